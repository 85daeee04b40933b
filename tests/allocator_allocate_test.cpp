// CachingAllocator::allocate (the replay's path: a handle, or kFailedBlock and
// the OOM) and malloc (the AllocResult) are two doors to one allocation: two
// allocators, one driven by malloc and one by allocate with the same
// generated requests and frees, must hand out the same handles, fail on the
// same requests with the same OomInfo, and end with the same statistics and
// segments. (What the allocation itself does is checked against values worked
// out by hand in allocator_test.cpp.) Configurations: the default, expandable
// segments, max_split_size with garbage collection, power-of-two rounding;
// one capacity small enough that requests fail.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "gpumem/sim/allocator.hpp"

namespace gpumem::sim {
namespace {

// The handle format (sim/allocator.hpp) round-trips, and a real block's
// handle is neither kNullBlock nor kFailedBlock.
static_assert(block_slot(make_block_handle(7, 3)) == 7 && block_generation(make_block_handle(7, 3)) == 3);
static_assert(block_slot(make_block_handle(0xffffffffU, 0x7fffffffU)) == 0xffffffffU &&
              block_generation(make_block_handle(0xffffffffU, 0x7fffffffU)) == 0x7fffffffU);
static_assert(make_block_handle(0, 1) > kNullBlock && make_block_handle(0, 1) != CachingAllocator::kFailedBlock);

TEST(AllocatorAllocate, SameMovesAsMalloc) {
    const std::vector<std::string> confs = {"", "expandable_segments:True", "max_split_size_mb:64,garbage_collection_threshold:0.6",
                                            "roundup_power2_divisions:4"};
    int failures = 0;
    for (const auto& c : confs) {
        for (const std::int64_t cap_mib : {std::int64_t{512}, std::int64_t{4096}}) {
            const AllocatorConfig cfg = AllocatorConfig::parse(c).value();
            CachingAllocator by_malloc(cfg, MiB(cap_mib));
            CachingAllocator by_allocate(cfg, MiB(cap_mib));
            std::mt19937_64 rng(static_cast<std::uint64_t>(cap_mib) * 31 + c.size());
            std::vector<BlockHandle> live;
            for (int i = 0; i < 4000; ++i) {
                const std::string at = "conf '" + c + "', capacity " + std::to_string(cap_mib) + " MiB, step " + std::to_string(i);
                if (!live.empty() && rng() % 5 < 2) {
                    const std::size_t k = rng() % live.size();
                    by_malloc.free(live[k]);
                    by_allocate.free(live[k]);
                    live[k] = live.back();
                    live.pop_back();
                    continue;
                }
                // Sizes from 0 bytes to 96 MiB, most of them small.
                const std::int64_t size = rng() % 10 == 0 ? static_cast<std::int64_t>(rng() % (96ULL << 20))
                                                          : static_cast<std::int64_t>(rng() % (2ULL << 20));
                const AllocResult r = by_malloc.malloc(Bytes(size));
                OomInfo oom;
                const BlockHandle h = by_allocate.allocate(Bytes(size), 0, oom);
                ASSERT_EQ(r.ok, h != CachingAllocator::kFailedBlock) << at;
                if (!r.ok) {
                    ++failures;
                    ASSERT_TRUE(r.oom.has_value()) << at;
                    EXPECT_TRUE(*r.oom == oom) << at << ": the OOM reports differ";
                    continue;
                }
                ASSERT_EQ(r.handle, h) << at;
                if (h != kNullBlock) live.push_back(h);
            }
            const AllocatorStats& a = by_malloc.stats();
            const AllocatorStats& b = by_allocate.stats();
            EXPECT_EQ(a.allocated, b.allocated);
            EXPECT_EQ(a.reserved, b.reserved);
            EXPECT_EQ(a.peak_reserved, b.peak_reserved);
            EXPECT_EQ(a.ooms, b.ooms);
            EXPECT_EQ(a.cuda_mallocs, b.cuda_mallocs);
            EXPECT_EQ(by_malloc.segments().size(), by_allocate.segments().size());
        }
    }
    EXPECT_GT(failures, 0);  // the small capacity makes requests fail
}

}  // namespace
}  // namespace gpumem::sim
