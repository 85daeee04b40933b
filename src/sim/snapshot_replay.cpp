// PyTorch memory snapshots, part 3: the recorded event trace (or the blocks
// live at the dump) turned into a sim::Trace for replay() through gpumem's
// allocator model, and analyze_snapshot(), the front end's one call. Trace
// entries mean what torch/cuda/memory.py's _snapshot docstring says.
#include "gpumem/sim/snapshot.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include <sys/mman.h>

#include "gpumem/core/addr_table.hpp"
#include "gpumem/core/budget.hpp"

namespace gpumem::sim {

// ---------------------------------------------------------------------------
// Trace conversion.

int default_device(const Snapshot& s) {
    for (std::size_t d = 0; d < s.device_traces.size(); ++d)
        if (!s.device_traces[d].empty()) return static_cast<int>(d);
    int best = -1;
    for (const auto& seg : s.segments)
        if (best < 0 || seg.device < best) best = seg.device;
    return best < 0 ? 0 : best;
}

namespace {

// What a streamed read keeps of each entry of the replayed device (no time;
// an "oom" entry, which has no address, keeps device_free in addr), as the
// conversion reads it. KeptEntries stores it in 24 bytes.
struct KeptEntry {
    std::int64_t addr = 0;
    Bytes size;
    std::int64_t stream = 0;
    std::int32_t frame = -1;
    TraceAction action = TraceAction::Other;
};
Bytes device_free_of(const SnapshotTraceEntry& e) { return e.device_free; }
Bytes device_free_of(const KeptEntry& e) { return Bytes(e.addr); }

// The conversion's first pass over one entry (from_device_trace, and
// KeptEntries' scan beside the reading): the trace names `addr`; true when
// it is a free of an address the trace never named before (an allocation
// made before the trace began).
bool first_pass_seed(AddrTable<char>& seen, TraceAction action, TraceAction free_action, std::int64_t addr) {
    if (action == TraceAction::Alloc) {
        seen.insert(addr, 0);
        return false;
    }
    return action == free_action && seen.insert(addr, 0);
}
// The entries a streamed read keeps, in chunks of 1.5 MiB mapped from the
// system. The conversion hands each chunk back once it has read it, so the
// entries and the trace made of them are never all resident at once: they
// were the peak of a large snapshot's analysis (10M entries: 320 MB of
// entries beside the trace), and the peak is what kMaxSnapshotMemory bounds
// (RSS, see core/budget.hpp).
//
// An entry takes 24 bytes, not SnapshotTraceEntry's 48: the stream (a CUDA
// stream's handle) is kept as the index of its first appearance among the
// kept entries (a trace has a handful), beside the action in one word.
//
// The conversion's first pass (from_device_trace: which addresses the trace
// names, and the frees of addresses it never allocated) runs beside the
// reading, on a second thread, over each chunk once the reader has filled
// it: it was 0.16 s of the 2 s a 10M-entry pickle took, all of it after the
// reading. The scan takes free_completed as the free (a trace that records
// completed frees, as PyTorch 2.1 and later do); the conversion uses what it
// found only if that holds, and reads the entries again otherwise.
class KeptEntries {
public:
    static constexpr std::size_t kPerChunk = std::size_t(1) << 16;  // x 24 B = 1.5 MiB
    KeptEntries() = default;
    KeptEntries(const KeptEntries&) = delete;
    KeptEntries& operator=(const KeptEntries&) = delete;
    ~KeptEntries() { clear(); }

    // What the scan found: every address an alloc or a free_completed names,
    // and in entry order the free_completed entries of an address not named
    // before (the stream as its index: stream_at).
    struct ScanSeed {
        std::int64_t addr;
        std::uint32_t stream_index;
        Bytes size;
        std::int32_t frame;
    };
    struct ScanResult {
        AddrTable<char> seen;
        std::vector<ScanSeed> seeds;
    };
    [[nodiscard]] std::int64_t stream_at(std::uint32_t index) const { return streams_[index]; }
    // Hands the scan the entries after its last chunk and waits for it: its
    // result over every entry kept, or null (no scan ran: fewer entries than
    // a chunk, one core, or it failed). The scan stops either way.
    ScanResult* finish_scan() {
        if (!scan_) return nullptr;
        if (size_ % kPerChunk != 0 && !scan_->hand(chunks_.back(), size_ % kPerChunk)) scan_.reset();
        if (scan_ && !scan_->finish()) scan_.reset();
        return scan_ ? &scan_->result : nullptr;
    }

