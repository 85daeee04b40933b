// Eager graph -> the graph fused kernels execute (gpumem/model/rewrite.hpp).
// Each pass matches the op sequences the builders emit (model/builder.cpp,
// model/transformer_builder.cpp) by their names and kinds.
#include "gpumem/model/rewrite.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace gpumem {

namespace {


// How many ops read each tensor.
std::vector<int> readers(const Block& b) {
    std::vector<int> n(b.tensors.size(), 0);
    for (const auto& op : b.ops)
        for (auto t : op.inputs) ++n[static_cast<std::size_t>(t)];
    if (b.output >= 0) ++n[static_cast<std::size_t>(b.output)];
    return n;
}

// Ops [i, j] -> one op (inputs: what the region reads from outside it).
void collapse(Block& b, std::size_t i, std::size_t j, Op merged) {
    for (std::size_t k = i; k <= j; ++k) {
        const Op& o = b.ops[k];
        for (auto p : o.params)
            if (std::find(merged.params.begin(), merged.params.end(), p) == merged.params.end()) merged.params.push_back(p);
        merged.flops.c0 += o.flops.c0;
        merged.flops.c1 += o.flops.c1;
        merged.flops.c2 += o.flops.c2;
    }
    b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(i), b.ops.begin() + static_cast<std::ptrdiff_t>(j) + 1);
    b.ops.insert(b.ops.begin() + static_cast<std::ptrdiff_t>(i), std::move(merged));
}

// The last op index >= i whose name is `prefix` or starts with `prefix.`.
std::size_t region_end(const Block& b, std::size_t i, const std::string& prefix) {
    std::size_t j = i;
    while (j + 1 < b.ops.size() && (b.ops[j + 1].name == prefix || b.ops[j + 1].name.starts_with(prefix + "."))) ++j;
    return j;
}

// HF RMSNorm: Cast `N.float`, `N.pow_mean_rsqrt`, `N.normalize`, the weight
// multiply `N` (RMSNorm) and its casts -> one kernel saving x and rstd
// (Liger LigerRMSNormFunction saves X and RSTD; TE rmsnorm saves the input
// and rsigma).
void fuse_norms(Block& b) {
    for (std::size_t i = 0; i + 1 < b.ops.size(); ++i) {
        const Op& o = b.ops[i];
        if (o.kind != OpKind::Cast || !o.name.ends_with(".float")) continue;
        const std::string prefix = o.name.substr(0, o.name.size() - 6);
        if (b.ops[i + 1].name != prefix + ".pow_mean_rsqrt" || b.ops[i + 1].outputs.empty()) continue;
        const std::size_t j = region_end(b, i, prefix);
        bool has_norm = false;
        for (std::size_t k = i; k <= j; ++k) has_norm = has_norm || b.ops[k].kind == OpKind::RMSNorm;
        if (!has_norm || b.ops[j].outputs.empty()) continue;
        const TensorId x = o.inputs.front();
        const TensorId rs = b.ops[i + 1].outputs.front();
        const TensorId out = b.ops[j].outputs.front();
        auto& ot = b.tensors[static_cast<std::size_t>(out)];
        ot.alias_of = -1;
        ot.role = b.tensors[static_cast<std::size_t>(x)].role;
        Op m;
        m.kind = OpKind::RMSNorm;
        m.name = prefix;
        m.inputs = {x};
        m.outputs = {out, rs};
        m.saved = {{x, false, false}, {rs, false, false}};
        collapse(b, i, j, std::move(m));
    }
}

// act(gate) * up -> one kernel saving gate and up (Liger LigerSiLUMulFunction
// saves a and b; Megatron bias_swiglu saves its input).
void fuse_glu(Block& b) {
    const auto n = readers(b);
    for (std::size_t i = 0; i + 1 < b.ops.size(); ++i) {
        const Op& a = b.ops[i];
        if (a.kind != OpKind::Activation || a.inputs.size() != 1 || a.outputs.size() != 1) continue;
        const TensorId act = a.outputs.front();
        if (n[static_cast<std::size_t>(act)] != 1) continue;
        // The multiply reading it, next op or the one after the up projection.
        std::size_t k = i + 1;
        while (k < b.ops.size() && k <= i + 2 &&
               !(b.ops[k].kind == OpKind::Mul && std::find(b.ops[k].inputs.begin(), b.ops[k].inputs.end(), act) != b.ops[k].inputs.end()))
            ++k;
        if (k >= b.ops.size() || k > i + 2) continue;
        Op& mul = b.ops[k];
        const TensorId gate = a.inputs.front();
        const TensorId up = mul.inputs[0] == act ? mul.inputs[1] : mul.inputs[0];
        mul.inputs = {gate, up};
        mul.saved = {{gate, false, false}, {up, false, false}};
        mul.flops.c1 += a.flops.c1;
        b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(i));
        --i;
    }
}

