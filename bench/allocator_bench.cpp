// Speed target: replaying a 1,000,000-event trace through the caching
// allocator model in under 1 s (Release, 2 cores). The trace is deterministic
// and shaped like training steps: each step's first half mostly allocates
// (forward: activations kept, temporaries freed soon), the second half mostly
// frees in LIFO-ish order (backward), sizes log-uniform from 512 B to 256 MiB.
// main() lives in estimate_bench.cpp (same gpumem_bench executable).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gpumem/sim/allocator.hpp"
#include "gpumem/sim/trace.hpp"

using namespace gpumem;
using namespace gpumem::sim;

namespace {

// splitmix64: the same numbers on every platform (std distributions are not).
struct Rng {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

Trace make_training_like_trace(std::int64_t n_events, std::uint64_t seed) {
    Trace t;
    t.events.reserve(static_cast<std::size_t>(n_events));
    Rng rng{seed};
    std::vector<std::int64_t> live;
    std::int64_t next_id = 0;
    const std::int64_t step_len = 20000;
    const double lo = std::log(512.0), hi = std::log(256.0 * 1024 * 1024);
    for (std::int64_t i = 0; i < n_events; ++i) {
        const std::int64_t in_step = i % step_len;
        const bool forward = in_step < step_len / 2;
        const double p_alloc = forward ? 0.6 : 0.4;
        TraceEvent e;
        e.phase = forward ? Phase::Forward : Phase::Backward;
        e.step = static_cast<std::int32_t>(i / step_len);
        if (live.empty() || rng.unit() < p_alloc) {
            e.kind = TraceEvent::Kind::Alloc;
            e.id = next_id++;
            // log-uniform, skewed small: most tensors are small, a few are huge
            const double u = rng.unit();
            e.size = Bytes(static_cast<std::int64_t>(std::exp(lo + (hi - lo) * u * u)));
            live.push_back(e.id);
        } else {
            e.kind = TraceEvent::Kind::Free;
            // LIFO-ish: one of the 8 most recent live tensors
            const std::size_t back = std::min<std::size_t>(live.size() - 1, rng.next() % 8);
            const std::size_t k = live.size() - 1 - back;
            e.id = live[k];
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
        t.events.push_back(e);
    }
    return t;
}

const Trace& trace_1m() {
    static const Trace t = make_training_like_trace(1'000'000, 42);
    return t;
}

}  // namespace

static void BM_Replay1M(benchmark::State& state) {
    const Trace& t = trace_1m();
    ReplayOptions opt;
    opt.capacity = GiB(80);
    for (auto _ : state) {
        auto r = replay(t, opt);
        benchmark::DoNotOptimize(r);
        state.counters["peak_alloc_GiB"] = r.peak_allocated.gib();
        state.counters["peak_reserved_GiB"] = r.peak_reserved.gib();
        state.counters["ooms"] = static_cast<double>(r.allocator.ooms);
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.events.size()));
}
BENCHMARK(BM_Replay1M)->Unit(benchmark::kMillisecond);

static void BM_Replay1MExpandable(benchmark::State& state) {
    const Trace& t = trace_1m();
    ReplayOptions opt;
    opt.capacity = GiB(80);
    opt.config = AllocatorConfig::parse("expandable_segments:True").value();
    for (auto _ : state) {
        auto r = replay(t, opt);
        benchmark::DoNotOptimize(r);
        state.counters["peak_reserved_GiB"] = r.peak_reserved.gib();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.events.size()));
}
BENCHMARK(BM_Replay1MExpandable)->Unit(benchmark::kMillisecond);

static void BM_Replay1MMaxSplitGc(benchmark::State& state) {
    const Trace& t = trace_1m();
    ReplayOptions opt;
    opt.capacity = GiB(80);
    opt.config = AllocatorConfig::parse("max_split_size_mb:128,garbage_collection_threshold:0.8").value();
    for (auto _ : state) {
        auto r = replay(t, opt);
        benchmark::DoNotOptimize(r);
        state.counters["peak_reserved_GiB"] = r.peak_reserved.gib();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.events.size()));
}
BENCHMARK(BM_Replay1MMaxSplitGc)->Unit(benchmark::kMillisecond);

static void BM_Replay1MNoAllocator(benchmark::State& state) {
    const Trace& t = trace_1m();
    ReplayOptions opt;
    opt.mode = AllocatorMode::None;
    for (auto _ : state) {
        auto r = replay(t, opt);
        benchmark::DoNotOptimize(r);
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.events.size()));
}
BENCHMARK(BM_Replay1MNoAllocator)->Unit(benchmark::kMillisecond);

// A fragmented small pool: 200,000 tensors of 512 bytes, every other one
// freed (100,000 free blocks of one size, none mergeable), reused, then freed
// in a scattered order and the rest after them (each free merges with its
// neighbours). One size class then holds 100,000 blocks: its free set must
// stay logarithmic per operation (a single sorted array of them moved half
// of itself per free: 3.8 s for the 100,000 frees).
static void BM_FragmentedSmallPool(benchmark::State& state) {
    const std::int64_t n = 200'000;
    std::vector<std::int64_t> scattered;
    for (std::int64_t i = 0; i < n; i += 2) scattered.push_back(i);
    Rng rng{7};
    for (std::size_t i = scattered.size(); i > 1; --i) std::swap(scattered[i - 1], scattered[rng.next() % i]);
    for (auto _ : state) {
        CachingAllocator a({}, GiB(80));
        std::vector<BlockHandle> h(static_cast<std::size_t>(n));
        for (auto& x : h) x = a.malloc(Bytes(512)).handle;
        for (std::int64_t i = 0; i < n; i += 2) a.free(h[static_cast<std::size_t>(i)]);
        for (std::int64_t i = 0; i < n; i += 2) h[static_cast<std::size_t>(i)] = a.malloc(Bytes(512)).handle;
        for (std::int64_t i : scattered) a.free(h[static_cast<std::size_t>(i)]);
        for (std::int64_t i = 1; i < n; i += 2) a.free(h[static_cast<std::size_t>(i)]);
        benchmark::DoNotOptimize(a.stats().reserved);
    }
    state.SetItemsProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_FragmentedSmallPool)->Unit(benchmark::kMillisecond);
