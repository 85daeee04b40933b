// Tests of the caching allocator simulator (sim/allocator.hpp) and trace replay
// (sim/trace.hpp). Every expected value is worked out by hand in a comment from
// the rules of c10/cuda/CUDACachingAllocator.cpp:
//   round_size: < 512 -> 512, else up to a multiple of 512 (or power-2 divisions)
//   pool: rounded <= 1 MiB -> small; segment (get_allocation_size): small 2 MiB,
//   large < 10 MiB -> 20 MiB, else rounded up to 2 MiB
//   should_split: small: remainder >= 512; large: request < max_split and remainder > 1 MiB
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <random>
#include <unordered_map>

#include "gpumem/sim/allocator.hpp"
#include "gpumem/sim/trace.hpp"

using namespace gpumem;
using namespace gpumem::sim;

namespace {

constexpr std::int64_t kMB = 1024 * 1024;
Bytes MiBf(double m) { return Bytes(static_cast<std::int64_t>(m * static_cast<double>(kMB))); }

AllocatorConfig conf(const std::string& s) {
    auto r = AllocatorConfig::parse(s);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
}

// Addresses of the allocated blocks, in address order.
std::vector<std::int64_t> allocated_addresses(const CachingAllocator& a) {
    std::vector<std::int64_t> out;
    for (const auto& s : a.segments())
        for (const auto& b : s.blocks)
            if (b.allocated) out.push_back(b.address);
    return out;
}

// Stats recomputed from the segment snapshot.
void expect_stats_match_segments(const CachingAllocator& a) {
    Bytes allocated, reserved, requested;
    std::int64_t blocks = 0;
    for (const auto& s : a.segments()) {
        Bytes sum;
        for (const auto& b : s.blocks) {
            sum += b.size;
            if (b.allocated) {
                allocated += b.size;
                requested += b.requested;
                ++blocks;
            }
        }
        EXPECT_EQ(sum, s.size);
        reserved += s.size;
    }
    EXPECT_EQ(a.stats().allocated, allocated);
    EXPECT_EQ(a.stats().reserved, reserved);
    EXPECT_EQ(a.stats().requested, requested);
    EXPECT_EQ(a.stats().allocations, blocks);
}

}  // namespace

// ---------------------------------------------------------------------------
// Rounding and pools

TEST(Allocator, TinyTensorTakes512BytesAndA2MiBSegment) {
    CachingAllocator a({}, GiB(80));
    // 4 B < kMinBlockSize -> 512 B; 512 <= 1 MiB -> small pool -> 2 MiB segment;
    // remainder 2 MiB - 512 >= 512 -> split, so only 512 B is charged.
    auto r = a.malloc(Bytes(4));
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.block_size, Bytes(512));
    EXPECT_EQ(a.stats().allocated, Bytes(512));
    EXPECT_EQ(a.stats().reserved, MiB(2));
    EXPECT_EQ(a.stats().requested, Bytes(4));
    // The second 4 B tensor reuses the free remainder of the same segment.
    auto r2 = a.malloc(Bytes(4));
    ASSERT_TRUE(r2.ok);
    EXPECT_EQ(a.stats().allocated, Bytes(1024));
    EXPECT_EQ(a.stats().reserved, MiB(2));
    EXPECT_EQ(a.stats().segments, 1);
    EXPECT_EQ(a.stats().cuda_mallocs, 1);
    a.check_invariants();
}

TEST(Allocator, RoundSizeTo512) {
    CachingAllocator a({}, GiB(80));
    EXPECT_EQ(a.round_size(Bytes(1)), Bytes(512));
    EXPECT_EQ(a.round_size(Bytes(512)), Bytes(512));
    EXPECT_EQ(a.round_size(Bytes(513)), Bytes(1024));            // ceil(513/512)*512
    EXPECT_EQ(a.round_size(MiB(1) + Bytes(1)), MiB(1) + Bytes(512));
}

TEST(Allocator, OneMiBIsSmallOneMiBPlusOneIsLarge) {
    {
        CachingAllocator a({}, GiB(80));
        // exactly 1 MiB: rounded 1 MiB <= kSmallSize -> small pool, 2 MiB segment.
        ASSERT_TRUE(a.malloc(MiB(1)).ok);
        auto segs = a.segments();
        ASSERT_EQ(segs.size(), 1u);
        EXPECT_TRUE(segs[0].small_pool);
        EXPECT_EQ(segs[0].size, MiB(2));
    }
    {
        CachingAllocator a({}, GiB(80));
        // 1 MiB + 1 B -> rounded 1 MiB + 512 B > kSmallSize -> large pool; below
        // kMinLargeAlloc (10 MiB) -> a kLargeBuffer (20 MiB) segment; remainder
        // 20 MiB - 1 MiB - 512 > 1 MiB -> split: allocated 1 MiB + 512.
        auto r = a.malloc(MiB(1) + Bytes(1));
        ASSERT_TRUE(r.ok);
        auto segs = a.segments();
        ASSERT_EQ(segs.size(), 1u);
        EXPECT_FALSE(segs[0].small_pool);
        EXPECT_EQ(segs[0].size, MiB(20));
        EXPECT_EQ(a.stats().allocated, MiB(1) + Bytes(512));
        EXPECT_EQ(a.stats().reserved, MiB(20));
    }
}

TEST(Allocator, SegmentSizes) {
    CachingAllocator a({}, GiB(80));
    // 10.5 MiB >= kMinLargeAlloc -> segment rounded up to 2 MiB: 12 MiB; the
    // remainder 1.5 MiB > 1 MiB -> split: allocated 10.5 MiB.
    ASSERT_TRUE(a.malloc(MiBf(10.5)).ok);
    EXPECT_EQ(a.stats().reserved, MiB(12));
    EXPECT_EQ(a.stats().allocated, MiBf(10.5));
    // 10 MiB - 512 B < kMinLargeAlloc -> 20 MiB segment.
    CachingAllocator b({}, GiB(80));
    ASSERT_TRUE(b.malloc(MiB(10) - Bytes(512)).ok);
    EXPECT_EQ(b.stats().reserved, MiB(20));
    // exactly 10 MiB -> ceil(10 / 2) * 2 = 10 MiB segment, no remainder.
    CachingAllocator c({}, GiB(80));
    ASSERT_TRUE(c.malloc(MiB(10)).ok);
    EXPECT_EQ(c.stats().reserved, MiB(10));
}