// HF's NewGELUActivation (`N.half_x`, `N.tanh`, `N.one_plus`, `N`: four
// saved tensors) -> one tanh-GELU kernel saving its input
// (F.gelu(approximate="tanh"), as LitGPT's GptNeoxMLP and Inductor run it).
void fuse_gelu(Block& b) {
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
        const std::string& nm = b.ops[i].name;
        if (!nm.ends_with(".half_x") || b.ops[i].inputs.size() != 1) continue;
        const std::string prefix = nm.substr(0, nm.size() - 7);
        const std::size_t j = region_end(b, i, prefix);
        if (j == i || b.ops[j].kind != OpKind::Activation || b.ops[j].name != prefix || b.ops[j].outputs.empty()) continue;
        Op m;
        m.kind = OpKind::Activation;
        m.name = prefix;
        m.inputs = {b.ops[i].inputs.front()};
        m.outputs = {b.ops[j].outputs.front()};
        m.saved = {{m.inputs.front(), false, false}};
        collapse(b, i, j, std::move(m));
    }
}

// Rotary embedding ops `N.*` of a `*.rotary_q` / `*.rotary_k` site -> one kernel.
void fuse_rope(Block& b) {
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
        const std::string& nm = b.ops[i].name;
        const auto pos = nm.find(".rotary_");
        if (pos == std::string::npos) continue;
        const auto dot = nm.find('.', pos + 8);
        if (dot == std::string::npos) continue;
        const std::string prefix = nm.substr(0, dot);
        const std::size_t j = region_end(b, i, prefix);
        if (j == i || b.ops[j].outputs.empty()) continue;
        Op m;
        m.kind = OpKind::Elementwise;
        m.name = prefix;
        m.inputs = {b.ops[i].inputs.front()};
        m.outputs = {b.ops[j].outputs.front()};
        b.tensors[static_cast<std::size_t>(m.outputs.front())].alias_of = -1;
        collapse(b, i, j, std::move(m));
    }
}

// `*.transpose_contiguous` copies of an attention output -> views.
void attention_views(Block& b) {
    for (auto& op : b.ops) {
        if (!op.name.ends_with(".transpose_contiguous") || op.inputs.size() != 1 || op.outputs.size() != 1) continue;
        op.kind = OpKind::View;
        auto& t = b.tensors[static_cast<std::size_t>(op.outputs.front())];
        t.alias_of = op.inputs.front();
        t.role = b.tensors[static_cast<std::size_t>(op.inputs.front())].role;
    }
}

