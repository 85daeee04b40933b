// gpumem/sim/trace.cpp — replay of a memory event trace through the caching
// allocator model (or through no allocator: live requested bytes only).
//
// One pass over the events keeps the current allocated/reserved bytes, the
// peaks, the per-(step, phase) peaks and a downsampled timeline; the largest
// live tensors at the allocated peak are reconstructed by a second pass that
// stops at the peak event (O(n), not a copy of the live set at every new peak).
#include "gpumem/sim/trace.hpp"

#include <algorithm>
#include <iterator>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "gpumem/core/budget.hpp"
#include "gpumem/sim/step.hpp"

namespace gpumem::sim {

const char* phase_name(Phase p) {
    switch (p) {
        case Phase::Setup: return "setup";
        case Phase::Forward: return "forward";
        case Phase::Loss: return "loss";
        case Phase::Backward: return "backward";
        case Phase::Optimizer: return "optimizer";
        case Phase::ZeroGrad: return "zero_grad";
        case Phase::Prefill: return "prefill";
        case Phase::Decode: return "decode";
        case Phase::Replay: return "replay";
    }
    return "unknown";
}

std::int32_t Trace::add_label(std::string s) {
    labels.push_back(std::move(s));
    return static_cast<std::int32_t>(labels.size() - 1);
}

std::int64_t Trace::full_events() const { return full_index(static_cast<std::int64_t>(events.size())); }

std::int64_t Trace::full_index(std::int64_t i) const {
    std::int64_t out = i;
    for (const TraceCut& c : cuts)
        if (c.at <= i) out = checked_add(out, checked_mul(c.at - c.begin, c.copies));
    return out;
}

namespace {

// The memory model behind replay(): the caching allocator, or plain live bytes.
class Model {
public:
    explicit Model(const ReplayOptions& opt) : capacity_(opt.capacity) {
        if (opt.mode == AllocatorMode::PyTorch) alloc_.emplace(opt.config, opt.capacity);
    }

    // Returns the handle, or CachingAllocator::kFailedBlock on OOM (oom_ is
    // then set). (A plain integer, not an optional: the optional went through
    // the stack and its flag was read back before its store had landed, every
    // event.)
    BlockHandle malloc(Bytes size, int stream) {
        if (alloc_) {
            const BlockHandle h = alloc_->allocate(size, stream, oom_buf_);
            if (h == CachingAllocator::kFailedBlock) {
                oom_ = oom_buf_;
                return CachingAllocator::kFailedBlock;
            }
            return h;
        }
        if (size > capacity_ - live_) {
            OomInfo o;
            o.requested = size;
            o.alloc_size = size;
            o.allocated = live_;
            o.reserved = live_;
            o.capacity = capacity_;
            o.device_free = capacity_ - live_;
            oom_ = o;
            ++stats_.ooms;
            return CachingAllocator::kFailedBlock;
        }
        live_ += size;
        stats_.allocated = stats_.reserved = stats_.requested = live_;
        stats_.peak_allocated = stats_.peak_reserved = stats_.peak_requested = max(stats_.peak_allocated, live_);
        ++stats_.allocations;
        return BlockHandle{0};
    }

    void free(BlockHandle h, Bytes size) {
        if (alloc_) {
            alloc_->free(h);
            return;
        }
        live_ -= size;
        stats_.allocated = stats_.reserved = stats_.requested = live_;
        --stats_.allocations;
    }

    void empty_cache() {
        if (alloc_) alloc_->empty_cache();
    }
    bool watch_capacity(Bytes limit) { return alloc_ && alloc_->watch_capacity(limit); }
    std::optional<CachingAllocator> take_watched() { return alloc_ ? alloc_->take_watched() : std::nullopt; }

