// gpumem/sim/allocator.cpp — PyTorch's CUDA caching allocator, re-implemented
// for simulation (no device memory; addresses come from a bump pointer).
//
// Every rule below was read from pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp
// (DeviceCachingAllocator) and c10/cuda/CUDAAllocatorConfig.{h,cpp} (2.4-2.8; the
// options moved to c10/core/AllocatorConfig.{h,cpp} in 2.9). Comments name the
// function each rule comes from. No code was copied; the structure mirrors the
// source on purpose (same pools, same set orderings, same retry order) so that
// reserved memory, fragmentation and OOM points come out the same.
//
// Deliberate simplifications (no effect on the byte counts of a single-device,
// single-process trace):
//   * no CUDA events / recordStream (a freed block is reusable at once),
//   * CUDA graph private pools only as streams >= kGraphPoolStream (a pool's
//     blocks keyed by its own stream, never released: the graphs outlive the
//     trace), no IPC, no free-memory callbacks,
//   * `capacity` plays two roles: what cudaMalloc/cuMemCreate can hand out, and
//     allowed_memory_maximum for garbage_collection_threshold (PyTorch only runs
//     the GC when set_per_process_memory_fraction() was called; we run it when
//     the threshold is set).
#include "gpumem/sim/allocator.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "allocator_internal.hpp"

namespace gpumem::sim {

namespace {

// Constants: CUDACachingAllocator.cpp (top of namespace Native).
constexpr std::int64_t kMinBlockSize = 512;             // all sizes rounded to >= 512 B
constexpr std::int64_t kSmallSize = 1 << 20;            // largest "small" allocation: 1 MiB
constexpr std::int64_t kSmallBuffer = 2 << 20;          // small pool segment: 2 MiB
constexpr std::int64_t kMinLargeAlloc = 10 << 20;       // 1..10 MiB requests share kLargeBuffer
constexpr std::int64_t kRoundLarge = 2 << 20;           // large segments rounded to 2 MiB
using detail::kNoLimit;
using detail::kRoundUpPowerOfTwoIntervals;
// Virtual address space of one expandable segment is capped (the source reserves
// 1 1/8 of the device memory; with a "no limit" capacity that would overflow).
constexpr std::int64_t kMaxExpandableAddressSpace = std::int64_t{1} << 44;

using detail::floor_log2;

// Sizes are at most kMaxSize after rounding (a request near INT64_MAX must not
// overflow; no capacity comes close, so such a request is an OOM answer).
constexpr std::int64_t kMaxSize = std::int64_t{1} << 62;
std::int64_t round_up(std::int64_t v, std::int64_t m) { return v >= kMaxSize ? kMaxSize : (v + m - 1) / m * m; }

}  // namespace

// ---------------------------------------------------------------------------
// Data structures (CUDACachingAllocator.cpp: Block, BlockPool, ExpandableSegment)

struct ExpSeg;
struct BlockPool;
struct Block;

struct Block {
    std::int64_t addr = 0;
    std::int64_t size = 0;
    std::int64_t requested = 0;
    Block* prev = nullptr;       // neighbours inside the segment (address order)
    Block* next = nullptr;
    BlockPool* pool = nullptr;
    ExpSeg* es = nullptr;        // non-null for blocks of an expandable segment
    std::int64_t gc_count_base = 0;
    int stream = 0;
    std::uint32_t slot = 0;
    std::uint32_t gen = 0;       // bumped on every allocation: stale handles are detected
    bool allocated = false;
    bool mapped = true;          // false only for unmapped ranges of expandable segments
    bool live = false;           // slot in use
    bool in_free = false;        // in its pool's free set

    [[nodiscard]] bool is_split() const { return prev != nullptr || next != nullptr; }
};

// BlockComparatorAddress: (stream, address) — the pool's unmapped set.
struct AddrCmp {
    bool operator()(const Block* a, const Block* b) const {
        if (a->stream != b->stream) return a->stream < b->stream;
        return a->addr < b->addr;
    }
};

// Free blocks in ascending (size, address) order, in short sorted runs (at
// most kCap entries), found by a binary search over each run's last key,
// then within the run. An insert or erase moves at most kCap entries of one
// run, however many blocks share a size (a fragmented small pool can hold
// hundreds of thousands of free 512-byte blocks: one sorted vector of them
// made every free move half of it, 3.8 s for 100,000 frees). A run that
// fills splits in two; one that empties goes (one is kept for reuse); one
// under a quarter full merges with a neighbour that has room. (This held a
// pool's whole free set before the size classes below: against a red-black
// tree, BM_Replay1M 91.5 -> 84.0 ms; runs of 8, 16 or 64 measured slower
// than 32; branch-free comparisons slower, BM_Replay1M 85 -> 112 ms.)
class SortedRuns {
public:
    struct Entry {
        std::int64_t size;
        std::int64_t addr;
        Block* b;
    };
    // A position: run `bi`, entry `i` (past the end: bi == runs()).
    struct Pos {
        std::uint32_t bi = 0;
        std::uint32_t i = 0;
        bool operator==(const Pos&) const = default;
    };
    static bool less(std::int64_t as, std::int64_t aa, std::int64_t bs, std::int64_t ba) {
        return as != bs ? as < bs : aa < ba;
    }