    void push_back(const SnapshotTraceEntry& e) {
        if (size_ % kPerChunk == 0) {
            if (chunks_.size() == chunks_.capacity()) chunks_.reserve(2 * chunks_.size() + 8);  // (no throw after the map)
            void* p = ::mmap(nullptr, kChunkBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            chunks_.push_back(static_cast<Packed*>(p));
        }
        std::uint32_t si = 0;
        if (!streams_.empty() && e.stream == streams_[last_stream_]) {
            si = last_stream_;  // (most entries are on the stream before's)
        } else if (const auto it = stream_index_.find(e.stream); it != stream_index_.end()) {
            si = it->second;
        } else {
            // More distinct streams than 2^28 would need more entries than
            // kMaxSnapshotMemory holds: never reached.
            if (streams_.size() >= kMaxStreams) throw std::bad_alloc();
            si = static_cast<std::uint32_t>(streams_.size());
            streams_.push_back(e.stream);
            stream_index_.emplace(e.stream, si);
        }
        last_stream_ = si;
        ++action_counts_[static_cast<std::size_t>(e.action)];
        chunks_.back()[size_ % kPerChunk] =
            Packed{e.action == TraceAction::Oom ? e.device_free.count() : e.addr, e.size.count(),
                   si | (static_cast<std::uint32_t>(e.action) << kStreamBits), e.frame};
        ++size_;
        if (size_ % kPerChunk == 0) scan_chunk(chunks_.back());
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] bool empty() const { return size_ == 0; }
    // Entries kept of each action (TraceAction's values as indexes).
    [[nodiscard]] std::int64_t count(TraceAction a) const { return action_counts_[static_cast<std::size_t>(a)]; }
    // Hands back the chunks wholly before entry `i`: they are not read again.
    void release_before(std::size_t i) {
        scan_.reset();  // (the scan reads the chunks: finished, or stopped here)
        for (; released_ < i / kPerChunk && released_ < chunks_.size(); ++released_) {
            ::munmap(chunks_[released_], kChunkBytes);
            chunks_[released_] = nullptr;
        }
    }
    void clear() {
        scan_.reset();
        scan_started_ = false;
        for (Packed* c : chunks_)
            if (c) ::munmap(c, kChunkBytes);
        chunks_.clear();
        size_ = 0;
        released_ = 0;
        streams_.clear();
        stream_index_.clear();
        last_stream_ = 0;
        action_counts_ = {};
    }

    class const_iterator {
    public:
        const_iterator(const KeptEntries* k, std::size_t i) : k_(k), i_(i) {}
        KeptEntry operator*() const {
            const Packed& p = k_->chunks_[i_ / kPerChunk][i_ % kPerChunk];
            return KeptEntry{p.addr, Bytes(p.size), k_->streams_[p.stream_action & kStreamMask], p.frame,
                             static_cast<TraceAction>(p.stream_action >> kStreamBits)};
        }
        const_iterator& operator++() {
            ++i_;
            return *this;
        }
        bool operator==(const const_iterator& o) const { return i_ == o.i_; }

    private:
        const KeptEntries* k_;
        std::size_t i_;
    };
    [[nodiscard]] const_iterator begin() const { return {this, 0}; }
    [[nodiscard]] const_iterator end() const { return {this, size_}; }

private:
    struct Packed {
        std::int64_t addr;
        std::int64_t size;
        std::uint32_t stream_action;  // stream index (low kStreamBits), action (above)
        std::int32_t frame;
    };
    static_assert(sizeof(Packed) == 24);
    static constexpr int kStreamBits = 28;
    static constexpr std::uint32_t kStreamMask = (1u << kStreamBits) - 1;
    static constexpr std::size_t kMaxStreams = std::size_t(1) << kStreamBits;
    static_assert(static_cast<std::uint32_t>(TraceAction::Other) < (1u << (32 - kStreamBits)));
    static constexpr std::size_t kChunkBytes = kPerChunk * sizeof(Packed);

    // The first pass's thread: chunks are handed to it as they fill and
    // read there while the reader fills the next (a chunk never changes
    // once handed, and is unmapped only after the scan has stopped).
    class Scan {
    public:
        Scan() : thread_([this] { run(); }) {}
        Scan(const Scan&) = delete;
        Scan& operator=(const Scan&) = delete;
        ~Scan() {
            {
                const std::lock_guard<std::mutex> lock(m_);
                stop_ = true;
            }
            cv_.notify_one();
            if (thread_.joinable()) thread_.join();
        }
        // False when it could not be handed (no memory): the scan is then
        // of no use.
        bool hand(const Packed* chunk, std::size_t n) noexcept {
            try {
                const std::lock_guard<std::mutex> lock(m_);
                jobs_.emplace_back(chunk, n);
            } catch (...) {
                return false;
            }
            cv_.notify_one();
            return true;
        }
        // Waits until every chunk handed is read; false if the scan failed.
        bool finish() {
            {
                const std::lock_guard<std::mutex> lock(m_);
                done_ = true;
            }
            cv_.notify_one();
            thread_.join();
            return !failed_;
        }
        ScanResult result;

    private:
        void run() {
            std::size_t next = 0;
            for (;;) {
                std::pair<const Packed*, std::size_t> job;
                {
                    std::unique_lock<std::mutex> lock(m_);
                    cv_.wait(lock, [&] { return stop_ || done_ || next < jobs_.size(); });
                    if (stop_ || next == jobs_.size()) return;
                    job = jobs_[next++];
                }
                try {
                    read(job.first, job.second);
                } catch (...) {  // (memory: the conversion reads the entries itself, under its budget)
                    failed_ = true;
                    return;
                }
            }
        }
        // from_device_trace's first pass over one chunk, the free being
        // free_completed (each address looked up 16 entries ahead, as there).
        void read(const Packed* c, std::size_t n) {
            constexpr std::size_t kAhead = 16;
            for (std::size_t k = 0; k < n; ++k) {
                if (k + kAhead < n) result.seen.prefetch(c[k + kAhead].addr);
                const Packed& p = c[k];
                const auto action = static_cast<TraceAction>(p.stream_action >> kStreamBits);
                if (first_pass_seed(result.seen, action, TraceAction::FreeCompleted, p.addr))
                    result.seeds.push_back(ScanSeed{p.addr, p.stream_action & kStreamMask, Bytes(p.size), p.frame});
            }
        }
        std::mutex m_;
        std::condition_variable cv_;
        std::vector<std::pair<const Packed*, std::size_t>> jobs_;
        bool stop_ = false, done_ = false;
        bool failed_ = false;  // (the thread's; read after the join)
        std::thread thread_;   // last: started once the rest exists
    };
    // A filled chunk to the scan (started at the first, on a machine with
    // more than one core; a thread that cannot start leaves the pass to the
    // conversion).
    void scan_chunk(const Packed* chunk) {
        if (!scan_started_) {
            scan_started_ = true;
            if (std::thread::hardware_concurrency() > 1) {
                try {
                    scan_ = std::make_unique<Scan>();
                } catch (const std::system_error&) {
                    scan_.reset();
                }
            }
        }
        if (scan_ && !scan_->hand(chunk, kPerChunk)) scan_.reset();
    }

    std::vector<Packed*> chunks_;
    std::size_t size_ = 0;
    std::size_t released_ = 0;  // chunks handed back
    std::vector<std::int64_t> streams_;  // by index
    std::unordered_map<std::int64_t, std::uint32_t> stream_index_;
    std::uint32_t last_stream_ = 0;
    std::array<std::int64_t, static_cast<std::size_t>(TraceAction::Other) + 1> action_counts_{};
    std::unique_ptr<Scan> scan_;
    bool scan_started_ = false;  // (once per filling: a scan that failed or could not start is not tried again)
};
// The conversion read the entries before `i` for the last time.
template <class E>
void release_read(const std::vector<E>&, std::size_t) {}
void release_read(KeptEntries& k, std::size_t i) {
    if (i % KeptEntries::kPerChunk == 0) k.release_before(i);
}

// OOM entries noted one by one; past this, one note counts the rest.
constexpr std::int64_t kMaxOomNotes = 20;
// OOM entries listed in a streamed summary (all are counted).
constexpr std::size_t kMaxOomRecords = 1000;

class TraceBuilder {
public:
    TraceBuilder(const Snapshot& s, TraceConversion& out) : s_(s), out_(out) {}