    [[nodiscard]] Bytes allocated() const { return alloc_ ? alloc_->stats().allocated : live_; }
    [[nodiscard]] Bytes reserved() const { return alloc_ ? alloc_->stats().reserved : live_; }
    [[nodiscard]] Bytes largest_free_block() const { return alloc_ ? alloc_->largest_free_block() : Bytes(0); }
    [[nodiscard]] Bytes private_reserved() const { return alloc_ ? alloc_->stats().reserved_private : Bytes(0); }
    [[nodiscard]] Bytes private_free() const { return alloc_ ? alloc_->stats().reserved_private - alloc_->stats().allocated_private : Bytes(0); }
    [[nodiscard]] const AllocatorStats& stats() const { return alloc_ ? alloc_->stats() : stats_; }
    [[nodiscard]] const std::optional<OomInfo>& last_oom() const { return oom_; }
    void signature(std::vector<std::int64_t>& out, const std::function<std::int64_t(BlockHandle)>& label) const {
        if (alloc_) alloc_->signature(out, label);
    }

private:
    std::optional<CachingAllocator> alloc_;
    Bytes capacity_;
    Bytes live_;
    AllocatorStats stats_;
    std::optional<OomInfo> oom_;
    OomInfo oom_buf_;  // allocate()'s out-parameter (filled only when it fails)
};

struct Live {
    BlockHandle handle = 0;
    Bytes size;
};
// The limited replay's own allocations, and the live tensors it freed
// (ReplayOptions::oom_capacity).
struct Added {
    BlockHandle handle = 0;
};
struct Removed {};
// A tensor live at the allocated peak (replay()'s second pass).
struct PeakRec {
    Bytes size;
    std::int32_t label = 0;
    Phase phase{};
};

bool same_phase(const TraceEvent& a, const TraceEvent& b) { return a.phase == b.phase && a.step == b.step; }

// Values by tensor id. The traces replay() sees name their tensors 0, 1, 2,
// ... (the step builder's ids, the snapshot conversion's): ids below
// `dense_limit` live in a vector indexed by id (a hash map's lookups and node
// allocations were a tenth of a pipeline simulation), others in a hash map.
// The vectors grow (doubling) to the largest id seen, at most dense_limit.
//
// The dense storage goes from one table to the next of its kind on a thread
// (the spare; release_replay_storage frees it): a plan's confirmations replay
// a dozen traces of ~10^5 ids each, and growing fresh tables faulted in and
// copied their pages every time (a quarter of the page faults of `gpumem plan
// llama-3-70b --gpus 64`). At most dense_limit ids (replay(): 2^23).
template <class V>
class IdTable {
public:
    explicit IdTable(std::int64_t dense_limit) : limit_(dense_limit) {
        // The spare's pages, written again (no id in it yet).
        values_ = std::move(spare().values);
        has_ = std::move(spare().has);
        const std::size_t n = std::min(has_.size(), static_cast<std::size_t>(std::max<std::int64_t>(limit_, 0)));
        values_.resize(n);
        has_.assign(n, 0);
    }
    ~IdTable() {
        Storage& s = spare();
        if (has_.capacity() > s.has.capacity()) {
            s.values = std::move(values_);
            s.has = std::move(has_);
        }
    }
    IdTable(const IdTable&) = delete;
    IdTable& operator=(const IdTable&) = delete;
    static void release_spare() { spare() = Storage{}; }
    // Room for ids below `n` (within the dense limit), taken now: growing by
    // doubling copied the table into fresh pages each time.
    void reserve(std::size_t n) {
        n = std::min(n, static_cast<std::size_t>(std::max<std::int64_t>(limit_, 0)));
        values_.reserve(n);
        has_.reserve(n);
    }

