// Hugging Face config.json -> TransformerSpec.
//
// Each family reads its fields the way its transformers configuration class
// does (configuration_<family>.py): omitted fields take the class defaults,
// attribute_map aliases (gpt2 n_embd <-> hidden_size, t5 d_model, ...) are
// accepted, and a JSON null stands for Python None (e.g. gpt2 n_inner ->
// 4*n_embd, deepseek_v2 q_lora_rank -> plain q_proj). Types are checked here,
// never by nlohmann (which would throw type_error), so every bad value is a
// one-line Error naming the origin, the field and the fix.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumem/core/limits.hpp"
#include "gpumem/model/transformer.hpp"

namespace gpumem {

const std::vector<std::string>& supported_model_types() {
    static const std::vector<std::string> types = {
        "bert",  "deepseek_v2", "deepseek_v3", "falcon", "gemma", "gemma2",  "gpt2", "gpt_bigcode", "gpt_neox", "llama",
        "mistral", "mixtral",   "opt",         "phi",    "phi3",  "qwen2",   "qwen2_moe", "roberta",  "t5",
        "qwen3",   "qwen3_moe", "granite",     "kimi_k2", "gpt_oss", "gemma3", "gemma3_text",
        "qwen3_next", "llama4", "llama4_text",
    };
    return types;
}

namespace {

using json = nlohmann::json;

// Sizes above this are rejected: no real tensor dimension is that large and
// products of such sizes must stay inside 64 bits.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;

std::string short_json(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

std::string fmt_double(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

class Reader {
public:
    Reader(const json& j, std::string_view origin, std::string cls, TransformerSpec& spec)
        : j_(j), origin_(origin), cls_(std::move(cls)), spec_(spec) {}

    // The value under the first present key (aliases listed after the
    // canonical name win over it, as attribute_map setters run after __init__),
    // or nullptr. `used` receives the key that was found.
    const json* find(std::initializer_list<const char*> keys, std::string* used = nullptr) const {
        const json* hit = nullptr;
        for (const char* k : keys) {
            auto it = j_.find(k);
            if (it != j_.end()) {
                hit = &*it;
                if (used) *used = k;
            }
        }
        return hit;
    }
    bool present_non_null(std::initializer_list<const char*> keys) const {
        const json* v = find(keys);
        return v != nullptr && !v->is_null();
    }
    bool present(std::initializer_list<const char*> keys) const { return find(keys) != nullptr; }

    [[noreturn]] void bad(const std::string& field, const std::string& what) const {
        fail(ErrorCode::InvalidArgument, field, std::string(origin_) + ": field \"" + field + "\" " + what);
    }

    // Integer with a class default (nullopt: required). `min` is the smallest
    // accepted value (1 for sizes, 0 for counts that may be zero).
    std::int64_t integer(std::initializer_list<const char*> keys, std::optional<std::int64_t> def,
                         std::int64_t min = 1) {
        std::string used = *keys.begin();
        const json* v = find(keys, &used);
        if (v == nullptr || v->is_null()) {
            if (!def) {
                fail(ErrorCode::InvalidArgument, used,
                     std::string(origin_) + ": missing required field \"" + used + "\" (" + cls_ +
                         " has no default); add it to the config");
            }
            note_default(used, std::to_string(*def));
            return *def;
        }
        return to_int(*v, used, min);
    }

    // A layer count: an integer of at most kMaxLayers (core/limits.hpp), so
    // that the per-layer lists and the graph stay bounded.
    std::int64_t layer_count(std::initializer_list<const char*> keys, std::optional<std::int64_t> def) {
        std::string used = *keys.begin();
        (void)find(keys, &used);
        const std::int64_t n = integer(keys, def);
        check_layers(n, used);
        return n;
    }
    void check_layers(std::int64_t n, const std::string& key) const {
        if (n > kMaxLayers)
            bad(key, "must be at most " + std::to_string(kMaxLayers) + " layers (got " + std::to_string(n) +
                         "); the deepest models in use have ~200 layers: check the value (docs/limits.md)");
    }

    // Integer field whose Python default is None: nullopt when missing or null.
    std::optional<std::int64_t> optional_integer(std::initializer_list<const char*> keys, std::int64_t min = 1) {
        std::string used = *keys.begin();
        const json* v = find(keys, &used);
        if (v == nullptr || v->is_null()) return std::nullopt;
        return to_int(*v, used, min);
    }

    std::int64_t to_int(const json& v, const std::string& field, std::int64_t min) const {
        const std::string want = min >= 1 ? "must be a positive integer" : "must be a non-negative integer";
        std::int64_t n = 0;
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(kMaxDim)) bad(field, want + " below 2^31 (got " + short_json(v) + ")");
            n = static_cast<std::int64_t>(u);
        } else if (v.is_number_integer()) {
            n = v.get<std::int64_t>();
        } else if (v.is_number_float()) {
            const double d = v.get<double>();
            if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > static_cast<double>(kMaxDim))
                bad(field, want + " (got " + short_json(v) + ")");
            n = static_cast<std::int64_t>(d);
        } else {
            bad(field, want + " (got " + short_json(v) + ")");
        }
        if (n < min) bad(field, want + " (got " + short_json(v) + ")");
        if (n > kMaxDim) bad(field, want + " below 2^31 (got " + short_json(v) + ")");
        return n;
    }

    double number(std::initializer_list<const char*> keys, double def, bool probability = false) {
        std::string used = *keys.begin();
        const json* v = find(keys, &used);
        if (v == nullptr || v->is_null()) {
            note_default(used, fmt_double(def));
            return def;
        }
        if (!v->is_number()) bad(used, "must be a number (got " + short_json(*v) + ")");
        const double d = v->get<double>();
        if (!std::isfinite(d)) bad(used, "must be a finite number (got " + short_json(*v) + ")");
        if (probability && (d < 0.0 || d >= 1.0))
            bad(used, "must be a probability in [0, 1) (got " + short_json(*v) + ")");
        return d;
    }

    bool boolean(std::initializer_list<const char*> keys, bool def) {
        std::string used = *keys.begin();
        const json* v = find(keys, &used);
        if (v == nullptr || v->is_null()) {
            note_default(used, def ? "true" : "false");
            return def;
        }
        if (v->is_boolean()) return v->get<bool>();
        if (v->is_number_integer() && (v->get<std::int64_t>() == 0 || v->get<std::int64_t>() == 1))
            return v->get<std::int64_t>() == 1;
        bad(used, "must be true or false (got " + short_json(*v) + ")");
    }

    std::string string(std::initializer_list<const char*> keys, const std::string& def) {
        std::string used = *keys.begin();
        const json* v = find(keys, &used);
        if (v == nullptr || v->is_null()) {
            note_default(used, "\"" + def + "\"");
            return def;
        }
        if (!v->is_string()) bad(used, "must be a string (got " + short_json(*v) + ")");
        return v->get<std::string>();
    }

    std::vector<std::int64_t> int_list(const char* key) const {
        std::vector<std::int64_t> out;
        const json* v = find({key});
        if (v == nullptr || v->is_null()) return out;
        if (!v->is_array()) bad(key, "must be a list of layer indices (got " + short_json(*v) + ")");
        for (const auto& e : *v) out.push_back(to_int(e, key, 0));
        return out;
    }

    std::vector<std::string> string_list(const char* key) const {
        std::vector<std::string> out;
        const json* v = find({key});
        if (v == nullptr || v->is_null()) return out;
        if (!v->is_array()) bad(key, "must be a list of strings (got " + short_json(*v) + ")");
        for (const auto& e : *v) {
            if (!e.is_string()) bad(key, "must be a list of strings (got " + short_json(e) + ")");
            out.push_back(e.get<std::string>());
        }
        return out;
    }

