// Framework profiles (memory/framework.hpp, model/rewrite.hpp): each rule's
// effect against an independent count written here.
#include <gtest/gtest.h>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// A small Llama: h=256, 4 heads (kv 2), I=688, 3 layers, V=1000.
ModelGraph llama_like() { return test::llama_graph({}); }

EstimateRequest base() {
    EstimateRequest r;
    r.batch = 2;
    r.seq = 128;
    r.precision = Precision::BF16;
    r.attention = Attention::Flash;
    r.analytic = true;
    return r;
}

Bytes saved(const ModelGraph& g, const EstimateRequest& r) {
    auto e = estimate(g, r);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.value().activation_detail.saved;
}

}  // namespace

// Fused RMSNorm keeps x (bf16) and rstd instead of HF's fp32 copy, rstd and
// 16-bit normalized output: 4h bytes less per token per norm (2 per layer, 1
// final). Fused SwiGLU keeps gate and up but not silu(gate): 2I less. The
// attention output read as a view: o_proj's transpose copy (2h) is gone.
TEST(Frameworks, FusedKernelsSaveWhatTheKernelsSave) {
    const ModelGraph g = llama_like();
    EstimateRequest eager = base(), fused = base();
    fused.kernels = Kernels::Fused;
    const std::int64_t b = 2, s = 128, h = 256, I = 688, L = 3;
    const std::int64_t want = b * s * (L * (2 * 4 * h + 2 * I + 2 * h) + 4 * h);
    EXPECT_EQ((saved(g, eager) - saved(g, fused)).count(), want);
}

// Loss kernels under pure bf16: HF's full CE saves the fp32 log_softmax
// (4bsV); a fused kernel saves the bf16 logits and an fp32 logsumexp per row
// (2bsV + 4bs); fused linear CE saves the input gradient [b, s, h] in bf16
// instead of the output layer's input [b, s, h] (the weight gradient is
// computed in forward too) and no logits.
TEST(Frameworks, LossKernelsSavedBytes) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, h = 256, V = 1000;
    EstimateRequest full = base(), fused = base(), linear = base();
    fused.cross_entropy = CrossEntropy::Fused;
    linear.cross_entropy = CrossEntropy::FusedLinear;
    const Bytes f = saved(g, full);
    EXPECT_EQ((f - saved(g, fused)).count(), 4 * b * s * V - (2 * b * s * V + 4 * b * s));
    EXPECT_EQ((f - saved(g, linear)).count(), 4 * b * s * V + 2 * b * s * h - 2 * b * s * h);
}

// Megatron mixed precision: bf16 weights (2), fp32 main gradients (4), fp32
// main weights and Adam moments (12): 18 bytes per parameter (Korthikanti et
// al. 2022 §2; Megatron-LM arguments.py). DeepSpeed bf16: bf16 weights and
// gradients (2 + 2) with fp32 master and moments (12): 16.
TEST(Frameworks, PrecisionPoliciesModelStates) {
    const ModelGraph g = llama_like();
    const std::int64_t n = g.total_params();
    for (auto [fw, per] : {std::pair{Framework::Megatron, 18}, std::pair{Framework::DeepSpeed, 16}}) {
        EstimateRequest r = base();
        r.framework = fw;
        auto e = estimate(g, r);
        ASSERT_TRUE(e.ok()) << e.error().message;
        const auto& p = e.value().per_gpu;
        EXPECT_EQ((p.weights + p.gradients + p.optimizer_states).count(), per * n) << to_string(fw);
    }
}

// torch.autocast saves a 16-bit copy of every weight for backward; FSDP2's
// policy (torchtitan) keeps none across layers.
TEST(Frameworks, AutocastWeightCopiesOnlyUnderAutocast) {
    const ModelGraph g = llama_like();
    EstimateRequest hf = base(), titan = base();
    hf.precision = titan.precision = Precision::AmpBF16;
    titan.framework = Framework::Torchtitan;
    titan.cross_entropy = CrossEntropy::Full;
    titan.recompute = Recompute::None;
    auto a = estimate(g, hf), t = estimate(g, titan);
    ASSERT_TRUE(a.ok() && t.ok());
    EXPECT_GT(a.value().activation_detail.autocast_weight_casts, Bytes(0));
    EXPECT_EQ(t.value().activation_detail.autocast_weight_casts, Bytes(0));
}

