// What the step simulation keeps beside its events, on a generated grid of
// jobs (one GPU, data parallel with ZeRO/FSDP, tensor and pipeline parallel,
// inference):
// - Trace::labels holds each text once (sim/step_internal.hpp Emitter::label):
//   a label is made per micro-batch and layer, and a 405B interleaved
//   pipeline rank once kept 34,890 copies of 83 texts. Every event names a
//   label that exists.
// - SimulateOptions::timeline = false (the planner's confirmations) leaves out
//   the timeline and changes nothing else of the answer.
// A failing job is printed as its gpumem command.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "gpumem/report/render.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"
#include "job_grid.hpp"

namespace gpumem {
namespace {

std::vector<test::GridJob> grid(std::uint64_t seed, int per_kind) {
    std::vector<test::GridJob> jobs;
    for (const auto kind : {test::GridKind::Single, test::GridKind::Sharded, test::GridKind::Tensor, test::GridKind::Pipeline,
                            test::GridKind::Inference}) {
        auto part = test::job_grid(kind, per_kind, seed + static_cast<std::uint64_t>(kind));
        jobs.insert(jobs.end(), part.begin(), part.end());
    }
    return jobs;
}

TEST(TraceLabels, EachTextOnceAndEveryEventNamesOne) {
    const std::vector<test::GridJob> jobs = grid(71, 6);
    ASSERT_GE(jobs.size(), 25U);
    std::size_t repeated_sites = 0;  // jobs with more labelled allocations than texts
    for (const auto& j : jobs) {
        const sim::StepTrace t = test::grid_step_trace(j.req);
        const auto& labels = t.trace.labels;
        const std::set<std::string> distinct(labels.begin(), labels.end());
        EXPECT_EQ(distinct.size(), labels.size()) << request_to_command(j.req) << ": a label text is kept more than once";
        std::size_t labelled = 0;
        for (const auto& e : t.trace.events) {
            if (e.label < 0) continue;
            ++labelled;
            ASSERT_LT(static_cast<std::size_t>(e.label), labels.size()) << request_to_command(j.req);
        }
        if (labelled > labels.size()) ++repeated_sites;
    }
    // The grid exercises labels made again and again (every job allocates per
    // layer and micro-batch more tensors than it has texts).
    EXPECT_GE(repeated_sites, jobs.size() / 2);
}

TEST(TraceLabels, NoTimelineChangesNothingElse) {
    const std::vector<test::GridJob> jobs = grid(73, 3);
    int with_points = 0;
    for (const auto& j : jobs) {
        const ModelGraph& g = test::grid_model(j.req.model);
        SimulateOptions on, off;
        off.timeline = false;
        const auto a = simulate_estimate(g, j.req, on);
        const auto b = simulate_estimate(g, j.req, off);
        ASSERT_TRUE(a && b) << request_to_command(j.req);
        if (!a.value().simulation) continue;  // too long to simulate: the analytic answer both times
        ASSERT_TRUE(b.value().simulation) << request_to_command(j.req);
        EXPECT_TRUE(b.value().simulation->timeline.empty()) << request_to_command(j.req);
        with_points += a.value().simulation->timeline.empty() ? 0 : 1;
        EXPECT_EQ(estimate_to_json(a.value()).dump(), estimate_to_json(b.value()).dump()) << request_to_command(j.req);
    }
    EXPECT_GE(with_points, 10);
}

}  // namespace
}  // namespace gpumem
