// gpumem/model/graph.hpp — the one internal model graph.
//
// Every input (built-in preset, Hugging Face config.json, model folder with
// safetensors headers, layer-list JSON) is lowered into a ModelGraph. Parameter
// counts, model-state memory, saved-activation memory, KV cache and (later) the
// step simulator all read this structure and never format-specific code.
//
// Shape of the graph:
//
//   ModelGraph
//     blocks[0]  "embeddings"   repeat 1    params, tensors, ops
//     blocks[1]  "layers"       repeat L    one transformer layer, executed L times
//     blocks[2]  "head"         repeat 1    final norm, lm_head, loss
//
// A Block is a straight-line list of ops executed `repeat` times in sequence;
// repeated identical layers are stored once so that a 671B-parameter model with
// 61 layers is a handful of blocks and an estimate stays in microseconds.
// Tensor 0 of a block is its input (the previous block's output); `output` is
// the tensor handed to the next block.
//
// Tensor sizes are symbolic in the micro-batch b and sequence length s:
// elements = b * (c0 + c1*s + c2*s^2): c1 covers token streams [b, s, h],
// c2 attention scores [b, a, s, s], c0 fixed per-sample shapes (CNN maps).
// Tensor dtypes are roles resolved from the precision mode at estimate time,
// because the same graph is estimated under fp32, bf16 and autocast.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/dtype.hpp"

