// gpumem's model graph as a JSON document (gpumem/model/graph_json.hpp).
#include "gpumem/model/graph_json.hpp"

#include <array>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpumem {

using nlohmann::json;

namespace {

constexpr std::array<Component, kComponentCount> kComponents = {Component::Embeddings, Component::Attention, Component::Mlp, Component::Experts,
                                                                Component::Router,     Component::Norms,     Component::Head, Component::Other};
constexpr std::array<OpKind, 24> kOpKinds = {OpKind::Input,      OpKind::Embedding,   OpKind::Linear,    OpKind::Matmul,    OpKind::Attention,
                                             OpKind::Softmax,    OpKind::LayerNorm,   OpKind::RMSNorm,   OpKind::Activation, OpKind::Dropout,
                                             OpKind::Add,        OpKind::Mul,         OpKind::Elementwise, OpKind::Cast,    OpKind::View,
                                             OpKind::Conv2d,     OpKind::BatchNorm2d, OpKind::MaxPool2d, OpKind::AvgPool2d, OpKind::AdaptiveAvgPool2d,
                                             OpKind::Flatten,    OpKind::Router,      OpKind::Experts,   OpKind::Loss};
static_assert(static_cast<std::size_t>(OpKind::Loss) + 1 == kOpKinds.size(), "every OpKind has a name in the file format");

const char* role_name(ActRole r) {
    switch (r) {
        case ActRole::Stream: return "stream";
        case ActRole::Lowered: return "lowered";
        case ActRole::Float32: return "float32";
        case ActRole::Index64: return "index64";
        case ActRole::Mask8: return "mask8";
        case ActRole::Upcast: return "upcast";
        case ActRole::Float8: return "float8";
        case ActRole::Float32UnlessHalf: return "float32_unless_fp16";
    }
    return "stream";
}
constexpr std::array<ActRole, 8> kRoles = {ActRole::Stream, ActRole::Lowered, ActRole::Float32, ActRole::Index64,
                                           ActRole::Mask8,  ActRole::Upcast,  ActRole::Float8,  ActRole::Float32UnlessHalf};
static_assert(static_cast<std::size_t>(ActRole::Float32UnlessHalf) + 1 == kRoles.size(), "every ActRole has a name in the file format");

const char* axis_name(SeqAxis a) {
    switch (a) {
        case SeqAxis::Main: return "main";
        case SeqAxis::Decoder: return "decoder";
        case SeqAxis::Cross: return "cross";
    }
    return "main";
}
constexpr std::array<SeqAxis, 3> kAxes = {SeqAxis::Main, SeqAxis::Decoder, SeqAxis::Cross};

json extent_json(const Extent& e) { return json::array({e.c0, e.c1, e.c2}); }

json bools(const std::vector<bool>& v) {
    json a = json::array();
    for (bool b : v) a.push_back(b);
    return a;
}

// ---- reading ---------------------------------------------------------------

constexpr std::int64_t kMaxCount = std::int64_t{1} << 40;  // no model has more elements in one dimension or tensor

class In {
public:
    In(const json& j, std::string path, std::string_view origin) : j_(j), path_(std::move(path)), origin_(origin) {}

