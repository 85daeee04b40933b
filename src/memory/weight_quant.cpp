// Quantized weights on the GPU (gpumem/memory/weight_quant.hpp). Formulas:
// docs/research/quant.md sections 3-10 (vLLM main 31a719bc).
#include "gpumem/memory/weight_quant.hpp"

#include <algorithm>
#include <charconv>
#include <memory>
#include <regex>

namespace gpumem {

namespace {

// PyTorch's caching allocator rounds every tensor to 512 bytes.
std::int64_t r512(std::int64_t b) { return std::max<std::int64_t>(512, checked_round_up(b, 512)); }
std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// An ignore entry: a module path, for one layer or all ("model.layers.3.mlp",
// "model.layers.*.self_attn", "lm_head", "re:.*mlp.gate$").
struct Ignore {
    std::int64_t layer = -1;  // -1: every layer (or outside the layers)
    std::string module;
    bool regex = false;
    std::shared_ptr<const std::regex> re;  // "re:" entries, compiled once; null: unreadable, excludes nothing
};

// A "re:" pattern from a config, compiled once. The pattern is untrusted: it
// is capped in length and nesting (the regex compiler recurses per group),
// and matched with libstdc++'s polynomial (breadth-first) executor, so that
// "(.|.)*x" cannot backtrack exponentially. A pattern it cannot read (or a
// back-reference, which needs backtracking) excludes nothing, as before.
std::shared_ptr<const std::regex> compile_ignore(const std::string& pattern) {
    constexpr std::size_t kMaxPattern = 1024;
    constexpr int kMaxGroups = 32;
    if (pattern.size() > kMaxPattern) return nullptr;
    int depth = 0;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] == '\\') ++i;
        else if (pattern[i] == '(' && ++depth > kMaxGroups) return nullptr;
        else if (pattern[i] == ')' && depth > 0) --depth;
    }
    try {
#ifdef __GLIBCXX__
        return std::make_shared<const std::regex>(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
#else
        return std::make_shared<const std::regex>(pattern, std::regex::ECMAScript);
#endif
    } catch (const std::regex_error&) {
        return nullptr;
    }
}

Ignore parse_ignore(const std::string& e) {
    Ignore ig;
    if (e.rfind("re:", 0) == 0) {
        ig.regex = true;
        ig.module = e.substr(3);
        ig.re = compile_ignore(ig.module);
        return ig;
    }
    std::string m = e;
    for (const char* pre : {"model.language_model.", "language_model.model.", "model."})
        if (m.rfind(pre, 0) == 0) m = m.substr(std::string(pre).size());
    if (m.rfind("layers.", 0) == 0) {
        const std::size_t dot = m.find('.', 7);
        const std::string idx = m.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
        std::int64_t n = 0;
        if (const auto [end, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), n);
            !idx.empty() && ec == std::errc() && end == idx.data() + idx.size() && n >= 0)
            ig.layer = n;
        m = dot == std::string::npos ? "" : m.substr(dot + 1);
    }
    ig.module = m;
    return ig;
}

bool ignored(const std::vector<Ignore>& igs, std::int64_t layer, const std::string& module) {
    for (const Ignore& ig : igs) {
        if (ig.regex) {
            if (!ig.re) continue;  // a pattern std::regex cannot read excludes nothing
            try {
                const std::string full = (layer >= 0 ? "model.layers." + std::to_string(layer) + "." : std::string()) + module;
                if (std::regex_search(full, *ig.re)) return true;
            } catch (const std::regex_error&) {
                // error_complexity / error_stack while matching: excludes nothing
            }
            continue;
        }
        if (ig.layer >= 0 && ig.layer != layer) continue;
        if (ig.module.empty() && ig.layer >= 0) return true;  // a whole layer
        if (module == ig.module || module.rfind(ig.module + ".", 0) == 0 ||
            (module.size() > ig.module.size() && module.compare(module.size() - ig.module.size() - 1, std::string::npos, "." + ig.module) == 0))
            return true;
    }
    return false;
}

std::string module_of(const Param& p) {
    const std::string& n = p.name;
    return n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 ? n.substr(0, n.size() - 7) : n;
}

}  // namespace