TEST(Allocator, TwoSixMiBRequestsShareOne20MiBSegment) {
    CachingAllocator a({}, GiB(80));
    // first 6 MiB: 20 MiB segment split into 6 (allocated) + 14 (free);
    // second 6 MiB: best fit is the 14 MiB block -> 6 + 8 (free).
    ASSERT_TRUE(a.malloc(MiB(6)).ok);
    ASSERT_TRUE(a.malloc(MiB(6)).ok);
    EXPECT_EQ(a.stats().reserved, MiB(20));
    EXPECT_EQ(a.stats().allocated, MiB(12));
    EXPECT_EQ(a.stats().segments, 1);
    auto addr = allocated_addresses(a);
    ASSERT_EQ(addr.size(), 2u);
    EXPECT_EQ(addr[1] - addr[0], 6 * kMB);  // the request takes the low addresses
    auto segs = a.segments();
    ASSERT_EQ(segs[0].blocks.size(), 3u);
    EXPECT_EQ(segs[0].blocks[2].size, MiB(8));
    EXPECT_FALSE(segs[0].blocks[2].allocated);
}

TEST(Allocator, LargeBlockNotSplitWhenRemainderAtMostOneMiB) {
    {
        CachingAllocator a({}, GiB(80));
        // 19.5 MiB >= 10 MiB -> segment ceil(19.5/2)*2 = 20 MiB; remainder
        // 0.5 MiB <= 1 MiB -> not split: the whole 20 MiB is charged.
        auto r = a.malloc(MiBf(19.5));
        ASSERT_TRUE(r.ok);
        EXPECT_EQ(r.block_size, MiB(20));
        EXPECT_EQ(a.stats().allocated, MiB(20));
        EXPECT_EQ(a.stats().requested, MiBf(19.5));
    }
    {
        CachingAllocator a({}, GiB(80));
        // 19 MiB -> 20 MiB segment, remainder exactly 1 MiB: "> kSmallSize" is false.
        EXPECT_EQ(a.malloc(MiB(19)).block_size, MiB(20));
    }
    {
        CachingAllocator a({}, GiB(80));
        // 18.5 MiB -> 20 MiB segment, remainder 1.5 MiB > 1 MiB -> split.
        EXPECT_EQ(a.malloc(MiBf(18.5)).block_size, MiBf(18.5));
    }
    {
        CachingAllocator a({}, GiB(80));
        // small pool splits down to 512 B: 1 MiB - 512 in a 2 MiB segment leaves
        // 1 MiB + 512 free; then a 1 MiB request leaves exactly 512 B -> still split.
        EXPECT_EQ(a.malloc(MiB(1) - Bytes(512)).block_size, MiB(1) - Bytes(512));
        EXPECT_EQ(a.malloc(MiB(1)).block_size, MiB(1));
        EXPECT_EQ(a.largest_free_block(), Bytes(512));
    }
}

TEST(Allocator, FreeMergesNeighbours) {
    CachingAllocator a({}, GiB(80));
    // A, B, C = 6 MiB each in one 20 MiB segment: [A 6][B 6][C 6][free 2].
    auto A = a.malloc(MiB(6)), B = a.malloc(MiB(6)), C = a.malloc(MiB(6));
    ASSERT_TRUE(A.ok && B.ok && C.ok);
    EXPECT_EQ(a.stats().segments, 1);
    a.free(A.handle);
    a.free(B.handle);
    // A and B merge into one free 12 MiB block: [free 12][C 6][free 2].
    auto segs = a.segments();
    ASSERT_EQ(segs.size(), 1u);
    ASSERT_EQ(segs[0].blocks.size(), 3u);
    EXPECT_EQ(segs[0].blocks[0].size, MiB(12));
    EXPECT_FALSE(segs[0].blocks[0].allocated);
    EXPECT_TRUE(segs[0].blocks[1].allocated);
    EXPECT_EQ(a.largest_free_block(), MiB(12));
    // Freeing C merges both sides: one free 20 MiB block.
    a.free(C.handle);
    segs = a.segments();
    ASSERT_EQ(segs[0].blocks.size(), 1u);
    EXPECT_EQ(segs[0].blocks[0].size, MiB(20));
    EXPECT_EQ(a.stats().allocated, Bytes(0));
    EXPECT_EQ(a.stats().reserved, MiB(20));  // cached, not returned
    a.check_invariants();
}

TEST(Allocator, BestFitSmallestThenLowestAddress) {
    CachingAllocator a({}, GiB(80));
    // Three whole segments (>= 10 MiB requests, rounded to 2 MiB, no remainder):
    // X 12 MiB, Y 14 MiB, Z 12 MiB, all freed -> cached blocks 12, 14, 12.
    auto X = a.malloc(MiB(12)), Y = a.malloc(MiB(14)), Z = a.malloc(MiB(12));
    ASSERT_TRUE(X.ok && Y.ok && Z.ok);
    auto addr = allocated_addresses(a);  // X < Y < Z (bump pointer)
    a.free(X.handle);
    a.free(Y.handle);
    a.free(Z.handle);
    // 11 MiB: the smallest block >= 11 MiB is 12 MiB; two of them -> lowest address (X).
    // Remainder 1 MiB is not > 1 MiB -> not split: 12 MiB charged.
    auto r = a.malloc(MiB(11));
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.block_size, MiB(12));
    EXPECT_EQ(allocated_addresses(a), std::vector<std::int64_t>{addr[0]});
    // 13 MiB: Z (12) is too small -> Y (14), remainder 1 MiB -> not split.
    auto r2 = a.malloc(MiB(13));
    EXPECT_EQ(r2.block_size, MiB(14));
    EXPECT_EQ(allocated_addresses(a), (std::vector<std::int64_t>{addr[0], addr[1]}));
    EXPECT_EQ(a.stats().segments, 3);  // no new segment
}

TEST(Allocator, BlocksAreReusedOnlyByTheirStream) {
    CachingAllocator a({}, GiB(80));
    auto r = a.malloc(MiB(6), /*stream=*/0);
    a.free(r.handle);
    // stream 1 cannot use stream 0's cached 20 MiB segment -> a new one: 40 MiB.
    auto r1 = a.malloc(MiB(6), 1);
    ASSERT_TRUE(r1.ok);
    EXPECT_EQ(a.stats().reserved, MiB(40));
    EXPECT_EQ(a.stats().segments, 2);
    // stream 0 again reuses its own segment: still 40 MiB.
    ASSERT_TRUE(a.malloc(MiB(6), 0).ok);
    EXPECT_EQ(a.stats().reserved, MiB(40));
    EXPECT_EQ(a.stats().cuda_mallocs, 2);
}

// ---------------------------------------------------------------------------
// Out of memory

TEST(Allocator, OomRetryReleasesCachedSegments) {
    CachingAllocator a({}, MiB(80));
    // 60 MiB -> a 60 MiB segment; freed it stays cached (reserved 60).
    auto r = a.malloc(MiB(60));
    ASSERT_TRUE(r.ok);
    a.free(r.handle);
    EXPECT_EQ(a.stats().reserved, MiB(60));
    // 70 MiB: no cached block fits; cudaMalloc 60 + 70 = 130 > 80 fails;
    // max_split_size unset -> release_available_cached_blocks does nothing;
    // release_cached_blocks frees the wholly free 60 MiB segment (reserved 0);
    // the retry cudaMalloc(70 MiB) fits.
    auto r2 = a.malloc(MiB(70));
    ASSERT_TRUE(r2.ok);
    EXPECT_EQ(a.stats().reserved, MiB(70));
    EXPECT_EQ(a.stats().peak_reserved, MiB(70));  // 60, then 0, then 70
    EXPECT_EQ(a.stats().alloc_retries, 1);
    EXPECT_EQ(a.stats().cuda_frees, 1);
    EXPECT_EQ(a.stats().cuda_mallocs, 2);
    EXPECT_EQ(a.stats().ooms, 0);
}

