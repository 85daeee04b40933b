// gpumem/model/transformer.hpp — Hugging Face transformer configs.
//
// A config.json is read as transformers reads it: each model_type's
// configuration class supplies defaults for fields the file omits
// (configuration_<family>.py). The parsed TransformerSpec is
// format-independent; build_transformer() lowers it into the ModelGraph,
// following the family's modeling_<family>.py module by module so that
// parameter counts equal sum(p.numel() for p in model.parameters()) of the
// transformers class (tied weights once, buffers excluded).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct TransformerSpec {
    std::string model_type;  // "llama", "gpt2", ... as in config.json
    std::string arch_class;  // architectures[0] or the family's default head class
    // What the counted class contains:
    enum class Head {
        CausalLM,
        BaseModel /* e.g. BertModel with pooler */,
        Seq2SeqLM,
        MaskedLM /* BertForMaskedLM / RobertaForMaskedLM: transform dense+LN, tied decoder + bias */
    } head = Head::CausalLM;

    std::int64_t vocab = 0;
    std::int64_t hidden = 0;
    std::int64_t layers = 0;            // decoder layers (or encoder layers for encoder-only)
    std::int64_t decoder_layers = 0;    // encoder-decoder only (T5): decoder layer count
    std::int64_t heads = 0;
    std::int64_t kv_heads = 0;
    std::int64_t head_dim = 0;
    std::int64_t intermediate = 0;
    std::int64_t max_positions = 0;     // 0 = unknown / relative

    enum class Norm { LayerNorm, RMSNorm } norm = Norm::RMSNorm;
    bool norm_bias = true;              // LayerNorm with bias
    double norm_eps = 1e-5;
    bool gemma_norm = false;            // RMSNorm computes x * (1 + w)
    bool sandwich_norm = false;         // gemma2: post_attention/pre_ff/post_ff extra norms
    bool final_norm = true;

    enum class Pos { Learned, Rotary, RelativeBias, None } pos = Pos::Rotary;
    std::int64_t pos_offset = 0;        // OPT's learned positions have 2 extra rows
    double rotary_pct = 1.0;            // partial rotary (phi, neox)
    std::int64_t token_types = 0;       // bert/roberta token_type embeddings
    bool embed_norm = false;            // bert/roberta/falcon-none: LayerNorm after embeddings
    bool embed_scale = false;           // gemma: x * sqrt(hidden) (no parameter)
    std::int64_t word_embed_proj_dim = 0; // OPT project_in/out when != hidden
    bool pooler = false;                // BertModel pooler (dense h x h + bias)
    std::int64_t relative_buckets = 0;  // T5 relative_attention_num_buckets

    bool fused_qkv = false;             // gpt2 c_attn, neox query_key_value, falcon, phi3 qkv_proj
    bool qkv_bias = false;
    bool o_bias = false;
    bool parallel_attn = false;         // attention and MLP read the same input (neox, phi, falcon)
    bool parallel_single_norm = false;  // phi/falcon: one input norm for both branches
    bool post_norm = false;             // bert/roberta: LayerNorm after residual add
    bool opt_layer_norm_before = true;

    enum class Mlp { Plain, Gated } mlp = Mlp::Gated;
    bool fused_gate_up = false;         // phi3 gate_up_proj
    bool mlp_bias = false;
    std::string act = "silu";          // hidden_act: silu, gelu, gelu_new, gelu_pytorch_tanh, relu, ...
    bool lm_head_bias = false;
    bool tie_embeddings = false;

    double attn_dropout = 0.0;
    double resid_dropout = 0.0;
    double embd_dropout = 0.0;
    double act_dropout = 0.0;           // dropout after the MLP activation (OPT activation_dropout, T5 dropout_rate)

    bool qk_norm = false;               // phi qk_layernorm: LayerNorm(head_dim) on q and k; qwen3/qwen3_moe: RMSNorm(head_dim) (q_norm, k_norm)
    std::int64_t sliding_window = 0;    // tokens a sliding-window layer attends to (0: none)
    std::vector<bool> sliding_layers;   // per layer: attends within sliding_window (empty: none)
    double attn_logit_softcap = 0.0;    // gemma2: tanh soft-capping of attention scores (0 = off)
    double final_logit_softcap = 0.0;   // gemma2: tanh soft-capping of the logits (0 = off)

    // Mixture of experts.
    std::int64_t experts = 0;           // routed experts (0 = dense)
    std::int64_t experts_per_token = 0;
    std::int64_t moe_intermediate = 0;
    std::int64_t shared_experts = 0;    // deepseek: count; qwen2_moe: 1 with its own size
    std::int64_t shared_expert_intermediate = 0;
    bool shared_expert_gate = false;    // qwen2_moe sigmoid gate (hidden -> 1)
    std::int64_t first_k_dense = 0;     // deepseek: first k layers dense
    std::int64_t moe_layer_freq = 1;
    bool router_bias = false;           // deepseek v3 e_score_correction_bias (parameter)
    bool router_sigmoid = false;        // deepseek v3 scores experts with sigmoid instead of softmax
    bool router_linear_bias = false;    // gpt-oss: the router is nn.Linear with a bias
    bool expert_bias = false;           // gpt-oss: experts' gate_up_proj and down_proj carry biases
    bool fused_expert_gate_up = false;  // gpt-oss: one gate_up_proj per expert
    bool attention_sinks = false;       // gpt-oss: a learned sink logit per head (self_attn.sinks)
    std::vector<bool> sparse_layers;    // optional explicit per-layer MoE flags (empty: derive)

    // Linear attention (Qwen3-Next's gated DeltaNet, modeling_qwen3_next.py
    // Qwen3NextGatedDeltaNet): the layers that use it instead of
    // self-attention, and its key/value heads, head sizes and the depthwise
    // causal convolution's kernel over the concatenated q, k, v.
    std::vector<bool> linear_attn_layers;  // empty: none
    std::int64_t linear_k_heads = 0, linear_v_heads = 0, linear_k_dim = 0, linear_v_dim = 0, linear_conv_kernel = 0;
    bool attn_output_gate = false;      // qwen3_next: q_proj also emits a sigmoid gate on the attention output
    // Chunked local attention (Llama 4): the layers that attend within
    // chunks of attention_chunk tokens (the RoPE layers; the NoPE ones are global).
    std::int64_t attention_chunk = 0;
    std::vector<bool> chunked_layers;

    // Multi-head latent attention (deepseek v2/v3).
    bool mla = false;
    std::int64_t q_lora_rank = 0;       // 0: plain q_proj
    std::int64_t kv_lora_rank = 0;
    std::int64_t qk_nope_head_dim = 0;
    std::int64_t qk_rope_head_dim = 0;
    std::int64_t v_head_dim = 0;

    std::optional<WeightQuant> weight_quant;  // quantization_config
    // Parameters outside the language model (a VLM's vision tower and
    // projector): name and shape, held with the embeddings.
    // `component` Attention or Mlp: split over tensor parallelism (first
    // dimension) as the engines shard the tower; Other: whole on every rank.
    struct ExtraParam {
        std::string name;
        std::vector<std::int64_t> shape;
        Component component = Component::Other;
    };
    std::vector<ExtraParam> extra_params;
    std::vector<std::string> notes;     // defaults applied, assumptions
};

// Families gpumem reads; an unknown model_type is an error that lists these.
const std::vector<std::string>& supported_model_types();

// Parses a config.json document. `origin` names the file in error messages.
Result<TransformerSpec> parse_hf_config(const nlohmann::json& config, std::string_view origin);

// Lowers a spec into the model graph (weights in `weight_dtype`).
ModelGraph build_transformer(const TransformerSpec& spec, DType weight_dtype);

}  // namespace gpumem
