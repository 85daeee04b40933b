// QLoRA / LoRA rules read from the frameworks (docs/assumptions.md, "Quantized
// bases and LoRA adapters"): what frozen quantized layers and the adapters keep
// for backward, LoRA dropout, the 4-bit storage variants, a quantized lm_head,
// --params with --quant, and an encoder-decoder model whose decoder runs a
// length of its own (--decoder-seq). Every expected number is computed here
// from the model's shapes, never taken from gpumem's output.
#include <gtest/gtest.h>

#include <string>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// Llama-2-7b (data/presets/configs/llama-2-7b.json).
constexpr std::int64_t kLayers = 32, kHidden = 4096, kInter = 11008, kVocab = 32000;

EstimateRequest llama_job(Mode mode, std::int64_t batch, std::int64_t seq) {
    EstimateRequest r;
    r.model = "llama-2-7b";
    r.mode = mode;
    r.batch = batch;
    r.seq = seq;
    r.analytic = true;
    return r;
}

EstimateResult run(const EstimateRequest& r) {
    auto e = estimate(r);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
    return e.ok() ? std::move(e).value() : EstimateResult{};
}

std::int64_t saved(const EstimateRequest& r) { return run(r).activation_detail.saved.count(); }

// bitsandbytes 4-bit storage of one [rows, cols] weight: packed 4-bit values,
// the 16-entry fp32 code, and the absmax per block of 64 (fp32; with double
// quantization uint8 codes + an fp32 absmax per 256 codes + the 256-entry fp32
// dynamic map + the fp32 mean).
std::int64_t bnb4(std::int64_t rows, std::int64_t cols, bool dq) {
    const std::int64_t n = rows * cols, blocks = (n + 63) / 64;
    return (n + 1) / 2 + 16 * 4 + (dq ? blocks + 4 * ((blocks + 255) / 256) + 256 * 4 + 4 : 4 * blocks);
}

// The quantized linears of one Llama layer: q, k, v, o [h, h], gate and up [I, h], down [h, I].
std::int64_t layer_bnb4(bool dq) { return 4 * bnb4(kHidden, kHidden, dq) + 3 * bnb4(kInter, kHidden, dq); }

// Parameters that stay 16-bit: embeddings, lm_head, two RMSNorms per layer and the final one.
constexpr std::int64_t kUnquantized = 2 * kVocab * kHidden + (2 * kLayers + 1) * kHidden;

}  // namespace

// Frozen linears save nothing of their input; LLM.int8's MatMul8bitLt keeps its
// input whenever it requires grad (the residual stream after the first adapter).
// The unique inputs of a layer's quantized linears: the attention norm's output
// (q, k, v: already saved by q_proj's adapter), the attention output (o_proj),
// the MLP norm's output (gate, up) and the MLP product (down_proj).
TEST(QLora, Int8LayersKeepTheirInputs) {
    const std::int64_t b = 2, s = 512;
    EstimateRequest nf4 = llama_job(Mode::QLora, b, s);
    EstimateRequest int8 = nf4;
    int8.quant = Quant::Int8;
    const std::int64_t per_layer = b * s * (kHidden + kHidden + kInter) * 2;  // bf16
    EXPECT_EQ(saved(int8) - saved(nf4), kLayers * per_layer);
    // Its backward casts the int8 weight back to bf16 for the input gradient
    // (the largest: [I, h]); its forward multiplies in int8. Inference: nothing.
    const EstimateResult e = run(int8);
    EXPECT_EQ(e.job->dequant.count(), kInter * kHidden * 2);
    EXPECT_FALSE(e.job->dequant_in_forward);
    EstimateRequest infer = llama_job(Mode::Infer, b, s);
    infer.quant = Quant::Int8;
    EXPECT_EQ(run(infer).job->dequant.count(), 0);
}

