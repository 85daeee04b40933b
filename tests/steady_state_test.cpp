// Steady-state extrapolation of the step simulation (sim/step.hpp
// StepTraceOptions::steady_state): what `estimate --format json` prints with
// the periods left out must be what a replay of every micro-batch prints, on a
// generated grid of models, gradient accumulation, pipeline sizes, allocator
// settings and recompute. A failing job is printed as its gpumem command.
#include <gtest/gtest.h>

#include "test_util.hpp"

#include <string>
#include <vector>

#include "gpumem/memory/job.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"
#include "job_grid.hpp"

namespace gpumem {
namespace {

std::string json_of(const EstimateRequest& r, bool full) {
    SimulateOptions o;
    o.full_replay = full;
    auto res = simulate_estimate(test::grid_model(r.model), r, o);
    if (!res) return "error: " + res.error().message;
    return estimate_to_json(res.value()).dump(1);
}

// Whether the extrapolated trace of one rank really left periods out.
bool was_cut(const EstimateRequest& r) { return !test::grid_step_trace(r).trace.cuts.empty(); }

void expect_same(const EstimateRequest& r, int& cut, int& total, int* long_single = nullptr) {
    const std::string a = json_of(r, false), b = json_of(r, true);
    ++total;
    if (r.parallel.pp == 1 && r.grad_accum >= sim::kDetectMinMicroBatches) {
        if (long_single) ++*long_single;
        if (was_cut(r)) ++cut;
    }
    EXPECT_TRUE(a == b) << request_to_command(r) << "\n    " << test::first_difference(a, b, "extrapolated", "full replay");
}

// The grid of the issue: small configurations of gpt2 and llama-3-8b,
// gradient accumulation 1..24 and 33..48, pp 1..4 (1F1B), allocator settings,
// recompute.
TEST(SteadyState, ExtrapolationEqualsFullReplay) {
    const std::vector<std::string> confs = {"", "expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.6",
                                            "roundup_power2_divisions:4"};
    test::Rng rng(2015);
    int cut = 0, total = 0, long_single = 0;
    for (const std::string model : {"gpt2", "llama-3-8b"}) {
        for (std::int64_t k = 1; k <= 40; ++k) {
            const std::int64_t ga = k <= 24 ? k : k + 8;  // 1..24 (one GPU detects from 16 on) and 33..48
            EstimateRequest r;
            r.model = model;
            r.seq = model == std::string("gpt2") ? 256 : 64;
            r.batch = 1 + rng.below(2);
            r.grad_accum = ga;
            r.alloc_conf = rng.pick(confs);
            r.recompute = rng.chance(50) ? Recompute::Full : Recompute::None;
            const std::int64_t pp = 1 + rng.below(4);
            r.parallel.gpus = pp;
            r.parallel.pp = pp;
            if (!test::grid_valid(r)) continue;
            expect_same(r, cut, total, &long_single);
        }
    }
    EXPECT_GE(total, 60);
    EXPECT_GE(long_single, 8);
    EXPECT_GE(cut, long_single * 3 / 4) << "the extrapolation should leave periods out of most long single-GPU jobs";
}

// The invariant grids' jobs (every layout kind, ZeRO/FSDP, no_sync, the
// optimizer in backward, CUDA graphs, ...) with long gradient accumulation.
TEST(SteadyState, GridJobsEqualFullReplay) {
    int cut = 0, total = 0;
    for (const auto kind : {test::GridKind::Single, test::GridKind::Pipeline}) {
        for (auto j : test::job_grid(kind, 40, 31)) {
            if (j.req.mode != Mode::Train) continue;
            j.req.grad_accum = sim::kDetectMinMicroBatches + static_cast<std::int64_t>(total % 17);
            if (!test::grid_valid(j.req)) continue;
            expect_same(j.req, cut, total);
        }
    }
    EXPECT_GE(total, 30);
}

}  // namespace
}  // namespace gpumem