// A framework refuses a precision it cannot run, naming its own setting.
TEST(Frameworks, UnsupportedPrecisionIsAnError) {
    const ModelGraph g = llama_like();
    EstimateRequest r = base();
    r.framework = Framework::Torchtune;
    r.precision = Precision::AmpBF16;
    auto e = estimate(g, r);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "precision");
    EXPECT_NE(e.error().message.find("dtype: bf16"), std::string::npos) << e.error().message;
}

// Defaults come from the profile; what the user sets wins.
TEST(Frameworks, ProfileDefaultsAndOverrides) {
    const ModelGraph g = llama_like();
    EstimateRequest r = base();
    r.framework = Framework::LlamaFactory;
    auto j = resolve_job(g, r);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j.value().req.recompute, Recompute::Full);  // gradient checkpointing on by default
    r.recompute = Recompute::None;
    j = resolve_job(g, r);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j.value().req.recompute, Recompute::None);
    EstimateRequest n = base();
    n.framework = Framework::NanoGPT;
    n.precision.reset();
    j = resolve_job(g, n);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j.value().req.precision, Precision::AmpBF16);
    EXPECT_EQ(j.value().framework.logits, LogitsLifetime::Kept);
}

// Every N-th layer checkpointed: ceil(L/N) layers keep only their input, the
// others everything; offloaded inputs leave nothing of the checkpointed layers.
TEST(Frameworks, RecomputeEveryAndOffload) {
    const ModelGraph g = llama_like();
    EstimateRequest none = base(), full = base(), every = base(), off = base();
    full.recompute = every.recompute = off.recompute = Recompute::Full;
    every.recompute_every = 2;  // layers 0 and 2 of 3
    off.activation_offload = true;
    auto one = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return e.value().activation_detail.blocks[1].total;
    };
    const Bytes layer_all = one(none).ceil_div(3);  // one layer's saves
    const Bytes input = Bytes(2 * 2 * 128 * 256);  // one layer's bf16 input
    EXPECT_EQ(one(full), input * 3);
    EXPECT_EQ(one(every), input * 2 + layer_all);
    EXPECT_EQ(one(off), Bytes(0));
    EstimateRequest bad = base();
    bad.activation_offload = true;
    auto e = estimate(g, bad);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "activation-offload");
}

// The analytic path and the simulator agree for every framework's defaults.
TEST(Frameworks, AnalyticAgreesWithSimulatorForEveryProfile) {
    const ModelGraph g = llama_like();
    for (int f = 0; f < 10; ++f) {
        EstimateRequest r = base();
        r.framework = static_cast<Framework>(f);
        r.precision.reset();
        r.analytic = true;
        auto a = estimate(g, r);
        r.analytic = false;
        auto e = simulate_estimate(g, r);
        ASSERT_TRUE(a.ok() && e.ok()) << to_string(*r.framework);
        const double an = static_cast<double>(a.value().per_gpu.peak_allocated.count());
        const double si = static_cast<double>(e.value().per_gpu.peak_allocated.count());
        EXPECT_NEAR(si / an, 1.0, 0.05) << request_to_command(r) << " (" << to_string(*r.framework) << ")";
    }
}

