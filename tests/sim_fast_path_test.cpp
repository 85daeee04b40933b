// The step simulation's fast path (steady-state extrapolation of gradient
// accumulation and pipeline schedules, the bounded decode) against
// SimulateOptions::full_replay (every micro-batch and every decode step
// replayed), on a generated grid: models of different depths (12 to 30
// layers) x batch x sequence x gradient accumulation x decode length x pp and
// interleaved vpp x allocator settings (expandable segments, max_split_size,
// garbage collection, roundup divisions) x recompute. Where the fast path does
// not mark its answer approximate, everything `estimate --format json` prints
// must be what the full replay prints; where it does, the note must say so,
// the full replay must not, and its peaks must be within
// kApproximateTolerance of the full replay's. A failing job is printed as its
// gpumem command.
#include <gtest/gtest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"
#include "job_grid.hpp"

namespace gpumem {
namespace {

struct Outcome {
    std::string json;
    bool approximate = false;
    std::int64_t peak_allocated = 0, peak_reserved = 0;
};

Outcome run(const EstimateRequest& r, bool full) {
    SimulateOptions o;
    o.full_replay = full;
    auto res = simulate_estimate(test::grid_model(r.model), r, o);
    if (!res) return {"error: " + res.error().message, false};
    Outcome out;
    out.json = estimate_to_json(res.value()).dump(1);
    out.peak_allocated = res.value().per_gpu.peak_allocated.count();
    out.peak_reserved = res.value().per_gpu.peak_reserved.count();
    if (res.value().simulation) {
        out.approximate = res.value().simulation->approximate;
        // An approximate answer says so in its notes.
        bool said = false;
        for (const auto& n : res.value().simulation->notes) said = said || n.find("(approximate") != std::string::npos;
        EXPECT_EQ(said, out.approximate) << request_to_command(r);
    }
    return out;
}

struct Tally {
    int total = 0, exact = 0, approximate = 0;
    double worst_allocated = 0, worst_reserved = 0;  // largest |fast / full - 1| of the approximate jobs
};

// Approximate answers (the interleaved schedule's 64-micro-batch cut, decode
// past 64 steps) stay within this of the full replay's peaks on the grids
// below (worst measured: 0.05% allocated, 0.7% reserved; README).
constexpr double kApproximateTolerance = 0.01;

void report(const char* what, const Tally& t) {
    std::printf("%s: %d jobs, %d exact, %d approximate; worst deviation %.3f%% allocated, %.3f%% reserved\n", what, t.total, t.exact,
                t.approximate, 100 * t.worst_allocated, 100 * t.worst_reserved);
}

double deviation(std::int64_t fast, std::int64_t full) {
    return full == 0 ? (fast == 0 ? 0.0 : 1.0) : std::abs(static_cast<double>(fast) / static_cast<double>(full) - 1.0);
}

void check(const EstimateRequest& r, Tally& t) {
    if (!test::grid_valid(r)) return;
    const Outcome fast = run(r, false), full = run(r, true);
    ++t.total;
    EXPECT_FALSE(full.approximate) << request_to_command(r) << ": the full replay is never approximate";
    if (fast.approximate) {
        ++t.approximate;
        const double da = deviation(fast.peak_allocated, full.peak_allocated), dr = deviation(fast.peak_reserved, full.peak_reserved);
        t.worst_allocated = std::max(t.worst_allocated, da);
        t.worst_reserved = std::max(t.worst_reserved, dr);
        EXPECT_LE(da, kApproximateTolerance) << request_to_command(r) << ": peak allocated " << fast.peak_allocated << ", full replay "
                                             << full.peak_allocated;
        EXPECT_LE(dr, kApproximateTolerance) << request_to_command(r) << ": peak reserved " << fast.peak_reserved << ", full replay "
                                             << full.peak_reserved;
        return;
    }
    ++t.exact;
    EXPECT_TRUE(fast.json == full.json) << request_to_command(r) << "\n    " << test::first_difference(fast.json, full.json, "fast path", "full replay");
}

const std::vector<std::string>& confs() {
    static const std::vector<std::string> c = {"", "expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.6",
                                               "roundup_power2_divisions:4", "expandable_segments:True,roundup_power2_divisions:2"};
    return c;
}

// Models of different depths: gpt2 (12 layers), llama-3.2-1b (16),
// qwen2-0.5b (24), smollm2-135m (30).
const std::vector<std::string>& models() {
    static const std::vector<std::string> m = {"gpt2", "llama-3.2-1b", "qwen2-0.5b", "smollm2-135m"};
    return m;
}

TEST(SimFastPath, TrainingGridEqualsFullReplay) {
    test::Rng rng(1616);
    Tally t;
    const std::vector<std::int64_t> gas = {1, 2, 5, 8, 13, 24, 40, 64};
    for (const std::string& model : models()) {
        for (const std::int64_t ga : gas) {
            for (int rep = 0; rep < 2; ++rep) {
                EstimateRequest r;
                r.model = model;
                r.batch = 1 + rng.below(2);
                r.seq = rng.pick(std::vector<std::int64_t>{64, 128, 256});
                r.grad_accum = ga;
                r.alloc_conf = rng.pick(confs());
                r.recompute = rng.chance(40) ? Recompute::Full : Recompute::None;
                const std::int64_t pp = rng.pick(std::vector<std::int64_t>{1, 1, 2, 4});
                r.parallel.gpus = pp;
                r.parallel.pp = pp;
                if (pp > 1 && rng.chance(40)) {
                    r.parallel.schedule = PipelineSchedule::Interleaved;
                    r.parallel.vpp = 2;
                }
                check(r, t);
            }
        }
    }
    EXPECT_GE(t.total, 40);
    EXPECT_GE(t.exact, t.total / 2) << "most jobs of the grid should be extrapolated exactly";
}

// Long 1F1B pipelines: the cache settles after a few hundred chunks; the
// detection window (sim/step_pipeline.cpp) must reach it, so these are exact.
TEST(SimFastPath, LongPipelinesAreExact) {
    test::Rng rng(1618);
    Tally t;
    for (const std::string model : {"gpt2", "llama-3.2-1b"}) {
        for (const std::int64_t pp : {2, 4, 8}) {
            for (const std::int64_t ga : {160, 320}) {
                EstimateRequest r;
                r.model = model;
                r.batch = 1 + rng.below(2);
                r.seq = 128;
                r.grad_accum = ga;
                r.alloc_conf = rng.pick(confs());
                r.recompute = rng.chance(30) ? Recompute::Full : Recompute::None;
                r.parallel.gpus = pp;
                r.parallel.pp = pp;
                check(r, t);
            }
        }
    }
    EXPECT_GE(t.total, 10);
    EXPECT_EQ(t.approximate, 0) << "1F1B pipelines should reach their steady state within the window";
}

// Interleaved pipelines past 64 micro-batches: the allocator's cache does not
// repeat within the detection window (the live tensors do, every 4 pp vpp
// chunk forwards and backwards), so the fast path cuts at 64 micro-batches
// and says approximate.
TEST(SimFastPath, LongInterleavedPipelines) {
    test::Rng rng(1619);
    Tally t;
    for (const std::string model : {"gpt2", "llama-3.2-1b", "qwen2-0.5b"}) {
        for (const std::int64_t pp : {2, 4}) {
            for (const std::int64_t ga : {96, 160, 320}) {
                EstimateRequest r;
                r.model = model;
                r.batch = 1 + rng.below(2);
                r.seq = 128;
                r.grad_accum = ga - ga % pp;
                r.alloc_conf = rng.pick(confs());
                r.recompute = rng.chance(30) ? Recompute::Full : Recompute::None;
                r.parallel.gpus = pp;
                r.parallel.pp = pp;
                r.parallel.schedule = PipelineSchedule::Interleaved;
                r.parallel.vpp = 2;
                check(r, t);
            }
        }
    }
    report("interleaved", t);
    EXPECT_GE(t.total, 12);
}

// A 1F1B pipeline whose cache does not settle within the detection window
// (64 pp + 512 chunk operations): llama-3-8b tp 4 pp 4 cp 4 at 8k tokens. The
// fast path cuts at 64 micro-batches and says approximate; its peaks must be
// within kApproximateTolerance of replaying all of them.
TEST(SimFastPath, LongPipelinesThatDoNotSettle) {
    Tally t;
    for (const std::int64_t ga : {256, 512}) {
        for (const std::string conf : {"", "expandable_segments:True"}) {
            EstimateRequest r;
            r.model = "llama-3-8b";
            r.seq = 8192;
            r.grad_accum = ga;
            r.precision = Precision::BF16;
            r.alloc_conf = conf;
            r.parallel.gpus = 64;
            r.parallel.tp = 4;
            r.parallel.pp = 4;
            r.parallel.cp = 4;
            r.parallel.sp = true;
            check(r, t);
        }
    }
    report("1F1B, unsettled", t);
    EXPECT_EQ(t.total, 4);
    EXPECT_GE(t.approximate, 1) << "the job the README names as approximate";
}

TEST(SimFastPath, DecodeGridEqualsFullReplay) {
    test::Rng rng(1617);
    Tally t;
    const std::vector<std::int64_t> gens = {0, 1, 7, 32, 64, 65, 100, 200};
    for (const std::string& model : models()) {
        for (const std::int64_t gen : gens) {
            EstimateRequest r;
            r.model = model;
            r.mode = Mode::Infer;
            r.batch = 1 + rng.below(4);
            r.seq = rng.pick(std::vector<std::int64_t>{16, 128, 512});
            r.gen_len = gen;
            r.alloc_conf = rng.pick(confs());
            check(r, t);
        }
    }
    EXPECT_GE(t.total, 24);
    EXPECT_GE(t.exact, t.total / 2);
    report("decode", t);
}

// An approximate answer whose total is within the 1% tolerance of the GPU's
// memory is no sure "fits": the estimate warns. Not when the margin is wider,
// nor when the simulation is exact.
TEST(SimFastPath, ApproximateAnswerNearCapacityWarns) {
    auto warned = [](std::int64_t gen, std::optional<Bytes> memory) {
        EstimateRequest r;
        r.model = "gpt2";
        r.mode = Mode::Infer;
        r.seq = 16;
        r.gen_len = gen;
        r.gpu_memory = memory;
        auto res = simulate_estimate(test::grid_model(r.model), r);
        EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.error().message);
        if (!res.ok()) return std::make_pair(false, Bytes(0));
        const auto& w = res.value().warnings;
        const bool has = std::any_of(w.begin(), w.end(), [](const std::string& x) { return x.find("whether it fits is uncertain") != std::string::npos; });
        return std::make_pair(has, res.value().per_gpu.total_device);
    };
    const Bytes total = warned(200, std::nullopt).second;  // decode past 64 steps: approximate
    ASSERT_GT(total, Bytes(0));
    EXPECT_TRUE(warned(200, Bytes(total.count() + total.count() / 200)).first);   // 0.5% above the total
    EXPECT_TRUE(warned(200, Bytes(total.count() - total.count() / 200)).first);   // 0.5% below: does not fit, uncertain
    EXPECT_FALSE(warned(200, Bytes(total.count() * 2)).first);
    const Bytes exact = warned(50, std::nullopt).second;  // 50 decode steps: replayed in full
    EXPECT_FALSE(warned(50, Bytes(exact.count() + exact.count() / 200)).first);
}

// A pipeline short enough in operations to be simulated whole (it fits in the
// detection window) but whose whole trace would pass the event limit
// (kMaxTraceEvents): llama-3.1-405b tp 8 pp 2 at grad-accum 300, 63 layers a
// rank, about 6.3M events. The simulation tries again looking for the steady
// state and answers simulated, where the full replay (and the simulation
// before the retry existed) can only give the analytic estimate.
TEST(SimFastPath, LongScheduleOverTheEventLimitIsStillSimulated) {
    EstimateRequest r;
    r.model = "llama-3.1-405b";
    r.seq = 2048;
    r.grad_accum = 300;
    r.parallel.gpus = 16;
    r.parallel.tp = 8;
    r.parallel.pp = 2;
    r.parallel.sp = true;
    const ModelGraph g = load_model(r.model).value();
    auto skipped = [](const EstimateResult& e) {
        return std::any_of(e.warnings.begin(), e.warnings.end(), [](const std::string& w) { return w.find("step simulation skipped") != std::string::npos; });
    };
    SimulateOptions whole;
    whole.full_replay = true;
    whole.threads = 1;
    auto full = simulate_estimate(g, r, whole);
    ASSERT_TRUE(full.ok()) << full.error().message;
    EXPECT_TRUE(skipped(full.value())) << request_to_command(r) << ": every micro-batch should pass " << sim::kMaxTraceEvents << " events";
    SimulateOptions fast;
    fast.threads = 1;
    auto res = simulate_estimate(g, r, fast);
    ASSERT_TRUE(res.ok()) << res.error().message;
    EXPECT_FALSE(skipped(res.value())) << request_to_command(r);
    ASSERT_TRUE(res.value().simulation.has_value()) << request_to_command(r);
    EXPECT_GT(res.value().simulation->events, sim::kMaxTraceEvents) << request_to_command(r) << ": periods left out";
}

// A job that does not fit is replayed twice: against the GPU's memory (where
// and how it fails) and without a limit (what it needs). The peaks shown are
// what the job needs whatever the GPU: on a generated grid (single GPU and
// pipelines, gradient accumulation with and without steady-state cuts,
// allocator settings, training and decode), the answer on a GPU of half the
// job's total must report the out-of-memory and otherwise the same peaks,
// per-phase rows and breakdown as on a GPU it fits. (The second replay reuses
// the first's trace when it has no cuts and is exact, else builds its own.)
TEST(SimFastPath, OutOfMemoryAnswerShowsWhatTheJobNeeds) {
    test::Rng rng(1620);
    int jobs = 0, ooms = 0;
    for (int k = 0; k < 48; ++k) {
        EstimateRequest r;
        r.model = rng.pick(models());
        r.batch = 1 + rng.below(2);
        r.seq = rng.pick(std::vector<std::int64_t>{64, 128, 256});
        r.alloc_conf = rng.pick(confs());
        if (rng.chance(25)) {
            r.mode = Mode::Infer;
            r.gen_len = rng.pick(std::vector<std::int64_t>{0, 16, 100});
        } else {
            r.grad_accum = rng.pick(std::vector<std::int64_t>{1, 2, 8, 40});
            r.recompute = rng.chance(30) ? Recompute::Full : Recompute::None;
            const std::int64_t pp = rng.pick(std::vector<std::int64_t>{1, 1, 2, 4});
            r.parallel.gpus = pp;
            r.parallel.pp = pp;
        }
        if (!test::grid_valid(r)) continue;
        r.gpu_memory = Bytes(std::int64_t{1} << 50);
        const auto big = simulate_estimate(test::grid_model(r.model), r);
        ASSERT_TRUE(big.ok()) << request_to_command(r) << ": " << big.error().message;
        r.gpu_memory = Bytes(big.value().per_gpu.total_device.count() / 2);
        const auto small = simulate_estimate(test::grid_model(r.model), r);
        ASSERT_TRUE(small.ok()) << request_to_command(r) << ": " << small.error().message;
        ++jobs;
        const EstimateResult &a = big.value(), &b = small.value();
        ASSERT_TRUE(a.simulation && b.simulation) << request_to_command(r);
        EXPECT_FALSE(b.per_gpu.fits) << request_to_command(r);
        ooms += b.simulation->oom ? 1 : 0;
        EXPECT_EQ(a.per_gpu.peak_allocated, b.per_gpu.peak_allocated) << request_to_command(r);
        EXPECT_EQ(a.per_gpu.peak_reserved, b.per_gpu.peak_reserved) << request_to_command(r);
        EXPECT_EQ(a.simulation->events, b.simulation->events) << request_to_command(r);
        ASSERT_EQ(a.simulation->phases.size(), b.simulation->phases.size()) << request_to_command(r);
        for (std::size_t i = 0; i < a.simulation->phases.size(); ++i) {
            EXPECT_EQ(a.simulation->phases[i].peak_allocated, b.simulation->phases[i].peak_allocated) << request_to_command(r) << " phase row " << i;
            EXPECT_EQ(a.simulation->phases[i].peak_reserved, b.simulation->phases[i].peak_reserved) << request_to_command(r) << " phase row " << i;
        }
        ASSERT_EQ(a.breakdown.size(), b.breakdown.size()) << request_to_command(r);
        for (std::size_t i = 0; i < a.breakdown.size(); ++i)
            EXPECT_EQ(a.breakdown[i].bytes, b.breakdown[i].bytes) << request_to_command(r) << " " << a.breakdown[i].key;
    }
    std::printf("%d jobs on a GPU of half their total, %d of them out of memory in the replay\n", jobs, ooms);
    EXPECT_GE(jobs, 30);
    EXPECT_GE(ooms, jobs * 3 / 4) << "half the memory should run most jobs out of memory in the replay";
}

}  // namespace
}  // namespace gpumem
