// TransformerSpec -> ModelGraph.
//
// Every family goes through the same few helpers, each following the eager
// PyTorch forward of the transformers modules op by op:
//   embeddings()  token (+ learned position, token type) embeddings, scale, norm, dropout
//   norm()        LayerNorm / LlamaRMSNorm / GemmaRMSNorm (x * (1 + w)) / T5LayerNorm
//   attention()   q/k/v projections (fused or not), qk-norm, rotary, repeat_kv, core, o_proj
//   mla()         DeepSeek multi-head latent attention (q/kv LoRA-style compression)
//   core()        scores matmul, scale, mask, soft-capping, softmax, dropout, @V, transpose back
//   mlp()         plain (up, act, down) or gated (act(gate) * up, down), fused gate_up
//   moe()         router, softmax/sigmoid + top-k, gather, experts, weighting, index_add, shared experts
//   layer()       pre-norm / post-norm / parallel / sandwich residual structure
//   head()        final norm, lm_head (tied or not), soft-capping, loss; pooler / MLM head
// Parameter names are those of the transformers modules relative to the layer
// (e.g. "self_attn.q_proj.weight") so that LoRA targets match module names.
#include <cmath>
#include <string>
#include <vector>

#include "gpumem/model/builder.hpp"
#include "gpumem/model/transformer.hpp"