// A compiled loss is one Inductor kernel: no fp32 log_softmax (4bsV) is kept,
// the 16-bit logits (2bsV) and an fp32 logsumexp per row (4bs) are.
TEST(Frameworks, CompiledLossKeepsLogitsAndLogsumexp) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, V = 1000;
    EstimateRequest eager = base(), compiled = base();
    compiled.compile = true;
    compiled.kernels = Kernels::Eager;
    // compile also fuses the layers' pointwise ops: compare the head block only.
    auto head = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return e.value().activation_detail.blocks.back().total;
    };
    const std::int64_t h = 256;
    // The final norm is fused too (4h per token less), the loss as above.
    EXPECT_EQ((head(eager) - head(compiled)).count(), 4 * b * s * V - (2 * b * s * V + 4 * b * s) + 4 * b * s * h);
}

// torchtitan shards FSDP over dp x cp (parallel_dims.py L386): with 8 GPUs as
// cp 4 x dp 2, each rank keeps 1/8 of the fp32 parameters, not 1/2.
TEST(Frameworks, TorchtitanShardsOverContextParallelRanks) {
    const ModelGraph g = llama_like();
    EstimateRequest r = base();
    r.framework = Framework::Torchtitan;
    r.precision = Precision::AmpBF16;
    r.parallel.gpus = 8;
    r.parallel.cp = 4;
    r.parallel.fsdp = Fsdp::Full;
    auto j = resolve_job(g, r);
    ASSERT_TRUE(j.ok()) << j.error().message;
    EXPECT_EQ(j.value().layout.shard, 8);
    r.framework = Framework::HF;
    j = resolve_job(g, r);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j.value().layout.shard, 2);
}

namespace {

// A small Llama with a large vocabulary, so that the loss sets the peak.
ModelGraph wide_vocab(bool tied) { return test::llama_graph({.layers = 2, .vocab = 32000, .tied = tied}); }

Bytes peak(const ModelGraph& g, EstimateRequest r, bool analytic) {
    r.analytic = analytic;
    auto e = analytic ? estimate(g, r) : simulate_estimate(g, r);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.value().per_gpu.peak_allocated;
}

}  // namespace

// A per-chunk loss (torchtune's compiled compute_cross_entropy over 8 chunks)
// saves what the fused kernel saves (the bf16 logits and a logsumexp), but its
// backward runs chunk by chunk: each chunk's gradient is made as that chunk's
// saved logits are released, so at the loss's backward the saved logits and
// their gradient overlap by one chunk (2bsV/8), not the whole 2bsV. LoRA
// (frozen output layer) so that no weight gradient joins the moment.
TEST(Frameworks, ChunkedLossBackwardOverlapsOneChunk) {
    const ModelGraph g = wide_vocab(false);
    const std::int64_t b = 2, s = 512, V = 32000;
    EstimateRequest r = base();
    r.batch = b;
    r.seq = s;
    r.framework = Framework::Torchtune;
    r.compile = true;
    r.mode = Mode::Lora;
    r.lora_rank = 8;
    r.recompute = Recompute::Full;
    EstimateRequest fused = r, chunked = r;
    fused.cross_entropy = CrossEntropy::Fused;
    chunked.cross_entropy = CrossEntropy::Chunked;
    const std::int64_t logits = 2 * b * s * V;
    for (bool analytic : {true, false})
        EXPECT_EQ((peak(g, fused, analytic) - peak(g, chunked, analytic)).count(), logits - logits / 8) << (analytic ? "analytic" : "simulated");
}