namespace gpumem {

// Parameter grouping used by `gpumem params` (by component).
enum class Component : std::uint8_t { Embeddings, Attention, Mlp, Experts, Router, Norms, Head, Other };
inline constexpr int kComponentCount = 8;
const char* component_name(Component c);

struct Extent {
    // c0 may be negative when the tensor is one token shorter than the
    // sequence (a traced shifted loss: V*(s-1) = -V + V*s); readers check
    // that c0 + c1 + c2 >= 0, so the count is never negative for s >= 1.
    std::int64_t c0 = 0;  // elements per sample independent of s
    std::int64_t c1 = 0;  // elements per token
    std::int64_t c2 = 0;  // elements per token^2 (attention scores)
    [[nodiscard]] std::int64_t elements(std::int64_t b, std::int64_t s) const;
    static Extent per_sample(std::int64_t n) { return {n, 0, 0}; }
    static Extent per_token(std::int64_t n) { return {0, n, 0}; }
    static Extent per_token2(std::int64_t n) { return {0, 0, n}; }
};

// How an activation's dtype follows the precision mode (resolved by
// memory/precision.hpp): under torch.autocast the residual stream stays in the
// parameter dtype (fp32) while matmul outputs are 16-bit.
enum class ActRole : std::uint8_t {
    Stream,   // parameter dtype: fp32 for fp32/amp, 16-bit for pure fp16/bf16
    Lowered,  // outputs of autocast-lowered ops (linear, matmul, conv) and what follows them
    Float32,  // always fp32 (norm statistics, explicit .float() upcasts, fp32 logits)
    Index64,  // int64 (token ids, labels, max-pool indices)
    Mask8,    // 1-byte bool/uint8 (dropout masks)
    Upcast,   // ops autocast runs in fp32 (softmax, log_softmax, layer_norm): fp32 under
              // autocast, the lowered dtype otherwise (torch autocast op lists)
    Float8,   // FP8 (e4m3) copies FP8 linears save for backward (model/rewrite.hpp)
    // fp32 unless the 16-bit dtype is fp16: the input copy of softmax(x,
    // dtype=float32), which ATen makes except for CUDA fp16, where the fused
    // half_to_float kernel reads x as it is (aten/src/ATen/native/SoftMax.cpp
    // softmax(input, dim, dtype)); with alias_of its input, no copy then.
    Float32UnlessHalf,
};

using TensorId = std::int32_t;

// Which sequence length an extent's s stands for. Decoder-only and encoder
// tensors use the job's --seq; an encoder-decoder model's decoder side uses
// --decoder-seq: decoder tokens [b, s_dec, h], decoder self-attention scores
// [b, a, s_dec, s_dec], cross-attention scores [b, a, s_dec, s_enc].
enum class SeqAxis : std::uint8_t {
    Main,     // c1 * s, c2 * s^2
    Decoder,  // c1 * s_dec, c2 * s_dec^2
    Cross,    // c1 * s_dec, c2 * s_dec * s (decoder queries x encoder keys)
};

struct TensorInfo {
    std::string name;
    Extent extent;
    ActRole role = ActRole::Stream;
    // `.to(dtype)` returns its input when the dtype already matches: a tensor
    // with alias_of >= 0 shares that tensor's storage whenever both resolve to
    // the same dtype (e.g. HF RMSNorm's hidden_states.to(torch.float32)).
    TensorId alias_of = -1;
    // A tensor produced once outside the repeated block and read by every
    // instance (T5's encoder output in each decoder layer): counted once per
    // model under this key, however many blocks and repeats save it.
    std::string shared_key;
    SeqAxis axis = SeqAxis::Main;  // the sequence its extent's s stands for
    // false: the extent is the whole tensor, not per sample (a traced model's
    // position ids [1, s], a causal-mask slice [1, 1, s, s], BatchNorm's
    // per-channel statistics, a scalar loss): it does not grow with the batch.
    bool per_batch = true;
};

// A tensor autograd keeps for the backward of an op.
struct SavedRef {
    TensorId tensor = -1;
    // Under autocast the op saves its own 16-bit cast of an fp32 input (a new
    // storage per op; autocast caches casts of leaf weights only).
    bool autocast_cast = false;
    // Saved only for the gradient of the op's own parameters (mm saves its
    // input only when the weight requires grad): dropped for frozen layers
    // (LoRA/QLoRA base weights).
    bool only_for_param_grad = false;
};

enum class OpKind : std::uint8_t {
    Input, Embedding, Linear, Matmul, Attention /* fused SDPA/flash */, Softmax, LayerNorm, RMSNorm,
    Activation, Dropout, Add, Mul, Elementwise, Cast, View, Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d,
    AdaptiveAvgPool2d, Flatten, Router, Experts, Loss
};
const char* op_kind_name(OpKind k);

// Op flags.
enum OpFlag : std::uint8_t {
    kAttnCore = 1,     // scores/softmax/dropout of attention: dropped by selective recompute
    kLoraTarget = 2,   // reserved for adapters
    kOutputHead = 4,   // the output projection to the vocabulary (lm_head, embed_out, MLM decoder)
    // Its backward hands each input a view of the output's gradient (cat and
    // stack: derivatives.yaml cat_tensors_backward narrows grad), so that
    // buffer lives until every input's gradient is consumed (a UNet's skip).
    kGradViews = 8,
};

struct Op {
    OpKind kind = OpKind::Elementwise;
    std::string name;  // module path inside the block, e.g. "self_attn.q_proj"
    std::vector<TensorId> inputs;
    std::vector<TensorId> outputs;
    std::vector<SavedRef> saved;
    std::vector<std::int32_t> params;  // indices into Block::params
    Extent flops;                      // forward FLOPs, same symbolic form as tensor sizes
    std::uint8_t flags = 0;
    // Linear ops: in/out features, used by LoRA (adapter shapes).
    std::int64_t in_features = 0;
    std::int64_t out_features = 0;
    // Loss ops: the cross-entropy runs per chunk of rows (torchtune's
    // CEWithChunkedOutputLoss / LinearCrossEntropyLoss, LitGPT's
    // chunked_cross_entropy), so its backward also runs chunk by chunk: each
    // chunk's gradient is made and that chunk's saved tensors freed before the
    // next (model/rewrite.hpp). 1: one kernel over all rows.
    std::int64_t chunks = 1;
};

struct Param {
    std::string name;                 // e.g. "self_attn.q_proj.weight"
    std::vector<std::int64_t> shape;  // one tensor's shape
    std::int64_t count = 1;           // identical tensors of this shape (e.g. MoE experts)
    DType dtype = DType::F32;
    Component component = Component::Other;
    bool trainable = true;
    bool linear_weight = false;       // weight of an nn.Linear: quantizable, LoRA-able
    bool output_head = false;         // the output projection's weight: bitsandbytes and PEFT's all-linear skip it
    // Kept whole on every tensor-parallel rank although its component is split:
    // learned position and token-type embeddings (Megatron-LM's
    // LanguageModelEmbedding holds them as torch.nn.Embedding; only the word
    // embedding is a VocabParallelEmbedding).
    bool tp_replicated = false;
    std::string module;               // leaf module name for LoRA matching ("q_proj", "c_attn", ...)
    [[nodiscard]] std::int64_t numel() const;  // count * prod(shape), checked
};

// Where an attention core (scores, mask, softmax, dropout, weighted sum)
// sits in a block: fused kernels (flash/SDPA) and selective recompute replace
// the core's saved tensors by its inputs q, k, v (and for flash, the output
// and an fp32 logsumexp of [b, heads, s]).
struct AttentionSite {
    TensorId q = -1, k = -1, v = -1, out = -1;
    std::int64_t heads = 0;
    bool causal = false;  // a causal mask: fused kernels skip the masked half of the scores
};

struct Block {
    std::string name;
    std::int64_t repeat = 1;
    bool checkpointable = false;  // a transformer layer: HF gradient checkpointing wraps it
    bool linear_attention = false;  // its layers are linear attention (state per sequence, no KV cache)
    std::vector<Param> params;
    std::vector<TensorInfo> tensors;  // tensors[0] is the block input
    std::vector<Op> ops;
    std::vector<AttentionSite> attention;
    TensorId output = 0;
};

// Transformer-level facts that formulas need beyond the op list.
struct TransformerDims {
    std::int64_t layers = 0;
    std::int64_t hidden = 0;
    std::int64_t heads = 0;
    std::int64_t kv_heads = 0;
    std::int64_t head_dim = 0;
    std::int64_t intermediate = 0;
    std::int64_t vocab = 0;
    std::int64_t experts = 0;          // routed experts (0 = dense)
    std::int64_t experts_per_token = 0;
    // KV-cache elements per token summed over all layers (2*kv*d per layer, or
    // the MLA latent kv_lora_rank + rope dim for DeepSeek).
    std::int64_t kv_elements_per_token = 0;
    bool latent_kv = false;            // MLA: one latent per token, not split by tensor parallelism
    // Sliding-window attention (Gemma 2, Mistral v0.1, gpt-oss, Qwen2 with
    // use_sliding_window): the window and which layers use it; serving engines
    // page those layers' KV by the window (memory/paged_kv.hpp).
    std::int64_t sliding_window = 0;
    std::vector<bool> sliding_layers;
    // Chunked local attention (Llama 4's RoPE layers): the chunk and which
    // layers use it; vLLM pages those layers' KV by chunk + batched tokens.
    std::int64_t attention_chunk = 0;
    std::vector<bool> chunked_layers;
    // Rotary position embedding: the rotated dimensions per head (0: none or
    // not modelled, e.g. MLA's scaled rope), how many distinct RoPE configs
    // (Gemma 3: local and global bases) and whether kept in fp32 (gpt-oss);
    // engines precompute a cos/sin cache of [max_positions, rotary_dim] each.
    std::int64_t rotary_dim = 0;
    std::int64_t rope_configs = 1;
    bool rope_fp32 = false;
    bool encoder_decoder = false;
    // Linear-attention layers (Qwen3-Next's gated DeltaNet): no KV cache but a
    // state per sequence of fixed size, a convolution state of (kernel - 1) x
    // conv_dim (conv_dim = 2 x k_heads x k_dim + v_heads x v_dim) and a
    // recurrent state of v_heads x k_dim x v_dim (modeling_qwen3_next.py
    // Qwen3NextDynamicCache; vLLM mamba_utils.py gated_delta_net_state_shape).
    // kv_elements_per_token counts the other (attention) layers only.
    std::vector<bool> linear_layers;   // per layer (empty: none)
    std::int64_t linear_conv_dim = 0, linear_conv_kernel = 0, linear_v_heads = 0, linear_k_dim = 0, linear_v_dim = 0;
    // Layers that hold a KV cache.
    [[nodiscard]] std::int64_t kv_layers() const {
        std::int64_t n = layers;
        for (bool l : linear_layers) n -= l ? 1 : 0;
        return n;
    }
    // One layer's linear-attention state for one sequence on one of `tp`
    // ranks (heads split): `conv_columns` columns of conv_dim / tp in
    // `conv_dt` and a recurrent state of v_heads / tp x k_dim x v_dim in
    // `ssm_dt`.
    [[nodiscard]] Bytes linear_state_bytes(std::int64_t tp, std::int64_t conv_columns, DType conv_dt, DType ssm_dt) const {
        tp = tp < 1 ? 1 : tp;
        const std::int64_t conv = checked_mul((linear_conv_dim + tp - 1) / tp, conv_columns);
        const std::int64_t rec = checked_mul((linear_v_heads + tp - 1) / tp, checked_mul(linear_k_dim, linear_v_dim));
        return dtype_bytes(conv_dt, conv) + dtype_bytes(ssm_dt, rec);
    }
    // ... for `batch` sequences as transformers' cache holds it
    // (Qwen3NextDynamicCache): conv_states [conv_dim, kernel] in `conv_dt`
    // and recurrent_states in fp32 (the delta rule returns its final state in fp32).
    [[nodiscard]] Bytes hf_linear_state_bytes(std::int64_t batch, std::int64_t tp, DType conv_dt) const {
        return linear_state_bytes(tp, linear_conv_kernel, conv_dt, DType::F32) * batch;
    }
};

// The output projection to the vocabulary (lm_head / embed_out / MLM decoder).
inline bool is_output_head(const Op& op) {
    return (op.flags & kOutputHead) != 0 ||
           (op.kind == OpKind::Linear && op.name.size() >= 7 && op.name.compare(op.name.size() - 7, 7, "lm_head") == 0);
}

// A checkpoint's weight quantization as its config.json states it
// (quantization_config), read by the serving engines (memory/weight_quant.hpp).
struct WeightQuant {
    std::string method;            // quant_method: fp8, compressed-tensors, gptq, awq, bitsandbytes, modelopt, mxfp4
    std::string scheme;            // fp8-tensor, fp8-channel, fp8-block, int8-channel, int8-tensor, wna16, nf4, int8-bnb, nvfp4, mxfp4
    std::int64_t bits = 8;
    std::int64_t group_size = 0;   // wna16: elements per scale (0: per channel)
    std::int64_t block_n = 0, block_k = 0;  // fp8-block
    bool act_order = false;        // GPTQ desc_act / compressed-tensors actorder
    bool zero_point = false;       // asymmetric (AWQ zero_point, GPTQ sym false)
    bool lm_head = false;          // the output head is quantized too (GPTQ/AWQ lm_head)
    std::vector<std::string> ignore;  // modules left in the model dtype (ignore, modules_to_not_convert, ...)
};

struct ModelGraph {
    std::string name;
    std::string family;  // "llama", "gpt2", "layers" (layer-list JSON), "params-only", ...
    std::string source;  // "preset", "config.json", "safetensors", "layer-list", "--params"
    std::vector<Block> blocks;
    std::optional<TransformerDims> transformer;
    std::int64_t max_positions = 0;  // 0: no limit known
    bool has_sequence = true;        // false for fixed-shape (CNN/MLP) models: --seq ignored
    // The model's forward returns the loss (a traced model that computes its
    // own loss, like HF's causal LMs): the training loop binds only the loss.
    // false: the loop binds the model's output (`out = model(x); loss =
    // loss_fn(out)`), which stays alive through backward. Transformer graphs
    // follow the framework's loop instead (memory/framework.hpp).
    bool loss_in_forward = false;
    // --params only: no graph, just a count (model states only).
    std::int64_t params_only = 0;
    std::vector<std::string> notes;  // assumptions made while loading
    // Model folders only: parameters stored per dtype in the safetensors
    // headers (buffers excluded), ascending by DType; empty for other sources.
    std::vector<std::pair<DType, std::int64_t>> header_dtype_counts;
    // config.json's quantization_config, when the checkpoint is quantized.
    std::optional<WeightQuant> weight_quant;

    [[nodiscard]] std::int64_t total_params() const;
    [[nodiscard]] std::int64_t trainable_params() const;
};

}  // namespace gpumem