// The loss over the output head: `loss.logits_float` (Cast, optional),
// `loss.log_softmax` (Softmax saving its output), `loss` (Loss).
void rewrite_loss(Block& b, const GraphRewrite& rw) {
    std::size_t ls = b.ops.size(), lo = b.ops.size();
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
        if (b.ops[i].kind == OpKind::Softmax && b.ops[i].name.ends_with(".log_softmax")) ls = i;
        if (b.ops[i].kind == OpKind::Loss) lo = i;
    }
    if (ls == b.ops.size() || lo == b.ops.size() || lo < ls) return;
    std::size_t cast = b.ops.size();
    if (ls > 0 && b.ops[ls - 1].kind == OpKind::Cast && b.ops[ls - 1].name.ends_with(".logits_float")) cast = ls - 1;
    const TensorId logp = b.ops[ls].outputs.front();
    const TensorId logits = cast < b.ops.size() ? b.ops[cast].inputs.front() : b.ops[ls].inputs.front();
    Op& loss = b.ops[lo];
    const Extent le = b.tensors[static_cast<std::size_t>(logits)].extent;

    switch (rw.loss) {
        case LossKernel::Full:
            if (!rw.loss_upcast && cast < b.ops.size()) {
                // log_softmax reads the logits as they are (fp32 under autocast).
                b.ops[ls].inputs = {logits};
                b.tensors[static_cast<std::size_t>(logp)].role = ActRole::Upcast;
                b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(cast));
            }
            return;
        case LossKernel::Chunked: {
            // Each chunk is upcast, log_softmax'd (its output saved) and the
            // upcast copy freed: one chunk's fp32 copy in flight.
            const std::int64_t k = std::max<std::int64_t>(1, rw.loss_chunks);
            loss.chunks = k;
            if (rw.loss_chunked_head) {
                // The output projection runs per chunk inside the loss: one chunk
                // of 16-bit logits at a time.
                auto& t = b.tensors[static_cast<std::size_t>(logits)];
                t.extent = {(le.c0 + k - 1) / k, (le.c1 + k - 1) / k, (le.c2 + k - 1) / k};
            }
            if (rw.loss_upcast && cast < b.ops.size()) {
                // (still an alias of the logits: `.float()` of fp32 logits is the
                // same tensor, no copy)
                const TensorId lf = b.ops[cast].outputs.front();
                auto& t = b.tensors[static_cast<std::size_t>(lf)];
                t.extent = {(le.c0 + k - 1) / k, (le.c1 + k - 1) / k, (le.c2 + k - 1) / k};
                b.ops[cast].kind = OpKind::Elementwise;
            } else if (!rw.loss_upcast) {
                b.tensors[static_cast<std::size_t>(logp)].role = ActRole::Upcast;
                if (cast < b.ops.size()) {
                    b.ops[ls].inputs = {logits};
                    b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(cast));
                }
            }
            return;
        }
        case LossKernel::Fused: {
            if (rw.loss_upcast && cast < b.ops.size()) {
                // Megatron's vocab-parallel cross-entropy: an fp32 copy of the
                // logits turned into the softmax in place and saved.
                const TensorId lf = b.ops[cast].outputs.front();
                loss.inputs[0] = lf;
                loss.saved.push_back({lf, false, false});
                b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(ls));
                return;
            }
            // One kernel: saves the logits and an fp32 logsumexp per row; the
            // backward writes the gradient into the logits' storage.
            if (rw.loss_per_chunk) loss.chunks = std::max<std::int64_t>(1, rw.loss_chunks);
            const TensorId lse = static_cast<TensorId>(b.tensors.size());
            b.tensors.push_back(TensorInfo{"loss.logsumexp", {le.c0 ? 1 : 0, le.c1 ? 1 : 0, 0}, ActRole::Float32, -1, {}});
            loss.inputs[0] = logits;
            loss.outputs.push_back(lse);
            loss.saved.push_back({logits, false, false});
            loss.saved.push_back({lse, false, false});
            const std::size_t first = cast < b.ops.size() ? cast : ls;
            b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(first), b.ops.begin() + static_cast<std::ptrdiff_t>(ls) + 1);
            return;
        }
        case LossKernel::FusedLinear: {
            // The output projection runs chunk by chunk inside the loss: about
            // hidden/vocab of the rows at a time in fp32 (Liger's chunk size
            // next_power_of_2(ceil(BT / ceil(V / H)))), i.e. ~BT x H fp32; the
            // input gradient [BT, H] is computed in forward and saved.
            std::size_t head = b.ops.size();
            for (std::size_t i = 0; i < ls; ++i)
                if (is_output_head(b.ops[i])) head = i;
            if (head == b.ops.size()) return;
            Op& lm = b.ops[head];
            const TensorId x = lm.inputs.front();
            const Extent xe = b.tensors[static_cast<std::size_t>(x)].extent;
            auto& chunk = b.tensors[static_cast<std::size_t>(lm.outputs.front())];
            chunk.extent = xe;
            chunk.role = ActRole::Float32;
            chunk.alias_of = -1;
            lm.saved.clear();
            const TensorId gin = static_cast<TensorId>(b.tensors.size());
            b.tensors.push_back(TensorInfo{"loss.grad_input", xe, b.tensors[static_cast<std::size_t>(x)].role, -1, {}});
            loss.inputs[0] = lm.outputs.front();
            loss.outputs.push_back(gin);
            loss.saved.push_back({gin, false, false});
            // Soft-capping and casts between the head and the loss run inside the kernel.
            b.ops.erase(b.ops.begin() + static_cast<std::ptrdiff_t>(head) + 1, b.ops.begin() + static_cast<std::ptrdiff_t>(ls) + 1);
            return;
        }
    }
}

// A quantized copy of `e` elements in 1-byte units: num/den bytes per element
// plus a 1-byte block scale per `block` elements (model/rewrite.hpp).
Extent quantized_extent(const Extent& e, const GraphRewrite& rw) {
    const auto q = [&](std::int64_t c) {
        if (c == 0) return std::int64_t{0};
        std::int64_t n = (c * rw.fp8_num + rw.fp8_den - 1) / rw.fp8_den;
        if (rw.fp8_scale_block > 0) n += (c + rw.fp8_scale_block - 1) / rw.fp8_scale_block;
        return n;
    };
    return {q(e.c0), q(e.c1), q(e.c2)};
}

