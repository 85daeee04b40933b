// PyTorch memory snapshots, part 2: the allocator state at the dump (reserved,
// allocated, fragmentation, segment sizes, largest allocations) and what the
// event trace holds. Fields as torch/cuda/memory.py's _snapshot docstring
// describes them.
#include "gpumem/sim/snapshot.hpp"

#include <algorithm>
#include <set>

namespace gpumem::sim {

void SnapshotTraceStats::count(TraceAction a) {
    ++entries;
    switch (a) {
        case TraceAction::Alloc: ++alloc; break;
        case TraceAction::FreeRequested: ++free_requested; break;
        case TraceAction::FreeCompleted: ++free_completed; break;
        case TraceAction::SegmentAlloc: ++segment_alloc; break;
        case TraceAction::SegmentFree: ++segment_free; break;
        case TraceAction::SegmentMap: ++segment_map; break;
        case TraceAction::SegmentUnmap: ++segment_unmap; break;
        case TraceAction::Snapshot: ++snapshot; break;
        case TraceAction::Oom: ++oom; break;
        case TraceAction::Other: ++other; break;
    }
}

// ---------------------------------------------------------------------------
// Summary.

SnapshotSummary summarize(const Snapshot& s, std::int64_t top_n) { return summarize(s, top_n, nullptr); }

SnapshotSummary summarize(const Snapshot& s, std::int64_t top_n, const StreamedTraceStats* streamed) {
    SnapshotSummary out;
    out.origin = s.origin;
    out.format = s.format;
    out.pickle_protocol = s.pickle_protocol;
    out.layout = s.layout;
    out.allocator_settings = s.allocator_settings;
    out.notes = s.notes;

    struct Edge {
        const char* label;
        Bytes max;
    };
    const Edge edges[] = {{"<=2MiB", MiB(2)},         {"2MiB-20MiB", MiB(20)},     {"20MiB-128MiB", MiB(128)},
                          {"128MiB-1GiB", GiB(1)},    {">1GiB", Bytes(INT64_MAX)}};
    Bytes lo(0);
    for (const auto& e : edges) {
        out.segment_sizes.push_back(SizeBucket{e.label, lo, e.max, 0, Bytes(0)});
        lo = e.max;
    }

    std::set<int> devices;
    std::vector<SnapshotAllocation> active;
    std::int64_t inconsistent = 0;
    for (const auto& seg : s.segments) {
        devices.insert(seg.device);
        out.reserved += seg.total_size;
        ++out.segments;
        if (seg.segment_type == "small") {
            ++out.small_segments;
            out.small_reserved += seg.total_size;
        } else {
            ++out.large_segments;
            out.large_reserved += seg.total_size;
        }
        if (seg.is_expandable) ++out.expandable_segments;
        for (auto& b : out.segment_sizes) {
            if (seg.total_size <= b.max) {
                ++b.count;
                b.bytes += seg.total_size;
                break;
            }
        }
        Bytes sum(0);
        for (const auto& blk : seg.blocks) {
            sum += blk.size;
            ++out.blocks;
            switch (blk.state) {
                case BlockState::ActiveAllocated:
                    ++out.active_blocks;
                    out.allocated += blk.size;
                    out.requested += blk.requested_size;
                    active.push_back(SnapshotAllocation{blk.address, blk.size, blk.requested_size, seg.stream, seg.device,
                                                        blk.frame >= 0 ? frame_label(s.frames[static_cast<std::size_t>(blk.frame)]) : ""});
                    break;
                case BlockState::ActivePendingFree:
                    ++out.pending_free_blocks;
                    out.active_pending_free += blk.size;
                    break;
                case BlockState::Inactive:
                    ++out.inactive_blocks;
                    out.inactive += blk.size;
                    out.largest_free_block = max(out.largest_free_block, blk.size);
                    break;
                case BlockState::Unknown: break;
            }
        }
        if (!seg.blocks.empty() && sum != seg.total_size) ++inconsistent;
    }
    out.fragmentation = out.reserved - out.allocated;
    if (inconsistent)
        out.notes.push_back(std::to_string(inconsistent) + " segment(s) whose blocks do not add up to total_size");

    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(0, top_n));
    const auto by_size = [](const SnapshotAllocation& a, const SnapshotAllocation& b) {
        return a.size != b.size ? a.size > b.size : a.address < b.address;
    };
    if (active.size() > n) {
        std::partial_sort(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(n), active.end(), by_size);
        active.resize(n);
    } else {
        std::sort(active.begin(), active.end(), by_size);
    }
    out.top_allocations = std::move(active);

    if (streamed) {
        for (const auto& st : streamed->traces) {
            if (st.entries == 0) continue;
            devices.insert(st.device);
            out.traces.push_back(st);
        }
        out.ooms = streamed->ooms;
    }
    for (std::size_t d = 0; d < s.device_traces.size() && !streamed; ++d) {
        const auto& entries = s.device_traces[d];
        if (entries.empty()) continue;
        devices.insert(static_cast<int>(d));
        SnapshotTraceStats st;
        st.device = static_cast<int>(d);
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const auto& e = entries[i];
            st.count(e.action);
            if (e.action == TraceAction::Oom)
                out.ooms.push_back(SnapshotOom{static_cast<int>(d), static_cast<std::int64_t>(i), e.size, e.device_free, e.time_us,
                                               e.frame >= 0 ? frame_label(s.frames[static_cast<std::size_t>(e.frame)]) : ""});
        }
        out.traces.push_back(st);
    }
    out.devices.assign(devices.begin(), devices.end());
    if (out.devices.size() > 1)
        out.notes.push_back("the snapshot covers " + std::to_string(out.devices.size()) +
                            " devices; the state figures add them up, the replay uses one");
    return out;
}

}  // namespace gpumem::sim