TEST(Allocator, GenuineOomReportsFragmentation) {
    CachingAllocator a({}, MiB(80));
    ASSERT_TRUE(a.malloc(MiB(50)).ok);  // 50 MiB segment
    ASSERT_TRUE(a.malloc(MiB(6)).ok);   // 20 MiB segment: 6 allocated + 14 free
    EXPECT_EQ(a.stats().reserved, MiB(70));
    // 16 MiB: the 14 MiB free block is too small; 70 + 16 = 86 > 80; nothing is
    // wholly free to release (the 20 MiB segment is split) -> OOM.
    auto r = a.malloc(MiB(16));
    EXPECT_FALSE(r.ok);
    ASSERT_TRUE(r.oom.has_value());
    EXPECT_EQ(r.oom->requested, MiB(16));
    EXPECT_EQ(r.oom->alloc_size, MiB(16));
    EXPECT_EQ(r.oom->allocated, MiB(56));
    EXPECT_EQ(r.oom->reserved, MiB(70));
    EXPECT_EQ(r.oom->capacity, MiB(80));
    EXPECT_EQ(r.oom->device_free, MiB(10));
    EXPECT_EQ(r.oom->largest_free_block, MiB(14));
    EXPECT_EQ(a.stats().ooms, 1);
    EXPECT_EQ(a.stats().alloc_retries, 1);
    a.check_invariants();
    // The failed request changed nothing: a 2 MiB request (large pool) still fits the
    // 14 MiB cached block and reserved stays 70 MiB.
    EXPECT_TRUE(a.malloc(MiB(2)).ok);
    EXPECT_EQ(a.stats().reserved, MiB(70));
}

// ---------------------------------------------------------------------------
// max_split_size_mb

TEST(Allocator, MaxSplitSizeOversizeBlocks) {
    const AllocatorConfig c = conf("max_split_size_mb:64");
    {
        CachingAllocator a(c, GiB(80));
        auto r = a.malloc(MiB(100));
        a.free(r.handle);
        // 90 MiB >= max_split: the cached 100 MiB block is usable because
        // 100 < 90 + max_non_split_rounding (20) = 110; an oversize request is never
        // split (should_split needs size < max_split) -> 100 MiB charged.
        auto r2 = a.malloc(MiB(90));
        EXPECT_EQ(r2.block_size, MiB(100));
        EXPECT_EQ(a.stats().reserved, MiB(100));
    }
    {
        CachingAllocator a(c, GiB(80));
        auto r = a.malloc(MiB(100));
        a.free(r.handle);
        // 70 MiB: 100 >= 70 + 20 = 90 -> the oversize block is refused; new 70 MiB segment.
        auto r2 = a.malloc(MiB(70));
        EXPECT_EQ(r2.block_size, MiB(70));
        EXPECT_EQ(a.stats().reserved, MiB(170));
    }
    {
        CachingAllocator a(c, GiB(80));
        auto r = a.malloc(MiB(100));
        a.free(r.handle);
        // 30 MiB < max_split: an oversize (>= 64 MiB) block never serves it.
        auto r2 = a.malloc(MiB(30));
        EXPECT_EQ(r2.block_size, MiB(30));
        EXPECT_EQ(a.stats().reserved, MiB(130));
    }
    {
        // Without max_split_size the 100 MiB block is split for 30 MiB (remainder 70).
        CachingAllocator a({}, GiB(80));
        auto r = a.malloc(MiB(100));
        a.free(r.handle);
        EXPECT_EQ(a.malloc(MiB(30)).block_size, MiB(30));
        EXPECT_EQ(a.stats().reserved, MiB(100));
    }
}

TEST(Allocator, MaxSplitSizeReleasesOversizeBlocksBeforeEverything) {
    CachingAllocator a(conf("max_split_size_mb:64"), MiB(150));
    auto big = a.malloc(MiB(100));
    a.free(big.handle);
    auto keep = a.malloc(MiB(6));  // a 20 MiB segment: 120 MiB reserved
    ASSERT_TRUE(keep.ok);
    EXPECT_EQ(a.stats().reserved, MiB(120));
    // 80 MiB: cached 100 >= 80 + 20 -> refused; cudaMalloc 120 + 80 > 150 fails;
    // release_available_cached_blocks frees the smallest oversize block >= 80 MiB
    // (the 100 MiB one) and the second cudaMalloc fits (20 + 80 = 100). This is not
    // the "retry" path (alloc_retries counts only the one after release_cached_blocks).
    auto r = a.malloc(MiB(80));
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(a.stats().reserved, MiB(100));
    EXPECT_EQ(a.stats().alloc_retries, 0);
    EXPECT_EQ(a.stats().cuda_frees, 1);
}

// ---------------------------------------------------------------------------
// roundup_power2_divisions

TEST(Allocator, RoundupPower2Divisions) {
    CachingAllocator a(conf("roundup_power2_divisions:4"), GiB(80));
    // 1.2 MiB = 1258291 B > 512 * 4: between 1 MiB and 2 MiB the 4 steps are
    // 1, 1.25, 1.5, 1.75 MiB (step = 1 MiB >> log2(4) = 256 KiB) -> 1.25 MiB.
    EXPECT_EQ(a.round_size(Bytes(1258291)), MiBf(1.25));
    // 1200 B <= 512 * 4 = 2048 -> plain 512 rounding: 1536.
    EXPECT_EQ(a.round_size(Bytes(1200)), Bytes(1536));
    // 4200 B: floor 4096, step 1024 -> 5120 (plain rounding would give 4608).
    EXPECT_EQ(a.round_size(Bytes(4200)), Bytes(5120));
    // a power of two is returned as is.
    EXPECT_EQ(a.round_size(MiB(4)), MiB(4));
    // 1.25 MiB is large: the request lands in a 20 MiB segment, 1.25 MiB charged.
    EXPECT_EQ(a.malloc(Bytes(1258291)).block_size, MiBf(1.25));

    // List form, 2.4-2.8 semantics: [256:1,512:2,>:4] -> intervals 0..8 (sizes
    // below 512 MiB) = 1, interval 9 set to 2 and then overwritten by '>' (which
    // fills from the last explicit interval) -> intervals 9..15 = 4.
    CachingAllocator b(conf("roundup_power2_divisions:[256:1,512:2,>:4]"), GiB(80));
    // 300 MiB + 1 B: interval 8 -> 1 division -> plain 512 rounding.
    EXPECT_EQ(b.round_size(MiB(300) + Bytes(1)), MiB(300) + Bytes(512));
    // 600 MiB: interval 9 -> 4 divisions of [512, 1024) MiB: 512, 640, ... -> 640 MiB.
    // (PyTorch >= 2.9 keeps 2 here and would give 768 MiB.)
    EXPECT_EQ(b.round_size(MiB(600)), MiB(640));
    // 3 GiB + 1 B: interval 11 -> 4 divisions of [2, 4) GiB, step 512 MiB -> 3.5 GiB.
    EXPECT_EQ(b.round_size(GiB(3) + Bytes(1)), MiB(3584));
}