// Transformer Engine linears save the column-wise quantized copy of their
// input for the weight gradient (TransformerEngine module/linear.py
// @d0067d0da6cb L600-621), not the 16-bit input. The output layer and routers
// are not TE modules (Megatron's output layer and TopKRouter run in torch).
void fp8_inputs(Block& b, const GraphRewrite& rw) {
    const bool fp4 = rw.fp8_den > 1;
    // An attention site's output, directly or through views.
    const auto attention_output = [&](TensorId t) {
        for (const AttentionSite& s : b.attention)
            for (TensorId x = t; x >= 0; x = b.tensors[static_cast<std::size_t>(x)].alias_of)
                if (x == s.out) return true;
        return false;
    };
    std::vector<std::pair<TensorId, TensorId>> copies;  // input -> its quantized copy (shared inputs)
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
        Op& op = b.ops[i];
        if (op.kind != OpKind::Linear || is_output_head(op) || op.inputs.empty()) continue;
        if (!op.params.empty() && b.params[static_cast<std::size_t>(op.params.front())].component == Component::Router) continue;
        const TensorId x = op.inputs.front();
        // Megatron: the output projection saves the attention output itself
        // (transformer/attention.py@d98e8a64ddf3 L428-444).
        if (rw.fp8_attention_out_original && attention_output(x)) continue;
        std::vector<SavedRef> saved;
        bool any = false;
        for (const auto& s : op.saved) {
            if (s.tensor == x && s.only_for_param_grad) {
                any = true;
                continue;
            }
            saved.push_back(s);
        }
        if (!any) continue;
        TensorId x8 = -1;
        if (rw.fp8_share_inputs)
            for (const auto& [in, q] : copies)
                if (in == x) x8 = q;
        const bool fresh = x8 < 0;
        if (fresh) {
            x8 = static_cast<TensorId>(b.tensors.size());
            b.tensors.push_back(TensorInfo{op.name + (fp4 ? ".input_fp4" : ".input_fp8"), quantized_extent(b.tensors[static_cast<std::size_t>(x)].extent, rw),
                                           ActRole::Float8, -1, {}, b.tensors[static_cast<std::size_t>(x)].axis});
            copies.emplace_back(x, x8);
        }
        saved.push_back({x8, false, true});
        op.saved = std::move(saved);
        op.inputs.push_back(x8);
        if (!fresh) continue;
        Op q;
        q.kind = OpKind::Elementwise;
        q.name = op.name + (fp4 ? ".quantize_fp4" : ".quantize_fp8");
        q.inputs = {x};
        q.outputs = {x8};
        b.ops.insert(b.ops.begin() + static_cast<std::ptrdiff_t>(i), std::move(q));
        ++i;
    }
}

}  // namespace

LossChunkGrads loss_chunk_grads(const Block& b, std::size_t head, std::size_t loss) {
    LossChunkGrads r;
    if (head >= b.ops.size() || b.ops[head].outputs.empty()) return r;
    r.logits = b.ops[head].outputs.front();
    for (std::size_t i = head + 1; i <= loss && i < b.ops.size(); ++i) {
        const Op& op = b.ops[i];
        if (op.outputs.empty()) continue;
        if (op.kind == OpKind::Softmax && op.name.ends_with(".log_softmax")) r.logp = op.outputs.front();
        if (op.name.ends_with(".logits_float") && b.tensors[static_cast<std::size_t>(op.outputs.front())].alias_of < 0) r.cast = op.outputs.front();
    }
    return r;
}

ModelGraph rewrite_graph(const ModelGraph& g, const GraphRewrite& rw) {
    ModelGraph out = g;
    if (!rw.any() || g.params_only > 0) return out;
    for (auto& b : out.blocks) {
        if (rw.fused_norm) fuse_norms(b);
        if (rw.fused_glu) fuse_glu(b);
        if (rw.fused_gelu) fuse_gelu(b);
        if (rw.fused_rope) fuse_rope(b);
        if (rw.attention_out_view) attention_views(b);
        if (rw.fp8_linear_inputs) fp8_inputs(b, rw);
        rewrite_loss(b, rw);
    }
    return out;
}

bool has_tied_output_head(const ModelGraph& g) {
    for (const Block& b : g.blocks)
        for (const Op& op : b.ops)
            if (op.kind == OpKind::Linear && is_output_head(op) && op.params.empty() && op.in_features > 0) return true;
    return false;
}

ModelGraph untie_output_head(const ModelGraph& g) {
    ModelGraph out = g;
    for (Block& b : out.blocks)
        for (Op& op : b.ops) {
            if (op.kind != OpKind::Linear || !is_output_head(op) || !op.params.empty() || op.in_features <= 0) continue;
            Param p;
            p.name = op.name + ".weight";
            p.shape = {op.out_features, op.in_features};
            p.component = Component::Head;
            p.linear_weight = true;
            p.output_head = true;
            const auto dot = op.name.rfind('.');
            p.module = dot == std::string::npos ? op.name : op.name.substr(dot + 1);
            b.params.push_back(std::move(p));
            op.params.push_back(static_cast<std::int32_t>(b.params.size() - 1));
        }
    out.notes.push_back("output layer untied: its own [vocab, hidden] weight besides the embedding");
    return out;
}

}  // namespace gpumem
