// SimulateOptions::stop_above (sim/simulate.hpp): the simulation of a
// pipeline's ranks may stop at the first rank that needs more than a limit,
// because the job then needs more than the limit whatever the other ranks
// need. On a generated grid of pipeline jobs, against the full simulation of
// the same job:
//   - a limit the full simulation does not exceed changes nothing (same
//     total, same peak, nothing stopped);
//   - a limit it exceeds is exceeded by the stopped simulation too (the
//     planner's verdict "does not fit" is the same), and the stopped total is
//     no more than the full one;
//   - the stopped answer is the same on one thread and on several.
// A failing job is printed as its gpumem command with the limit.
#include <gtest/gtest.h>

#include <string>

#include "gpumem/memory/request.hpp"
#include "gpumem/sim/simulate.hpp"
#include "job_grid.hpp"

namespace gpumem {
namespace {

Result<EstimateResult> run(const EstimateRequest& r, Bytes limit, int threads) {
    SimulateOptions so;
    so.stop_above = limit;
    so.threads = threads;
    return simulate_estimate(test::grid_model(r.model), r, so);
}

TEST(StopAbove, StoppedSimulationKeepsTheVerdict) {
    int jobs = 0, stopped = 0;
    for (const auto& j : test::job_grid(test::GridKind::Pipeline, 16, 71)) {
        const EstimateRequest& r = j.req;
        const auto full = run(r, Bytes(0), 1);
        ASSERT_TRUE(full) << request_to_command(r) << ": " << full.error().message;
        if (!full.value().simulation) continue;  // analytic fallback (event limit)
        ++jobs;
        const Bytes total = full.value().per_gpu.total_device;
        const std::string cmd = request_to_command(r);
        // Not exceeded: the full answer.
        for (const Bytes limit : {total, total + Bytes(1), total * 2}) {
            const auto got = run(r, limit, 1);
            ASSERT_TRUE(got) << cmd;
            EXPECT_EQ(got.value().per_gpu.total_device, total) << cmd << " (stop_above " << limit.count() << ")";
            EXPECT_EQ(got.value().per_gpu.peak_allocated, full.value().per_gpu.peak_allocated) << cmd << " (stop_above " << limit.count() << ")";
            EXPECT_EQ(got.value().simulation->stopped_at_stage, -1) << cmd << " (stop_above " << limit.count() << ")";
        }
        // Exceeded: still exceeded, by no more than the full simulation.
        for (const Bytes limit : {total - Bytes(1), Bytes(total.count() / 10 * 9), Bytes(total.count() / 2)}) {
            const auto one = run(r, limit, 1);
            const auto many = run(r, limit, 3);
            ASSERT_TRUE(one && many) << cmd;
            const Bytes got = one.value().per_gpu.total_device;
            EXPECT_GT(got, limit) << cmd << " (stop_above " << limit.count() << ")";
            EXPECT_LE(got, total) << cmd << " (stop_above " << limit.count() << ")";
            EXPECT_EQ(many.value().per_gpu.total_device, got) << cmd << " (stop_above " << limit.count() << "): 3 threads vs 1";
            EXPECT_EQ(many.value().simulation->stopped_at_stage, one.value().simulation->stopped_at_stage) << cmd << ": 3 threads vs 1";
            if (one.value().simulation->stopped_at_stage >= 0) ++stopped;
        }
    }
    EXPECT_GE(jobs, 12);
    EXPECT_GE(stopped, 6);  // the grid does exercise the stop
}

}  // namespace
}  // namespace gpumem