// ---------------------------------------------------------------------------
// expandable_segments

TEST(Allocator, ExpandableSegmentsMapPages) {
    CachingAllocator a(conf("expandable_segments:True"), GiB(8));
    // 30 MiB: one virtual segment for (stream 0, large pool); map ceil(30/20) = 2
    // pages = 40 MiB; split (expandable: remainder 10 MiB >= 512).
    auto t1 = a.malloc(MiB(30));
    ASSERT_TRUE(t1.ok);
    EXPECT_EQ(t1.block_size, MiB(30));
    EXPECT_EQ(a.stats().reserved, MiB(40));
    // second 30 MiB: no free block >= 30 MiB; the free 10 MiB tail plus one more
    // page (20 MiB) at the lowest address make exactly 30 MiB -> 3 pages, 60 MiB.
    auto t2 = a.malloc(MiB(30));
    ASSERT_TRUE(t2.ok);
    EXPECT_EQ(a.stats().reserved, MiB(60));
    EXPECT_EQ(a.stats().allocated, MiB(60));
    auto segs = a.segments();
    ASSERT_EQ(segs.size(), 1u);  // one contiguous mapped range
    EXPECT_TRUE(segs[0].expandable);
    EXPECT_EQ(segs[0].size, MiB(60));
    EXPECT_EQ(a.stats().segments, 1);
    EXPECT_EQ(a.stats().cuda_mallocs, 2);  // two map operations
    // all free + empty_cache: every page unmapped, the segment dropped.
    a.free(t1.handle);
    a.free(t2.handle);
    EXPECT_EQ(a.stats().reserved, MiB(60));
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved, Bytes(0));
    EXPECT_EQ(a.stats().segments, 0);
    EXPECT_TRUE(a.segments().empty());
    a.check_invariants();
}

TEST(Allocator, ExpandableEmptyCacheUnmapsOnlyWhollyFreePages) {
    CachingAllocator a(conf("expandable_segments:True"), GiB(8));
    // t1 = [0, 30) MiB on pages 0-1 (mapped 40); t2 = 25 MiB: free [30, 40) + page 2
    // -> [30, 60) mapped, t2 = [30, 55), free [55, 60).
    auto t1 = a.malloc(MiB(30));
    auto t2 = a.malloc(MiB(25));
    ASSERT_TRUE(t1.ok && t2.ok);
    EXPECT_EQ(a.stats().reserved, MiB(60));
    a.free(t1.handle);  // free [0, 30)
    a.empty_cache();
    // [0, 30) covers page 0 wholly ([0, 20)) -> unmapped; [20, 30) shares page 1
    // with t2 -> stays mapped; [55, 60) is part of page 2 -> stays. Reserved 40 MiB.
    EXPECT_EQ(a.stats().reserved, MiB(40));
    auto segs = a.segments();
    ASSERT_EQ(segs.size(), 1u);
    EXPECT_EQ(segs[0].size, MiB(40));
    ASSERT_EQ(segs[0].blocks.size(), 3u);
    EXPECT_EQ(segs[0].blocks[0].size, MiB(10));
    EXPECT_EQ(segs[0].blocks[1].size, MiB(25));
    EXPECT_EQ(segs[0].blocks[2].size, MiB(5));
    // A new 20 MiB request refills the hole at the lowest address: page 0 is mapped
    // again and merges with [20, 30) -> a 30 MiB free block, split to 20 + 10.
    auto t3 = a.malloc(MiB(20));
    ASSERT_TRUE(t3.ok);
    EXPECT_EQ(a.stats().reserved, MiB(60));
    a.check_invariants();
}

TEST(Allocator, ExpandableSmallPoolUses2MiBPages) {
    CachingAllocator a(conf("expandable_segments:True"), GiB(8));
    ASSERT_TRUE(a.malloc(Bytes(4)).ok);  // small pool: one 2 MiB page
    EXPECT_EQ(a.stats().reserved, MiB(2));
    ASSERT_TRUE(a.malloc(MiB(1)).ok);    // fits in the rest of the page
    EXPECT_EQ(a.stats().reserved, MiB(2));
    ASSERT_TRUE(a.malloc(MiB(1)).ok);    // 2 MiB - 1 MiB - 512 left: map one more page
    EXPECT_EQ(a.stats().reserved, MiB(4));
}

// ---------------------------------------------------------------------------
// garbage_collection_threshold

TEST(Allocator, GarbageCollectionFreesOldestCachedBlocks) {
    // capacity 200 MiB, threshold 0.25 -> GC when reserved > 50 MiB.
    CachingAllocator a(conf("garbage_collection_threshold:0.25"), MiB(200));
    // Ages count get_free_block calls on the large pool.
    auto A = a.malloc(MiB(40));  // call 1; A's segment 40 MiB
    a.free(A.handle);            // A cached with base 1
    auto B = a.malloc(MiB(50));  // call 2; 40 < 50 -> new 50 MiB segment (reserved 40 <= 50: no GC)
    a.free(B.handle);            // B cached with base 2
    EXPECT_EQ(a.stats().reserved, MiB(90));
    // C = 60 MiB, call 3: nothing fits; reserved 90 > 50 -> GC must reclaim 40 MiB.
    // Ages: A 3-1 = 2, B 3-2 = 1, average 1.5 -> free A (age >= 1.5): 40 MiB
    // reclaimed, done. Then cudaMalloc(60): reserved 50 + 60 = 110.
    auto C = a.malloc(MiB(60));
    ASSERT_TRUE(C.ok);
    EXPECT_EQ(a.stats().reserved, MiB(110));
    EXPECT_EQ(a.stats().cuda_frees, 1);
    auto segs = a.segments();
    ASSERT_EQ(segs.size(), 2u);
    std::vector<Bytes> sizes{segs[0].size, segs[1].size};
    std::sort(sizes.begin(), sizes.end());
    EXPECT_EQ(sizes, (std::vector<Bytes>{MiB(50), MiB(60)}));
    // Without GC all three segments stay: 150 MiB.
    CachingAllocator b({}, MiB(200));
    auto A2 = b.malloc(MiB(40));
    b.free(A2.handle);
    auto B2 = b.malloc(MiB(50));
    b.free(B2.handle);
    ASSERT_TRUE(b.malloc(MiB(60)).ok);
    EXPECT_EQ(b.stats().reserved, MiB(150));
}