// bitsandbytes >= 0.43.2: MatMul4Bit keeps only the packed weight; before it
// kept the input as LLM.int8 does (--bnb-4bit-saves-input).
TEST(QLora, Legacy4bitKeepsInputs) {
    const std::int64_t b = 4, s = 2048;
    EstimateRequest now = llama_job(Mode::QLora, b, s);
    EstimateRequest old = now;
    old.bnb_4bit_saves_input = true;
    const std::int64_t per_layer = b * s * (2 * kHidden + kInter) * 2;
    EXPECT_EQ(saved(old) - saved(now), kLayers * per_layer);
    // A quantized lm_head (--quantize-head) keeps the final norm's output too.
    EstimateRequest head = old;
    head.quantize_head = true;
    EXPECT_EQ(saved(head) - saved(old), b * s * kHidden * 2);
    // With the current release a quantized lm_head keeps nothing more.
    EstimateRequest head_now = now;
    head_now.quantize_head = true;
    EXPECT_EQ(saved(head_now), saved(now));
}

// LoRA dropout p > 0: each adapter (q_proj and v_proj) keeps its own dropped
// bf16 copy of the attention norm's output and a 1-byte mask; the norm output
// itself, saved once for both adapters when p = 0, is no longer kept.
TEST(QLora, DropoutKeepsACopyAndAMaskPerAdapter) {
    const std::int64_t b = 4, s = 1024;
    EstimateRequest p0 = llama_job(Mode::QLora, b, s);
    EstimateRequest p1 = p0;
    p1.lora_dropout = 0.05;
    const std::int64_t bsh = b * s * kHidden;
    EXPECT_EQ(saved(p1) - saved(p0), kLayers * (2 * (bsh * 2 + bsh * 1) - bsh * 2));
    // An explicit 0 is PEFT's nn.Identity: nothing changes.
    EstimateRequest zero = p0;
    zero.lora_dropout = 0.0;
    EXPECT_EQ(saved(zero), saved(p0));
}

// PEFT's lora.Linear casts its input to the adapters' dtype (fp32 under
// autocast): each adapter's lora_A then saves its own bf16 cast; the
// bitsandbytes wrappers skip the cast under autocast and share the input.
TEST(QLora, LoraAdaptersCastTheirInput) {
    const std::int64_t b = 2, s = 1024;
    const std::int64_t bsh = b * s * kHidden;
    EXPECT_EQ(saved(llama_job(Mode::Lora, b, s)) - saved(llama_job(Mode::QLora, b, s)), kLayers * (2 * bsh * 2 - bsh * 2));
    // Pure bf16 (bf16 adapters): no cast, the input is shared as under QLoRA.
    EstimateRequest lora = llama_job(Mode::Lora, b, s), q = llama_job(Mode::QLora, b, s);
    lora.precision = q.precision = Precision::BF16;
    EXPECT_EQ(saved(lora), saved(q));
}

// nf4 / fp4 storage with and without double quantization (inference: no adapters).
TEST(QLora, FourBitStorageVariants) {
    EstimateRequest r = llama_job(Mode::Infer, 1, 128);
    r.quant = Quant::NF4;
    const std::int64_t dq = run(r).job->weights.count();
    EXPECT_EQ(dq, kUnquantized * 2 + kLayers * layer_bnb4(true));
    r.double_quant = false;
    const std::int64_t plain = run(r).job->weights.count();
    EXPECT_EQ(plain, kUnquantized * 2 + kLayers * layer_bnb4(false));
    r.quant = Quant::FP4;
    EXPECT_EQ(run(r).job->weights.count(), plain);  // fp4 differs from nf4 in its code values only
    r.double_quant = true;
    EXPECT_EQ(run(r).job->weights.count(), dq);
}

// --quantize-head (LitGPT): lm_head held in 4 bits and dequantized for its matmul.
TEST(QLora, QuantizedHead) {
    EstimateRequest r = llama_job(Mode::Infer, 1, 128);
    r.quant = Quant::NF4;
    const EstimateResult base = run(r);
    r.quantize_head = true;
    const EstimateResult head = run(r);
    EXPECT_EQ(head.job->weights.count() - base.job->weights.count(), bnb4(kVocab, kHidden, true) - kVocab * kHidden * 2);
    EXPECT_EQ(head.job->dequant.count(), kInter * kHidden * 2);  // the largest layer weight, bf16
    EXPECT_EQ(head.job->head_dequant.count(), kVocab * kHidden * 2);
    EXPECT_EQ(base.job->head_dequant.count(), 0);
}

