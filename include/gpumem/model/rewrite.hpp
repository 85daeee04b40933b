// gpumem/model/rewrite.hpp — the same model under other modeling code.
//
// Graphs are built as Hugging Face's eager PyTorch modules run them (what the
// CPU oracle verifies). Other frameworks run the same layers through fused
// kernels that allocate and save less; rewrite_graph() turns an eager graph
// into the graph those kernels execute, op by op, so that the analytic path
// and the step simulator (which both read the graph) see the same kernels:
//
//  - fused RMSNorm (Liger LigerRMSNorm, Unsloth, Transformer Engine, apex):
//    one kernel saving its input and an fp32 rstd per row, instead of HF's
//    fp32 copy, normalized fp32 tensor and 16-bit cast;
//  - fused SwiGLU / GeGLU (Liger, Unsloth, TE `swiglu`, Megatron
//    bias_swiglu_fusion): saves the gate and up projections, not silu(gate);
//  - tanh-GELU as one kernel (F.gelu(approximate="tanh"): LitGPT's
//    GptNeoxMLP, Inductor) instead of HF's composite NewGELUActivation, which
//    saves x, tanh(.), 0.5x and 1 + tanh(.);
//  - fused RoPE (Liger, Unsloth, TE apply_rope_fusion): one kernel, nothing
//    saved, no cos/sin products in flight;
//  - attention output in [b, s, heads, d] layout (flash-attn / TE / Megatron):
//    o_proj reads the kernel's output as a view, no transpose copy;
//  - the loss kernel: full cross-entropy (HF), chunked (torchtune, LitGPT:
//    one chunk's fp32 copy at a time), fused (saves the logits and an fp32
//    logsumexp per row; the gradient is written into the logits), or fused
//    linear cross-entropy (never materialises the logits: one chunk of fp32
//    logits in flight and the input gradient computed in forward and saved);
//  - FP8 / FP4 linears (Transformer Engine, memory/fp8.hpp): each linear saves
//    the quantized column-wise copy of its input for the weight gradient
//    instead of the 16-bit input (one copy for the linears TE fuses into one
//    module; Megatron's attention output projection keeps the attention output
//    itself). torchao's Float8Linear saves the 16-bit input: no rewrite.
// Every rewrite keeps parameters, FLOPs of matmuls and block structure.
#pragma once

#include <cstdint>

#include "gpumem/model/graph.hpp"

namespace gpumem {

enum class LossKernel : std::uint8_t { Full, Chunked, Fused, FusedLinear };

struct GraphRewrite {
    bool fused_norm = false;
    bool fused_glu = false;
    bool fused_gelu = false;  // HF's composite NewGELUActivation -> one tanh-GELU kernel
    bool fused_rope = false;
    bool attention_out_view = false;
    LossKernel loss = LossKernel::Full;
    std::int64_t loss_chunks = 8;   // Chunked: chunks of the sequence (torchtune num_output_chunks)
    bool loss_chunked_head = false; // Chunked: the output projection runs per chunk too (no whole logits)
    // The loss runs per chunk of loss_chunks (Chunked, or a Fused kernel that
    // torch.compile made of a per-chunk loss): the backward runs chunk by
    // chunk too, each chunk's saved tensors freed as its gradient is made
    // (Op::chunks).
    bool loss_per_chunk = false;
    // Whether the loss upcasts the logits to fp32 before log_softmax (HF's
    // ForCausalLMLoss, torchtune); false: log_softmax in the logits' dtype
    // (LitGPT's chunked_cross_entropy), fp32 under autocast.
    bool loss_upcast = true;
    // Quantized saved inputs: fp8_num / fp8_den bytes per element and one
    // 1-byte scale per fp8_scale_block elements (0: none); linears reading the
    // same input share one copy (TE's LayerNormLinear QKV / FC1); the linear
    // reading an attention output keeps that output (save_original_input).
    bool fp8_linear_inputs = false;
    std::int64_t fp8_num = 1, fp8_den = 1, fp8_scale_block = 0;
    bool fp8_share_inputs = false;
    bool fp8_attention_out_original = false;
    [[nodiscard]] bool any() const {
        return fused_norm || fused_glu || fused_gelu || fused_rope || attention_out_view || loss != LossKernel::Full || !loss_upcast || fp8_linear_inputs;
    }
};

// A copy of `g` as the given kernels run it (g itself when nothing applies).
ModelGraph rewrite_graph(const ModelGraph& g, const GraphRewrite& rw);

// Whether g's output projection shares the input embedding's weight (a
// Linear output head without a parameter of its own).
bool has_tied_output_head(const ModelGraph& g);
// A copy of g whose tied output projections own a weight of their shape
// [vocab, hidden] (LitGPT's GPT: lm_head and wte are separate modules and
// its checkpoint converter copies the embedding into lm_head for models that
// tie them, so training updates two tensors).
ModelGraph untie_output_head(const ModelGraph& g);

// The tensors a per-chunk loss backward makes gradients for, between the
// output head `head` and the loss op `loss` of block `b`: the logits (the
// head's output), log_softmax's output and the fp32 copy of a chunk the loss
// casts (-1 when absent).
struct LossChunkGrads {
    TensorId logits = -1, logp = -1, cast = -1;
};
LossChunkGrads loss_chunk_grads(const Block& b, std::size_t head, std::size_t loss);

// A per-chunk loss's backward (Op::chunks), as the analytic path and the
// simulator both count it. One chunk's gradients in flight over everything
// saved: log_softmax's output gradient for one chunk and the input gradient
// (the chunk's fp32 copy, already one chunk, or one chunk of the logits).
inline Bytes loss_chunk_transient(Bytes logp, Bytes cast, Bytes logits, std::int64_t chunks) {
    return logp.ceil_div(chunks) + (cast > Bytes(0) ? cast : logits.ceil_div(chunks));
}
// The output projection's weight gradient, run per chunk too: its
// contributions summed in autograd's input buffer, in place from the second
// on (torch >= 2.0 InputBuffer accumulate / can_accumulate_inplace), so the
// sum and one contribution exist at once; 16-bit contributions under autocast
// over fp32 weights.
inline Bytes chunked_head_grad_transient(Bytes weight_grad, bool sixteen_bit_contributions) {
    return (sixteen_bit_contributions ? Bytes(weight_grad.count() / 2) : weight_grad) * 2;
}

}  // namespace gpumem
