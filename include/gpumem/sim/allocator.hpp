// gpumem/sim/allocator.hpp — a re-implementation of PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator) for
// simulation: no device memory is touched, addresses are virtual.
//
// Why: torch.cuda.max_memory_reserved() and nvidia-smi depend on how the
// caching allocator rounds, splits, caches and merges blocks, not only on how
// many bytes are live. A job can fail with gigabytes "free" because they are
// fragmented. Simulating the allocator's rules on the step's event trace gives
// what PyTorch really reports.
//
// Rules (each cited in allocator.cpp against the source):
//   round_size         requests rounded up to 512 B (kMinBlockSize), or to
//                      roundup_power2_divisions steps when configured
//   pools              rounded size <= 1 MiB (kSmallSize) -> small pool, else large
//   segment size       small: 2 MiB (kSmallBuffer); large < 10 MiB (kMinLargeAlloc):
//                      20 MiB (kLargeBuffer); else rounded up to 2 MiB (kRoundLarge)
//   best fit           smallest cached block of the same stream and pool with
//                      size >= request, ties by lowest address; only that one block
//                      is considered (if the max_split rules refuse it: new segment)
//   max_split_size     an oversize cached block (>= max_split_size) serves only
//                      requests >= max_split_size, and only if it is smaller than
//                      request + max_non_split_rounding (20 MiB)
//   split              small pool: remainder >= 512 B; large pool: remainder > 1 MiB
//                      and the request is below max_split_size
//   free               merge with free neighbours of the same segment
//   OOM retry          free cached oversize blocks, then every wholly free segment
//                      (empty_cache), then report OOM
//   garbage collection with garbage_collection_threshold, when no cached block fits
//                      and reserved > threshold * capacity: free whole cached large
//                      segments at least as old as the average (age = best-fit
//                      searches since they were freed) until the excess is reclaimed
//   expandable         one growing virtual segment per (stream, pool), 2 MiB/20 MiB pages
//   private pools      streams >= kGraphPoolStream stand for CUDA graph private
//                      pools (PrivatePool): their blocks serve only that pool and
//                      are never released (empty_cache, OOM retry, garbage
//                      collection) while the graph lives
//
// "Out of memory" is an answer (AllocResult::oom), never an exception.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/sim/alloc_conf.hpp"

namespace gpumem::sim {

using BlockHandle = std::int64_t;  // valid until freed
// malloc(0) allocates nothing (like PyTorch) and returns this handle; free() ignores it.
inline constexpr BlockHandle kNullBlock = 0;
// A block's handle is its slot in the allocator's block storage (low 32 bits)
// and the slot's generation (high bits, from 1 up, so handles are > 0 but
// for kNullBlock): a freed block's handle never names the slot's next block.
// Callers that keep something per allocated block (the steady-state probe)
// key it by slot and check the generation.
inline constexpr BlockHandle make_block_handle(std::uint32_t slot, std::uint32_t gen) {
    return static_cast<BlockHandle>((static_cast<std::uint64_t>(gen) << 32) | slot);
}
inline constexpr std::size_t block_slot(BlockHandle h) { return static_cast<std::size_t>(static_cast<std::uint64_t>(h) & 0xffffffffULL); }
inline constexpr std::uint32_t block_generation(BlockHandle h) { return static_cast<std::uint32_t>(static_cast<std::uint64_t>(h) >> 32); }
// Allocations on a stream at or above this one are a CUDA graph's private pool
// (c10/cuda/CUDACachingAllocator.cpp: beginAllocateToPool routes a capturing
// stream's allocations to the graph's PrivatePool, which has its own block
// sets; releasePool lets release_cached_blocks free them only once no graph
// uses the pool). The simulated graphs live for the whole trace.
inline constexpr int kGraphPoolStream = 1 << 20;

struct AllocatorStats {
    Bytes allocated;        // sum of allocated (rounded) block sizes: memory_allocated()
    Bytes reserved;         // sum of segment sizes: memory_reserved()
    Bytes requested;        // sum of unrounded request sizes
    Bytes peak_allocated;   // max_memory_allocated()
    Bytes peak_reserved;    // max_memory_reserved()
    Bytes peak_requested;
    Bytes allocated_private;  // the part of `allocated` in CUDA graph private pools
    Bytes reserved_private;   // the part of `reserved` in CUDA graph private pools
    std::int64_t segments = 0;         // cudaMalloc segments + expandable segments with mapped pages
    std::int64_t allocations = 0;      // live blocks
    std::int64_t alloc_retries = 0;    // cudaMalloc failures followed by a retry
    std::int64_t ooms = 0;
    std::int64_t cuda_mallocs = 0;
    std::int64_t cuda_frees = 0;
};

struct OomInfo {
    Bytes requested;        // the rounded request that failed
    Bytes alloc_size;       // what cudaMalloc was asked for (get_allocation_size): the
                            // "Tried to allocate" figure of PyTorch's OOM message
    Bytes allocated;        // at the failure
    Bytes reserved;
    Bytes capacity;
    Bytes device_free;      // capacity - reserved - memory outside the allocator
    Bytes largest_free_block;  // in the cache