    [[nodiscard]] bool empty() const { return runs_.empty(); }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] std::uint32_t runs() const { return static_cast<std::uint32_t>(runs_.size()); }
    [[nodiscard]] std::uint32_t run_size(std::uint32_t bi) const { return runs_[bi]->n; }
    [[nodiscard]] const Entry& at(Pos p) const { return runs_[p.bi]->at()[p.i]; }
    [[nodiscard]] const Entry& back() const { return lasts_.back(); }
    [[nodiscard]] Pos last() const { return {runs() - 1, runs_.back()->n - 1}; }
    // The first entry not below (size, addr); {runs(), 0} if none.
    [[nodiscard]] Pos lower_bound(std::int64_t size, std::int64_t addr) const {
        if (runs_.size() == 1) {  // most classes (a class of one size holds a few blocks)
            if (less(lasts_[0].size, lasts_[0].addr, size, addr)) return {1, 0};
            return {0, pos_in(*runs_[0], size, addr)};
        }
        std::uint32_t lo = 0, n = runs();
        while (n > 0) {
            const std::uint32_t half = n / 2;
            const Entry& e = lasts_[lo + half];
            if (less(e.size, e.addr, size, addr)) {
                lo += half + 1;
                n -= half + 1;
            } else {
                n = half;
            }
        }
        if (lo == runs()) return {lo, 0};
        return {lo, pos_in(*runs_[lo], size, addr)};
    }
    // The list made of `n` entries in ascending order (it was empty): runs
    // half full, centred.
    void assign_ascending(const Entry* e, std::size_t n) {
        for (std::size_t at = 0; at < n; at += kCap / 2) {
            const auto k = static_cast<std::uint32_t>(std::min<std::size_t>(kCap / 2, n - at));
            std::unique_ptr<Bucket> r = take_run();
            r->head = (kCap - k) / 2;
            std::copy(e + at, e + at + k, r->at());
            r->n = k;
            lasts_.push_back(e[at + k - 1]);
            runs_.push_back(std::move(r));
        }
        size_ = n;
    }
    // Every entry in ascending order appended to `out`; the list is left empty.
    void take_all(std::vector<Entry>& out) {
        for (auto& r : runs_) {
            out.insert(out.end(), r->at(), r->at() + r->n);
            if (!spare_) spare_ = std::move(r);
        }
        runs_.clear();
        lasts_.clear();
        size_ = 0;
    }
    // False when an equal key is in the list (std::set::insert).
    bool insert(const Entry& x) {
        ++size_;  // (undone below if the key is there)
        if (runs_.empty()) {
            runs_.push_back(take_run());
            lasts_.push_back(x);
            insert_at(*runs_[0], 0, x);
            return true;
        }
        Pos p = lower_bound(x.size, x.addr);
        if (p.bi == runs()) p = {runs() - 1, runs_.back()->n};  // past every key: the last run's end
        else if (!less(x.size, x.addr, at(p).size, at(p).addr)) {
            --size_;
            return false;
        }
        Bucket* r = runs_[p.bi].get();
        if (r->n == kCap) {
            split(p.bi);
            if (p.i > kCap / 2) {
                ++p.bi;
                p.i -= kCap / 2;
            }
            r = runs_[p.bi].get();
        }
        insert_at(*r, p.i, x);
        if (p.i + 1 == r->n) lasts_[p.bi] = x;
        return true;
    }
    void erase(Pos p) {
        Bucket* r = runs_[p.bi].get();
        erase_at(*r, p.i);
        --size_;
        if (r->n == 0) {
            if (!spare_) spare_ = std::move(runs_[p.bi]);
            runs_.erase(runs_.begin() + p.bi);
            lasts_.erase(lasts_.begin() + p.bi);
            return;
        }
        lasts_[p.bi] = r->at()[r->n - 1];
        if (r->n < kCap / 4) merge_around(p.bi);
    }
    // Entries in strictly ascending order, no run empty, each last key its run's.
    [[nodiscard]] bool ordered() const {
        const Entry* prev = nullptr;
        std::size_t n = 0;
        for (std::uint32_t bi = 0; bi < runs(); ++bi) {
            const Bucket& r = *runs_[bi];
            if (r.n == 0 || r.head + r.n > kCap) return false;
            n += r.n;
            for (std::uint32_t i = 0; i < r.n; ++i) {
                const Entry& e = r.at()[i];
                if (prev && !less(prev->size, prev->addr, e.size, e.addr)) return false;
                prev = &e;
            }
            if (lasts_[bi].b != prev->b || lasts_[bi].size != prev->size || lasts_[bi].addr != prev->addr) return false;
        }
        return lasts_.size() == runs_.size() && n == size_;
    }

private:
    static constexpr std::uint32_t kCap = 32;
    // A run's entries are e[head, head + n): room at both ends, so that an
    // insert or erase moves the shorter side (best fit takes a class's first
    // entry; moving the whole run every time made BM_SimDecode 10% slower).
    struct Bucket {
        std::uint32_t head = 0;
        std::uint32_t n = 0;
        Entry e[kCap];
        Entry* at() { return e + head; }
        [[nodiscard]] const Entry* at() const { return e + head; }
    };
    static std::uint32_t pos_in(const Bucket& r, std::int64_t size, std::int64_t addr) {
        const Entry* e = r.at();
        std::uint32_t lo = 0, n = r.n;
        while (n > 0) {
            const std::uint32_t half = n / 2;
            if (less(e[lo + half].size, e[lo + half].addr, size, addr)) {
                lo += half + 1;
                n -= half + 1;
            } else {
                n = half;
            }
        }
        return lo;
    }
    // Entry `x` at position i of a run with room, moving the shorter side
    // (into the room at its end; a run with no room before its first entry
    // and an insert near the front is centred first).
    static void insert_at(Bucket& r, std::uint32_t i, const Entry& x) {
        const bool front = i <= r.n - i;
        if (front && r.head == 0 && kCap - r.n >= 2) centre(r, 1);
        Entry* e = r.at();
        if ((front && r.head > 0) || r.head + r.n == kCap) {
            std::move(e, e + i, e - 1);
            --r.head;
        } else {
            std::move_backward(e + i, e + r.n, e + r.n + 1);
        }
        r.at()[i] = x;
        ++r.n;
    }
    static void erase_at(Bucket& r, std::uint32_t i) {
        Entry* e = r.at();
        if (i < r.n - 1 - i) {
            std::move_backward(e, e + i, e + i + 1);
            ++r.head;
        } else {
            std::move(e + i + 1, e + r.n, e + i);
        }
        --r.n;
    }
    // The run's entries moved to the middle of its room, `extra` more
    // entries counted (at least one free slot is left before them).
    static void centre(Bucket& r, std::uint32_t extra) {
        const std::uint32_t head = (kCap - r.n - extra + 1) / 2;
        if (head < r.head) std::move(r.at(), r.at() + r.n, r.e + head);
        else if (head > r.head) std::move_backward(r.at(), r.at() + r.n, r.e + head + r.n);
        r.head = head;
    }
    // A full run: its upper half becomes a new run after it (each half
    // centred in its room).
    void split(std::uint32_t bi) {
        Bucket* r = runs_[bi].get();
        std::unique_ptr<Bucket> hi = take_run();
        hi->head = kCap / 4;
        std::copy(r->at() + kCap / 2, r->at() + kCap, hi->at());
        hi->n = kCap - kCap / 2;
        r->n = kCap / 2;
        centre(*r, 0);
        runs_.insert(runs_.begin() + bi + 1, std::move(hi));
        lasts_.insert(lasts_.begin() + bi + 1, lasts_[bi]);
        lasts_[bi] = r->at()[r->n - 1];
    }
    // Run bi, under a quarter full, joins a neighbour with room for both.
    void merge_around(std::uint32_t bi) {
        if (bi + 1 < runs() && runs_[bi]->n + runs_[bi + 1]->n <= kCap / 2) {
            absorb_next(bi);
        } else if (bi > 0 && runs_[bi - 1]->n + runs_[bi]->n <= kCap / 2) {
            absorb_next(bi - 1);
        }
    }
    void absorb_next(std::uint32_t bi) {
        Bucket* a = runs_[bi].get();
        Bucket* b = runs_[bi + 1].get();
        if (a->head + a->n + b->n > kCap) centre(*a, b->n);
        std::copy(b->at(), b->at() + b->n, a->at() + a->n);
        a->n += b->n;
        lasts_[bi] = lasts_[bi + 1];
        if (!spare_) spare_ = std::move(runs_[bi + 1]);
        runs_.erase(runs_.begin() + bi + 1);
        lasts_.erase(lasts_.begin() + bi + 1);
    }
    std::unique_ptr<Bucket> take_run() {
        std::unique_ptr<Bucket> r = spare_ ? std::move(spare_) : std::make_unique<Bucket>();
        r->head = 0;
        r->n = 0;
        return r;
    }

    std::vector<std::unique_ptr<Bucket>> runs_;  // in key order
    std::vector<Entry> lasts_;                   // each run's last entry (a copy, in one array for the search)
    std::unique_ptr<Bucket> spare_;              // one emptied run, kept for reuse
    std::size_t size_ = 0;
};

// One size class of FreeBlocks: a sorted array while it holds at most
// kFlatMax blocks (almost always: a class of one size holds a handful, the
// busiest of `gpumem estimate llama-3-8b` a few hundred), SortedRuns past it
// (a fragmented small pool can hold 10^5 blocks of one size; the array alone
// made every free move half of them). The array is in descending (size,
// address) order, so the best fit, the smallest, is its last entry and taking
// it moves nothing. Positions are SortedRuns', the array being one run:
// entry i counts from the smallest. SortedRuns for every class cost 5% more
// instructions than the array on the BM_Replay1M trace (cachegrind).
class SizeClass {
public:
    using Entry = SortedRuns::Entry;
    using Pos = SortedRuns::Pos;

    [[nodiscard]] bool empty() const {
        if (big_) [[unlikely]] return big_->empty();
        return flat_.empty();
    }
    [[nodiscard]] std::size_t size() const { return big_ ? big_->size() : flat_.size(); }
    [[nodiscard]] std::uint32_t runs() const {
        if (big_) [[unlikely]] return big_->runs();
        return flat_.empty() ? 0 : 1;
    }
    [[nodiscard]] std::uint32_t run_size(std::uint32_t bi) const {
        if (big_) [[unlikely]] return big_->run_size(bi);
        return static_cast<std::uint32_t>(flat_.size());
    }
    [[nodiscard]] const Entry& at(Pos p) const {
        if (big_) [[unlikely]] return big_->at(p);
        return flat_[flat_.size() - 1 - p.i];
    }
    [[nodiscard]] const Entry& largest() const { return big_ ? big_->back() : flat_.front(); }
    [[nodiscard]] Pos last() const { return big_ ? big_->last() : Pos{0, static_cast<std::uint32_t>(flat_.size() - 1)}; }
    // The first entry not below (size, addr); {runs(), 0} if none.
    [[nodiscard]] Pos lower_bound(std::int64_t size, std::int64_t addr) const {
        if (big_) [[unlikely]] return big_->lower_bound(size, addr);
        const std::size_t k = not_below(size, addr);
        if (k == 0) return {runs(), 0};
        return {0, static_cast<std::uint32_t>(flat_.size() - k)};
    }
    // False when an equal key is in the class (std::set::insert).
    bool insert(const Entry& x) {
        if (big_) [[unlikely]] return big_->insert(x);
        const std::size_t k = not_below(x.size, x.addr);
        if (k > 0 && !SortedRuns::less(x.size, x.addr, flat_[k - 1].size, flat_[k - 1].addr)) return false;  // (flat_[k - 1] >= x)
        flat_.insert(flat_.begin() + static_cast<std::ptrdiff_t>(k), x);
        if (flat_.size() > kFlatMax) [[unlikely]] {
            std::reverse(flat_.begin(), flat_.end());
            big_ = std::make_unique<SortedRuns>();
            big_->assign_ascending(flat_.data(), flat_.size());
            flat_.clear();
        }
        return true;
    }
    void erase(Pos p) {
        if (!big_) [[likely]] {
            flat_.erase(flat_.begin() + static_cast<std::ptrdiff_t>(flat_.size() - 1 - p.i));
            return;
        }
        big_->erase(p);
        if (big_->size() < kFlatMax / 4) {
            big_->take_all(flat_);
            std::reverse(flat_.begin(), flat_.end());
            big_.reset();
        }
    }
    [[nodiscard]] bool ordered() const {
        if (big_) return flat_.empty() && big_->size() >= kFlatMax / 4 && big_->ordered();
        for (std::size_t i = 1; i < flat_.size(); ++i)
            if (!SortedRuns::less(flat_[i].size, flat_[i].addr, flat_[i - 1].size, flat_[i - 1].addr)) return false;
        return flat_.size() <= kFlatMax;
    }

private:
    static constexpr std::size_t kFlatMax = 256;
    // The number of entries of the array not below (size, addr).
    [[nodiscard]] std::size_t not_below(std::int64_t size, std::int64_t addr) const {
        std::size_t lo = 0, n = flat_.size();
        while (n > 0) {
            const std::size_t half = n / 2;
            const Entry& e = flat_[lo + half];
            if (!SortedRuns::less(e.size, e.addr, size, addr)) {
                lo += half + 1;
                n -= half + 1;
            } else {
                n = half;
            }
        }
        return lo;
    }
    std::vector<Entry> flat_;          // descending, while big_ is null
    std::unique_ptr<SortedRuns> big_;  // past kFlatMax entries
};