// ---------------------------------------------------------------------------
// Stats, property test

TEST(Allocator, StatsEqualSegmentSumsUnderRandomOps) {
    const std::vector<std::pair<std::string, Bytes>> setups = {
        {"", GiB(2)},
        {"max_split_size_mb:64", GiB(1)},
        {"roundup_power2_divisions:[1:4,64:8,>:2]", GiB(2)},
        {"expandable_segments:True", GiB(1)},
        {"garbage_collection_threshold:0.6", MiB(700)},
        {"max_split_size_mb:40,garbage_collection_threshold:0.5,roundup_power2_divisions:2", MiB(600)},
    };
    for (const auto& [text, cap] : setups) {
        SCOPED_TRACE(text);
        CachingAllocator a(conf(text), cap);
        std::mt19937_64 rng(12345);
        std::vector<BlockHandle> live;
        std::int64_t ooms = 0;
        for (int op = 0; op < 3000; ++op) {
            const auto dice = rng() % 100;
            if (dice < 55 || live.empty()) {
                // sizes: 40% small (1 B .. 1 MiB), 60% large (1 MiB .. 120 MiB), log-ish
                std::int64_t sz;
                if (rng() % 10 < 4) {
                    sz = 1 + static_cast<std::int64_t>(rng() % kMB);
                } else {
                    const int shift = static_cast<int>(rng() % 7);  // 1..64 MiB scale
                    sz = kMB + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(kMB << shift));
                }
                auto r = a.malloc(Bytes(sz), static_cast<int>(rng() % 2));
                if (r.ok) {
                    live.push_back(r.handle);
                } else {
                    ++ooms;
                    ASSERT_TRUE(r.oom.has_value());
                }
            } else if (dice < 97) {
                // LIFO-ish: mostly the most recent tensors
                const std::size_t k = live.size() - 1 - std::min<std::size_t>(live.size() - 1, rng() % 4);
                a.free(live[k]);
                live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            } else {
                a.empty_cache();
            }
            a.check_invariants();
            if (op % 50 == 0) expect_stats_match_segments(a);
            ASSERT_LE(a.stats().reserved, cap);
        }
        expect_stats_match_segments(a);
        EXPECT_EQ(a.stats().ooms, ooms);
        for (auto h : live) a.free(h);
        a.empty_cache();
        EXPECT_EQ(a.stats().allocated, Bytes(0));
        EXPECT_EQ(a.stats().reserved, Bytes(0));
        EXPECT_EQ(a.stats().segments, 0);
        a.check_invariants();
    }
}

// The best fit under random operations, worked out from the segment
// snapshot before each request: get_free_block's lower_bound on (stream,
// size, address) over the pool's free blocks (CUDACachingAllocator.cpp,
// BlockComparatorSize) takes, among the free blocks of the request's stream
// and pool (small when the rounded size is at most 1 MiB), the smallest
// holding the rounded request, then the lowest address; the request sits at
// that block's address (a split keeps the low part). With none, a new
// segment above every address so far. Default settings (no max_split_size:
// every block may serve every request), a capacity nothing reaches. Sizes
// span 512 B to 8 GiB (the free set's 512-byte classes and 19 levels above) on nine
// streams, a CUDA graph pool's among them (its walk across streams).
TEST(Allocator, BestFitIsTheSmallestThenLowestFreeBlockUnderRandomOps) {
    CachingAllocator a({}, GiB(1) * 4096);
    std::mt19937_64 rng(2026);
    std::vector<BlockHandle> live;
    const int streams[] = {0, 0, 0, 0, 1, 2, 7, kGraphPoolStream, kGraphPoolStream + 1};
    std::int64_t reused = 0, fresh = 0;
    for (int op = 0; op < 2500; ++op) {
        if (rng() % 100 < 55 || live.empty()) {
            std::int64_t sz;
            const auto kind = rng() % 10;
            if (kind < 3) sz = 512 * static_cast<std::int64_t>(1 + rng() % 64);              // one 512-byte class each
            else if (kind < 6) sz = 1 + static_cast<std::int64_t>(rng() % (2 * kMB));        // the small pool and its edge
            else sz = kMB + static_cast<std::int64_t>(rng() % (std::uint64_t{kMB} << (rng() % 14)));  // up to 8 GiB
            const int stream = streams[rng() % std::size(streams)];
            const std::int64_t rounded = a.round_size(Bytes(sz)).count();
            const bool small = rounded <= kMB;
            std::int64_t top = 0;
            std::optional<std::pair<std::int64_t, std::int64_t>> best;  // (size, address)
            for (const auto& s : a.segments()) {
                top = std::max(top, s.address + s.size.count());
                if (s.stream != stream || s.small_pool != small) continue;
                for (const auto& b : s.blocks)
                    if (!b.allocated && b.size.count() >= rounded) {
                        const std::pair<std::int64_t, std::int64_t> k{b.size.count(), b.address};
                        if (!best || k < *best) best = k;
                    }
            }
            const auto before = allocated_addresses(a);
            const auto r = a.malloc(Bytes(sz), stream);
            ASSERT_TRUE(r.ok) << "op " << op;
            const auto after = allocated_addresses(a);
            std::vector<std::int64_t> added;
            std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(added));
            ASSERT_EQ(added.size(), 1U) << "op " << op;
            if (best) {
                EXPECT_EQ(added[0], best->second) << "op " << op << ": " << sz << " bytes on stream " << stream;
                ++reused;
            } else {
                EXPECT_GE(added[0], top) << "op " << op << ": " << sz << " bytes on stream " << stream;
                ++fresh;
            }
            live.push_back(r.handle);
        } else {
            const std::size_t k = live.size() - 1 - std::min<std::size_t>(live.size() - 1, rng() % 8);
            a.free(live[k]);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
        a.check_invariants();
    }
    // Both outcomes were exercised many times.
    EXPECT_GT(reused, 300);
    EXPECT_GT(fresh, 40);
}

