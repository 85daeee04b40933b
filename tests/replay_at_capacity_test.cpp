// One replay that answers two questions (sim/trace.hpp
// ReplayOptions::oom_capacity): what a trace needs without a limit, and where
// a replay against a GPU of `capacity` (stop_at_oom) runs out of memory. The
// second answer, where the replay says it knows it, must be exactly what the
// limited replay itself gives: the same event, the same OomInfo, or, when it
// never runs out, the same result field for field. Checked on generated traces
// (random mixes of small and large tensors, frees in any order, emptyCache,
// several streams, frees of tensors already freed, allocations of live ids) and on the step simulation's traces of a few models, over
// allocator settings and capacities from a fifth of the job's need to all of
// it. A failing case prints its seed and settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/step.hpp"
#include "gpumem/sim/trace.hpp"
#include "job_grid.hpp"

using namespace gpumem;
using namespace gpumem::sim;

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

Trace random_trace(test::Rng& rng, int events) {
    Trace t;
    std::vector<std::int64_t> live;
    std::int64_t next = 0;
    const std::vector<std::int64_t> sizes = {1, 512, 4096, 300 * 1024, kMiB, kMiB + 1, 3 * kMiB, 9 * kMiB, 20 * kMiB, 64 * kMiB, 300 * kMiB};
    for (int k = 0; k < events; ++k) {
        const auto phase = static_cast<Phase>(rng.below(3));
        // Now and then what snapshots hold and replay() ignores: a free of a
        // tensor already freed (or never made), an allocation of a live id.
        if (next > 0 && rng.chance(2)) {
            t.events.push_back({TraceEvent::Kind::Free, phase, 0, rng.below(next + 5), Bytes(0), -1, 0});
            const std::int64_t id = t.events.back().id;
            live.erase(std::remove(live.begin(), live.end(), id), live.end());
            continue;
        }
        if (!live.empty() && rng.chance(2)) {
            t.events.push_back({TraceEvent::Kind::Alloc, phase, 0, rng.pick(live), Bytes(kMiB), -1, 0});
            continue;
        }
        if (!live.empty() && (rng.chance(45) || live.size() > 400)) {
            const auto at = static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(live.size())));
            t.events.push_back({TraceEvent::Kind::Free, phase, 0, live[at], Bytes(0), -1, 0});
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
        } else if (rng.below(400) == 0) {
            t.events.push_back({TraceEvent::Kind::EmptyCache, phase, 0, -1, Bytes(0), -1, 0});
        } else {
            const std::int64_t size = rng.pick(sizes) + rng.below(4096);
            const int stream = rng.chance(10) ? 1 : 0;
            t.events.push_back({TraceEvent::Kind::Alloc, phase, stream, next, Bytes(size), -1, 0});
            live.push_back(next++);
        }
    }
    return t;
}

// The fields a caller reads from a replay that did not run out of memory.
std::string describe(const ReplayResult& r) {
    std::string s = std::to_string(r.peak_allocated.count()) + " " + std::to_string(r.peak_reserved.count()) + " " + std::to_string(r.peak_event) + " " +
                    std::to_string(r.final_allocated.count()) + " " + std::to_string(r.final_reserved.count()) + " " +
                    std::to_string(r.fragmentation_at_peak.count()) + " " + std::to_string(r.largest_free_block_at_peak.count()) + " " +
                    std::to_string(r.failed_allocs) + " " + std::to_string(r.allocator.cuda_mallocs) + " " + std::to_string(r.allocator.cuda_frees) + " " +
                    std::to_string(r.allocator.alloc_retries) + " " + std::to_string(r.allocator.segments) + " phases";
    for (const auto& p : r.phases) s += " " + std::to_string(p.peak_allocated.count()) + "/" + std::to_string(p.peak_reserved.count());
    s += " timeline";
    for (const auto& p : r.timeline) s += " " + std::to_string(p.event) + ":" + std::to_string(p.reserved.count());
    s += " top";
    for (const auto& p : r.top_at_peak) s += " " + std::to_string(p.id);
    return s;
}

struct Tally {
    int cases = 0, known = 0, known_oom = 0, unknown = 0;
};

