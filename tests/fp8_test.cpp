// FP8 / FP4 training recipes (memory/fp8.hpp): Transformer Engine's cached
// weight copies and scaling state, and the quantized inputs its linears save,
// against counts written out here from the layer shapes and TE's tensor
// layouts; torchao's recipes against the 16-bit run; analytic against
// simulated peaks for every recipe.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <vector>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

constexpr std::array<Fp8Recipe, 7> kRecipes{Fp8Recipe::None, Fp8Recipe::Delayed, Fp8Recipe::Current, Fp8Recipe::Tensorwise,
                                            Fp8Recipe::Rowwise, Fp8Recipe::MXFP8, Fp8Recipe::NVFP4};

std::int64_t up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// Llama-3-8B's linear weights [out, in] per layer (h 4096, 32 heads of 128,
// 8 key/value heads, I 14336): q, k, v, o, gate, up, down; 32 layers.
const std::vector<std::array<std::int64_t, 2>> kLlama3Linears{
    {4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096}, {14336, 4096}, {14336, 4096}, {4096, 14336}};
constexpr std::int64_t kLlama3Layers = 32;

EstimateRequest megatron(const std::string& gpu, Fp8Recipe r) {
    EstimateRequest q;
    q.model = "llama-3-8b";
    q.batch = 1;
    q.seq = 1024;
    q.gpu = gpu;
    q.framework = Framework::Megatron;
    q.attention = Attention::Flash;
    q.fp8_recipe = r;
    q.analytic = true;
    return q;
}

// A breakdown row, 0 when the estimate has none (no FP8 copies: no row).
Bytes row(const EstimateResult& e, const std::string& key) { return test::breakdown_row(e, key, Bytes(0)); }

Bytes fp8_row(const EstimateRequest& q) {
    auto e = estimate(q);
    EXPECT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(row(e.value(), "unattributed"), Bytes(0)) << "rows must sum to the total";
    return row(e.value(), "fp8_weight_copies");
}

// Delayed scaling per GEMM: fwd scale [3] + amax history [len, 3], bwd scale
// [2] + amax history [len, 2], fp32.
std::int64_t delayed_state(std::int64_t len) { return 4 * (3 + 3 * len + 2 + 2 * len); }

}  // namespace

