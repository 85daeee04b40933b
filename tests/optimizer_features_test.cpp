// Issue 12: paged optimizers, the optimizer in backward, FSDP1's flat-parameter
// gradients under LoRA, FSDP no_sync and the load phase. Every expected number
// is computed here from the model's dimensions and the frameworks' rules
// (memory/features.hpp cites them), never copied from gpumem's output.
#include <gtest/gtest.h>

#include <cmath>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/features.hpp"
#include "gpumem/memory/fields.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// Llama-3-8B (data/presets/configs/llama-3-8b.json): hidden 4096, 32 layers,
// 32 heads of 128, 8 key/value heads, MLP 14336, vocabulary 128256, untied.
constexpr std::int64_t kH = 4096, kL = 32, kKv = 8 * 128, kI = 14336, kV = 128256;
// One decoder layer: q, k, v, o, gate, up, down and two RMSNorm weights.
constexpr std::int64_t kLayer = kH * kH + kKv * kH + kKv * kH + kH * kH + 3 * kI * kH + 2 * kH;
constexpr std::int64_t kLlama3Params = 2 * kV * kH + kL * kLayer + kH;  // embeddings, lm_head, layers, final norm

// SmolLM2-135M: hidden 576, 30 layers, 9 heads of 64, 3 key/value heads, MLP
// 1536, vocabulary 49152, tied embeddings.
constexpr std::int64_t kSH = 576, kSL = 30, kSKv = 3 * 64, kSI = 1536, kSV = 49152;
constexpr std::int64_t kSmolParams = kSV * kSH + kSL * (2 * kSH * kSH + 2 * kSKv * kSH + 3 * kSI * kSH + 2 * kSH) + kSH;

EstimateRequest job(const std::string& model) {
    EstimateRequest r;
    r.model = model;
    r.analytic = true;
    return r;
}

EstimateResult ok(const Result<EstimateResult>& r) {
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
}

EstimateResult analytic(EstimateRequest r) {
    r.analytic = true;
    return ok(estimate(r));
}

EstimateResult simulated(EstimateRequest r) {
    r.analytic = false;
    return ok(simulate_estimate(r));
}

Bytes row(const EstimateResult& r, const std::string& key) { return test::breakdown_row(r, key); }
Bytes rows_sum(const EstimateResult& r) { return test::breakdown_sum(r); }

Error error_of(const EstimateRequest& r) {
    auto e = estimate(r);
    EXPECT_FALSE(e.ok());
    return e.ok() ? Error{} : e.error();
}

}  // namespace

TEST(OptimizerFeatures, ModelDimensionsMatchThePresets) {
    // The constants above are the presets' own parameter counts.
    EXPECT_EQ(analytic(job("llama-3-8b")).params.total, kLlama3Params);
    EXPECT_EQ(analytic(job("smollm2-135m")).params.total, kSmolParams);
}

// ---- paged optimizers ----------------------------------------------------------

