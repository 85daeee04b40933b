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

// Steady-state extrapolation (sim/step.hpp): the trace left out `copies`
// repetitions of its events [begin, at) just before event `at`. Replayed from
// the allocator state at `at`, which was found equal to the state at `begin`,
// they would repeat exactly what [begin, at) did, so replay() reports what the
// full trace gives: the left-out events counted, their per-phase rows
// repeated, event indices after `at` shifted.
struct TraceCut {
    std::int64_t begin = 0;
    std::int64_t at = 0;
    std::int64_t copies = 0;
};

struct Trace {
    std::vector<TraceEvent> events;
    std::vector<std::string> labels;  // "layers.3.mlp.down_proj (activation)", ...
    std::vector<TraceCut> cuts;       // in order of `at`
    std::int32_t add_label(std::string s);
    // Events of the full trace: events.size() plus those the cuts left out.
    [[nodiscard]] std::int64_t full_events() const;
    // The index in the full trace of event `i` of this one.
    [[nodiscard]] std::int64_t full_index(std::int64_t i) const;
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
    // Rows of ReplayResult::phases repeated for one steady-state cut stop at
    // this many rows (the rows left out repeat the ones shown): a job of 10^6
    // micro-batches would otherwise list millions.
    std::int64_t max_cut_phase_rows = 2048;
    // Also tell, in the same pass, what a replay against this capacity with
    // stop_at_oom would give (0: not asked): ReplayResult::at_capacity_*.
    // For a replay with more capacity than this (a caller that wants both
    // "where would it fail on this GPU" and "what does it need"). Up to the
    // first cudaMalloc that would pass this capacity the two replays make the
    // same moves; from there the allocator's state is copied and the limited
    // replay runs on to its out-of-memory (CachingAllocator::watch_capacity).
    Bytes oom_capacity;
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
    std::int64_t events = 0;               // events of the full trace (Trace::full_events)
    std::int64_t peak_event = -1;          // event index of the allocated peak (Trace::full_index maps it)
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
    // Requested bytes live at the allocated peak by TraceEvent::label (the
    // last entry: unlabelled tensors); filled with top_at_peak (top_tensors > 0).
    std::vector<Bytes> live_by_label;
    std::vector<PhasePeak> phases;         // per (step, phase), in trace order
    std::int64_t phases_left_out = 0;      // rows of steady-state cuts not listed (max_cut_phase_rows)
    std::vector<TimelinePoint> timeline;   // events: indices in the full trace
    std::optional<OomInfo> oom;            // first OOM, if the trace did not fit
    std::int64_t oom_event = -1;
    std::int64_t failed_allocs = 0;        // allocations that hit OOM (skipped, with their frees)
    std::int64_t unknown_frees = 0;        // frees of ids never allocated (or already freed): ignored
    std::int64_t duplicate_allocs = 0;     // allocs of an id that is still live: ignored
    AllocatorStats allocator;
    // ReplayOptions::oom_capacity. Known: a replay against that capacity runs
    // out of memory at at_capacity_oom_event with at_capacity_oom, or, with no
    // at_capacity_oom, never needs more than it and gives this result. Not
    // known (the caching allocator model with expandable segments or garbage
    // collection, no allocator model, steady-state cuts, an allocation that
    // fails here too, a limited replay that fits once it frees its cache):
    // replay against the capacity to know.
    bool at_capacity_known = false;
    std::optional<OomInfo> at_capacity_oom;
    std::int64_t at_capacity_oom_event = -1;
};

ReplayResult replay(const Trace& trace, const ReplayOptions& opt);
// replay() hands its live-tensor table's storage (at most 2^18 ids, 4.25 MiB)
// to the next replay on the same thread; this frees it (release_trace_storage
// does too: a long-lived thread keeps nothing between requests).
void release_replay_storage();

// Replays a trace as it grows (the step builder feeds it at each period
// boundary) and describes the state everything after depends on: the
// allocator's (CachingAllocator::signature) and the live tensors, each named
// by its id when allocated before `base_id`, else by its distance from
// `next_id` (the same tensor of a later period has the same distance).
class StateProbe {
public:
    explicit StateProbe(const ReplayOptions& opt);
    ~StateProbe();
    StateProbe(const StateProbe&) = delete;
    StateProbe& operator=(const StateProbe&) = delete;
    void feed(const Trace& trace);  // the events added since the last call
    [[nodiscard]] std::vector<std::int64_t> signature(std::int64_t base_id, std::int64_t next_id) const;

private:
    struct Impl;
    Impl* impl_;
};

}  // namespace gpumem::sim
