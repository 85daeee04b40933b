// gpumem/sim/snapshot.hpp — real PyTorch CUDA memory snapshots.
//
// torch.cuda.memory._record_memory_history() + _dump_snapshot("snap.pickle")
// record what the caching allocator did; this module reads that file (the
// pickle, or the same data saved as JSON), summarizes the allocator state at
// the dump, and turns the recorded event trace into a sim::Trace that
// replay() runs through gpumem's allocator model — so a measured run and a
// simulated one can be compared event for event.
//
// Layouts read (torch/cuda/memory.py _snapshot docstring, torch/csrc/cuda/
// Module.cpp memorySnapshot, torch/cuda/_memory_viz.py):
//   new (PyTorch >= 2.1)  {"segments": [...], "device_traces": [[...], ...],
//                          "allocator_settings": {...}}; blocks carry "frames"
//                          and "requested_size"; trace entries carry action,
//                          addr (device_free for "oom"), size, stream,
//                          time_us, frames.
//   old (PyTorch ~2.0)    blocks carry "history": [{addr, real_size, frames}]
//                          (most recent first) instead of frames; the top level
//                          may lack device_traces.
//   oldest                memory_snapshot(): a bare list of segments.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/sim/trace.hpp"

namespace gpumem::sim {

struct SnapshotFrame {
    std::string filename;
    std::int64_t line = 0;
    std::string name;
};
// "train.py:42 forward" (file name without directories).
std::string frame_label(const SnapshotFrame& f);

enum class BlockState : std::uint8_t { ActiveAllocated, ActivePendingFree, Inactive, Unknown };
const char* block_state_name(BlockState s);

struct SnapshotHistoryEntry {  // old layout: one allocation that used the block
    std::int64_t addr = 0;
    Bytes real_size;
    std::int32_t frame = -1;  // index into Snapshot::frames
};

struct SnapshotBlock {
    std::int64_t address = 0;
    Bytes size;            // the rounded block size
    Bytes requested_size;  // what the program asked for (== size when unknown)
    BlockState state = BlockState::Unknown;
    std::int32_t frame = -1;                   // top frame of the allocation
    std::vector<SnapshotHistoryEntry> history; // old layout only
};

struct SnapshotSegment {
    int device = 0;
    std::int64_t address = 0;
    Bytes total_size;
    Bytes allocated_size;
    Bytes active_size;
    Bytes requested_size;
    std::int64_t stream = 0;
    std::string segment_type;  // "small" | "large"
    bool is_expandable = false;
    std::vector<SnapshotBlock> blocks;
};

enum class TraceAction : std::uint8_t {
    Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap, Snapshot, Oom, Other
};
const char* trace_action_name(TraceAction a);

struct SnapshotTraceEntry {
    TraceAction action = TraceAction::Other;
    std::int64_t addr = 0;     // absent for "oom"
    Bytes size;                // alloc / free_*: the requested size; oom: the failed request
    std::int64_t stream = 0;
    std::int64_t time_us = 0;
    Bytes device_free;         // "oom" only: what cudaMemGetInfo reported free
    std::int32_t frame = -1;   // index into Snapshot::frames
};

enum class SnapshotLayout : std::uint8_t { DeviceTraces, BlockHistory, SegmentsOnly };
const char* snapshot_layout_name(SnapshotLayout l);

struct Snapshot {
    std::string origin;            // file name (or what the caller passed)
    std::string format;            // "pickle" | "json"
    int pickle_protocol = 0;
    SnapshotLayout layout = SnapshotLayout::SegmentsOnly;
    bool has_device_traces = false;  // the key is present (it may hold empty lists)
    std::vector<SnapshotSegment> segments;
    std::vector<std::vector<SnapshotTraceEntry>> device_traces;  // [device][entry]
    // Read by read_snapshot_streaming: entries handed to the sink per device
    // (device_traces then has one empty list per device).
    std::vector<std::int64_t> streamed_entries;
    std::map<std::string, std::string> allocator_settings;      // values as text ("True", "128", "[...]")
    std::vector<SnapshotFrame> frames;                           // interned top frames
    std::vector<std::string> notes;                              // things the reader tolerated
};

// What one analyze_snapshot() call may add to the process's resident size
// (reading, converting and replaying together; checked as it goes, see
// WorkBudget::MemoryLimit). Between two checks a vector's reallocation can
// briefly hold old and new copies; with that, the process's own few MiB and
// the mapped file's pages around the read position (at most ~33 MiB), the
// whole stays under 1 GiB (crafted files peaked at 823 MB;
// tests/hostile_input_test.cpp checks it). The 10^7-entry trace of bench/snapshot_bench.cpp takes about
// 600 MiB. A JSON file of 64 MiB or more is read by two threads
// (src/sim/snapshot_internal.hpp): while it is read, the second thread's
// records (at most 160 MiB, left out of this count) and its own ~33 MiB of
// the file come on top, under 1 GiB still (720 + 160 + 2 x 33 MiB).
inline constexpr std::int64_t kMaxSnapshotMemory = std::int64_t(720) << 20;

// Reads a snapshot file: a pickle (first byte 0x80) or JSON, whole: the
// document and every trace entry are held (for tests and small files; the
// commands read through analyze_snapshot(), which streams and whose memory
// is bounded by kMaxSnapshotMemory).
Result<Snapshot> read_snapshot(const std::string& path);
// The same from bytes; `origin` names the data in error messages.
Result<Snapshot> parse_snapshot_bytes(std::string_view data, std::string origin);

// Streaming reading: the trace entries go to a sink as they are parsed, in
// order per device, and are not kept (a 10^7-entry trace never sits in
// memory, nor does the file: it is mapped and read front to back).
class TraceEntrySink {
public:
    virtual ~TraceEntrySink() = default;
    // Entry `index` of device `device`'s trace. Its frame indexes the
    // Snapshot's frames (complete when reading returns).
    virtual void entry(int device, std::int64_t index, const SnapshotTraceEntry& e) = 0;
    // Forget every entry seen so far: they are all handed over again (a
    // pickle whose structure the streaming parser could not follow).
    virtual void restart() = 0;
};
Result<Snapshot> read_snapshot_streaming(const std::string& path, TraceEntrySink& sink);
Result<Snapshot> parse_snapshot_streaming(std::string_view data, std::string origin, TraceEntrySink& sink);

struct SizeBucket {
    std::string label;   // "<=2MiB", "2MiB-20MiB", ...
    Bytes min;           // exclusive, except the first bucket (0)
    Bytes max;           // inclusive; Bytes(INT64_MAX) for the last
    std::int64_t count = 0;
    Bytes bytes;
};

struct SnapshotAllocation {
    std::int64_t address = 0;
    Bytes size;
    Bytes requested;
    std::int64_t stream = 0;
    int device = 0;
    std::string frame;  // frame_label() of the top frame, "" if unknown
};

struct SnapshotTraceStats {
    int device = 0;
    std::int64_t entries = 0;
    std::int64_t alloc = 0, free_requested = 0, free_completed = 0;
    std::int64_t segment_alloc = 0, segment_free = 0, segment_map = 0, segment_unmap = 0;
    std::int64_t snapshot = 0, oom = 0, other = 0;
    // Counts one entry (entries and its action's counter).
    void count(TraceAction a);
};

struct SnapshotOom {
    int device = 0;
    std::int64_t entry = 0;  // index in that device's trace
    Bytes requested;
    Bytes device_free;
    std::int64_t time_us = 0;
    std::string frame;
};

// How a trace for replay was derived (filled by to_trace_detailed / analyze).
struct TraceConversionInfo {
    int device = 0;
    std::string source;  // "device_traces" | "block_history" | "active_blocks"
    std::int64_t events = 0, allocs = 0, frees = 0;
    std::int64_t seeded = 0;          // allocations live before the trace began, added at its start
    Bytes seeded_bytes;
    std::int64_t implicit_frees = 0;  // alloc at a live address: its missing free was added
    std::int64_t unmatched_frees = 0; // free of an address never allocated (and not seeded)
    std::int64_t ignored = 0;         // segment_*, snapshot, oom and the unused free kind
    std::int64_t ooms = 0;
    std::string free_action;          // "free_completed" | "free_requested" | ""
};

struct SnapshotSummary {
    std::string origin;
    std::string format;
    int pickle_protocol = 0;
    SnapshotLayout layout = SnapshotLayout::SegmentsOnly;
    std::vector<int> devices;  // devices with segments or trace entries