    std::int64_t alloc(std::int64_t stream, Bytes size, std::int32_t frame) {
        TraceEvent e;
        e.kind = TraceEvent::Kind::Alloc;
        e.stream = stream_id(stream);
        e.id = next_id_++;
        e.size = size;
        e.label = label(frame);
        out_.trace.events.push_back(e);
        ++out_.info.allocs;
        return e.id;
    }
    void free(std::int64_t id, std::int64_t stream, Bytes size) {
        TraceEvent e;
        e.kind = TraceEvent::Kind::Free;
        e.stream = stream_id(stream);
        e.id = id;
        e.size = size;
        out_.trace.events.push_back(e);
        ++out_.info.frees;
    }

private:
    int stream_id(std::int64_t stream) {
        if (stream == 0) return 0;
        const auto it = streams_.find(stream);
        if (it != streams_.end()) return it->second;
        const int id = static_cast<int>(streams_.size()) + 1;
        // Ids from kGraphPoolStream up stand for CUDA graph private pools in the
        // allocator model: a snapshot with that many streams is refused, not misread.
        if (id >= kGraphPoolStream)
            fail(ErrorCode::InvalidArgument, "snapshot",
                 "snapshot: more than " + std::to_string(kGraphPoolStream - 1) +
                     " distinct CUDA streams in the trace; no real program has that many, check the file");
        streams_.emplace(stream, id);
        return id;
    }
    std::int32_t label(std::int32_t frame) {
        if (frame < 0 || static_cast<std::size_t>(frame) >= s_.frames.size()) return -1;
        const auto it = labels_.find(frame);
        if (it != labels_.end()) return it->second;
        const auto idx = static_cast<std::int32_t>(out_.trace.labels.size());
        out_.trace.labels.push_back(frame_label(s_.frames[static_cast<std::size_t>(frame)]));
        labels_.emplace(frame, idx);
        return idx;
    }