    [[nodiscard]] V* find(std::int64_t id) {
        if (dense(id)) return static_cast<std::size_t>(id) < has_.size() && has_[static_cast<std::size_t>(id)] ? &values_[static_cast<std::size_t>(id)] : nullptr;
        auto it = sparse_.find(id);
        return it == sparse_.end() ? nullptr : &it->second;
    }
    // `id` must not be in the table. The value is built in its slot from
    // `args` (V's fields): a value built on the stack and copied was read
    // back before its stores had landed (PeakRec's 13 bytes as two
    // overlapping words), a stall of a quarter of replay()'s own time.
    template <class... A>
    void emplace(std::int64_t id, A... args) {
        static_assert(std::is_trivially_destructible_v<V>);
        ++size_;
        if (!dense(id)) {
            sparse_.emplace(id, V{args...});
            return;
        }
        const auto i = static_cast<std::size_t>(id);
        if (i >= has_.size()) {
            const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(limit_), std::max<std::size_t>(i + 1, 2 * has_.size()));
            has_.resize(n, 0);
            values_.resize(n);
        }
        has_[i] = 1;
        ::new (static_cast<void*>(&values_[i])) V{args...};  // (V is trivially destructible)
    }
    void erase(std::int64_t id) {  // if present
        if (dense(id)) {
            const auto i = static_cast<std::size_t>(id);
            if (i >= has_.size() || !has_[i]) return;
            has_[i] = 0;
        } else if (sparse_.erase(id) == 0) {
            return;
        }
        --size_;
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    template <class F>
    void for_each(F&& f) const {
        for (std::size_t i = 0; i < has_.size(); ++i)
            if (has_[i]) f(static_cast<std::int64_t>(i), values_[i]);
        for (const auto& [id, v] : sparse_) f(id, v);
    }

private:
    struct Storage {
        std::vector<V> values;
        std::vector<std::uint8_t> has;
    };
    static Storage& spare() {
        thread_local Storage s;
        return s;
    }
    [[nodiscard]] bool dense(std::int64_t id) const { return id >= 0 && id < limit_; }
    std::int64_t limit_;
    std::vector<V> values_;
    std::vector<std::uint8_t> has_;
    std::unordered_map<std::int64_t, V> sparse_;
    std::size_t size_ = 0;
};

}  // namespace

void release_replay_storage() {
    IdTable<Live>::release_spare();
    IdTable<PeakRec>::release_spare();
    IdTable<Added>::release_spare();
    IdTable<Removed>::release_spare();
}

ReplayResult replay(const Trace& trace, const ReplayOptions& opt) {
    ReplayResult res;
    const auto& ev = trace.events;
    const auto n = static_cast<std::int64_t>(ev.size());
    Model model(opt);

    // --- timeline budget: peaks and the final point (3), phase boundaries (at
    // most half the budget), the rest per-bucket maxima.
    const std::int64_t max_points = opt.record_timeline ? std::max<std::int64_t>(opt.max_timeline_points, 0) : 0;
    std::int64_t boundaries = 0;  // (counted only for a timeline: a pass over every event)
    if (max_points > 0)
        for (std::int64_t i = 0; i < n; ++i)
            if (i == 0 || !same_phase(ev[static_cast<std::size_t>(i)], ev[static_cast<std::size_t>(i - 1)])) ++boundaries;
    const std::int64_t kept_boundaries = std::min(boundaries, max_points / 2);
    const std::int64_t buckets = std::max<std::int64_t>(1, max_points - kept_boundaries - 3);
    const std::int64_t bucket_size = std::max<std::int64_t>(1, (n + buckets - 1) / buckets);
    // Phase boundaries and bucket maxima, each in event order (merged at the end).
    std::vector<TimelinePoint> points, boundary_pts;
    if (max_points > 0) {
        points.reserve(static_cast<std::size_t>(buckets + 1));
        boundary_pts.reserve(static_cast<std::size_t>(kept_boundaries));
    }
    std::int64_t boundary_points = 0;
    std::int64_t cur_bucket = -1;
    std::optional<TimelinePoint> bucket_best;
    TimelinePoint reserved_peak_point;
    bool have_reserved_peak = false;

    // At most 2^23 ids in the vectors (17 bytes an id, grown to the largest
    // id seen): the traces' ids count their allocations, so a table holds
    // at most about half of what the trace's own events take. (Capped at
    // 2^18 before, a 10M-entry snapshot's 3.3M ids went through the hash
    // map: 3.78 -> 3.5 s for `gpumem snapshot`, its peak memory unchanged,
    // being reached while the entries are converted.)
    const std::int64_t dense_ids = std::min<std::int64_t>(checked_add(checked_mul(n, std::int64_t{4}), std::int64_t{1024}), std::int64_t{1} << 23);
    IdTable<Live> live(dense_ids);
    live.reserve(static_cast<std::size_t>(n) + 1);  // (a trace's ids count its allocations)
    std::vector<std::uint8_t> accepted(static_cast<std::size_t>(n), 0);  // Alloc events that allocated
    std::unordered_set<std::int64_t> failed;  // ids whose allocation hit OOM: their Free is ignored

    // Steady-state cuts: the per-phase rows of each cut's period, repeated
    // where the left-out events would have run.
    std::vector<std::vector<PhasePeak>> period_rows(trace.cuts.size());
    auto add_row = [](std::vector<PhasePeak>& rows, const PhasePeak& r) {
        if (!rows.empty() && rows.back().phase == r.phase && rows.back().step == r.step) {
            rows.back().peak_allocated = max(rows.back().peak_allocated, r.peak_allocated);
            rows.back().peak_reserved = max(rows.back().peak_reserved, r.peak_reserved);
        } else {
            rows.push_back(r);
        }
    };
    res.events = trace.full_events();

    // ReplayOptions::oom_capacity: watched until the allocator hands over its
    // state at the first cudaMalloc past it, then the limited replay runs on
    // from that event against the copy, reading the live tensors of this
    // replay as they were before it (`live`, untouched meanwhile) under its
    // own allocations and frees since.
    enum class Watch : std::uint8_t { Off, On, Crossed };
    Watch watch = opt.oom_capacity > Bytes(0) && trace.cuts.empty() && model.watch_capacity(opt.oom_capacity) ? Watch::On : Watch::Off;
    auto run_limited = [&](CachingAllocator& lim, std::int64_t from) {
        // (Dense tables like `live`: a hash node per event was 730 of an 8B
        // simulation's 7,343 heap allocations.)
        IdTable<Added> added(dense_ids);
        IdTable<Removed> removed(dense_ids);
        auto live_before = [&](std::int64_t id) -> const Live* { return removed.find(id) ? nullptr : live.find(id); };
        for (std::int64_t k = from; k < n; ++k) {
            check_budget();
            const TraceEvent& x = ev[static_cast<std::size_t>(k)];
            switch (x.kind) {
                case TraceEvent::Kind::Alloc: {
                    if (added.find(x.id) || live_before(x.id)) break;  // still live: ignored, as below
                    const AllocResult r = lim.malloc(x.size, x.stream);
                    if (!r.ok) {
                        res.at_capacity_known = true;
                        res.at_capacity_oom = r.oom;
                        res.at_capacity_oom_event = k;
                        return;
                    }
                    added.emplace(x.id, r.handle);
                    break;
                }
                case TraceEvent::Kind::Free: {
                    if (const Added* a = added.find(x.id)) {
                        lim.free(a->handle);
                        added.erase(x.id);
                    } else if (const Live* l = live_before(x.id)) {
                        lim.free(l->handle);
                        removed.emplace(x.id);
                    }
                    break;
                }
                case TraceEvent::Kind::EmptyCache: lim.empty_cache(); break;
                case TraceEvent::Kind::PhaseMark: break;
            }
        }
        // It fits once it frees its cache: not known here.
    };

    bool stop = false;
    for (std::int64_t i = 0; i < n && !stop; ++i) {
        check_budget();
        const TraceEvent& e = ev[static_cast<std::size_t>(i)];
        for (std::size_t c = 0; c < trace.cuts.size(); ++c) {
            const TraceCut& cut = trace.cuts[c];
            if (cut.at != i) continue;
            // (at most max_cut_phase_rows rows per cut)
            const auto first_row = static_cast<std::int64_t>(res.phases.size());
            for (std::int64_t k = 0; k < cut.copies; ++k) {
                check_budget();
                if (static_cast<std::int64_t>(res.phases.size()) - first_row >= opt.max_cut_phase_rows) {
                    // The remaining copies' rows, counted (each copy adds as many as the last).
                    const auto before = static_cast<std::int64_t>(res.phases.size());
                    for (const PhasePeak& r : period_rows[c]) add_row(res.phases, r);
                    const std::int64_t per_copy = static_cast<std::int64_t>(res.phases.size()) - before;
                    res.phases.resize(static_cast<std::size_t>(before));
                    res.phases_left_out = checked_add(res.phases_left_out, checked_mul(per_copy, cut.copies - k));
                    break;
                }
                for (const PhasePeak& r : period_rows[c]) add_row(res.phases, r);
            }
        }
        switch (e.kind) {
            case TraceEvent::Kind::Alloc: {
                if (live.find(e.id)) {
                    ++res.duplicate_allocs;
                    break;
                }
                const BlockHandle h = model.malloc(e.size, e.stream);
                if (watch == Watch::On) {
                    if (auto lim = model.take_watched()) {
                        watch = Watch::Crossed;
                        run_limited(*lim, i);
                    } else if (h == CachingAllocator::kFailedBlock) {
                        watch = Watch::Crossed;  // fails without a limit too: the limited replay fails earlier or here
                    }
                }
                if (h == CachingAllocator::kFailedBlock) {
                    ++res.failed_allocs;
                    failed.insert(e.id);
                    if (!res.oom) {
                        res.oom = model.last_oom();
                        res.oom_event = i;
                    }
                    if (opt.stop_at_oom) stop = true;
                    break;  // skipped: its Free finds no live id and is ignored
                }
                live.emplace(e.id, h, e.size);
                accepted[static_cast<std::size_t>(i)] = 1;
                break;
            }
            case TraceEvent::Kind::Free: {
                const Live* l = live.find(e.id);
                if (!l) {
                    if (failed.erase(e.id) == 0) ++res.unknown_frees;
                    break;
                }
                model.free(l->handle, l->size);
                live.erase(e.id);
                break;
            }
            case TraceEvent::Kind::EmptyCache: model.empty_cache(); break;
            case TraceEvent::Kind::PhaseMark: break;
        }

        const Bytes allocated = model.allocated();
        const Bytes reserved = model.reserved();
        if (allocated > res.peak_allocated) {
            res.peak_allocated = allocated;
            res.peak_event = i;
            res.peak_phase = e.phase;
            res.peak_step = e.step;
            res.fragmentation_at_peak = reserved - allocated;
            res.largest_free_block_at_peak = model.largest_free_block();
        }
        res.graph_pool_reserved = max(res.graph_pool_reserved, model.private_reserved());
        if (reserved > res.peak_reserved) {
            res.peak_reserved = reserved;
            res.graph_pool_free_at_reserved_peak = model.private_free();
            reserved_peak_point = TimelinePoint{i, e.phase, e.step, allocated, reserved};
            have_reserved_peak = true;
        }

        const bool new_phase = i == 0 || !same_phase(e, ev[static_cast<std::size_t>(i - 1)]);
        if (new_phase) res.phases.push_back(PhasePeak{e.phase, e.step, allocated, reserved});
        PhasePeak& pp = res.phases.back();
        pp.peak_allocated = max(pp.peak_allocated, allocated);
        pp.peak_reserved = max(pp.peak_reserved, reserved);
        for (std::size_t c = 0; c < trace.cuts.size(); ++c) {
            const TraceCut& cut = trace.cuts[c];
            if (i < cut.begin || i >= cut.at) continue;
            auto& rows = period_rows[c];
            if (i == cut.begin || new_phase) rows.push_back(PhasePeak{e.phase, e.step, allocated, reserved});
            rows.back().peak_allocated = max(rows.back().peak_allocated, allocated);
            rows.back().peak_reserved = max(rows.back().peak_reserved, reserved);
        }

        if (max_points > 0) {
            const TimelinePoint pt{i, e.phase, e.step, allocated, reserved};
            if (new_phase && boundary_points < kept_boundaries) {
                boundary_pts.push_back(pt);
                ++boundary_points;
            }
            const std::int64_t b = i / bucket_size;
            if (b != cur_bucket) {
                if (bucket_best) points.push_back(*bucket_best);
                bucket_best = pt;
                cur_bucket = b;
            } else if (allocated > bucket_best->allocated) {
                bucket_best = pt;
            }
        }
    }

    res.final_allocated = model.allocated();
    res.final_reserved = model.reserved();
    res.allocator = model.stats();
    if (watch == Watch::On && !stop) res.at_capacity_known = true;  // never past it: the same replay

    // --- timeline: merge, keep the peaks, at most max_points.
    if (max_points > 0 && n > 0) {
        if (bucket_best) points.push_back(*bucket_best);
        auto by_event = [](const TimelinePoint& a, const TimelinePoint& b) { return a.event < b.event; };
        // In event order, points of one event in the order they were taken
        // (what a stable sort of them all gives): a phase boundary is taken at
        // its event, a bucket's maximum only once its bucket has ended, so a
        // boundary goes first (std::merge takes the first range's first); the
        // reserved peak and the final point come after every point of their
        // event. (The stable sort of ~1,000 points was 3% of a one-off
        // simulated `gpumem estimate`.)
        std::vector<TimelinePoint> merged;
        merged.reserve(boundary_pts.size() + points.size() + 2);
        std::merge(boundary_pts.begin(), boundary_pts.end(), points.begin(), points.end(), std::back_inserter(merged), by_event);
        points = std::move(merged);
        if (have_reserved_peak) points.insert(std::upper_bound(points.begin(), points.end(), reserved_peak_point, by_event), reserved_peak_point);
        const TraceEvent& last = ev.back();
        points.push_back(TimelinePoint{n - 1, last.phase, last.step, res.final_allocated, res.final_reserved});
        points.erase(std::unique(points.begin(), points.end(),
                                 [](const TimelinePoint& a, const TimelinePoint& b) { return a.event == b.event; }),
                     points.end());
        if (static_cast<std::int64_t>(points.size()) > max_points) {
            // Tiny budgets only: keep the allocated peak first, then the highest points.
            std::stable_sort(points.begin(), points.end(), [&](const TimelinePoint& a, const TimelinePoint& b) {
                const bool pa = a.event == res.peak_event, pb = b.event == res.peak_event;
                if (pa != pb) return pa;
                return a.allocated > b.allocated;
            });
            points.resize(static_cast<std::size_t>(max_points));
            std::sort(points.begin(), points.end(), by_event);
        }
        if (!trace.cuts.empty())
            for (auto& p : points) p.event = trace.full_index(p.event);
        res.timeline = std::move(points);
    }

    // --- second pass: live tensors at the allocated peak.
    if (res.peak_event >= 0 && opt.top_tensors > 0) {
        IdTable<PeakRec> at_peak(dense_ids);
        for (std::int64_t i = 0; i <= res.peak_event; ++i) {
            check_budget();
            const TraceEvent& e = ev[static_cast<std::size_t>(i)];
            if (e.kind == TraceEvent::Kind::Alloc && accepted[static_cast<std::size_t>(i)]) {
                at_peak.emplace(e.id, e.size, e.label, e.phase);
            } else if (e.kind == TraceEvent::Kind::Free) {
                at_peak.erase(e.id);
            }
        }
        // The `top` largest (size descending, then id), kept in a heap of
        // that size: no copy of every live tensor.
        struct Cand {
            std::int64_t id;
            PeakRec r;
        };
        auto larger = [](const Cand& a, const Cand& b) {
            if (a.r.size != b.r.size) return a.r.size > b.r.size;
            return a.id < b.id;
        };
        const auto top = static_cast<std::size_t>(std::min<std::int64_t>(opt.top_tensors, static_cast<std::int64_t>(at_peak.size())));
        std::vector<Cand> best;  // a heap whose front is the smallest kept
        best.reserve(top + 1);
        res.live_by_label.assign(trace.labels.size() + 1, Bytes(0));
        at_peak.for_each([&](std::int64_t id, const PeakRec& r) {
            check_budget();
            const std::size_t l = r.label >= 0 && static_cast<std::size_t>(r.label) < trace.labels.size() ? static_cast<std::size_t>(r.label) : trace.labels.size();
            res.live_by_label[l] += r.size;
            const Cand c{id, r};
            if (best.size() < top) {
                best.push_back(c);
                std::push_heap(best.begin(), best.end(), larger);
            } else if (top > 0 && larger(c, best.front())) {
                std::pop_heap(best.begin(), best.end(), larger);
                best.back() = c;
                std::push_heap(best.begin(), best.end(), larger);
            }
        });
        std::sort(best.begin(), best.end(), larger);
        std::vector<LiveTensor> all;
        all.reserve(best.size());
        for (const Cand& c : best) {
            LiveTensor t;
            t.id = c.id;
            t.size = c.r.size;
            if (c.r.label >= 0 && static_cast<std::size_t>(c.r.label) < trace.labels.size())
                t.label = trace.labels[static_cast<std::size_t>(c.r.label)];
            t.phase = c.r.phase;
            all.push_back(std::move(t));
        }
        res.top_at_peak = std::move(all);
    }
    return res;
}

// The probe's tables are dense, as replay()'s: hash maps of the live tensors
// and of each block's tensor were a third of the probe's time, the probe a
// third of a one-GPU step simulation with grad-accum 256.
struct StateProbe::Impl {
    explicit Impl(const ReplayOptions& o) : model(o), pytorch(o.mode == AllocatorMode::PyTorch) {}
    Model model;
    bool pytorch;
    std::size_t cursor = 0;
    IdTable<Live> live{kMaxTraceEvents + 1};  // a step trace's ids are below its events
    // The tensor in each allocated block, by the handle's slot: (generation,
    // tensor id); a slot's entry is current while its block is allocated.
    struct Owner {
        std::uint32_t gen = 0;
        std::int64_t id = 0;
    };
    std::vector<Owner> owner;
    std::unordered_set<std::int64_t> failed;

