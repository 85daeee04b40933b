// Model-state memory (weights, gradients, optimizer states) against
// independent calculations and published numbers.
#include <gtest/gtest.h>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"

using namespace gpumem;

namespace {
EstimateResult run(std::int64_t params, Precision p, Optimizer o) {
    EstimateRequest req;
    req.params_count = params;
    req.precision = p;
    req.optimizer = o;
    auto r = estimate(req);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
}
}  // namespace

// Seed 002: a 7B model in fp16 with fp32 master weights and Adam moments:
// 14 + 14 + 28 + 28 + 28 = 112 GB of model states.
TEST(ModelStates, Seed002SevenBillionFp16Adam) {
    const std::int64_t P = 7'000'000'000;
    const auto r = run(P, Precision::FP16, Optimizer::Adam);
    EXPECT_EQ(r.per_gpu.weights.count(), 14'000'000'000);
    EXPECT_EQ(r.per_gpu.gradients.count(), 14'000'000'000);
    EXPECT_EQ(r.per_gpu.master_weights.count(), 28'000'000'000);
    EXPECT_EQ(r.per_gpu.optimizer_states.count(), 28'000'000'000LL * 3);
    EXPECT_EQ((r.per_gpu.weights + r.per_gpu.gradients + r.per_gpu.optimizer_states).count(), 112'000'000'000);
}

// shared/reference/memory-formulas.md table: bytes per parameter.
TEST(ModelStates, BytesPerParameterTable) {
    const std::int64_t P = 1'000'000;
    struct Row { Precision p; Optimizer o; int w, g, opt; };
    const Row rows[] = {
        {Precision::FP32, Optimizer::SGD, 4, 4, 0},
        {Precision::FP32, Optimizer::SGDMomentum, 4, 4, 4},
        {Precision::FP32, Optimizer::AdamW, 4, 4, 8},
        {Precision::AmpBF16, Optimizer::AdamW, 4, 4, 8},
        {Precision::AmpFP16, Optimizer::Adam, 4, 4, 8},
        {Precision::BF16, Optimizer::AdamW, 2, 2, 4},
        {Precision::FP32, Optimizer::Lion, 4, 4, 4},
    };
    for (const auto& row : rows) {
        const auto r = run(P, row.p, row.o);
        EXPECT_EQ(r.per_gpu.weights.count(), row.w * P) << to_string(row.p) << " " << to_string(row.o);
        EXPECT_EQ(r.per_gpu.gradients.count(), row.g * P) << to_string(row.p) << " " << to_string(row.o);
        EXPECT_EQ(r.per_gpu.optimizer_states.count(), row.opt * P) << to_string(row.p) << " " << to_string(row.o);
    }
}

// bitsandbytes 8-bit Adam: uint8 exp_avg and exp_avg_sq plus an fp32 absmax
// per 256-element block; tensors under 4096 elements keep fp32 states.
TEST(ModelStates, AdamW8bitLayout) {
    const std::int64_t big = 4096LL * 4096;  // one [4096, 4096] tensor via --params
    const auto r = run(big, Precision::FP32, Optimizer::AdamW8bit);
    EXPECT_EQ(r.per_gpu.optimizer_states.count(), 2 * big + 2 * 4 * (big / 256));
    const auto small = run(1000, Precision::FP32, Optimizer::AdamW8bit);
    EXPECT_EQ(small.per_gpu.optimizer_states.count(), 2 * 4 * 1000);
}

// Adafactor (transformers, beta1=None): factored fp32 row/column second
// moments for matrices, full for vectors, plus one fp32 RMS scalar each.
TEST(ModelStates, AdafactorFactoredOnGpt2) {
    auto g = load_model("gpt2");
    ASSERT_TRUE(g.ok()) << g.error().message;
    std::int64_t expected = 0;
    for (const auto& b : g.value().blocks)
        for (const auto& p : b.params) {
            std::int64_t per;
            if (p.shape.size() >= 2) per = 4 * (p.shape[p.shape.size() - 2] + p.shape.back()) + 4;
            else per = 4 * p.shape[0] + 4;
            expected += per * p.count * b.repeat;
        }
    EstimateRequest req;
    req.model = "gpt2";
    req.precision = Precision::FP32;
    req.optimizer = Optimizer::Adafactor;
    auto r = estimate(g.value(), req);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().per_gpu.optimizer_states.count(), expected);
    // Far below AdamW's 8 bytes per parameter.
    EXPECT_LT(expected, 124439808LL * 8 / 10);
}

TEST(ModelStates, BreakdownSumsToTotal) {
    for (const char* m : {"gpt2", "llama-3-8b", "mixtral-8x7b", "t5-small", "bert-base-uncased"}) {
        for (Mode mode : {Mode::Train, Mode::Lora, Mode::QLora, Mode::Infer}) {
            EstimateRequest req;
            req.model = m;
            req.mode = mode;
            req.seq = 512;
            req.gen_len = mode == Mode::Infer ? 128 : 0;
            auto r = estimate(req);
            ASSERT_TRUE(r.ok()) << m << ": " << r.error().message;
            Bytes sum;
            for (const auto& row : r.value().breakdown) sum += row.bytes;
            EXPECT_EQ(sum, r.value().per_gpu.total_device) << m << " " << to_string(mode);
            EXPECT_GE(r.value().per_gpu.peak_reserved, r.value().per_gpu.peak_allocated);
        }
    }
}