// Many free blocks of one size (a fragmented small pool): 3,000 tensors of
// 512 bytes fill one 2 MiB segment's first 1.5 MiB; every other one freed
// leaves 1,500 free blocks of 512 bytes, none mergeable (their neighbours
// are allocated). Each new 512-byte request takes the lowest free address
// (best fit: all the same size), worked out from the segment snapshot; then
// everything is freed in a scattered order, each free merging with its
// free neighbours, until the segment is one free block again. The free set
// holds up to 1,500 entries of one size on the way, and few at the end.
TEST(Allocator, ManyFreeBlocksOfOneSizeKeepTheBestFitOrder) {
    CachingAllocator a({}, GiB(1));
    constexpr int kN = 3000;
    std::vector<BlockHandle> h(kN);
    for (auto& x : h) x = a.malloc(Bytes(512)).handle;
    for (int i = 0; i < kN; i += 2) a.free(h[static_cast<std::size_t>(i)]);
    a.check_invariants();
    auto lowest_free_512 = [&a] {
        std::int64_t best = -1;
        for (const auto& s : a.segments())
            for (const auto& b : s.blocks)
                if (!b.allocated && b.size == Bytes(512) && (best < 0 || b.address < best)) best = b.address;
        return best;
    };
    for (int i = 0; i < kN; i += 4) {  // half of the holes taken again, lowest first
        const std::int64_t want = lowest_free_512();
        const auto before = allocated_addresses(a);
        h[static_cast<std::size_t>(i)] = a.malloc(Bytes(512)).handle;
        const auto after = allocated_addresses(a);
        std::vector<std::int64_t> added;
        std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(added));
        ASSERT_EQ(added, std::vector<std::int64_t>{want}) << "request " << i / 4;
    }
    a.check_invariants();
    std::vector<int> live;
    for (int i = 0; i < kN; ++i)
        if (i % 2 == 1 || i % 4 == 0) live.push_back(i);
    std::mt19937_64 rng(99);
    std::shuffle(live.begin(), live.end(), rng);
    for (std::size_t k = 0; k < live.size(); ++k) {
        a.free(h[static_cast<std::size_t>(live[k])]);
        if (k % 16 == 0) a.check_invariants();
    }
    a.check_invariants();
    EXPECT_EQ(a.stats().allocated, Bytes(0));
    EXPECT_EQ(a.stats().segments, 1);
    EXPECT_EQ(a.largest_free_block(), MiB(2));  // the segment, whole again
}

TEST(Allocator, ZeroBytesAndBadHandles) {
    CachingAllocator a({}, GiB(1));
    auto r = a.malloc(Bytes(0));  // PyTorch allocates nothing for 0 bytes
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.handle, kNullBlock);
    EXPECT_EQ(a.stats().reserved, Bytes(0));
    a.free(r.handle);  // no-op
    auto x = a.malloc(Bytes(100));
    a.free(x.handle);
    EXPECT_THROW(a.free(x.handle), std::invalid_argument);  // double free
    EXPECT_THROW(a.malloc(Bytes(-1)), std::invalid_argument);
}

TEST(Allocator, ResetPeaks) {
    CachingAllocator a({}, GiB(1));
    auto r = a.malloc(MiB(30));
    a.free(r.handle);
    a.empty_cache();
    EXPECT_EQ(a.stats().peak_allocated, MiB(30));
    a.reset_peaks();
    EXPECT_EQ(a.stats().peak_allocated, Bytes(0));
    EXPECT_EQ(a.stats().peak_reserved, Bytes(0));
}

// ---------------------------------------------------------------------------
// AllocatorConfig::parse

TEST(AllocatorConfig, ParsesDocumentedSyntax) {
    auto c = conf("max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6,"
                  "roundup_power2_divisions:[256:1,512:2,>:4],max_non_split_rounding_mb:64");
    ASSERT_TRUE(c.max_split_size.has_value());
    EXPECT_EQ(*c.max_split_size, MiB(128));
    EXPECT_TRUE(c.expandable_segments);
    EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.6);
    EXPECT_EQ(c.max_non_split_rounding, MiB(64));
    ASSERT_EQ(c.roundup_power2_divisions.size(), 16u);
    // 256 -> interval log2(256) = 8; the first entry also fills 0..7; '>' fills 9.. (2.4-2.8).
    for (int i = 0; i <= 8; ++i) EXPECT_EQ(c.roundup_power2_divisions[static_cast<std::size_t>(i)], 1) << i;
    for (int i = 9; i < 16; ++i) EXPECT_EQ(c.roundup_power2_divisions[static_cast<std::size_t>(i)], 4) << i;

    auto d = conf("roundup_power2_divisions:8,expandable_segments:False,backend:native,release_lock_on_cudamalloc:True");
    EXPECT_EQ(d.roundup_power2_divisions, std::vector<int>{8});
    EXPECT_FALSE(d.expandable_segments);
    auto e = conf("");
    EXPECT_FALSE(e.max_split_size.has_value());
    EXPECT_EQ(e.to_string(), "");
}

TEST(AllocatorConfig, RoundTripsThroughToString) {
    for (const std::string s : {"max_split_size_mb:128,expandable_segments:True",
                                "roundup_power2_divisions:4,garbage_collection_threshold:0.75",
                                "roundup_power2_divisions:[256:1,512:2,>:4]", "max_non_split_rounding_mb:40"}) {
        const auto c = conf(s);
        const auto c2 = conf(c.to_string());
        EXPECT_EQ(c2.to_string(), c.to_string()) << s;
        EXPECT_EQ(c2.max_split_size, c.max_split_size);
        EXPECT_EQ(c2.roundup_power2_divisions, c.roundup_power2_divisions);
        EXPECT_EQ(c2.garbage_collection_threshold, c.garbage_collection_threshold);
        EXPECT_EQ(c2.expandable_segments, c.expandable_segments);
        EXPECT_EQ(c2.max_non_split_rounding, c.max_non_split_rounding);
    }
    EXPECT_EQ(conf("max_split_size_mb:128,expandable_segments:True").to_string(),
              "max_split_size_mb:128,expandable_segments:True");
}

TEST(AllocatorConfig, RejectsBadValuesNamingTheOption) {
    auto err = [](const std::string& s) {
        auto r = AllocatorConfig::parse(s);
        EXPECT_FALSE(r.ok()) << s;
        return r.ok() ? std::string() : r.error().message;
    };
    auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
    // PyTorch 2.4-2.8: "max_split_size_mb too small, must be > 20".
    EXPECT_TRUE(has(err("max_split_size_mb:8"), "max_split_size_mb must be > 20 (got 8)"));
    EXPECT_TRUE(has(err("max_split_size_mb:20"), "max_split_size_mb"));
    EXPECT_TRUE(has(err("max_split_size_mb:abc"), "max_split_size_mb expects a whole number"));
    EXPECT_TRUE(has(err("max_non_split_rounding_mb:10"), "max_non_split_rounding_mb must be > 20"));
    EXPECT_TRUE(has(err("garbage_collection_threshold:1.5"), "garbage_collection_threshold must be in (0.0, 1.0)"));
    EXPECT_TRUE(has(err("garbage_collection_threshold:0"), "garbage_collection_threshold"));
    EXPECT_TRUE(has(err("roundup_power2_divisions:3"), "roundup_power2_divisions must be a power of 2 (got 3)"));
    EXPECT_TRUE(has(err("roundup_power2_divisions:[300:2]"), "interval must be a power of 2"));
    EXPECT_TRUE(has(err("roundup_power2_divisions:[256:3]"), "divisions must be 0 or a power of 2"));
    EXPECT_TRUE(has(err("roundup_power2_divisions:[256:1"), "missing ']'"));
    EXPECT_TRUE(has(err("expandable_segments:yes"), "expandable_segments expects True or False"));
    EXPECT_TRUE(has(err("max_split_size_mb"), "expected ':' after 'max_split_size_mb'"));
    EXPECT_TRUE(has(err("max_split_size_mb:128 expandable_segments:True"), "max_split_size_mb"));
    const std::string unknown = err("max_split_mb:128");
    EXPECT_TRUE(has(unknown, "unknown option 'max_split_mb'"));
    EXPECT_TRUE(has(unknown, "max_split_size_mb"));  // lists the known keys
    EXPECT_TRUE(has(unknown, "--alloc-conf"));
    auto r = AllocatorConfig::parse("backend:cudaMallocAsync");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::Unsupported);
    EXPECT_EQ(r.error().field, "--alloc-conf");
}