    [[noreturn]] void bad(const std::string& key, const std::string& what) const {
        const std::string field = key.empty() ? path_ : path_.empty() ? key : path_ + "." + key;
        fail(ErrorCode::ParseError, field, std::string(origin_) + ": " + field + " " + what);
    }
    const json* find(const char* key) const {
        if (!j_.is_object()) bad("", "must be an object");
        const auto it = j_.find(key);
        return it == j_.end() || it->is_null() ? nullptr : &*it;
    }
    std::int64_t integer(const char* key, std::optional<std::int64_t> def, std::int64_t lo, std::int64_t hi = kMaxCount) const {
        const json* v = find(key);
        if (!v) {
            if (!def) bad(key, "is missing");
            return *def;
        }
        if (!v->is_number_integer()) bad(key, "must be an integer (got " + std::string(v->type_name()) + ")");
        const std::int64_t x = v->get<std::int64_t>();
        if (x < lo || x > hi) bad(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " + std::to_string(x) + ")");
        return x;
    }
    bool boolean(const char* key, bool def) const {
        const json* v = find(key);
        if (!v) return def;
        if (!v->is_boolean()) bad(key, "must be true or false");
        return v->get<bool>();
    }
    std::string string(const char* key, std::optional<std::string> def) const {
        const json* v = find(key);
        if (!v) {
            if (!def) bad(key, "is missing");
            return *def;
        }
        if (!v->is_string()) bad(key, "must be a string");
        return v->get<std::string>();
    }
    const json& array(const char* key, bool required) const {
        static const json empty = json::array();
        const json* v = find(key);
        if (!v) {
            if (required) bad(key, "is missing");
            return empty;
        }
        if (!v->is_array()) bad(key, "must be an array");
        return *v;
    }
    template <class E, std::size_t N, class NameOf>
    E enumerated(const char* key, std::optional<E> def, const std::array<E, N>& all, NameOf name_of) const {
        const json* v = find(key);
        if (!v) {
            if (!def) bad(key, "is missing");
            return *def;
        }
        std::string names;
        if (v->is_string())
            for (E e : all)
                if (v->get<std::string>() == name_of(e)) return e;
        for (E e : all) names += (names.empty() ? "" : ", ") + std::string(name_of(e));
        bad(key, "must be one of: " + names);
    }
    Extent extent(const char* key) const {
        const json* v = find(key);
        if (!v) return {};
        if (!v->is_array() || v->size() != 3) bad(key, "must be [c0, c1, c2]: elements per sample, per token, per token squared");
        std::array<std::int64_t, 3> c{};
        for (std::size_t i = 0; i < 3; ++i) {
            if (!(*v)[i].is_number_integer()) bad(key, "must hold three integers");
            c[i] = (*v)[i].get<std::int64_t>();
            if (c[i] < (i == 0 ? -kMaxCount : 0) || c[i] > kMaxCount)
                bad(key, i == 0 ? "c0 must be between -2^40 and 2^40" : "c1 and c2 must be between 0 and 2^40");
        }
        if (c[0] + c[1] + c[2] < 0) bad(key, "is negative at s = 1 (c0 + c1 + c2 < 0)");
        return {c[0], c[1], c[2]};
    }
    std::vector<std::int64_t> ints(const char* key, std::int64_t lo, std::int64_t hi) const {
        std::vector<std::int64_t> out;
        for (const auto& x : array(key, false)) {
            if (!x.is_number_integer()) bad(key, "must hold integers");
            const std::int64_t v = x.get<std::int64_t>();
            if (v < lo || v > hi) bad(key, "entries must be between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " + std::to_string(v) + ")");
            out.push_back(v);
        }
        return out;
    }
    std::vector<bool> bool_list(const char* key) const {
        std::vector<bool> out;
        for (const auto& x : array(key, false)) {
            if (!x.is_boolean()) bad(key, "must hold true/false");
            out.push_back(x.get<bool>());
        }
        return out;
    }
    In at(const char* key, std::size_t i, const json& v) const { return In(v, (path_.empty() ? "" : path_ + ".") + key + "[" + std::to_string(i) + "]", origin_); }
    In sub(const char* key, const json& v) const { return In(v, (path_.empty() ? "" : path_ + ".") + key, origin_); }

private:
    const json& j_;
    std::string path_;
    std::string_view origin_;
};

Block read_block(const In& in) {
    Block b;
    b.name = in.string("name", std::nullopt);
    b.repeat = in.integer("repeat", 1, 1, 1 << 20);
    b.checkpointable = in.boolean("checkpointable", false);
    b.linear_attention = in.boolean("linear_attention", false);
    const json& params = in.array("params", false);
    for (std::size_t i = 0; i < params.size(); ++i) {
        const In p = in.at("params", i, params[i]);
        Param x;
        x.name = p.string("name", std::nullopt);
        x.shape = p.ints("shape", 1, kMaxCount);
        if (x.shape.empty()) p.bad("shape", "must list at least one dimension");
        x.count = p.integer("count", 1, 1, kMaxCount);
        const std::string dt = p.string("dtype", std::string("float32"));
        const auto d = parse_dtype(dt);
        if (!d) p.bad("dtype", "is not a dtype gpumem knows (\"" + dt + "\")");
        x.dtype = *d;
        x.component = p.enumerated("component", std::optional<Component>(Component::Other), kComponents, component_name);
        x.trainable = p.boolean("trainable", true);
        x.linear_weight = p.boolean("linear_weight", false);
        x.output_head = p.boolean("output_head", false);
        x.tp_replicated = p.boolean("tp_replicated", false);
        x.module = p.string("module", std::string());
        std::int64_t elements = 0;
        try {
            elements = x.numel();
        } catch (const std::exception&) {
            p.bad("shape", "has more elements than gpumem can count");
        }
        if (elements > kMaxCount * 64) p.bad("shape", "has more than 2^46 elements");
        b.params.push_back(std::move(x));
    }
    const json& tensors = in.array("tensors", true);
    if (tensors.empty()) in.bad("tensors", "must hold the block input first");
    const auto nt = static_cast<std::int64_t>(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const In t = in.at("tensors", i, tensors[i]);
        TensorInfo x;
        x.name = t.string("name", std::nullopt);
        x.extent = t.extent("extent");
        x.role = t.enumerated("role", std::optional<ActRole>(ActRole::Stream), kRoles, role_name);
        x.alias_of = static_cast<TensorId>(t.integer("alias_of", -1, -1, static_cast<std::int64_t>(i) - 1));
        x.shared_key = t.string("shared_key", std::string());
        x.axis = t.enumerated("axis", std::optional<SeqAxis>(SeqAxis::Main), kAxes, axis_name);
        x.per_batch = t.boolean("per_batch", true);
        b.tensors.push_back(std::move(x));
    }
    const auto np = static_cast<std::int64_t>(b.params.size());
    const json& ops = in.array("ops", false);
    for (std::size_t i = 0; i < ops.size(); ++i) {
        const In o = in.at("ops", i, ops[i]);
        Op x;
        x.kind = o.enumerated("kind", std::optional<OpKind>(), kOpKinds, op_kind_name);
        x.name = o.string("name", std::string());
        for (auto t : o.ints("inputs", 0, nt - 1)) x.inputs.push_back(static_cast<TensorId>(t));
        for (auto t : o.ints("outputs", 0, nt - 1)) x.outputs.push_back(static_cast<TensorId>(t));
        const json& saved = o.array("saved", false);
        for (std::size_t k = 0; k < saved.size(); ++k) {
            const In s = o.at("saved", k, saved[k]);
            SavedRef r;
            r.tensor = static_cast<TensorId>(s.integer("tensor", std::nullopt, 0, nt - 1));
            r.autocast_cast = s.boolean("autocast_cast", false);
            r.only_for_param_grad = s.boolean("only_for_param_grad", false);
            x.saved.push_back(r);
        }
        for (auto p : o.ints("params", 0, np - 1)) x.params.push_back(static_cast<std::int32_t>(p));
        x.flops = o.extent("flops");
        x.flags = static_cast<std::uint8_t>(o.integer("flags", 0, 0, 255));
        x.in_features = o.integer("in_features", 0, 0);
        x.out_features = o.integer("out_features", 0, 0);
        x.chunks = o.integer("chunks", 1, 1, 1 << 20);
        b.ops.push_back(std::move(x));
    }
    const json& att = in.array("attention", false);
    for (std::size_t i = 0; i < att.size(); ++i) {
        const In a = in.at("attention", i, att[i]);
        AttentionSite s;
        s.q = static_cast<TensorId>(a.integer("q", std::nullopt, 0, nt - 1));
        s.k = static_cast<TensorId>(a.integer("k", std::nullopt, 0, nt - 1));
        s.v = static_cast<TensorId>(a.integer("v", std::nullopt, 0, nt - 1));
        s.out = static_cast<TensorId>(a.integer("out", std::nullopt, 0, nt - 1));
        s.heads = a.integer("heads", 0, 0, 1 << 20);
        s.causal = a.boolean("causal", false);
        b.attention.push_back(s);
    }
    b.output = static_cast<TensorId>(in.integer("output", 0, 0, nt - 1));
    return b;
}

TransformerDims read_transformer(const In& in) {
    TransformerDims d;
    d.layers = in.integer("layers", std::nullopt, 1, 1 << 20);
    d.hidden = in.integer("hidden", std::nullopt, 1, 1 << 24);
    d.heads = in.integer("heads", 0, 0, 1 << 20);
    d.kv_heads = in.integer("kv_heads", 0, 0, 1 << 20);
    d.head_dim = in.integer("head_dim", 0, 0, 1 << 20);
    d.intermediate = in.integer("intermediate", 0, 0, 1 << 26);
    d.vocab = in.integer("vocab", 0, 0, 1 << 26);
    d.experts = in.integer("experts", 0, 0, 1 << 20);
    d.experts_per_token = in.integer("experts_per_token", 0, 0, 1 << 20);
    d.kv_elements_per_token = in.integer("kv_elements_per_token", 0, 0);
    d.latent_kv = in.boolean("latent_kv", false);
    d.sliding_window = in.integer("sliding_window", 0, 0, 1 << 30);
    d.sliding_layers = in.bool_list("sliding_layers");
    d.attention_chunk = in.integer("attention_chunk", 0, 0, 1 << 30);
    d.chunked_layers = in.bool_list("chunked_layers");
    d.rotary_dim = in.integer("rotary_dim", 0, 0, 1 << 20);
    d.rope_configs = in.integer("rope_configs", 1, 1, 16);
    d.rope_fp32 = in.boolean("rope_fp32", false);
    d.encoder_decoder = in.boolean("encoder_decoder", false);
    d.linear_layers = in.bool_list("linear_layers");
    d.linear_conv_dim = in.integer("linear_conv_dim", 0, 0, 1 << 26);
    d.linear_conv_kernel = in.integer("linear_conv_kernel", 0, 0, 1 << 10);
    d.linear_v_heads = in.integer("linear_v_heads", 0, 0, 1 << 20);
    d.linear_k_dim = in.integer("linear_k_dim", 0, 0, 1 << 20);
    d.linear_v_dim = in.integer("linear_v_dim", 0, 0, 1 << 20);
    for (const auto* v : {&d.sliding_layers, &d.chunked_layers, &d.linear_layers})
        if (!v->empty() && static_cast<std::int64_t>(v->size()) != d.layers)
            in.bad(v == &d.sliding_layers ? "sliding_layers" : v == &d.chunked_layers ? "chunked_layers" : "linear_layers",
                   "must list one flag per layer (" + std::to_string(d.layers) + ") or be empty");
    if (d.kv_heads > 0 && d.heads > 0 && d.heads % d.kv_heads != 0) in.bad("kv_heads", "must divide heads");
    return d;
}

WeightQuant read_quant(const In& in) {
    WeightQuant q;
    q.method = in.string("method", std::nullopt);
    q.scheme = in.string("scheme", std::nullopt);
    q.bits = in.integer("bits", 8, 1, 32);
    q.group_size = in.integer("group_size", 0, 0, 1 << 20);
    q.block_n = in.integer("block_n", 0, 0, 1 << 20);
    q.block_k = in.integer("block_k", 0, 0, 1 << 20);
    q.act_order = in.boolean("act_order", false);
    q.zero_point = in.boolean("zero_point", false);
    q.lm_head = in.boolean("lm_head", false);
    const json& ig = in.array("ignore", false);
    for (const auto& x : ig) {
        if (!x.is_string()) in.bad("ignore", "must hold module names");
        q.ignore.push_back(x.get<std::string>());
    }
    return q;
}

}  // namespace