// A loop that keeps the logits bound (--logits kept: `outputs = model(...)`
// stays alive until the next forward) holds them to the very end of backward:
// through the first layer's rebuild under full recompute and the tied
// embedding's gradient, where this job peaks (Qwen2-0.5B ties a 151,936 x 896
// embedding; ZeRO-1 on 2 GPUs so the step's optimizer phase is not the peak).
// Both views then differ from the same job with the logits freed by exactly
// the held bf16 logits, b x s x V x 2 bytes: exactly in the analytic view; in
// the simulator within 1 MiB, the largest remainder the caching allocator
// leaves unsplit in a large-pool block (kSmallSize, counted as allocated; the
// two jobs' blocks fall differently). The analytic view once left the logits
// out at those two moments: 7% under the simulator (found with grid seed 103).
TEST(Frameworks, KeptLogitsLiveToTheEndOfBackward) {
    const nlohmann::json body = {{"model", "qwen2-0.5b"}, {"batch", 3},         {"seq", 512},   {"precision", "amp-bf16"},
                                 {"optimizer", "adam"},   {"recompute", "full"}, {"cross-entropy", "fused"}, {"gpus", 2},
                                 {"zero", 1},             {"gpu-memory", "1024TiB"}};
    EstimateRequest kept = request_from_json(body).value(), freed = kept;
    kept.logits = LogitsLifetime::Kept;
    freed.logits = LogitsLifetime::Freed;
    const ModelGraph g = load_model(kept.model).value();
    const std::int64_t b = kept.batch, s = *kept.seq, V = g.transformer->vocab;  // 151,936 (Qwen2-0.5B's config.json)
    for (bool analytic : {true, false}) {
        kept.analytic = freed.analytic = analytic;
        auto k = analytic ? estimate(g, kept) : simulate_estimate(g, kept);
        auto f = analytic ? estimate(g, freed) : simulate_estimate(g, freed);
        ASSERT_TRUE(k.ok() && f.ok());
        EXPECT_NE(k.value().per_gpu.peak_phase.find("backward"), std::string::npos) << (analytic ? "analytic" : "simulated");
        const std::int64_t held = (k.value().per_gpu.peak_allocated - f.value().per_gpu.peak_allocated).count();
        if (analytic) EXPECT_EQ(held, b * s * V * 2);
        else EXPECT_NEAR(static_cast<double>(held), static_cast<double>(b * s * V * 2), static_cast<double>(MiB(1).count()));
    }
}

// The per-chunk output projection's weight gradient arrives in 8
// contributions, summed in autograd's input buffer in place from the second
// on (torch >= 2.0): the sum and one contribution, 2 x [V, h] in bf16, at once.
TEST(Frameworks, ChunkedHeadWeightGradientSumAndOneContribution) {
    const std::int64_t V = 32000, h = 256;
    for (bool tied : {false, true}) {
        const ModelGraph g = wide_vocab(tied);
        EstimateRequest r = base();
        r.framework = Framework::Torchtune;
        r.cross_entropy = CrossEntropy::Chunked;
        auto j = resolve_job(g, r);
        ASSERT_TRUE(j.ok()) << j.error().message;
        sim::StepTraceOptions so;
        so.cublas_workspaces = false;
        const sim::StepTrace st = sim::build_step_trace(g, j.value(), so);
        int found = 0;
        for (const auto& ev : st.trace.events)
            if (ev.kind == sim::TraceEvent::Kind::Alloc && ev.size == Bytes(2 * 2 * V * h) && ev.label >= 0 &&
                st.trace.labels[static_cast<std::size_t>(ev.label)] == "head (activation gradients)")
                ++found;
        EXPECT_EQ(found, 2) << (tied ? "tied" : "untied") << ": one per step";
    }
}