// The free, mapped blocks of a pool in best-fit order (BlockComparatorSize:
// stream, size, address), with a count of their sizes outside CUDA graph
// private pools so that the largest free block (what an OOM message and every
// new peak of a replay report) is O(log n), not a walk over the streams of a
// snapshot with thousands of them.
//
// The order is the source's std::set<Block*>; the structure is not. Every
// malloc searches this set and most mallocs and frees change it, and a
// step's pools hold hundreds of free blocks (856 in the small pool of
// `gpumem estimate llama-3-8b`, about 500 in a generated snapshot's). A
// red-black tree of pointers compared through the blocks took a third of a
// step simulation's samples (perf); one SortedRuns of every block (the
// structure before this one) still spent most of a large snapshot's replay
// in mispredicted comparisons (FreeBlocks::insert 29%, erase 15% of
// `gpumem snapshot` on 10M entries).
//
// Here each stream's blocks (past kFewBlocks of them; one list before) are
// split by size into classes, as a two-level segregated-fit allocator does
// (TLSF: Masmano et al., "TLSF: a new dynamic memory allocator for real-time
// systems", ECRTS 2004): below 32 KiB one class per 512 bytes (the
// allocator's rounding, so one size each), above it 64 classes per power of
// two. A bit per non-empty class and one per level with a non-empty class
// find the first class at or above a size with a count-trailing-zeros; a
// class (SizeClass) keeps its blocks in (size, address) order, so its first
// is its best fit. The order the allocator sees is unchanged: classes are
// ordered by size, so lower_bound, ++ and -- walk (stream, size, address)
// exactly. Measured against the single SortedRuns on this project's 2-core
// machine: replaying BM_Replay1M's trace 5 times, CPU time x0.76 (farm-bench,
// median of 11 pairs), 995M -> 871M instructions and 11.1M -> 5.0M
// mispredicted branches (cachegrind's model); 40 calls of `gpumem estimate
// llama-3-8b`, CPU time x0.89 (median of 11 pairs), mispredicted branches
// 158k -> 109k.
class FreeBlocks {
    using Entry = SizeClass::Entry;
    using Pos = SizeClass::Pos;
    static constexpr int kSubBits = 6;
    static constexpr std::uint32_t kSubs = 1U << kSubBits;        // classes per level
    static constexpr int kExactShift = 9;                         // level 0: 512-byte classes
    static constexpr std::uint64_t kLevel0 = std::uint64_t{kSubs} << kExactShift;  // 32 KiB
    static constexpr int kLevel0Bits = kSubBits + kExactShift;    // 15
    static constexpr std::uint32_t kLevels = 64 - kLevel0Bits + 1;  // sizes below 2^63
    static constexpr std::uint32_t kClasses = kLevels * kSubs;
    // A stream's blocks stay in one list (class 0) until there are more than
    // this many: a snapshot of 10^5 streams holding a block or two each then
    // costs a list each, not a table of classes each (2.8 KB a stream: 60,000
    // streams took 201 MB instead of 33 MB).
    static constexpr std::size_t kFewBlocks = 32;

    static std::uint32_t class_of(std::int64_t size) {
        if (size < 0) return 0;
        const auto s = static_cast<std::uint64_t>(size);
        if (s < kLevel0) return static_cast<std::uint32_t>(s >> kExactShift);
        const int fl = static_cast<int>(std::bit_width(s)) - 1;  // >= kLevel0Bits
        return static_cast<std::uint32_t>(fl - kLevel0Bits + 1) * kSubs +
               static_cast<std::uint32_t>((s >> (fl - kSubBits)) & (kSubs - 1));
    }
    struct Level {
        SizeClass lists[kSubs];
    };
    struct Classes {
        std::uint64_t levels = 0;            // bit l: level l has a non-empty class
        std::uint64_t subs[kLevels] = {};    // per level, bit k: class k is non-empty
        std::unique_ptr<Level> level[kLevels];
    };
    // One stream's free blocks: all in `few` while there are few, then by
    // class (`cls`, kept once made).
    struct Bins {
        explicit Bins(int s) : stream(s) {}
        int stream;
        SizeClass few;
        std::unique_ptr<Classes> cls;
        [[nodiscard]] const SizeClass& list(std::uint32_t c) const { return cls ? cls->level[c / kSubs]->lists[c % kSubs] : few; }
        SizeClass& list(std::uint32_t c) { return cls ? cls->level[c / kSubs]->lists[c % kSubs] : few; }
        [[nodiscard]] std::uint32_t class_for(std::int64_t size) const { return cls ? class_of(size) : 0; }
        [[nodiscard]] bool has(std::uint32_t c) const {
            return cls ? ((cls->subs[c / kSubs] >> (c % kSubs)) & 1U) != 0 : c == 0 && !few.empty();
        }
        // The first non-empty class at or after c (kClasses: none).
        [[nodiscard]] std::uint32_t next_from(std::uint32_t c) const {
            if (!cls) return c == 0 && !few.empty() ? 0 : kClasses;
            if (c >= kClasses) return kClasses;
            std::uint32_t lv = c / kSubs;
            const std::uint64_t m = cls->subs[lv] & (~std::uint64_t{0} << (c % kSubs));
            if (m) return lv * kSubs + static_cast<std::uint32_t>(std::countr_zero(m));
            const std::uint64_t lm = lv + 1 < 64 ? cls->levels & (~std::uint64_t{0} << (lv + 1)) : 0;
            if (!lm) return kClasses;
            lv = static_cast<std::uint32_t>(std::countr_zero(lm));
            return lv * kSubs + static_cast<std::uint32_t>(std::countr_zero(cls->subs[lv]));
        }
        // The last non-empty class before c (kClasses: none).
        [[nodiscard]] std::uint32_t last_before(std::uint32_t c) const {
            if (c == 0) return kClasses;
            if (!cls) return few.empty() ? kClasses : 0;
            c = std::min(c, kClasses) - 1;
            std::uint32_t lv = c / kSubs;
            const std::uint32_t sub = c % kSubs;
            const std::uint64_t m = cls->subs[lv] & (sub + 1 == 64 ? ~std::uint64_t{0} : (std::uint64_t{2} << sub) - 1);
            if (m) return lv * kSubs + 63U - static_cast<std::uint32_t>(std::countl_zero(m));
            const std::uint64_t lm = cls->levels & ((std::uint64_t{1} << lv) - 1);
            if (!lm) return kClasses;
            lv = 63U - static_cast<std::uint32_t>(std::countl_zero(lm));
            return lv * kSubs + 63U - static_cast<std::uint32_t>(std::countl_zero(cls->subs[lv]));
        }
        // Into class c's list (made if needed); false if the key is there.
        bool add(std::uint32_t c, const Entry& x) {
            const std::uint32_t lv = c / kSubs;
            if (!cls->level[lv]) cls->level[lv] = std::make_unique<Level>();
            if (!cls->level[lv]->lists[c % kSubs].insert(x)) return false;
            cls->subs[lv] |= std::uint64_t{1} << (c % kSubs);
            cls->levels |= std::uint64_t{1} << lv;
            return true;
        }
        // Class c's list emptied: its bits cleared.
        void emptied(std::uint32_t c) {
            const std::uint32_t lv = c / kSubs;
            cls->subs[lv] &= ~(std::uint64_t{1} << (c % kSubs));
            if (cls->subs[lv] == 0) cls->levels &= ~(std::uint64_t{1} << lv);
        }
    };

public:
    FreeBlocks() = default;
    FreeBlocks(const FreeBlocks&) = delete;
    FreeBlocks& operator=(const FreeBlocks&) = delete;

    // A position: a stream's blocks (end: null), class `c`, entry `p` of the
    // class. Valid until the set changes.
    class iterator {
    public:
        Block* operator*() const { return b_->list(c_).at(p_).b; }
        iterator& operator++() {
            const SizeClass& l = b_->list(c_);
            if (++p_.i < l.run_size(p_.bi)) return *this;
            if (++p_.bi < l.runs()) {
                p_.i = 0;
                return *this;
            }
            *this = s_->first_from(b_, c_ + 1);
            return *this;
        }
        iterator& operator--() {
            if (b_) {
                if (p_.i > 0) {
                    --p_.i;
                    return *this;
                }
                if (p_.bi > 0) {
                    --p_.bi;
                    p_.i = b_->list(c_).run_size(p_.bi) - 1;
                    return *this;
                }
            }
            *this = s_->last_before(b_, c_);
            return *this;
        }
        bool operator==(const iterator& o) const { return b_ == o.b_ && c_ == o.c_ && p_ == o.p_; }

    private:
        friend class FreeBlocks;
        iterator(const FreeBlocks* s, Bins* b, std::uint32_t c, Pos p) : s_(s), b_(b), c_(c), p_(p) {}
        const FreeBlocks* s_;
        Bins* b_;  // (the set's own: erase() changes it through a position)
        std::uint32_t c_;
        Pos p_;
    };

