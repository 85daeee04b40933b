// core/shape.hpp: a Shape holds a tensor's dimensions in place; a shape of
// more than kMaxDims dimensions folds its leading ones into the first, so the
// element count and the last two dimensions stay what they were, and so do
// the memory formulas that read them (Adafactor's factored states: fp32 rows
// and columns per leading index, transformers Adafactor._get_options /
// exp_avg_sq_row, exp_avg_sq_col).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpumem/core/shape.hpp"
#include "gpumem/memory/job.hpp"

namespace gpumem {
namespace {

TEST(Shape, HoldsDimensionsInPlace) {
    const Shape s{4096, 11008};
    EXPECT_EQ(s.size(), 2U);
    EXPECT_EQ(s[0], 4096);
    EXPECT_EQ(s.back(), 11008);
    EXPECT_EQ(s.to_vector(), (std::vector<std::int64_t>{4096, 11008}));
    EXPECT_TRUE(Shape{}.empty());
    const std::vector<std::int64_t> eight{1, 2, 3, 4, 5, 6, 7, 8};
    EXPECT_EQ(Shape(eight).to_vector(), eight);  // kMaxDims dimensions: kept as they are
    EXPECT_EQ(Shape(eight), (Shape{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(Shape, LongerShapesFoldTheirLeadingDimensions) {
    const std::vector<std::int64_t> ten{2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const Shape s(ten);
    ASSERT_EQ(s.size(), Shape::kMaxDims);
    EXPECT_EQ(s.to_vector(), (std::vector<std::int64_t>{2 * 3 * 4, 5, 6, 7, 8, 9, 10, 11}));
    // Elements: 2 x 3 x ... x 11 = 11! = 39916800.
    EXPECT_EQ((TrainTensor{s, 3}.numel()), 3 * 39916800LL);
    // Adafactor: 4 bytes x lead x (rows + cols) + a 4-byte RMS per tensor,
    // lead = 2 x 3 x ... x 9 = 9! = 362880, rows 10, cols 11.
    EXPECT_EQ(optimizer_bytes(Optimizer::Adafactor, TrainTensor{s, 1}, DType::F32).count(), 4 * 362880LL * (10 + 11) + 4);
}

}  // namespace
}  // namespace gpumem
