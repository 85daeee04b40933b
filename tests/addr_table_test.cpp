// core/addr_table.hpp against std::unordered_map: the same generated
// sequences of inserts, assignments, lookups and erases must leave the same
// contents, on keys chosen to collide (multiples of one large power of two:
// device addresses are multiples of 512, and Fibonacci hashing must still
// spread them), on random keys including negative ones and INT64_MIN/MAX, and
// through many doublings and runs that wrap around the end of the array.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/core/addr_table.hpp"

namespace gpumem {
namespace {

void run(const std::string& name, const std::vector<std::int64_t>& keys, std::uint64_t seed, int ops) {
    AddrTable<std::int64_t> t;
    std::unordered_map<std::int64_t, std::int64_t> ref;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < ops; ++i) {
        const std::int64_t k = keys[rng() % keys.size()];
        const std::string at = name + ", op " + std::to_string(i) + ", key " + std::to_string(k);
        switch (rng() % 4) {
            case 0: {  // insert
                const auto v = static_cast<std::int64_t>(rng());
                const bool added = ref.emplace(k, v).second;
                ASSERT_EQ(t.insert(k, v), added) << at;
                break;
            }
            case 1: {  // assign
                const auto v = static_cast<std::int64_t>(rng());
                ref[k] = v;
                t.assign(k, v);
                break;
            }
            case 2:  // erase
                ref.erase(k);
                t.erase(k);
                break;
            default: {  // find
                const auto it = ref.find(k);
                const std::int64_t* got = t.find(k);
                ASSERT_EQ(got != nullptr, it != ref.end()) << at;
                if (got) {
                    ASSERT_EQ(*got, it->second) << at;
                }
            }
        }
        ASSERT_EQ(t.size(), ref.size()) << at;
    }
    for (const std::int64_t k : keys) {
        const auto it = ref.find(k);
        const std::int64_t* got = t.find(k);
        ASSERT_EQ(got != nullptr, it != ref.end()) << name << ", key " << k << " at the end";
        if (got) {
            EXPECT_EQ(*got, it->second) << name << ", key " << k << " at the end";
        }
    }
}

TEST(AddrTable, SameContentsAsUnorderedMap) {
    // Few keys, many operations: runs are erased and refilled in place.
    std::vector<std::int64_t> few;
    for (std::int64_t i = 0; i < 300; ++i) few.push_back(i * 512);
    run("300 addresses 512 apart", few, 1, 200000);

    // Keys 2^20 apart (one large segment each): their products with the
    // hash constant differ only in high bits.
    std::vector<std::int64_t> apart;
    for (std::int64_t i = 0; i < 5000; ++i) apart.push_back(i << 20);
    run("5000 addresses 1 MiB apart", apart, 2, 200000);

    // Random keys over the whole range, and the extremes.
    std::mt19937_64 rng(3);
    std::vector<std::int64_t> any = {0, -1, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
    for (int i = 0; i < 20000; ++i) any.push_back(static_cast<std::int64_t>(rng()));
    run("random keys", any, 4, 300000);
}

TEST(AddrTable, GrowsFromEmptyAndErasesEverything) {
    AddrTable<int> t;
    EXPECT_EQ(t.find(42), nullptr);
    t.erase(42);  // nothing to erase
    const int n = 100000;  // past many doublings (1024 slots first)
    for (int i = 0; i < n; ++i) ASSERT_TRUE(t.insert(std::int64_t{i} * 4096, i));
    EXPECT_EQ(t.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; i += 2) t.erase(std::int64_t{i} * 4096);
    EXPECT_EQ(t.size(), static_cast<std::size_t>(n / 2));
    for (int i = 0; i < n; ++i) {
        const int* v = t.find(std::int64_t{i} * 4096);
        if (i % 2 == 0) {
            ASSERT_EQ(v, nullptr) << i;
        } else {
            ASSERT_NE(v, nullptr) << i;
            ASSERT_EQ(*v, i);
        }
    }
    for (int i = 1; i < n; i += 2) t.erase(std::int64_t{i} * 4096);
    EXPECT_EQ(t.size(), 0U);
    for (int i = 0; i < n; i += 997) EXPECT_EQ(t.find(std::int64_t{i} * 4096), nullptr);
}

}  // namespace
}  // namespace gpumem