    [[nodiscard]] iterator begin() const { return first_from(streams_.empty() ? nullptr : streams_.begin()->second.get(), 0); }
    [[nodiscard]] iterator end() const { return {this, nullptr, 0, Pos{}}; }
    // First block not ordered before `key` (std::set::lower_bound).
    [[nodiscard]] iterator lower_bound(const Block* key) const {
        Bins* b = find_bins(key->stream);
        if (!b) {
            const auto it = streams_.upper_bound(key->stream);
            return first_from(it == streams_.end() ? nullptr : it->second.get(), 0);
        }
        const std::uint32_t c = b->class_for(key->size);
        if (b->has(c)) {
            const SizeClass& l = b->list(c);
            const Pos p = l.lower_bound(key->size, key->addr);
            if (p.bi < l.runs()) return {this, b, c, p};
        }
        return first_from(b, c + 1);
    }
    // The position of `b`, or end().
    [[nodiscard]] iterator find(const Block* b) const {
        const iterator it = lower_bound(b);
        return it != end() && *it == b ? it : end();
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] bool empty() const { return size_ == 0; }
    // Each stream's blocks in order, under its own stream, each in the list
    // of its class (class 0 while few), a class's bits set exactly when its
    // list holds blocks, each entry's key its block's; the walk the
    // allocator makes visits every block in strictly increasing (stream,
    // size, address) order.
    [[nodiscard]] bool consistent() const {
        std::size_t n = 0;
        auto check_list = [&n](const SizeClass& l, int stream, std::optional<std::uint32_t> cls) {
            if (!l.ordered()) return false;
            for (std::uint32_t bi = 0; bi < l.runs(); ++bi)
                for (std::uint32_t i = 0; i < l.run_size(bi); ++i) {
                    const Entry& e = l.at(Pos{bi, i});
                    if ((cls && class_of(e.size) != *cls) || e.b->size != e.size || e.b->addr != e.addr || e.b->stream != stream || !e.b->in_free)
                        return false;
                    ++n;
                }
            return true;
        };
        for (const auto& [stream, bp] : streams_) {
            const Bins& b = *bp;
            if (b.stream != stream) return false;
            if (!b.cls) {
                if (b.few.size() > kFewBlocks || !check_list(b.few, stream, std::nullopt)) return false;
                continue;
            }
            if (!b.few.empty()) return false;
            for (std::uint32_t lv = 0; lv < kLevels; ++lv) {
                if (((b.cls->levels >> lv) & 1U) != (b.cls->subs[lv] != 0 ? 1U : 0U)) return false;
                for (std::uint32_t k = 0; k < kSubs; ++k) {
                    const std::uint32_t c = lv * kSubs + k;
                    if (!b.cls->level[lv]) {
                        if (b.has(c)) return false;
                        continue;
                    }
                    const SizeClass& l = b.list(c);
                    if (b.has(c) == l.empty() || !check_list(l, stream, c)) return false;
                }
            }
        }
        if (n != size_) return false;
        std::size_t walked = 0;
        const Block* prev = nullptr;
        for (const Block* x : *this) {
            if (prev && !(prev->stream < x->stream || (prev->stream == x->stream && SortedRuns::less(prev->size, prev->addr, x->size, x->addr))))
                return false;
            prev = x;
            ++walked;
        }
        return walked == size_;
    }

    void insert(Block* b) {
        Bins& bins = bins_for(b->stream);
        const Entry x{b->size, b->addr, b};
        if (bins.cls) {
            if (!bins.add(class_of(b->size), x)) return;  // an equal key is in the set (std::set::insert)
        } else {
            if (!bins.few.insert(x)) return;
            if (bins.few.size() > kFewBlocks) spread(bins);
        }
        ++size_;
        b->in_free = true;
        if (b->stream != 0) note(b, +1);
    }
    void erase(iterator it) {
        Bins& bins = *it.b_;
        SizeClass& l = bins.list(it.c_);
        Block* b = l.at(it.p_).b;
        if (b->stream != 0) note(b, -1);
        b->in_free = false;
        l.erase(it.p_);
        --size_;
        if (bins.cls && l.empty()) bins.emptied(it.c_);
    }
    std::size_t erase(Block* b) {
        if (!b->in_free) return 0;
        const iterator it = find(b);
        // A free block's key never changes while it is in the set.
        if (it == end()) throw std::logic_error("CachingAllocator invariant violated: free block missing from its pool");
        erase(it);
        return 1;
    }
    // Largest free block of the eager streams (a graph pool's blocks serve no
    // eager request): stream 0's is the last entry of its last non-empty
    // class; the other eager streams' sizes are counted (almost every free
    // block is stream 0's, and counting them was a twelfth of a snapshot
    // replay).
    [[nodiscard]] std::int64_t largest_eager() const {
        std::int64_t best = eager_sizes_.empty() ? 0 : eager_sizes_.rbegin()->first;
        if (const Bins* b = find_bins(0)) {
            const std::uint32_t c = b->last_before(kClasses);
            if (c != kClasses) best = std::max(best, b->list(c).largest().size);
        }
        return best;
    }

private:
    // The first entry of class c or later of stream b, else of the streams after it.
    [[nodiscard]] iterator first_from(Bins* b, std::uint32_t c) const {
        for (; b; b = next_bins(b), c = 0) {
            const std::uint32_t f = b->next_from(c);
            if (f != kClasses) return {this, b, f, Pos{}};
        }
        return end();
    }
    // The last entry before class c of stream b (at end(): of the last
    // stream), else of the streams before it. Not called at begin().
    [[nodiscard]] iterator last_before(Bins* b, std::uint32_t c) const {
        if (!b) {
            if (streams_.empty()) throw std::logic_error("FreeBlocks: decrement of begin()");
            b = streams_.rbegin()->second.get();
            c = kClasses;
        }
        for (;;) {
            const std::uint32_t f = b->last_before(c);
            if (f != kClasses) return {this, b, f, b->list(f).last()};
            const auto it = streams_.lower_bound(b->stream);
            if (it == streams_.begin()) throw std::logic_error("FreeBlocks: decrement of begin()");
            b = std::prev(it)->second.get();
            c = kClasses;
        }
    }
    [[nodiscard]] Bins* next_bins(const Bins* b) const {
        const auto it = streams_.upper_bound(b->stream);
        return it == streams_.end() ? nullptr : it->second.get();
    }
    // The stream's blocks, or null: the stream an insert last named first
    // (almost every call names stream 0). Only inserts move it, so that
    // const calls change nothing (concurrent reads of one allocator stay safe).
    [[nodiscard]] Bins* find_bins(int s) const {
        if (hot_ && hot_->stream == s) return hot_;
        const auto it = streams_.find(s);
        return it == streams_.end() ? nullptr : it->second.get();
    }
    Bins& bins_for(int s) {
        Bins* b = find_bins(s);
        if (!b) {
            auto& slot = streams_[s];
            slot = std::make_unique<Bins>(s);
            b = slot.get();
        }
        hot_ = b;
        return *b;
    }
    // A stream past kFewBlocks: its blocks spread over the classes.
    static void spread(Bins& bins) {
        bins.cls = std::make_unique<Classes>();
        for (std::uint32_t i = 0; i < bins.few.run_size(0); ++i) {
            const Entry& e = bins.few.at(Pos{0, i});
            bins.add(class_of(e.size), e);
        }
        bins.few = SizeClass{};
    }
    void note(const Block* b, int delta);

    std::map<int, std::unique_ptr<Bins>> streams_;  // kept once made
    Bins* hot_ = nullptr;  // the stream the last insert named
    std::size_t size_ = 0;
    std::map<std::int64_t, std::int64_t> eager_sizes_;  // size -> free blocks of that size (eager streams but 0)
};

struct BlockPool {
    explicit BlockPool(bool small) : is_small(small) {}
    FreeBlocks blocks;                     // free, mapped blocks
    std::set<Block*, AddrCmp> unmapped;    // unmapped ranges of expandable segments
    bool is_small;
    std::int64_t get_free_blocks_call_count = 0;

    // BlockPool::insert_into_blocks: stamps the GC age base.
    void insert_into_blocks(Block* b) {
        b->gc_count_base = get_free_blocks_call_count;
        blocks.insert(b);
    }
};

void FreeBlocks::note(const Block* b, int delta) {
    if (b->stream >= kGraphPoolStream) return;
    auto& n = eager_sizes_[b->size];
    n += delta;
    if (n == 0) eager_sizes_.erase(b->size);
}

// ExpandableSegment: a virtual range mapped page by page.
struct ExpSeg {
    std::int64_t base = 0;
    std::int64_t size = 0;      // virtual size (multiple of page)
    std::int64_t page = 0;      // 2 MiB (small pool) or 20 MiB (large pool)
    std::int64_t mapped = 0;    // bytes currently mapped
    int stream = 0;
    bool small = false;
};

