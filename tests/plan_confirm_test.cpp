// The planner's confirmation by the step simulation (plan/planner.hpp) runs
// candidates on several threads at once; what it reports must be what a
// serial walk down the analytic ranking gives: simulate the best, then the
// next, until `confirm` of them fit (or 2 * confirm + 2 were tried), drop
// those the simulation does not fit. The walk is done here with
// simulate_estimate() directly, on a grid of models, GPU counts and GPU
// memory sizes (small sizes make the simulation drop candidates).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpumem/memory/request.hpp"
#include "gpumem/plan/planner.hpp"
#include "gpumem/sim/simulate.hpp"

using namespace gpumem;

namespace {

struct Row {
    std::string command;
    bool confirmed = false;
    std::int64_t total_device = 0;
};

std::vector<Row> rows(const PlanResult& p) {
    std::vector<Row> out;
    for (const auto& c : p.top) out.push_back({request_to_command(c.request), c.confirmed, c.total_device.count()});
    return out;
}

}  // namespace

TEST(PlanConfirm, ParallelConfirmationIsTheSerialWalk) {
    int grids = 0, with_drops = 0;
    for (const char* model : {"gpt2", "llama-3.2-1b"})
        for (std::int64_t gpus : {1, 4, 8})
            for (double gib : {3.0, 6.0, 24.0}) {
                SCOPED_TRACE(std::string(model) + " gpus " + std::to_string(gpus) + " memory " + std::to_string(gib) + " GiB");
                PlanRequest pr;
                pr.base.model = model;
                pr.base.seq = 512;
                pr.base.gpu_memory = Bytes(static_cast<std::int64_t>(gib * 1024 * 1024 * 1024));
                pr.base.parallel.gpus = gpus;
                pr.headroom = 0;
                pr.top = 5;
                pr.confirm = 2;
                // The analytic ranking: the same search, nothing simulated.
                PlanRequest ar = pr;
                ar.confirm = 0;
                ar.top = 10000;
                const auto analytic = plan(ar);
                ASSERT_TRUE(analytic) << analytic.error().message;
                const auto& ranked = analytic.value().top;
                if (ranked.empty()) continue;
                ++grids;
                const double capacity = static_cast<double>(ranked.front().per_gpu.capacity.count()) * (1.0 - pr.headroom);
                // The serial walk.
                std::vector<Row> expected;
                std::size_t fit = 0, tried = 0;
                const std::size_t tries = std::min<std::size_t>(ranked.size(), 2 * static_cast<std::size_t>(pr.confirm) + 2);
                for (std::size_t i = 0; i < ranked.size() && expected.size() < static_cast<std::size_t>(pr.top); ++i) {
                    Row r{request_to_command(ranked[i].request), false, ranked[i].total_device.count()};
                    if (tried < tries && fit < static_cast<std::size_t>(pr.confirm)) {
                        ++tried;
                        const auto sim = simulate_estimate(ranked[i].request);
                        if (sim) {
                            r.confirmed = true;
                            r.total_device = sim.value().per_gpu.total_device.count();
                            if (static_cast<double>(r.total_device) > capacity) {
                                ++with_drops;
                                continue;  // dropped
                            }
                            ++fit;
                        }
                    }
                    expected.push_back(r);
                }
                std::vector<std::string> first_assumptions;
                for (int threads : {1, 2, 4}) {
                    PlanRequest t = pr;
                    t.threads = threads;
                    const auto p = plan(t);
                    ASSERT_TRUE(p) << p.error().message;
                    const auto got = rows(p.value());
                    ASSERT_EQ(got.size(), expected.size()) << "threads " << threads;
                    for (std::size_t i = 0; i < got.size(); ++i) {
                        EXPECT_EQ(got[i].command, expected[i].command) << "threads " << threads << " row " << i;
                        EXPECT_EQ(got[i].confirmed, expected[i].confirmed) << "threads " << threads << " row " << i;
                        EXPECT_EQ(got[i].total_device, expected[i].total_device) << "threads " << threads << " row " << i;
                    }
                    if (threads == 1) first_assumptions = p.value().assumptions;
                    else EXPECT_EQ(p.value().assumptions, first_assumptions) << "threads " << threads;
                }
            }
    EXPECT_GE(grids, 12);
    EXPECT_GE(with_drops, 1);  // the grid reaches the dropping path
}