    friend bool operator==(const OomInfo&, const OomInfo&) = default;
};

struct AllocResult {
    bool ok = false;
    BlockHandle handle = -1;
    Bytes block_size;       // the rounded (possibly unsplit) size charged to allocated
    std::optional<OomInfo> oom;
};

struct BlockInfo {
    std::int64_t address = 0;
    Bytes size;
    Bytes requested;
    bool allocated = false;
};

struct SegmentInfo {
    std::int64_t address = 0;
    Bytes size;
    int stream = 0;
    bool small_pool = false;
    bool expandable = false;
    std::vector<BlockInfo> blocks;  // address order
};

class CachingAllocator {
public:
    // `capacity`: what cudaMalloc can hand out in total (device memory minus the
    // CUDA context and memory outside the allocator).
    CachingAllocator(AllocatorConfig cfg, Bytes capacity);
    ~CachingAllocator();
    CachingAllocator(CachingAllocator&&) noexcept;
    CachingAllocator& operator=(CachingAllocator&&) noexcept;
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    AllocResult malloc(Bytes size, int stream = 0);
    // malloc() for a caller that needs only the handle (replay(), once per
    // event): the handle, or kFailedBlock when the request fails, with `oom`
    // then saying why. Building malloc()'s 88-byte AllocResult and copying it
    // out was a sixth of malloc's own time.
    static constexpr BlockHandle kFailedBlock = -1;  // handles are >= 0
    BlockHandle allocate(Bytes size, int stream, OomInfo& oom);
    void free(BlockHandle h);
    void empty_cache();
    void reset_peaks();
    // Capacity watch: a replay without limit that also tells where a replay
    // against `limit` would run out of memory (sim/trace.hpp
    // ReplayOptions::oom_capacity). The allocator keeps a copy of its state
    // from just before the first cudaMalloc that would take reserved above
    // `limit`, with `limit` as its capacity: take_watched() hands it over
    // (once). Up to that cudaMalloc both runs made the same moves: the
    // capacity decides nothing else where neither expandable segments (their
    // address space is sized from it) nor garbage collection (its threshold
    // is a fraction of it) is set; with either, watch_capacity refuses (false).
    bool watch_capacity(Bytes limit);
    // Whether the capacity decides nothing but whether cudaMalloc succeeds
    // under these settings (what watch_capacity needs).
    [[nodiscard]] static bool capacity_only_limits(const AllocatorConfig& cfg);
    std::optional<CachingAllocator> take_watched();

    [[nodiscard]] const AllocatorStats& stats() const;
    [[nodiscard]] Bytes largest_free_block() const;   // largest cached (free) block
    [[nodiscard]] std::vector<SegmentInfo> segments() const;
    [[nodiscard]] const AllocatorConfig& config() const;
    // The size a request is rounded to (round_size in the source).
    [[nodiscard]] Bytes round_size(Bytes size) const;
    // Appends a canonical description of everything that decides the
    // allocator's future behaviour: segments in address order (each by its
    // rank, not its address: new segments always get higher addresses), their
    // blocks by offset, size, requested bytes and state, an allocated block by
    // `label(handle)`, a free block by its garbage-collection age when that is
    // on. Two states with equal signatures answer the same requests alike
    // (steady-state detection of the step simulation, sim/step.hpp).
    void signature(std::vector<std::int64_t>& out, const std::function<std::int64_t(BlockHandle)>& label) const;
    // Walks every block list and checks stats against the blocks; throws
    // std::logic_error on a violation. Called after each operation in debug builds.
    void check_invariants() const;

private:
    struct Impl;
    explicit CachingAllocator(Impl* impl);
    Impl* impl_;
};

}  // namespace gpumem::sim
