// Scaling rules of saved activations, each checked against an independent
// calculation from the HF/PyTorch code paths (not against gpumem's output).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"

using namespace gpumem;

namespace {

ModelGraph llama(std::int64_t layers, std::int64_t vocab = 1000) {
    const nlohmann::json cfg = {{"model_type", "llama"},       {"hidden_size", 256},        {"num_attention_heads", 8},
                                {"num_key_value_heads", 2},     {"intermediate_size", 688},  {"num_hidden_layers", layers},
                                {"vocab_size", vocab},          {"max_position_embeddings", 8192}};
    return load_hf_config_json(cfg, "test llama").value();
}

std::int64_t activations(const ModelGraph& g, std::int64_t b, std::int64_t s, Precision p, Attention a, Recompute r) {
    EstimateRequest req;
    req.batch = b;
    req.seq = s;
    req.precision = p;
    req.attention = a;
    req.recompute = r;
    auto res = estimate(g, req);
    EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.error().message);
    return res.value().per_gpu.activations.count();
}

}  // namespace

// HF gradient checkpointing keeps each decoder layer's input hidden_states
// [b, s, h] only: two more layers add exactly 2 * b*s*h * 2 bytes in bf16.
TEST(ActivationRules, FullRecomputeKeepsLayerInputs) {
    const std::int64_t b = 2, s = 512, h = 256;
    const auto a2 = activations(llama(2), b, s, Precision::BF16, Attention::Flash, Recompute::Full);
    const auto a4 = activations(llama(4), b, s, Precision::BF16, Attention::Flash, Recompute::Full);
    EXPECT_EQ(a4 - a2, 2 * b * s * h * 2);
}

// Eager LLaMA attention keeps per layer the fp32 softmax output [b, a, s, s]
// and its bf16 copy (softmax(..., dtype=float32).to(q.dtype), saved by the
// matmul with V): 6 bytes per score. Everything else is linear in b*s, so
// (b=1, 2s) minus (b=2, s) leaves only the score terms: L * a * 6 * (4s^2 - 2s^2).
TEST(ActivationRules, EagerScoresAreQuadraticFlashIsNot) {
    const auto g = llama(3);
    const std::int64_t s = 256, L = 3, a = 8;
    const auto eager_long = activations(g, 1, 2 * s, Precision::BF16, Attention::Eager, Recompute::None);
    const auto eager_wide = activations(g, 2, s, Precision::BF16, Attention::Eager, Recompute::None);
    EXPECT_EQ(eager_long - eager_wide, L * a * 6 * (4 * s * s - 2 * s * s));
    const auto flash_long = activations(g, 1, 2 * s, Precision::BF16, Attention::Flash, Recompute::None);
    const auto flash_wide = activations(g, 2, s, Precision::BF16, Attention::Flash, Recompute::None);
    // Flash keeps no s^2 term; the only difference left is the shifted labels
    // of the loss (b*(s-1) vs b*(s-1) rows: int64 labels, fp32 log-probs).
    EXPECT_LT(std::llabs(flash_long - flash_wide), 1000 * 4 + 64);
}

// Selective recompute drops the attention core; full recompute keeps only layer inputs.
TEST(ActivationRules, RecomputeOrdering) {
    const auto g = llama(2);
    const auto eager = activations(g, 2, 1024, Precision::BF16, Attention::Eager, Recompute::None);
    const auto sel = activations(g, 2, 1024, Precision::BF16, Attention::Eager, Recompute::Selective);
    const auto full = activations(g, 2, 1024, Precision::BF16, Attention::Eager, Recompute::Full);
    EXPECT_LT(sel, eager);
    EXPECT_LT(full, sel);
}

// Dropout with p > 0 saves a 1-byte mask per element (CUDA native_dropout);
// GPT-2 has 3 dropouts per layer on [b,s,h] (attn output, mlp output,
// and the embedding one once) plus attention dropout on [b,a,s,s], where the
// post-dropout tensor is a new fp32 storage saved by the matmul with V.
TEST(ActivationRules, Gpt2DropoutMasks) {
    nlohmann::json cfg = {{"model_type", "gpt2"}, {"n_embd", 128}, {"n_head", 4}, {"n_layer", 2}, {"vocab_size", 1000}};
    const auto with = load_hf_config_json(cfg, "gpt2 p=0.1").value();
    cfg["resid_pdrop"] = 0.0;
    cfg["embd_pdrop"] = 0.0;
    cfg["attn_pdrop"] = 0.0;
    const auto without = load_hf_config_json(cfg, "gpt2 p=0").value();
    const std::int64_t b = 2, s = 64, h = 128, a = 4, L = 2;
    const auto d = activations(with, b, s, Precision::FP32, Attention::Eager, Recompute::None) -
                   activations(without, b, s, Precision::FP32, Attention::Eager, Recompute::None);
    EXPECT_EQ(d, (2 * L + 1) * b * s * h * 1 + L * b * a * s * s * (1 + 4));
}

// A fused linear cross-entropy (Liger's LigerFusedLinearCrossEntropyLoss)
// never makes the logits: the rewrite drops the ops between the output
// projection and the loss, and the tensors they made (the fp32 logits,
// log_softmax's output) are made by no op. The largest tensor, the block the
// analytic reserved peak keeps cached, is then the largest one an op makes: a
// decoder layer's MLP intermediate [b, s, intermediate] in bf16 (LlamaMLP:
// gate_proj / up_proj outputs, act_fn(gate) * up), which for this model is
// larger than the fp32 chunk [b s, hidden] the fused loss works on. It was
// the whole fp32 logits [b, s, vocab], 60 times as large.
TEST(ActivationRules, LargestTensorIsOneAnOpMakes) {
    const ModelGraph g = llama(2, 32000);  // hidden 256, intermediate 688
    const std::int64_t b = 2, s = 1024;
    EstimateRequest req;
    req.batch = b;
    req.seq = s;
    req.precision = Precision::BF16;
    req.attention = Attention::Flash;
    req.recompute = Recompute::None;
    req.cross_entropy = CrossEntropy::FusedLinear;
    req.analytic = true;
    const auto r = estimate(g, req);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const std::int64_t mlp = b * s * 688 * 2, chunk = b * s * 256 * 4, logits = b * s * 32000 * 4;
    ASSERT_GT(mlp, chunk);
    EXPECT_EQ(r.value().activation_detail.largest_tensor.count(), mlp);
    EXPECT_LT(r.value().activation_detail.largest_tensor.count(), logits / 50);
}