    // State at the dump (all devices together).
    Bytes reserved;             // sum of segment sizes: memory_reserved()
    Bytes allocated;            // active_allocated blocks: memory_allocated()
    Bytes requested;            // their requested sizes
    Bytes active_pending_free;  // freed, waiting on stream events
    Bytes inactive;             // cached free blocks
    Bytes fragmentation;        // reserved - allocated
    Bytes largest_free_block;
    std::int64_t segments = 0, small_segments = 0, large_segments = 0, expandable_segments = 0;
    Bytes small_reserved, large_reserved;
    std::int64_t blocks = 0, active_blocks = 0, pending_free_blocks = 0, inactive_blocks = 0;
    std::vector<SizeBucket> segment_sizes;          // histogram of segment sizes
    std::vector<SnapshotAllocation> top_allocations;  // largest active blocks, largest first

    std::vector<SnapshotTraceStats> traces;  // per device with entries
    std::vector<SnapshotOom> ooms;
    std::map<std::string, std::string> allocator_settings;

    std::optional<TraceConversionInfo> conversion;  // set by analyze_snapshot
    std::string replay_config;                      // allocator config replayed with
    std::vector<std::string> notes;
};

SnapshotSummary summarize(const Snapshot& s, std::int64_t top_n = 10);
// The trace part of a summary, gathered while the entries streamed by.
struct StreamedTraceStats {
    std::vector<SnapshotTraceStats> traces;  // by device (entries 0: none)
    std::vector<SnapshotOom> ooms;           // by device, then entry
};
// summarize() with the trace statistics taken from `streamed` (when not
// null) instead of s.device_traces.
SnapshotSummary summarize(const Snapshot& s, std::int64_t top_n, const StreamedTraceStats* streamed);

struct TraceConversion {
    Trace trace;
    TraceConversionInfo info;
    std::vector<std::string> notes;
};

// The trace of one device for replay():
//   alloc                          -> Alloc (size = the trace's requested size; the
//                                     id follows the address until it is freed)
//   free_completed                 -> Free (free_requested when the device trace has
//                                     no free_completed at all)
//   segment_*, snapshot            -> ignored (the allocator model makes its own)
//   oom                            -> counted and noted
// Allocations alive before the trace began (freed in it without an alloc, or
// active at the dump without one) are added at its start. Without device
// traces the trace is built from the blocks live at the dump (their history's
// real_size in the old layout), allocs only, in address order.
TraceConversion to_trace_detailed(const Snapshot& s, int device);
Trace to_trace(const Snapshot& s, int device);

// The device analyze_snapshot() picks: the lowest with trace entries, else the
// lowest with segments, else 0.
int default_device(const Snapshot& s);

struct SnapshotOptions {
    ReplayOptions replay;
    // When true and the snapshot records a non-empty PYTORCH_CUDA_ALLOC_CONF,
    // replay with it instead of replay.config (set false for --alloc-conf).
    bool config_from_snapshot = true;
    int device = -1;          // -1: default_device()
    std::int64_t top_n = 10;  // largest allocations listed
    bool run_replay = true;
};

// The replay options an analysis uses: opt.replay, with the snapshot's
// recorded PYTORCH_CUDA_ALLOC_CONF when opt.config_from_snapshot and it
// parses; a note in `notes` says which was used.
ReplayOptions snapshot_replay_options(const Snapshot& s, const SnapshotOptions& opt, std::vector<std::string>& notes);

struct SnapshotReport {
    SnapshotSummary summary;
    std::optional<ReplayResult> replay;
};

// Reads, summarizes, converts and replays: the one call a front end needs.
Result<SnapshotReport> analyze_snapshot(const std::string& path, const SnapshotOptions& opt);
Result<SnapshotReport> analyze_snapshot(const std::string& path, const ReplayOptions& replay);
// The same on data already read (origin names it in messages).
Result<SnapshotReport> analyze_snapshot_bytes(std::string_view data, std::string origin, const SnapshotOptions& opt);

}  // namespace gpumem::sim