// bitsandbytes Optimizer2State.init_state: 8-bit states for tensors of at least
// min_8bit_size = 4096 elements, one uint8 byte per element for state1 and
// state2 and an fp32 absmax per 256-element block for each; smaller tensors
// keep fp32 states. get_state_buffer pages state1/state2 of tensors of at
// least 1e5 elements; the absmax stays in PyTorch's allocator.
TEST(OptimizerFeatures, PagedStateSizes) {
    const TrainTensor big{{4096, 4096}, 1}, mid{{50000}, 1}, small{{1000}, 1};
    const std::int64_t n = 4096LL * 4096;
    EXPECT_EQ(optimizer_bytes(Optimizer::PagedAdamW8bit, big, DType::BF16).count(), 2 * n + 2 * 4 * (n / 256));
    EXPECT_EQ(paged_state_bytes(Optimizer::PagedAdamW8bit, big).count(), 2 * n);
    EXPECT_EQ(optimizer_bytes(Optimizer::PagedAdamW8bit, mid, DType::F32).count(), 2 * 50000 + 2 * 4 * ((50000 + 255) / 256));
    EXPECT_EQ(paged_state_bytes(Optimizer::PagedAdamW8bit, mid).count(), 0);  // < 1e5: torch.zeros_like
    EXPECT_EQ(optimizer_bytes(Optimizer::PagedAdamW8bit, small, DType::F32).count(), 2 * 4 * 1000);
    // PagedAdamW (optim_bits 32): fp32 state1 + state2 whatever the parameter dtype.
    EXPECT_EQ(optimizer_bytes(Optimizer::PagedAdamW, big, DType::BF16).count(), 8 * n);
    EXPECT_EQ(paged_state_bytes(Optimizer::PagedAdamW, big).count(), 8 * n);
    EXPECT_EQ(paged_state_bytes(Optimizer::PagedAdamW, TrainTensor{{99999}, 1}).count(), 0);
    EXPECT_EQ(paged_state_bytes(Optimizer::PagedAdamW, TrainTensor{{100000}, 3}).count(), 3 * 8 * 100000);
    // Nothing else pages.
    EXPECT_EQ(paged_state_bytes(Optimizer::AdamW8bit, big).count(), 0);
    EXPECT_EQ(paged_state_bytes(Optimizer::AdamW, big).count(), 0);
    EXPECT_EQ(to_string(Optimizer::PagedAdamW8bit), std::string("paged-adamw8bit"));
    EXPECT_EQ(parse_optimizer("paged-adamw").value(), Optimizer::PagedAdamW);
}

// QLoRA of Llama-3-8B with rank-64 adapters on q_proj and v_proj (PEFT's
// default targets) and paged 8-bit AdamW: per layer q.A [64, 4096], q.B
// [4096, 64] and v.A [64, 4096] have 262144 elements (paged: 2 bytes each),
// v.B [1024, 64] has 65536 (< 1e5: in the allocator, 8-bit).
TEST(OptimizerFeatures, PagedQloraStatesOutsideTheAllocator) {
    EstimateRequest r = job("llama-3-8b");
    r.mode = Mode::QLora;
    r.lora_rank = 64;
    r.batch = 1;
    r.seq = 1024;
    r.optimizer = Optimizer::PagedAdamW8bit;
    const std::int64_t big = 64 * kH, vb = kKv * 64;
    const std::int64_t paged = kL * 3 * 2 * big;
    const std::int64_t in_allocator = kL * (3 * 2 * 4 * (big / 256) + 2 * vb + 2 * 4 * (vb / 256));
    for (bool sim : {false, true}) {
        const EstimateResult p = sim ? simulated(r) : analytic(r);
        SCOPED_TRACE(sim ? "simulated" : "analytic");
        EXPECT_EQ(p.per_gpu.paged_optimizer_states.count(), paged);
        EXPECT_EQ(row(p, "paged_optimizer_states").count(), paged);
        if (!sim) {
            EXPECT_EQ(p.per_gpu.optimizer_states.count(), in_allocator);
        }
        // In nvidia-smi's total, not in torch.cuda.max_memory_reserved().
        EXPECT_EQ(p.per_gpu.total_device, p.per_gpu.peak_reserved + p.per_gpu.cuda_context + Bytes(paged));
        EXPECT_EQ(rows_sum(p), p.per_gpu.total_device);
        bool said = false;
        for (const auto& a : p.assumptions) said = said || a.find("pages them out") != std::string::npos;
        EXPECT_TRUE(said) << "the assumptions say that paged states page out under pressure";
    }
    // The same job with bitsandbytes' unpaged AdamW8bit holds every state in the allocator.
    EstimateRequest plain = r;
    plain.optimizer = Optimizer::AdamW8bit;
    const EstimateResult a = analytic(plain), p = analytic(r);
    EXPECT_EQ(a.per_gpu.optimizer_states.count(), paged + in_allocator);
    EXPECT_EQ(a.per_gpu.paged_optimizer_states.count(), 0);
    EXPECT_EQ((a.per_gpu.peak_allocated - p.per_gpu.peak_allocated).count(), paged);
}

