#include "gpumem/model/builder.hpp"

#include <cassert>
#include <stdexcept>

namespace gpumem {

Extent extent_div(Extent e, std::int64_t k) {
    if (k <= 0 || e.c0 % k != 0 || e.c1 % k != 0 || e.c2 % k != 0)
        throw std::logic_error("extent_div: extent is not divisible by " + std::to_string(k));
    return {e.c0 / k, e.c1 / k, e.c2 / k};
}

Extent extent_mul(Extent e, std::int64_t k) {
    return {checked_mul(e.c0, k), checked_mul(e.c1, k), checked_mul(e.c2, k)};
}

namespace {
std::string leaf_module(const std::string& name) {
    const auto pos = name.rfind('.');
    return pos == std::string::npos ? name : name.substr(pos + 1);
}
}  // namespace

BlockBuilder::BlockBuilder(std::string name, std::int64_t repeat, DType param_dtype) : param_dtype_(param_dtype) {
    block_.name = std::move(name);
    block_.repeat = repeat;
}

TensorId BlockBuilder::tensor(const std::string& name, Extent e, ActRole role, TensorId alias_of) {
    block_.tensors.push_back(TensorInfo{name, e, role, alias_of, {}});
    return static_cast<TensorId>(block_.tensors.size() - 1);
}

TensorId BlockBuilder::input(const std::string& name, Extent e, ActRole role) {
    if (!block_.tensors.empty()) throw std::logic_error("BlockBuilder::input must be the first tensor");
    return tensor(name, e, role);
}

TensorId BlockBuilder::data(const std::string& name, Extent e, ActRole role) {
    if (block_.tensors.empty()) tensor("(no input)", {}, ActRole::Stream);
    const TensorId t = tensor(name, e, role);
    op(OpKind::Input, name, {}, {t});
    return t;
}

std::int32_t BlockBuilder::param(const std::string& name, std::vector<std::int64_t> shape, Component c,
                                 const std::string& module, bool linear_weight, std::int64_t count) {
    Param p;
    p.name = name;
    p.shape = std::move(shape);
    p.count = count;
    p.dtype = param_dtype_;
    p.component = c;
    p.linear_weight = linear_weight;
    p.module = module.empty() ? leaf_module(name.substr(0, name.rfind('.'))) : module;
    block_.params.push_back(std::move(p));
    return static_cast<std::int32_t>(block_.params.size() - 1);
}

std::int32_t BlockBuilder::param_of_last_op(const std::string& name, std::vector<std::int64_t> shape, Component c, const std::string& module) {
    assert(!block_.ops.empty());
    const std::int32_t pi = param(name, std::move(shape), c, module);
    block_.ops.back().params.push_back(pi);
    return pi;
}

Op& BlockBuilder::op(OpKind kind, const std::string& name, std::vector<TensorId> in, std::vector<TensorId> out,
                     std::vector<SavedRef> saved) {
    Op o;
    o.kind = kind;
    o.name = name;
    o.inputs = std::move(in);
    o.outputs = std::move(out);
    o.saved = std::move(saved);
    block_.ops.push_back(std::move(o));
    return block_.ops.back();
}

TensorId BlockBuilder::embedding(TensorId ids, std::int64_t vocab, std::int64_t dim, const std::string& name,
                                 Component c, bool add_param, bool vocab_parallel) {
    const TensorId out = tensor(name, extent_mul(info(ids).extent, dim), ActRole::Stream);
    Op& o = op(OpKind::Embedding, name, {ids}, {out}, {{ids, false}});
    if (add_param) {
        const std::int32_t pi = param(name + ".weight", {vocab, dim}, c);
        block_.params[static_cast<std::size_t>(pi)].tp_replicated = !vocab_parallel;
        o.params.push_back(pi);
    }
    return out;
}

TensorId BlockBuilder::linear(TensorId x, std::int64_t in, std::int64_t out_f, bool bias, const std::string& name,
                              Component c, bool add_param) {
    const Extent rows = extent_div(info(x).extent, in);
    const TensorId out = tensor(name, extent_mul(rows, out_f), ActRole::Lowered);
    // mm on x.view(-1, in): the view shares x's storage, so the saved input is x.
    Op& o = op(OpKind::Linear, name, {x}, {out}, {{x, true, true}});
    o.in_features = in;
    o.out_features = out_f;
    o.flops = extent_mul(rows, checked_mul(2, checked_mul(in, out_f)));
    if (add_param) {
        o.params.push_back(param(name + ".weight", {out_f, in}, c, leaf_module(name), true));
        if (bias) o.params.push_back(param(name + ".bias", {out_f}, c, leaf_module(name)));
    }
    return out;
}

TensorId BlockBuilder::matmul(TensorId a, TensorId b, Extent out_e, std::int64_t flops_per_out,
                              const std::string& name, bool save_a, bool save_b, std::uint8_t flags) {
    const TensorId out = tensor(name, out_e, ActRole::Lowered);
    std::vector<SavedRef> saved;
    if (save_a) saved.push_back({a, true});
    if (save_b) saved.push_back({b, true});
    Op& o = op(OpKind::Matmul, name, {a, b}, {out}, std::move(saved));
    o.flops = extent_mul(out_e, flops_per_out);
    o.flags = flags;
    return out;
}

TensorId BlockBuilder::softmax(TensorId x, const std::string& name, ActRole out_role, std::uint8_t flags) {
    const TensorId out = tensor(name, info(x).extent, out_role);
    Op& o = op(OpKind::Softmax, name, {x}, {out}, {{out, false}});
    o.flops = extent_mul(info(x).extent, 5);
    o.flags = flags;
    return out;
}

TensorId BlockBuilder::dropout(TensorId x, double p, const std::string& name, std::uint8_t flags) {
    if (p <= 0.0) return x;  // ATen's dropout returns its input when p == 0
    const TensorId mask = tensor(name + ".mask", info(x).extent, ActRole::Mask8);
    const TensorId out = tensor(name, info(x).extent, info(x).role);
    Op& o = op(OpKind::Dropout, name, {x}, {out, mask}, {{mask, false}});
    o.flags = flags;
    return out;
}

TensorId BlockBuilder::layernorm(TensorId x, std::int64_t dim, bool bias, const std::string& name, Component c,
                                 bool add_param) {
    const Extent rows = extent_div(info(x).extent, dim);
    const TensorId mean = tensor(name + ".mean", rows, ActRole::Float32);
    const TensorId rstd = tensor(name + ".rstd", rows, ActRole::Float32);
    const TensorId out = tensor(name, info(x).extent, ActRole::Upcast);
    Op& o = op(OpKind::LayerNorm, name, {x}, {out, mean, rstd}, {{x, false}, {mean, false}, {rstd, false}});
    o.flops = extent_mul(info(x).extent, 8);
    if (add_param) {
        o.params.push_back(param(name + ".weight", {dim}, c));
        if (bias) o.params.push_back(param(name + ".bias", {dim}, c));
    }
    return out;
}

TensorId BlockBuilder::rmsnorm(TensorId x, std::int64_t dim, const std::string& name, Component c, bool add_param) {
    // LlamaRMSNorm.forward: xf = x.to(float32); var = xf.pow(2).mean(-1); h = xf * rsqrt(var + eps);
    // return weight * h.to(input_dtype).  pow saves xf, rsqrt saves its output,
    // mul saves xf and the rsqrt, the weight mul saves h.to(input_dtype).
    const Extent e = info(x).extent;
    const Extent rows = extent_div(e, dim);
    const TensorId xf = cast(x, ActRole::Float32, name + ".float");
    const TensorId rs = tensor(name + ".rsqrt", rows, ActRole::Float32);
    op(OpKind::Elementwise, name + ".pow_mean_rsqrt", {xf}, {rs}, {{xf, false}, {rs, false}});
    const TensorId h = elementwise({xf, rs}, e, ActRole::Float32, {xf, rs}, name + ".normalize");
    const TensorId hc = cast(h, info(x).role, name + ".to_input_dtype");
    const TensorId out = tensor(name, e, info(x).role);
    Op& o = op(OpKind::RMSNorm, name, {hc}, {out}, {{hc, false}});
    o.flops = extent_mul(e, 4);
    if (add_param) o.params.push_back(param(name + ".weight", {dim}, c));
    return out;
}

TensorId BlockBuilder::activation(TensorId x, Act a, const std::string& name) {
    const Extent e = info(x).extent;
    const ActRole r = info(x).role;
    switch (a) {
        case Act::ReLU:
        case Act::Tanh:
        case Act::Sigmoid: {
            const TensorId out = tensor(name, e, r);
            op(OpKind::Activation, name, {x}, {out}, {{out, false}});
            return out;
        }
        case Act::GELU:
        case Act::GELUTanh:
        case Act::SiLU: {
            const TensorId out = tensor(name, e, r);
            op(OpKind::Activation, name, {x}, {out}, {{x, false}});
            return out;
        }
        case Act::GELUNew: {
            // NewGELUActivation: 0.5*x * (1 + tanh(c*(x + 0.044715*pow(x,3)))):
            // pow saves x, tanh saves its output, the final mul saves 0.5*x and (1 + tanh).
            const TensorId half_x = elementwise({x}, e, r, {}, name + ".half_x");
            const TensorId th = elementwise({x}, e, r, {x}, name + ".tanh");
            block_.ops.back().saved.push_back({th, false});
            const TensorId one_plus = elementwise({th}, e, r, {}, name + ".one_plus");
            const TensorId out = tensor(name, e, r);
            op(OpKind::Activation, name, {half_x, one_plus}, {out}, {{half_x, false}, {one_plus, false}});
            return out;
        }
    }
    return x;
}

namespace {
// Type promotion of a binary op (torch.result_type): the wider operand wins.
// Lowered (16-bit under autocast) <= Upcast, Stream (fp32 under autocast, the
// same 16-bit type otherwise) <= Float32; a residual add of a 16-bit branch to
// an fp32 stream is fp32.
ActRole promote(ActRole a, ActRole b) {
    auto rank = [](ActRole r) {
        switch (r) {
            case ActRole::Lowered: return 0;
            case ActRole::Upcast:
            case ActRole::Stream: return 1;
            case ActRole::Float32: return 2;
            default: return -1;
        }
    };
    if (rank(a) < 0 || rank(b) < 0 || rank(a) >= rank(b)) return a;
    return b;
}
}  // namespace

TensorId BlockBuilder::add(TensorId a, TensorId b, const std::string& name) {
    const TensorId out = tensor(name, info(a).extent, promote(info(a).role, info(b).role));
    op(OpKind::Add, name, {a, b}, {out});
    return out;
}

TensorId BlockBuilder::mul(TensorId a, TensorId b, const std::string& name) {
    const TensorId out = tensor(name, info(a).extent, info(a).role);
    op(OpKind::Mul, name, {a, b}, {out}, {{a, false}, {b, false}});
    return out;
}

TensorId BlockBuilder::elementwise(const std::vector<TensorId>& in, Extent out_e, ActRole role,
                                   const std::vector<TensorId>& saved, const std::string& name, std::uint8_t flags) {
    const TensorId out = tensor(name, out_e, role);
    std::vector<SavedRef> s;
    for (auto t : saved) s.push_back({t, false});
    Op& o = op(OpKind::Elementwise, name, in, {out}, std::move(s));
    o.flags = flags;
    return out;
}

TensorId BlockBuilder::cast(TensorId x, ActRole role, const std::string& name) {
    const TensorId out = tensor(name, info(x).extent, role, x);
    op(OpKind::Cast, name, {x}, {out});
    return out;
}

TensorId BlockBuilder::view(TensorId x, Extent e, const std::string& name) {
    const TensorId out = tensor(name, e, info(x).role, x);
    op(OpKind::View, name, {x}, {out});
    return out;
}

TensorId BlockBuilder::copy(TensorId x, Extent e, const std::string& name, ActRole role) {
    const TensorId out = tensor(name, e, role);
    op(OpKind::Elementwise, name, {x}, {out});
    return out;
}

TensorId BlockBuilder::conv2d(TensorId x, std::int64_t in_ch, std::int64_t out_ch, std::int64_t k, bool bias,
                              Extent out_e, std::int64_t out_hw, const std::string& name) {
    const TensorId out = tensor(name, out_e, ActRole::Lowered);
    Op& o = op(OpKind::Conv2d, name, {x}, {out}, {{x, true, true}});
    o.flops = Extent::per_sample(checked_mul(checked_mul(2, out_hw), checked_mul(out_ch, checked_mul(in_ch, k * k))));
    o.params.push_back(param(name + ".weight", {out_ch, in_ch, k, k}, Component::Other, leaf_module(name)));
    if (bias) o.params.push_back(param(name + ".bias", {out_ch}, Component::Other, leaf_module(name)));
    return out;
}

TensorId BlockBuilder::batchnorm2d(TensorId x, std::int64_t ch, const std::string& name) {
    // Per-channel save_mean/save_invstd (2 x ch fp32, independent of the batch)
    // are below a kilobyte and not modelled.
    const TensorId out = tensor(name, info(x).extent, info(x).role);
    Op& o = op(OpKind::BatchNorm2d, name, {x}, {out}, {{x, false}});
    o.params.push_back(param(name + ".weight", {ch}, Component::Norms));
    o.params.push_back(param(name + ".bias", {ch}, Component::Norms));
    return out;
}

TensorId BlockBuilder::maxpool2d(TensorId x, Extent out_e, std::int64_t /*k*/, const std::string& name) {
    const TensorId idx = tensor(name + ".indices", out_e, ActRole::Index64);
    const TensorId out = tensor(name, out_e, info(x).role);
    op(OpKind::MaxPool2d, name, {x}, {out, idx}, {{x, false}, {idx, false}});
    return out;
}

TensorId BlockBuilder::avgpool2d(TensorId x, Extent out_e, const std::string& name, bool adaptive) {
    const TensorId out = tensor(name, out_e, info(x).role);
    op(adaptive ? OpKind::AdaptiveAvgPool2d : OpKind::AvgPool2d, name, {x}, {out}, {{x, false}});
    return out;
}

TensorId BlockBuilder::cross_entropy(TensorId logits, Extent logits_extent, Extent rows, bool upcast_fp32,
                                     const std::string& name) {
    const TensorId labels = data(name + ".labels", rows, ActRole::Index64);
    const TensorId lf = upcast_fp32 ? cast(logits, ActRole::Float32, name + ".logits_float") : logits;
    const TensorId logp = tensor(name + ".log_softmax", logits_extent, upcast_fp32 ? ActRole::Float32 : ActRole::Upcast);
    Op& ls = op(OpKind::Softmax, name + ".log_softmax", {lf}, {logp}, {{logp, false}});
    ls.flops = extent_mul(logits_extent, 5);
    const TensorId loss = tensor(name, {}, ActRole::Float32);
    op(OpKind::Loss, name, {logp, labels}, {loss}, {{labels, false}});
    return loss;
}

TensorId BlockBuilder::mse_loss(TensorId x, const std::string& name) {
    const TensorId target = data(name + ".target", info(x).extent, info(x).role);
    const TensorId loss = tensor(name, {}, ActRole::Float32);
    op(OpKind::Loss, name, {x, target}, {loss}, {{x, false}, {target, false}});
    return loss;
}

TensorId BlockBuilder::sum_loss(TensorId x, const std::string& name) {
    const TensorId loss = tensor(name, {}, ActRole::Float32);
    op(OpKind::Loss, name, {x}, {loss});
    return loss;
}

void BlockBuilder::mark_attention(TensorId q, TensorId k, TensorId v, TensorId out, std::int64_t heads, bool causal) {
    block_.attention.push_back(AttentionSite{q, k, v, out, heads, causal});
}

Block BlockBuilder::finish(TensorId output) {
    block_.output = output;
    return std::move(block_);
}

}  // namespace gpumem