// The blocks, by slot: chunks of 256 that never move (blocks link to each
// other by pointer). std::deque kept 4 blocks in each of its 512-byte
// chunks: 600 of an 8B simulation's heap allocations, the capacity watch's
// copy included.
class BlockStore {
public:
    static constexpr std::size_t kChunk = 256;
    BlockStore() = default;
    BlockStore(const BlockStore& o) { *this = o; }
    BlockStore& operator=(const BlockStore& o) {
        if (this == &o) return *this;
        chunks_.clear();
        chunks_.reserve(o.chunks_.size());
        for (const auto& c : o.chunks_) {
            chunks_.push_back(std::make_unique<Block[]>(kChunk));
            std::copy(c.get(), c.get() + kChunk, chunks_.back().get());
        }
        size_ = o.size_;
        return *this;
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    Block& operator[](std::size_t i) { return chunks_[i / kChunk][i % kChunk]; }
    const Block& operator[](std::size_t i) const { return chunks_[i / kChunk][i % kChunk]; }
    Block& emplace_back() {
        if (size_ == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<Block[]>(kChunk));
        return (*this)[size_++];
    }
    template <class F>
    void for_each(F&& f) {
        for (std::size_t i = 0; i < size_; ++i) f((*this)[i]);
    }
    template <class F>
    void for_each(F&& f) const {
        for (std::size_t i = 0; i < size_; ++i) f((*this)[i]);
    }

private:
    std::vector<std::unique_ptr<Block[]>> chunks_;
    std::size_t size_ = 0;
};

struct SegRec {  // one cudaMalloc segment
    std::int64_t base = 0;
    std::int64_t size = 0;
    int stream = 0;
    bool small = false;
    bool released = false;
};

// The cudaMalloc segments by base address. Bases come from a bump pointer,
// so records are appended in address order and found by binary search; a
// released one is marked and dropped when half the records are released.
// (A hash map took a heap node per segment and a node per segment again in
// every clone: 2,400 of the 7,300 heap allocations of an 8B simulation.)
class SegTable {
public:
    void add(std::int64_t base, SegRec r) {
        if (!recs_.empty() && base <= recs_.back().base) throw std::logic_error("CachingAllocator: segment bases out of order");
        r.base = base;
        recs_.push_back(r);
        ++live_;
    }
    [[nodiscard]] const SegRec* find(std::int64_t base) const { return at(recs_, base); }
    void erase(std::int64_t base) {
        SegRec* r = at(recs_, base);
        if (!r) return;
        r->released = true;
        --live_;
        if (live_ * 2 < recs_.size())
            recs_.erase(std::remove_if(recs_.begin(), recs_.end(), [](const SegRec& x) { return x.released; }), recs_.end());
    }
    [[nodiscard]] std::size_t size() const { return live_; }

private:
    template <class V>
    static auto at(V& recs, std::int64_t base) -> decltype(&recs.front()) {
        auto it = std::lower_bound(recs.begin(), recs.end(), base, [](const SegRec& r, std::int64_t b) { return r.base < b; });
        return it != recs.end() && it->base == base && !it->released ? &*it : nullptr;
    }
    std::vector<SegRec> recs_;
    std::size_t live_ = 0;
};

struct CachingAllocator::Impl {
    AllocatorConfig cfg;
    std::int64_t capacity;
    std::int64_t max_split;        // max_split_size (kNoLimit when unset)
    std::int64_t max_non_split;    // max_non_split_rounding
    std::int64_t large_buffer;     // kLargeBuffer / large_segment_size
    bool gc_enabled;

    BlockPool large_blocks{false};
    BlockPool small_blocks{true};

    BlockStore storage;
    std::vector<std::uint32_t> free_slots;
    SegTable segs;                                      // cudaMalloc segments by base
    std::vector<std::unique_ptr<ExpSeg>> exp_segs;      // live expandable segments
    std::int64_t next_addr = std::int64_t{1} << 32;     // bump pointer for virtual addresses
    AllocatorStats stats;
    // Capacity watch (CachingAllocator::watch_capacity): the state before the
    // first cudaMalloc that would take reserved above `watch`.
    std::int64_t watch = kNoLimit;
    std::unique_ptr<Impl> watched;

    Impl(AllocatorConfig c, Bytes cap)
        : cfg(std::move(c)),
          capacity(std::min(cap.count(), kMaxSize / 2)),
          max_split(cfg.max_split_size ? cfg.max_split_size->count() : kNoLimit),
          max_non_split(cfg.max_non_split_rounding.count()),
          large_buffer(cfg.large_segment_size.count()),
          gc_enabled(cfg.garbage_collection_threshold > 0.0) {
        if (capacity < 0) throw std::invalid_argument("CachingAllocator: negative capacity");
        if (large_buffer <= 0) throw std::invalid_argument("CachingAllocator: large_segment_size must be positive");
    }

    // --- block storage -----------------------------------------------------
    Block* new_block(std::int64_t addr, std::int64_t size, int stream, BlockPool* pool, ExpSeg* es) {
        Block* b;
        if (!free_slots.empty()) {
            b = &storage[free_slots.back()];
            free_slots.pop_back();
            const std::uint32_t slot = b->slot, gen = b->gen;
            *b = Block{};
            b->slot = slot;
            b->gen = gen;
        } else {
            b = &storage.emplace_back();
            b->slot = static_cast<std::uint32_t>(storage.size() - 1);
        }
        b->addr = addr;
        b->size = size;
        b->stream = stream;
        b->pool = pool;
        b->es = es;
        b->live = true;
        return b;
    }
    void delete_block(Block* b) {
        b->live = false;
        b->prev = b->next = nullptr;
        free_slots.push_back(b->slot);
    }

    // --- stats helpers -----------------------------------------------------
    void add_reserved(std::int64_t n) {
        stats.reserved += Bytes(n);
        stats.peak_reserved = max(stats.peak_reserved, stats.reserved);
    }

    // --- config-dependent rules --------------------------------------------
    // CUDAAllocatorConfig::roundup_power2_divisions(size): interval index is
    // floor(log2(size)) - 20 clamped to [0, 15] (sizes below 2 MiB use entry 0).
    [[nodiscard]] std::int64_t divisions_for(std::int64_t size) const {
        const auto& v = cfg.roundup_power2_divisions;
        if (v.empty()) return 0;
        if (v.size() == 1) return v[0];
        int idx = floor_log2(static_cast<std::uint64_t>(size)) - 20;
        idx = std::clamp(idx, 0, kRoundUpPowerOfTwoIntervals - 1);
        return static_cast<std::size_t>(idx) < v.size() ? v[static_cast<std::size_t>(idx)] : 0;
    }

    // roundup_power2_next_division: the next of `divisions` equal steps between
    // the surrounding powers of two (powers of two are returned unchanged).
    static std::int64_t roundup_power2_next_division(std::int64_t size, std::int64_t divisions) {
        const auto u = static_cast<std::uint64_t>(size);
        if (std::has_single_bit(u)) return size;
        const std::uint64_t floor2 = std::bit_floor(u);
        const std::uint64_t step = floor2 >> floor_log2(static_cast<std::uint64_t>(divisions));
        if (step == 0) return static_cast<std::int64_t>(floor2 << 1);
        const std::uint64_t down = u & ~(step - 1);
        return static_cast<std::int64_t>(down == u ? u : down + step);
    }

    // round_size: < 512 -> 512; with divisions d > 1 and size > 512*d ->
    // roundup_power2_next_division; else up to a multiple of 512.
    [[nodiscard]] std::int64_t round_size(std::int64_t size) const {
        if (size < kMinBlockSize) return kMinBlockSize;
        if (size >= kMaxSize) return kMaxSize;
        const std::int64_t d = divisions_for(size);
        if (d > 1 && size > kMinBlockSize * d) return roundup_power2_next_division(size, d);
        return round_up(size, kMinBlockSize);
    }

    // get_allocation_size: segment size cudaMalloc is asked for.
    [[nodiscard]] std::int64_t get_allocation_size(std::int64_t size) const {
        if (size <= kSmallSize) return kSmallBuffer;
        if (size < kMinLargeAlloc) return large_buffer;
        return round_up(size, kRoundLarge);
    }

    // get_pool: rounded size <= kSmallSize -> small pool.
    BlockPool& get_pool(std::int64_t size) { return size <= kSmallSize ? small_blocks : large_blocks; }

    // should_split: small pool or expandable_segments -> remainder >= 512 B;
    // large pool -> request below max_split_size and remainder > kSmallSize.
    [[nodiscard]] bool should_split(const Block* block, std::int64_t size) const {
        const std::int64_t remaining = block->size - size;
        if (block->pool->is_small || cfg.expandable_segments) return remaining >= kMinBlockSize;
        return size < max_split && remaining > kSmallSize;
    }

    struct Params {
        std::int64_t size;        // rounded request
        int stream;
        BlockPool* pool;
        std::int64_t alloc_size;  // get_allocation_size(size)
        Block* block = nullptr;
    };

    // get_free_block: best fit = lower_bound on (stream, size, address 0).
    bool get_free_block(Params& p) {
        BlockPool& pool = *p.pool;
        if (gc_enabled) ++pool.get_free_blocks_call_count;  // ages for garbage collection
        Block key;
        key.stream = p.stream;
        key.size = p.size;
        key.addr = std::numeric_limits<std::int64_t>::min();
        auto it = pool.blocks.lower_bound(&key);
        if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
        if ((*it)->es) {
            // Expandable segments: for best fit a block followed by unmapped space
            // counts with the size it could expand to; prefer a later block whose
            // expandable size is smaller.
            auto expandable_size = [](const Block* b) {
                return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
            };
            auto next = it;
            ++next;
            while ((*it)->es && next != pool.blocks.end() && (*next)->stream == p.stream &&
                   expandable_size(*next) < expandable_size(*it)) {
                it = next;
                ++next;
            }
        }
        // Do not return an oversize block for a request below max_split_size.
        if (p.size < max_split && (*it)->size >= max_split) return false;
        // An oversize block serves a large request only within max_non_split_rounding
        // (kLargeBuffer before max_non_split_rounding_mb existed; same default).
        if (p.size >= max_split && (*it)->size >= p.size + max_non_split) return false;
        p.block = *it;
        pool.blocks.erase(it);
        return true;
    }

    // alloc_block: a new segment from cudaMalloc (or mapped pages when expandable).
    bool alloc_block(Params& p, bool is_retry) {
        if (is_retry) ++stats.alloc_retries;
        if (cfg.expandable_segments) {
            p.block = try_allocate_expandable_block(p.stream, p.pool, p.size);
            return p.block != nullptr;
        }
        // Nothing has changed since this malloc began (a failed best-fit
        // search changes nothing; the GC, which ages blocks, is off where a
        // watch is set): the copy is the state before the malloc.
        if (watch != kNoLimit && !watched && stats.reserved.count() + p.alloc_size > watch) {
            watched = clone();
            watched->capacity = watch;
            watch = kNoLimit;
        }
        if (stats.reserved.count() + p.alloc_size > capacity) return false;  // cudaErrorMemoryAllocation
        const std::int64_t addr = next_addr;
        next_addr += round_up(p.alloc_size, kRoundLarge);
        p.block = new_block(addr, p.alloc_size, p.stream, p.pool, nullptr);
        segs.add(addr, SegRec{0, p.alloc_size, p.stream, p.pool->is_small, false});
        ++stats.segments;
        ++stats.cuda_mallocs;
        add_reserved(p.alloc_size);
        if (is_private(p.stream)) stats.reserved_private += Bytes(p.alloc_size);
        return true;
    }