// LitGPT's own modeling code runs tanh-GELU as one kernel
// (F.gelu(approximate="tanh") in GptNeoxMLP, litgpt/model.py L812-816) saving
// its input; HF's NewGELUActivation also keeps tanh(.), 0.5x and 1 + tanh(.):
// three [b, s, I] bf16 tensors more per layer. LitGPT's fused qkv output is
// kept whole by the saved v (as many kv heads as heads: no copy), its q and k
// parts two [b, s, h] bf16 tensors more (litgpt/model.py L479, L538-539).
TEST(Frameworks, LitgptRunsTanhGeluAsOneKernel) {
    nlohmann::json c = {{"model_type", "phi"},     {"hidden_size", 256},   {"num_attention_heads", 4}, {"num_hidden_layers", 2},
                        {"intermediate_size", 1024}, {"vocab_size", 1000}, {"hidden_act", "gelu_new"}, {"partial_rotary_factor", 0.4}};
    auto g = load_hf_config_json(c, "test");
    ASSERT_TRUE(g.ok()) << g.error().message;
    const std::int64_t b = 2, s = 128, I = 1024, h = 256;
    EstimateRequest hf = base(), lit = base();
    lit.framework = Framework::LitGPT;
    auto layer = [&](const EstimateRequest& r) {
        auto e = estimate(g.value(), r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        for (const auto& blk : e.value().activation_detail.blocks)
            if (blk.block == "layers") return blk.per_instance;
        return Bytes(0);
    };
    EXPECT_EQ((layer(hf) - layer(lit)).count(), 3 * 2 * b * s * I - 2 * 2 * b * s * h);
}

// Axolotl's quantized LoRA runs PEFT's prepare_model_for_kbit_training
// (peft other.py L95-98): the parameters left unquantized (embedding, output
// layer, 2L + 1 RMSNorm weights) are cast to fp32, 2 bytes more each; the
// quantized linears are untouched. --kbit-upcast false is the 16-bit base.
TEST(Frameworks, AxolotlUpcastsUnquantizedParametersForKbitLora) {
    const ModelGraph g = llama_like();
    const std::int64_t h = 256, V = 1000, L = 3;
    EstimateRequest up = base();
    up.framework = Framework::Axolotl;
    up.mode = Mode::QLora;
    up.recompute = Recompute::Full;
    EstimateRequest plain = up;
    plain.kbit_upcast = false;
    auto weights = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return e.value().per_gpu.weights;
    };
    EXPECT_EQ((weights(up) - weights(plain)).count(), 2 * (2 * V * h + (2 * L + 1) * h));
    // The residual stream [b, s, h] is fp32: the L checkpointed layer inputs
    // and the final norm's saved input, 2 bytes more per element.
    EXPECT_EQ((saved(g, up) - saved(g, plain)).count(), 2 * 2 * 128 * h * (L + 1));
}

// LitGPT's LoRAQKVLinear applies one dropout to the fused QKV input for the
// q, k and v adapters (litgpt/lora.py L381-414); PEFT gives each adapter its
// own: per layer two dropped bf16 copies [b, s, h] and two bool masks fewer.
TEST(Frameworks, LitgptQkvAdaptersShareOneDropout) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, h = 256;
    EstimateRequest hf = base(), lit = base();
    for (EstimateRequest* r : {&hf, &lit}) {
        r->mode = Mode::Lora;
        r->lora_targets = {"q_proj", "k_proj", "v_proj"};
        r->lora_dropout = 0.05;
    }
    lit.framework = Framework::LitGPT;
    auto layer = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        for (const auto& blk : e.value().activation_detail.blocks)
            if (blk.block == "layers") return blk.per_instance;
        return Bytes(0);
    };
    EXPECT_EQ((layer(hf) - layer(lit)).count(), 2 * (2 + 1) * b * s * h);
}

// torchtune's model returns `self.output(h).float()` without chunked output
// (torchtune/modules/transformer.py L678-689): a compiled full loss reads,
// saves and differentiates the fp32 logits (4bsV), where a loss compiled with
// its own upcast (HF's ForCausalLMLoss inside the compiled model) keeps the
// 16-bit logits and an fp32 logsumexp per row (2bsV + 4bs).
TEST(Frameworks, TorchtuneCompiledFullLossKeepsFp32Logits) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, V = 1000;
    EstimateRequest hf = base(), tt = base();
    for (EstimateRequest* r : {&hf, &tt}) {
        r->compile = true;
        r->cross_entropy = CrossEntropy::Full;
    }
    tt.framework = Framework::Torchtune;
    auto head = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return e.value().activation_detail.blocks.back().total;
    };
    EXPECT_EQ((head(tt) - head(hf)).count(), 4 * b * s * V - (2 * b * s * V + 4 * b * s));
}