// ---- optimizer in backward -----------------------------------------------------

TEST(OptimizerFeatures, InBackwardRejectsGradientAccumulation) {
    EstimateRequest r = job("llama-3-8b");
    r.optimizer_in_backward = true;
    r.grad_accum = 2;
    const Error e = error_of(r);
    EXPECT_EQ(e.field, "optimizer-in-backward");
    EXPECT_NE(e.message.find("--grad-accum 1"), std::string::npos) << e.message;
    r.grad_accum = 1;
    r.parallel.gpus = 8;  // DDP
    EXPECT_EQ(error_of(r).field, "optimizer-in-backward");
    r.parallel.fsdp = Fsdp::Full;  // torchtune's FSDP2
    EXPECT_TRUE(estimate(r).ok());
    r.parallel.fsdp_version = 1;
    EXPECT_EQ(error_of(r).field, "optimizer-in-backward");
}

// Live bytes of the first step (no allocator): with the optimizer in
// backward, the states are made during backward and no gradient is left at
// its end; without it, every gradient is left and the states come later.
TEST(OptimizerFeatures, InBackwardLeavesNoGradients) {
    EstimateRequest r = job("smollm2-135m");
    r.precision = Precision::BF16;
    r.optimizer = Optimizer::AdamW;
    r.batch = 1;
    r.seq = 256;
    r.allocator = AllocatorKind::None;
    const std::int64_t grads = 2 * kSmolParams, states = 2 * 2 * kSmolParams;  // bf16 gradients; bf16 exp_avg + exp_avg_sq
    const std::int64_t slack = 1 << 20;  // the batch's token ids and labels, the loss
    const EstimateResult normal = simulated(r);
    r.optimizer_in_backward = true;
    const EstimateResult inbwd = simulated(r);
    const auto& n = *normal.simulation;
    const auto& i = *inbwd.simulation;
    const std::int64_t n_bwd = (n.after_backward - Bytes(2 * kSmolParams)).count();  // less the bf16 weights
    const std::int64_t i_bwd = (i.after_backward - Bytes(2 * kSmolParams)).count();
    EXPECT_GE(n_bwd, grads);
    EXPECT_LE(n_bwd, grads + slack);
    EXPECT_GE(i_bwd, states);
    EXPECT_LE(i_bwd, states + slack);
    EXPECT_EQ(i.after_optimizer, i.after_backward) << "optimizer.step() has nothing left to do";
    EXPECT_LE(row(inbwd, "gradients").count(), 0) << "no gradients at the simulated peak (a zero row is left out)";
}