std::int64_t quantized_linear_bytes(const WeightQuant& q, std::int64_t K, std::int64_t N, std::int64_t dt, const GpuSpec& gpu) {
    const std::int64_t cc = gpu.compute_capability;
    const std::int64_t NK = checked_mul(N, K);
    const std::string& s = q.scheme;
    if (s == "fp8-tensor" || s == "fp8-channel" || s == "fp8-block") {
        if (cc > 0 && cc < 89) {  // Marlin weight-only FP8: scales in the model dtype, per channel or per 128-row block
            const std::int64_t scales = s == "fp8-block" ? dt * N * cdiv(K, std::max<std::int64_t>(1, q.block_k)) : dt * N;
            return r512(NK) + r512(scales) + 512;
        }
        if (s == "fp8-tensor") return r512(NK) + 512;
        if (s == "fp8-channel") return r512(NK) + r512(4 * N);
        if (cc >= 100) return r512(NK) + r512(4 * N * cdiv(K, 512));  // DeepGEMM's packed E8M0 scales on Blackwell
        return r512(NK) + r512(4 * cdiv(N, q.block_n) * cdiv(K, q.block_k));
    }
    if (s == "int8-channel") return r512(NK) + r512(4 * N);
    if (s == "int8-tensor") return r512(NK) + 512;
    if (s == "int8-bnb") return r512(NK) + r512(4 * N);
    if (s == "nf4") return r512(NK / 2) + r512(NK / 64) + 2048;  // double-quantized absmax and quant-state tensors
    if (s == "nvfp4") {
        if (cc >= 100)  // CUTLASS: weight to 32-multiples, swizzled block scales to [128k, 4k]
            return r512(checked_round_up(N, 32) * checked_round_up(K, 32) / 2) + r512(checked_round_up(N, 128) * checked_round_up(cdiv(K, 16), 4)) + 4 * 512;
        return r512(NK / 2) + r512(NK / 16) + 4 * 512 + 512;  // Marlin
    }
    if (s == "mxfp4") {
        // Expert weights of 4 bits with an E8M0 scale per 32; Hopper's Triton
        // layout pads the contraction dimension to 256 (fused_moe/oracle/mxfp4.py
        // L376-L400; docs/research/quant.md section 7).
        const std::int64_t Kp = cc == 90 ? checked_round_up(K, 256) : K, Np = N;  // other GPUs: padded by the caller, which knows the hidden size
        return r512(checked_mul(Np, Kp) / 2) + r512(checked_mul(Np, Kp) / 32);
    }
    if (s == "wna16") {
        const std::int64_t packed = NK * q.bits / 8;
        const std::int64_t groups = q.group_size > 0 ? cdiv(K, q.group_size) : 1;
        const std::int64_t scales = dt * N * groups;
        const std::int64_t zeros = N * groups * q.bits / 8;  // int32-packed zero points
        if (cc == 90 && q.method == "awq") return r512(packed) + r512(scales) + r512(dt * N * groups);  // Machete: zeros in the model dtype
        if (cc == 90 && q.method != "awq") return r512(packed) + r512(scales) + r512(zeros) + r512(4 * K);  // Machete keeps qzeros and g_idx
        std::int64_t b = r512(packed) + r512(scales) + 512;  // Marlin, with its per-layer workspace
        if (q.method == "awq" || q.zero_point) b += r512(zeros);
        if (q.act_order) b += 2 * r512(4 * K);
        return b;
    }
    return dt * NK;
}

WeightQuant online_fp8() {
    WeightQuant w;
    w.method = "fp8";
    w.scheme = "fp8-tensor";
    w.bits = 8;
    return w;
}