// torchtitan compiles the loss with the blocks (compile.components default
// ["model", "loss"]: torchtitan/config/configs.py@b5bcd76c66d0 L301,
// components/loss.py L245-252): a compiled full loss keeps the 16-bit logits
// and an fp32 logsumexp (2bsV + 4bs) instead of the fp32 copy's log_softmax
// (4bsV); --no-compile-loss is its 2024-12..2025-04 train.py, which compiled
// the blocks only. --compile-loss without --compile names the fix.
TEST(Frameworks, TorchtitanCompilesTheLossUnlessTold) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, V = 1000;
    EstimateRequest with_loss = base(), blocks_only = base();
    for (EstimateRequest* r : {&with_loss, &blocks_only}) {
        r->framework = Framework::Torchtitan;
        r->precision = Precision::AmpBF16;
        r->cross_entropy = CrossEntropy::Full;
        r->compile = true;
    }
    blocks_only.compile_loss = false;
    auto head = [&](const EstimateRequest& r) {
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        EXPECT_EQ(e.value().job->req.compile_loss, r.compile_loss.value_or(true));
        return e.value().activation_detail.blocks.back().total;
    };
    EXPECT_EQ((head(blocks_only) - head(with_loss)).count(), 4 * b * s * V - (2 * b * s * V + 4 * b * s));

    EstimateRequest bad = base();
    bad.compile_loss = true;
    auto e = estimate(g, bad);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "compile-loss");
}

// LitGPT's GPT has separate lm_head and wte modules, and its converter copies
// a tied checkpoint's embedding into lm_head (litgpt/model.py@00af8b0d9b43
// L25, L28; scripts/convert_hf_checkpoint.py L207): a tied model trains V x h
// more parameters under LitGPT. Untied models are unchanged.
TEST(Frameworks, LitgptTrainsTiedOutputLayerAsItsOwnWeight) {
    test::LlamaShape tied_shape;
    tied_shape.tied = true;
    const ModelGraph tied = test::llama_graph(tied_shape), untied = test::llama_graph({});
    const std::int64_t h = 256, V = 1000;
    auto params = [](const ModelGraph& g, Framework f, Mode m) {
        EstimateRequest r = base();
        r.framework = f;
        r.mode = m;
        r.precision = Precision::BF16;
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return std::make_pair(e.value().params.total, test::breakdown_row(e.value(), "weights"));
    };
    for (Mode m : {Mode::Train, Mode::Lora}) {
        const auto hf = params(tied, Framework::HF, m), lit = params(tied, Framework::LitGPT, m);
        EXPECT_EQ(lit.first - hf.first, V * h);
        EXPECT_EQ((lit.second - hf.second).count(), 2 * V * h);  // bf16
        EXPECT_EQ(params(untied, Framework::LitGPT, m).first, params(untied, Framework::HF, m).first);
    }
    EXPECT_EQ(params(tied, Framework::HF, Mode::Train).first, tied.total_params());
}

// LitGPT's bf16-mixed builds and loads the model in fp32 (litgpt/finetune/
// lora.py@26857050fe3f L131, L210-211, L236): a LoRA base stays fp32 (4 bytes
// a parameter, PEFT users load it in bf16: 2) and autocast casts each frozen
// weight per call; the matmul keeps the bf16 copy when its input requires grad.
// In layer 0, q/k/v read the normed embedding, which does not: every other
// linear's copy is kept.
TEST(Frameworks, LitgptBf16MixedKeepsAnFp32LoraBase) {
    const ModelGraph g = llama_like();
    auto run = [&](Framework f) {
        EstimateRequest r = base();
        r.framework = f;
        r.mode = Mode::Lora;
        r.precision = Precision::AmpBF16;
        r.lora_targets = {"q_proj", "v_proj"};
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        return std::move(e).value();
    };
    const EstimateResult lit = run(Framework::LitGPT), hf = run(Framework::HF);
    const std::int64_t h = 256, kv = 128, I = 688, V = 1000, L = 3;
    const std::int64_t layer = h * h + h * kv + h * kv + h * h + 3 * I * h;  // q, k, v, o, gate, up, down
    const std::int64_t qkv = h * h + 2 * h * kv;
    const std::int64_t base_params = g.total_params();
    EXPECT_EQ((test::breakdown_row(lit, "weights") - test::breakdown_row(hf, "weights")).count(), 2 * base_params);
    EXPECT_EQ(lit.activation_detail.autocast_weight_casts.count(), 2 * (L * layer - qkv + V * h));
    EXPECT_EQ(hf.activation_detail.autocast_weight_casts.count(), 0);
}