    static bool is_private(int stream) { return stream >= kGraphPoolStream; }

    // release_block: cudaFree of a whole (unsplit) cached segment.
    void release_block(Block* b) {
        --stats.segments;
        ++stats.cuda_frees;
        stats.reserved -= Bytes(b->size);
        if (is_private(b->stream)) stats.reserved_private -= Bytes(b->size);
        b->pool->blocks.erase(b);
        segs.erase(b->addr);
        delete_block(b);
    }

    // release_available_cached_blocks: with max_split_size set, free the smallest
    // oversize cached block >= max(request, max_split_size); if there is none,
    // free oversize blocks from the largest down until enough bytes were freed.
    bool release_available_cached_blocks(const Params& p) {
        if (max_split == kNoLimit || is_private(p.stream)) return false;
        BlockPool& pool = *p.pool;
        Block key;
        key.stream = p.stream;
        key.size = std::max(p.size, max_split);
        key.addr = std::numeric_limits<std::int64_t>::min();
        auto it = pool.blocks.lower_bound(&key);
        if (it == pool.blocks.end() || (*it)->stream != p.stream) {
            if (it == pool.blocks.begin()) return false;
            // The blocks are picked first, then released (a release moves the
            // set's entries); the source releases each as it walks down.
            std::int64_t released = 0;
            std::vector<Block*> picked;
            --it;
            while (released < key.size && (*it)->size >= max_split && (*it)->stream == p.stream) {
                Block* cur = *it;
                if (cur->es || cur->is_split()) break;  // the source asserts these never occur here
                released += cur->size;
                picked.push_back(cur);
                if (it == pool.blocks.begin()) break;
                --it;
            }
            for (Block* b : picked) release_block(b);
            if (released < key.size) return false;
        } else {
            if ((*it)->es || (*it)->is_split()) return false;
            release_block(*it);
        }
        return true;
    }

    // release_blocks: cudaFree every unsplit cached block of the pool; unmap the
    // wholly free pages of expandable segments (and drop fully unmapped ones).
    void release_blocks(BlockPool& pool) {
        std::vector<Block*> to_unmap, to_release;  // (a release moves the set's entries)
        for (Block* b : pool.blocks) {
            if (is_private(b->stream)) continue;  // graph_pools_freeable only: the graphs live
            if (b->es) {
                to_unmap.push_back(b);
            } else if (!b->is_split()) {
                to_release.push_back(b);
            }
        }
        for (Block* b : to_release) release_block(b);
        for (Block* b : to_unmap) {
            unmap_block(b);
            if (!b->mapped && !b->is_split()) release_expandable_segment(b);
        }
    }

    // release_cached_blocks (emptyCache): large pool, then small pool.
    void release_cached_blocks() {
        release_blocks(large_blocks);
        release_blocks(small_blocks);
    }

    // garbage_collect_cached_blocks: when reserved exceeds threshold * capacity,
    // free unsplit large cached blocks whose age (get_free_block calls on the pool
    // since they became free) is at least the average age, repeating until the
    // excess is reclaimed or nothing more can be freed.
    void garbage_collect_cached_blocks() {
        const auto gc_threshold = static_cast<std::int64_t>(cfg.garbage_collection_threshold *
                                                            static_cast<double>(capacity));
        const std::int64_t total = stats.reserved.count();
        if (total <= gc_threshold) return;
        const std::int64_t target = total - gc_threshold;
        std::int64_t reclaimed = 0;
        BlockPool& pool = large_blocks;
        auto age = [&pool](const Block* b) { return pool.get_free_blocks_call_count - b->gc_count_base; };
        std::int64_t total_age = 0;
        std::int64_t freeable = 0;
        for (const Block* b : pool.blocks) {
            if (!b->is_split() && !b->es && !is_private(b->stream)) {
                total_age += age(b);
                ++freeable;
            }
        }
        if (freeable == 0) return;
        bool block_freed = true;
        while (reclaimed < target && block_freed && freeable > 0) {
            const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
            block_freed = false;
            std::vector<Block*> old;  // picked, then released (a release moves the set's entries)
            for (Block* b : pool.blocks) {
                if (!b->is_split() && !b->es && !is_private(b->stream) && static_cast<double>(age(b)) >= age_threshold) {
                    block_freed = true;
                    reclaimed += b->size;
                    total_age -= age(b);
                    --freeable;
                    old.push_back(b);
                }
            }
            for (Block* b : old) release_block(b);
        }
    }

    // --- expandable segments -------------------------------------------------
    static bool allocatable(const Block* b) { return b != nullptr && !b->allocated; }

    // find_expandable_block: the lowest-address run of free/unmapped blocks of
    // this stream's segments with room for `size`; else a new segment.
    Block* find_expandable_block(int stream, BlockPool* pool, std::int64_t size) {
        auto has_space = [size](const Block* b) {
            std::int64_t bytes = 0;
            while (bytes < size && allocatable(b)) {
                bytes += b->size;
                b = b->next;
            }
            return bytes >= size;
        };
        Block key;
        key.stream = stream;
        key.addr = std::numeric_limits<std::int64_t>::min();
        for (auto it = pool->unmapped.lower_bound(&key); it != pool->unmapped.end() && (*it)->stream == stream; ++it) {
            Block* c = *it;
            if (allocatable(c->prev)) c = c->prev;  // a free block right before the gap
            if (has_space(c)) return c;
        }
        auto es = std::make_unique<ExpSeg>();
        es->page = pool->is_small ? kSmallBuffer : large_buffer;
        // ExpandableSegment: address space for 1 1/8 of the device memory, so a
        // request larger than the device fails to map (an OOM). Our address
        // space is capped (a "no limit" capacity would overflow it): a request
        // beyond the cap reserves a segment that holds it, as the source's
        // 1 1/8 of any device that could map it would.
        const std::int64_t want = capacity > kMaxExpandableAddressSpace ? kMaxExpandableAddressSpace
                                                                         : capacity + capacity / 8;
        es->size = std::max(es->page, round_up(std::max<std::int64_t>({want, size, 1}), es->page));
        es->base = next_addr;
        es->stream = stream;
        es->small = pool->is_small;
        next_addr += round_up(es->size, kRoundLarge);
        Block* candidate = new_block(es->base, es->size, stream, pool, es.get());
        candidate->mapped = false;
        pool->unmapped.insert(candidate);
        exp_segs.push_back(std::move(es));
        return candidate;
    }

    // map_block + ExpandableSegment::map: map the pages covering
    // [to_map, to_map + size); fails (maps nothing) if the pages do not fit.
    bool map_block(Block* to_map, std::int64_t size) {
        ExpSeg& es = *to_map->es;
        const std::int64_t begin = (to_map->addr - es.base) / es.page;
        const std::int64_t end = (to_map->addr + size - es.base + es.page - 1) / es.page;
        const std::int64_t mapped_size = (end - begin) * es.page;
        if (mapped_size == 0) return false;
        if (stats.reserved.count() + mapped_size > capacity) return false;  // cuMemCreate OOM
        BlockPool& pool = *to_map->pool;
        pool.unmapped.erase(to_map);
        to_map->mapped = true;
        if (mapped_size < to_map->size) {
            Block* remaining = new_block(to_map->addr + mapped_size, to_map->size - mapped_size, to_map->stream,
                                         &pool, to_map->es);
            remaining->mapped = false;
            remaining->prev = to_map;
            remaining->next = to_map->next;
            if (to_map->next) to_map->next->prev = remaining;
            to_map->next = remaining;
            pool.unmapped.insert(remaining);
            to_map->size = mapped_size;
        }
        try_merge_blocks(to_map, to_map->prev, pool);
        try_merge_blocks(to_map, to_map->next, pool);
        pool.insert_into_blocks(to_map);
        if (es.mapped == 0) ++stats.segments;  // counted while it holds memory
        es.mapped += mapped_size;
        ++stats.cuda_mallocs;
        add_reserved(mapped_size);
        if (is_private(to_map->stream)) stats.reserved_private += Bytes(mapped_size);
        return true;
    }