// Per-tensor FP8 (delayed, current) on Hopper: every linear weight as FP8 data
// and its FP8 transpose (1 byte each) + an fp32 scale-inverse; on Blackwell one
// buffer serves both. Megatron's amax history is 1 row, TE's default 1024.
TEST(Fp8, TransformerEngineWeightCopiesLlama3_8B) {
    std::int64_t elems = 0, gemms = 0;
    for (const auto& w : kLlama3Linears) {
        elems += w[0] * w[1] * kLlama3Layers;
        gemms += kLlama3Layers;
    }
    ASSERT_EQ(elems, 6'979'321'856);
    EXPECT_EQ(fp8_row(megatron("H100", Fp8Recipe::Delayed)).count(), 2 * elems + 4 * gemms + delayed_state(1) * gemms);
    EXPECT_EQ(fp8_row(megatron("H100", Fp8Recipe::Current)).count(), 2 * elems + 4 * gemms);
    EXPECT_EQ(fp8_row(megatron("B200", Fp8Recipe::Delayed)).count(), elems + 4 * gemms + delayed_state(1) * gemms);
    EXPECT_EQ(fp8_row(megatron("B200", Fp8Recipe::Current)).count(), elems + 4 * gemms);
    EstimateRequest hf = megatron("H100", Fp8Recipe::Delayed);
    hf.framework = Framework::HF;
    hf.precision = Precision::BF16;
    EXPECT_EQ(fp8_row(hf).count(), 2 * elems + 4 * gemms + delayed_state(1024) * gemms);
}

// MXFP8: row-wise data + E8M0 scales [roundup(M, 128), roundup(K / 32, 4)],
// column-wise data + scales [roundup(M / 32, 4), roundup(K, 128)]. NVFP4:
// row-wise [M, K / 2] + E4M3 scales [roundup(M, 128), roundup(K / 16, 4)],
// column-wise [K, M / 2] + scales [roundup(K, 128), roundup(M / 16, 4)], two
// fp32 amaxes.
TEST(Fp8, BlockScaledWeightCopiesLlama3_8B) {
    std::int64_t mx = 0, nv = 0;
    for (const auto& [m, k] : kLlama3Linears) {
        mx += kLlama3Layers * (2 * m * k + up(m, 128) * up(k / 32, 4) + up(m / 32, 4) * up(k, 128));
        nv += kLlama3Layers * (m * k / 2 + up(m, 128) * up((k + 15) / 16, 4) + k * m / 2 + up(k, 128) * up((m + 15) / 16, 4) + 8);
    }
    EXPECT_EQ(fp8_row(megatron("B200", Fp8Recipe::MXFP8)).count(), mx);
    EXPECT_EQ(fp8_row(megatron("B200", Fp8Recipe::NVFP4)).count(), nv);
    // 8.5 and 4.5 bits per element of the weights, twice.
    EXPECT_NEAR(static_cast<double>(mx) / 6'979'321'856.0, 2.0 + 2.0 / 32.0, 1e-9);
    EXPECT_NEAR(static_cast<double>(nv) / 6'979'321'856.0, 1.0 + 2.0 / 16.0, 1e-3);
}

// Tensor parallelism splits the weights (and their copies); every rank keeps
// a scaling state per GEMM. FSDP-sharded parameters keep no copies (TE's
// FSDP2 path re-quantizes), nor do torchao's recipes.
TEST(Fp8, WeightCopiesUnderLayoutsAndTorchao) {
    std::int64_t elems = 0;
    for (const auto& w : kLlama3Linears) elems += w[0] * w[1] * kLlama3Layers;
    const std::int64_t gemms = 7 * kLlama3Layers;
    EstimateRequest tp = megatron("H100", Fp8Recipe::Delayed);
    tp.parallel.gpus = 2;
    tp.parallel.tp = 2;
    EXPECT_EQ(fp8_row(tp).count(), 2 * (elems / 2) + 4 * gemms + delayed_state(1) * gemms);
    EstimateRequest fsdp = megatron("H100", Fp8Recipe::Delayed);
    fsdp.framework = Framework::HF;
    fsdp.precision = Precision::BF16;
    fsdp.parallel.gpus = 8;
    fsdp.parallel.fsdp = Fsdp::Full;
    EXPECT_EQ(fp8_row(fsdp), Bytes(0));
    for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) EXPECT_EQ(fp8_row(megatron("H100", r)), Bytes(0)) << to_string(r);
}

namespace {

// A small Llama: h=256, 4 heads (kv 2), I=704, 3 layers, V=1000.
ModelGraph small_llama() { return test::llama_graph({.intermediate = 704}); }

EstimateRequest small(Framework f, Fp8Recipe r) {
    EstimateRequest q;
    q.batch = 2;
    q.seq = 128;
    q.precision = Precision::BF16;
    q.attention = Attention::Flash;
    q.framework = f;
    q.fp8_recipe = r;
    q.gpu = r == Fp8Recipe::MXFP8 || r == Fp8Recipe::NVFP4 ? "B200" : "H100";
    q.analytic = true;
    return q;
}

Bytes layer_saves(const ModelGraph& g, const EstimateRequest& q) {
    auto e = estimate(g, q);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.value().activation_detail.blocks[1].total;
}

}  // namespace

// What the layers save per token under Megatron (TE layers: fused norm and
// SwiGLU, flash attention, LayerNormLinear QKV and FC1). In bf16 the QKV
// input, the FC1 input and the FC2 input (2h + 2h + 2I bytes) are saved only
// by their linears; a TE recipe saves one quantized copy of each, Q(c) bytes
// for c elements, and delayed scaling adds one for the output projection
// (the other recipes keep the attention output, saved by flash anyway).
// Q(c) = c (FP8), c + c/32 (MXFP8), c/2 + c/16 (NVFP4). torchao's recipes save
// what bf16 saves.
TEST(Fp8, SavedInputsPerRecipe) {
    const ModelGraph g = small_llama();
    const std::int64_t b = 2, s = 128, h = 256, I = 704, L = 3;
    const Bytes none = layer_saves(g, small(Framework::Megatron, Fp8Recipe::None));
    auto delta = [&](Fp8Recipe r) { return (none - layer_saves(g, small(Framework::Megatron, r))).count(); };
    auto Q = [](Fp8Recipe r, std::int64_t c) { return r == Fp8Recipe::MXFP8 ? c + c / 32 : r == Fp8Recipe::NVFP4 ? c / 2 + c / 16 : c; };
    const std::int64_t bf16 = 2 * h + 2 * h + 2 * I;
    EXPECT_EQ(delta(Fp8Recipe::Delayed), b * s * L * (bf16 - 3 * Q(Fp8Recipe::Delayed, h) - Q(Fp8Recipe::Delayed, I)));
    for (Fp8Recipe r : {Fp8Recipe::Current, Fp8Recipe::MXFP8, Fp8Recipe::NVFP4})
        EXPECT_EQ(delta(r), b * s * L * (bf16 - 2 * Q(r, h) - Q(r, I))) << to_string(r);
    for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) EXPECT_EQ(delta(r), 0) << to_string(r);
    // Hugging Face modules swapped for te.Linear one by one: q, k, v each keep
    // a copy of their shared input (3h for 2h), gate and up too (2h for 2h),
    // the output projection its input's (h for 2h), down its (I for 2I).
    const Bytes hf_none = layer_saves(g, small(Framework::HF, Fp8Recipe::None));
    EXPECT_EQ((hf_none - layer_saves(g, small(Framework::HF, Fp8Recipe::Delayed))).count(), b * s * L * I);
}

// The step simulation makes the same copies (at each layer's first forward)
// and agrees with the analytic peak for every recipe and framework.
TEST(Fp8, AnalyticAgreesWithSimulator) {
    const ModelGraph g = small_llama();
    for (Framework f : {Framework::HF, Framework::Megatron, Framework::Torchtitan})
        for (Fp8Recipe r : kRecipes)
            for (std::int64_t accum : {1, 2}) {
                EstimateRequest q = small(f, r);
                if (f == Framework::Torchtitan) q.precision = Precision::AmpBF16;
                q.grad_accum = accum;
                auto a = estimate(g, q);
                q.analytic = false;
                auto e = simulate_estimate(g, q);
                ASSERT_TRUE(a.ok() && e.ok()) << request_to_command(q);
                const double an = static_cast<double>(a.value().per_gpu.peak_allocated.count());
                const double si = static_cast<double>(e.value().per_gpu.peak_allocated.count());
                EXPECT_NEAR(si / an, 1.0, 0.02) << request_to_command(q);
                EXPECT_EQ(row(a.value(), "fp8_weight_copies"), row(e.value(), "fp8_weight_copies")) << request_to_command(q);
                const bool te = r == Fp8Recipe::Delayed || r == Fp8Recipe::Current || r == Fp8Recipe::MXFP8 || r == Fp8Recipe::NVFP4;
                EXPECT_EQ(row(a.value(), "fp8_weight_copies") > Bytes(0), te) << request_to_command(q);
            }
}

// Pipeline and tensor parallel ranks: each stage keeps the copies of its own layers.
TEST(Fp8, PipelineStagesAgree) {
    const ModelGraph g = small_llama();
    EstimateRequest q = small(Framework::Megatron, Fp8Recipe::Delayed);
    q.parallel.gpus = 4;
    q.parallel.pp = 2;
    q.parallel.pp_layers = {2, 1};
    q.parallel.tp = 2;
    q.grad_accum = 4;
    q.analytic = false;
    auto e = simulate_estimate(g, q);
    ASSERT_TRUE(e.ok()) << e.error().message;
    ASSERT_TRUE(e.value().parallel.has_value());
    Bytes sum;
    for (const auto& st : e.value().parallel->stages) {
        sum += st.fp8_weights;
        if (!st.simulated) continue;
        EXPECT_NEAR(static_cast<double>(st.simulated_peak_allocated.count()) /
                        static_cast<double>((st.allocated + e.value().per_gpu.cublas_workspace).count()),
                    1.0, 0.03)
            << "stage " << st.stage;
    }
    // 3 layers of 7 linears split over tp 2 and two stages: all copies once, a
    // scaling state per GEMM.
    const std::int64_t h = 256, kv = 128, I = 704;
    const std::int64_t per_layer = 2 * (h * h + kv * h + kv * h + h * h + 2 * I * h + h * I) / 2 + 7 * (4 + delayed_state(1));
    EXPECT_EQ(sum.count(), 3 * per_layer);
}

// Every recipe's assumption line names what it keeps.
TEST(Fp8, AssumptionsNameTheRecipe) {
    for (Fp8Recipe r : kRecipes) {
        if (r == Fp8Recipe::None) continue;
        auto e = estimate(small_llama(), small(Framework::Megatron, r));
        ASSERT_TRUE(e.ok());
        const std::string want = std::string("--fp8-recipe ") + to_string(r);
        EXPECT_TRUE(std::any_of(e.value().assumptions.begin(), e.value().assumptions.end(),
                                [&](const std::string& a) { return a.rfind(want, 0) == 0; }))
            << to_string(r);
    }
    EstimateRequest hopper = small(Framework::Megatron, Fp8Recipe::NVFP4);
    hopper.gpu = "H100";
    auto e = estimate(small_llama(), hopper);
    ASSERT_TRUE(e.ok());
    EXPECT_FALSE(e.value().warnings.empty());
}
