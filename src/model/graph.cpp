#include "gpumem/model/graph.hpp"

namespace gpumem {

const char* component_name(Component c) {
    switch (c) {
        case Component::Embeddings: return "embeddings";
        case Component::Attention: return "attention";
        case Component::Mlp: return "mlp";
        case Component::Experts: return "experts";
        case Component::Router: return "router";
        case Component::Norms: return "norms";
        case Component::Head: return "head";
        case Component::Other: return "other";
    }
    return "other";
}

const char* op_kind_name(OpKind k) {
    switch (k) {
        case OpKind::Input: return "input";
        case OpKind::Embedding: return "embedding";
        case OpKind::Linear: return "linear";
        case OpKind::Matmul: return "matmul";
        case OpKind::Attention: return "attention";
        case OpKind::Softmax: return "softmax";
        case OpKind::LayerNorm: return "layernorm";
        case OpKind::RMSNorm: return "rmsnorm";
        case OpKind::Activation: return "activation";
        case OpKind::Dropout: return "dropout";
        case OpKind::Add: return "add";
        case OpKind::Mul: return "mul";
        case OpKind::Elementwise: return "elementwise";
        case OpKind::Cast: return "cast";
        case OpKind::View: return "view";
        case OpKind::Conv2d: return "conv2d";
        case OpKind::BatchNorm2d: return "batchnorm2d";
        case OpKind::MaxPool2d: return "maxpool2d";
        case OpKind::AvgPool2d: return "avgpool2d";
        case OpKind::AdaptiveAvgPool2d: return "adaptive_avgpool2d";
        case OpKind::Flatten: return "flatten";
        case OpKind::Router: return "router";
        case OpKind::Experts: return "experts";
        case OpKind::Loss: return "loss";
    }
    return "op";
}

std::int64_t Extent::elements(std::int64_t b, std::int64_t s) const {
    std::int64_t per = c0;
    if (c1 != 0) per = checked_add(per, checked_mul(c1, s));
    if (c2 != 0) per = checked_add(per, checked_mul(c2, checked_mul(s, s)));
    return checked_mul(b, per);
}

std::int64_t Param::numel() const {
    std::int64_t n = count;
    for (auto d : shape) n = checked_mul(n, d);
    return n;
}

std::int64_t ModelGraph::total_params() const {
    if (params_only > 0) return params_only;
    std::int64_t n = 0;
    for (const auto& b : blocks)
        for (const auto& p : b.params) n = checked_add(n, checked_mul(b.repeat, p.numel()));
    return n;
}

std::int64_t ModelGraph::trainable_params() const {
    if (params_only > 0) return params_only;
    std::int64_t n = 0;
    for (const auto& b : blocks)
        for (const auto& p : b.params)
            if (p.trainable) n = checked_add(n, checked_mul(b.repeat, p.numel()));
    return n;
}

}  // namespace gpumem