    // try_allocate_expandable_block
    Block* try_allocate_expandable_block(int stream, BlockPool* pool, std::int64_t size) {
        // More than the device can ever map: cuMemCreate fails (the source's
        // segment, 1 1/8 of the device, is mapped up to the failure: nothing).
        if (size > capacity) return nullptr;
        Block* candidate = find_expandable_block(stream, pool, size);
        if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, size))) return nullptr;
        while (candidate->size < size) {
            // candidate is free and mapped, followed by unmapped space
            const std::int64_t remaining = size - candidate->size;
            Block* next = candidate->next;
            // find_expandable_block returned a run with room for `size`; a run
            // ending early would be a bug here, answered as "does not map".
            if (next == nullptr || next->mapped || next->allocated) return nullptr;
            if (!map_block(next, std::min(remaining, next->size))) return nullptr;
            candidate = next;  // map_block merged the old candidate into `next`
        }
        pool->blocks.erase(candidate);
        return candidate;
    }

    // unmap_block + ExpandableSegment::unmap: unmap the whole pages inside a
    // free block; the partial pages at either end stay mapped as free blocks.
    void unmap_block(Block* block) {
        ExpSeg& es = *block->es;
        const std::int64_t begin = (block->addr - es.base + es.page - 1) / es.page;
        const std::int64_t end = (block->addr + block->size - es.base) / es.page;
        if (begin >= end) return;
        BlockPool& pool = *block->pool;
        pool.blocks.erase(block);
        const std::int64_t uptr = es.base + begin * es.page;
        const std::int64_t usize = (end - begin) * es.page;
        const std::int64_t before = uptr - block->addr;
        if (before > 0) {
            Block* b = new_block(block->addr, before, block->stream, &pool, block->es);
            b->prev = block->prev;
            if (b->prev) b->prev->next = b;
            b->next = block;
            block->prev = b;
            pool.insert_into_blocks(b);
        }
        const std::int64_t after = block->size - (before + usize);
        if (after > 0) {
            Block* a = new_block(uptr + usize, after, block->stream, &pool, block->es);
            a->next = block->next;
            if (a->next) a->next->prev = a;
            a->prev = block;
            block->next = a;
            pool.insert_into_blocks(a);
        }
        block->addr = uptr;
        block->size = usize;
        block->mapped = false;
        try_merge_blocks(block, block->prev, pool);
        try_merge_blocks(block, block->next, pool);
        pool.unmapped.insert(block);
        es.mapped -= usize;
        if (es.mapped == 0) --stats.segments;
        stats.reserved -= Bytes(usize);
        ++stats.cuda_frees;
    }

    // release_expandable_segment: a segment whose whole range is unmapped. (As in
    // the source, a segment created by find_expandable_block whose first mapping
    // failed stays, unmapped, until release_blocks meets it again; it holds no
    // memory and is not counted in stats.segments.)
    void release_expandable_segment(Block* block) {
        ExpSeg* es = block->es;
        block->pool->unmapped.erase(block);
        delete_block(block);
        auto it = std::find_if(exp_segs.begin(), exp_segs.end(), [es](const auto& p) { return p.get() == es; });
        if (it != exp_segs.end()) exp_segs.erase(it);
    }

    // --- merge / split -------------------------------------------------------
    // try_merge_blocks: absorb a free neighbour with the same mapped state.
    std::int64_t try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
        if (!src || src->allocated || dst->mapped != src->mapped) return 0;
        if (dst->prev == src) {  // [src dst]
            dst->addr = src->addr;
            dst->prev = src->prev;
            if (dst->prev) dst->prev->next = dst;
        } else {  // [dst src]
            dst->next = src->next;
            if (dst->next) dst->next->prev = dst;
        }
        const std::int64_t subsumed = src->size;
        dst->size += subsumed;
        if (src->mapped) {
            pool.blocks.erase(src);
        } else {
            pool.unmapped.erase(src);
        }
        delete_block(src);
        return subsumed;
    }

    // alloc_found_block: split off the low addresses for the request (the old
    // Block object keeps the remainder and returns to the pool), mark allocated.
    Block* alloc_found_block(const Params& p, std::int64_t orig_size, bool split) {
        Block* block = p.block;
        if (split) {
            Block* remaining = block;
            block = new_block(remaining->addr, p.size, p.stream, p.pool, remaining->es);
            block->prev = remaining->prev;
            if (block->prev) block->prev->next = block;
            block->next = remaining;
            remaining->prev = block;
            remaining->addr += p.size;
            remaining->size -= p.size;
            p.pool->insert_into_blocks(remaining);
        }
        block->allocated = true;
        block->requested = orig_size;
        // 31-bit generation (>= 1): handles stay positive and never equal kNullBlock.
        block->gen = block->gen >= 0x7fffffffU ? 1U : block->gen + 1U;
        stats.allocated += Bytes(block->size);
        if (is_private(block->stream)) stats.allocated_private += Bytes(block->size);
        stats.requested += Bytes(orig_size);
        stats.peak_allocated = max(stats.peak_allocated, stats.allocated);
        stats.peak_requested = max(stats.peak_requested, stats.requested);
        ++stats.allocations;
        return block;
    }

    // free_block: merge with free neighbours, return to the pool.
    void free_block(Block* block) {
        BlockPool& pool = *block->pool;
        try_merge_blocks(block, block->prev, pool);
        try_merge_blocks(block, block->next, pool);
        pool.insert_into_blocks(block);
    }

    // A deep copy: blocks keep their slots (so handles stay valid), their
    // links point into the copy, the free sets are rebuilt. Expandable
    // segments are not copied (watch_capacity refuses them).
    [[nodiscard]] std::unique_ptr<Impl> clone() const {
        auto c = std::make_unique<Impl>(cfg, Bytes(capacity));
        c->storage = storage;
        auto tr = [&c](const Block* b) -> Block* { return b ? &c->storage[b->slot] : nullptr; };
        c->storage.for_each([&](Block& b) {
            b.prev = tr(b.prev);
            b.next = tr(b.next);
            b.pool = b.pool == &large_blocks ? &c->large_blocks : b.pool == &small_blocks ? &c->small_blocks : nullptr;
            b.es = nullptr;
            b.in_free = false;
        });
        for (const BlockPool* from : {&large_blocks, &small_blocks}) {
            BlockPool& to = from == &large_blocks ? c->large_blocks : c->small_blocks;
            to.get_free_blocks_call_count = from->get_free_blocks_call_count;
            for (const Block* b : from->blocks) to.blocks.insert(tr(b));
        }
        c->free_slots = free_slots;
        c->segs = segs;
        c->next_addr = next_addr;
        c->stats = stats;
        return c;
    }

    // --- public operations ---------------------------------------------------
    [[nodiscard]] std::int64_t largest_free() const {
        return std::max(large_blocks.blocks.largest_eager(), small_blocks.blocks.largest_eager());
    }

    // The handle, or CachingAllocator::kFailedBlock with `oom` filled.
    BlockHandle allocate(std::int64_t orig_size, int stream, OomInfo& oom) {
        if (orig_size < 0) throw std::invalid_argument("CachingAllocator::malloc: negative size");
        if (orig_size == 0) return kNullBlock;  // PyTorch hands out nullptr for 0 bytes without allocating
        // malloc: round, pick the pool, best fit, else a new segment with retries.
        const std::int64_t size = round_size(orig_size);
        BlockPool& pool = get_pool(size);
        Params p{size, stream, &pool, get_allocation_size(size)};
        bool found = get_free_block(p);
        if (!found) {
            if (gc_enabled) garbage_collect_cached_blocks();
            found = alloc_block(p, false) || (release_available_cached_blocks(p) && alloc_block(p, false)) ||
                    (release_cached_blocks(), alloc_block(p, true));
        }
        if (!found) {
            ++stats.ooms;
            oom = OomInfo{};
            oom.requested = Bytes(size);
            oom.alloc_size = Bytes(p.alloc_size);
            oom.allocated = stats.allocated;
            oom.reserved = stats.reserved;
            oom.capacity = Bytes(capacity);
            oom.device_free = Bytes(std::max<std::int64_t>(0, capacity - stats.reserved.count()));
            oom.largest_free_block = Bytes(largest_free());
            return CachingAllocator::kFailedBlock;
        }
        const bool split = should_split(p.block, size);
        Block* b = alloc_found_block(p, orig_size, split);
        return make_block_handle(b->slot, b->gen);
    }

    AllocResult malloc(std::int64_t orig_size, int stream) {
        AllocResult r;
        OomInfo oom;
        const BlockHandle h = allocate(orig_size, stream, oom);
        if (h == CachingAllocator::kFailedBlock) {
            r.ok = false;
            r.oom = oom;
            return r;
        }
        r.ok = true;
        r.handle = h;
        if (h != kNullBlock) r.block_size = Bytes(storage[block_slot(h)].size);
        return r;
    }

    void free(BlockHandle h) {
        if (h == kNullBlock) return;
        const std::size_t slot = block_slot(h);
        const std::uint32_t gen = block_generation(h);
        if (h < 0 || slot >= storage.size()) throw std::invalid_argument("CachingAllocator::free: invalid handle");
        Block* b = &storage[slot];
        if (!b->live || !b->allocated || b->gen != gen)
            throw std::invalid_argument("CachingAllocator::free: handle is not an allocated block (double free?)");
        // free: stats first, then free_block.
        b->allocated = false;
        stats.allocated -= Bytes(b->size);
        if (is_private(b->stream)) stats.allocated_private -= Bytes(b->size);
        stats.requested -= Bytes(b->requested);
        --stats.allocations;
        b->requested = 0;
        free_block(b);
    }

    // --- inspection ----------------------------------------------------------
    [[nodiscard]] std::vector<const Block*> heads() const {
        std::vector<const Block*> out;
        storage.for_each([&](const Block& b) {
            if (b.live && b.prev == nullptr) out.push_back(&b);
        });
        return out;
    }

    [[nodiscard]] std::vector<SegmentInfo> segments() const {
        std::vector<SegmentInfo> out;
        for (const Block* head : heads()) {
            const Block* b = head;
            while (b) {
                if (!b->mapped) {
                    b = b->next;
                    continue;
                }
                // one SegmentInfo per contiguous mapped range (snapshot())
                SegmentInfo s;
                s.address = b->addr;
                s.stream = b->stream;
                s.small_pool = b->pool->is_small;
                s.expandable = b->es != nullptr;
                while (b && b->mapped) {
                    s.blocks.push_back(BlockInfo{b->addr, Bytes(b->size), Bytes(b->requested), b->allocated});
                    s.size += Bytes(b->size);
                    b = b->next;
                }
                out.push_back(std::move(s));
            }
        }
        std::sort(out.begin(), out.end(), [](const SegmentInfo& a, const SegmentInfo& c) { return a.address < c.address; });
        return out;
    }

    void signature(std::vector<std::int64_t>& out, const std::function<std::int64_t(BlockHandle)>& label) const {
        std::vector<const Block*> hs = heads();
        std::sort(hs.begin(), hs.end(), [](const Block* a, const Block* c) { return a->addr < c->addr; });
        out.push_back(static_cast<std::int64_t>(hs.size()));
        for (const Block* head : hs) {
            const std::int64_t base = head->es ? head->es->base : head->addr;
            out.push_back(-1);  // segment separator
            out.push_back(head->stream);
            out.push_back(head->pool->is_small ? 1 : 0);
            if (head->es) {
                out.push_back(head->es->size);
                out.push_back(head->es->page);
                out.push_back(head->es->mapped);
            } else {
                out.push_back(0);
            }
            for (const Block* b = head; b; b = b->next) {
                out.push_back(b->addr - base);
                out.push_back(b->size);
                out.push_back(b->requested);
                out.push_back((b->allocated ? 1 : 0) | (b->mapped ? 2 : 0));
                if (b->allocated) out.push_back(label(make_block_handle(b->slot, b->gen)));
                else if (gc_enabled && b->mapped) out.push_back(b->pool->get_free_blocks_call_count - b->gc_count_base);
            }
        }
    }

    [[noreturn]] static void violation(const std::string& what) {
        throw std::logic_error("CachingAllocator invariant violated: " + what);
    }

    void check_invariants() const {
        std::int64_t allocated = 0, requested = 0, reserved = 0, allocations = 0;
        std::size_t free_mapped = 0, free_unmapped = 0;
        std::int64_t n_segs = 0, n_es = 0, n_es_objects = 0;
        std::unordered_set<const ExpSeg*> seen_es;
        for (const Block* head : heads()) {
            const Block* b = head;
            std::int64_t seg_size = 0, mapped = 0;
            const std::int64_t base = head->addr;
            while (b) {
                if (!b->live) violation("dead block linked into a segment");
                if (b->size <= 0) violation("block of non-positive size");
                if (b->next) {
                    if (b->next->prev != b) violation("broken prev/next links");
                    if (b->addr + b->size != b->next->addr) violation("blocks not contiguous");
                    if (b->next->stream != b->stream || b->next->pool != b->pool || b->next->es != b->es)
                        violation("blocks of one segment disagree on stream/pool/segment");
                    if (!b->allocated && !b->next->allocated && b->mapped == b->next->mapped)
                        violation("two adjacent free blocks were not merged");
                }
                if (!b->mapped && (b->allocated || !b->es)) violation("unmapped block allocated or outside an expandable segment");
                if (b->allocated) {
                    allocated += b->size;
                    requested += b->requested;
                    ++allocations;
                    if (b->pool->blocks.find(b) != b->pool->blocks.end() || b->in_free) violation("allocated block in a free pool");
                } else if (b->mapped) {
                    ++free_mapped;
                    if (b->pool->blocks.find(b) == b->pool->blocks.end()) violation("free block missing from its pool");
                    if (!b->in_free) violation("free block not flagged as in its pool");
                } else {
                    ++free_unmapped;
                    auto it = b->pool->unmapped.find(const_cast<Block*>(b));
                    if (it == b->pool->unmapped.end() || *it != b) violation("unmapped block missing from the unmapped set");
                    if ((b->addr - b->es->base) % b->es->page != 0 || b->size % b->es->page != 0)
                        violation("unmapped range not page aligned");
                }
                if (b->pool->is_small != (b->pool == &small_blocks)) violation("pool flag");
                seg_size += b->size;
                if (b->mapped) mapped += b->size;
                b = b->next;
            }
            if (head->es) {
                if (!seen_es.insert(head->es).second) violation("two heads for one expandable segment");
                if (base != head->es->base || seg_size != head->es->size) violation("expandable segment range");
                if (mapped != head->es->mapped) violation("expandable segment mapped bytes");
                if (mapped > 0) ++n_es;
                ++n_es_objects;
            } else {
                const SegRec* rec = segs.find(base);
                if (!rec || rec->size != seg_size) violation("segment size differs from the cudaMalloc size");
                if (rec->small != head->pool->is_small || rec->stream != head->stream)
                    violation("segment record pool/stream");
                ++n_segs;
            }
            reserved += mapped;
        }
        if (n_segs != static_cast<std::int64_t>(segs.size())) violation("segment records without blocks");
        if (n_es_objects != static_cast<std::int64_t>(exp_segs.size())) violation("expandable segments without blocks");
        if (!small_blocks.blocks.consistent() || !large_blocks.blocks.consistent())
            violation("a pool's free set is out of order or out of date");
        if (free_mapped != small_blocks.blocks.size() + large_blocks.blocks.size())
            violation("pool sets hold blocks that are not free blocks of a segment");
        if (free_unmapped != small_blocks.unmapped.size() + large_blocks.unmapped.size())
            violation("unmapped sets hold stray blocks");
        if (stats.allocated.count() != allocated) violation("stats.allocated != sum of allocated blocks");
        if (stats.requested.count() != requested) violation("stats.requested != sum of requested sizes");
        if (stats.reserved.count() != reserved) violation("stats.reserved != sum of mapped segment bytes");
        if (stats.allocations != allocations) violation("stats.allocations != allocated blocks");
        if (stats.segments != n_segs + n_es) violation("stats.segments != segments");
        if (stats.peak_allocated < stats.allocated || stats.peak_reserved < stats.reserved ||
            stats.peak_requested < stats.requested)
            violation("a peak below its current value");
        if (stats.reserved.count() > capacity) violation("reserved above capacity");
        std::int64_t largest = 0;
        for (const BlockPool* pool : {&large_blocks, &small_blocks})
            for (const Block* b : pool->blocks)
                if (!is_private(b->stream)) largest = std::max(largest, b->size);
        if (largest != largest_free()) violation("largest free block differs from the free blocks");
    }
};