// ---------------------------------------------------------------------------
// Replay

namespace {

struct TraceBuilder {
    Trace t;
    Phase phase = Phase::Forward;
    std::int32_t step = 0;
    void alloc(std::int64_t id, Bytes size, std::int32_t label = -1) {
        TraceEvent e;
        e.kind = TraceEvent::Kind::Alloc;
        e.id = id;
        e.size = size;
        e.label = label;
        e.phase = phase;
        e.step = step;
        t.events.push_back(e);
    }
    void free(std::int64_t id) {
        TraceEvent e;
        e.kind = TraceEvent::Kind::Free;
        e.id = id;
        e.phase = phase;
        e.step = step;
        t.events.push_back(e);
    }
};

}  // namespace

TEST(Replay, NoAllocatorPeakIsMaxLiveRequestedBytes) {
    TraceBuilder b;
    std::mt19937_64 rng(7);
    std::vector<std::pair<std::int64_t, std::int64_t>> live;  // id, size
    std::int64_t cur = 0, expect_peak = 0, next_id = 0;
    for (int i = 0; i < 5000; ++i) {
        if (live.empty() || rng() % 2 == 0) {
            const std::int64_t sz = 1 + static_cast<std::int64_t>(rng() % (50 * kMB));
            b.alloc(next_id, Bytes(sz));
            live.emplace_back(next_id++, sz);
            cur += sz;
            expect_peak = std::max(expect_peak, cur);
        } else {
            const std::size_t k = rng() % live.size();
            b.free(live[k].first);
            cur -= live[k].second;
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
    }
    ReplayOptions opt;
    opt.mode = AllocatorMode::None;
    auto r = replay(b.t, opt);
    EXPECT_EQ(r.peak_allocated, Bytes(expect_peak));
    EXPECT_EQ(r.peak_reserved, Bytes(expect_peak));  // no caching: reserved == allocated
    EXPECT_EQ(r.final_allocated, Bytes(cur));
    EXPECT_EQ(r.fragmentation_at_peak, Bytes(0));
    EXPECT_FALSE(r.oom.has_value());
}

TEST(Replay, PyTorchModeMatchesAllocatorAndTracksPhases) {
    TraceBuilder b;
    b.phase = Phase::Forward;
    b.alloc(1, MiB(6));   // 20 MiB segment
    b.alloc(2, MiB(6));   // same segment
    b.phase = Phase::Backward;
    b.free(2);
    b.alloc(3, MiB(30));  // new 30 MiB segment: allocated 36, reserved 50
    b.free(3);
    b.free(1);
    TraceEvent ec;
    ec.kind = TraceEvent::Kind::EmptyCache;
    ec.phase = Phase::Optimizer;
    b.t.events.push_back(ec);
    auto r = replay(b.t, ReplayOptions{});
    EXPECT_EQ(r.peak_allocated, MiB(36));
    EXPECT_EQ(r.peak_event, 3);
    EXPECT_EQ(r.peak_phase, Phase::Backward);
    EXPECT_EQ(r.peak_reserved, MiB(50));
    // at the peak: reserved 50 - allocated 36 = 14 MiB cached; largest free block
    // is the 14 MiB tail of the 20 MiB segment (6 MiB id 1, then 14 MiB free).
    EXPECT_EQ(r.fragmentation_at_peak, MiB(14));
    EXPECT_EQ(r.largest_free_block_at_peak, MiB(14));
    EXPECT_EQ(r.final_reserved, Bytes(0));  // empty_cache released everything
    ASSERT_EQ(r.phases.size(), 3u);
    EXPECT_EQ(r.phases[0].phase, Phase::Forward);
    EXPECT_EQ(r.phases[0].peak_allocated, MiB(12));
    EXPECT_EQ(r.phases[1].phase, Phase::Backward);
    EXPECT_EQ(r.phases[1].peak_allocated, MiB(36));
    EXPECT_EQ(r.phases[1].peak_reserved, MiB(50));
    EXPECT_EQ(r.phases[2].phase, Phase::Optimizer);
    // phases are sampled after each event: the optimizer phase is the empty_cache event alone -> 0.
    EXPECT_EQ(r.phases[2].peak_reserved, Bytes(0));
}

TEST(Replay, TimelineDownsamplingKeepsThePeak) {
    TraceBuilder b;
    std::int64_t id = 0;
    // Sawtooth: 40 rounds of 50 allocations of 2 MiB then frees (ten 2 MiB blocks
    // fill each 20 MiB segment exactly, so each is charged 2 MiB); round 23 also
    // allocates a 300 MiB spike.
    for (int round = 0; round < 40; ++round) {
        b.step = round / 10;
        const std::int64_t first = id;
        for (int k = 0; k < 50; ++k) b.alloc(id++, MiB(2));
        if (round == 23) {
            b.alloc(id++, MiB(300));
            b.free(id - 1);
        }
        for (std::int64_t j = id - 1; j >= first; --j)
            if (!(round == 23 && j == id - 1)) b.free(j);
    }
    ReplayOptions opt;
    opt.max_timeline_points = 50;
    auto r = replay(b.t, opt);
    EXPECT_LE(static_cast<std::int64_t>(r.timeline.size()), 50);
    EXPECT_GE(r.timeline.size(), 10u);
    bool has_peak = false;
    for (const auto& p : r.timeline)
        if (p.event == r.peak_event) {
            has_peak = true;
            EXPECT_EQ(p.allocated, r.peak_allocated);
        }
    EXPECT_TRUE(has_peak);
    EXPECT_TRUE(std::is_sorted(r.timeline.begin(), r.timeline.end(),
                               [](const TimelinePoint& x, const TimelinePoint& y) { return x.event < y.event; }));
    // 4 steps -> 4 phase boundaries, all in the timeline.
    for (std::int32_t s = 0; s < 4; ++s)
        EXPECT_TRUE(std::any_of(r.timeline.begin(), r.timeline.end(), [s](const TimelinePoint& p) { return p.step == s; }));
    // 50 * 2 MiB + 300 MiB live at the peak.
    EXPECT_EQ(r.peak_allocated, MiB(400));
    EXPECT_EQ(r.peak_step, 2);
    ASSERT_EQ(r.phases.size(), 4u);
    EXPECT_EQ(r.phases[2].peak_allocated, r.peak_allocated);
}

TEST(Replay, OomInTheMiddleIsReportedAndReplayContinues) {
    TraceBuilder b;
    b.alloc(1, MiB(40));
    b.alloc(2, MiB(50));  // 90 > 80 MiB: OOM at event 1
    b.free(2);            // ignored (the tensor never existed)
    b.alloc(3, MiB(30));  // fits: 70
    b.free(1);
    b.free(99);           // unknown id: ignored, counted
    ReplayOptions opt;
    opt.capacity = MiB(80);
    auto r = replay(b.t, opt);
    ASSERT_TRUE(r.oom.has_value());
    EXPECT_EQ(r.oom_event, 1);
    EXPECT_EQ(r.oom->requested, MiB(50));
    EXPECT_EQ(r.oom->allocated, MiB(40));
    EXPECT_EQ(r.failed_allocs, 1);
    EXPECT_EQ(r.unknown_frees, 1);
    EXPECT_EQ(r.peak_allocated, MiB(70));
    EXPECT_EQ(r.peak_event, 3);
    EXPECT_EQ(r.final_allocated, MiB(30));
    EXPECT_EQ(r.allocator.ooms, 1);
    // Mode None reports the same OOM point from live bytes alone.
    opt.mode = AllocatorMode::None;
    auto n = replay(b.t, opt);
    ASSERT_TRUE(n.oom.has_value());
    EXPECT_EQ(n.oom_event, 1);
    EXPECT_EQ(n.peak_allocated, MiB(70));
}

TEST(Replay, TopTensorsAtThePeak) {
    TraceBuilder b;
    const auto w = b.t.add_label("weight");
    const auto act = b.t.add_label("activation");
    const auto tmp = b.t.add_label("temp");
    b.phase = Phase::Setup;
    b.alloc(10, MiB(100), w);
    b.phase = Phase::Forward;
    b.alloc(11, MiB(20), act);
    b.alloc(12, MiB(50), tmp);   // freed before the peak (170 MiB at that point)
    b.free(12);
    b.alloc(13, MiB(60), act);
    b.alloc(14, MiB(30), act);   // peak: 100 + 20 + 60 + 30 = 210 MiB
    b.phase = Phase::Backward;
    b.free(14);
    b.free(13);
    ReplayOptions opt;
    opt.top_tensors = 3;
    auto r = replay(b.t, opt);
    EXPECT_EQ(r.peak_event, 5);
    ASSERT_EQ(r.top_at_peak.size(), 3u);
    EXPECT_EQ(r.top_at_peak[0].id, 10);
    EXPECT_EQ(r.top_at_peak[0].label, "weight");
    EXPECT_EQ(r.top_at_peak[0].phase, Phase::Setup);
    EXPECT_EQ(r.top_at_peak[1].id, 13);
    EXPECT_EQ(r.top_at_peak[1].size, MiB(60));
    EXPECT_EQ(r.top_at_peak[2].id, 14);
    EXPECT_EQ(r.top_at_peak[2].label, "activation");
    EXPECT_STREQ(phase_name(Phase::Backward), "backward");
    (void)tmp;
}

// ---------------------------------------------------------------------------
// The capacity watch's copy (watch_capacity / take_watched) against an
// allocator that ran against the limit from the start: from the first
// cudaMalloc past the limit on, both must answer every request alike (same
// handles, stats and state). The random run keeps well over 256 blocks (the
// block store's chunk) and frees whole segments (empty_cache, OOM retries),
// so the copy covers several chunks and the segment records' compaction.
TEST(Allocator, WatchedCopyAnswersLikeAnAllocatorAtTheLimit) {
    for (const char* text : {"", "max_split_size_mb:64", "roundup_power2_divisions:4"}) {
        SCOPED_TRACE(text);
        const Bytes limit = MiBf(256);
        CachingAllocator watched(conf(text), GiB(64));
        CachingAllocator at_limit(conf(text), limit);
        ASSERT_TRUE(watched.watch_capacity(limit));
        std::optional<CachingAllocator> copy;
        std::mt19937_64 rng(99);
        std::vector<BlockHandle> live;  // handles valid in `at_limit` and, before the crossing, in `watched`
        std::size_t most_blocks = 0;
        auto same_state = [&](const CachingAllocator& a, const CachingAllocator& b) {
            std::vector<std::int64_t> sa, sb;
            a.signature(sa, [](BlockHandle h) { return h; });
            b.signature(sb, [](BlockHandle h) { return h; });
            return sa == sb;
        };
        for (int op = 0; op < 6000; ++op) {
            CachingAllocator& run = copy ? *copy : watched;
            const auto dice = rng() % 100;
            if (dice < 60 || live.empty()) {
                // Mostly small tensors (many blocks per 2 MiB segment), some large ones.
                const std::int64_t sz = rng() % 20 != 0 ? 1 + static_cast<std::int64_t>(rng() % (64 * 1024))
                                                         : kMB + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(8 * kMB));
                const int stream = static_cast<int>(rng() % 2);
                const AllocResult want = at_limit.malloc(Bytes(sz), stream);
                const AllocResult got = run.malloc(Bytes(sz), stream);
                if (!copy) {
                    if (auto c = watched.take_watched()) {
                        // The crossing: the copy is the state before this malloc. Run it there.
                        copy.emplace(std::move(*c));
                        const AllocResult again = copy->malloc(Bytes(sz), stream);
                        ASSERT_EQ(again.ok, want.ok) << "op " << op;
                        if (want.ok) {
                            ASSERT_EQ(again.handle, want.handle) << "op " << op;
                            live.push_back(want.handle);
                        }
                        continue;
                    }
                }
                ASSERT_EQ(got.ok, want.ok) << "op " << op;
                if (want.ok) {
                    ASSERT_EQ(got.handle, want.handle) << "op " << op;
                    live.push_back(want.handle);
                }
            } else if (dice < 97) {
                const std::size_t k = static_cast<std::size_t>(rng() % live.size());
                at_limit.free(live[k]);
                run.free(live[k]);
                live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            } else {
                at_limit.empty_cache();
                run.empty_cache();
            }
            most_blocks = std::max(most_blocks, live.size());
            if (copy && op % 20 == 0) {
                copy->check_invariants();
                ASSERT_EQ(copy->stats().reserved, at_limit.stats().reserved) << "op " << op;
                ASSERT_EQ(copy->stats().segments, at_limit.stats().segments) << "op " << op;
                ASSERT_TRUE(same_state(*copy, at_limit)) << "op " << op;
            }
        }
        ASSERT_TRUE(copy.has_value()) << "the run never crossed the limit";
        EXPECT_GT(most_blocks, 600u);
        EXPECT_GT(at_limit.stats().ooms, 0);
        EXPECT_GT(at_limit.stats().cuda_frees, 0);
        EXPECT_EQ(copy->stats().ooms, at_limit.stats().ooms);
    }
}
