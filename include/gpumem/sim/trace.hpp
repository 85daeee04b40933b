// gpumem/sim/trace.hpp — memory event traces and their replay.
//
// A trace is the ordered list of allocations and frees one program makes:
// generated from the model graph by the step simulator (sim/step.hpp) or read
// from a real PyTorch memory snapshot (sim/snapshot.hpp). replay() runs a
// trace through the caching allocator model (or through none: pure live-tensor
// bytes, what PyTorch's CPU profiler sees) and records the timeline.
//
//   event:   alloc t1  alloc t2  free t1  alloc t3 ...
//   live:    |--t1---|
//                 |----t2---------------...
//   replay:  allocated / reserved after every event, peaks, OOM if any
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/sim/allocator.hpp"

namespace gpumem::sim {

enum class Phase : std::uint8_t { Setup, Forward, Loss, Backward, Optimizer, ZeroGrad, Prefill, Decode, Replay };
const char* phase_name(Phase p);

struct TraceEvent {
    enum class Kind : std::uint8_t { Alloc, Free, EmptyCache, PhaseMark };
    Kind kind = Kind::Alloc;
    Phase phase = Phase::Replay;
    int stream = 0;
    std::int64_t id = 0;       // tensor id: an Alloc and its Free share it
    Bytes size;                // Alloc: requested bytes
    std::int32_t label = -1;   // index into Trace::labels (what the tensor is)
    std::int32_t step = 0;     // training step (0 = first)
};

struct Trace {
    std::vector<TraceEvent> events;
    std::vector<std::string> labels;  // "layers.3.mlp.down_proj (activation)", ...
    std::int32_t add_label(std::string s);
};

enum class AllocatorMode { PyTorch, None };

struct ReplayOptions {
    AllocatorMode mode = AllocatorMode::PyTorch;
    AllocatorConfig config;
    Bytes capacity = Bytes(INT64_MAX / 4);   // what cudaMalloc can give
    bool record_timeline = true;
    std::int64_t max_timeline_points = 4000;  // downsampled, peaks kept
    std::int64_t top_tensors = 10;            // largest live tensors at the peak
    // Stop at the first allocation that fails (the result then holds that OOM
    // and the replay up to it): for a caller that only asks "does it fit?".
    // After an OOM every failing allocation walks the whole cache (emptyCache
    // before the retry), which on a large trace costs minutes.
    bool stop_at_oom = false;
};

struct TimelinePoint {
    std::int64_t event = 0;  // index into the trace
    Phase phase = Phase::Replay;
    std::int32_t step = 0;
    Bytes allocated;
    Bytes reserved;
};

struct LiveTensor {
    std::int64_t id = 0;
    Bytes size;
    std::string label;
    Phase phase = Phase::Replay;  // phase it was allocated in
};

struct PhasePeak {
    Phase phase = Phase::Replay;
    std::int32_t step = 0;
    Bytes peak_allocated;
    Bytes peak_reserved;
};

struct ReplayResult {
    Bytes peak_allocated;
    Bytes peak_reserved;
    std::int64_t peak_event = -1;          // event index of the allocated peak
    Phase peak_phase = Phase::Replay;
    std::int32_t peak_step = 0;
    Bytes final_allocated;
    Bytes final_reserved;
    Bytes fragmentation_at_peak;           // reserved - allocated when allocated peaked
    Bytes largest_free_block_at_peak;
    // CUDA graph private pools (streams >= kGraphPoolStream): their largest
    // reservation, and their reserved bytes no tensor used when reserved peaked.
    Bytes graph_pool_reserved;
    Bytes graph_pool_free_at_reserved_peak;
    std::vector<LiveTensor> top_at_peak;   // largest live tensors at the peak
    std::vector<PhasePeak> phases;         // per (step, phase), in trace order
    std::vector<TimelinePoint> timeline;
    std::optional<OomInfo> oom;            // first OOM, if the trace did not fit
    std::int64_t oom_event = -1;
    std::int64_t failed_allocs = 0;        // allocations that hit OOM (skipped, with their frees)
    std::int64_t unknown_frees = 0;        // frees of ids never allocated (or already freed): ignored
    std::int64_t duplicate_allocs = 0;     // allocs of an id that is still live: ignored
    AllocatorStats allocator;
};

ReplayResult replay(const Trace& trace, const ReplayOptions& opt);

}  // namespace gpumem::sim
