// Framework profiles (gpumem/memory/framework.hpp). Each behaviour cites the
// framework's source; docs/frameworks.md lists the same rules with quotes.
#include "gpumem/memory/framework.hpp"

#include <array>

#include "gpumem/memory/fp8.hpp"

namespace gpumem {

namespace {

using P = FrameworkProfile;

void rule(P& p, std::string what, std::string source) { p.rules.push_back({std::move(what), std::move(source)}); }

const std::string kHfLoss = "huggingface/transformers src/transformers/loss/loss_utils.py@0114da07ec0e L45-55";

std::array<P, 10> build_profiles() {
    std::array<P, 10> t;
    {
        P& p = t[static_cast<std::size_t>(Framework::HF)];
        p.id = Framework::HF;
        p.title = "Hugging Face Trainer / accelerate / TRL";
        p.default_precision = Precision::AmpBF16;
        rule(p, "the Trainer keeps only the loss: logits freed before backward", "huggingface/trl trl/trainer/sft_trainer.py@f2cd57710ae3 L1740-1742, L1832");
        rule(p, "ForCausalLMLoss: logits.float(), then cross_entropy over all rows", kHfLoss);
        rule(p, "bf16=True: torch.autocast over fp32 parameters", "huggingface/accelerate src/accelerate/accelerator.py@16cb6eb80dd9 L585-592, L1818-1824");
        rule(p, "LoRA dropout 0.0 (PEFT LoraConfig)", "huggingface/peft src/peft/tuners/lora/config.py@5d602fdbff04 L634");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::Torchtune)];
        p.id = Framework::Torchtune;
        p.title = "torchtune recipes";
        p.cross_entropy = CrossEntropy::Chunked;
        p.ce_chunks = 8;
        p.ce_chunked_head = true;
        p.ce_upcast_in_model = true;
        p.default_precision = Precision::BF16;
        const std::string why = "torchtune has no autocast mode: it trains with `dtype: bf16` (use --precision bf16) or fp32";
        p.unsupported = {{Precision::AmpBF16, why}, {Precision::AmpFP16, why}, {Precision::FP16, "torchtune does not train in fp16: use --precision bf16 or fp32"}};
        rule(p, "`del logits` before loss.backward()", "pytorch/torchtune recipes/full_finetune_single_device.py@bd2a0fc7c314 L564-567, L619");
        rule(p, "LinearCrossEntropyLoss: output projection and cross-entropy in 8 chunks, each upcast to fp32", "pytorch/torchtune torchtune/modules/loss/cross_entropy_loss.py@bd2a0fc7c314 L19-70, L107-114");
        rule(p, "dtype: bf16: the model in bf16, no autocast", "pytorch/torchtune recipes/full_finetune_single_device.py@bd2a0fc7c314 L126, L400-416");
        rule(p, "RMSNorm in fp32 with eager ops (as Hugging Face)", "pytorch/torchtune torchtune/modules/rms_norm.py@bd2a0fc7c314 L28-39");
        rule(p, "without chunked output the model returns `self.output(h).float()`: a compiled full loss reads, saves and differentiates fp32 logits",
             "pytorch/torchtune torchtune/modules/transformer.py@bd2a0fc7c314 L678-689");
        rule(p, "LoRA dropout 0.0", "pytorch/torchtune torchtune/models/llama3_1/_component_builders.py@bd2a0fc7c314 L158");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::LitGPT)];
        p.id = Framework::LitGPT;
        p.title = "LitGPT (Lightning Fabric)";
        p.logits = LogitsLifetime::Kept;
        p.cross_entropy = CrossEntropy::Chunked;
        p.ce_chunk_tokens = 128;
        p.ce_upcast = false;
        p.default_precision = Precision::AmpBF16;
        p.lora_dropout = 0.05;
        p.compile_loss = false;
        p.untied_head = true;
        p.amp_lora_base_fp32 = true;
        p.fused_qkv_views = true;
        rule(p, "one fused qkv Linear; q, k, v are views of its output (split, view, transpose) and only grouped-query k, v are copied (repeat_interleave): "
                "with as many key/value heads as query heads, the v SDPA saves keeps the whole fused output",
             "Lightning-AI/litgpt litgpt/model.py@26857050fe3f L430-539 (L479 qkv.split, L538-539 repeat_interleave)");
        rule(p, "LoRAQKVLinear with part of q, k, v adapted: zero_pad scatters B's output with index_copy_, whose backward keeps that output",
             "Lightning-AI/litgpt litgpt/lora.py@26857050fe3f L321-326; pytorch/pytorch tools/autograd/derivatives.yaml index_copy (source: grad.index_select(dim, index).expand_as(source))");
        rule(p, "bf16-mixed (the default training precision) builds and loads the model in fp32 (fabric.init_module under MixedPrecision), so a LoRA base stays fp32 and autocast casts each frozen weight per call",
             "Lightning-AI/litgpt litgpt/finetune/lora.py@26857050fe3f L131, L210-211, L236");
        rule(p, "GPT has separate lm_head and wte modules; for models whose checkpoint ties them the converter copies the embedding into lm_head, so both are trained",
             "Lightning-AI/litgpt litgpt/model.py@00af8b0d9b43 L25, L28; litgpt/scripts/convert_hf_checkpoint.py@00af8b0d9b43 L207 (copy_weights_hf_llama), L282");
        p.single_kernel_gelu = true;
        p.fused_qkv_lora = true;
        rule(p, "`logits = model(input_ids)` stays bound through fabric.backward", "Lightning-AI/litgpt litgpt/finetune/full.py@26857050fe3f L282-285");
        rule(p, "chunked_cross_entropy: 128-row chunks, no explicit upcast", "Lightning-AI/litgpt litgpt/utils.py@26857050fe3f L302-351");
        rule(p, "default training precision bf16-mixed (torch.autocast)", "Lightning-AI/litgpt litgpt/utils.py@26857050fe3f L363-380");
        rule(p, "LoRA dropout 0.05", "Lightning-AI/litgpt litgpt/finetune/lora.py@26857050fe3f L58");
        rule(p, "its own modeling code: tanh-GELU MLPs (Phi, GPT-NeoX) call F.gelu(approximate=\"tanh\"), one kernel saving its input",
             "Lightning-AI/litgpt litgpt/model.py@26857050fe3f L812-816");
        rule(p, "LoRA on the fused QKV projection (LoRAQKVLinear): one dropout of its input serves the q, k and v adapters",
             "Lightning-AI/litgpt litgpt/lora.py@26857050fe3f L381-414");
        rule(p, "bitsandbytes plugin: weights quantized from fp16, so each 4-bit dequantization makes an fp16 copy and its bf16 cast",
             "Lightning-AI/pytorch-lightning src/lightning/fabric/plugins/precision/bitsandbytes.py@438f29f07a80 L334");
        rule(p, "the loop's `logits` keep the previous micro-batch's graph through the next forward: with bitsandbytes < 0.43.2 "
                "(--bnb-4bit-saves-input) its 4-bit inputs too (ctx.tensors, not freed by backward)",
             "Lightning-AI/litgpt litgpt/finetune/lora.py@26857050fe3f L355-359; bitsandbytes-foundation/bitsandbytes commit 9e753741 (#1270, in 0.43.2) bitsandbytes/autograd/_functions.py");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::NanoGPT)];
        p.id = Framework::NanoGPT;
        p.title = "karpathy/nanoGPT (and llama2.c) training loop";
        p.logits = LogitsLifetime::Kept;
        p.ce_upcast = false;
        p.default_precision = Precision::AmpBF16;
        rule(p, "`logits, loss = model(X, Y)`: logits bound until the next micro-step", "karpathy/nanoGPT train.py@3adf61e154c3 L299-305");
        rule(p, "F.cross_entropy on the logits as they are (fp32 under autocast)", "karpathy/nanoGPT model.py@3adf61e154c3 L186-187");
        rule(p, "torch.autocast(bfloat16) over fp32 parameters", "karpathy/nanoGPT train.py@3adf61e154c3 L73, L111-112");
        rule(p, "compile = True by default (pass --no-compile for an eager run)", "karpathy/nanoGPT train.py@3adf61e154c3 L74");
        p.compile = true;
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::Megatron)];
        p.id = Framework::Megatron;
        p.title = "Megatron-Core with Transformer Engine";
        p.cross_entropy = CrossEntropy::Fused;
        p.kernels = Kernels::TE;
        p.policy = PrecisionPolicy::OwnCopies;
        p.default_precision = Precision::BF16;
        p.unsupported = {{Precision::AmpBF16, "Megatron's --bf16 is bf16 parameters with fp32 main gradients and weights, not torch.autocast: use --precision bf16"},
                         {Precision::AmpFP16, "Megatron's --fp16 is fp16 parameters with fp32 main gradients and weights, not torch.autocast: use --precision fp16"}};
        rule(p, "the loss is computed inside the model; logits freed before backward", "NVIDIA/Megatron-LM megatron/core/models/gpt/gpt_model.py@d98e8a64ddf3 L807, L835-841");
        rule(p, "vocab-parallel cross-entropy: an fp32 copy turned into the softmax in place and saved", "NVIDIA/Megatron-LM megatron/core/tensor_parallel/cross_entropy.py@d98e8a64ddf3 L20-25, L61-62, L181");
        rule(p, "bf16 parameters, fp32 main gradients, fp32 main weights", "NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64ddf3 L1204-1217, L3671-3673");
        rule(p, "Transformer Engine layer spec; SwiGLU and RoPE fusion on by default", "NVIDIA/Megatron-LM megatron/core/models/gpt/gpt_layer_specs.py@d98e8a64ddf3 L145; megatron/training/arguments.py@d98e8a64ddf3 L2887-2905");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::Torchtitan)];
        p.id = Framework::Torchtitan;
        p.title = "torchtitan (FSDP2)";
        p.cross_entropy = CrossEntropy::FusedLinear;
        p.policy = PrecisionPolicy::OwnCopies;
        p.default_precision = Precision::AmpBF16;
        p.recompute = Recompute::Ops;
        rule(p, "output layer and cross-entropy in 8 chunks, each backpropagated at once into an fp32 [T, D] gradient", "pytorch/torchtitan torchtitan/components/loss.py@b5bcd76c66d0 L501-560, L676-700");
        rule(p, "FSDP2 MixedPrecisionPolicy: fp32 sharded parameters, bf16 compute copies, fp32 reduce", "pytorch/torchtitan torchtitan/config/configs.py@b5bcd76c66d0 L94-106; torchtitan/distributed/fsdp.py@b5bcd76c66d0 L223-227");
        rule(p, "default activation checkpointing: per-op selective on every block (every other matmul recomputed)", "pytorch/torchtitan torchtitan/trainer.py@b5bcd76c66d0 L108-110; torchtitan/distributed/activation_checkpoint.py@b5bcd76c66d0 L185-287");
        rule(p, "--compile compiles each block and the loss (compile.components default [\"model\", \"loss\"]); from 2024-12-18 (e8977b0) to 2025-04-02 (bbb1b61) the loss was not compiled: --no-compile-loss",
             "pytorch/torchtitan torchtitan/config/configs.py@b5bcd76c66d0 L301; torchtitan/components/loss.py@b5bcd76c66d0 L245-252, L282-284; train.py@9dec370ad26b L137-138");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::DeepSpeed)];
        p.id = Framework::DeepSpeed;
        p.title = "DeepSpeed engine (Hugging Face model)";
        p.policy = PrecisionPolicy::OwnCopies;
        p.default_precision = Precision::BF16;
        const std::string why = "DeepSpeed's bf16/fp16 modes cast the model to 16 bits with fp32 master weights, not torch.autocast: use --precision bf16 or fp16";
        p.unsupported = {{Precision::AmpBF16, why}, {Precision::AmpFP16, why}};
        rule(p, "the engine casts the module to bf16; BF16_Optimizer keeps an fp32 master partition", "microsoft/DeepSpeed deepspeed/runtime/engine.py@38327e07f6cd L1010-1025, L1228-1231; deepspeed/runtime/bf16_optimizer.py@38327e07f6cd L156, L162");
        rule(p, "loop and loss as the Hugging Face Trainer", kHfLoss);
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::Axolotl)];
        p.id = Framework::Axolotl;
        p.title = "Axolotl (Hugging Face Trainer)";
        p.default_precision = Precision::BF16;
        rule(p, "loop as the Hugging Face Trainer; fused-linear CE only with cut_cross_entropy / liger options", "axolotl-ai-cloud/axolotl src/axolotl/core/trainers/base.py@067b021c8b87 L376-444; src/axolotl/integrations/liger/args.py@067b021c8b87 L55");
        rule(p, "LoRA dropout 0.0 (schema default)", "axolotl-ai-cloud/axolotl src/axolotl/utils/schemas/peft.py@067b021c8b87 L80");
        p.kbit_upcast = true;
        rule(p, "8-bit/4-bit LoRA: PEFT prepare_model_for_kbit_training casts every non-quantized parameter to fp32 (skipped under FSDP QLoRA or ZeRO-3; "
                "embeddings_skip_upcast keeps embeddings and lm_head 16-bit)",
             "axolotl-ai-cloud/axolotl src/axolotl/loaders/model.py@067b021c8b87 L988-1023, src/axolotl/loaders/patch_manager.py@067b021c8b87 L361-366; "
             "huggingface/peft src/peft/utils/other.py@ec267c64 L95-98");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::Unsloth)];
        p.id = Framework::Unsloth;
        p.title = "Unsloth";
        p.cross_entropy = CrossEntropy::FusedLinear;
        p.kernels = Kernels::Fused;
        p.default_precision = Precision::BF16;
        p.recompute = Recompute::Full;
        p.activation_offload = true;
        rule(p, "chunked fused cross-entropy: logits never returned, input gradient computed in forward", "unslothai/unsloth-zoo unsloth_zoo/fused_losses/cross_entropy_loss.py@ce232d6cef9c L140-173, L250-258");
        rule(p, "Triton RMSNorm, SwiGLU and RoPE kernels", "unslothai/unsloth unsloth/kernels/rms_layernorm.py@015bdef0d94a L205; unsloth/kernels/fast_lora.py@015bdef0d94a L110");
        rule(p, "use_gradient_checkpointing=\"unsloth\": every layer, inputs offloaded to pinned CPU memory", "unslothai/unsloth unsloth/models/llama.py@015bdef0d94a L3079; unslothai/unsloth-zoo unsloth_zoo/gradient_checkpointing.py@ce232d6cef9c L705-854");
        rule(p, "LoRA dropout 0", "unslothai/unsloth unsloth/models/llama.py@015bdef0d94a L3074");
    }
    {
        P& p = t[static_cast<std::size_t>(Framework::LlamaFactory)];
        p.id = Framework::LlamaFactory;
        p.title = "LLaMA-Factory (Hugging Face Trainer)";
        p.default_precision = Precision::BF16;
        p.recompute = Recompute::Full;
        rule(p, "gradient checkpointing on by default (every layer)", "hiyouga/LLaMA-Factory src/llamafactory/hparams/model_args.py@ff6d4d12eeb0 L145-152; src/llamafactory/model/model_utils/checkpointing.py@ff6d4d12eeb0 L184-198");
        rule(p, "LoRA dropout 0.0", "hiyouga/LLaMA-Factory src/llamafactory/hparams/finetuning_args.py@ff6d4d12eeb0 L73-76");
    }
    return t;
}

}  // namespace