std::vector<Bytes> quantized_weight_delta(const ModelGraph& g, const WeightQuant& q, std::int64_t tp, const std::vector<std::int64_t>& stage_layers,
                                          std::int64_t dt, const GpuSpec& gpu) {
    std::vector<Ignore> igs;
    for (const auto& e : q.ignore) igs.push_back(parse_ignore(e));
    const auto delta_of = [&](const Param& p, std::int64_t layer, bool head) -> std::int64_t {
        // Triton's MXFP4 MoE keeps the experts' biases in fp32 (mxfp4.py L723-L725).
        if (q.scheme == "mxfp4" && p.count > 1 && p.shape.size() == 1 && gpu.compute_capability >= 90) return checked_mul(p.numel(), 4 - dt);
        if (!p.linear_weight || p.shape.size() != 2 || p.component == Component::Router) return 0;
        if (p.output_head && !q.lm_head) return 0;
        if (q.scheme == "mxfp4" && p.count <= 1) return 0;  // MXFP4 quantizes the experts only
        const std::string m = head && p.output_head ? std::string("lm_head") : module_of(p);
        if (ignored(igs, layer, m)) return 0;
        std::int64_t N = p.shape[0], K = p.shape[1];
        if (q.scheme == "mxfp4" && g.transformer && p.count > 1) {
            // Per rank: tensor parallelism splits the expert width I. Marlin /
            // TRT-LLM / FlashInfer pad the hidden dimension to 256 and the
            // width to 128 (gpt-oss-20b: 2880 -> 3072 and 2944, as its log
            // prints); Hopper's Triton layout pads the contraction only (below).
            const std::int64_t width = g.transformer->intermediate, Irank = (width + tp - 1) / tp;
            const bool gate_up = N == 2 * width;  // [2I, H]; the down projection is [H, I]
            const bool pad_all = gpu.compute_capability < 90 || gpu.compute_capability >= 100;
            const std::int64_t H = pad_all ? checked_round_up(g.transformer->hidden, 256) : g.transformer->hidden;
            const std::int64_t I = pad_all ? checked_round_up(Irank, 128) : Irank;
            N = gate_up ? 2 * I : H;
            K = gate_up ? H : I;
            const std::int64_t rank = checked_mul(quantized_linear_bytes(q, K, N, dt, gpu), p.count);
            return checked_mul(rank, tp) - checked_mul(dt, p.numel());
        }
        const std::int64_t quant = checked_mul(quantized_linear_bytes(q, K, N, dt, gpu), std::max<std::int64_t>(1, p.count));
        return quant - checked_mul(checked_mul(dt, p.numel() / std::max<std::int64_t>(1, p.count)), std::max<std::int64_t>(1, p.count));
    };
    std::vector<Bytes> out(stage_layers.size(), Bytes(0));
    std::vector<std::int64_t> stage_of_layer;
    for (std::size_t s = 0; s < stage_layers.size(); ++s)
        for (std::int64_t i = 0; i < stage_layers[s]; ++i) stage_of_layer.push_back(static_cast<std::int64_t>(s));
    std::int64_t layer = 0;
    for (const Block& b : g.blocks) {
        if (b.checkpointable) {
            for (std::int64_t r = 0; r < b.repeat; ++r, ++layer) {
                std::int64_t d = 0;
                for (const Param& p : b.params) d += delta_of(p, layer, false);
                const std::size_t s = layer < static_cast<std::int64_t>(stage_of_layer.size()) ? static_cast<std::size_t>(stage_of_layer[static_cast<std::size_t>(layer)]) : out.size() - 1;
                out[s] = Bytes(out[s].count() + d / std::max<std::int64_t>(1, tp));
            }
        } else {
            std::int64_t d = 0;
            for (const Param& p : b.params) d += delta_of(p, -1, layer > 0);
            const std::size_t s = layer == 0 ? 0 : out.size() - 1;
            out[s] = Bytes(out[s].count() + d / std::max<std::int64_t>(1, tp));
        }
    }
    return out;
}

std::string describe_weight_quant(const WeightQuant& q, const GpuSpec& gpu) {
    const std::int64_t cc = gpu.compute_capability;
    std::string k;
    const bool fp8 = q.scheme.rfind("fp8", 0) == 0;
    if (fp8 && cc > 0 && cc < 89) k = "Marlin weight-only FP8 (no FP8 on this GPU)";
    else if (q.scheme == "fp8-block" && cc >= 100) k = "DeepGEMM's E8M0 block scales";
    else if (q.scheme == "wna16") k = cc == 90 ? "Machete (Hopper)" : "Marlin";
    else if (q.scheme == "nvfp4") k = cc >= 100 ? "CUTLASS (padded, swizzled scales)" : "Marlin (no native FP4)";
    else k = "the engine's default kernel";
    std::string s = "weights quantized: " + q.method + " " + q.scheme;
    if (q.scheme == "wna16") s += " " + std::to_string(q.bits) + "-bit, group " + (q.group_size > 0 ? std::to_string(q.group_size) : std::string("per channel"));
    if (q.scheme == "fp8-block") s += " " + std::to_string(q.block_n) + "x" + std::to_string(q.block_k);
    s += ", laid out for " + k + " (vLLM's quantization methods, docs/research/quant.md); embeddings, norms, routers" +
         std::string(q.lm_head ? "" : " and the output head") + " stay in the model dtype" + (q.ignore.empty() ? "" : ", as do the " + std::to_string(q.ignore.size()) + " modules the config excludes");
    return s;
}

}  // namespace gpumem