// Llama-3-8B, bf16, AdamW (foreach), batch 2 x 2048. Without the optimizer in
// backward the optimizer step holds W + O + G + the foreach temporaries =
// 2 + 4 + 2 + 2 bytes per parameter; in backward it holds only W + O (the
// step is empty), and the backward never holds more than one tensor's
// gradient and update (at most the largest, kV x kH, twice in bf16) beside
// the weights, states and activations.
TEST(OptimizerFeatures, InBackwardLlama3Peak) {
    EstimateRequest r = job("llama-3-8b");
    r.precision = Precision::BF16;
    r.batch = 2;
    r.seq = 2048;
    const EstimateResult normal = simulated(r);
    r.optimizer_in_backward = true;
    const EstimateResult inbwd = simulated(r), inbwd_a = analytic(r);
    const std::int64_t N = kLlama3Params;
    auto phase_peak = [](const EstimateResult& e, const std::string& phase, int step) {
        for (const auto& p : e.simulation->phases)
            if (p.phase == phase && p.step == step) return p.peak_allocated.count();
        return std::int64_t{-1};
    };
    const std::int64_t small = std::int64_t{256} << 20;  // cuBLAS workspaces, the batch, the loss
    EXPECT_GE(phase_peak(normal, "optimizer", 1), 10 * N);
    EXPECT_GE(phase_peak(inbwd, "optimizer", 1), 6 * N);
    EXPECT_LE(phase_peak(inbwd, "optimizer", 1), 6 * N + small);
    EXPECT_EQ(row(inbwd_a, "gradients").count(), 0);
    EXPECT_EQ((inbwd_a.per_gpu.weights + inbwd_a.per_gpu.optimizer_states).count(), 6 * N);
    // The backward's peak: never above the normal step's backward by more than
    // the largest tensor's gradient and foreach temporary.
    const std::int64_t in_flight = 2 * (2 * kV * kH);
    EXPECT_LE(phase_peak(inbwd, "backward", 1), phase_peak(normal, "backward", 1) + in_flight);
    // The analytic view agrees with the simulation within the invariants' 5%.
    const double an = static_cast<double>(inbwd_a.per_gpu.peak_allocated.count());
    EXPECT_NEAR(static_cast<double>(inbwd.per_gpu.peak_allocated.count()), an, 0.05 * an);
}

// ---- FSDP1 flat parameters with LoRA, FSDP no_sync ------------------------------

// FSDP1 wraps each decoder layer in one FlatParameter; with use_orig_params
// its requires_grad is the OR of its tensors', so LoRA's frozen base weights
// get (sharded) gradients too: per layer kLayer bf16 elements over 8 ranks.
TEST(OptimizerFeatures, Fsdp1LoraGradientsCoverTheFrozenWeights) {
    EstimateRequest r = job("llama-3-8b");
    r.mode = Mode::Lora;
    r.precision = Precision::BF16;
    r.batch = 1;
    r.seq = 1024;
    r.parallel.gpus = 8;
    r.parallel.fsdp = Fsdp::Full;
    const EstimateResult v2 = analytic(r);
    r.parallel.fsdp_version = 1;
    const EstimateResult v1 = analytic(r);
    EXPECT_EQ((v1.per_gpu.gradients - v2.per_gpu.gradients).count(), kL * (2 * kLayer / 8));
    // Simulated rank within 5% of the analytic one.
    const EstimateResult s = simulated(r);
    ASSERT_TRUE(s.parallel);
    for (const auto& st : s.parallel->stages)
        if (st.simulated) {
            const double an = static_cast<double>((st.allocated + s.per_gpu.cublas_workspace).count());
            EXPECT_NEAR(static_cast<double>(st.simulated_peak_allocated.count()), an, 0.05 * an);
        }
}

// no_sync / set_requires_gradient_sync(False): between micro-batches every
// rank keeps the full unsharded gradients (fp32 under amp-bf16: 4 bytes per
// parameter) instead of its 1/8 shard.
TEST(OptimizerFeatures, NoSyncKeepsFullGradients) {
    EstimateRequest r = job("smollm2-135m");
    r.batch = 1;
    r.seq = 512;
    r.grad_accum = 4;
    r.parallel.gpus = 8;
    r.parallel.fsdp = Fsdp::Full;
    const EstimateResult sync = analytic(r);
    r.parallel.no_sync = true;
    const EstimateResult nosync = analytic(r);
    EXPECT_EQ(row(nosync, "gradients").count(), 4 * kSmolParams);
    EXPECT_LE(row(sync, "gradients").count(), 4 * kSmolParams / 8 + (1 << 20));
    EXPECT_GT(nosync.per_gpu.peak_allocated, sync.per_gpu.peak_allocated + Bytes(4 * kSmolParams * 7 / 8 * 9 / 10));
    const EstimateResult s = simulated(r);
    for (const auto& st : s.parallel->stages)
        if (st.simulated) {
            const double an = static_cast<double>((st.allocated + s.per_gpu.cublas_workspace).count());
            EXPECT_NEAR(static_cast<double>(st.simulated_peak_allocated.count()), an, 0.05 * an);
        }
    // Without FSDP there is nothing to skip.
    r.parallel.fsdp = Fsdp::None;
    EXPECT_EQ(error_of(r).field, "no-sync");
}

