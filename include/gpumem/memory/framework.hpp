// gpumem/memory/framework.hpp — training frameworks as they really run.
//
// The same model and settings take 10-40% more or less memory depending on
// the framework that trains it: how long its loop holds the logits, how its
// loss reads them, which kernels its modeling code runs (and what they save
// for backward), and how it implements "bf16 mixed precision". A profile is
// the set of those behaviours for one framework, each read from the
// framework's source at a named commit (the citations below, also printed in
// docs/frameworks.md); request fields (--cross-entropy, --logits, --kernels,
// ...) override single behaviours. resolve_job() applies the profile: it
// fills the unset fields, rewrites the graph for the framework's kernels
// (model/rewrite.hpp) and lists the rules in the assumptions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/rewrite.hpp"

namespace gpumem {

// How "mixed precision" makes the 16-bit copies of the weights that matmuls
// read: torch.autocast casts fp32 weights inside each op and keeps the casts
// (saved for backward) for the whole forward; frameworks with their own
// policy (FSDP2 MixedPrecisionPolicy, Megatron, DeepSpeed) hold 16-bit
// parameters or all-gather 16-bit copies per layer, which autograd does not
// keep across layers.
enum class PrecisionPolicy { Autocast, OwnCopies };

struct FrameworkRule {
    std::string what;    // "loss: chunked cross-entropy, 8 chunks, fp32 per chunk"
    std::string source;  // "pytorch/torchtune torchtune/modules/loss/ce_chunked_output_loss.py@<commit> L.."
};

struct FrameworkProfile {
    Framework id = Framework::HF;
    std::string title;              // "Hugging Face Trainer / accelerate / TRL"
    LogitsLifetime logits = LogitsLifetime::Freed;
    CrossEntropy cross_entropy = CrossEntropy::Full;
    std::int64_t ce_chunks = 8;     // chunked: chunks of the sequence
    std::int64_t ce_chunk_tokens = 0;  // chunked by tokens instead (LitGPT lm_head_chunk_size); 0: use ce_chunks
    bool ce_upcast = true;          // the loss upcasts logits to fp32
    Kernels kernels = Kernels::Eager;
    PrecisionPolicy policy = PrecisionPolicy::Autocast;
    std::optional<Precision> default_precision;  // the framework's default training precision
    // Precisions the framework cannot run, with the message naming its own setting.
    std::vector<std::pair<Precision, std::string>> unsupported;
    // The loss computes the output projection chunk by chunk too, so the
    // whole logits never exist (torchtune LinearCrossEntropyLoss).
    bool ce_chunked_head = false;
    Recompute recompute = Recompute::None;  // the framework's default checkpointing
    bool compile = false;
    // Whether --compile covers the loss: torchtune compiles it (compile_loss),
    // nanoGPT and the HF Trainer compile the whole model with its loss,
    // torchtitan compiles each transformer block and (since 2025-04) the loss;
    // LitGPT compiles the model only.
    bool compile_loss = true;
    // The model itself upcasts whole logits to fp32 before the loss (torchtune's
    // TransformerDecoder without chunked output): a compiled loss then reads,
    // saves and differentiates fp32 logits.
    bool ce_upcast_in_model = false;
    bool activation_offload = false;
    // Its own modeling code runs tanh-GELU as one kernel (LitGPT's
    // GptNeoxMLP: F.gelu(approximate="tanh")), not HF's composite NewGELUActivation.
    bool single_kernel_gelu = false;
    // The output layer is a module of its own even where the checkpoint ties
    // it to the embedding (LitGPT: the converter copies wte into lm_head).
    bool untied_head = false;
    // Its mixed precision builds and loads the model in fp32 (Fabric's
    // MixedPrecision plugin): a LoRA base stays fp32 under autocast, where
    // PEFT users load it in 16 bits.
    bool amp_lora_base_fp32 = false;
    // Its attention slices q, k and v from one fused QKV output as views: with
    // as many key/value heads as query heads the saved v keeps all of it.
    bool fused_qkv_views = false;
    // LoRA on a fused QKV module with one dropout of its input (LitGPT's LoRAQKVLinear).
    bool fused_qkv_lora = false;
    // Calls PEFT's prepare_model_for_kbit_training for quantized LoRA
    // (--kbit-upcast's default).
    bool kbit_upcast = false;
    double lora_dropout = 0.0;      // the framework's default LoRA dropout
    std::vector<FrameworkRule> rules;
};

const FrameworkProfile& framework_profile(Framework f);

// The resolved behaviour of one job (profile defaults, then request overrides).
struct FrameworkChoice {
    Framework framework = Framework::HF;
    LogitsLifetime logits = LogitsLifetime::Freed;
    CrossEntropy cross_entropy = CrossEntropy::Full;
    Kernels kernels = Kernels::Eager;
    PrecisionPolicy policy = PrecisionPolicy::Autocast;
    bool compile = false;
    bool compile_loss = false;       // --compile covers the loss too
    bool activation_offload = false;
    Fp8Recipe fp8 = Fp8Recipe::None;
    CudaGraphs cuda_graphs = CudaGraphs::None;  // training only
    GraphRewrite rewrite;            // what the graph rewrite applies
    std::vector<std::string> assumptions;
};

// Fills req's unset framework fields (and the default precision) from the
// profile, validates the combination, and returns what the job runs.
// Throws InputError for a precision the framework cannot run.
FrameworkChoice resolve_framework(EstimateRequest& req, bool train, bool has_transformer);

}  // namespace gpumem
