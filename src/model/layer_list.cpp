// src/model/layer_list.cpp — layer-list JSON for custom models.
//
//   {"name": "toy-mlp",
//    "input": {"shape": [1024], "dtype": "float32"},      // per sample; the batch comes from --batch
//    "dtype": "float32",                                   // parameter dtype (optional)
//    "layers": [{"type": "linear", "in": 1024, "out": 1024, "bias": true}, {"type": "relu"}, ...],
//    "loss": "sum"}                                        // sum | mse | cross_entropy | none
//
// The layers run in sequence as an nn.Sequential would; parameter names follow
// nn.Sequential ("0.weight", "2.bias", ...). The per-sample shape is tracked
// layer by layer (conv/pool: [C, H, W] with PyTorch's floor((H + 2p - k)/s) + 1;
// linear acts on the last dim) and every mismatch is an error naming
// layers[i] and the field. Everything lowers into one Block "layers" (repeat 1)
// built with BlockBuilder, so saved-for-backward tensors follow PyTorch's rules.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "gpumem/core/limits.hpp"
#include "gpumem/model/builder.hpp"
#include "gpumem/model/load.hpp"
#include "load_internal.hpp"

namespace gpumem {

namespace {

using nlohmann::json;

const std::vector<std::string>& supported_layers() {
    static const std::vector<std::string> v{"linear",
                                            "conv2d",
                                            "batchnorm2d",
                                            "layernorm",
                                            "embedding",
                                            "relu",
                                            "gelu",
                                            "silu",
                                            "tanh",
                                            "sigmoid",
                                            "dropout",
                                            "maxpool2d",
                                            "avgpool2d",
                                            "adaptive_avgpool2d",
                                            "flatten",
                                            "softmax",
                                            "multihead_attention"};
    return v;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::int64_t prod(const std::vector<std::int64_t>& v) {
    std::int64_t p = 1;
    for (auto d : v) p = checked_mul(p, d);
    return p;
}

class LayerListLoader {
public:
    LayerListLoader(const json& doc, std::string origin) : doc_(doc), origin_(std::move(origin)) {}

    ModelGraph load();

private:
    const json& doc_;
    std::string origin_;
    // Current layer context for messages.
    std::size_t idx_ = 0;
    std::string type_;
    const json* layer_ = nullptr;

    std::vector<std::int64_t> shape_;  // per-sample shape of the current tensor
    bool integer_ = false;             // current tensor holds integer ids
    std::vector<std::string> notes_;

    [[noreturn]] void fail_field(const std::string& field, const std::string& what,
                                 ErrorCode code = ErrorCode::InvalidArgument) const {
        const std::string f = "layers[" + std::to_string(idx_) + "]." + field;
        fail(code, f, origin_ + ": " + f + " (" + type_ + ") " + what);
    }
    [[noreturn]] void fail_layer(const std::string& what, ErrorCode code = ErrorCode::InvalidArgument) const {
        const std::string f = "layers[" + std::to_string(idx_) + "]";
        fail(code, f, origin_ + ": " + f + " (" + type_ + "): " + what);
    }

    const json* find(std::initializer_list<const char*> keys) const {
        for (const char* k : keys)
            if (layer_->contains(k)) return &(*layer_)[k];
        return nullptr;
    }
    std::int64_t get_int(std::initializer_list<const char*> keys, std::optional<std::int64_t> def,
                         std::int64_t min_value = 1) const {
        const json* v = find(keys);
        const std::string key = *keys.begin();
        if (!v) {
            if (def) return *def;
            fail_field(key, "is missing: " + type_ + " needs \"" + key + "\"");
        }
        if (!v->is_number_integer())
            fail_field(key, std::string("must be an integer, got ") + detail::json_kind(*v) + " " + v->dump());
        const auto n = v->get<std::int64_t>();
        if (n < min_value)
            fail_field(key, "must be " + std::string(min_value == 0 ? ">= 0" : "a positive integer") + ", got " +
                                std::to_string(n));
        return n;
    }
    // An int or a pair [a, b] (kernel_size, stride, padding).
    std::pair<std::int64_t, std::int64_t> get_pair(std::initializer_list<const char*> keys,
                                                   std::optional<std::pair<std::int64_t, std::int64_t>> def,
                                                   std::int64_t min_value = 1) const {
        const json* v = find(keys);
        const std::string key = *keys.begin();
        if (!v) {
            if (def) return *def;
            fail_field(key, "is missing: " + type_ + " needs \"" + key + "\"");
        }
        auto check = [&](const json& x) {
            if (!x.is_number_integer()) fail_field(key, std::string("must be an integer or [h, w], got ") + v->dump());
            const auto n = x.get<std::int64_t>();
            if (n < min_value)
                fail_field(key, "must be " + std::string(min_value == 0 ? ">= 0" : "positive") + ", got " + v->dump());
            return n;
        };
        if (v->is_array()) {
            if (v->size() != 2) fail_field(key, "must be an integer or [h, w], got " + v->dump());
            return {check((*v)[0]), check((*v)[1])};
        }
        const auto n = check(*v);
        return {n, n};
    }
    bool get_bool(std::initializer_list<const char*> keys, bool def) const {
        const json* v = find(keys);
        if (!v) return def;
        if (!v->is_boolean()) fail_field(*keys.begin(), std::string("must be true or false, got ") + v->dump());
        return v->get<bool>();
    }
    double get_prob(const char* key, double def) const {
        const json* v = find({key});
        if (!v) return def;
        if (!v->is_number()) fail_field(key, std::string("must be a number, got ") + v->dump());
        const double p = v->get<double>();
        if (!(p >= 0.0 && p < 1.0)) fail_field(key, "must be in [0, 1), got " + v->dump());
        return p;
    }

    std::string prev_desc() const { return idx_ == 0 ? "the input has" : "the previous layer outputs"; }
    void need_float() const {
        if (integer_)
            fail_layer("the input holds integer ids " + shape_str(shape_) +
                       "; only embedding accepts integer input (or give \"input\": {\"dtype\": \"float32\"})");
    }
    void need_chw() const {
        need_float();
        if (shape_.size() != 3)
            fail_layer("needs a [C, H, W] input per sample, but " + prev_desc() + " " + shape_str(shape_));
    }
    void check_features(const char* field, std::int64_t expected_here, std::int64_t actual, const char* what) const {
        if (expected_here != actual)
            fail_layer("\"" + std::string(field) + "\" is " + std::to_string(expected_here) + " but " + prev_desc() +
                       " " + std::to_string(actual) + " " + what);
    }
    static std::int64_t pool_out(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p) {
        // PyTorch (dilation 1, ceil_mode False): floor((in + 2p - k) / s) + 1
        const std::int64_t num = in + 2 * p - k;
        if (num < 0) return 0;
        return num / s + 1;
    }
};

ModelGraph LayerListLoader::load() {
    if (!doc_.is_object())
        fail(ErrorCode::ParseError, origin_,
             origin_ + ": a layer list must be a JSON object {\"input\": ..., \"layers\": [...]}, got " +
                 detail::json_kind(doc_));

    // Parameter dtype.
    DType pdt = DType::F32;
    for (const char* k : {"dtype", "param_dtype"}) {
        if (!doc_.contains(k)) continue;
        const auto& v = doc_[k];
        auto t = v.is_string() ? parse_dtype(v.get<std::string>()) : std::nullopt;
        if (!t || dtype_bits(*t) < 16 || *t == DType::I64 || *t == DType::I32 || *t == DType::I16)
            fail(ErrorCode::InvalidArgument, k,
                 origin_ + ": \"" + k + "\" must be a floating-point dtype (float32, bfloat16, float16), got " +
                     v.dump());
        pdt = *t;
    }

    // Input.
    if (!doc_.contains("input"))
        fail(ErrorCode::InvalidArgument, "input",
             origin_ +
                 ": \"input\" is missing; give the per-sample input, e.g. \"input\": {\"shape\": [1024], "
                 "\"dtype\": \"float32\"}");
    const json& in = doc_["input"];
    const json* in_shape = nullptr;
    DType in_dtype = DType::F32;
    if (in.is_array()) {
        in_shape = &in;
    } else if (in.is_object()) {
        if (!in.contains("shape"))
            fail(ErrorCode::InvalidArgument, "input.shape",
                 origin_ + ": input.shape is missing (per-sample shape, e.g. [3, 224, 224])");
        in_shape = &in["shape"];
        if (in.contains("dtype")) {
            const auto& d = in["dtype"];
            auto t = d.is_string() ? parse_dtype(d.get<std::string>()) : std::nullopt;
            if (!t || *t == DType::NF4 || *t == DType::Int4 || *t == DType::Bool)
                fail(ErrorCode::InvalidArgument, "input.dtype",
                     origin_ + ": input.dtype " + d.dump() + " is not a tensor dtype (float32, bfloat16, int64, ...)");
            in_dtype = *t;
        }
    } else {
        fail(
            ErrorCode::InvalidArgument, "input",
            origin_ + ": \"input\" must be an object {\"shape\": [...], \"dtype\": ...}, got " + detail::json_kind(in));
    }
    if (!in_shape->is_array() || in_shape->empty())
        fail(ErrorCode::InvalidArgument, "input.shape",
             origin_ + ": input.shape must be a non-empty array of positive integers (per sample, without the batch)");
    for (const auto& d : *in_shape) {
        if (!d.is_number_integer() || d.get<std::int64_t>() <= 0)
            fail(ErrorCode::InvalidArgument, "input.shape",
                 origin_ + ": input.shape must hold positive integers, got " + in_shape->dump());
        shape_.push_back(d.get<std::int64_t>());
    }
    const bool int_input = in_dtype == DType::I64 || in_dtype == DType::I32 || in_dtype == DType::I16 ||
                           in_dtype == DType::I8 || in_dtype == DType::U8;
    integer_ = int_input;
    if (int_input && in_dtype != DType::I64)
        notes_.push_back("input dtype " + std::string(dtype_name(in_dtype)) +
                         " modelled as int64 (nn.Embedding indices are usually int64)");
    if (!int_input && in_dtype != DType::F32 && in_dtype != pdt)
        notes_.push_back("input dtype " + std::string(dtype_name(in_dtype)) +
                         " modelled in the parameter dtype / precision mode");

    if (!doc_.contains("layers") || !doc_["layers"].is_array())
        fail(ErrorCode::InvalidArgument, "layers", origin_ + ": \"layers\" must be an array of layer objects");
    const json& layers = doc_["layers"];
    if (layers.empty()) fail(ErrorCode::InvalidArgument, "layers", origin_ + ": \"layers\" is empty");
    if (layers.size() > static_cast<std::size_t>(kMaxLayers))
        fail(ErrorCode::InvalidArgument, "layers",
             origin_ + ": \"layers\" has " + std::to_string(layers.size()) + " entries; at most " + std::to_string(kMaxLayers) +
                 " (real layer lists have hundreds; docs/limits.md)");

    BlockBuilder b("layers", 1, pdt);
    TensorId cur = b.data("input", Extent::per_sample(prod(shape_)), int_input ? ActRole::Index64 : ActRole::Stream);
    auto ext = [](std::int64_t n) { return Extent::per_sample(n); };

    for (idx_ = 0; idx_ < layers.size(); ++idx_) {
        layer_ = &layers[idx_];
        type_ = "?";
        const std::string f = "layers[" + std::to_string(idx_) + "]";
        if (!layer_->is_object())
            fail(ErrorCode::InvalidArgument, f, origin_ + ": " + f + " must be an object with a \"type\"");
        if (!layer_->contains("type") || !(*layer_)["type"].is_string())
            fail(ErrorCode::InvalidArgument, f + ".type",
                 origin_ + ": " + f + ".type is missing (one of: " + join(supported_layers()) + ")");
        std::string t = (*layer_)["type"].get<std::string>();
        std::transform(t.begin(), t.end(), t.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        static const std::map<std::string, std::string> kAlias{{"conv", "conv2d"},
                                                               {"batchnorm", "batchnorm2d"},
                                                               {"bn", "batchnorm2d"},
                                                               {"layer_norm", "layernorm"},
                                                               {"adaptiveavgpool2d", "adaptive_avgpool2d"},
                                                               {"mha", "multihead_attention"},
                                                               {"multiheadattention", "multihead_attention"},
                                                               {"maxpool", "maxpool2d"},
                                                               {"avgpool", "avgpool2d"}};
        if (auto it = kAlias.find(t); it != kAlias.end()) t = it->second;
        type_ = t;
        std::string name = std::to_string(idx_);
        if (layer_->contains("name") && (*layer_)["name"].is_string() && !(*layer_)["name"].get<std::string>().empty())
            name = (*layer_)["name"].get<std::string>();

        try {
            if (t == "linear") {
                need_float();
                const auto in_f = get_int({"in", "in_features"}, std::nullopt);
                const auto out_f = get_int({"out", "out_features"}, std::nullopt);
                const bool bias = get_bool({"bias"}, true);
                check_features("in", in_f, shape_.back(), "features");
                cur = b.linear(cur, in_f, out_f, bias, name, Component::Other);
                shape_.back() = out_f;
            } else if (t == "conv2d") {
                need_chw();
                const auto in_c = get_int({"in", "in_channels"}, std::nullopt);
                const auto out_c = get_int({"out", "out_channels"}, std::nullopt);
                const auto [kh, kw] = get_pair({"kernel", "kernel_size"}, std::nullopt);
                const auto [sh, sw] = get_pair({"stride"}, std::pair<std::int64_t, std::int64_t>{1, 1});
                const auto [ph, pw] = get_pair({"padding"}, std::pair<std::int64_t, std::int64_t>{0, 0}, 0);
                const bool bias = get_bool({"bias"}, true);
                check_features("in", in_c, shape_[0], "channels");
                const auto oh = pool_out(shape_[1], kh, sh, ph), ow = pool_out(shape_[2], kw, sw, pw);
                if (oh <= 0 || ow <= 0)
                    fail_layer("kernel " + std::to_string(kh) + "x" + std::to_string(kw) + " does not fit the " +
                               std::to_string(shape_[1]) + "x" + std::to_string(shape_[2]) + " input (padding " +
                               std::to_string(ph) + ")");
                const std::vector<std::int64_t> out_shape{out_c, oh, ow};
                // As BlockBuilder::conv2d, with rectangular kernels: convolution saves its input.
                const TensorId out = b.tensor(name, ext(prod(out_shape)), ActRole::Lowered);
                Op& o = b.op(OpKind::Conv2d, name, {cur}, {out}, {{cur, true}});
                o.flops = ext(
                    checked_mul(checked_mul(2, checked_mul(oh, ow)), checked_mul(out_c, checked_mul(in_c, kh * kw))));
                const auto w = b.param(name + ".weight", {out_c, in_c, kh, kw}, Component::Other, name);
                b.block().ops.back().params.push_back(w);
                if (bias) {
                    const auto bi = b.param(name + ".bias", {out_c}, Component::Other, name);
                    b.block().ops.back().params.push_back(bi);
                }
                cur = out;
                shape_ = out_shape;
            } else if (t == "batchnorm2d") {
                need_chw();
                const auto c = get_int({"features", "channels", "num_features"}, std::nullopt);
                check_features("features", c, shape_[0], "channels");
                cur = b.batchnorm2d(cur, c, name);
            } else if (t == "layernorm") {
                need_float();
                const auto d = get_int({"normalized", "dim", "normalized_shape"}, std::nullopt);
                const bool affine = get_bool({"elementwise_affine", "affine"}, true);
                const bool bias = get_bool({"bias"}, true);
                check_features("normalized", d, shape_.back(), "features");
                cur = b.layernorm(cur, d, bias, name, Component::Norms, affine);
            } else if (t == "embedding") {
                if (!integer_)
                    fail_layer("needs integer token ids as input, but " + prev_desc() + " a float tensor " +
                               shape_str(shape_) + " (set \"input\": {\"dtype\": \"int64\"})");
                const auto num = get_int({"num", "num_embeddings"}, std::nullopt);
                const auto dim = get_int({"dim", "embedding_dim"}, std::nullopt);
                cur = b.embedding(cur, num, dim, name, Component::Embeddings);
                shape_.push_back(dim);
                integer_ = false;
            } else if (t == "relu" || t == "gelu" || t == "silu" || t == "tanh" || t == "sigmoid") {
                need_float();
                using A = BlockBuilder::Act;
                A a = t == "relu"   ? A::ReLU
                      : t == "gelu" ? A::GELU
                      : t == "silu" ? A::SiLU
                      : t == "tanh" ? A::Tanh
                                    : A::Sigmoid;
                if (t == "gelu" && layer_->contains("approximate") && (*layer_)["approximate"] == "tanh")
                    a = A::GELUTanh;
                cur = b.activation(cur, a, name);
            } else if (t == "dropout") {
                need_float();
                cur = b.dropout(cur, get_prob("p", 0.5), name);
            } else if (t == "maxpool2d" || t == "avgpool2d") {
                need_chw();
                const auto [kh, kw] = get_pair({"kernel", "kernel_size"}, std::nullopt);
                const auto [sh, sw] = get_pair({"stride"}, std::pair<std::int64_t, std::int64_t>{kh, kw});
                const auto [ph, pw] = get_pair({"padding"}, std::pair<std::int64_t, std::int64_t>{0, 0}, 0);
                if (2 * ph > kh || 2 * pw > kw)
                    fail_field("padding", "must be at most half the kernel size (PyTorch rule)");
                const auto oh = pool_out(shape_[1], kh, sh, ph), ow = pool_out(shape_[2], kw, sw, pw);
                if (oh <= 0 || ow <= 0)
                    fail_layer("kernel " + std::to_string(kh) + "x" + std::to_string(kw) + " does not fit the " +
                               std::to_string(shape_[1]) + "x" + std::to_string(shape_[2]) + " input");
                shape_ = {shape_[0], oh, ow};
                cur = t == "maxpool2d" ? b.maxpool2d(cur, ext(prod(shape_)), kh, name)
                                       : b.avgpool2d(cur, ext(prod(shape_)), name, false);
            } else if (t == "adaptive_avgpool2d") {
                need_chw();
                const auto [oh, ow] = get_pair({"output", "output_size"}, std::nullopt);
                shape_ = {shape_[0], oh, ow};
                cur = b.avgpool2d(cur, ext(prod(shape_)), name, true);
            } else if (t == "flatten") {
                need_float();
                // nn.Flatten() (start_dim=1): all per-sample dims into one; a view of a contiguous tensor.
                shape_ = {prod(shape_)};
                cur = b.view(cur, ext(shape_[0]), name);
                b.block().ops.back().kind = OpKind::Flatten;
            } else if (t == "softmax") {
                need_float();
                if (layer_->contains("dim") && (*layer_)["dim"] != -1 &&
                    (*layer_)["dim"] != static_cast<std::int64_t>(shape_.size()))
                    notes_.push_back("layers[" + std::to_string(idx_) +
                                     "] softmax: dim other than -1 has the same "
                                     "memory; modelled as dim -1");
                // softmax saves its output; under autocast it runs in fp32 (the Upcast role).
                cur = b.softmax(cur, name, ActRole::Upcast);
            } else if (t == "multihead_attention") {
                need_float();
                if (shape_.size() != 2)
                    fail_layer("needs a [seq, embed_dim] input per sample, but " + prev_desc() + " " +
                               shape_str(shape_));
                const auto E = get_int({"embed_dim", "embed"}, std::nullopt);
                const auto H = get_int({"heads", "num_heads"}, std::nullopt);
                const double p = get_prob("dropout", 0.0);
                const bool bias = get_bool({"bias"}, true);
                check_features("embed_dim", E, shape_[1], "features");
                if (E % H != 0)
                    fail_field("heads",
                               "must divide embed_dim (" + std::to_string(E) + " % " + std::to_string(H) + " != 0)");
                const std::int64_t L = shape_[0];
                const std::int64_t d = E / H;
                // nn.MultiheadAttention(E, H, batch_first=True)(x, x, x) in training
                // runs F.multi_head_attention_forward's math path (need_weights=True):
                //   proj = linear(x, in_proj_weight, in_proj_bias)          saves x
                //   proj.unflatten(-1, (3, E))...contiguous() -> q, k, v    a copy [3, L, B, E]; q/k/v are views
                //   q_scaled = q * (1/sqrt(d))                              scalar mul saves nothing
                //   w = bmm(q_scaled, k^T)                                  saves q_scaled and k (the qkv copy)
                //   w = softmax(w); w = dropout(w, p)                       saves softmax output (+ bool mask)
                //   o = bmm(w, v)                                           saves w and v (v: same qkv storage)
                //   o = o.transpose(0, 1).contiguous().view(L*B, E)         a copy
                //   out = linear(o, out_proj.weight, out_proj.bias)         saves the copy
                // The head-averaged weights returned to the caller are dropped unused.
                const TensorId proj = b.linear(cur, E, 3 * E, false, name + ".in_proj", Component::Attention, false);
                const auto w = b.param(name + ".in_proj_weight", {3 * E, E}, Component::Attention, "in_proj");
                b.block().ops.back().params.push_back(w);
                if (bias) {
                    const auto bi = b.param(name + ".in_proj_bias", {3 * E}, Component::Attention, "in_proj");
                    b.block().ops.back().params.push_back(bi);
                }
                const TensorId qkv =
                    b.copy(proj, ext(checked_mul(3, checked_mul(L, E))), name + ".qkv", ActRole::Lowered);
                const TensorId qs =
                    b.elementwise({qkv}, ext(checked_mul(L, E)), ActRole::Lowered, {}, name + ".q_scaled");
                const Extent scores_e = ext(checked_mul(H, checked_mul(L, L)));
                const TensorId scores = b.matmul(qs, qkv, scores_e, 2 * d, name + ".scores", true, true, kAttnCore);
                const TensorId probs = b.softmax(scores, name + ".softmax", ActRole::Stream, kAttnCore);
                const TensorId probs_d = b.dropout(probs, p, name + ".attn_dropout", kAttnCore);
                // v is a view of the qkv storage the scores bmm already saved.
                const TensorId ctx =
                    b.matmul(probs_d, qkv, ext(checked_mul(L, E)), 2 * L, name + ".attn_v", true, false);
                const TensorId ctx_c = b.copy(ctx, ext(checked_mul(L, E)), name + ".attn_output", ActRole::Lowered);
                cur = b.linear(ctx_c, E, E, bias, name + ".out_proj", Component::Attention);
            } else {
                fail(ErrorCode::Unsupported, f + ".type",
                     origin_ + ": " + f + ".type \"" + (*layer_)["type"].get<std::string>() +
                         "\" is not supported (supported: " + join(supported_layers()) + ")");
            }
        } catch (const OverflowError&) {
            fail_layer("sizes overflow 64 bits; check the layer's dimensions", ErrorCode::Overflow);
        }
    }

    // Loss.
    idx_ = layers.size();
    std::string loss = "sum";
    if (doc_.contains("loss")) {
        if (!doc_["loss"].is_string())
            fail(ErrorCode::InvalidArgument, "loss",
                 origin_ + ": \"loss\" must be one of sum, mse, cross_entropy, none");
        loss = doc_["loss"].get<std::string>();
    } else {
        notes_.push_back("no \"loss\" given: backward of out.sum() assumed");
    }
    if (integer_ && loss != "none")
        fail(ErrorCode::InvalidArgument, "loss",
             origin_ +
                 ": the model output is integer ids (no layer after the input); add layers or set \"loss\": \"none\"");
    if (loss == "sum") {
        b.sum_loss(cur, "loss");
    } else if (loss == "mse") {
        b.mse_loss(cur, "loss");
    } else if (loss == "cross_entropy") {
        // nn.CrossEntropyLoss on logits whose last dim holds the classes; one int64
        // label per row. Under autocast log_softmax runs in fp32: cast to the
        // Stream role (a no-op alias when the dtypes match).
        const std::int64_t classes = shape_.back();
        const std::int64_t rows = prod(shape_) / classes;
        if (classes < 2)
            fail(ErrorCode::InvalidArgument, "loss",
                 origin_ + ": cross_entropy needs a class dimension, but the last layer outputs " + shape_str(shape_));
        const TensorId logits = b.cast(cur, ActRole::Stream, "loss.logits");
        b.cross_entropy(logits, ext(prod(shape_)), ext(rows), false, "loss");
    } else if (loss != "none") {
        fail(ErrorCode::InvalidArgument, "loss",
             origin_ + ": \"loss\" \"" + loss + "\" is not supported (sum, mse, cross_entropy, none)");
    }

    ModelGraph g;
    if (doc_.contains("name") && doc_["name"].is_string() && !doc_["name"].get<std::string>().empty())
        g.name = doc_["name"].get<std::string>();
    else
        g.name = std::filesystem::path(origin_).stem().string();
    g.family = "layers";
    g.source = "layer-list";
    g.has_sequence = false;
    g.blocks.push_back(b.finish(cur));
    g.notes = std::move(notes_);
    g.notes.push_back("output per sample " + shape_str(shape_) + "; the batch dimension comes from --batch");
    return g;
}

}  // namespace

Result<ModelGraph> load_layer_list_json(const nlohmann::json& doc, std::string_view origin) {
    return detail::guard([&]() -> Result<ModelGraph> {
        LayerListLoader loader(doc, std::string(origin));
        return loader.load();
    });
}

Result<ModelGraph> load_layer_list_file(const std::string& path) {
    return detail::guard([&]() -> Result<ModelGraph> {
        const json doc = detail::read_json_file(path);
        return load_layer_list_json(doc, path);
    });
}

}  // namespace gpumem