// ---------------------------------------------------------------------------

CachingAllocator::CachingAllocator(AllocatorConfig cfg, Bytes capacity) : impl_(new Impl(std::move(cfg), capacity)) {}
CachingAllocator::~CachingAllocator() { delete impl_; }
CachingAllocator::CachingAllocator(CachingAllocator&& o) noexcept : impl_(o.impl_) { o.impl_ = nullptr; }
CachingAllocator& CachingAllocator::operator=(CachingAllocator&& o) noexcept {
    if (this != &o) {
        delete impl_;
        impl_ = o.impl_;
        o.impl_ = nullptr;
    }
    return *this;
}

AllocResult CachingAllocator::malloc(Bytes size, int stream) {
    AllocResult r = impl_->malloc(size.count(), stream);
#ifdef GPUMEM_ALLOCATOR_CHECKS
    impl_->check_invariants();
#endif
    return r;
}

BlockHandle CachingAllocator::allocate(Bytes size, int stream, OomInfo& oom) {
    const BlockHandle h = impl_->allocate(size.count(), stream, oom);
#ifdef GPUMEM_ALLOCATOR_CHECKS
    impl_->check_invariants();
#endif
    return h;
}

void CachingAllocator::free(BlockHandle h) {
    impl_->free(h);
#ifdef GPUMEM_ALLOCATOR_CHECKS
    impl_->check_invariants();
#endif
}

void CachingAllocator::empty_cache() {
    impl_->release_cached_blocks();
#ifdef GPUMEM_ALLOCATOR_CHECKS
    impl_->check_invariants();
#endif
}

void CachingAllocator::reset_peaks() {
    AllocatorStats& s = impl_->stats;
    s.peak_allocated = s.allocated;
    s.peak_reserved = s.reserved;
    s.peak_requested = s.requested;
}

bool CachingAllocator::capacity_only_limits(const AllocatorConfig& cfg) {
    return !cfg.expandable_segments && cfg.garbage_collection_threshold <= 0.0;  // as Impl's gc_enabled
}

bool CachingAllocator::watch_capacity(Bytes limit) {
    if (!capacity_only_limits(impl_->cfg)) return false;
    impl_->watch = std::min(limit.count(), kMaxSize / 2);
    impl_->watched.reset();
    return true;
}

std::optional<CachingAllocator> CachingAllocator::take_watched() {
    if (!impl_->watched) return std::nullopt;
    return CachingAllocator(impl_->watched.release());
}

CachingAllocator::CachingAllocator(Impl* impl) : impl_(impl) {}

const AllocatorStats& CachingAllocator::stats() const { return impl_->stats; }
Bytes CachingAllocator::largest_free_block() const { return Bytes(impl_->largest_free()); }
std::vector<SegmentInfo> CachingAllocator::segments() const { return impl_->segments(); }
const AllocatorConfig& CachingAllocator::config() const { return impl_->cfg; }
Bytes CachingAllocator::round_size(Bytes size) const { return Bytes(impl_->round_size(size.count())); }
void CachingAllocator::check_invariants() const { impl_->check_invariants(); }
void CachingAllocator::signature(std::vector<std::int64_t>& out, const std::function<std::int64_t(BlockHandle)>& label) const {
    impl_->signature(out, label);
}

}  // namespace gpumem::sim
