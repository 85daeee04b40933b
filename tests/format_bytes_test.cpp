// format_bytes (core/bytes.hpp) formats on integers; its reference is what it
// replaced, C's snprintf("%.2f <unit>") of n / 1024^k. Compared over a
// generated grid: every unit boundary, exact ties at the second decimal
// (where rounding half to even shows), negatives, the int64 extremes and
// random values.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/bytes.hpp"

namespace {

using gpumem::Bytes;

std::string printf_reference(std::int64_t n) {
    const double a = std::fabs(static_cast<double>(n));
    const Bytes b(n);
    char buf[64];
    if (a < 1024.0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(n));
    else if (a < 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(n) / 1024.0);
    else if (a < 1024.0 * 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f MiB", b.mib());
    else if (a < 1024.0 * 1024.0 * 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f GiB", b.gib());
    else std::snprintf(buf, sizeof buf, "%.2f TiB", b.gib() / 1024.0);
    return buf;
}

TEST(FormatBytes, MatchesPrintfOnAGeneratedGrid) {
    std::vector<std::int64_t> ns = {0, 1, 1023, 1024, 1025, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                                    std::numeric_limits<std::int64_t>::min() + 1};
    for (int k = 1; k <= 5; ++k) {
        const std::int64_t unit = std::int64_t(1) << (10 * k);
        for (std::int64_t d = -3; d <= 3; ++d) ns.push_back(unit + d);
        // Exact ties at the second decimal: m * 100 = 2^(10k-1) (mod 2^(10k))
        // for m = (2i + 1) * 2^(10k-3), since (2i + 1) * 25 is odd; adding
        // whole units keeps the tie and puts m in this unit's range.
        for (std::int64_t i = 0; i < 400; ++i) {
            const std::int64_t m = (2 * i + 1) * (unit / 8);
            ns.push_back(m % unit + unit);
            ns.push_back(-(m % unit + 3 * unit));
        }
    }
    std::mt19937_64 rng(20261128);
    for (int i = 0; i < 20000; ++i) {
        const int bits = static_cast<int>(rng() % 63);
        const std::int64_t v = static_cast<std::int64_t>(rng() >> (64 - bits - 1));
        ns.push_back(v);
        ns.push_back(-v);
    }
    for (std::int64_t n : ns) ASSERT_EQ(gpumem::format_bytes(Bytes(n)), printf_reference(n)) << "n = " << n;
}

// Two ties from the rule written out by hand: 1.125 KiB (1152 B) rounds to
// the even 1.12, 1.375 KiB (1408 B) to 1.38.
TEST(FormatBytes, TiesRoundHalfToEven) {
    EXPECT_EQ(gpumem::format_bytes(Bytes(1152)), "1.12 KiB");
    EXPECT_EQ(gpumem::format_bytes(Bytes(1408)), "1.38 KiB");
    EXPECT_EQ(gpumem::format_bytes(Bytes(-1152)), "-1.12 KiB");
}

}  // namespace