// LitGPT's LoRAQKVLinear with q and v adapted (not k): zero_pad scatters B's
// [b, s, q + v] output into zeros with index_copy_, whose backward keeps its
// source (litgpt/lora.py@26857050fe3f L321-326; derivatives.yaml index_copy:
// `source: grad.index_select(dim, index).expand_as(source)`): per layer
// 2 x b x s x (h + kv) bytes more than with q, k and v all adapted, beyond the
// k adapter's own lora_A output (b x s x r, bf16).
TEST(Frameworks, LitgptPartialQkvLoraKeepsTheZeroPadSource) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, h = 256, kv = 128, r = 8;
    auto layer = [&](std::vector<std::string> targets) {
        EstimateRequest q = base();
        q.framework = Framework::LitGPT;
        q.mode = Mode::Lora;
        q.lora_rank = r;
        q.lora_targets = std::move(targets);
        auto e = estimate(g, q);
        EXPECT_TRUE(e.ok()) << e.error().message;
        for (const auto& blk : e.value().activation_detail.blocks)
            if (blk.block == "layers") return blk.per_instance;
        return Bytes(0);
    };
    const Bytes qv = layer({"q_proj", "v_proj"}), qkv = layer({"q_proj", "k_proj", "v_proj"});
    EXPECT_EQ((qv - qkv).count(), 2 * b * s * (h + kv) - 2 * b * s * r);
}

// Megatron's --recompute-method / --recompute-num-layers (megatron/core/
// recompute.py@d98e8a64ddf3 L157-183) on 3 layers whose uncheckpointed saves
// are S each and whose input is I = b x s x h bf16: block 1 checkpoints layer
// 0 only (I + 2S kept); uniform 2 checkpoints the chunks [0, 1] and [2] (two
// inputs kept) and rebuilds two layers at once in backward (S more in flight
// than one layer at a time).
TEST(Frameworks, MegatronRecomputeMethodAndNumLayers) {
    const ModelGraph g = llama_like();
    const std::int64_t b = 2, s = 128, h = 256;
    auto layers = [&](Recompute rc, std::optional<RecomputeMethod> m, std::optional<std::int64_t> n) {
        EstimateRequest r = base();
        r.recompute = rc;
        r.recompute_method = m;
        r.recompute_num_layers = n;
        auto e = estimate(g, r);
        EXPECT_TRUE(e.ok()) << e.error().message;
        for (const auto& blk : e.value().activation_detail.blocks)
            if (blk.block == "layers") return blk;
        return BlockActivations{};
    };
    const auto none = layers(Recompute::None, std::nullopt, std::nullopt), full = layers(Recompute::Full, std::nullopt, std::nullopt);
    const Bytes S = none.per_instance, I = Bytes(2 * b * s * h);
    EXPECT_EQ(none.total, S * 3);
    EXPECT_EQ(full.total, I * 3);
    EXPECT_EQ(layers(Recompute::Full, RecomputeMethod::Block, 1).total, I + S * 2);
    EXPECT_EQ(layers(Recompute::Full, RecomputeMethod::Block, 3).total, I * 3);
    const auto uni = layers(Recompute::Full, RecomputeMethod::Uniform, 2);
    EXPECT_EQ(uni.total, I * 2);
    EXPECT_EQ(uni.recompute_transient - full.recompute_transient, S);

    EstimateRequest bad = base();
    bad.recompute = Recompute::Selective;
    bad.recompute_num_layers = 2;
    auto e = estimate(g, bad);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "recompute-num-layers");
}