namespace gpumem {

namespace {

using S = TransformerSpec;
using Act = BlockBuilder::Act;

struct AttnNames {
    std::string core;    // prefix of the attention-core ops
    std::string q, k, v; // separate projections
    std::string qkv;     // fused projection (when spec.fused_qkv)
    std::string o;
    std::string q_norm, k_norm;  // phi qk_layernorm
};

struct MlpNames {
    std::string up, gate, down, gate_up;  // full module paths inside the layer
};

struct Names {
    // Embeddings block.
    std::string embed = "embed_tokens", pos, type, embed_norm;
    // Layer.
    AttnNames attn{"self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj",
                   "self_attn.o_proj", "", ""};
    std::string ln1 = "input_layernorm", ln2 = "post_attention_layernorm";
    std::string ln_post_attn, ln_post_ff;  // gemma2 sandwich norms
    MlpNames mlp{"mlp.up_proj", "mlp.gate_proj", "mlp.down_proj", "mlp.gate_up_proj"};
    // Mixture of experts.
    std::string moe = "mlp", router = "mlp.gate", experts = "mlp.experts";
    MlpNames expert{"up_proj", "gate_proj", "down_proj", ""};
    std::string shared = "mlp.shared_experts", shared_gate;
    bool router_linear_weight = true;  // router is an nn.Linear (deepseek: a bare Parameter)
    // Head.
    std::string final_norm = "norm", lm_head = "lm_head";
    std::string mlm_dense, mlm_norm, mlm_decoder, mlm_bias;
    // Behaviour.
    bool conv1d = false;                // GPT-2 Conv1D: weight stored [in, out]
    bool softmax_fp32 = true;           // softmax(dtype=float32).to(q.dtype)
    bool softmax_upcast_input = false;  // T5: softmax(scores.float()).type_as(scores)
    bool scale_scores = true;           // T5 does not scale
    bool upcast_logits = true;          // causal-LM loss does logits.float()
};

Names names_for(const S& s) {
    Names n;
    const std::string& t = s.model_type;
    if (t == "gpt2" || t == "gpt_bigcode") {
        n.embed = "wte";
        n.pos = "wpe";
        n.attn = {"attn", "", "", "", "attn.c_attn", "attn.c_proj", "", ""};
        n.ln1 = "ln_1";
        n.ln2 = "ln_2";
        n.mlp = {"mlp.c_fc", "", "mlp.c_proj", ""};
        n.final_norm = "ln_f";
        // GPT-2: Conv1D weights and a plain softmax; GPTBigCode: nn.Linear and
        // softmax in fp32 (attention_softmax_in_fp32).
        n.conv1d = t == "gpt2";
        n.softmax_fp32 = t != "gpt2";
    } else if (t == "bert" || t == "roberta") {
        n.embed = "embeddings.word_embeddings";
        n.pos = "embeddings.position_embeddings";
        n.type = "embeddings.token_type_embeddings";
        n.embed_norm = "embeddings.LayerNorm";
        n.attn = {"attention.self", "attention.self.query", "attention.self.key", "attention.self.value", "",
                  "attention.output.dense", "", ""};
        n.ln1 = "attention.output.LayerNorm";
        n.ln2 = "output.LayerNorm";
        n.mlp = {"intermediate.dense", "", "output.dense", ""};
        n.softmax_fp32 = false;
        n.upcast_logits = false;
        if (t == "bert") {
            n.mlm_dense = "cls.predictions.transform.dense";
            n.mlm_norm = "cls.predictions.transform.LayerNorm";
            n.mlm_decoder = "cls.predictions.decoder";
            n.mlm_bias = "cls.predictions.bias";
        } else {
            n.mlm_dense = "lm_head.dense";
            n.mlm_norm = "lm_head.layer_norm";
            n.mlm_decoder = "lm_head.decoder";
            n.mlm_bias = "lm_head.bias";
        }
    } else if (t == "t5") {
        n.embed = "shared";
        n.final_norm = "decoder.final_layer_norm";
        n.softmax_upcast_input = true;
        n.scale_scores = false;
        n.upcast_logits = false;
    } else if (t == "opt") {
        n.pos = "embed_positions";
        n.attn.o = "self_attn.out_proj";
        n.ln1 = "self_attn_layer_norm";
        n.ln2 = "final_layer_norm";
        n.mlp = {"fc1", "", "fc2", ""};
        n.final_norm = "final_layer_norm";
    } else if (t == "gpt_neox") {
        n.embed = "embed_in";
        n.attn = {"attention", "", "", "", "attention.query_key_value", "attention.dense", "", ""};
        n.mlp = {"mlp.dense_h_to_4h", "", "mlp.dense_4h_to_h", ""};
        n.final_norm = "final_layer_norm";
        n.lm_head = "embed_out";
    } else if (t == "phi") {
        n.attn.o = "self_attn.dense";
        n.attn.q_norm = "self_attn.q_layernorm";
        n.attn.k_norm = "self_attn.k_layernorm";
        n.mlp = {"mlp.fc1", "", "mlp.fc2", ""};
        n.final_norm = "final_layernorm";
    } else if (t == "falcon") {
        n.embed = "word_embeddings";
        n.attn = {"self_attention", "", "", "", "self_attention.query_key_value", "self_attention.dense", "", ""};
        if (s.parallel_attn && !s.parallel_single_norm) {
            n.ln1 = "ln_attn";
            n.ln2 = "ln_mlp";
        }
        n.mlp = {"mlp.dense_h_to_4h", "", "mlp.dense_4h_to_h", ""};
        n.final_norm = "ln_f";
    } else if (t == "gemma2" || t == "gemma3_text") {
        n.ln2 = "pre_feedforward_layernorm";
        n.ln_post_attn = "post_attention_layernorm";
        n.ln_post_ff = "post_feedforward_layernorm";
    } else if (t == "mixtral") {
        n.moe = "block_sparse_moe";
        n.router = "block_sparse_moe.gate";
        n.experts = "block_sparse_moe.experts";
        n.expert = {"w3", "w1", "w2", ""};
    } else if (t == "qwen2_moe") {
        n.shared = "mlp.shared_expert";
        n.shared_gate = "mlp.shared_expert_gate";
    } else if (t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2") {
        n.router_linear_weight = false;
    }
    if (t == "gpt_oss") {  // GptOssMLP: mlp.router, mlp.experts.{gate_up_proj, down_proj} (with biases)
        n.router = "mlp.router";
        n.expert = {"", "", "down_proj", "gate_up_proj"};
    }
    if (t == "llama4_text") {  // Llama4TextDecoderLayer.feed_forward: Llama4TextMoe or Llama4TextMLP
        n.mlp = {"feed_forward.up_proj", "feed_forward.gate_proj", "feed_forward.down_proj", ""};
        n.moe = "feed_forward";
        n.router = "feed_forward.router";
        n.experts = "feed_forward.experts";
        n.expert = {"", "", "down_proj", "gate_up_proj"};
        n.shared = "feed_forward.shared_expert";
    }
    if (t == "qwen3_next") {  // Qwen3NextSparseMoeBlock: mlp.shared_expert, mlp.shared_expert_gate
        n.shared = "mlp.shared_expert";
        n.shared_gate = "mlp.shared_expert_gate";
    }
    if (t == "qwen3" || t == "qwen3_moe" || t == "gemma3_text" || t == "qwen3_next") {  // Qwen3Attention / Gemma3Attention q_norm, k_norm
        n.attn.q_norm = "self_attn.q_norm";
        n.attn.k_norm = "self_attn.k_norm";
    }
    return n;
}

std::string leaf(const std::string& name) {
    const auto pos = name.rfind('.');
    return pos == std::string::npos ? name : name.substr(pos + 1);
}

Act act_of(const std::string& a, std::vector<std::string>& notes) {
    if (a == "relu") return Act::ReLU;
    if (a == "gelu") return Act::GELU;
    if (a == "gelu_new" || a == "gelu_fast" || a == "gelu_python_tanh") return Act::GELUNew;
    if (a == "gelu_pytorch_tanh") return Act::GELUTanh;
    if (a == "silu" || a == "swish") return Act::SiLU;
    if (a == "tanh") return Act::Tanh;
    if (a == "sigmoid") return Act::Sigmoid;
    notes.push_back("activation \"" + a + "\" modelled as gelu");
    return Act::GELU;
}

struct Ctx {
    const S& s;
    const Names& n;
    BlockBuilder& B;
    std::vector<std::string>& notes;
    Act act;
    [[nodiscard]] Extent tok(std::int64_t k) const { return Extent::per_token(k); }
};

// nn.Linear (or GPT-2 Conv1D, weight [in, out]). `count` > 0 adds `count`
// identical weights (routed experts); add_param=false shares a weight added elsewhere.
// Flags the op just added as the output projection, and its weight.
void mark_output_head(BlockBuilder& B) {
    Op& op = B.block().ops.back();
    op.flags |= kOutputHead;
    for (auto pi : op.params) B.block().params[static_cast<std::size_t>(pi)].output_head = true;
}

TensorId linear(Ctx& c, TensorId x, std::int64_t in, std::int64_t out, bool bias, const std::string& name,
                Component comp, bool add_param = true, std::int64_t count = 0, bool linear_weight = true) {
    const bool custom = add_param && (c.n.conv1d || count > 0 || !linear_weight);
    if (!custom) return c.B.linear(x, in, out, bias, name, comp, add_param);
    const TensorId y = c.B.linear(x, in, out, false, name, comp, false);
    const std::size_t op_index = c.B.block().ops.size() - 1;
    std::vector<std::int64_t> shape = c.n.conv1d ? std::vector<std::int64_t>{in, out} : std::vector<std::int64_t>{out, in};
    const auto w = c.B.param(name + ".weight", shape, comp, leaf(name), linear_weight, count > 0 ? count : 1);
    c.B.block().ops[op_index].params.push_back(w);
    if (bias) {
        const auto b = c.B.param(name + ".bias", {out}, comp, leaf(name), false, count > 0 ? count : 1);
        c.B.block().ops[op_index].params.push_back(b);
    }
    return y;
}

// GemmaRMSNorm: out = _norm(x.float()) * (1 + w.float()), then .type_as(x).
TensorId gemma_rmsnorm(Ctx& c, TensorId x, std::int64_t dim, const std::string& name, Component comp,
                       bool add_param) {
    BlockBuilder& B = c.B;
    const Extent e = B.info(x).extent;
    const Extent rows = extent_div(e, dim);
    const ActRole role = B.info(x).role;
    const TensorId xf = B.cast(x, ActRole::Float32, name + ".float");
    const TensorId rs = B.tensor(name + ".rsqrt", rows, ActRole::Float32);
    B.op(OpKind::Elementwise, name + ".pow_mean_rsqrt", {xf}, {rs}, {{xf, false}, {rs, false}});
    const TensorId h = B.elementwise({xf, rs}, e, ActRole::Float32, {xf, rs}, name + ".normalize");
    const TensorId of = B.tensor(name + ".scaled", e, ActRole::Float32);
    Op& o = B.op(OpKind::RMSNorm, name, {h}, {of}, {{h, false}});
    o.flops = extent_mul(e, 4);
    const std::size_t op_index = B.block().ops.size() - 1;
    if (add_param) {
        const auto w = B.param(name + ".weight", {dim}, comp);
        B.block().ops[op_index].params.push_back(w);
    }
    return B.cast(of, role, name + ".type_as");
}

TensorId norm(Ctx& c, TensorId x, std::int64_t dim, const std::string& name, Component comp = Component::Norms,
              bool add_param = true) {
    if (c.s.norm == S::Norm::LayerNorm) return c.B.layernorm(x, dim, c.s.norm_bias, name, comp, add_param);
    if (c.s.gemma_norm) return gemma_rmsnorm(c, x, dim, name, comp, add_param);
    return c.B.rmsnorm(x, dim, name, comp, add_param);
}

TensorId dropout(Ctx& c, TensorId x, double p, const std::string& name, std::uint8_t flags = 0) {
    return c.B.dropout(x, p, name, flags);
}

// Rotary embedding on `heads` heads of `dim` (the first `rot` dims rotated):
// q*cos + rotate_half(q)*sin, rotate_half = cat(-x2, x1). Multiplications by
// the cos/sin buffers save only those small [s, d] buffers (not modelled), so
// nothing is saved here. cos/sin follow the hidden-state dtype (fp32 under
// autocast), hence the Stream role of the result.
TensorId rotary(Ctx& c, TensorId t, std::int64_t heads, std::int64_t dim, std::int64_t rot, const std::string& name) {
    BlockBuilder& B = c.B;
    const Extent full = c.tok(heads * dim);
    const Extent re = c.tok(heads * rot);
    const TensorId tr = rot < dim ? B.view(t, re, name + ".rot_slice") : t;
    const TensorId a = B.elementwise({tr}, re, ActRole::Stream, {}, name + ".mul_cos");
    const TensorId rh = B.elementwise({tr}, re, B.info(tr).role, {}, name + ".rotate_half");
    const TensorId b = B.elementwise({rh}, re, ActRole::Stream, {}, name + ".mul_sin");
    TensorId e = B.add(a, b, name + ".add");
    if (rot < dim) e = B.elementwise({e, t}, full, ActRole::Stream, {}, name + ".cat_pass");
    return e;
}

struct CoreOpts {
    std::string prefix;
    std::int64_t heads = 0, qk_dim = 0, v_dim = 0;
    bool q_contig = false, k_contig = false, v_contig = false;  // false: matmul copies the permuted tensor
    bool mask = true;                                          // `scores + mask` (a new tensor)
    bool causal = false;                                       // decoder self-attention
};

// Eager attention core: softmax(q k^T * scale + mask) @ v, then transpose back.
TensorId core(Ctx& c, TensorId q, TensorId k, TensorId v, const CoreOpts& o) {
    BlockBuilder& B = c.B;
    const Extent qe = c.tok(o.heads * o.qk_dim);
    const Extent ve = c.tok(o.heads * o.v_dim);
    const Extent sc = Extent::per_token2(o.heads);
    const std::string& p = o.prefix;
    // torch.matmul on 4-D tensors reshapes them to 3-D: a permuted tensor is copied.
    const TensorId qm = o.q_contig ? q : B.copy(q, qe, p + ".q_contiguous", ActRole::Lowered);
    const TensorId km = o.k_contig ? k : B.copy(k, qe, p + ".k_contiguous", ActRole::Lowered);
    TensorId x = B.matmul(qm, km, sc, 2 * o.qk_dim, p + ".scores", true, true, kAttnCore);
    if (c.n.scale_scores) x = B.elementwise({x}, sc, ActRole::Lowered, {}, p + ".scale", kAttnCore);
    if (c.s.attn_logit_softcap > 0.0) {
        // gemma2: scores = tanh(scores / cap) * cap; tanh saves its output.
        x = B.elementwise({x}, sc, ActRole::Lowered, {}, p + ".softcap_div", kAttnCore);
        x = B.activation(x, Act::Tanh, p + ".softcap_tanh");
        B.block().ops.back().flags = kAttnCore;
        x = B.elementwise({x}, sc, ActRole::Lowered, {}, p + ".softcap_mul", kAttnCore);
    }
    if (o.mask) x = B.elementwise({x}, sc, ActRole::Lowered, {}, p + ".mask", kAttnCore);
    if (c.n.softmax_fp32 || c.n.softmax_upcast_input) {
        // T5's scores.float() is a copy in every 16-bit dtype; softmax(dtype=
        // float32) copies its input too, but for fp16 (the fused half_to_float
        // kernel, aten/src/ATen/native/SoftMax.cpp softmax(input, dim, dtype)).
        x = B.cast(x, c.n.softmax_upcast_input ? ActRole::Float32 : ActRole::Float32UnlessHalf, p + ".scores_float");
        B.block().ops.back().flags = kAttnCore;
        x = B.softmax(x, p + ".softmax", ActRole::Float32, kAttnCore);
        x = B.cast(x, ActRole::Lowered, p + ".softmax_to_dtype");
        B.block().ops.back().flags = kAttnCore;
    } else {
        x = B.softmax(x, p + ".softmax", ActRole::Upcast, kAttnCore);
    }
    x = dropout(c, x, c.s.attn_dropout, p + ".attn_dropout", kAttnCore);
    const TensorId vm = o.v_contig ? v : B.copy(v, ve, p + ".v_contiguous", ActRole::Lowered);
    const TensorId out = B.matmul(x, vm, ve, 0, p + ".attn_v", true, true, kAttnCore);
    B.block().ops.back().flops = Extent::per_token2(2 * o.heads * o.v_dim);
    // Fused kernels (SDPA/flash) and selective recompute keep q, k, v (+ out) instead.
    B.mark_attention(q, k, v, out, o.heads, o.causal);
    // attn_output.transpose(1, 2).contiguous().reshape(b, s, -1)
    return B.copy(out, ve, p + ".transpose_contiguous", ActRole::Lowered);
}

struct AttnOpts {
    const AttnNames* names = nullptr;
    TensorId kv_source = -1;       // cross-attention: keys/values from the encoder
    bool rel_bias_param = false;   // T5 first layer: relative_attention_bias
    bool rel_bias = false;         // T5: position bias added in place (no mask op)
    bool causal = true;
};

TensorId attention(Ctx& c, TensorId x, const AttnOpts& a) {
    const S& s = c.s;
    BlockBuilder& B = c.B;
    const AttnNames& nm = *a.names;
    const std::int64_t h = s.hidden, H = s.heads, KV = s.kv_heads, d = s.head_dim;
    TensorId q = 0, k = 0, v = 0;
    if (s.fused_qkv && a.kv_source < 0) {
        const TensorId qkv = linear(c, x, h, (H + 2 * KV) * d, s.qkv_bias, nm.qkv, Component::Attention);
        q = B.view(qkv, c.tok(H * d), nm.core + ".q");
        k = B.view(qkv, c.tok(KV * d), nm.core + ".k");
        v = B.view(qkv, c.tok(KV * d), nm.core + ".v");
    } else {
        const TensorId src = a.kv_source >= 0 ? a.kv_source : x;
        q = linear(c, x, h, H * d * (s.attn_output_gate ? 2 : 1), s.qkv_bias, nm.q, Component::Attention);
        k = linear(c, src, h, KV * d, s.qkv_bias, nm.k, Component::Attention);
        v = linear(c, src, h, KV * d, s.qkv_bias, nm.v, Component::Attention);
    }
    TensorId gate = -1;
    if (s.attn_output_gate) {
        // Qwen3NextAttention: torch.chunk(q_proj(x).view(..., 2 * head_dim), 2): the
        // query a view (q_norm makes it new), the gate reshaped into a copy.
        const TensorId qg = q;
        q = B.view(qg, c.tok(H * d), nm.core + ".query");
        gate = B.copy(qg, c.tok(H * d), nm.core + ".gate", B.info(qg).role);
    }
    if (s.attention_sinks) {  // GptOssAttention.sinks: one learned logit per head
        B.param_of_last_op(nm.core + ".sinks", {H}, Component::Attention, "sinks");
    }
    if (s.qk_norm && s.norm == S::Norm::RMSNorm) {  // Qwen3Attention: q_norm / k_norm = RMSNorm(head_dim)
        q = B.rmsnorm(q, d, nm.q_norm, Component::Attention);
        k = B.rmsnorm(k, d, nm.k_norm, Component::Attention);
    } else if (s.qk_norm) {
        q = B.layernorm(q, d, true, nm.q_norm, Component::Attention);
        k = B.layernorm(k, d, true, nm.k_norm, Component::Attention);
    }
    if (s.pos == S::Pos::Rotary && a.kv_source < 0) {
        auto rot = static_cast<std::int64_t>(static_cast<double>(d) * s.rotary_pct);
        if (rot > d) rot = d;
        if (rot > 0) {
            q = rotary(c, q, H, d, rot, nm.core + ".rotary_q");
            k = rotary(c, k, KV, d, rot, nm.core + ".rotary_k");
        }
    }
    CoreOpts co;
    co.prefix = nm.core;
    co.heads = H;
    co.qk_dim = d;
    co.v_dim = d;
    if (KV < H) {
        // repeat_kv: expand + reshape materializes contiguous [b, H, s, d] copies.
        k = B.copy(k, c.tok(H * d), nm.core + ".repeat_kv_k", B.info(k).role);
        v = B.copy(v, c.tok(H * d), nm.core + ".repeat_kv_v", B.info(v).role);
        co.k_contig = co.v_contig = true;
    }
    if (a.rel_bias_param) {
        // position_bias = relative_attention_bias(buckets).permute + mask: [b, H, s, s],
        // computed once in the first layer and reused (the [s, s] int64 buckets are not modelled).
        const TensorId pb = B.tensor(nm.core + ".position_bias", Extent::per_token2(H), ActRole::Stream);
        B.op(OpKind::Embedding, nm.core + ".relative_attention_bias", {}, {pb});
        B.param_of_last_op(nm.core + ".relative_attention_bias.weight", {s.relative_buckets, H}, Component::Attention, "relative_attention_bias");
    }
    co.mask = !a.rel_bias;  // T5 adds the (masked) position bias in place
    co.causal = a.causal;
    TensorId out = core(c, q, k, v, co);
    if (gate >= 0) {  // attn_output * torch.sigmoid(gate): sigmoid saves its output, the product both inputs
        const TensorId sg = B.activation(gate, Act::Sigmoid, nm.core + ".gate_sigmoid");
        out = B.elementwise({out, sg}, c.tok(H * d), B.info(out).role, {out, sg}, nm.core + ".gate_mul");
    }
    return linear(c, out, H * d, h, s.o_bias, nm.o, Component::Attention);
}

// Qwen3NextGatedDeltaNet (modeling_qwen3_next.py), eager path: in_proj_qkvz
// and in_proj_ba; the q, k, v part through a depthwise causal conv1d (kernel
// K, no bias, weight [conv_dim, 1, K]) and SiLU; beta = sigmoid(b) and g =
// -exp(A_log) * softplus(a + dt_bias) per value head; the chunked gated delta
// rule (modelled as one op that saves q, k, v, g and beta, as the fused
// kernels do); RMSNormGated(out, z) with a weight of v_dim; out_proj.
TensorId gated_delta_net(Ctx& c, TensorId x) {
    const S& s = c.s;
    BlockBuilder& B = c.B;
    const std::int64_t h = s.hidden, nv = s.linear_v_heads, dk = s.linear_k_dim, dv = s.linear_v_dim, K = s.linear_conv_kernel;
    const std::int64_t kd = checked_mul(s.linear_k_heads, dk), vd = checked_mul(nv, dv), conv = checked_add(checked_mul(2, kd), vd);
    const std::string p = "linear_attn";
    const TensorId qkvz = linear(c, x, h, checked_add(conv, vd), false, p + ".in_proj_qkvz", Component::Attention);
    const TensorId ba = linear(c, x, h, checked_mul(2, nv), false, p + ".in_proj_ba", Component::Attention);
    const ActRole role = B.info(qkvz).role;
    // fix_query_key_value_ordering + torch.cat((q, k, v)): the conv input.
    const TensorId mixed = B.copy(qkvz, c.tok(conv), p + ".mixed_qkv", role);
    const TensorId z = B.copy(qkvz, c.tok(vd), p + ".z", role);
    const TensorId cv = B.tensor(p + ".conv1d.out", c.tok(conv), role);
    Op& co = B.op(OpKind::Elementwise, p + ".conv1d", {mixed}, {cv}, {{mixed, false}});
    co.flops = c.tok(checked_mul(checked_mul(2, conv), K));
    B.param_of_last_op(p + ".conv1d.weight", {conv, 1, K}, Component::Attention, "conv1d");
    const TensorId act = B.activation(cv, Act::SiLU, p + ".conv1d.silu");
    const TensorId q = B.view(act, c.tok(kd), p + ".query");
    const TensorId k = B.view(act, c.tok(kd), p + ".key");
    const TensorId v = B.view(act, c.tok(vd), p + ".value");
    const TensorId beta = B.activation(B.view(ba, c.tok(nv), p + ".b"), Act::Sigmoid, p + ".beta");
    const TensorId g = B.elementwise({ba}, c.tok(nv), ActRole::Float32, {ba}, p + ".g");
    B.param_of_last_op(p + ".A_log", {nv}, Component::Attention, "A_log");
    B.param_of_last_op(p + ".dt_bias", {nv}, Component::Attention, "dt_bias");
    const TensorId core = B.tensor(p + ".core_attn_out", c.tok(vd), role);
    Op& dr = B.op(OpKind::Elementwise, p + ".chunk_gated_delta_rule", {q, k, v, g, beta}, {core},
                  {{q, false}, {k, false}, {v, false}, {g, false}, {beta, false}});
    dr.flops = c.tok(checked_mul(checked_mul(nv, 6), checked_mul(dk, dv)));  // state update and read-out per token and head (an estimate)
    const TensorId normed = B.elementwise({core, z}, c.tok(vd), role, {core, z}, p + ".norm");
    B.param_of_last_op(p + ".norm.weight", {dv}, Component::Norms, "norm");
    return linear(c, normed, vd, h, false, p + ".out_proj", Component::Attention);
}

// DeepSeek multi-head latent attention (DeepseekV3Attention eager).
TensorId mla(Ctx& c, TensorId x) {
    const S& s = c.s;
    BlockBuilder& B = c.B;
    const std::int64_t h = s.hidden, H = s.heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim,
                       vd = s.v_head_dim, dq = nope + rope, kvl = s.kv_lora_rank;
    TensorId q = 0;
    if (s.q_lora_rank > 0) {
        const TensorId qa = linear(c, x, h, s.q_lora_rank, s.qkv_bias, "self_attn.q_a_proj", Component::Attention);
        const TensorId qn = B.rmsnorm(qa, s.q_lora_rank, "self_attn.q_a_layernorm", Component::Norms);
        q = linear(c, qn, s.q_lora_rank, H * dq, false, "self_attn.q_b_proj", Component::Attention);
    } else {
        q = linear(c, x, h, H * dq, false, "self_attn.q_proj", Component::Attention);
    }
    const TensorId ckv = linear(c, x, h, kvl + rope, s.qkv_bias, "self_attn.kv_a_proj_with_mqa", Component::Attention);
    const TensorId k_pass = B.view(ckv, c.tok(kvl), "self_attn.k_pass");
    const TensorId k_rot0 = B.view(ckv, c.tok(rope), "self_attn.k_rot");
    const TensorId kn = B.rmsnorm(k_pass, kvl, "self_attn.kv_a_layernorm", Component::Norms);
    const TensorId kv = linear(c, kn, kvl, H * (nope + vd), false, "self_attn.kv_b_proj", Component::Attention);
    const TensorId k_nope = B.view(kv, c.tok(H * nope), "self_attn.k_nope");
    const TensorId v = B.view(kv, c.tok(H * vd), "self_attn.value");
    const TensorId q_pass = B.view(q, c.tok(H * nope), "self_attn.q_pass");
    const TensorId q_rot0 = B.view(q, c.tok(H * rope), "self_attn.q_rot");
    const TensorId q_rot = rotary(c, q_rot0, H, rope, rope, "self_attn.rotary_q");
    const TensorId k_rot = rotary(c, k_rot0, 1, rope, rope, "self_attn.rotary_k");
    // torch.cat((pass, rot), -1): new contiguous [b, H, s, dq] tensors (k_rot expanded to H heads).
    const TensorId qf = B.elementwise({q_pass, q_rot}, c.tok(H * dq), ActRole::Stream, {}, "self_attn.query_cat");
    const TensorId kf = B.elementwise({k_nope, k_rot}, c.tok(H * dq), ActRole::Stream, {}, "self_attn.key_cat");
    CoreOpts co;
    co.prefix = "self_attn";
    co.heads = H;
    co.qk_dim = dq;
    co.v_dim = vd;
    co.q_contig = co.k_contig = true;
    co.causal = true;
    const TensorId out = core(c, qf, kf, v, co);
    return linear(c, out, H * vd, h, s.o_bias, "self_attn.o_proj", Component::Attention);
}

struct MlpOpts {
    MlpNames names;
    std::int64_t rows_factor = 1;  // experts: input extent is per_token(k * hidden)
    std::int64_t inter = 0;
    bool bias = false;
    bool gated = true;
    bool fused_gate_up = false;
    Component comp = Component::Mlp;
    std::int64_t count = 0;  // routed experts: weights added once with this count
};

TensorId mlp(Ctx& c, TensorId x, const MlpOpts& m) {
    BlockBuilder& B = c.B;
    const std::int64_t h = c.s.hidden, I = m.inter;
    const MlpNames& nm = m.names;
    TensorId y = 0;
    if (!m.gated) {
        TensorId u = linear(c, x, h, I, m.bias, nm.up, m.comp, true, m.count);
        u = B.activation(u, c.act, nm.up + ".act");
        u = dropout(c, u, c.s.act_dropout, nm.up + ".act_dropout");
        y = linear(c, u, I, h, m.bias, nm.down, m.comp, true, m.count);
    } else if (m.fused_gate_up) {
        const TensorId gu = linear(c, x, h, 2 * I, m.bias, nm.gate_up, m.comp, true, m.count);
        const TensorId g = B.view(gu, extent_mul(c.tok(I), m.rows_factor), nm.gate_up + ".gate");
        const TensorId u = B.view(gu, extent_mul(c.tok(I), m.rows_factor), nm.gate_up + ".up");
        const TensorId a = B.activation(g, c.act, nm.gate_up + ".act");
        TensorId p = B.mul(u, a, nm.gate_up + ".mul");
        p = dropout(c, p, c.s.act_dropout, nm.gate_up + ".act_dropout");
        y = linear(c, p, I, h, m.bias, nm.down, m.comp, true, m.count);
    } else {
        const TensorId g = linear(c, x, h, I, m.bias, nm.gate, m.comp, true, m.count);
        const TensorId a = B.activation(g, c.act, nm.gate + ".act");
        const TensorId u = linear(c, x, h, I, m.bias, nm.up, m.comp, true, m.count);
        TensorId p = B.mul(a, u, nm.down + ".input_mul");
        p = dropout(c, p, c.s.act_dropout, nm.down + ".act_dropout");
        y = linear(c, p, I, h, m.bias, nm.down, m.comp, true, m.count);
    }
    return y;
}

MlpOpts dense_mlp_opts(const Ctx& c, std::int64_t inter) {
    MlpOpts m;
    m.names = c.n.mlp;
    m.inter = inter;
    m.bias = c.s.mlp_bias;
    m.gated = c.s.mlp == S::Mlp::Gated;
    m.fused_gate_up = c.s.fused_gate_up;
    return m;
}

MlpNames prefixed(const std::string& prefix, const MlpNames& n) {
    auto f = [&](const std::string& x) { return x.empty() ? x : prefix + "." + x; };
    return {f(n.up), f(n.gate), f(n.down), f(n.gate_up)};
}

// Sparse MoE block: tokens are routed to top_k experts; the experts run on the
// gathered rows (b*s*top_k in all) and are modelled as one gathered tensor.
TensorId moe(Ctx& c, TensorId x) {
    const S& s = c.s;
    BlockBuilder& B = c.B;
    const Names& n = c.n;
    const std::int64_t h = s.hidden, E = s.experts, K = s.experts_per_token;
    // Router.
    const TensorId logits = linear(c, x, h, E, s.router_linear_bias, n.router, Component::Router, true, 0, n.router_linear_weight);
    if (s.router_bias) {
        B.param_of_last_op(n.router + ".e_score_correction_bias", {E}, Component::Router, leaf(n.router));
    }
    const TensorId scores = s.router_sigmoid ? B.activation(B.cast(logits, ActRole::Float32, n.router + ".float"),
                                                            Act::Sigmoid, n.router + ".sigmoid")
                                             : B.softmax(logits, n.router + ".softmax", ActRole::Float32);
    const TensorId topw = B.tensor(n.router + ".topk_weights", c.tok(K), ActRole::Float32);
    const TensorId topi = B.tensor(n.router + ".topk_indices", c.tok(K), ActRole::Index64);
    B.op(OpKind::Router, n.router + ".topk", {scores}, {topw, topi}, {{topi, false}});
    const TensorId w = B.cast(topw, ActRole::Lowered, n.router + ".weights_to_dtype");
    // Gather the routed rows (hidden_states[top_x]: index saves the int64 row ids).
    const TensorId gathered = B.tensor(n.experts + ".gathered", c.tok(K * h), B.info(x).role);
    B.op(OpKind::Experts, n.experts + ".gather", {x, topi}, {gathered}, {{topi, false}});
    MlpOpts m;
    m.names = prefixed(n.experts, n.expert);
    m.inter = s.moe_intermediate;
    m.gated = true;
    m.bias = s.expert_bias;
    m.fused_gate_up = s.fused_expert_gate_up;
    m.comp = Component::Experts;
    m.count = E;
    m.rows_factor = K;
    const TensorId ey = mlp(c, gathered, m);
    // expert_out * routing_weight (saves both), then index_add_ into the output (saves the index).
    const TensorId weighted =
        B.elementwise({ey, w}, c.tok(K * h), ActRole::Lowered, {ey, w}, n.experts + ".weighted");
    const TensorId combined = B.tensor(n.moe + ".routed_output", c.tok(h), ActRole::Lowered);
    B.op(OpKind::Experts, n.moe + ".index_add", {weighted, topi}, {combined}, {{topi, false}});
    TensorId out = combined;
    if (s.shared_experts > 0 && s.shared_expert_intermediate > 0) {
        MlpOpts sm;
        sm.names = prefixed(n.shared, {"up_proj", "gate_proj", "down_proj", ""});
        sm.inter = s.shared_expert_intermediate;
        sm.gated = true;
        TensorId sy = mlp(c, x, sm);
        if (s.shared_expert_gate) {
            const TensorId g = linear(c, x, h, 1, false, n.shared_gate, Component::Router);
            const TensorId sg = B.activation(g, Act::Sigmoid, n.shared_gate + ".sigmoid");
            sy = B.elementwise({sg, sy}, c.tok(h), ActRole::Lowered, {sg, sy}, n.shared_gate + ".mul");
        }
        out = B.add(out, sy, n.moe + ".add_shared");
    }
    return out;
}

// One decoder (or encoder) layer. x is the residual stream.
TensorId layer(Ctx& c, TensorId x, bool moe_layer, bool linear_layer = false) {
    const S& s = c.s;
    const Names& n = c.n;
    BlockBuilder& B = c.B;
    const std::int64_t h = s.hidden;
    AttnOpts ao;
    ao.names = &n.attn;
    ao.causal = !(s.model_type == "bert" || s.model_type == "roberta");  // encoders attend both ways
    auto attn = [&](TensorId in) { return linear_layer ? gated_delta_net(c, in) : s.mla ? mla(c, in) : attention(c, in, ao); };
    auto ffn = [&](TensorId in) { return moe_layer ? moe(c, in) : mlp(c, in, dense_mlp_opts(c, s.intermediate)); };

    if (s.post_norm) {
        // BERT / OPT (do_layer_norm_before=False): LayerNorm after each residual add.
        TensorId a = attn(x);
        a = dropout(c, a, s.resid_dropout, n.attn.o + ".dropout");
        const TensorId x1 = norm(c, B.add(a, x, "attn_residual"), h, n.ln1);
        TensorId m = ffn(x1);
        m = dropout(c, m, s.resid_dropout, n.mlp.down + ".dropout");
        return norm(c, B.add(m, x1, "mlp_residual"), h, n.ln2);
    }
    if (s.parallel_attn) {
        // GPT-NeoX / Phi / Falcon: attention and MLP both read the (normed) layer input.
        const TensorId n1 = norm(c, x, h, n.ln1);
        TensorId a = attn(n1);
        a = dropout(c, a, s.resid_dropout, n.attn.o + ".dropout");
        const TensorId n2 = s.parallel_single_norm ? n1 : norm(c, x, h, n.ln2);
        TensorId m = ffn(n2);
        m = dropout(c, m, s.resid_dropout, n.mlp.down + ".dropout");
        return B.add(B.add(m, a, "mlp_plus_attn"), x, "residual");
    }
    // Pre-norm sequential (GPT-2, Llama family, OPT, Falcon without parallel_attn).
    const TensorId n1 = norm(c, x, h, n.ln1);
    TensorId a = attn(n1);
    if (s.sandwich_norm) a = norm(c, a, h, n.ln_post_attn);
    a = dropout(c, a, s.resid_dropout, n.attn.o + ".dropout");
    const TensorId x1 = B.add(x, a, "attn_residual");
    const TensorId n2 = norm(c, x1, h, n.ln2);
    TensorId m = ffn(n2);
    if (s.sandwich_norm) m = norm(c, m, h, n.ln_post_ff);
    m = dropout(c, m, s.resid_dropout, n.mlp.down + ".dropout");
    return B.add(x1, m, "mlp_residual");
}

// T5Block: self-attention, (decoder) cross-attention, feed-forward; each
// sublayer is x + dropout(sublayer(layer_norm(x))).
TensorId t5_layer(Ctx& c, TensorId x, bool decoder, bool first, TensorId enc) {
    const S& s = c.s;
    BlockBuilder& B = c.B;
    const std::int64_t h = s.hidden;
    const AttnNames self_names{"layer.0.SelfAttention", "layer.0.SelfAttention.q", "layer.0.SelfAttention.k",
                               "layer.0.SelfAttention.v", "", "layer.0.SelfAttention.o", "", ""};
    const AttnNames cross_names{"layer.1.EncDecAttention", "layer.1.EncDecAttention.q", "layer.1.EncDecAttention.k",
                                "layer.1.EncDecAttention.v", "", "layer.1.EncDecAttention.o", "", ""};
    AttnOpts ao;
    ao.names = &self_names;
    ao.rel_bias_param = first;
    ao.rel_bias = true;
    ao.causal = decoder;
    TensorId a = attention(c, norm(c, x, h, "layer.0.layer_norm"), ao);
    a = dropout(c, a, s.resid_dropout, "layer.0.dropout");
    x = B.add(x, a, "layer.0.residual");
    int ff_index = 1;
    if (decoder) {
        AttnOpts co;
        co.names = &cross_names;
        co.kv_source = enc;
        co.rel_bias = true;  // zero position bias + encoder mask, computed once and added in place
        co.causal = false;
        TensorId ca = attention(c, norm(c, x, h, "layer.1.layer_norm"), co);
        ca = dropout(c, ca, s.resid_dropout, "layer.1.dropout");
        x = B.add(x, ca, "layer.1.residual");
        ff_index = 2;
    }
    const std::string ff = "layer." + std::to_string(ff_index);
    MlpOpts m;
    m.gated = s.mlp == S::Mlp::Gated;
    m.inter = s.intermediate;
    m.bias = false;
    m.names = m.gated ? MlpNames{ff + ".DenseReluDense.wi_1", ff + ".DenseReluDense.wi_0", ff + ".DenseReluDense.wo", ""}
                      : MlpNames{ff + ".DenseReluDense.wi", "", ff + ".DenseReluDense.wo", ""};
    TensorId f = mlp(c, norm(c, x, h, ff + ".layer_norm"), m);
    f = dropout(c, f, s.resid_dropout, ff + ".dropout");
    return B.add(x, f, ff + ".residual");
}

// An encoder-decoder model's decoder side (SeqAxis, model/graph.hpp): the
// block's tensors are decoder tokens, except what is computed from the encoder
// output alone (cross-attention k, v and their copies keep the encoder's
// length); scores of decoder queries against encoder keys are Cross, and so is
// what follows them until the weighted sum returns to decoder tokens.
void set_decoder_axes(Block& b) {
    // The block's input and new data are decoder tokens; the encoder output
    // (the tensor shared with the encoder) has the encoder's length.
    for (auto& t : b.tensors) t.axis = t.shared_key.empty() ? SeqAxis::Decoder : SeqAxis::Main;
    for (const Op& op : b.ops) {
        bool main = false, dec = false, cross = false;
        for (auto t : op.inputs) {
            const SeqAxis a = b.tensors[static_cast<std::size_t>(t)].axis;
            main = main || a == SeqAxis::Main;
            dec = dec || a == SeqAxis::Decoder;
            cross = cross || a == SeqAxis::Cross;
        }
        for (auto t : op.outputs) {
            auto& info = b.tensors[static_cast<std::size_t>(t)];
            if (!info.shared_key.empty()) continue;
            if (main && !dec && !cross) info.axis = SeqAxis::Main;
            else if (info.extent.c2 != 0 && (cross || (main && dec))) info.axis = SeqAxis::Cross;
            else info.axis = SeqAxis::Decoder;  // decoder tokens, decoder self-attention, new inputs
        }
    }
}

Block embeddings_block(const S& s, const Names& n, DType dt, std::vector<std::string>& notes, Act act) {
    BlockBuilder B("embeddings", 1, dt);
    Ctx c{s, n, B, notes, act};
    const TensorId ids = B.data("input_ids", Extent::per_token(1), ActRole::Index64);
    const bool proj = s.word_embed_proj_dim > 0 && s.word_embed_proj_dim != s.hidden;
    const std::int64_t edim = proj ? s.word_embed_proj_dim : s.hidden;
    TensorId x = B.embedding(ids, s.vocab, edim, n.embed, Component::Embeddings);
    for (const auto& ep : s.extra_params) {  // a VLM's vision tower and projector: parameters only
        B.param_of_last_op(ep.name, ep.shape, ep.component, leaf(ep.name));
    }
    if (proj) x = linear(c, x, edim, s.hidden, false, "project_in", Component::Embeddings);
    if (s.embed_scale) x = B.elementwise({x}, Extent::per_token(s.hidden), ActRole::Stream, {}, "embed_scale");
    if (s.token_types > 0) {
        const TensorId tt = B.data("token_type_ids", Extent::per_token(1), ActRole::Index64);
        x = B.add(x, B.embedding(tt, s.token_types, s.hidden, n.type, Component::Embeddings, true, false), "add_token_type");
    }
    if (s.pos == S::Pos::Learned) {
        const TensorId pid = B.data("position_ids", Extent::per_token(1), ActRole::Index64);
        x = B.add(x, B.embedding(pid, s.max_positions + s.pos_offset, s.hidden, n.pos, Component::Embeddings, true, false),
                  "add_positions");
    }
    if (s.embed_norm) x = B.layernorm(x, s.hidden, s.norm_bias, n.embed_norm, Component::Norms);
    x = B.dropout(x, s.embd_dropout, "embed_dropout");
    return B.finish(x);
}

Block head_block(const S& s, const Names& n, DType dt, std::vector<std::string>& notes, Act act) {
    BlockBuilder B("head", 1, dt);
    Ctx c{s, n, B, notes, act};
    const std::int64_t h = s.hidden, V = s.vocab;
    TensorId x = B.input("hidden_states", Extent::per_token(h), ActRole::Stream);
    const bool t5 = s.model_type == "t5";
    if (t5) {
        x = norm(c, x, h, "decoder.final_layer_norm");
        x = B.dropout(x, s.resid_dropout, "decoder.dropout");
    } else if (s.final_norm) {
        x = norm(c, x, h, n.final_norm);
    }
    switch (s.head) {
        case S::Head::CausalLM:
        case S::Head::Seq2SeqLM: {
            std::int64_t in = h;
            if (s.word_embed_proj_dim > 0 && s.word_embed_proj_dim != h) {
                x = linear(c, x, h, s.word_embed_proj_dim, false, "project_out", Component::Head);
                in = s.word_embed_proj_dim;
            }
            // T5 with tied embeddings rescales before the shared-weight projection.
            if (t5 && s.tie_embeddings)
                x = B.elementwise({x}, Extent::per_token(h), B.info(x).role, {}, "scale_model_dim");
            TensorId logits = linear(c, x, in, V, s.lm_head_bias && !s.tie_embeddings, n.lm_head, Component::Head,
                                     !s.tie_embeddings);
            mark_output_head(B);
            if (s.tie_embeddings && s.lm_head_bias) {
                B.param_of_last_op(n.lm_head + ".bias", {V}, Component::Head, leaf(n.lm_head));
            }
            if (s.final_logit_softcap > 0.0) {
                logits = B.elementwise({logits}, Extent::per_token(V), ActRole::Lowered, {}, "softcap_div");
                logits = B.activation(logits, Act::Tanh, "softcap_tanh");
                logits = B.elementwise({logits}, Extent::per_token(V), ActRole::Lowered, {}, "softcap_mul");
            }
            B.cross_entropy(logits, Extent::per_token(V), Extent::per_token(1), n.upcast_logits, "loss");
            break;
        }
        case S::Head::MaskedLM: {
            TensorId t = linear(c, x, h, h, true, n.mlm_dense, Component::Head);
            t = B.activation(t, act, n.mlm_dense + ".act");
            t = B.layernorm(t, h, true, n.mlm_norm, Component::Head);
            const TensorId logits = linear(c, t, h, V, false, n.mlm_decoder, Component::Head, !s.tie_embeddings);
            mark_output_head(B);
            B.param_of_last_op(n.mlm_bias, {V}, Component::Head, leaf(n.mlm_decoder));
            B.cross_entropy(logits, Extent::per_token(V), Extent::per_token(1), false, "loss");
            break;
        }
        case S::Head::BaseModel: {
            if (s.pooler) {
                // BertPooler: dense + tanh on the first token.
                const TensorId first = B.copy(x, Extent::per_sample(h), "pooler.first_token", B.info(x).role);
                TensorId p = linear(c, first, h, h, true, "pooler.dense", Component::Head);
                p = B.activation(p, Act::Tanh, "pooler.activation");
                B.sum_loss(p, "loss");
                notes.push_back("base model without a task head: training loss modelled as a sum of its outputs");
            } else {
                B.sum_loss(x, "loss");
                notes.push_back("base model without an LM head: training loss modelled as a sum of its outputs");
            }
            break;
        }
    }
    return B.finish(B.block().tensors.size() > 0 ? static_cast<TensorId>(B.block().tensors.size() - 1) : 0);
}

std::string run_name(const std::string& prefix, std::int64_t a, std::int64_t b, bool whole) {
    if (whole) return prefix;
    return prefix + "." + std::to_string(a) + (b > a ? "-" + std::to_string(b) : "");
}

bool is_linear(const S& s, std::int64_t i) {
    return static_cast<std::size_t>(i) < s.linear_attn_layers.size() && s.linear_attn_layers[static_cast<std::size_t>(i)];
}

bool is_sparse(const S& s, std::int64_t i) {
    if (s.experts <= 0) return false;
    if (!s.sparse_layers.empty())
        return static_cast<std::size_t>(i) < s.sparse_layers.size() && s.sparse_layers[static_cast<std::size_t>(i)];
    return i >= s.first_k_dense && i % std::max<std::int64_t>(1, s.moe_layer_freq) == 0;
}

}  // namespace

ModelGraph build_transformer(const TransformerSpec& s, DType weight_dtype) {
    ModelGraph g;
    g.name = s.arch_class.empty() ? s.model_type : s.arch_class;
    g.family = s.model_type;
    g.source = "config.json";
    g.notes = s.notes;
    g.max_positions = s.max_positions;
    const Names n = names_for(s);
    const Act act = act_of(s.act, g.notes);

    g.blocks.push_back(embeddings_block(s, n, weight_dtype, g.notes, act));

    const std::int64_t h = s.hidden;
    if (s.model_type == "t5") {
        auto stack = [&](const std::string& prefix, std::int64_t count, bool decoder) {
            for (int part = 0; part < 2; ++part) {
                const std::int64_t repeat = part == 0 ? std::min<std::int64_t>(1, count) : count - 1;
                if (repeat <= 0) continue;
                BlockBuilder B(run_name(prefix, part, part == 0 ? 0 : count - 1, false), repeat, weight_dtype);
                B.block().checkpointable = true;
                Ctx c{s, n, B, g.notes, act};
                TensorId x = B.input("hidden_states", Extent::per_token(h), ActRole::Stream);
                const TensorId enc =
                    decoder ? B.data("encoder_hidden_states", Extent::per_token(h), ActRole::Stream) : -1;
                if (enc >= 0) B.block().tensors[static_cast<std::size_t>(enc)].shared_key = "encoder_hidden_states";
                x = t5_layer(c, x, decoder, part == 0, enc);
                g.blocks.push_back(B.finish(x));
                if (decoder) set_decoder_axes(g.blocks.back());
            }
        };
        stack("encoder.layers", s.layers, false);
        {
            BlockBuilder B("encoder.final", 1, weight_dtype);
            Ctx c{s, n, B, g.notes, act};
            TensorId x = B.input("hidden_states", Extent::per_token(h), ActRole::Stream);
            x = norm(c, x, h, "encoder.final_layer_norm");
            x = B.dropout(x, s.resid_dropout, "encoder.dropout");
            g.blocks.push_back(B.finish(x));
        }
        {
            // Decoder input embeddings share the `shared` weight (counted once, in "embeddings").
            BlockBuilder B("decoder.embeddings", 1, weight_dtype);
            B.input("encoder_output", Extent::per_token(h), ActRole::Stream);
            // The encoder output every decoder layer's cross-attention reads.
            B.block().tensors[0].shared_key = "encoder_hidden_states";
            const TensorId ids = B.data("decoder_input_ids", Extent::per_token(1), ActRole::Index64);
            TensorId x = B.embedding(ids, s.vocab, h, "shared", Component::Embeddings, false);
            x = B.dropout(x, s.embd_dropout, "decoder.embed_dropout");
            g.blocks.push_back(B.finish(x));
            set_decoder_axes(g.blocks.back());
        }
        stack("decoder.layers", s.decoder_layers, true);
        g.notes.push_back("t5: the encoder output read by cross-attention is an input of each decoder block");
    } else {
        std::int64_t i = 0;
        while (i < s.layers) {
            const bool sparse = is_sparse(s, i), lin = is_linear(s, i);
            std::int64_t j = i;
            while (j + 1 < s.layers && is_sparse(s, j + 1) == sparse && is_linear(s, j + 1) == lin) ++j;
            const bool whole = i == 0 && j == s.layers - 1;
            BlockBuilder B(run_name("layers", i, j, whole), j - i + 1, weight_dtype);
            B.block().checkpointable = true;
            B.block().linear_attention = lin;
            Ctx c{s, n, B, g.notes, act};
            TensorId x = B.input("hidden_states", Extent::per_token(h), ActRole::Stream);
            x = layer(c, x, sparse, lin);
            g.blocks.push_back(B.finish(x));
            i = j + 1;
        }
    }

    g.blocks.push_back(head_block(s, n, weight_dtype, g.notes, act));
    if (s.model_type == "t5") set_decoder_axes(g.blocks.back());  // the LM head reads the decoder

    TransformerDims d;
    d.layers = s.layers + (s.model_type == "t5" ? s.decoder_layers : 0);
    d.hidden = s.hidden;
    d.heads = s.heads;
    d.kv_heads = s.kv_heads;
    d.head_dim = s.head_dim;
    d.intermediate = s.intermediate;
    d.vocab = s.vocab;
    d.experts = s.experts;
    d.experts_per_token = s.experts_per_token;
    d.encoder_decoder = s.model_type == "t5";
    d.sliding_window = s.sliding_window;
    d.sliding_layers = s.sliding_layers;
    d.attention_chunk = s.attention_chunk;
    d.chunked_layers = s.chunked_layers;
    if (s.attention_chunk > 0)
        g.notes.push_back("chunked local attention (" + std::to_string(s.attention_chunk) +
                          "-token chunks) on the RoPE layers: serving engines page it by chunk (gpumem serving); generate()'s KV cache is "
                          "counted in full on every layer, an over-estimate past one chunk");
    if (s.pos == S::Pos::Rotary && !s.mla)
        d.rotary_dim = std::min(s.head_dim, static_cast<std::int64_t>(static_cast<double>(s.head_dim) * s.rotary_pct));
    d.rope_configs = s.model_type == "gemma3_text" ? 2 : 1;  // Gemma3TextModel: rotary_emb and rotary_emb_local
    d.rope_fp32 = s.model_type == "gpt_oss";                  // vLLM gpt_oss.py L82-L85: dtype=torch.float32
    if (s.mla) {
        d.latent_kv = true;
        d.kv_elements_per_token = checked_mul(s.layers, s.kv_lora_rank + s.qk_rope_head_dim);
        g.notes.push_back("KV cache counted as the MLA latent (kv_lora_rank + qk_rope_head_dim per layer); transformers' "
                          "eager DeepSeek caches the decompressed k/v (heads*(qk_nope+qk_rope) + heads*v_head_dim)");
    } else if (s.model_type == "t5") {
        // Self-attention k/v plus cross-attention k/v per decoder layer (encoder length == decoder length).
        d.kv_elements_per_token = checked_mul(s.decoder_layers, checked_mul(4, checked_mul(s.kv_heads, s.head_dim)));
        g.notes.push_back("t5 KV cache: decoder self-attention plus cross-attention k/v, encoder length = sequence length");
    } else if (s.model_type == "bert" || s.model_type == "roberta") {
        d.kv_elements_per_token = 0;
        g.notes.push_back("encoder-only model: no KV cache");
    } else {
        d.kv_elements_per_token = checked_mul(s.layers, checked_mul(2, checked_mul(s.kv_heads, s.head_dim)));
    }
    if (!s.linear_attn_layers.empty()) {
        d.linear_layers = s.linear_attn_layers;
        d.linear_conv_kernel = s.linear_conv_kernel;
        d.linear_conv_dim = 2 * s.linear_k_heads * s.linear_k_dim + s.linear_v_heads * s.linear_v_dim;
        d.linear_v_heads = s.linear_v_heads;
        d.linear_k_dim = s.linear_k_dim;
        d.linear_v_dim = s.linear_v_dim;
        d.kv_elements_per_token = checked_mul(d.kv_layers(), checked_mul(2, checked_mul(s.kv_heads, s.head_dim)));
        g.notes.push_back("linear-attention layers (gated DeltaNet): " + std::to_string(s.layers - d.kv_layers()) + " of " +
                          std::to_string(s.layers) + "; no KV cache there but a state per sequence (convolution and recurrent state)");
    }
    g.transformer = d;
    g.weight_quant = s.weight_quant;
    return g;
}

}  // namespace gpumem