// ---- load phase ----------------------------------------------------------------

// QLoRA: transformers hands each weight to bitsandbytes, which copies it to the
// GPU in 16 bits and quantizes it there: the largest linear (an MLP matrix,
// 14336 x 4096) in bf16 on top of the weights loaded so far.
TEST(OptimizerFeatures, LoadPhaseQlora) {
    EstimateRequest r = job("llama-3-8b");
    r.mode = Mode::QLora;
    r.batch = 1;
    r.seq = 512;
    const EstimateResult e = analytic(r);
    EXPECT_EQ(e.per_gpu.load_peak, e.per_gpu.weights + Bytes(2 * kI * kH));
    EXPECT_NE(e.per_gpu.peak_phase, "load");  // the step needs more
    r.load_dtype = LoadDtype::FP32;
    EXPECT_EQ(error_of(r).field, "load-dtype");
}

// Inference loaded without torch_dtype: the whole model in fp32 on the GPU,
// then cast to bf16 tensor by tensor (the largest, kV x kH, last): the load
// phase is the headline.
TEST(OptimizerFeatures, LoadPhaseFp32Headline) {
    EstimateRequest r = job("llama-3-8b");
    r.mode = Mode::Infer;
    r.precision = Precision::BF16;
    r.batch = 1;
    r.seq = 128;
    const EstimateResult steady = analytic(r);
    r.load_dtype = LoadDtype::FP32;
    for (bool sim : {false, true}) {
        const EstimateResult e = sim ? simulated(r) : analytic(r);
        SCOPED_TRACE(sim ? "simulated" : "analytic");
        const std::int64_t load = 4 * kLlama3Params + 2 * kV * kH;
        EXPECT_EQ(e.per_gpu.load_peak.count(), load);
        EXPECT_EQ(e.per_gpu.peak_phase, "load");
        EXPECT_EQ(e.per_gpu.total_device.count(), load + e.per_gpu.cuda_context.count());
        EXPECT_EQ(rows_sum(e), e.per_gpu.total_device);
        EXPECT_GT(row(e, "load_excess").count(), 0);
    }
    EXPECT_EQ(steady.per_gpu.load_peak.count(), 2 * kLlama3Params);  // bf16 tensors stream in, nothing in flight
    EXPECT_NE(steady.per_gpu.peak_phase, "load");
}

// ---- the request fields --------------------------------------------------------

TEST(OptimizerFeatures, RequestFields) {
    auto r = request_from_json({{"model", "gpt2"},
                                {"optimizer", "paged-adamw8bit"},
                                {"optimizer-in-backward", true},
                                {"fsdp_version", 1},
                                {"no_sync", true},
                                {"load_dtype", "fp32"}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value().optimizer, Optimizer::PagedAdamW8bit);
    EXPECT_TRUE(r.value().optimizer_in_backward);
    EXPECT_EQ(r.value().parallel.fsdp_version, 1);
    EXPECT_TRUE(r.value().parallel.no_sync);
    EXPECT_EQ(r.value().load_dtype, LoadDtype::FP32);
    const std::string cmd = request_to_command(r.value());
    for (const char* flag : {"--optimizer paged-adamw8bit", "--optimizer-in-backward", "--fsdp-version 1", "--no-sync", "--load-dtype fp32"})
        EXPECT_NE(cmd.find(flag), std::string::npos) << cmd;
    auto bad = request_from_json({{"model", "gpt2"}, {"fsdp_version", 3}});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().field, "fsdp-version");
}