    const Snapshot& s_;
    TraceConversion& out_;
    std::int64_t next_id_ = 1;
    std::unordered_map<std::int64_t, int> streams_;
    std::unordered_map<std::int32_t, std::int32_t> labels_;
};

// `entries`: the device's trace (a vector, or the entries a streamed read
// keeps, handed back as the last pass reads them).
// How many entries of each action a trace holds (a pass over a vector; a
// streamed read counted them as it kept them).
struct ActionCounts {
    std::int64_t allocs = 0, completes = 0, requests = 0, segment_frees = 0;
};
ActionCounts count_actions(const std::vector<SnapshotTraceEntry>& entries) {
    ActionCounts c;
    for (const auto& e : entries) {
        c.allocs += e.action == TraceAction::Alloc;
        c.completes += e.action == TraceAction::FreeCompleted;
        c.requests += e.action == TraceAction::FreeRequested;
        c.segment_frees += e.action == TraceAction::SegmentFree || e.action == TraceAction::SegmentUnmap;
    }
    return c;
}
ActionCounts count_actions(const KeptEntries& entries) {
    return {entries.count(TraceAction::Alloc), entries.count(TraceAction::FreeCompleted), entries.count(TraceAction::FreeRequested),
            entries.count(TraceAction::SegmentFree) + entries.count(TraceAction::SegmentUnmap)};
}

template <class Entries>
void from_device_trace(const Snapshot& s, Entries& entries, int device, TraceConversion& out) {
    auto& info = out.info;
    info.source = "device_traces";
    const auto [allocs, completes, requests, segment_frees] = count_actions(entries);
    const bool completed = completes > 0, requested = requests > 0;
    const TraceAction free_action = completed ? TraceAction::FreeCompleted : TraceAction::FreeRequested;
    info.free_action = completed || requested ? trace_action_name(free_action) : "";

    // Pass 1: which allocations were alive before the trace began? A free of
    // an address the trace never mentioned before, and a block active at the
    // dump whose address the trace never mentions.
    struct Seed {
        std::int64_t addr;
        std::int64_t stream;
        Bytes size;
        std::int32_t frame;
    };
    std::vector<Seed> seeds;
    AddrTable<char> seen;  // every address the trace names, as it goes
    bool scanned = false;  // by a streamed read's scan (KeptEntries)
    if constexpr (std::is_same_v<Entries, KeptEntries>) {
        KeptEntries::ScanResult* r = entries.finish_scan();
        if (r && free_action == TraceAction::FreeCompleted) {
            seen = std::move(r->seen);
            seeds.reserve(r->seeds.size());
            for (const auto& sd : r->seeds) seeds.push_back(Seed{sd.addr, entries.stream_at(sd.stream_index), sd.size, sd.frame});
            scanned = true;
        }
    }
    // Both passes below look each entry's address up in a table too large
    // for the cache: the lookup kAhead entries on is started first.
    constexpr int kAhead = 16;
    auto ahead = entries.begin();
    auto restart_ahead = [&] {
        ahead = entries.begin();
        for (int k = 0; k < kAhead && ahead != entries.end(); ++k) ++ahead;
    };
    auto prefetch_ahead = [&](const auto& table) {
        if (ahead == entries.end()) return;
        table.prefetch((*ahead).addr);
        ++ahead;
    };
    if (!scanned) {
        restart_ahead();
        for (const auto& e : entries) {
            prefetch_ahead(seen);
            check_budget();
            if (first_pass_seed(seen, e.action, free_action, e.addr)) seeds.push_back(Seed{e.addr, e.stream, e.size, e.frame});
        }
    }
    std::vector<Seed> at_dump;
    for (const auto& seg : s.segments) {
        if (seg.device != device) continue;
        for (const auto& b : seg.blocks)
            if (b.state == BlockState::ActiveAllocated && !seen.find(b.address))
                at_dump.push_back(Seed{b.address, seg.stream, b.requested_size, b.frame});
    }
    std::sort(at_dump.begin(), at_dump.end(), [](const Seed& a, const Seed& b) { return a.addr < b.addr; });
    seeds.insert(seeds.end(), at_dump.begin(), at_dump.end());

    TraceBuilder tb(s, out);
    struct Live {
        std::int64_t id;
        Bytes size;
    };
    // Every event but an implicit free (rare) has its place reserved.
    out.trace.events.reserve(seeds.size() + static_cast<std::size_t>(allocs + (completed ? completes : requests)));
    AddrTable<Live> live;
    check_memory_now();
    for (const auto& sd : seeds) {
        live.assign(sd.addr, Live{tb.alloc(sd.stream, sd.size, sd.frame), sd.size});
        ++info.seeded;
        info.seeded_bytes += sd.size;
    }
    std::size_t i = 0;
    restart_ahead();
    for (auto at = entries.begin(); at != entries.end(); ++at, ++i) {
        prefetch_ahead(live);
        check_budget();
        release_read(entries, i);
        const auto& e = *at;
        if (e.action == TraceAction::Alloc) {
            if (Live* l = live.find(e.addr)) {
                tb.free(l->id, e.stream, l->size);
                ++info.implicit_frees;
                // (the new allocation takes the entry below)
            }
            live.assign(e.addr, Live{tb.alloc(e.stream, e.size, e.frame), e.size});
        } else if (e.action == free_action) {
            if (Live* l = live.find(e.addr)) {
                tb.free(l->id, e.stream, l->size);
                live.erase(e.addr);
            } else {
                ++info.unmatched_frees;
            }
        } else {
            ++info.ignored;
            if (e.action == TraceAction::Oom && ++info.ooms <= kMaxOomNotes) {
                std::string msg = "device " + std::to_string(device) + " trace entry " + std::to_string(i) +
                                  ": out of memory: tried to allocate " + format_bytes(e.size) + " with " +
                                  format_bytes(device_free_of(e)) + " free on the device";
                if (e.frame >= 0) msg += " (" + frame_label(s.frames[static_cast<std::size_t>(e.frame)]) + ")";
                out.notes.push_back(msg + "; the failed request is not replayed");
            }
        }
    }
    if (info.ooms > kMaxOomNotes)
        out.notes.push_back(std::to_string(info.ooms - kMaxOomNotes) + " more out-of-memory entries (the first " +
                            std::to_string(kMaxOomNotes) + " are noted above); the failed requests are not replayed");
    if (info.seeded)
        out.notes.push_back(std::to_string(info.seeded) + " allocation(s) (" + format_bytes(info.seeded_bytes) +
                            ") made before the trace began were added at its start (the trace buffer keeps only the last "
                            "max_entries events)");
    if (info.implicit_frees)
        out.notes.push_back(std::to_string(info.implicit_frees) +
                            " allocation(s) at an address still in use: the missing free was added before each");
    if (info.unmatched_frees)
        out.notes.push_back(std::to_string(info.unmatched_frees) + " free(s) of addresses not allocated at that point were ignored");
    if (segment_frees)
        out.notes.push_back(std::to_string(segment_frees) +
                            " segment_free/segment_unmap entries (torch.cuda.empty_cache(), or cached memory released to retry "
                            "a failed cudaMalloc) are not replayed: the replay's reserved memory can stay above the run's");
    if (!completed && info.frees)
        out.notes.push_back("the trace has no free_completed events; frees are taken at free_requested");
}

void from_blocks(const Snapshot& s, int device, TraceConversion& out) {
    auto& info = out.info;
    const bool history = s.layout == SnapshotLayout::BlockHistory;
    info.source = history ? "block_history" : "active_blocks";
    TraceBuilder tb(s, out);
    std::int64_t past = 0;
    for (const auto& seg : s.segments) {
        if (seg.device != device) continue;
        for (const auto& b : seg.blocks) {
            const bool live = b.state == BlockState::ActiveAllocated;
            if (!b.history.empty()) past += static_cast<std::int64_t>(b.history.size()) - (live ? 1 : 0);
            if (live) tb.alloc(seg.stream, b.requested_size, b.frame);
        }
    }
    std::string msg = "no event trace for device " + std::to_string(device) + " (record with torch.cuda.memory._record_memory_history()); " +
                      "the replay allocates the " + std::to_string(info.allocs) + " block(s) live at the dump, in address order";
    if (history) msg += " with their history's real_size";
    out.notes.push_back(msg);
    if (past)
        out.notes.push_back(std::to_string(past) + " earlier allocation(s) in the block histories have no timestamps and are not replayed");
}

}  // namespace

TraceConversion to_trace_detailed(const Snapshot& s, int device) {
    TraceConversion out;
    out.info.device = device;
    if (device >= 0 && static_cast<std::size_t>(device) < s.device_traces.size() &&
        !s.device_traces[static_cast<std::size_t>(device)].empty())
        from_device_trace(s, s.device_traces[static_cast<std::size_t>(device)], device, out);
    else
        from_blocks(s, device, out);
    out.info.events = static_cast<std::int64_t>(out.trace.events.size());
    return out;
}

namespace {
// to_trace_detailed() on the entries a streamed read kept for `device`.
TraceConversion to_trace_streamed(const Snapshot& s, KeptEntries& entries, int device) {
    TraceConversion out;
    out.info.device = device;
    if (device >= 0 && !entries.empty())
        from_device_trace(s, entries, device, out);
    else
        from_blocks(s, device, out);
    out.info.events = static_cast<std::int64_t>(out.trace.events.size());
    return out;
}
}  // namespace

Trace to_trace(const Snapshot& s, int device) { return to_trace_detailed(s, device).trace; }

// ---------------------------------------------------------------------------
// The front-end entry point.

ReplayOptions snapshot_replay_options(const Snapshot& s, const SnapshotOptions& opt, std::vector<std::string>& notes) {
    ReplayOptions ro = opt.replay;
    if (!opt.config_from_snapshot) return ro;
    const auto it = s.allocator_settings.find("PYTORCH_CUDA_ALLOC_CONF");
    if (it == s.allocator_settings.end() || it->second.empty() || it->second == "None") return ro;
    auto cfg = AllocatorConfig::parse(it->second);
    if (cfg) {
        ro.config = cfg.value();
        notes.push_back("replayed with the snapshot's PYTORCH_CUDA_ALLOC_CONF=" + it->second);
    } else {
        notes.push_back("the snapshot's PYTORCH_CUDA_ALLOC_CONF could not be used (" + cfg.error().message +
                        "); replayed with the default configuration");
    }
    return ro;
}

namespace {
// `kept`: the trace entries of the one device the streamed read kept
// (snap.device_traces holds none); `streamed`: every device's statistics.
SnapshotReport analyze(Snapshot snap, const SnapshotOptions& opt, const StreamedTraceStats& streamed,
                       KeptEntries& kept, int kept_device) {
    SnapshotReport rep;
    rep.summary = summarize(snap, opt.top_n, &streamed);
    std::int64_t ooms = 0;
    for (const auto& t : streamed.traces) ooms += t.oom;
    if (ooms > static_cast<std::int64_t>(streamed.ooms.size()))
        rep.summary.notes.push_back(std::to_string(ooms) + " out-of-memory entries in the trace; the first " +
                                    std::to_string(streamed.ooms.size()) + " are listed");
    int device = opt.device;
    if (device < 0) {
        device = !kept.empty() ? kept_device : default_device(snap);
    } else {
        const bool has_trace = device == kept_device && !kept.empty();
        const bool has_segments = std::any_of(snap.segments.begin(), snap.segments.end(),
                                              [&](const SnapshotSegment& sg) { return sg.device == device; });
        if (!has_trace && !has_segments) {
            std::string list;
            for (int d : rep.summary.devices) list += (list.empty() ? "" : ", ") + std::to_string(d);
            fail(ErrorCode::InvalidArgument, "device",
                 snap.origin + ": no segments or trace entries for device " + std::to_string(device) +
                     (list.empty() ? std::string(" (the snapshot is empty)") : " (devices in the file: " + list + ")"));
        }
    }
    auto conv = to_trace_streamed(snap, kept, device);
    // The entries are in the trace now: free them before the replay.
    kept.clear();
    rep.summary.conversion = conv.info;
    for (auto& n : conv.notes) rep.summary.notes.push_back(std::move(n));

    const ReplayOptions ro = snapshot_replay_options(snap, opt, rep.summary.notes);
    rep.summary.replay_config = ro.config.to_string();
    if (opt.run_replay) {
        rep.replay = replay(conv.trace, ro);
        release_replay_storage();  // one replay per snapshot: nothing to hand on
    }
    return rep;
}
// Streaming reading for analyze(): statistics of every device's entries, and
// the entries themselves only for the device to replay (opt.device, else the
// lowest with entries).
class KeepOneDevice final : public TraceEntrySink {
public:
    explicit KeepOneDevice(int device) : want_(device) {}