    void note_default(const std::string& field, const std::string& value) {
        spec_.notes.push_back(field + "=" + value + " (" + cls_ + " default)");
    }
    void note(std::string s) { spec_.notes.push_back(std::move(s)); }
    [[nodiscard]] std::string_view origin() const { return origin_; }

private:
    const json& j_;
    std::string_view origin_;
    std::string cls_;
    TransformerSpec& spec_;
};

// hidden / heads when head_dim is derived.
std::int64_t derive_head_dim(const Reader& r, std::int64_t hidden, std::int64_t heads, const std::string& hidden_key,
                             const std::string& heads_key) {
    if (hidden % heads != 0) {
        fail(ErrorCode::InvalidArgument, hidden_key,
             std::string(r.origin()) + ": \"" + hidden_key + "\" (" + std::to_string(hidden) +
                 ") is not divisible by \"" + heads_key + "\" (" + std::to_string(heads) +
                 "); fix the sizes or set \"head_dim\"");
    }
    return hidden / heads;
}

void check_kv_heads(const Reader& r, std::int64_t heads, std::int64_t kv, const std::string& kv_key) {
    if (heads % kv != 0) {
        fail(ErrorCode::InvalidArgument, kv_key,
             std::string(r.origin()) + ": \"" + kv_key + "\" (" + std::to_string(kv) +
                 ") must divide the number of attention heads (" + std::to_string(heads) + ")");
    }
}

// Which class of the family is counted. `causal`, `base`, `masked`, `seq2seq`:
// the family's class names for each head; empty when the family has none.
struct HeadClasses {
    std::string causal, base, masked, seq2seq;
    TransformerSpec::Head fallback = TransformerSpec::Head::CausalLM;
};

void pick_head(const json& j, TransformerSpec& spec, const HeadClasses& hc) {
    using H = TransformerSpec::Head;
    auto default_class = [&]() -> std::string {
        switch (hc.fallback) {
            case H::CausalLM: return hc.causal;
            case H::BaseModel: return hc.base;
            case H::Seq2SeqLM: return hc.seq2seq;
            case H::MaskedLM: return hc.masked;
        }
        return hc.causal;
    };
    std::string arch;
    auto it = j.find("architectures");
    if (it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) arch = (*it)[0].get<std::string>();
    if (arch.empty()) {
        spec.arch_class = default_class();
        spec.head = hc.fallback;
        spec.notes.push_back("no architectures in config: counted as " + spec.arch_class);
        return;
    }
    spec.arch_class = arch;
    if (!hc.causal.empty() && arch == hc.causal) {
        spec.head = H::CausalLM;
    } else if (!hc.base.empty() && arch == hc.base) {
        spec.head = H::BaseModel;
    } else if (!hc.masked.empty() && arch == hc.masked) {
        spec.head = H::MaskedLM;
    } else if (!hc.seq2seq.empty() && arch == hc.seq2seq) {
        spec.head = H::Seq2SeqLM;
    } else {
        spec.head = hc.fallback;
        spec.notes.push_back("architectures[0] " + arch + " is approximated as " + default_class() +
                             " (task heads other than the LM head are not counted)");
    }
}

// Qwen2-MoE / Qwen3-MoE: every decoder_sparse_step-th layer is sparse unless
// listed in mlp_only_layers (modeling_qwen2_moe.py / modeling_qwen3_moe.py).
void read_sparse_layers(Reader& r, TransformerSpec& s) {
    const std::int64_t step = r.integer({"decoder_sparse_step"}, 1);
    const auto mlp_only = r.int_list("mlp_only_layers");
    s.sparse_layers.assign(static_cast<std::size_t>(s.layers), false);
    for (std::int64_t i = 0; i < s.layers; ++i) {
        const bool only = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
        s.sparse_layers[static_cast<std::size_t>(i)] = !only && s.experts > 0 && (i + 1) % step == 0;
    }
}

// Qwen2-MoE / Qwen3-Next sparse blocks: routed experts and one shared expert
// behind a sigmoid gate (Qwen2MoeSparseMoeBlock / Qwen3NextSparseMoeBlock),
// with each config class's defaults.
void read_qwen_moe(Reader& r, TransformerSpec& s, std::int64_t experts, std::int64_t top_k, std::int64_t moe_inter, std::int64_t shared_inter) {
    s.experts = r.integer({"num_experts"}, experts, 0);
    s.experts_per_token = r.integer({"num_experts_per_tok"}, top_k);
    s.moe_intermediate = r.integer({"moe_intermediate_size"}, moe_inter);
    s.shared_expert_intermediate = r.integer({"shared_expert_intermediate_size"}, shared_inter, 0);
    s.shared_experts = s.shared_expert_intermediate > 0 ? 1 : 0;
    s.shared_expert_gate = s.shared_experts > 0;
    read_sparse_layers(r, s);
}

// Families whose modules follow LlamaForCausalLM (RMSNorm, rotary, gated MLP).
void read_llama_like(Reader& r, TransformerSpec& s, const std::string& type) {
    struct D {
        std::int64_t vocab, hidden, inter, layers, heads;
        std::optional<std::int64_t> kv;
        std::int64_t maxpos;
        double eps;
        bool tie;
        std::string act;
    };
    D d{};
    if (type == "llama") d = {32000, 4096, 11008, 32, 32, std::nullopt, 2048, 1e-6, false, "silu"};
    else if (type == "mistral") d = {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-6, false, "silu"};
    else if (type == "mixtral") d = {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-5, false, "silu"};
    else if (type == "qwen2") d = {151936, 4096, 22016, 32, 32, 32, 32768, 1e-6, false, "silu"};
    else if (type == "qwen2_moe") d = {151936, 2048, 5632, 24, 16, 16, 32768, 1e-6, false, "silu"};
    else if (type == "gemma") d = {256000, 3072, 24576, 28, 16, 16, 8192, 1e-6, true, "gelu_pytorch_tanh"};
    else if (type == "gemma2") d = {256000, 2304, 9216, 26, 8, 4, 8192, 1e-6, true, "gelu_pytorch_tanh"};
    else if (type == "gemma3_text") d = {262208, 2304, 9216, 26, 8, 4, 131072, 1e-6, true, "gelu_pytorch_tanh"};  // Gemma3TextConfig
    else if (type == "phi3") d = {32064, 3072, 8192, 32, 32, std::nullopt, 4096, 1e-5, false, "silu"};
    else if (type == "deepseek_v2") d = {32000, 4096, 11008, 32, 32, std::nullopt, 2048, 1e-6, false, "silu"};
    // Qwen3Config / Qwen3MoeConfig / GraniteConfig defaults (transformers configuration_*.py).
    else if (type == "qwen3") d = {151936, 4096, 22016, 32, 32, 32, 32768, 1e-6, false, "silu"};
    else if (type == "qwen3_moe") d = {151936, 2048, 6144, 24, 32, 4, 32768, 1e-6, false, "silu"};
    else if (type == "granite") d = {32000, 4096, 11008, 32, 32, std::nullopt, 2048, 1e-6, false, "silu"};
    else if (type == "gpt_oss") d = {201088, 2880, 2880, 36, 64, 8, 131072, 1e-5, false, "silu"};  // GptOssConfig
    else if (type == "qwen3_next") d = {151936, 2048, 5632, 48, 16, 2, 32768, 1e-6, false, "silu"};  // Qwen3NextConfig
    else if (type == "llama4_text") d = {202048, 5120, 8192, 48, 40, 8, 4096 * 32, 1e-5, false, "silu"};  // Llama4TextConfig
    else /* deepseek_v3 */ d = {129280, 7168, 18432, 61, 128, 128, 4096, 1e-6, false, "silu"};

    s.vocab = r.integer({"vocab_size"}, d.vocab);
    s.hidden = r.integer({"hidden_size"}, d.hidden);
    s.intermediate = r.integer({"intermediate_size"}, d.inter);
    s.layers = r.layer_count({"num_hidden_layers"}, d.layers);
    s.heads = r.integer({"num_attention_heads"}, d.heads);
    auto kv = r.optional_integer({"num_key_value_heads"});
    if (!kv) {
        kv = d.kv ? *d.kv : s.heads;
        if (r.present({"num_key_value_heads"}) || !d.kv) r.note("num_key_value_heads=num_attention_heads");
        else r.note_default("num_key_value_heads", std::to_string(*kv));
    }
    s.kv_heads = *kv;
    s.max_positions = r.integer({"max_position_embeddings"}, d.maxpos);
    s.norm = TransformerSpec::Norm::RMSNorm;
    s.norm_bias = false;
    s.norm_eps = r.number({"rms_norm_eps"}, d.eps);
    s.tie_embeddings = r.boolean({"tie_word_embeddings"}, d.tie);
    s.pos = TransformerSpec::Pos::Rotary;
    s.mlp = TransformerSpec::Mlp::Gated;
    s.act = r.string({"hidden_act"}, d.act);
    s.attn_dropout = r.number({"attention_dropout"}, 0.0, true);

    const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3" || type == "kimi_k2";
    if (!deepseek) {
        std::string hd_key = "head_dim";
        auto hd = r.optional_integer({"head_dim"});
        if (type == "gemma" && !hd) {
            hd = 256;
            r.note_default("head_dim", "256");
        } else if ((type == "gemma2" || type == "gemma3_text" || type == "qwen3_next") && !hd) {
            hd = 256;
            r.note_default("head_dim", "256");
        } else if (type == "llama4_text" && !hd) {
            hd = 128;
            r.note_default("head_dim", "128");
        }
        s.head_dim = hd ? *hd : derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        check_kv_heads(r, s.heads, s.kv_heads, "num_key_value_heads");
    }

    // Biases: each family hard-codes or configures them differently.
    if (type == "llama" || type == "gemma" || type == "gemma2" || type == "gemma3_text" || type == "qwen3" || type == "qwen3_moe" || type == "granite" ||
        type == "qwen3_next" || type == "llama4_text") {
        const bool ab = r.boolean({"attention_bias"}, false);
        s.qkv_bias = ab;
        s.o_bias = ab;
    }
    if (type == "llama" || type == "granite") s.mlp_bias = r.boolean({"mlp_bias"}, false);
    if (type == "qwen3" || type == "qwen3_moe" || type == "qwen3_next") s.qk_norm = true;  // Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim)
    if (type == "gpt_oss") {  // modeling_gpt_oss.py: biased attention and router, fused biased experts, attention sinks
        const bool ab = r.boolean({"attention_bias"}, true);
        s.qkv_bias = ab;
        s.o_bias = ab;
        s.experts = r.integer({"num_local_experts"}, 128, 0);
        s.experts_per_token = r.integer({"num_experts_per_tok", "experts_per_token"}, 4);
        s.moe_intermediate = s.intermediate;
        s.router_linear_bias = true;
        s.expert_bias = true;
        s.fused_expert_gate_up = true;
        s.attention_sinks = true;
        s.sparse_layers.assign(static_cast<std::size_t>(s.layers), s.experts > 0);
    }
    if (type == "qwen3_next") {
        // modeling_qwen3_next.py: zero-centred RMSNorm (x * (1 + w)), gated
        // attention (q_proj emits the query and a sigmoid gate), partial RoPE,
        // gated DeltaNet on the layers layer_types marks "linear_attention"
        // (Qwen3NextConfig: every full_attention_interval-th layer is full),
        // and a sparse MoE with a gated shared expert (Qwen2-MoE style).
        s.gemma_norm = true;
        s.attn_output_gate = true;
        s.rotary_pct = r.number({"partial_rotary_factor"}, 0.25);
        s.linear_k_heads = r.integer({"linear_num_key_heads"}, 16);
        s.linear_v_heads = r.integer({"linear_num_value_heads"}, 32);
        s.linear_k_dim = r.integer({"linear_key_head_dim"}, 128);
        s.linear_v_dim = r.integer({"linear_value_head_dim"}, 128);
        s.linear_conv_kernel = r.integer({"linear_conv_kernel_dim"}, 4);
        if (s.linear_v_heads % s.linear_k_heads != 0)
            r.bad("linear_num_value_heads", "must be a multiple of linear_num_key_heads (" + std::to_string(s.linear_k_heads) + ")");
        if (r.present_non_null({"layer_types"})) {
            const auto types = r.string_list("layer_types");
            if (static_cast<std::int64_t>(types.size()) != s.layers) r.bad("layer_types", "must list one type per layer (" + std::to_string(s.layers) + ")");
            for (const auto& t : types) {
                if (t != "linear_attention" && t != "full_attention") r.bad("layer_types", "each entry is \"linear_attention\" or \"full_attention\" (got \"" + t + "\")");
                s.linear_attn_layers.push_back(t == "linear_attention");
            }
        } else {
            const std::int64_t every = r.integer({"full_attention_interval"}, 4, 1);
            for (std::int64_t i = 0; i < s.layers; ++i) s.linear_attn_layers.push_back((i + 1) % every != 0);
        }
        read_qwen_moe(r, s, 512, 10, 512, 512);
        r.note("qwen3_next: the checkpoint's multi-token-prediction (mtp.*) weights are not counted (transformers ignores them, "
               "vLLM loads them only for speculative decoding)");
    }
    if (type == "llama4_text") {
        // modeling_llama4.py (transformers 000c33fd; docs/research/llama4.md):
        // MoE layers (moe_layers, else every interleave_moe_layer_step-th) of
        // num_local_experts fused experts (gate_up_proj [E, H, 2I], down_proj
        // [E, I, H]) with intermediate_size, a sigmoid top-k router without a
        // bias and a shared expert of intermediate_size; the other layers a
        // dense MLP of intermediate_size_mlp. The QK norm (use_qk_norm) is an
        // L2 norm without weights. no_rope_layers[i] == 1: layer i uses RoPE
        // and attends within chunks of attention_chunk_size; 0: NoPE, global
        // (an empty list: every 4th layer NoPE, Llama4TextConfig).
        s.moe_intermediate = s.intermediate;
        s.intermediate = r.integer({"intermediate_size_mlp"}, 16384);
        s.experts = r.integer({"num_local_experts"}, 16, 0);
        s.experts_per_token = r.integer({"num_experts_per_tok"}, 1);
        s.shared_experts = 1;
        s.shared_expert_intermediate = s.moe_intermediate;
        s.fused_expert_gate_up = true;
        s.router_sigmoid = true;
        s.sparse_layers.assign(static_cast<std::size_t>(s.layers), false);
        if (r.present_non_null({"moe_layers"})) {
            for (const auto i : r.int_list("moe_layers")) {
                if (i < 0 || i >= s.layers) r.bad("moe_layers", "each entry must be a layer index below " + std::to_string(s.layers) + " (got " + std::to_string(i) + ")");
                s.sparse_layers[static_cast<std::size_t>(i)] = s.experts > 0;
            }
        } else {
            const std::int64_t step = r.integer({"interleave_moe_layer_step"}, 1, 0);
            for (std::int64_t i = 0; i < s.layers; ++i) s.sparse_layers[static_cast<std::size_t>(i)] = s.experts > 0 && step > 0 && (i + 1) % step == 0;
        }
        std::vector<std::int64_t> rope = r.present_non_null({"no_rope_layers"}) ? r.int_list("no_rope_layers") : std::vector<std::int64_t>{};
        if (rope.empty()) {
            const std::int64_t every = r.integer({"no_rope_layer_interval"}, 4, 1);
            for (std::int64_t i = 0; i < s.layers; ++i) rope.push_back((i + 1) % every != 0 ? 1 : 0);
        }
        if (static_cast<std::int64_t>(rope.size()) != s.layers) r.bad("no_rope_layers", "must list one 0/1 flag per layer (" + std::to_string(s.layers) + ")");
        const std::int64_t chunk = r.present_non_null({"attention_chunk_size"}) ? r.integer({"attention_chunk_size"}, 8192, 1) : 0;
        if (chunk > 0) {
            s.attention_chunk = chunk;
            for (const auto f : rope) s.chunked_layers.push_back(f != 0);
        }
    }
    if (type == "qwen3_moe") {
        s.experts = r.integer({"num_experts"}, 128, 0);
        s.experts_per_token = r.integer({"num_experts_per_tok"}, 8);
        s.moe_intermediate = r.integer({"moe_intermediate_size"}, 768);
        read_sparse_layers(r, s);
    }
    // Sliding-window attention, per layer: an explicit layer_types list
    // (newer configs), else each family's rule.
    {
        const std::int64_t window = r.present_non_null({"sliding_window"}) ? r.integer({"sliding_window"}, 0, 0) : 0;
        std::vector<bool> sl;
        if (r.present_non_null({"layer_types"}) && window > 0) {
            const auto types = r.string_list("layer_types");
            if (static_cast<std::int64_t>(types.size()) != s.layers) r.bad("layer_types", "must list one type per layer (" + std::to_string(s.layers) + ")");
            for (const auto& t : types) sl.push_back(t == "sliding_attention");
        } else if (type == "gemma2" && window > 0) {
            for (std::int64_t i = 0; i < s.layers; ++i) sl.push_back(i % 2 == 0);  // Gemma2DecoderLayer: is_sliding = not layer_idx % 2
        } else if (type == "gemma3_text") {
            // Gemma3TextConfig: sliding_window 4096 and every sliding_window_pattern-th (6th) layer full.
            const std::int64_t w = window > 0 ? window : 4096;
            const std::int64_t pattern = r.integer({"sliding_window_pattern"}, 6, 1);
            for (std::int64_t i = 0; i < s.layers; ++i) sl.push_back((i + 1) % pattern != 0);
            if (std::find(sl.begin(), sl.end(), true) != sl.end()) {
                s.sliding_window = w;
                s.sliding_layers = sl;
            }
            sl.clear();
        } else if (type == "mistral" && window > 0) {
            sl.assign(static_cast<std::size_t>(s.layers), true);  // MistralAttention: every layer
        } else if ((type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe") && window > 0 &&
                   r.boolean({"use_sliding_window"}, false)) {
            const std::int64_t from = r.integer({"max_window_layers"}, s.layers, 0);
            for (std::int64_t i = 0; i < s.layers; ++i) sl.push_back(i >= from);
        }
        if (std::find(sl.begin(), sl.end(), true) != sl.end()) {
            s.sliding_window = window;
            s.sliding_layers = sl;
        }
    }
    if (type == "qwen2") {
        s.qkv_bias = true;  // Qwen2Attention: q/k/v bias=True, o_proj bias=False (hard-coded)
        s.o_bias = false;
        if (r.present({"attention_bias"})) r.note("qwen2: attention_bias is ignored (q/k/v always have a bias)");
    }
    if (type == "qwen2_moe") {
        s.qkv_bias = r.boolean({"qkv_bias"}, true);
        s.o_bias = false;
    }
    if (type == "gemma" || type == "gemma2" || type == "gemma3_text") {
        s.gemma_norm = true;
        s.embed_scale = true;
        // GemmaMLP uses hidden_activation when set (older configs say hidden_act "gelu").
        if (r.present_non_null({"hidden_activation"})) s.act = r.string({"hidden_activation"}, s.act);
    }
    if (type == "gemma2") {
        s.sandwich_norm = true;
        s.attn_logit_softcap = r.number({"attn_logit_softcapping"}, 50.0);
        s.final_logit_softcap = r.number({"final_logit_softcapping"}, 30.0);
    }
    if (type == "gemma3_text") {  // Gemma3Attention: q_norm / k_norm; no soft-capping by default
        s.sandwich_norm = true;
        s.qk_norm = true;
        s.attn_logit_softcap = r.present_non_null({"attn_logit_softcapping"}) ? r.number({"attn_logit_softcapping"}, 0.0) : 0.0;
        s.final_logit_softcap = r.present_non_null({"final_logit_softcapping"}) ? r.number({"final_logit_softcapping"}, 0.0) : 0.0;
    }
    if (type == "phi3") {
        s.fused_qkv = true;
        s.fused_gate_up = true;
        s.resid_dropout = r.number({"resid_pdrop"}, 0.0, true);
        s.embd_dropout = r.number({"embd_pdrop"}, 0.0, true);
        s.rotary_pct = r.number({"partial_rotary_factor"}, 1.0);
    }
    if (type == "mixtral") {
        s.experts = r.integer({"num_local_experts"}, 8);
        s.experts_per_token = r.integer({"num_experts_per_tok"}, 2);
        s.moe_intermediate = s.intermediate;
    }
    if (type == "qwen2_moe") read_qwen_moe(r, s, 60, 4, 1408, 5632);
    if (deepseek) {
        const bool v3 = type == "deepseek_v3" || type == "kimi_k2";
        s.mla = true;
        const std::int64_t q_def = 1536;
        // q_lora_rank: null means None (plain q_proj, e.g. DeepSeek-V2-Lite); missing takes the default.
        if (r.present({"q_lora_rank"})) {
            auto q = r.optional_integer({"q_lora_rank"}, 0);
            s.q_lora_rank = q ? *q : 0;
        } else {
            s.q_lora_rank = q_def;
            r.note_default("q_lora_rank", std::to_string(q_def));
        }
        s.kv_lora_rank = r.integer({"kv_lora_rank"}, 512);
        s.qk_nope_head_dim = r.integer({"qk_nope_head_dim"}, 128);
        s.qk_rope_head_dim = r.integer({"qk_rope_head_dim"}, 64);
        s.v_head_dim = r.integer({"v_head_dim"}, 128);
        s.head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;
        s.kv_heads = s.heads;  // MLA: every head has its own (decompressed) k and v
        const bool ab = r.boolean({"attention_bias"}, false);
        s.qkv_bias = ab;
        s.o_bias = ab;
        s.experts = v3 ? r.integer({"n_routed_experts", "num_local_experts"}, 256, 0)
                       : r.integer({"n_routed_experts", "num_experts"}, 64, 0);
        s.shared_experts = r.integer({"n_shared_experts"}, v3 ? 1 : 2, 0);
        s.moe_intermediate = r.integer({"moe_intermediate_size"}, v3 ? 2048 : 1407);
        s.shared_expert_intermediate = s.moe_intermediate * s.shared_experts;
        if (v3) {
            s.experts_per_token = r.integer({"num_experts_per_tok"}, 8);
        } else {
            auto k = r.optional_integer({"num_experts_per_tok"});
            if (!k && s.experts > 0) {
                r.bad("num_experts_per_tok", "is required when n_routed_experts > 0 (DeepseekV2Config default is None)");
            }
            s.experts_per_token = k ? *k : 0;
        }
        s.first_k_dense = r.integer({"first_k_dense_replace"}, v3 ? 3 : 0, 0);
        s.moe_layer_freq = r.integer({"moe_layer_freq"}, 1);
        s.router_bias = v3;  // DeepseekV3 gate.e_score_correction_bias is an nn.Parameter
        s.router_sigmoid = v3 || r.string({"scoring_func"}, "softmax") == "sigmoid";
        if (v3) {
            const std::int64_t groups = r.integer({"n_group"}, 8);
            const std::int64_t topk_group = r.integer({"topk_group"}, 4);
            if (s.experts > 0 && s.experts % groups != 0)
                r.bad("n_group", "must divide n_routed_experts (" + std::to_string(s.experts) + ")");
            if (topk_group > groups) r.bad("topk_group", "must not exceed n_group (" + std::to_string(groups) + ")");
        } else {
            (void)r.string({"topk_method"}, "greedy");
        }
        if (r.present_non_null({"num_nextn_predict_layers"}))
            r.note("num_nextn_predict_layers ignored: the multi-token-prediction module is not part of " +
                   std::string(v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"));
        if (s.experts > 0 && s.experts_per_token > s.experts)
            r.bad("num_experts_per_tok", "must not exceed the number of routed experts (" +
                                             std::to_string(s.experts) + ")");
        s.sparse_layers.assign(static_cast<std::size_t>(s.layers), false);
        for (std::int64_t i = 0; i < s.layers; ++i)
            s.sparse_layers[static_cast<std::size_t>(i)] =
                s.experts > 0 && i >= s.first_k_dense && i % s.moe_layer_freq == 0;
    }
    if (s.experts > 0 && s.experts_per_token > s.experts)
        r.bad("num_experts_per_tok",
              "must not exceed the number of experts (" + std::to_string(s.experts) + ")");
}

// quantization_config (transformers' and the engines' formats; which tensors
// each creates: docs/research/quant.md). Unknown methods are errors naming them.
WeightQuant read_quantization(const json& q, std::string_view origin) {
    const auto bad = [&](const std::string& msg) { fail(ErrorCode::Unsupported, "quantization_config", std::string(origin) + ": quantization_config " + msg); };
    if (!q.is_object()) bad("must be an object");
    WeightQuant w;
    const auto str = [&](const json& o, const char* k, const std::string& def) {
        const auto it = o.find(k);
        return it != o.end() && it->is_string() ? it->get<std::string>() : def;
    };
    const auto num = [&](const json& o, const char* k, std::int64_t def) {
        const auto it = o.find(k);
        if (it == o.end() || it->is_null()) return def;
        if (!it->is_number_integer()) bad(std::string("\"") + k + "\" must be an integer");
        const auto v = it->get<std::int64_t>();
        if (v < -1 || v > 1 << 20) bad(std::string("\"") + k + "\" is out of range");
        return v;
    };
    const auto flag = [&](const json& o, const char* k, bool def) {
        const auto it = o.find(k);
        return it != o.end() && it->is_boolean() ? it->get<bool>() : def;
    };
    const auto list = [&](const json& o, const char* k) {
        std::vector<std::string> out;
        const auto it = o.find(k);
        if (it != o.end() && it->is_array())
            for (const auto& e : *it)
                if (e.is_string()) out.push_back(e.get<std::string>());
        return out;
    };
    w.method = str(q, "quant_method", "");
    if (w.method == "fp8") {
        w.bits = 8;
        const auto it = q.find("weight_block_size");
        if (it != q.end() && it->is_array() && it->size() == 2 && (*it)[0].is_number_integer() && (*it)[1].is_number_integer()) {
            w.scheme = "fp8-block";
            w.block_n = (*it)[0].get<std::int64_t>();
            w.block_k = (*it)[1].get<std::int64_t>();
            if (w.block_n <= 0 || w.block_k <= 0) bad("weight_block_size must be positive");
        } else {
            w.scheme = "fp8-tensor";
        }
        w.ignore = list(q, "ignored_layers");
        if (w.ignore.empty()) w.ignore = list(q, "modules_to_not_convert");
    } else if (w.method == "compressed-tensors") {
        const std::string format = str(q, "format", "");
        const auto groups = q.find("config_groups");
        if (groups == q.end() || !groups->is_object() || groups->empty()) bad("(compressed-tensors) has no config_groups");
        const json& g0 = groups->begin().value();
        const auto wt = g0.find("weights");
        if (wt == g0.end() || !wt->is_object()) bad("(compressed-tensors) config group has no \"weights\"");
        w.bits = num(*wt, "num_bits", 8);
        const std::string type = str(*wt, "type", "int"), strategy = str(*wt, "strategy", "tensor");
        w.group_size = num(*wt, "group_size", 0);
        w.zero_point = !flag(*wt, "symmetric", true);
        w.act_order = str(*wt, "actorder", "") == "group";
        if (format.find("nvfp4") != std::string::npos || (type == "float" && w.bits == 4)) {
            w.scheme = "nvfp4";
        } else if (type == "float" && w.bits == 8) {
            w.scheme = strategy == "channel" ? "fp8-channel" : strategy == "block" ? "fp8-block" : "fp8-tensor";
            if (strategy == "block") {
                const auto bs = wt->find("block_structure");
                w.block_n = w.block_k = 128;
                if (bs != wt->end() && bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer()) {
                    w.block_n = (*bs)[0].get<std::int64_t>();
                    w.block_k = (*bs)[1].get<std::int64_t>();
                }
            }
        } else if (type == "int" && w.bits == 8 && format != "pack-quantized") {
            w.scheme = strategy == "channel" ? "int8-channel" : "int8-tensor";
        } else if (type == "int" && (w.bits == 4 || w.bits == 8)) {
            w.scheme = "wna16";
        } else {
            bad("(compressed-tensors) weights of type " + type + " with " + std::to_string(w.bits) + " bits are not modelled");
        }
        w.ignore = list(q, "ignore");
    } else if (w.method == "gptq" || w.method == "awq") {
        w.scheme = "wna16";
        w.bits = num(q, w.method == "gptq" ? "bits" : "bits", 4);
        if (w.method == "awq" && q.contains("w_bit")) w.bits = num(q, "w_bit", 4);
        w.group_size = num(q, "group_size", 128);
        if (w.method == "awq" && q.contains("q_group_size")) w.group_size = num(q, "q_group_size", 128);
        if (w.group_size < 0) w.group_size = 0;
        w.act_order = w.method == "gptq" && flag(q, "desc_act", false) && w.group_size > 0;
        w.zero_point = w.method == "awq" ? flag(q, "zero_point", true) : !flag(q, "sym", true);
        w.lm_head = flag(q, "lm_head", false);
        w.ignore = list(q, "modules_to_not_convert");
        if (w.bits != 4 && w.bits != 8) bad(w.method + " with " + std::to_string(w.bits) + " bits is not modelled (4 or 8)");
    } else if (w.method == "bitsandbytes") {
        const bool four = flag(q, "load_in_4bit", false);
        if (!four && !flag(q, "load_in_8bit", false)) bad("(bitsandbytes) loads neither 4- nor 8-bit weights");
        w.scheme = four ? "nf4" : "int8-bnb";
        w.bits = four ? 4 : 8;
        w.ignore = list(q, "llm_int8_skip_modules");
    } else if (w.method == "modelopt") {
        const std::string algo = str(q, "quant_algo", "");
        if (algo == "NVFP4") w.scheme = "nvfp4";
        else if (algo == "FP8") w.scheme = "fp8-tensor";
        else bad("(modelopt) quant_algo \"" + algo + "\" is not modelled (NVFP4, FP8)");
        w.bits = algo == "NVFP4" ? 4 : 8;
        w.ignore = list(q, "exclude_modules");
        if (w.ignore.empty()) w.ignore = list(q, "ignore");
    } else if (w.method == "mxfp4") {
        w.scheme = "mxfp4";
        w.bits = 4;
        w.ignore = list(q, "modules_to_not_convert");
    } else {
        bad("quant_method \"" + w.method + "\" is not modelled (fp8, compressed-tensors, gptq, awq, bitsandbytes, modelopt, mxfp4)");
    }
    return w;
}

// A vision-language config (Gemma 3, Llama 4): the language model from its
// text_config, read as the family `text_type`.
void read_text_config(const json& j, std::string_view origin, TransformerSpec& s, const char* family, const char* cls, const char* text_type) {
    const auto tc = j.find("text_config");
    if (tc == j.end() || !tc->is_object())
        fail(ErrorCode::ParseError, "text_config", std::string(origin) + ": a " + family + " config needs a \"text_config\" object");
    Reader r(*tc, origin, cls, s);
    read_llama_like(r, s, text_type);
    s.model_type = text_type;
}

// A vision tower's square image split into square patches.
struct Patches {
    std::int64_t image = 0, patch = 0, channels = 0;
    [[nodiscard]] std::int64_t count() const { return checked_mul(image / patch, image / patch); }
};
Patches read_patches(Reader& v, std::int64_t image, std::int64_t patch) {
    Patches p{v.integer({"image_size"}, image), v.integer({"patch_size"}, patch), v.integer({"num_channels"}, 3)};
    if (p.image < p.patch) v.bad("patch_size", "must be at most image_size");
    return p;
}

TransformerSpec parse(const json& j, std::string_view origin) {
    if (!j.is_object()) {
        fail(ErrorCode::ParseError, "", std::string(origin) + ": a config.json must be a JSON object (got " +
                                            std::string(j.type_name()) + ")");
    }
    auto list_supported = [] {
        std::string out;
        for (const auto& t : supported_model_types()) out += (out.empty() ? "" : ", ") + t;
        return out;
    };
    auto mt = j.find("model_type");
    if (mt == j.end() || mt->is_null()) {
        fail(ErrorCode::Unsupported, "model_type",
             std::string(origin) + ": missing \"model_type\"; set it to one of: " + list_supported());
    }
    if (!mt->is_string()) {
        fail(ErrorCode::Unsupported, "model_type",
             std::string(origin) + ": \"model_type\" must be a string (got " + short_json(*mt) +
                 "); supported: " + list_supported());
    }
    const std::string type = mt->get<std::string>();
    const auto& sup = supported_model_types();
    if (std::find(sup.begin(), sup.end(), type) == sup.end()) {
        fail(ErrorCode::Unsupported, "model_type",
             std::string(origin) + ": unsupported model_type \"" + type + "\"; supported: " + list_supported());
    }

    TransformerSpec s;
    s.model_type = type;
    using H = TransformerSpec::Head;
    using N = TransformerSpec::Norm;
    using P = TransformerSpec::Pos;
    using M = TransformerSpec::Mlp;

    if (type == "gpt2" || type == "gpt_bigcode") {
        // configuration_gpt2.py / configuration_gpt_bigcode.py: the same GPT-2
        // layout; GPTBigCode uses nn.Linear, gelu_pytorch_tanh and, by default,
        // multi-query attention (one shared K/V head).
        const bool bigcode = type == "gpt_bigcode";
        Reader r(j, origin, bigcode ? "GPTBigCodeConfig" : "GPT2Config", s);
        s.vocab = r.integer({"vocab_size"}, 50257);
        s.max_positions = r.integer({"n_positions", "max_position_embeddings"}, 1024);
        s.hidden = r.integer({"n_embd", "hidden_size"}, 768);
        s.layers = r.layer_count({"n_layer", "num_hidden_layers"}, 12);
        s.heads = r.integer({"n_head", "num_attention_heads"}, 12);
        auto inner = r.optional_integer({"n_inner"});
        if (!inner) r.note("n_inner=None: MLP width 4*n_embd");
        s.intermediate = inner ? *inner : 4 * s.hidden;
        s.kv_heads = (bigcode && r.boolean({"multi_query"}, true)) ? 1 : s.heads;
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "n_embd", "n_head");
        s.act = r.string({"activation_function"}, bigcode ? "gelu_pytorch_tanh" : "gelu_new");
        s.resid_dropout = r.number({"resid_pdrop"}, 0.1, true);
        s.embd_dropout = r.number({"embd_pdrop"}, 0.1, true);
        s.attn_dropout = r.number({"attn_pdrop"}, 0.1, true);
        s.norm = N::LayerNorm;
        s.norm_eps = r.number({"layer_norm_epsilon"}, 1e-5);
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
        s.pos = P::Learned;
        s.fused_qkv = true;
        s.qkv_bias = s.o_bias = s.mlp_bias = true;
        s.mlp = M::Plain;
        if (bigcode) pick_head(j, s, {"GPTBigCodeForCausalLM", "GPTBigCodeModel", "", "", H::CausalLM});
        else pick_head(j, s, {"GPT2LMHeadModel", "GPT2Model", "", "", H::CausalLM});
    } else if (type == "bert" || type == "roberta") {
        const bool rob = type == "roberta";
        Reader r(j, origin, rob ? "RobertaConfig" : "BertConfig", s);
        s.vocab = r.integer({"vocab_size"}, rob ? 50265 : 30522);
        s.hidden = r.integer({"hidden_size"}, 768);
        s.layers = r.layer_count({"num_hidden_layers"}, 12);
        s.heads = r.integer({"num_attention_heads"}, 12);
        s.kv_heads = s.heads;
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        s.intermediate = r.integer({"intermediate_size"}, 3072);
        s.act = r.string({"hidden_act"}, "gelu");
        s.resid_dropout = r.number({"hidden_dropout_prob"}, 0.1, true);
        s.embd_dropout = s.resid_dropout;
        s.attn_dropout = r.number({"attention_probs_dropout_prob"}, 0.1, true);
        s.max_positions = r.integer({"max_position_embeddings"}, 512);
        s.token_types = r.integer({"type_vocab_size"}, 2, 0);
        s.norm = N::LayerNorm;
        s.norm_eps = r.number({"layer_norm_eps"}, 1e-12);
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
        s.pos = P::Learned;
        s.embed_norm = true;
        s.post_norm = true;
        s.final_norm = false;
        s.qkv_bias = s.o_bias = s.mlp_bias = true;
        s.mlp = M::Plain;
        if (rob) pick_head(j, s, {"", "RobertaModel", "RobertaForMaskedLM", "", H::BaseModel});
        else pick_head(j, s, {"", "BertModel", "BertForMaskedLM", "", H::BaseModel});
        if (rob && s.arch_class == "RobertaForCausalLM") {
            s.head = H::MaskedLM;  // same lm_head module (dense + layer_norm + tied decoder + bias)
        }
        s.pooler = s.head == H::BaseModel;
        if (s.head == H::MaskedLM && !s.tie_embeddings)
            r.note("tie_word_embeddings=false: the MLM decoder weight is counted separately");
    } else if (type == "t5") {
        Reader r(j, origin, "T5Config", s);
        s.vocab = r.integer({"vocab_size"}, 32128);
        s.hidden = r.integer({"d_model", "hidden_size"}, 512);
        s.head_dim = r.integer({"d_kv", "head_dim"}, 64);
        s.intermediate = r.integer({"d_ff"}, 2048);
        s.layers = r.layer_count({"num_layers", "num_hidden_layers"}, 6);
        auto dec = r.optional_integer({"num_decoder_layers"});
        if (dec) r.check_layers(*dec, "num_decoder_layers");
        if (!dec) r.note("num_decoder_layers=None: decoder has num_layers layers");
        s.decoder_layers = dec ? *dec : s.layers;
        s.heads = r.integer({"num_heads", "num_attention_heads"}, 8);
        s.kv_heads = s.heads;
        s.relative_buckets = r.integer({"relative_attention_num_buckets"}, 32);
        (void)r.integer({"relative_attention_max_distance"}, 128);
        const double p = r.number({"dropout_rate"}, 0.1, true);
        s.attn_dropout = s.resid_dropout = s.embd_dropout = s.act_dropout = p;
        s.norm = N::RMSNorm;
        s.norm_bias = false;
        s.norm_eps = r.number({"layer_norm_epsilon"}, 1e-6);
        const std::string ff = r.string({"feed_forward_proj"}, "relu");
        const auto dash = ff.find('-');
        const std::string first = dash == std::string::npos ? ff : ff.substr(0, dash);
        const std::string act = dash == std::string::npos ? ff : ff.substr(dash + 1);
        const bool gated = dash != std::string::npos && first == "gated";
        if ((dash != std::string::npos && !gated) || ff.find('-', dash == std::string::npos ? 0 : dash + 1) !=
                                                         std::string::npos) {
            r.bad("feed_forward_proj", "must be `ACT_FN` or `gated-ACT_FN` such as \"relu\" or \"gated-gelu\" (got \"" +
                                            ff + "\")");
        }
        s.mlp = gated ? M::Gated : M::Plain;
        s.act = act == "gelu" && gated ? "gelu_new" : act;  // T5Config: "gated-gelu" means gelu_new
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
        s.pos = P::RelativeBias;
        s.max_positions = 0;
        pick_head(j, s, {"", "T5Model", "", "T5ForConditionalGeneration", H::Seq2SeqLM});
    } else if (type == "opt") {
        Reader r(j, origin, "OPTConfig", s);
        s.vocab = r.integer({"vocab_size"}, 50272);
        s.hidden = r.integer({"hidden_size"}, 768);
        s.layers = r.layer_count({"num_hidden_layers"}, 12);
        s.intermediate = r.integer({"ffn_dim"}, 3072);
        s.max_positions = r.integer({"max_position_embeddings"}, 2048);
        s.heads = r.integer({"num_attention_heads"}, 12);
        s.kv_heads = s.heads;
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        s.opt_layer_norm_before = r.boolean({"do_layer_norm_before"}, true);
        const bool remove_final = r.boolean({"_remove_final_layer_norm"}, false);
        s.final_norm = s.opt_layer_norm_before && !remove_final;
        s.post_norm = !s.opt_layer_norm_before;
        auto proj = r.optional_integer({"word_embed_proj_dim"});
        s.word_embed_proj_dim = proj ? *proj : s.hidden;
        s.resid_dropout = r.number({"dropout"}, 0.1, true);
        s.attn_dropout = r.number({"attention_dropout"}, 0.0, true);
        s.act_dropout = r.number({"activation_dropout"}, 0.0, true);
        s.act = r.string({"activation_function"}, "relu");
        const bool bias = r.boolean({"enable_bias"}, true);
        s.qkv_bias = s.o_bias = s.mlp_bias = bias;
        const bool affine = r.boolean({"layer_norm_elementwise_affine"}, true);
        if (!affine) r.note("layer_norm_elementwise_affine=false is approximated: LayerNorm weights still counted");
        s.norm = N::LayerNorm;
        s.norm_bias = bias;  // OPT LayerNorms use bias=enable_bias
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
        s.pos = P::Learned;
        s.pos_offset = 2;
        s.mlp = M::Plain;
        pick_head(j, s, {"OPTForCausalLM", "OPTModel", "", "", H::CausalLM});
    } else if (type == "gpt_neox") {
        Reader r(j, origin, "GPTNeoXConfig", s);
        s.vocab = r.integer({"vocab_size"}, 50432);
        s.hidden = r.integer({"hidden_size"}, 6144);
        s.layers = r.layer_count({"num_hidden_layers"}, 44);
        s.heads = r.integer({"num_attention_heads"}, 64);
        s.kv_heads = s.heads;
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        s.intermediate = r.integer({"intermediate_size"}, 24576);
        s.act = r.string({"hidden_act"}, "gelu");
        s.rotary_pct = r.number({"rotary_pct", "partial_rotary_factor"}, 0.25);
        s.attn_dropout = r.number({"attention_dropout"}, 0.0, true);
        s.resid_dropout = r.number({"hidden_dropout"}, 0.0, true);
        s.max_positions = r.integer({"max_position_embeddings"}, 2048);
        s.norm = N::LayerNorm;
        s.norm_eps = r.number({"layer_norm_eps"}, 1e-5);
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, false);
        s.parallel_attn = r.boolean({"use_parallel_residual"}, true);
        s.fused_qkv = true;
        const bool ab = r.boolean({"attention_bias"}, true);
        s.qkv_bias = s.o_bias = ab;
        s.mlp_bias = true;
        s.mlp = M::Plain;
        pick_head(j, s, {"GPTNeoXForCausalLM", "GPTNeoXModel", "", "", H::CausalLM});
    } else if (type == "phi") {
        Reader r(j, origin, "PhiConfig", s);
        s.vocab = r.integer({"vocab_size"}, 51200);
        s.hidden = r.integer({"hidden_size"}, 2048);
        s.intermediate = r.integer({"intermediate_size"}, 8192);
        s.layers = r.layer_count({"num_hidden_layers"}, 24);
        s.heads = r.integer({"num_attention_heads"}, 32);
        auto kv = r.optional_integer({"num_key_value_heads"});
        s.kv_heads = kv ? *kv : s.heads;
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        check_kv_heads(r, s.heads, s.kv_heads, "num_key_value_heads");
        s.resid_dropout = r.number({"resid_pdrop"}, 0.0, true);
        s.embd_dropout = r.number({"embd_pdrop"}, 0.0, true);
        s.attn_dropout = r.number({"attention_dropout"}, 0.0, true);
        s.act = r.string({"hidden_act"}, "gelu_new");
        s.max_positions = r.integer({"max_position_embeddings"}, 2048);
        s.norm = N::LayerNorm;
        s.norm_eps = r.number({"layer_norm_eps"}, 1e-5);
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, false);
        s.rotary_pct = r.number({"partial_rotary_factor"}, 0.5);
        s.qk_norm = r.boolean({"qk_layernorm"}, false);
        s.parallel_attn = true;
        s.parallel_single_norm = true;
        s.qkv_bias = s.o_bias = s.mlp_bias = true;
        s.lm_head_bias = true;
        s.mlp = M::Plain;
        pick_head(j, s, {"PhiForCausalLM", "PhiModel", "", "", H::CausalLM});
    } else if (type == "falcon") {
        Reader r(j, origin, "FalconConfig", s);
        s.vocab = r.integer({"vocab_size"}, 65024);
        s.hidden = r.integer({"hidden_size", "n_embed"}, 4544);
        s.layers = r.layer_count({"num_hidden_layers", "n_layer"}, 32);
        s.heads = r.integer({"num_attention_heads", "n_head"}, 71);
        s.head_dim = derive_head_dim(r, s.hidden, s.heads, "hidden_size", "num_attention_heads");
        s.norm = N::LayerNorm;
        s.norm_eps = r.number({"layer_norm_epsilon"}, 1e-5);
        s.resid_dropout = r.number({"hidden_dropout"}, 0.0, true);
        s.attn_dropout = r.number({"attention_dropout"}, 0.0, true);
        auto kv = r.optional_integer({"num_kv_heads", "n_head_kv"});
        const bool alibi = r.boolean({"alibi"}, false);
        const bool new_arch = r.boolean({"new_decoder_architecture"}, false);
        const bool mq = r.boolean({"multi_query"}, true);
        s.parallel_attn = r.boolean({"parallel_attn"}, true);
        const bool bias = r.boolean({"bias"}, false);
        s.max_positions = r.integer({"max_position_embeddings"}, 2048);
        auto ffn = r.optional_integer({"ffn_hidden_size"});
        s.intermediate = ffn ? *ffn : 4 * s.hidden;
        s.act = r.string({"activation"}, "gelu");
        auto nln = r.optional_integer({"num_ln_in_parallel_attn"});
        if (!nln && new_arch) nln = 2;
        if (new_arch) {
            s.kv_heads = kv ? *kv : s.heads;
        } else if (mq) {
            s.kv_heads = 1;
        } else {
            s.kv_heads = s.heads;
        }
        check_kv_heads(r, s.heads, s.kv_heads, "num_kv_heads");
        s.parallel_single_norm = s.parallel_attn && !(nln && *nln == 2);
        s.pos = alibi ? P::None : P::Rotary;
        if (alibi) r.note("falcon alibi: position bias has no parameters");
        s.fused_qkv = true;
        s.qkv_bias = s.o_bias = s.mlp_bias = bias;
        s.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
        s.mlp = M::Plain;
        pick_head(j, s, {"FalconForCausalLM", "FalconModel", "", "", H::CausalLM});
    } else {
        static const std::pair<const char*, const char*> classes[] = {
            {"llama", "Llama"},     {"mistral", "Mistral"},    {"mixtral", "Mixtral"},
            {"qwen2", "Qwen2"},     {"qwen2_moe", "Qwen2Moe"}, {"gemma", "Gemma"},
            {"gemma2", "Gemma2"},   {"phi3", "Phi3"},          {"deepseek_v2", "DeepseekV2"},
            {"deepseek_v3", "DeepseekV3"}, {"qwen3", "Qwen3"},       {"qwen3_moe", "Qwen3Moe"},
            {"granite", "Granite"},         {"kimi_k2", "DeepseekV3"},   {"gpt_oss", "GptOss"},
            {"gemma3_text", "Gemma3Text"},  {"gemma3", "Gemma3Text"},     {"qwen3_next", "Qwen3Next"},
            {"llama4_text", "Llama4"},      {"llama4", "Llama4"},
        };
        std::string prefix;
        for (const auto& [t, p] : classes)
            if (type == t) prefix = p;
        if (type == "gemma3") {
            // Gemma3ForConditionalGeneration: the language model from text_config,
            // the SigLIP vision tower and the projector as parameters only.
            read_text_config(j, origin, s, "gemma3", "Gemma3TextConfig", "gemma3_text");
            const auto vc = j.find("vision_config");
            if (vc != j.end() && vc->is_object()) {
                Reader v(*vc, origin, "SiglipVisionConfig", s);
                const std::int64_t vh = v.integer({"hidden_size"}, 768), vi = v.integer({"intermediate_size"}, 3072), vl = v.layer_count({"num_hidden_layers"}, 12);
                const Patches pg = read_patches(v, 224, 16);
                const std::int64_t patch = pg.patch, ch = pg.channels, patches = pg.count();
                // modeling_siglip.py SiglipVisionEmbeddings / SiglipEncoderLayer, modeling_gemma3.py Gemma3MultiModalProjector.
                s.extra_params = {{"vision_tower.embeddings.patch_embedding.weight", {vh, ch, patch, patch}},
                                  {"vision_tower.embeddings.patch_embedding.bias", {vh}},
                                  {"vision_tower.embeddings.position_embedding.weight", {patches, vh}},
                                  {"vision_tower.encoder.layers.attn_qkvo.weight", {vl, 4, vh, vh}},
                                  {"vision_tower.encoder.layers.attn_qkvo.bias", {vl, 4, vh}},
                                  {"vision_tower.encoder.layers.mlp.fc1.weight", {vl, vi, vh}},
                                  {"vision_tower.encoder.layers.mlp.fc1.bias", {vl, vi}},
                                  {"vision_tower.encoder.layers.mlp.fc2.weight", {vl, vh, vi}},
                                  {"vision_tower.encoder.layers.mlp.fc2.bias", {vl, vh}},
                                  {"vision_tower.encoder.layers.layer_norms", {vl, 4, vh}},
                                  {"vision_tower.post_layernorm", {2, vh}},
                                  {"multi_modal_projector.mm_input_projection_weight", {vh, s.hidden}},
                                  {"multi_modal_projector.mm_soft_emb_norm.weight", {vh}}};
                s.notes.push_back("gemma3: the SigLIP vision tower (" + std::to_string(vl) + " layers of " + std::to_string(vh) +
                                  ") and the projector are counted as parameters; image activations are not modelled");
            }
            s.arch_class = "Gemma3ForConditionalGeneration";
            s.head = H::CausalLM;
        } else if (type == "llama4") {
            // Llama4ForConditionalGeneration: the language model from
            // text_config, the vision tower and projector as parameters only
            // (modeling_llama4.py; docs/research/llama4.md section 2c). The
            // tower's linears are split over tensor parallelism as vLLM's
            // mllama4.py shards them (mm_encoder_tp_mode "weights").
            read_text_config(j, origin, s, "llama4", "Llama4TextConfig", "llama4_text");
            const auto vc = j.find("vision_config");
            if (vc != j.end() && vc->is_object()) {
                Reader v(*vc, origin, "Llama4VisionConfig", s);
                const std::int64_t D = v.integer({"hidden_size"}, 768), Iv = v.integer({"intermediate_size"}, 5632), Lv = v.layer_count({"num_hidden_layers"}, 34);
                const Patches pg = read_patches(v, 448, 14);
                const std::int64_t patch = pg.patch, ch = pg.channels;
                const std::int64_t pin = v.integer({"projector_input_dim"}, 4096), pout = v.integer({"projector_output_dim"}, 4096);
                const std::int64_t vout = v.integer({"vision_output_dim"}, 7680);
                const bool pbias = v.boolean({"multi_modal_projector_bias"}, false);
                const std::int64_t positions = checked_add(pg.count(), 1);
                using C = Component;
                s.extra_params = {{"vision_model.patch_embedding.linear.weight", {D, checked_mul(ch, checked_mul(patch, patch))}, C::Attention},
                                  {"vision_model.class_embedding", {D}},
                                  {"vision_model.positional_embedding_vlm", {positions, D}},
                                  {"vision_model.layernorm_pre_post", {2, 2, D}},
                                  {"vision_model.model.layers.self_attn.qkv.weight", {checked_mul(3, D), Lv, D}, C::Attention},
                                  {"vision_model.model.layers.self_attn.qkv.bias", {checked_mul(3, D), Lv}, C::Attention},
                                  {"vision_model.model.layers.self_attn.o_proj.weight", {D, Lv, D}, C::Attention},
                                  {"vision_model.model.layers.self_attn.o_proj.bias", {D, Lv}},
                                  {"vision_model.model.layers.mlp.fc1.weight", {Iv, Lv, D}, C::Mlp},
                                  {"vision_model.model.layers.mlp.fc1.bias", {Iv, Lv}, C::Mlp},
                                  {"vision_model.model.layers.mlp.fc2.weight", {Iv, Lv, D}, C::Mlp},
                                  {"vision_model.model.layers.mlp.fc2.bias", {D, Lv}},
                                  {"vision_model.model.layers.layer_norms", {Lv, 4, D}},
                                  {"vision_model.vision_adapter.mlp.fc1.weight", {pin, Iv}, C::Mlp},
                                  {"vision_model.vision_adapter.mlp.fc2.weight", {pout, pin}, C::Mlp},
                                  {"multi_modal_projector.linear_1.weight", {s.hidden, vout}, C::Mlp}};
                if (pbias) {
                    s.extra_params.push_back({"vision_model.vision_adapter.mlp.fc1.bias", {pin}, C::Mlp});
                    s.extra_params.push_back({"vision_model.vision_adapter.mlp.fc2.bias", {pout}});
                }
                s.notes.push_back("llama4: the vision tower (" + std::to_string(Lv) + " layers of " + std::to_string(D) +
                                  ") and the projector are counted as parameters; image activations are not modelled");
            }
            s.arch_class = "Llama4ForConditionalGeneration";
            s.head = H::CausalLM;
        } else {
            Reader r(j, origin, prefix + "Config", s);
            read_llama_like(r, s, type);
            pick_head(j, s, {prefix + "ForCausalLM", prefix + "Model", "", "", H::CausalLM});
        }
        if (type == "kimi_k2") s.model_type = "deepseek_v3";  // Kimi K2 is DeepseekV3ForCausalLM
    }
    if (const auto qc = j.find("quantization_config"); qc != j.end() && !qc->is_null()) s.weight_quant = read_quantization(*qc, origin);
    return s;
}

}  // namespace

Result<TransformerSpec> parse_hf_config(const nlohmann::json& config, std::string_view origin) {
    return capture([&]() -> TransformerSpec { return parse(config, origin); });
}

}  // namespace gpumem