// --params N --quant nf4: all N parameters are one quantized linear weight.
TEST(QLora, ParamsOnlyAppliesTheQuantization) {
    const std::int64_t n = 7'000'000'000;
    EstimateRequest r;
    r.params_count = n;
    r.mode = Mode::Infer;
    r.quant = Quant::NF4;
    const EstimateResult e = run(r);
    EXPECT_EQ(e.job->weights.count(), bnb4(1, n, true));
    bool said = false;
    for (const auto& a : e.assumptions) said = said || a.find("every parameter counted as a quantized linear weight") != std::string::npos;
    EXPECT_TRUE(said);
    r.mode = Mode::QLora;
    r.quant.reset();  // qlora's default: nf4
    r.double_quant = false;
    EXPECT_EQ(run(r).job->weights.count(), bnb4(1, n, false));
    r.quant = Quant::Int8;  // int8 + one fp32 row scale
    EXPECT_EQ(run(r).job->weights.count(), n + 4);
}

// The simulated step follows the same rules: its peak stays within 5% of the
// analytic one for every variant, and keeping the 4-bit inputs raises both.
TEST(QLora, SimulatorAgrees) {
    auto both = [](EstimateRequest r) {
        r.analytic = true;
        const auto a = estimate(r);
        r.analytic = false;
        const auto s = simulate_estimate(r);
        EXPECT_TRUE(a.ok() && s.ok());
        return std::pair<double, double>{static_cast<double>(a.value().per_gpu.peak_allocated.count()),
                                         static_cast<double>(s.value().per_gpu.peak_allocated.count())};
    };
    const EstimateRequest base = llama_job(Mode::QLora, 2, 1024);
    std::vector<EstimateRequest> variants(6, base);
    variants[1].quant = Quant::Int8;
    variants[2].bnb_4bit_saves_input = true;
    variants[3].lora_dropout = 0.1;
    variants[4].mode = Mode::Lora;
    variants[5].quantize_head = true;
    variants[5].quant = Quant::FP4;
    variants[5].double_quant = false;
    for (std::size_t i = 0; i < variants.size(); ++i) {
        const auto [a, s] = both(variants[i]);
        EXPECT_NEAR(s / a, 1.0, 0.05) << "variant " << i;
    }
    const auto [a0, s0] = both(variants[0]);
    const auto [a2, s2] = both(variants[2]);
    EXPECT_GT(a2, a0);
    EXPECT_GT(s2, s0);
}

namespace {

// t5-small (data/presets/configs/t5-small.json): d_model 512, 8 heads of 64, vocab 32128.
constexpr std::int64_t kT5Inner = 8 * 64, kT5Vocab = 32128;

EstimateRequest t5_job(std::int64_t batch, std::int64_t seq, std::int64_t dec) {
    EstimateRequest r;
    r.model = "t5-small";
    r.mode = Mode::Train;
    r.batch = batch;
    r.seq = seq;
    r.decoder_seq = dec;
    r.analytic = true;
    return r;
}

const BlockActivations& block(const EstimateResult& e, const std::string& prefix, bool repeated) {
    for (const auto& b : e.activation_detail.blocks)
        if (b.block.rfind(prefix, 0) == 0 && (b.repeat > 1) == repeated) return b;
    ADD_FAILURE() << "no block " << prefix;
    static const BlockActivations none;
    return none;
}

}  // namespace