    void entry(int d, std::int64_t i, const SnapshotTraceEntry& e) override {
        auto& traces = stats_.traces;
        if (traces.size() <= static_cast<std::size_t>(d)) {
            const auto old = traces.size();
            traces.resize(static_cast<std::size_t>(d) + 1);
            for (auto k = old; k < traces.size(); ++k) traces[k].device = static_cast<int>(k);
        }
        auto& st = traces[static_cast<std::size_t>(d)];
        st.count(e.action);
        check_budget();  // the memory limit analyze_snapshot installs
        if (e.action == TraceAction::Oom && stats_.ooms.size() < kMaxOomRecords) {
            stats_.ooms.push_back(SnapshotOom{d, i, e.size, e.device_free, e.time_us, {}});
            oom_frames_.push_back(e.frame);
        }
        const bool keep = want_ >= 0 ? d == want_ : (kept_device_ < 0 || d <= kept_device_);
        if (!keep) return;
        if (d != kept_device_) {
            kept_.clear();
            kept_device_ = d;
        }
        kept_.push_back(e);
    }
    void restart() override {
        stats_ = {};
        oom_frames_.clear();
        kept_.clear();
        kept_device_ = -1;
    }

    // Labels the OOMs and returns the statistics.
    const StreamedTraceStats& finish(const Snapshot& snap) {
        for (std::size_t k = 0; k < stats_.ooms.size(); ++k) {
            const auto f = oom_frames_[k];
            if (f >= 0 && static_cast<std::size_t>(f) < snap.frames.size())
                stats_.ooms[k].frame = frame_label(snap.frames[static_cast<std::size_t>(f)]);
        }
        std::stable_sort(stats_.ooms.begin(), stats_.ooms.end(), [](const SnapshotOom& a, const SnapshotOom& b) {
            return a.device != b.device ? a.device < b.device : a.entry < b.entry;
        });
        return stats_;
    }
    KeptEntries& kept() { return kept_; }
    [[nodiscard]] int kept_device() const { return kept_device_; }

private:
    int want_;
    StreamedTraceStats stats_;
    std::vector<std::int32_t> oom_frames_;
    KeptEntries kept_;  // chunked: growing it never copies
    int kept_device_ = -1;
};

}  // namespace

namespace {
// The memory limit of one analysis: reading, converting and replaying.
WorkBudget::MemoryLimit memory_limit(const std::string& origin) {
    return {kMaxSnapshotMemory,
            origin + ": reading and replaying it needs more than " + std::to_string(kMaxSnapshotMemory >> 20) +
                " MiB of memory (gpumem's limit for one snapshot); record a shorter trace, e.g. "
                "torch.cuda.memory._record_memory_history(max_entries=1000000)",
            origin};
}

// Reads with `read(sink)` (a streaming reader) under the memory limit, then analyzes.
template <class Read>
Result<SnapshotReport> analyze_streamed(const std::string& origin, const SnapshotOptions& opt, Read&& read) {
    const WorkBudget memory(memory_limit(origin));
    KeepOneDevice sink(opt.device);
    auto snap = read(sink);
    if (!snap) return snap.error();
    return capture([&]() -> Result<SnapshotReport> {
        const auto& stats = sink.finish(snap.value());
        return analyze(std::move(snap).value(), opt, stats, sink.kept(), sink.kept_device());
    });
}
}  // namespace

Result<SnapshotReport> analyze_snapshot_bytes(std::string_view data, std::string origin, const SnapshotOptions& opt) {
    return analyze_streamed(origin, opt, [&](KeepOneDevice& sink) { return parse_snapshot_streaming(data, origin, sink); });
}

Result<SnapshotReport> analyze_snapshot(const std::string& path, const SnapshotOptions& opt) {
    return analyze_streamed(path, opt, [&](KeepOneDevice& sink) { return read_snapshot_streaming(path, sink); });
}

Result<SnapshotReport> analyze_snapshot(const std::string& path, const ReplayOptions& replay) {
    SnapshotOptions opt;
    opt.replay = replay;
    return analyze_snapshot(path, opt);
}

}  // namespace gpumem::sim