// Compares the one-pass answer with the limited replay's; `what` names the case.
void check(const Trace& t, const AllocatorConfig& conf, Bytes capacity, const std::string& what, Tally& tally) {
    ReplayOptions limited;
    limited.config = conf;
    limited.capacity = capacity;
    limited.stop_at_oom = true;
    const ReplayResult want = replay(t, limited);

    ReplayOptions both;
    both.config = conf;
    both.oom_capacity = capacity;
    const ReplayResult got = replay(t, both);
    ++tally.cases;
    const bool neutral = !conf.expandable_segments && conf.garbage_collection_threshold <= 0.0;
    if (!neutral) {
        EXPECT_FALSE(got.at_capacity_known) << what << ": expandable segments and garbage collection depend on the capacity";
        ++tally.unknown;
        return;
    }
    if (!got.at_capacity_known) {
        // Only a limited replay that gets through by freeing its cache is left unknown.
        EXPECT_FALSE(want.oom.has_value()) << what << ": a limited replay that runs out of memory should be told in one pass";
        ++tally.unknown;
        return;
    }
    ++tally.known;
    ASSERT_EQ(got.at_capacity_oom.has_value(), want.oom.has_value()) << what;
    if (want.oom) {
        ++tally.known_oom;
        const OomInfo& a = *got.at_capacity_oom;
        const OomInfo& b = *want.oom;
        EXPECT_EQ(got.at_capacity_oom_event, want.oom_event) << what;
        EXPECT_EQ(a.requested, b.requested) << what;
        EXPECT_EQ(a.alloc_size, b.alloc_size) << what;
        EXPECT_EQ(a.allocated, b.allocated) << what;
        EXPECT_EQ(a.reserved, b.reserved) << what;
        EXPECT_EQ(a.capacity, b.capacity) << what;
        EXPECT_EQ(a.device_free, b.device_free) << what;
        EXPECT_EQ(a.largest_free_block, b.largest_free_block) << what;
    } else {
        EXPECT_EQ(describe(got), describe(want)) << what << ": never past the capacity, the same replay";
    }
}

const std::vector<std::string>& confs() {
    static const std::vector<std::string> c = {"",
                                               "max_split_size_mb:64",
                                               "roundup_power2_divisions:4",
                                               "max_split_size_mb:200,roundup_power2_divisions:[256:1,512:2,>:4]",
                                               "expandable_segments:True",
                                               "garbage_collection_threshold:0.6"};
    return c;
}

}  // namespace

TEST(ReplayAtCapacity, GeneratedTracesAgreeWithTheLimitedReplay) {
    test::Rng rng(2611);
    Tally tally;
    for (int k = 0; k < 120; ++k) {
        const Trace t = random_trace(rng, 200 + static_cast<int>(rng.below(1500)));
        const std::string conf_text = rng.pick(confs());
        const AllocatorConfig conf = AllocatorConfig::parse(conf_text).value();
        ReplayOptions free_run;
        free_run.config = conf;
        const Bytes need = replay(t, free_run).peak_reserved;
        const std::int64_t percent = 20 + rng.below(100);  // 20% .. 119% of what it needs
        const Bytes capacity(std::max<std::int64_t>(1, need.count() / 100 * percent));
        check(t, conf, capacity, "case " + std::to_string(k) + " conf '" + conf_text + "' capacity " + std::to_string(percent) + "% of " + std::to_string(need.count()), tally);
    }
    std::printf("%d cases: %d told in one pass (%d out of memory), %d not\n", tally.cases, tally.known, tally.known_oom, tally.unknown);
    EXPECT_GE(tally.known_oom, 40) << "the out-of-memory answer in one pass";
    EXPECT_GE(tally.known - tally.known_oom, 10) << "capacities the trace never passes";
    EXPECT_GE(tally.unknown, 10);
}

TEST(ReplayAtCapacity, StepTracesAgreeWithTheLimitedReplay) {
    test::Rng rng(2612);
    Tally tally;
    for (const std::string model : {"gpt2", "llama-3.2-1b", "qwen2-0.5b"}) {
        const ModelGraph g = load_model(model).value();
        for (int k = 0; k < 6; ++k) {
            EstimateRequest r;
            r.model = model;
            r.batch = 1 + rng.below(4);
            r.seq = rng.pick(std::vector<std::int64_t>{128, 512, 1024});
            r.grad_accum = 1 + rng.below(3);
            r.recompute = rng.chance(30) ? Recompute::Full : Recompute::None;
            const Job job = resolve_job(g, r).value();
            StepTraceOptions so;
            so.cublas_workspace = job.gpu.cublas_workspace;
            const Trace t = build_step_trace(g, job, so).trace;
            const std::string conf_text = rng.pick(confs());
            const AllocatorConfig conf = AllocatorConfig::parse(conf_text).value();
            ReplayOptions free_run;
            free_run.config = conf;
            const Bytes need = replay(t, free_run).peak_reserved;
            for (const std::int64_t percent : {25, 60, 90, 99, 100}) {
                const Bytes capacity(need.count() / 100 * percent);
                check(t, conf, capacity,
                      request_to_command(r) + " --alloc-conf '" + conf_text + "' at " + std::to_string(percent) + "% of " + std::to_string(need.count()),
                      tally);
            }
        }
    }
    std::printf("%d cases: %d told in one pass (%d out of memory), %d not\n", tally.cases, tally.known, tally.known_oom, tally.unknown);
    EXPECT_GE(tally.known_oom, 30);
}