    // The tensor allocated in block `h`, or nullopt.
    [[nodiscard]] std::optional<std::int64_t> tensor_of(BlockHandle h) const {
        if (h == kNullBlock || block_slot(h) >= owner.size()) return std::nullopt;
        const Owner& o = owner[block_slot(h)];
        if (o.id == 0 || o.gen != block_generation(h)) return std::nullopt;
        return o.id;
    }
};

StateProbe::StateProbe(const ReplayOptions& opt) : impl_(new Impl(opt)) {}
StateProbe::~StateProbe() { delete impl_; }

void StateProbe::feed(const Trace& trace) {
    Impl& s = *impl_;
    for (; s.cursor < trace.events.size(); ++s.cursor) {
        const TraceEvent& e = trace.events[s.cursor];
        switch (e.kind) {
            case TraceEvent::Kind::Alloc: {
                if (s.live.find(e.id)) break;
                const BlockHandle h = s.model.malloc(e.size, e.stream);
                if (h == CachingAllocator::kFailedBlock) {
                    s.failed.insert(e.id);
                    break;
                }
                s.live.emplace(e.id, h, e.size);
                // (A zero-byte request's null handle names no block.)
                if (s.pytorch && h != kNullBlock) {
                    if (block_slot(h) >= s.owner.size()) s.owner.resize(block_slot(h) + 1);
                    s.owner[block_slot(h)] = Impl::Owner{block_generation(h), e.id};
                }
                break;
            }
            case TraceEvent::Kind::Free: {
                const Live* l = s.live.find(e.id);
                if (!l) {
                    s.failed.erase(e.id);
                    break;
                }
                s.model.free(l->handle, l->size);
                if (s.pytorch && l->handle != kNullBlock) s.owner[block_slot(l->handle)].id = 0;
                s.live.erase(e.id);
                break;
            }
            case TraceEvent::Kind::EmptyCache: s.model.empty_cache(); break;
            case TraceEvent::Kind::PhaseMark: break;
        }
    }
}

std::vector<std::int64_t> StateProbe::signature(std::int64_t base_id, std::int64_t next_id) const {
    const Impl& s = *impl_;
    // Tensors of the periods: negative distances, apart from the ids before the base.
    auto name = [&](std::int64_t id) { return id < base_id ? id : id - next_id; };
    std::vector<std::int64_t> out;
    // Ascending by name without a sort (the sort was 1.4% of the instructions
    // of `estimate llama-3-8b --seq 2048 --grad-accum 16`): the table walks its ids in ascending order,
    // so the names are two ascending runs, the periods' (negative) after the
    // older ones. (Ids outside the dense table come last, in no order: sorted
    // then.)
    std::vector<std::pair<std::int64_t, std::int64_t>> tensors;
    tensors.reserve(s.live.size());
    std::size_t older = 0;
    s.live.for_each([&](std::int64_t id, const Live& l) {
        tensors.emplace_back(name(id), l.size.count());
        if (id < base_id) ++older;
    });
    std::rotate(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(older), tensors.end());
    if (!std::is_sorted(tensors.begin(), tensors.end())) std::sort(tensors.begin(), tensors.end());
    out.push_back(static_cast<std::int64_t>(tensors.size()));
    for (const auto& [k, v] : tensors) {
        out.push_back(k);
        out.push_back(v);
    }
    std::vector<std::int64_t> failed;
    for (auto id : s.failed) failed.push_back(name(id));
    std::sort(failed.begin(), failed.end());
    out.push_back(static_cast<std::int64_t>(failed.size()));
    out.insert(out.end(), failed.begin(), failed.end());
    if (s.pytorch)
        s.model.signature(out, [&](BlockHandle h) {
            const std::optional<std::int64_t> id = s.tensor_of(h);
            return id ? name(*id) : std::int64_t{INT64_MIN};
        });
    return out;
}

}  // namespace gpumem::sim