// Encoder-decoder: the decoder's tokens follow --decoder-seq, the encoder's --seq.
TEST(DecoderSeq, DecoderTensorsFollowTheDecoderLength) {
    const std::int64_t b = 2;
    // The LM head reads decoder tokens: bf16 logits [b, s_dec, V] under amp-bf16.
    EXPECT_EQ(run(t5_job(b, 512, 128)).activation_detail.logits.count(), b * 128 * kT5Vocab * 2);
    // Encoder blocks do not see the decoder length.
    const EstimateResult short_dec = run(t5_job(b, 512, 64)), long_dec = run(t5_job(b, 512, 256));
    EXPECT_EQ(block(short_dec, "encoder.layers", true).per_instance, block(long_dec, "encoder.layers", true).per_instance);
    EXPECT_EQ(block(short_dec, "encoder.layers", false).total, block(long_dec, "encoder.layers", false).total);
    // Per encoder token, a decoder layer keeps (flash attention, full training,
    // amp-bf16): cross-attention k and v (bf16, saved by SDPA) and the k and v
    // projections' own bf16 casts of the fp32 encoder output: 4 x inner x 2 bytes.
    const EstimateResult enc256 = run(t5_job(b, 256, 128)), enc512 = run(t5_job(b, 512, 128));
    EXPECT_EQ(block(enc512, "decoder.layers", true).per_instance.count() - block(enc256, "decoder.layers", true).per_instance.count(),
              b * 256 * 4 * kT5Inner * 2);
    // Unset, the decoder runs --seq tokens (and the assumption says so).
    EstimateRequest unset = t5_job(b, 256, 0);
    unset.decoder_seq.reset();
    const EstimateResult same = run(unset);
    EXPECT_EQ(same.activation_detail.saved, run(t5_job(b, 256, 256)).activation_detail.saved);
    bool said = false;
    for (const auto& a : same.assumptions) said = said || a.find("decoder length = encoder length") != std::string::npos;
    EXPECT_TRUE(said);
}

TEST(DecoderSeq, SimulatorAgrees) {
    auto simulated = [](EstimateRequest r) {
        r.analytic = false;
        const auto sim = simulate_estimate(r);
        EXPECT_TRUE(sim.ok());
        return sim.ok() ? static_cast<double>(sim.value().per_gpu.peak_allocated.count()) : 0.0;
    };
    for (Attention att : {Attention::Flash, Attention::Eager})
        for (auto [s, d] : {std::pair<std::int64_t, std::int64_t>{512, 64}, {128, 512}, {256, 256}}) {
            EstimateRequest r = t5_job(16, s, d);  // activations dominate: the peak is in backward
            r.attention = att;
            const auto a = estimate(r);
            ASSERT_TRUE(a.ok());
            EXPECT_EQ(a.value().per_gpu.peak_phase, "backward");
            EXPECT_NEAR(simulated(r) / static_cast<double>(a.value().per_gpu.peak_allocated.count()), 1.0, 0.05)
                << "seq " << s << " decoder " << d << " " << to_string(att);
        }
    // The simulated step itself follows the decoder length.
    EXPECT_GT(simulated(t5_job(16, 128, 512)), simulated(t5_job(16, 128, 128)));
    // LoRA with dropout on an encoder-decoder model.
    EstimateRequest lora = t5_job(16, 512, 64);
    lora.mode = Mode::Lora;
    lora.lora_dropout = 0.1;
    const auto a = estimate(lora);
    ASSERT_TRUE(a.ok());
    EXPECT_NEAR(simulated(lora) / static_cast<double>(a.value().per_gpu.peak_allocated.count()), 1.0, 0.05);
}

TEST(QLora, CliFlags) {
    const auto ok = test::run_cli(
        "estimate llama-2-7b --mode qlora --quant fp4 --no-double-quant --quantize-head --lora-dropout 0.05 "
        "--bnb-4bit-saves-input --batch 1 --seq 256 --analytic --format json");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    const auto ignored = test::run_cli("estimate llama-2-7b --mode qlora --decoder-seq 64 --batch 1 --seq 256 --analytic");
    EXPECT_EQ(ignored.exit_code, 0) << ignored.err;
    EXPECT_NE((ignored.out + ignored.err).find("--decoder-seq is ignored"), std::string::npos);
    const auto bad = test::run_cli("estimate llama-2-7b --mode qlora --lora-dropout 1.5 --analytic");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("lora-dropout"), std::string::npos) << bad.err;
}
