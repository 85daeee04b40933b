// A pipeline estimate simulates every rank that could hold the most side by
// side (SimulateOptions::threads, core/parallel.hpp). The answer must not
// depend on the threads: on a generated grid of pipeline jobs (1F1B and
// interleaved, recompute, allocator settings from job_grid.hpp), with and
// without a capacity that some ranks overflow, one thread and four print the
// same `estimate --format json`, and the rank reported is the one a serial
// walk keeps (a rank out of memory first, then the largest reserved peak,
// then the lowest rank). A failing job is printed as its gpumem command.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "gpumem/memory/job.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/sim/simulate.hpp"
#include "job_grid.hpp"
#include "test_util.hpp"

namespace gpumem {
namespace {

Result<EstimateResult> run(const EstimateRequest& r, int threads) {
    SimulateOptions o;
    o.threads = threads;
    return simulate_estimate(test::grid_model(r.model), r, o);
}

void same_answer(const EstimateRequest& r, int& ranks_compared) {
    const auto one = run(r, 1), four = run(r, 4);
    ASSERT_EQ(one.ok(), four.ok()) << request_to_command(r);
    if (!one.ok()) return;
    const std::string a = estimate_to_json(one.value()).dump(1), b = estimate_to_json(four.value()).dump(1);
    EXPECT_TRUE(a == b) << request_to_command(r) << "\n    " << test::first_difference(a, b, "1 thread", "4 threads");
    const auto& par = one.value().parallel;
    if (!par || !one.value().simulation) return;
    // The rank reported holds the largest simulated reserved peak of those
    // simulated, the lowest such rank (no rank ran out of memory here).
    std::int64_t want = -1;
    Bytes most;
    for (const auto& st : par->stages) {
        if (!st.simulated) continue;
        ++ranks_compared;
        if (want < 0 || st.simulated_peak_reserved > most) {
            want = st.stage;
            most = st.simulated_peak_reserved;
        }
    }
    if (!one.value().simulation->oom) {
        EXPECT_EQ(par->most_loaded, want) << request_to_command(r);
    }
}

TEST(SimParallel, RanksSideBySideAnswerAsOneThread) {
    int jobs = 0, ranks = 0, capped = 0;
    for (test::GridJob& j : test::job_grid(test::GridKind::Pipeline, 24, 2701)) {
        EstimateRequest& r = j.req;
        same_answer(r, ranks);
        ++jobs;
        // Again with a capacity between the ranks' totals, so that some run out
        // of memory in the replay against the GPU and some do not.
        const auto full = run(r, 1);
        if (!full.ok() || !full.value().parallel) continue;
        Bytes lo, hi;
        for (const auto& st : full.value().parallel->stages) {
            if (!st.simulated) continue;
            if (lo == Bytes(0) || st.simulated_peak_reserved < lo) lo = st.simulated_peak_reserved;
            hi = max(hi, st.simulated_peak_reserved);
        }
        if (lo == hi) continue;
        const Bytes outside = full.value().per_gpu.total_device - full.value().per_gpu.peak_reserved;
        r.gpu_memory = outside + lo + Bytes((hi - lo).count() / 2);
        same_answer(r, ranks);
        ++capped;
    }
    std::printf("%d pipeline jobs (%d again with a capacity between their ranks), %d ranks simulated\n", jobs, capped, ranks);
    EXPECT_GE(jobs, 20);
    EXPECT_GE(capped, 5) << "the grid should have pipelines whose ranks' peaks differ";
    EXPECT_GE(ranks, 2 * jobs) << "pipeline jobs simulate several ranks";
}

}  // namespace
}  // namespace gpumem
