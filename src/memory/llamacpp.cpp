// llama.cpp's load-time buffers (gpumem/memory/llamacpp.hpp). Rules and their
// sources: docs/research/llamacpp.md (LC = a95a11e5b834, 2026-04-30; OLD =
// c392e5094dea, 2025-02-20).
#include "gpumem/memory/llamacpp.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/model/load.hpp"
#include "engine_args.hpp"
#include "serving_internal.hpp"

namespace gpumem {

namespace {

using engine_args::check;

std::string mib(Bytes b) { return serving_detail::fixed(static_cast<double>(b.count()) / 1048576.0, 2); }

std::string upper(std::string_view s) {
    std::string o(s);
    for (char& c : o) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return o;
}

const GgmlType& type_named(const char* n) {
    const GgmlType* t = ggml_type_by_name(n);
    if (!t) fail(ErrorCode::InvalidArgument, "", std::string("ggml type table lacks ") + n);
    return *t;
}

// ---- llama-quantize's per-tensor type mix --------------------------------

// llama_ftype (include/llama.h @LC) and its base type
// (llama_ftype_get_default_type, llama-quant.cpp L792-831).
struct FileType {
    const char* name;
    int id;
    const char* base;
};
constexpr FileType kFileTypes[] = {
    {"F32", 0, "f32"},       {"F16", 1, "f16"},       {"Q4_0", 2, "q4_0"},     {"Q4_1", 3, "q4_1"},     {"Q8_0", 7, "q8_0"},
    {"Q5_0", 8, "q5_0"},     {"Q5_1", 9, "q5_1"},     {"Q2_K", 10, "q2_K"},    {"Q3_K_S", 11, "q3_K"},  {"Q3_K_M", 12, "q3_K"},
    {"Q3_K_L", 13, "q3_K"},  {"Q4_K_S", 14, "q4_K"},  {"Q4_K_M", 15, "q4_K"},  {"Q5_K_S", 16, "q5_K"},  {"Q5_K_M", 17, "q5_K"},
    {"Q6_K", 18, "q6_K"},    {"IQ4_NL", 25, "iq4_nl"}, {"IQ4_XS", 30, "iq4_xs"}, {"BF16", 32, "bf16"},
    // L792-834: IQ3_XS and IQ3_M on iq3_s, IQ2_S on iq2_xs, IQ2_M on iq2_s.
    {"IQ2_XXS", 19, "iq2_xxs"}, {"IQ2_XS", 20, "iq2_xs"}, {"Q2_K_S", 21, "q2_K"}, {"IQ3_XS", 22, "iq3_s"}, {"IQ3_XXS", 23, "iq3_xxs"},
    {"IQ1_S", 24, "iq1_s"},     {"IQ3_S", 26, "iq3_s"},   {"IQ3_M", 27, "iq3_s"}, {"IQ2_S", 28, "iq2_xs"}, {"IQ2_M", 29, "iq2_s"},
    {"IQ1_M", 31, "iq1_m"},     {"TQ1_0", 36, "tq1_0"},   {"TQ2_0", 37, "tq2_0"}, {"MXFP4_MOE", 38, "mxfp4"},
};
// Names of the other llama_ftype values, for the error and for files.
constexpr std::pair<int, const char*> kOtherFileTypes[] = {{39, "NVFP4"}, {40, "Q1_0"}};

// llama-quantize refuses these without an importance matrix (L767-786,
// L1038-1049), so real files of them were made with one.
bool needs_imatrix(std::string_view f) {
    return f == "IQ1_S" || f == "IQ1_M" || f == "IQ2_XXS" || f == "IQ2_XS" || f == "IQ2_S" || f == "IQ2_M" || f == "IQ3_XXS" || f == "IQ3_XS" ||
           f == "Q2_K_S";
}
// The IQ1/IQ2 file types' own branch of the rules (L487-510).
bool iq12(std::string_view f) { return f == "IQ1_S" || f == "IQ1_M" || f == "IQ2_XXS" || f == "IQ2_XS" || f == "IQ2_S" || f == "IQ2_M"; }
// That branch's raised type for attn_v and the first ffn_down tensors.
const char* iq12_raised(std::string_view f) { return f == "IQ2_S" || f == "IQ2_M" ? "iq3_s" : "q2_K"; }

const FileType* file_type_named(std::string_view n) {
    const std::string u = upper(n);
    for (const auto& f : kFileTypes)
        if (u == f.name) return &f;
    return nullptr;
}

std::string file_type_name(std::int64_t id) {
    for (const auto& f : kFileTypes)
        if (f.id == id) return f.name;
    for (const auto& [i, n] : kOtherFileTypes)
        if (i == id) return n;
    return id < 0 ? "unknown" : "file type " + std::to_string(id);
}

enum class Cat { TokenEmbd, Output, AttnQ, AttnK, AttnV, AttnQkv, AttnOutput, FfnGate, FfnUp, FfnDown, Router, Other };

// use_more_bits (llama-quant.cpp L417-419): the first and last eighth of the
// layers and every third in between.
bool use_more_bits(std::int64_t i, std::int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct MixContext {
    const FileType* ft = nullptr;
    std::int64_t n_layer = 0, n_gqa = 1, n_expert = 0;
    bool is_70b = false;
    bool old_qkv_rule = false;
    bool imatrix = false;  // an importance matrix was given (qs.has_imatrix)
};

// llama_tensor_get_type (L411-658) without --pure or overrides. `experts`:
// a 3-D tensor of routed experts (ne[2] > 1). The IQ1/IQ2 types' ffn_down
// rule counts tensors in file order and is applied by the caller.
const GgmlType& mix_type(const MixContext& c, Cat cat, std::int64_t i, bool experts = false) {
    const std::string f = c.ft->name;
    const GgmlType& base = type_named(c.ft->base);
    const bool quantized = f != "F32" && f != "F16" && f != "BF16";
    if (!quantized || cat == Cat::Router) return base;
    const auto T = [](const char* n) -> const GgmlType& { return type_named(n); };
    const bool E8 = c.n_expert == 8;
    if (cat == Cat::Output) {  // L439-461 (and token_embd when there is no output.weight)
        if (f == "MXFP4_MOE") return T("q8_0");
        if (iq12(f) || f == "IQ3_XXS") return T("q5_K");
        return f == "Q8_0" ? base : T("q6_K");
    }
    if (f == "MXFP4_MOE") return experts ? T("mxfp4") : T("q8_0");  // L461-468
    if (cat == Cat::TokenEmbd) {  // L469-486: an untied token_embd
        if (f == "IQ2_XXS" || f == "IQ2_XS" || f == "IQ1_S" || f == "IQ1_M") return T("q2_K");
        if (f == "IQ2_S" || f == "IQ2_M" || f == "IQ3_XXS") return T("iq3_s");
        if (f == "TQ1_0" || f == "TQ2_0") return T("q4_K");
        return base;
    }
    if (iq12(f)) {  // L487-510
        const GgmlType& lo = T(iq12_raised(f));
        if (cat == Cat::AttnV || cat == Cat::AttnQkv) {
            if (cat == Cat::AttnQkv && c.old_qkv_rule) return base;
            return c.n_gqa >= 4 || c.n_expert >= 4 ? T("q4_K") : lo;
        }
        if (E8 && cat == Cat::AttnK) return T("q4_K");
        if (cat == Cat::AttnOutput) {
            if (E8) return T("q5_K");
            if (f == "IQ1_S" || f == "IQ1_M") return T("iq2_xxs");
            if (f == "IQ2_S" || f == "IQ2_M") return T("iq3_s");
        }
        return base;
    }
    switch (cat) {
        case Cat::AttnV:
        case Cat::AttnQkv: {
            if (cat == Cat::AttnQkv && c.old_qkv_rule) {  // before #19770 (2026-03-10)
                if (f == "Q3_K_M" || f == "Q3_K_L") return T("q4_K");
                if (f == "Q4_K_M") return T("q5_K");
                if (f == "Q5_K_M") return T("q6_K");
                if (f == "IQ3_M") return T("q4_K");
                return base;
            }
            // L511-548
            const GgmlType* t = &base;
            if (f == "Q2_K") t = &T(c.n_gqa >= 4 ? "q4_K" : "q3_K");
            else if (f == "Q2_K_S" && c.n_gqa >= 4) t = &T("q4_K");
            else if (f == "IQ3_XXS") t = &T(c.n_gqa >= 4 ? "q4_K" : c.imatrix ? "iq3_xxs" : "iq3_s");
            else if ((f == "IQ3_XS" || f == "IQ3_S") && c.n_gqa >= 4) t = &T("q4_K");
            else if (f == "IQ3_M") t = &T("q4_K");
            else if (f == "Q3_K_M") t = &T(i < 2 ? "q5_K" : "q4_K");
            else if (f == "Q3_K_L") t = &T("q5_K");
            else if ((f == "IQ4_XS" || f == "IQ4_NL") && c.n_gqa >= 4) t = &T("q5_K");
            else if ((f == "Q4_K_M" || f == "Q5_K_M") && use_more_bits(i, c.n_layer)) t = &T("q6_K");
            else if (f == "Q4_K_S" && i < 4) t = &T("q5_K");
            if (c.is_70b && (t->id == T("q3_K").id || t->id == T("q4_K").id)) t = &T("q5_K");
            if (c.n_expert == 8) t = &T("q8_0");
            return *t;
        }
        case Cat::AttnK:  // L549-560: 8-expert models keep K in q8_0
            if (E8) return T("q8_0");
            if (f == "IQ3_XS") return T("iq3_xxs");
            if (f == "IQ3_XXS") return T("iq2_s");
            return base;
        case Cat::AttnQ:  // L561-567
            if (f == "IQ3_XS") return T("iq3_xxs");
            if (f == "IQ3_XXS") return T("iq2_s");
            return base;
        case Cat::FfnDown:  // L568-612
            if (f == "Q2_K") return T("q3_K");
            if (f == "Q2_K_S") return i < c.n_layer / 8 ? T("q4_K") : base;
            if (f == "IQ3_XXS" && !c.imatrix) return T(i < c.n_layer / 8 ? "q4_K" : "q3_K");
            if (f == "Q3_K_M") return T(i < c.n_layer / 16 ? "q5_K" : "q4_K");
            if (f == "IQ3_M" && (i < c.n_layer / 8 || (E8 && use_more_bits(i, c.n_layer)))) return T("q4_K");
            if (f == "Q3_K_L") return T("q5_K");
            if ((f == "Q4_K_M" || f == "Q5_K_M") && use_more_bits(i, c.n_layer)) return T("q6_K");
            if ((f == "Q4_K_S" || f == "IQ4_XS" || f == "IQ4_NL") && i < c.n_layer / 8) return T("q5_K");
            return base;
        case Cat::AttnOutput:  // L613-632
            if (E8) {
                static const char* const kE8[] = {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"};
                for (const char* k : kE8)
                    if (f == k) return T("q5_K");
                return base;
            }
            if (f == "Q2_K") return T("q3_K");
            if (f == "IQ3_XXS") return T("iq3_s");
            if (f == "Q3_K_M") return T("q4_K");
            if (f == "Q3_K_L") return T("q5_K");
            if (f == "IQ3_M") return T("q4_K");
            return base;
        case Cat::FfnGate:  // L640-655: IQ3_XS's middle layers
        case Cat::FfnUp:
            if (f == "IQ3_XS" && i >= c.n_layer / 8 && i < 7 * c.n_layer / 8) return T("iq3_xxs");
            return base;
        default:
            return base;
    }
}

// The fallback when a row is not a whole number of blocks (L362-408).
const GgmlType& row_compatible(const GgmlType& t, std::int64_t ne0) {
    if (ne0 % t.block == 0) return t;
    static const std::map<std::string, std::string> kFallback = {
        {"q4_K", "q5_0"},     {"q5_K", "q5_1"},    {"q6_K", "q8_0"},     {"q2_K", "q4_0"},     {"q3_K", "q4_0"},    {"iq4_xs", "iq4_nl"},
        {"iq1_s", "iq4_nl"},  {"iq1_m", "iq4_nl"}, {"iq2_xxs", "iq4_nl"}, {"iq2_xs", "iq4_nl"}, {"iq2_s", "iq4_nl"}, {"iq3_xxs", "iq4_nl"},
        {"iq3_s", "iq4_nl"},  {"tq1_0", "q4_0"},   {"tq2_0", "q4_0"}};
    const auto it = kFallback.find(t.name);
    const GgmlType* f = it != kFallback.end() ? ggml_type_by_name(it->second) : nullptr;
    if (f && ne0 % f->block == 0) return *f;
    return type_named("f16");
}

// Hugging Face parameter names onto llama.cpp's tensor names and roles
// (gguf-py/gguf/tensor_mapping.py @LC).
struct Role {
    Cat cat;
    const char* gguf;
};
Role role_of(const std::string& hf) {
    const auto ends = [&](const char* suffix) {
        const std::string s(suffix);
        return hf.size() >= s.size() && hf.compare(hf.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("qkv_proj") || ends("query_key_value") || ends("c_attn") || ends("Wqkv") || ends("W_pack")) return {Cat::AttnQkv, "attn_qkv"};
    if (ends("q_proj") || ends(".query")) return {Cat::AttnQ, "attn_q"};
    if (ends("k_proj") || ends(".key")) return {Cat::AttnK, "attn_k"};
    if (ends("v_proj") || ends(".value")) return {Cat::AttnV, "attn_v"};
    if (ends("o_proj") || ends("attention.dense") || ends("self_attn.dense") || ends("out_proj") || ends("attn.c_proj") ||
        ends("attention.output.dense"))
        return {Cat::AttnOutput, "attn_output"};
    if (ends("gate_up_proj")) return {Cat::FfnUp, "ffn_up"};
    if (ends("gate_proj") || ends("w1")) return {Cat::FfnGate, "ffn_gate"};
    if (ends("up_proj") || ends("dense_h_to_4h") || ends("fc1") || ends("c_fc") || ends("w3") || ends("intermediate.dense"))
        return {Cat::FfnUp, "ffn_up"};
    if (ends("down_proj") || ends("dense_4h_to_h") || ends("fc2") || ends("mlp.c_proj") || ends("w2") || ends("output.dense"))
        return {Cat::FfnDown, "ffn_down"};
    if (ends("mlp.gate") || ends("router")) return {Cat::Router, "ffn_gate_inp"};
    return {Cat::Other, ""};
}

std::string strip_suffix(const std::string& n, const char* suf) {
    const std::string s(suf);
    return n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0 ? n.substr(0, n.size() - s.size()) : n;
}

}  // namespace

std::vector<std::pair<std::string, std::int64_t>> tensor_type_counts(const LlamaModel& m) {
    std::map<int, std::pair<std::string, std::int64_t>> by_id;
    for (const auto& t : m.tensors) {
        auto& e = by_id[t.type->id];
        e.first = t.type->name;
        ++e.second;
    }
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const auto& [id, e] : by_id) out.push_back(e);
    return out;
}

Result<LlamaModel> llama_model_from_graph(const ModelGraph& g, std::string_view file_type, bool old_qkv_rule, std::optional<bool> imatrix) {
    return capture([&]() -> LlamaModel {
        check(g.transformer.has_value() && !g.transformer->encoder_decoder, "model", "llama.cpp serving needs a decoder-only transformer");
        const TransformerDims& d = *g.transformer;
        check(!d.latent_kv, "model",
              "llama.cpp's MLA cache (DeepSeek) is not modelled from a config: give the .gguf file, or serve it with --engine vllm");
        const FileType* ft = file_type_named(file_type);
        if (!ft) {
            std::string known;
            for (const auto& f : kFileTypes) known += std::string(known.empty() ? "" : ", ") + f.name;
            fail(ErrorCode::InvalidArgument, "quant",
                 "--quant " + std::string(file_type) + ": not a GGUF file type llama-quantize makes (" + known +
                     "): give the .gguf file, whose header names every tensor's type");
        }
        LlamaModel m;
        m.name = g.name;
        m.arch = g.family;
        m.file_type = ft->name;
        m.n_layer = d.layers;
        m.n_embd = d.hidden;
        m.n_head = d.heads;
        m.n_ff = d.intermediate;
        m.n_vocab = d.vocab;
        m.n_ctx_train = g.max_positions;
        const std::int64_t kv_dim = d.kv_heads * d.head_dim;
        m.n_embd_k_gqa.assign(static_cast<std::size_t>(d.layers), kv_dim);
        m.n_embd_v_gqa.assign(static_cast<std::size_t>(d.layers), kv_dim);
        if (d.sliding_window > 0) {
            m.n_swa = d.sliding_window;
            m.swa_layers = d.sliding_layers;
        }
        MixContext mc;
        mc.ft = ft;
        mc.n_layer = d.layers;
        mc.n_gqa = d.kv_heads > 0 ? d.heads / d.kv_heads : 1;
        mc.n_expert = d.experts;
        // LLM_TYPE_70B (llama-model.cpp @LC L881-901, L1264-1280): llama models
        // of 80 layers with grouped KV heads and not 8 experts, Qwen2 of 80.
        mc.is_70b = d.layers == 80 && (((g.family == "llama" || g.family == "mistral") && d.kv_heads != d.heads && d.experts != 8) || g.family == "qwen2");
        mc.old_qkv_rule = old_qkv_rule;
        mc.imatrix = imatrix.value_or(needs_imatrix(ft->name));
        const GgmlType& f32 = type_named("f32");
        const GgmlType& f16 = type_named(ft->id == 0 ? "f32" : ft->id == 32 ? "bf16" : "f16");
        std::uint64_t offset = 0;
        std::int64_t layer = 0;
        bool has_output = false;
        std::vector<LlamaTensor> tail;  // output_norm and output: last in the file
        const auto add = [&](std::vector<LlamaTensor>& to, const std::string& name, int lay, const GgmlType& t, std::vector<std::int64_t> ne) {
            LlamaTensor x;
            x.name = name;
            x.layer = lay;
            x.type = &t;
            x.ne = std::move(ne);
            x.bytes = ggml_nbytes(t, x.ne);
            to.push_back(std::move(x));
        };
        std::vector<LlamaTensor> body;
        for (const Block& b : g.blocks) {
            if (b.checkpointable) {  // a transformer layer, `repeat` times
                for (std::int64_t r = 0; r < b.repeat; ++r, ++layer) {
                    const std::string blk = "blk." + std::to_string(layer) + ".";
                    for (const Param& p : b.params) {
                        const bool weight = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
                        const std::string stem = strip_suffix(strip_suffix(p.name, ".weight"), ".bias");
                        if (p.shape.size() < 2 || !weight) {  // norms and biases: f32 (1-D tensors are never quantized, L293)
                            add(body, blk + stem + (weight ? ".weight" : ".bias"), static_cast<int>(layer), f32, {p.numel()});
                            continue;
                        }
                        const Role role = role_of(stem);
                        const bool experts = p.count > 1;
                        // nn.Linear [out, in] -> ggml ne [in, out]; GPT-2's Conv1D stores [in, out].
                        const bool conv1d = g.family == "gpt2";
                        std::vector<std::int64_t> ne = conv1d ? std::vector<std::int64_t>{p.shape[0], p.shape[1]} : std::vector<std::int64_t>{p.shape[1], p.shape[0]};
                        if (experts) ne.push_back(p.count);
                        const GgmlType& want = role.cat == Cat::Router ? f32 : role.cat == Cat::Other ? f16 : mix_type(mc, role.cat, layer, experts);
                        const bool shared = stem.find("shared_expert") != std::string::npos;
                        if (experts && stem.size() >= 12 && stem.compare(stem.size() - 12, 12, "gate_up_proj") == 0 && ne[1] % 2 == 0) {
                            // Fused experts (gpt-oss): the converter writes ffn_gate_exps and ffn_up_exps.
                            std::vector<std::int64_t> half = ne;
                            half[1] /= 2;
                            add(body, blk + "ffn_gate_exps.weight", static_cast<int>(layer), row_compatible(mix_type(mc, Cat::FfnGate, layer, true), ne[0]), half);
                            add(body, blk + "ffn_up_exps.weight", static_cast<int>(layer), row_compatible(mix_type(mc, Cat::FfnUp, layer, true), ne[0]), half);
                            continue;
                        }
                        const std::string nm =
                            role.gguf[0] ? blk + role.gguf + (experts ? "_exps" : shared ? "_shexp" : "") + ".weight" : blk + stem + ".weight";
                        add(body, nm, static_cast<int>(layer), row_compatible(want, ne[0]), ne);
                    }
                }
            } else if (layer == 0) {  // the embeddings block
                for (const Param& p : b.params) {
                    if (p.component == Component::Other) {  // a VLM's vision tower: llama.cpp's separate mmproj file
                        if (m.notes.empty() || m.notes.back().rfind("vision", 0) != 0)
                            m.notes.push_back("vision tower and projector: not in the text GGUF (llama.cpp loads them from a separate --mmproj file)");
                        continue;
                    }
                    if (p.shape.size() == 2 && p.component == Component::Embeddings && p.name.find("embed_positions") == std::string::npos &&
                        p.name.find("wpe") == std::string::npos) {
                        add(body, "token_embd.weight", -1, f16, {p.shape[1], p.shape[0]});
                    } else if (p.shape.size() == 2) {
                        add(body, "position_embd.weight", -1, f16, {p.shape[1], p.shape[0]});  // not quantized (L288-360)
                    } else {
                        add(body, "token_embd_norm." + std::string(p.name.find("bias") != std::string::npos ? "bias" : "weight"), -1, f32, {p.numel()});
                    }
                }
            } else {  // the head: final norm, output
                for (const Param& p : b.params) {
                    if (p.output_head || (p.shape.size() == 2 && p.component == Component::Head)) {
                        has_output = true;
                        const GgmlType& want = mix_type(mc, Cat::Output, 0);
                        // Rows not a whole number of 256-blocks: q8_0 (L439-461).
                        const GgmlType& t = ft->id != 0 && ft->id != 1 && ft->id != 32 && p.shape[1] % 256 != 0 ? type_named("q8_0") : want;
                        add(tail, "output.weight", static_cast<int>(d.layers), row_compatible(t, p.shape[1]), {p.shape[1], p.shape[0]});
                    } else if (p.shape.size() == 1 && p.name.find("lm_head") != std::string::npos) {
                        add(tail, "output.bias", static_cast<int>(d.layers), f32, {p.numel()});
                    } else {
                        add(tail, std::string("output_norm.") + (p.name.find("bias") != std::string::npos ? "bias" : "weight"), static_cast<int>(d.layers), f32,
                            {p.numel()});
                    }
                }
            }
        }
        m.tied = !has_output;
        // Tied embeddings: token_embd takes the output's type (L439-461: the
        // rule applies to token_embd when there is no output.weight).
        for (auto& t : body)
            if (t.name == "token_embd.weight" && m.tied && ft->id != 0 && ft->id != 1 && ft->id != 32) {
                const GgmlType& want = t.ne[0] % 256 != 0 ? type_named("q8_0") : mix_type(mc, Cat::Output, 0);
                t.type = &row_compatible(want, t.ne[0]);
                t.bytes = ggml_nbytes(*t.type, t.ne);
            } else if (t.name == "token_embd.weight" && ft->id != 0 && ft->id != 1 && ft->id != 32) {
                t.type = &row_compatible(mix_type(mc, Cat::TokenEmbd, 0), t.ne[0]);
                t.bytes = ggml_nbytes(*t.type, t.ne);
            }
        for (auto& t : body) m.fused_qkv = m.fused_qkv || t.name.find("attn_qkv") != std::string::npos;
        // IQ1/IQ2: the first n_layer / 8 ffn_down tensors in llama-quantize's
        // order (layer, then name: _exps before _shexp) take the lower type
        // (L497-502, a raw counter over every ffn_down* tensor).
        if (iq12(ft->name)) {
            std::vector<LlamaTensor*> downs;
            for (auto& t : body)
                if (t.name.find("ffn_down") != std::string::npos && t.ne.size() >= 2) downs.push_back(&t);
            std::stable_sort(downs.begin(), downs.end(), [](const LlamaTensor* a, const LlamaTensor* b) {
                return a->layer != b->layer ? a->layer < b->layer : a->name < b->name;
            });
            const GgmlType& lo = type_named(iq12_raised(ft->name));
            for (std::size_t k = 0; k < downs.size() && static_cast<std::int64_t>(k) < d.layers / 8; ++k) {
                downs[k]->type = &row_compatible(lo, downs[k]->ne[0]);
                downs[k]->bytes = ggml_nbytes(*downs[k]->type, downs[k]->ne);
            }
        }
        for (auto& t : tail) body.push_back(std::move(t));
        for (auto& t : body) {  // the converter's order, each tensor aligned to 32 bytes (gguf.cpp L716-731)
            t.offset = offset;
            offset += static_cast<std::uint64_t>(checked_round_up(t.bytes, 32));
        }
        m.data_size = static_cast<std::int64_t>(offset);
        m.tensors = std::move(body);
        m.notes.push_back("tensor types: llama-quantize's " + m.file_type + " mix " + (mc.imatrix ? "with" : "without") +
                          " an importance matrix" + (needs_imatrix(ft->name) && mc.imatrix ? " (it refuses this type without one)" : "") + " (llama-quant.cpp@a95a11e5b834" +
                          (old_qkv_rule ? ", fused attn_qkv by the rule before #19770" : "") + "); a downloaded file's own types may differ: give the .gguf to read them");
        return m;
    });
}

Result<LlamaModel> llama_model_from_gguf(const GgufFile& f, std::string_view name) {
    return capture([&]() -> LlamaModel {
        LlamaModel m;
        m.name = std::string(name);
        m.arch = f.architecture;
        check(!m.arch.empty(), "model", std::string(name) + ": the GGUF header has no general.architecture");
        const auto need = [&](const char* key) {
            const auto v = f.arch_int(key);
            check(v.has_value() && *v > 0, "model", std::string(name) + ": the GGUF header lacks " + m.arch + "." + key);
            return *v;
        };
        m.n_layer = need("block_count");
        m.n_embd = need("embedding_length");
        m.n_head = need("attention.head_count");
        m.n_ff = f.arch_int("feed_forward_length").value_or(0);
        m.n_ctx_train = f.arch_int("context_length").value_or(0);
        m.file_type = file_type_name(f.file_type);
        check(m.n_layer <= 100000, "model", std::string(name) + ": block_count " + std::to_string(m.n_layer) + " is not a real model's");
        const auto per_layer = [&](const char* key, std::int64_t fallback) {
            std::vector<std::int64_t> v(static_cast<std::size_t>(m.n_layer), fallback);
            const std::string k = m.arch + "." + key;
            if (const auto it = f.ints.find(k); it != f.ints.end()) std::fill(v.begin(), v.end(), it->second);
            if (const auto it = f.int_arrays.find(k); it != f.int_arrays.end() && static_cast<std::int64_t>(it->second.size()) == m.n_layer) v = it->second;
            return v;
        };
        const std::vector<std::int64_t> kv_heads = per_layer("attention.head_count_kv", m.n_head);
        const std::int64_t k_len = f.arch_int("attention.key_length").value_or(m.n_embd / m.n_head);
        const std::int64_t v_len = f.arch_int("attention.value_length").value_or(m.n_embd / m.n_head);
        for (std::int64_t i = 0; i < m.n_layer; ++i) {
            m.n_embd_k_gqa.push_back(checked_mul(kv_heads[static_cast<std::size_t>(i)], k_len));
            m.n_embd_v_gqa.push_back(checked_mul(kv_heads[static_cast<std::size_t>(i)], v_len));
        }
        // Sliding-window layers (llama-model.cpp load_hparams: set_swa_pattern):
        // gemma2 and gpt-oss every other layer, gemma3 five of six; others none.
        if (const auto w = f.arch_int("attention.sliding_window"); w && *w > 0) {
            const std::int64_t pattern = m.arch == "gemma2" || m.arch == "gpt-oss" ? 2 : m.arch == "gemma3" ? 6 : 0;
            if (pattern > 0) {
                m.n_swa = *w;
                for (std::int64_t i = 0; i < m.n_layer; ++i) m.swa_layers.push_back((i + 1) % pattern != 0);
            } else {
                m.notes.push_back(m.arch + ": attention.sliding_window is set but its layer pattern is not modelled; every layer is cached in full");
            }
        }
        bool has_output = false;
        for (const GgufTensor& t : f.tensors) {
            LlamaTensor x;
            x.name = t.name;
            x.type = ggml_type_by_id(t.type);
            check(x.type != nullptr, "model", std::string(name) + ": tensor " + t.name + " has an unknown ggml type");
            x.ne = t.ne;
            x.offset = t.offset;
            x.bytes = t.bytes;
            if (t.name.rfind("blk.", 0) == 0) {
                const std::size_t dot = t.name.find('.', 4);
                std::int64_t il = -1;
                const std::string_view idx = std::string_view(t.name).substr(4, dot == std::string::npos ? std::string_view::npos : dot - 4);
                if (const auto [end, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), il);
                    ec != std::errc() || end != idx.data() + idx.size() || idx.empty())
                    il = -1;
                check(il >= 0 && il < m.n_layer, "model", std::string(name) + ": tensor " + t.name + " names a block outside 0.." + std::to_string(m.n_layer - 1));
                x.layer = static_cast<int>(il);
            } else if (t.name.rfind("output", 0) == 0) {
                x.layer = static_cast<int>(m.n_layer);
                has_output = has_output || t.name == "output.weight";
            } else if (t.name == "rope_freqs.weight") {
                m.rope_freqs = true;
                x.layer = -2;  // duplicated into every buffer with layers
            } else {
                x.layer = -1;  // token_embd and the other input tensors stay on the CPU
            }
            if (t.name == "token_embd.weight" && m.n_vocab == 0 && t.ne.size() >= 2) m.n_vocab = t.ne[1];
            if (t.name.find("attn_qkv") != std::string::npos) m.fused_qkv = true;
            m.tensors.push_back(std::move(x));
        }
        check(m.n_vocab > 0, "model", std::string(name) + ": the GGUF file has no token_embd.weight");
        if (m.n_ff == 0) m.n_ff = 4 * m.n_embd;
        m.tied = !has_output;
        m.data_size = f.data_size;
        return m;
    });
}

// ---- the command line --------------------------------------------------

void apply_llamacpp_command(const std::vector<std::string>& argv, std::size_t i, ServingOptions& o, EstimateRequest& job) {
    o.engine = Engine::LlamaCpp;
    engine_args::FlagReader f(argv, i, "llama.cpp");
    const auto int_value = [](const std::string& flag, const std::string& v) { return engine_args::to_int("llama.cpp", flag, v); };
    // Flags that do not change memory (common/arg.cpp @LC), with a value / without.
    static const std::vector<std::string> kIgnoredValue = {
        "-t", "--threads", "-tb", "--threads-batch", "--host", "--port", "-n", "--n-predict", "--temp", "--top-k", "--top-p", "--min-p",
        "-s", "--seed", "-p", "--prompt", "--chat-template", "-a", "--alias", "--api-key", "--repeat-penalty", "--fit", "--fit-target",
        "-mg", "--main-gpu", "-to", "--timeout", "--log-file", "-sys", "--system-prompt", "--reasoning-format", "--reasoning-budget",
        "--chat-template-file", "--slot-save-path", "-dev", "--device", "--keep", "--mmproj", "--lora"};
    static const std::vector<std::string> kIgnoredFlag = {
        "--jinja", "-cnv", "--conversation", "-no-cnv", "--no-conversation", "--no-warmup", "--metrics", "-cb", "--cont-batching",
        "--mlock", "-v", "--verbose", "--log-disable", "--no-webui", "-e", "--escape", "--no-display-prompt", "--mmap",
        "--embedding", "--embeddings", "-sp", "--special", "--props", "--slots", "--no-perf", "-i", "--interactive", "-st", "--single-turn"};
    while (f.next()) {
        const std::string a = f.flag();
        if (!f.is_flag()) fail(ErrorCode::InvalidArgument, "command", "unexpected argument \"" + a + "\" in the llama.cpp command line");
        if (a == "-m" || a == "--model") {
            const std::string m = f.value();
            if (job.model.empty()) job.model = m;  // a MODEL given before `--` stands in for this one
        } else if (a == "-ngl" || a == "--gpu-layers" || a == "--n-gpu-layers") {
            const std::string v = f.value();
            if (v == "all" || v == "auto" || v == "-1") o.n_gpu_layers.reset();
            else o.n_gpu_layers = int_value(a, v);
        } else if (a == "-c" || a == "--ctx-size") {
            o.ctx_size = int_value(a, f.value());
        } else if (a == "-b" || a == "--batch-size") {
            o.max_num_batched_tokens = int_value(a, f.value());
        } else if (a == "-ub" || a == "--ubatch-size") {
            o.ubatch_size = int_value(a, f.value());
        } else if (a == "-np" || a == "--parallel") {
            o.max_num_seqs = int_value(a, f.value());
        } else if (a == "-fa" || a == "--flash-attn") {
            // -fa on|off|auto (since 2025-09); a bare -fa (older builds) means on.
            std::string v;
            o.flash_attn = f.take_if({"on", "off", "auto"}, &v) ? v : std::string("on");
        } else if (a == "-ctk" || a == "--cache-type-k") {
            o.cache_type_k = f.value();
        } else if (a == "-ctv" || a == "--cache-type-v") {
            o.cache_type_v = f.value();
        } else if (a == "-ts" || a == "--tensor-split") {
            o.tensor_split = f.value();
        } else if (a == "-sm" || a == "--split-mode") {
            o.split_mode = f.value();
        } else if (a == "--no-mmap") {
            o.no_mmap = true;
        } else if (a == "-nkvo" || a == "--no-kv-offload") {
            o.no_kv_offload = true;
        } else if (a == "-kvu" || a == "--kv-unified") {
            o.kv_unified = true;
        } else if (a == "--swa-full") {
            o.swa_full = true;
        } else if (a == "-hf" || a == "--hf-repo" || a == "-hff" || a == "--hf-file") {
            f.value();
            check(!job.model.empty(), "command",
                  "llama.cpp " + a + " downloads the model: name it before -- instead (a preset or config.json with --quant, or the .gguf file)");
        } else if (std::find(kIgnoredValue.begin(), kIgnoredValue.end(), a) != kIgnoredValue.end()) {
            f.value();
        } else if (std::find(kIgnoredFlag.begin(), kIgnoredFlag.end(), a) != kIgnoredFlag.end()) {
        } else {
            fail(ErrorCode::InvalidArgument, "command",
                 "llama.cpp " + a + " is not modelled by gpumem serving: drop it, or use the flags it models (-m, -ngl, -c, -b, -ub, -np, -fa, -ctk, "
                 "-ctv, -ts, -sm, --no-mmap, -nkvo, -kvu, --swa-full)");
        }
    }
}

// ---- the buffers --------------------------------------------------------

namespace {

constexpr std::int64_t kCudaAlign = 128;       // ggml-cuda.cu buffer alignment (L791-809)
constexpr std::int64_t kMatrixRowPadding = 512;  // MATRIX_ROW_PADDING (ggml-cuda)

// A tensor's size in a CUDA buffer: quantized rows padded to 512 elements,
// the whole to 128 bytes (ggml-alloc.c L1180-1183, ggml-cuda.cu L791-809).
std::int64_t cuda_bytes(const LlamaTensor& t) {
    std::int64_t b = t.bytes;
    const bool quantized = t.type->block > 1;
    if (quantized && !t.ne.empty() && t.ne[0] % kMatrixRowPadding != 0)
        b = checked_add(b, ggml_row_bytes(*t.type, kMatrixRowPadding - t.ne[0] % kMatrixRowPadding));
    return checked_round_up(b, kCudaAlign);
}

struct Era {
    std::string name;
    bool output_first = true;   // -ngl counts the output layer first (#18148, 2025-12-18)
    bool pad256 = true;         // n_ctx padded to 256 (#17046, 2025-11-07); before: 256 with FA, else 32
    bool multi_stream = true;   // one KV stream per slot unless unified (#14363, 2025-07-16)
    bool outputs_max_1 = true;  // the reserve graph has one output row (2026 builds: n_outputs_max)
    bool old_qkv_rule = false;  // fused attn_qkv quantized by the rule before #19770
    std::int64_t default_ctx = 0;      // -c default (0: training context)
    bool server_np4_unified = true;    // llama-server without -np: 4 slots, unified KV (tools/server/server.cpp L95-99)
    bool fa_auto = true;               // -fa defaults to auto (#15434, 2025-08-30); before: off
};

Era era_of(const std::optional<std::string>& v) {
    Era e;
    if (!v || *v == "2026-04" || *v == "a95a11e5b834") {
        e.name = "2026-04 (a95a11e5b834)";
        return e;
    }
    check(*v == "2025-06", "engine-version",
          "llama.cpp " + *v + " is not modelled: gpumem serving knows llama.cpp 2026-04 (a95a11e5b834, the default) and 2025-06 (builds before "
          "the 2025-07..12 changes to slots, context padding and -ngl order)");
    e.name = "2025-06";
    e.output_first = false;
    e.pad256 = false;
    e.multi_stream = false;
    e.outputs_max_1 = false;
    e.old_qkv_rule = true;
    e.default_ctx = 4096;
    e.server_np4_unified = false;
    e.fa_auto = false;
    return e;
}

struct Setting {
    std::int64_t ngl = 0;            // as resolved (n_layer + 1 = all)
    std::int64_t n_ctx = 0;          // cells over all streams
    std::int64_t n_ctx_seq = 0;      // per slot
    std::int64_t n_seq = 1;
    bool unified = true;
    std::int64_t n_batch = 2048, n_ubatch = 512;
    bool fa = true;
    const GgmlType* type_k = nullptr;
    const GgmlType* type_v = nullptr;
    std::vector<double> split;       // device shares (normalised), one per GPU
    bool mmap = true;
    bool kv_offload = true;
    bool swa_full = false;
};

struct Device {
    Bytes model, kv, compute;
};
struct Buffers {
    std::vector<Device> gpu;
    Bytes host_mapped, host_model, host_kv, host_compute, host_output;
    Bytes cpu_weight_for_offload;  // the largest weight of a CPU layer (op offload copies it)
};

// Which device holds layer il (0..n_layer; n_layer = the output layer), -1 =
// CPU (llama-model.cpp@LC L3014-3064; @OLD L1316).
int device_of(std::int64_t il, const LlamaModel& m, const Setting& s, const Era& e) {
    const std::int64_t n = m.n_layer;
    const std::int64_t ngl = std::min(s.ngl, n + 1);
    if (ngl <= 0 || s.split.empty()) return -1;
    const std::int64_t start = e.output_first ? std::max<std::int64_t>(n + 1 - ngl, 0) : std::max<std::int64_t>(n - ngl, 0);
    if (il < start) return -1;
    if (il == n && !e.output_first && ngl <= n) return -1;  // old order: the output layer needs ngl > n_layer
    const std::int64_t act = std::min(ngl, n + 1);
    double cum = 0;
    const double x = static_cast<double>(il - start) / static_cast<double>(act);
    for (std::size_t d = 0; d < s.split.size(); ++d) {
        cum += s.split[d];
        if (x < cum) return static_cast<int>(d);
    }
    return static_cast<int>(s.split.size()) - 1;
}

Buffers buffers(const LlamaModel& m, const Setting& s, const Era& e) {
    Buffers b;
    b.gpu.resize(s.split.size());
    std::uint64_t lo = UINT64_MAX, hi = 0;
    std::vector<bool> dev_has_layers(s.split.size(), false);
    for (const LlamaTensor& t : m.tensors) {
        if (t.layer == -2) continue;  // rope_freqs: below
        const int dev = t.layer < 0 ? -1 : device_of(t.layer, m, s, e);
        if (dev >= 0) {
            b.gpu[static_cast<std::size_t>(dev)].model += Bytes(cuda_bytes(t));
            if (t.layer < m.n_layer) dev_has_layers[static_cast<std::size_t>(dev)] = true;
        } else {
            lo = std::min(lo, t.offset);
            hi = std::max(hi, t.offset + static_cast<std::uint64_t>(t.bytes));
            b.host_model += Bytes(t.bytes);
            if (t.layer >= 0 && t.ne.size() >= 2 && t.type->block > 1) b.cpu_weight_for_offload = max(b.cpu_weight_for_offload, Bytes(cuda_bytes(t)));
            if (t.layer == m.n_layer && t.name == "output.weight") b.cpu_weight_for_offload = max(b.cpu_weight_for_offload, Bytes(cuda_bytes(t)));
        }
    }
    // Tied embeddings: the output layer's weight is a copy of token_embd
    // (TENSOR_DUPLICATED, llama-model.cpp@LC L3159).
    if (m.tied) {
        for (const LlamaTensor& t : m.tensors)
            if (t.name == "token_embd.weight") {
                const int dev = device_of(m.n_layer, m, s, e);
                if (dev >= 0) b.gpu[static_cast<std::size_t>(dev)].model += Bytes(cuda_bytes(t));
                else b.cpu_weight_for_offload = max(b.cpu_weight_for_offload, Bytes(cuda_bytes(t)));
            }
    }
    if (m.rope_freqs)
        for (const LlamaTensor& t : m.tensors)
            if (t.layer == -2)
                for (std::size_t d = 0; d < dev_has_layers.size(); ++d)
                    if (dev_has_layers[d]) b.gpu[d].model += Bytes(cuda_bytes(t));
    // CPU weights: one mapping over the span of the CPU tensors in the file
    // (llama-model.cpp@LC L7967-7981), or real allocations with --no-mmap.
    if (lo <= hi && lo != UINT64_MAX) b.host_mapped = s.mmap ? Bytes(static_cast<std::int64_t>(hi - lo)) : Bytes(0);
    if (s.mmap) b.host_model = Bytes(0);

    // KV: cells x the device's layers x (K row + V row) (llama-kv-cache.cpp@LC L185-277).
    // Sliding-window layers keep PAD256(min(n_ctx_seq, n_swa x (unified ?
    // n_seq : 1) + n_ubatch)) cells per stream (llama-kv-cache-iswa.cpp@LC L50),
    // all of them with --swa-full.
    const std::int64_t streams = s.unified ? 1 : s.n_seq;
    const std::int64_t swa_cells = m.n_swa > 0 && !s.swa_full
                                       ? checked_mul(std::min(s.n_ctx_seq, checked_round_up(checked_add(checked_mul(m.n_swa, s.unified ? s.n_seq : 1), s.n_ubatch), 256)), streams)
                                       : s.n_ctx;
    for (std::int64_t il = 0; il < m.n_layer; ++il) {
        const std::size_t l = static_cast<std::size_t>(il);
        const Bytes row = Bytes(checked_add(ggml_row_bytes(*s.type_k, m.n_embd_k_gqa[l]), ggml_row_bytes(*s.type_v, m.n_embd_v_gqa[l])));
        const bool swa = l < m.swa_layers.size() && m.swa_layers[l];
        const Bytes layer_kv = Bytes(checked_mul(swa ? swa_cells : s.n_ctx, row.count()));
        const int dev = s.kv_offload ? device_of(il, m, s, e) : -1;
        if (dev >= 0) b.gpu[static_cast<std::size_t>(dev)].kv += layer_kv;
        else b.host_kv += layer_kv;
    }

    // Compute buffers (empirical fits, docs/research/llamacpp.md 3c): the
    // worst-case graph for n_tokens = min(n_ctx, n_ubatch) over the full KV.
    const double ub = static_cast<double>(std::min(s.n_ubatch, s.n_ctx)), kv = static_cast<double>(s.n_ctx_seq), E = static_cast<double>(m.n_embd),
                 H = static_cast<double>(m.n_head), V = static_cast<double>(m.n_vocab), F = static_cast<double>(m.n_ff);
    const double c = m.fused_qkv ? 6.0 : 4.0;
    // FA off: f32 KQ scores, the mask copy and c activations of the stream.
    const double attn = 4.0 * (kv * ub * H + kv * ub + c * ub * E);
    const double rows = e.outputs_max_1 ? 1.0 : ub;  // logits rows in the reserve graph
    const double logits = 4.0 * V * rows;
    const double ffn = e.outputs_max_1 ? 4.45 * 4.0 * ub * F : 0.0;
    const bool any_gpu = !s.split.empty() && s.ngl > 0;
    const bool partial = any_gpu && b.cpu_weight_for_offload > Bytes(0);
    double gpu_compute = 0;
    if (partial) {
        // Op offload: large-batch ops of CPU layers run on the GPU with a copy
        // of the weight (Mistral ngl 20: output copy + logits + one stream).
        gpu_compute = static_cast<double>(b.cpu_weight_for_offload.count()) + logits + 4.0 * ub * E;
    } else {
        gpu_compute = std::max(logits + 3.0 * 4.0 * ub * E, ffn);
        if (!s.fa) gpu_compute = std::max(gpu_compute, attn);
    }
    if (any_gpu) {
        // Each GPU with layers reserves the graph.
        for (std::size_t d = 0; d < b.gpu.size(); ++d)
            if (b.gpu[d].model > Bytes(0)) b.gpu[d].compute = Bytes(static_cast<std::int64_t>(std::ceil(gpu_compute)));
        // The host side: token_embd's get_rows and the f32 KQ mask.
        b.host_compute = Bytes(static_cast<std::int64_t>(4.0 * ub * E + 4.0 * kv * ub));
    } else {
        b.host_compute = Bytes(static_cast<std::int64_t>(std::ceil(s.fa ? std::max(logits + 12.0 * ub * E, ffn) : std::max({attn, logits + 8.0 * ub * E, ffn}))));
    }
    // The output buffer: n_vocab f32 logits per output row (llama-context.cpp@LC L1892-1912).
    b.host_output = Bytes(checked_mul(checked_mul(m.n_vocab, std::max<std::int64_t>(1, s.n_seq)), 4));
    return b;
}

const GgmlType& cache_type(const std::optional<std::string>& v, const char* field) {
    const std::string n = v.value_or("f16");
    static const std::vector<std::string> kAllowed = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};
    check(std::find(kAllowed.begin(), kAllowed.end(), n) != kAllowed.end(), field,
          std::string("--") + field + " " + n + " is not one of llama.cpp's cache types (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)");
    return *ggml_type_by_name(n);
}

bool is_gguf_path(const std::string& p) { return p.size() > 5 && upper(p.substr(p.size() - 5)) == ".GGUF"; }

// Q4_K_M etc. in a file name ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf").
std::optional<std::string> file_type_in_name(const std::string& p) {
    const std::string u = upper(std::filesystem::path(p).filename().string());
    const FileType* best = nullptr;
    for (const auto& f : kFileTypes)
        if (u.find(std::string(f.name)) != std::string::npos && (!best || std::string(f.name).size() > std::string(best->name).size())) best = &f;
    return best ? std::optional<std::string>(best->name) : std::nullopt;
}

}  // namespace

ServingResult llamacpp_memory(const EstimateRequest& job_in, const ServingOptions& o) {
    EstimateRequest job = job_in;
    ServingResult out;
    const Era era = era_of(o.engine_version);
    out.engine = "llama.cpp";
    out.engine_version = era.name;
    check(!o.gpu_memory_utilization && !o.mem_fraction_static && !o.max_total_tokens && !o.kv_cache_memory, "engine",
          "--gpu-memory-utilization, --mem-fraction-static, --max-total-tokens and --kv-cache-memory are vLLM's and SGLang's; llama.cpp sizes its "
          "KV cache from -c (--ctx-size)");
    check(job.parallel.tp <= 1 && job.parallel.pp <= 1, "tp", "llama.cpp splits layers across GPUs with -ts (--tensor-split), not --tp / --pp");
    check(!job.kv_dtype, "kv-dtype", "llama.cpp's cache types are -ctk / -ctv (--cache-type-k / --cache-type-v)");

    // The model: a .gguf header, or a preset / config.json with --quant.
    LlamaModel m;
    // A path that exists, or that cannot be inspected (a link loop): read_gguf names the problem.
    // Never for a service request (job.files false): built-in names only.
    std::error_code exists_ec;
    const bool file = job.files && is_gguf_path(job.model) && (std::filesystem::exists(job.model, exists_ec) || exists_ec);
    if (file) {
        const GgufFile f = take(read_gguf(job.model));
        m = take(llama_model_from_gguf(f, std::filesystem::path(job.model).filename().string()));
        if (o.quant) out.assumptions.push_back("--quant " + *o.quant + " ignored: the file's own tensor types are used");
    } else {
        std::string quant;
        if (o.quant) quant = *o.quant;
        else if (const auto q = is_gguf_path(job.model) ? file_type_in_name(job.model) : std::nullopt) quant = *q;
        check(!is_gguf_path(job.model), "model",
              "cannot read " + job.model + ": give the .gguf file, or name the model before -- (a preset, config.json or model folder) with --quant " +
                  (quant.empty() ? std::string("Q4_K_M") : quant));
        check(!quant.empty(), "quant",
              "llama.cpp serves GGUF files: give the .gguf file, or name its file type with --quant (e.g. --quant Q4_K_M, Q8_0, F16)");
        const ModelGraph g = take(load_model(job.model, model_options(job)));
        check(!g.transformer || g.transformer->linear_layers.empty(), "model",
              "llama.cpp's recurrent state for linear-attention layers (Qwen3-Next) is not modelled here; gpumem serving answers for this model with "
              "--engine vllm");
        check(!g.transformer || g.transformer->attention_chunk == 0, "model",
              "llama.cpp's KV cache for chunked local attention (Llama 4) is not modelled here; gpumem serving answers for this model with --engine vllm");
        m = take(llama_model_from_graph(g, quant, era.old_qkv_rule));
    }
    out.model_name = m.name;
    for (const auto& n : m.notes) out.assumptions.push_back(n);

    // The devices.
    const GpuSpec gpu = take(find_gpu(job.gpu));
    out.gpu = gpu.name;
    const Bytes capacity = job.gpu_memory.value_or(gpu.memory);
    Setting s;
    std::string split_mode = o.split_mode.value_or("layer");
    check(split_mode == "layer" || split_mode == "none", "split-mode",
          "llama.cpp -sm " + split_mode + " is not modelled (layer, none): row split shares each matrix's rows between GPUs");
    if (o.tensor_split && split_mode == "layer") {
        std::string v = *o.tensor_split;
        std::replace(v.begin(), v.end(), '/', ',');
        std::size_t p = 0;
        double total = 0;
        while (p <= v.size()) {
            const std::size_t q = std::min(v.find(',', p), v.size());
            const std::string part = v.substr(p, q - p);
            char* end = nullptr;
            const double x = std::strtod(part.c_str(), &end);
            check(!part.empty() && end && *end == '\0' && std::isfinite(x) && x >= 0, "tensor-split",
                  "-ts " + *o.tensor_split + ": give one non-negative share per GPU, e.g. 3,1");
            s.split.push_back(x);
            total += x;
            p = q + 1;
            check(s.split.size() <= 16, "tensor-split", "-ts: at most 16 GPUs");
        }
        check(total > 0, "tensor-split", "-ts " + *o.tensor_split + ": at least one share must be positive");
        for (double& x : s.split) x /= total;
    } else {
        s.split = {1.0};
    }
    const std::int64_t n = m.n_layer;
    s.ngl = o.n_gpu_layers.value_or(n + 1);
    check(s.ngl >= 0, "n-gpu-layers", "-ngl must be 0 or more (all: leave it out)");
    s.ngl = std::min(s.ngl, n + 1);
    s.mmap = !o.no_mmap;
    s.kv_offload = !o.no_kv_offload;
    s.swa_full = o.swa_full;
    s.type_k = &cache_type(o.cache_type_k, "cache-type-k");
    s.type_v = &cache_type(o.cache_type_v, "cache-type-v");
    // Flash attention: auto is on when the device of every layer supports the
    // FA op (llama-context.cpp@LC L429-466), as CUDA's and the CPU's do;
    // quantized V needs it (L2986-2988).
    const std::string fa = o.flash_attn.value_or(era.fa_auto ? "auto" : "off");
    check(fa == "on" || fa == "off" || fa == "auto", "flash-attn", "-fa takes on, off or auto (got " + fa + ")");
    s.fa = fa != "off";
    check(s.type_v->block == 1 || s.fa, "cache-type-v", "llama.cpp: V cache quantization requires flash attention (-fa on)");
    for (std::size_t l = 0; l < m.n_embd_k_gqa.size() && s.fa; ++l) {
        const std::int64_t hd = m.n_head > 0 ? m.n_embd / m.n_head : 0;
        check(hd <= 0 || (hd % s.type_k->block == 0 && hd % s.type_v->block == 0), "cache-type-k",
              "llama.cpp: with flash attention the cache type's block (" + std::to_string(s.type_k->block) + ") must divide the head size " + std::to_string(hd));
    }
    // Slots and cells (llama-context.cpp@LC L57, L161-196; tools/server/server.cpp L95-99).
    s.n_seq = o.max_num_seqs.value_or(era.server_np4_unified ? 4 : 1);
    check(s.n_seq >= 1 && s.n_seq <= 4096, "max-num-seqs", "-np must be between 1 and 4096");
    s.unified = o.kv_unified.value_or(!o.max_num_seqs && era.server_np4_unified) || !era.multi_stream;
    std::int64_t ctx = o.ctx_size.value_or(era.default_ctx);
    check(ctx >= 0, "ctx-size", "-c must be 0 (the training context) or a positive number of tokens");
    if (ctx == 0) ctx = m.n_ctx_train > 0 ? m.n_ctx_train : 4096;
    check(ctx <= (std::int64_t{1} << 26), "ctx-size", "-c " + std::to_string(ctx) + " is beyond any model's context (at most 2^26 tokens)");
    const std::int64_t pad = era.pad256 ? 256 : 0;
    const auto padded = [&](std::int64_t x) { return pad ? checked_round_up(x, pad) : checked_round_up(x, s.fa ? 256 : 32); };
    if (s.unified) {
        s.n_ctx = padded(ctx);
        s.n_ctx_seq = s.n_ctx;
    } else {
        s.n_ctx_seq = padded(std::max<std::int64_t>(1, ctx / s.n_seq));
        s.n_ctx = checked_mul(s.n_ctx_seq, s.n_seq);
    }
    s.n_batch = std::min(o.max_num_batched_tokens.value_or(2048), s.n_ctx);
    s.n_ubatch = std::min(o.ubatch_size.value_or(512), s.n_batch);
    check(s.n_batch >= 1 && s.n_ubatch >= 1, "ubatch-size", "-b and -ub must be positive");

    const Bytes context = job.cuda_context.value_or(gpu.cuda_context);
    const auto totals = [&](const Buffers& b) {
        std::vector<Bytes> t;
        for (const Device& d : b.gpu) t.push_back(d.model + d.kv + d.compute + (d.model > Bytes(0) || d.kv > Bytes(0) ? context : Bytes(0)));
        return t;
    };
    const auto all_fit = [&](const Buffers& b) {
        for (const Bytes t : totals(b))
            if (t > capacity) return false;
        return true;
    };
    const Buffers b = buffers(m, s, era);
    const std::vector<Bytes> tot = totals(b);
    std::vector<ServingPerGpu> ranks;
    std::size_t worst = 0;
    for (std::size_t d = 0; d < b.gpu.size(); ++d) {
        ServingPerGpu r;
        r.device = "CUDA" + std::to_string(d);
        r.weights = b.gpu[d].model;
        r.kv_cache = b.gpu[d].kv;
        r.activation_peak = b.gpu[d].compute;
        r.cuda_context = tot[d] > Bytes(0) ? context : Bytes(0);
        r.total_device = tot[d];
        r.capacity = capacity;
        r.fits = tot[d] <= capacity;
        if (tot[d] > tot[worst]) worst = d;
        ranks.push_back(r);
    }
    for (std::size_t d = 0; d < ranks.size(); ++d)
        if (!ranks[d].fits && out.error.empty()) {
            // What fails first, in load order: the model buffer, then the KV cache, then the compute buffer.
            const ServingPerGpu& r = ranks[d];
            const Bytes what = r.cuda_context + r.weights > capacity ? r.weights : r.cuda_context + r.weights + r.kv_cache > capacity ? r.kv_cache : r.activation_peak;
            out.error = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating " + mib(what) + " MiB on device " + std::to_string(d) +
                        ": cudaMalloc failed: out of memory";
        }
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    ServingHost h;
    h.model_mapped = b.host_mapped;
    h.model = b.host_model;
    h.kv_cache = b.host_kv;
    h.compute = b.host_compute;
    h.output = b.host_output;
    h.total = h.model_mapped + h.model + h.kv_cache + h.compute + h.output;
    out.host = h;

    LlamaCppDetail det;
    det.n_layer = n;
    det.n_gpu_layers = s.ngl;
    det.n_ctx = s.n_ctx;
    det.n_ctx_seq = s.n_ctx_seq;
    det.n_ubatch = s.n_ubatch;
    det.n_parallel = s.n_seq;
    det.kv_unified = s.unified;
    det.flash_attn = s.fa;
    det.mmap = s.mmap;
    det.type_k = s.type_k->name;
    det.type_v = s.type_v->name;
    det.file_type = m.file_type;
    det.tensor_types = tensor_type_counts(m);
    for (const LlamaTensor& t : m.tensors) {
        std::int64_t e = 1;
        for (const auto ne : t.ne) e = checked_mul(e, ne);
        det.params = checked_add(det.params, e);
    }
    // The most layers that fit with these settings, and the longest context
    // (in 256-token steps) with these layers.
    det.fit_gpu_layers = -1;
    for (std::int64_t k = n + 1; k >= 0; --k) {
        Setting t = s;
        t.ngl = k;
        if (all_fit(buffers(m, t, era))) {
            det.fit_gpu_layers = k;
            break;
        }
    }
    {
        std::int64_t lo = 0, hi = std::max<std::int64_t>(1, std::max(m.n_ctx_train, s.n_ctx) / 256);
        while (lo < hi) {
            const std::int64_t mid = (lo + hi + 1) / 2;
            Setting t = s;
            t.n_ctx_seq = mid * 256;
            t.n_ctx = s.unified ? t.n_ctx_seq : checked_mul(t.n_ctx_seq, s.n_seq);
            if (all_fit(buffers(m, t, era))) lo = mid;
            else hi = mid - 1;
        }
        det.fit_ctx_size = s.unified ? lo * 256 : lo * 256 * s.n_seq;
    }
    out.llamacpp = det;

    out.tp = 1;
    out.pp = 1;
    out.max_model_len = s.n_ctx_seq;
    out.max_num_seqs = s.n_seq;
    out.max_num_batched_tokens = s.n_batch;
    out.block_size = 1;
    out.kv_cache_tokens = s.n_ctx;
    out.fit_max_model_len = s.unified ? det.fit_ctx_size : det.fit_ctx_size / s.n_seq;
    out.kv_cache_blocks = s.n_ctx;
    out.max_concurrency = static_cast<double>(s.n_seq);
    engine_args::set_request_len(out, o, "a slot's context (-c / -np)", "llama-server stops such a request at the slot's end; raise -c or lower -np");
    out.concurrency_at_request_len =
        s.unified ? std::min<double>(static_cast<double>(s.n_seq), std::floor(static_cast<double>(s.n_ctx) / static_cast<double>(out.request_len)))
                  : static_cast<double>(s.n_seq);
    out.job = job;

    out.assumptions.push_back("llama.cpp " + era.name + ": model buffers = the offloaded tensors padded as ggml-cuda does (rows to 512, buffers to 128 B); KV = " +
                              std::to_string(s.n_ctx) + " cells x layers x (K + V rows)" +
                              (m.n_swa > 0 && !s.swa_full ? ", sliding-window layers (window " + std::to_string(m.n_swa) + ") fewer cells (llama-kv-cache-iswa.cpp)" : std::string()) +
                              "; docs/research/llamacpp.md");
    out.assumptions.push_back("-ngl " + std::to_string(s.ngl) + (o.n_gpu_layers ? "" : " (all layers; llama.cpp's --fit may choose fewer, or a shorter -c, when they do not fit)") +
                              ", -c " + std::to_string(s.n_ctx) + (o.ctx_size ? "" : era.default_ctx ? " (the CLI default)" : " (the model's training context)") +
                              ", -np " + std::to_string(s.n_seq) + (s.unified ? " (one unified KV stream)" : " (one stream per slot)") +
                              ", -b " + std::to_string(s.n_batch) + ", -ub " + std::to_string(s.n_ubatch) + ", flash attention " + (s.fa ? "on" : "off") +
                              (fa == "auto" ? " (auto: on where the backend has the kernel)" : ""));
    out.assumptions.push_back("compute buffers (estimates, fitted to public logs): flash attention off: the f32 attention scores of -ub x context; "
                              "on: the logits and the stream (2026 builds: the FFN working set), plus a copy of the largest CPU weight under partial offload");
    out.assumptions.push_back("CUDA context " + mib(context) + " MiB per GPU: gpumem's catalog value for a PyTorch process (llama.cpp's is smaller; "
                              "not measured), override with --cuda-context");
    if (s.split.size() > 1) out.assumptions.push_back("layers split across " + std::to_string(s.split.size()) + " GPUs by -ts (llama-model.cpp@a95a11e5b834 L3014-3057)");
    return out;
}

}  // namespace gpumem
