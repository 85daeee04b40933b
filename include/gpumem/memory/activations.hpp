// gpumem/memory/activations.hpp — bytes autograd keeps for backward.
//
// Walks the model graph once per block and sums the storages of the tensors
// that ops save (graph/builder.hpp lists the per-op rules), deduplicated by
// storage as torch.autograd.graph.saved_tensors_hooks would see them:
//   - views and same-dtype casts share their source's storage;
//   - under autocast, each lowered op saves its own 16-bit cast of an fp32
//     input; the 16-bit casts of weights are cached per forward and counted
//     separately (autocast_weight_casts);
//   - an op saves its input for the weight gradient only when its
//     parameters are trainable, and saves nothing when neither an input nor a
//     parameter requires grad (frozen LoRA base, frozen embeddings);
//   - selective recompute and fused attention replace the attention core by
//     q, k, v (+ output and fp32 logsumexp [b, heads, s] for flash/SDPA),
//     Korthikanti et al. 2022 §4 / FlashAttention-2 backward;
//   - full recompute (HF gradient checkpointing) keeps only the input of
//     each checkpointed layer; one layer's activations are rebuilt at a time.
// Verified against the CPU oracle (tests/fixtures/oracle/activations.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct ActivationContext {
    std::int64_t batch = 1;
    std::int64_t seq = 1;
    DType stream = DType::F32;   // parameter / residual-stream dtype
    DType lowered = DType::F32;  // dtype of autocast-lowered op outputs
    bool autocast = false;       // torch.autocast active (amp-fp16 / amp-bf16)
    Recompute recompute = Recompute::None;
    Attention attention = Attention::Eager;
    bool train_base = true;      // false: base weights frozen (LoRA/QLoRA)
    std::vector<std::string> lora_targets;  // module leaf names with adapters
    std::int64_t lora_rank = 0;
};

struct BlockActivations {
    std::string block;
    std::int64_t repeat = 1;
    Bytes per_instance;          // saved bytes of one execution of the block
    Bytes routed_per_instance;   // part of per_instance: tensors of routed experts (MoE)
    Bytes largest_tensor;        // largest tensor produced in the block (transient sizing)
    Bytes working_set;           // everything one instance produces (recompute transient)
};

struct ActivationResult {
    Bytes saved;                 // total saved for backward, deduplicated, parameters excluded
    Bytes autocast_weight_casts; // part of `saved`: cached 16-bit copies of weights
    Bytes lora_adapters;         // part of `saved`: tensors the adapters add
    Bytes recompute_transient;   // full recompute: one layer's activations rebuilt in backward
    // Full recompute: autocast's weight-cast cache still holds every 16-bit
    // weight copy until the forward leaves the autocast region (not saved).
    Bytes autocast_cache_unsaved;
    Bytes largest_tensor;
    // During an op's backward the gradients w.r.t. its output and its input
    // coexist: the largest such pair over all ops.
    Bytes backward_grad_pair;
    Bytes loss_input;            // the tensor the loss reads (the model's output)
    Bytes logits;                // lm_head output [b, s, V] (0 without a head)
    std::vector<BlockActivations> blocks;
};

// True when a LoRA adapter wraps this op (a Linear whose leaf module name is
// in `targets`; "all-linear" means every Linear except lm_head, as PEFT).
bool lora_applies(const Op& op, const std::vector<std::string>& targets);

ActivationResult saved_activations(const ModelGraph& g, const ActivationContext& ctx);

// The dtype a role resolves to under a context.
DType resolve_role(ActRole role, const ActivationContext& ctx);

}  // namespace gpumem