bool is_graph_json(const json& doc) {
    return doc.is_object() && doc.contains("format") && doc["format"].is_string() && doc["format"].get<std::string>() == kGraphFormat;
}

json graph_to_json(const ModelGraph& g) {
    json out = json::object();
    out["format"] = kGraphFormat;
    out["version"] = kGraphFormatVersion;
    out["name"] = g.name;
    out["family"] = g.family;
    out["source"] = g.source;
    out["notes"] = g.notes;
    out["max_positions"] = g.max_positions;
    out["has_sequence"] = g.has_sequence;
    out["loss_in_forward"] = g.loss_in_forward;
    out["params_only"] = g.params_only;
    json blocks = json::array();
    for (const Block& b : g.blocks) {
        json jb = {{"name", b.name}, {"repeat", b.repeat}, {"checkpointable", b.checkpointable}, {"linear_attention", b.linear_attention}, {"output", b.output}};
        json params = json::array();
        for (const Param& p : b.params)
            params.push_back({{"name", p.name},
                              {"shape", p.shape},
                              {"count", p.count},
                              {"dtype", std::string(dtype_name(p.dtype))},
                              {"component", component_name(p.component)},
                              {"trainable", p.trainable},
                              {"linear_weight", p.linear_weight},
                              {"output_head", p.output_head},
                              {"tp_replicated", p.tp_replicated},
                              {"module", p.module}});
        json tensors = json::array();
        for (const TensorInfo& t : b.tensors)
            tensors.push_back({{"name", t.name},
                               {"extent", extent_json(t.extent)},
                               {"role", role_name(t.role)},
                               {"alias_of", t.alias_of},
                               {"shared_key", t.shared_key},
                               {"axis", axis_name(t.axis)},
                               {"per_batch", t.per_batch}});
        json ops = json::array();
        for (const Op& o : b.ops) {
            json saved = json::array();
            for (const SavedRef& s : o.saved)
                saved.push_back({{"tensor", s.tensor}, {"autocast_cast", s.autocast_cast}, {"only_for_param_grad", s.only_for_param_grad}});
            ops.push_back({{"kind", op_kind_name(o.kind)},
                           {"name", o.name},
                           {"inputs", o.inputs},
                           {"outputs", o.outputs},
                           {"saved", saved},
                           {"params", o.params},
                           {"flops", extent_json(o.flops)},
                           {"flags", o.flags},
                           {"in_features", o.in_features},
                           {"out_features", o.out_features},
                           {"chunks", o.chunks}});
        }
        json att = json::array();
        for (const AttentionSite& a : b.attention)
            att.push_back({{"q", a.q}, {"k", a.k}, {"v", a.v}, {"out", a.out}, {"heads", a.heads}, {"causal", a.causal}});
        jb["params"] = std::move(params);
        jb["tensors"] = std::move(tensors);
        jb["ops"] = std::move(ops);
        jb["attention"] = std::move(att);
        blocks.push_back(std::move(jb));
    }
    out["blocks"] = std::move(blocks);
    if (g.transformer) {
        const TransformerDims& d = *g.transformer;
        out["transformer"] = {{"layers", d.layers},
                              {"hidden", d.hidden},
                              {"heads", d.heads},
                              {"kv_heads", d.kv_heads},
                              {"head_dim", d.head_dim},
                              {"intermediate", d.intermediate},
                              {"vocab", d.vocab},
                              {"experts", d.experts},
                              {"experts_per_token", d.experts_per_token},
                              {"kv_elements_per_token", d.kv_elements_per_token},
                              {"latent_kv", d.latent_kv},
                              {"sliding_window", d.sliding_window},
                              {"sliding_layers", bools(d.sliding_layers)},
                              {"attention_chunk", d.attention_chunk},
                              {"chunked_layers", bools(d.chunked_layers)},
                              {"rotary_dim", d.rotary_dim},
                              {"rope_configs", d.rope_configs},
                              {"rope_fp32", d.rope_fp32},
                              {"encoder_decoder", d.encoder_decoder},
                              {"linear_layers", bools(d.linear_layers)},
                              {"linear_conv_dim", d.linear_conv_dim},
                              {"linear_conv_kernel", d.linear_conv_kernel},
                              {"linear_v_heads", d.linear_v_heads},
                              {"linear_k_dim", d.linear_k_dim},
                              {"linear_v_dim", d.linear_v_dim}};
    } else {
        out["transformer"] = nullptr;
    }
    if (g.weight_quant) {
        const WeightQuant& q = *g.weight_quant;
        out["weight_quant"] = {{"method", q.method},       {"scheme", q.scheme},     {"bits", q.bits},
                               {"group_size", q.group_size}, {"block_n", q.block_n},  {"block_k", q.block_k},
                               {"act_order", q.act_order},   {"zero_point", q.zero_point}, {"lm_head", q.lm_head},
                               {"ignore", q.ignore}};
    } else {
        out["weight_quant"] = nullptr;
    }
    json counts = json::array();
    for (const auto& [dt, n] : g.header_dtype_counts) counts.push_back(json::array({std::string(dtype_name(dt)), n}));
    out["header_dtype_counts"] = std::move(counts);
    return out;
}