const FrameworkProfile& framework_profile(Framework f) {
    static const std::array<P, 10> profiles = build_profiles();
    return profiles[static_cast<std::size_t>(f)];
}

FrameworkChoice resolve_framework(EstimateRequest& req, bool train, bool has_transformer) {
    FrameworkChoice ch;
    ch.framework = req.framework.value_or(Framework::HF);
    const FrameworkProfile& p = framework_profile(ch.framework);
    const bool named = req.framework.has_value();
    if (!req.precision && train && p.default_precision) {
        req.precision = *p.default_precision;
        if (named) ch.assumptions.push_back(std::string("precision ") + to_string(*req.precision) + ": " + p.title + "'s default");
    }
    if (train && req.precision)
        for (const auto& [prec, why] : p.unsupported)
            if (prec == *req.precision) fail(ErrorCode::InvalidArgument, "precision", "--precision " + std::string(to_string(prec)) + " with --framework " + to_string(ch.framework) + ": " + why);
    ch.logits = req.logits.value_or(p.logits);
    ch.cross_entropy = req.cross_entropy.value_or(p.cross_entropy);
    ch.kernels = req.kernels.value_or(p.kernels);
    ch.policy = p.policy;
    // CUDA graphs in training. torch.compile(mode="reduce-overhead") is
    // torch.compile with Inductor's CUDA graph trees, so it compiles;
    // Megatron-Core's per-layer graphs are Megatron's own.
    ch.cuda_graphs = train ? req.cuda_graphs : CudaGraphs::None;
    if (ch.cuda_graphs == CudaGraphs::Compile) {
        if (req.compile && !*req.compile)
            fail(ErrorCode::InvalidArgument, "cuda-graphs", "--cuda-graphs compile is torch.compile(mode=\"reduce-overhead\"): it cannot run with --compile false");
        req.compile = true;
    }
    if (ch.cuda_graphs == CudaGraphs::Megatron && ch.framework != Framework::Megatron)
        fail(ErrorCode::InvalidArgument, "cuda-graphs",
             "--cuda-graphs megatron is Megatron-Core's per-layer CUDA graphs (--cuda-graph-impl local): use it with --framework megatron "
             "(torch.compile(mode=\"reduce-overhead\") is --cuda-graphs compile)");
    req.cuda_graphs = ch.cuda_graphs;
    ch.compile = req.compile.value_or(p.compile);
    if (req.compile_loss && *req.compile_loss && !ch.compile)
        fail(ErrorCode::InvalidArgument, "compile-loss", "--compile-loss says what --compile covers: add --compile, or drop --compile-loss");
    ch.compile_loss = ch.compile && req.compile_loss.value_or(p.compile_loss);
    req.compile_loss = ch.compile_loss;
    if (!req.recompute) req.recompute = train ? p.recompute : Recompute::None;
    // The profile's offloading goes with its checkpointing (Unsloth offloads
    // the checkpointed layers' inputs); without checkpointing it is off.
    const bool ckpt = *req.recompute == Recompute::Full || *req.recompute == Recompute::Ops;
    ch.activation_offload = train && req.activation_offload.value_or(p.activation_offload && ckpt);
    req.compile = ch.compile;
    req.activation_offload = ch.activation_offload;
    ch.fp8 = req.fp8_recipe;
    if (ch.cross_entropy == CrossEntropy::FusedLinear) ch.logits = LogitsLifetime::Freed;  // there are no logits to hold
    if (!train) {
        ch.logits = LogitsLifetime::Freed;
        ch.cross_entropy = CrossEntropy::Full;
    }
    req.framework = ch.framework;
    req.logits = ch.logits;
    req.cross_entropy = ch.cross_entropy;
    req.kernels = ch.kernels;

    GraphRewrite& rw = ch.rewrite;
    const bool fused = ch.kernels != Kernels::Eager || ch.compile;
    rw.fused_norm = rw.fused_glu = rw.fused_rope = fused;
    rw.fused_gelu = fused || p.single_kernel_gelu;
    rw.attention_out_view = fused && req.attention == Attention::Flash;
    if (train) {
        switch (ch.cross_entropy) {
            case CrossEntropy::Full: rw.loss = LossKernel::Full; break;
            case CrossEntropy::Chunked: rw.loss = LossKernel::Chunked; break;
            case CrossEntropy::Fused: rw.loss = LossKernel::Fused; break;
            case CrossEntropy::FusedLinear: rw.loss = LossKernel::FusedLinear; break;
        }
        // The framework's own loss keeps its upcast rule; a loss kernel the
        // user chose runs as that kernel's reference implementation does.
        rw.loss_upcast = ch.cross_entropy == p.cross_entropy ? p.ce_upcast : ch.cross_entropy != CrossEntropy::Fused;
        rw.loss_chunked_head = ch.cross_entropy == p.cross_entropy && p.ce_chunked_head;
        const std::int64_t s = req.seq.value_or(2048);
        rw.loss_chunks = p.ce_chunk_tokens > 0 ? std::max<std::int64_t>(1, (s + p.ce_chunk_tokens - 1) / p.ce_chunk_tokens) : p.ce_chunks;
        rw.loss_per_chunk = ch.cross_entropy == CrossEntropy::Chunked;
        // Transformer Engine recipes save quantized inputs; torchao's
        // Float8Linear saves the 16-bit input (memory/fp8.hpp).
        rw.fp8_linear_inputs = te_recipe(ch.fp8);
        if (rw.fp8_linear_inputs) {
            const QuantFormat q = te_format(ch.fp8);
            rw.fp8_num = q.num;
            rw.fp8_den = q.den;
            rw.fp8_scale_block = q.scale_block;
            rw.fp8_share_inputs = ch.kernels == Kernels::TE;  // LayerNormLinear QKV / FC1
            rw.fp8_attention_out_original = ch.framework == Framework::Megatron && ch.fp8 != Fp8Recipe::Delayed;
        }
        // A compiled loss (torchtune compile_loss; nanoGPT's loss inside the
        // compiled model) is one Inductor kernel: the upcast, log_softmax and
        // nll fuse, and the backward recomputes the softmax from the logits
        // and a per-row logsumexp instead of keeping an fp32 log_softmax.
        if (ch.compile && ch.compile_loss && (rw.loss == LossKernel::Full || rw.loss == LossKernel::Chunked)) {
            // A model that upcasts whole logits itself hands the compiled loss
            // fp32 logits (kept, as Megatron's fp32 softmax is: LossKernel::Fused
            // with the upcast).
            rw.loss_upcast = rw.loss == LossKernel::Full && p.ce_upcast_in_model;
            rw.loss = LossKernel::Fused;
            rw.loss_chunked_head = false;  // every chunk's logits are kept for the recompute
        }
    }
    if (!has_transformer) rw = GraphRewrite{};

    if (named || ch.framework != Framework::HF || fused || ch.cross_entropy != CrossEntropy::Full || ch.logits != LogitsLifetime::Freed) {
        std::string line = std::string("framework ") + to_string(ch.framework) + " (" + p.title + "): ";
        line += std::string("logits ") + (ch.logits == LogitsLifetime::Kept ? "held by the loop through backward" : "freed before backward");
        switch (ch.cross_entropy) {
            case CrossEntropy::Full: line += rw.loss_upcast ? ", full cross-entropy on an fp32 copy of the logits" : ", full cross-entropy on the logits as they are"; break;
            case CrossEntropy::Chunked:
                line += ", chunked cross-entropy (" + std::to_string(rw.loss_chunks) + " chunks" + (rw.loss_upcast ? ", each upcast to fp32" : ", no upcast") +
                        "; backward chunk by chunk, each chunk's saves freed as its gradient is made)";
                break;
            case CrossEntropy::Fused: line += rw.loss_upcast ? ", fused cross-entropy saving an fp32 softmax" : ", fused cross-entropy saving the logits and a logsumexp"; break;
            case CrossEntropy::FusedLinear: line += ", fused linear cross-entropy (no logits materialised)"; break;
        }
        line += std::string(", ") + (ch.kernels == Kernels::TE ? "Transformer Engine layers" : fused ? (ch.compile && ch.kernels == Kernels::Eager ? "torch.compile-fused kernels" : "fused kernels") : "eager modeling code");
        line += std::string(", ") + (ch.policy == PrecisionPolicy::Autocast ? "torch.autocast mixed precision" : "the framework's own 16-bit weight copies (none saved across layers)");
        ch.assumptions.push_back(line + " (docs/frameworks.md)");
    }
    if (named)
        for (const auto& r : p.rules) ch.assumptions.push_back(std::string(to_string(ch.framework)) + ": " + r.what + " [" + r.source + "]");
    if (train && has_transformer && ch.fp8 != Fp8Recipe::None) ch.assumptions.push_back(fp8_assumption(ch.fp8, ch.framework));
    if (ch.compile)
        ch.assumptions.push_back(std::string("--compile: Inductor's fused pointwise kernels save what fused kernels save, a compiled loss keeps the logits and a "
                                             "logsumexp (no fp32 log_softmax); ") +
                                 (ch.cuda_graphs == CudaGraphs::Compile ? "mode=\"reduce-overhead\": CUDA graphs below"
                                                                        : "no CUDA graphs (mode=\"reduce-overhead\" is --cuda-graphs compile)"));
    // CUDA graphs in training (docs/frameworks.md, "CUDA graphs"): a graph's
    // memory is a private pool of the caching allocator that only its captures
    // use and empty_cache() does not release while the graph lives
    // (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp@001074d25084
    // beginAllocateToPool / releasePool / free_block; torch/cuda/graphs.py@006be72d443c
    // graph.__enter__ empties the general cache before each capture).
    if (ch.cuda_graphs == CudaGraphs::Compile)
        ch.assumptions.push_back(
            "--cuda-graphs compile: torch.compile(mode=\"reduce-overhead\") records the compiled forward and backward as CUDA graph trees in one private "
            "pool per device, warm-up runs included [pytorch/pytorch torch/_inductor/cudagraph_trees.py@00008d32e650 L2-7, TreeManagerContainer, "
            "CUDAWarmupNode]: activations, temporaries and the parameter gradients the backward graph returns live in the pool; weights, optimizer "
            "states and the (eager) optimizer step's temporaries in the general pool, which cannot reuse the pool's free blocks: reserved = the "
            "general pool's peak + the pool's peak");
    else if (ch.cuda_graphs == CudaGraphs::Megatron)
        ch.assumptions.push_back(
            "--cuda-graphs megatron: Megatron-Core captures each transformer layer's forward and backward (per micro-batch in flight) into one shared "
            "private pool at the end of the first step, in execution order [NVIDIA/Megatron-LM megatron/core/transformer/cuda_graphs.py@d98e8a64ddf3 "
            "L732-743, L1926-1935, L1958-2023; megatron/core/pipeline_parallel/schedules.py@d98e8a64ddf3 L888-889]: the layers' activations and "
            "temporaries live in the pool; embedding, output layer, loss, fp32 main gradients, optimizer states and step in the general pool, which "
            "cannot reuse the pool's free blocks: reserved = the general pool's peak + the pool's peak");
    return ch;
}

}  // namespace gpumem