Result<ModelGraph> graph_from_json(const json& doc, std::string_view origin) {
    return capture([&]() -> ModelGraph {
        const In in(doc, "", origin);
        if (!doc.is_object()) in.bad("", "a model graph file must be a JSON object");
        if (!is_graph_json(doc))
            fail(ErrorCode::ParseError, "format", std::string(origin) + ": \"format\" must be \"" + std::string(kGraphFormat) + "\"");
        const std::int64_t version = in.integer("version", std::nullopt, 0, std::numeric_limits<std::int32_t>::max());
        if (version != kGraphFormatVersion)
            fail(ErrorCode::Unsupported, "version",
                 std::string(origin) + ": model graph version " + std::to_string(version) + "; this gpumem reads version " +
                     std::to_string(kGraphFormatVersion) + " (write the file again with this gpumem's tracer or importer)");
        ModelGraph g;
        g.name = in.string("name", std::nullopt);
        g.family = in.string("family", std::string("graph"));
        g.source = in.string("source", std::string("model graph"));
        for (const auto& n : in.array("notes", false)) {
            if (!n.is_string()) in.bad("notes", "must hold strings");
            g.notes.push_back(n.get<std::string>());
        }
        g.max_positions = in.integer("max_positions", 0, 0, std::int64_t{1} << 31);
        g.has_sequence = in.boolean("has_sequence", true);
        g.loss_in_forward = in.boolean("loss_in_forward", false);
        g.params_only = in.integer("params_only", 0, 0, kMaxCount * 64);
        const json& blocks = in.array("blocks", g.params_only == 0);
        if (blocks.empty() && g.params_only == 0) in.bad("blocks", "must hold at least one block");
        for (std::size_t i = 0; i < blocks.size(); ++i) g.blocks.push_back(read_block(in.at("blocks", i, blocks[i])));
        if (const json* t = in.find("transformer")) g.transformer = read_transformer(in.sub("transformer", *t));
        if (const json* q = in.find("weight_quant")) g.weight_quant = read_quant(in.sub("weight_quant", *q));
        const json& counts = in.array("header_dtype_counts", false);
        for (std::size_t i = 0; i < counts.size(); ++i) {
            const json& c = counts[i];
            if (!c.is_array() || c.size() != 2 || !c[0].is_string() || !c[1].is_number_integer() || c[1].get<std::int64_t>() < 0)
                in.bad("header_dtype_counts", "entries must be [dtype, count]");
            const auto d = parse_dtype(c[0].get<std::string>());
            if (!d) in.bad("header_dtype_counts", "names a dtype gpumem does not know");
            g.header_dtype_counts.emplace_back(*d, c[1].get<std::int64_t>());
        }
        return g;
    });
}

}  // namespace gpumem
