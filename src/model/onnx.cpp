// src/model/onnx.cpp — ONNX graph reader (gpumem/model/onnx.hpp).
//
// Three passes over the parsed ModelProto:
//   1. index: values (graph inputs, initializers, node outputs), their
//      producers and consumers; initializers split into parameters and
//      buffers by how the graph uses them (docs/research/onnx.md §7);
//   2. probes: the graph is run on shapes only (plus the values of small
//      integer tensors, for the Shape→Gather→Concat→Reshape chains) at a few
//      (batch, seq) points, with strides, so that views and copies are told
//      apart as ATen's view/reshape would (computeStride semantics);
//   3. lowering: one model-graph op per node (GELU's Erf chain and SiLU's
//      x·sigmoid(x) matched as one op), saved tensors per torch 1.13's
//      derivatives.yaml (docs/research/onnx.md §5 cites the lines), sizes
//      fitted to b·(c0 + c1·s + c2·s²).
// Every input is validated (counts, attributes, ranks, data sizes) and an
// error names the node (index, name, op_type) or the field.
#include "gpumem/model/onnx.hpp"
#include "gpumem/core/input.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx.pb.h>  // generated from onnx/onnx.proto by protoc (CMakeLists.txt)

#include "gpumem/model/builder.hpp"

namespace gpumem {

namespace {

using I64 = std::int64_t;
using Shape = std::vector<I64>;

constexpr int kMaxRank = 8;
constexpr I64 kMaxDataElems = 4096;  // values kept for shape arithmetic
constexpr I64 kMaxNodes = 200000;

// onnx.proto TensorProto.DataType
enum : int { kFloat = 1, kU8 = 2, kI8 = 3, kU16 = 4, kI16 = 5, kI32 = 6, kI64 = 7, kString = 8, kBool = 9, kF16 = 10, kF64 = 11, kU32 = 12, kU64 = 13, kBF16 = 16 };

bool is_float(int dt) { return dt == kFloat || dt == kF16 || dt == kF64 || dt == kBF16; }
bool is_int(int dt) { return dt == kU8 || dt == kI8 || dt == kU16 || dt == kI16 || dt == kI32 || dt == kI64 || dt == kBool || dt == kU32 || dt == kU64; }
I64 elem_size(int dt) {
    switch (dt) {
        case kU8: case kI8: case kBool: return 1;
        case kU16: case kI16: case kF16: case kBF16: return 2;
        case kFloat: case kI32: case kU32: return 4;
        case kI64: case kF64: case kU64: return 8;
        default: return 0;
    }
}

I64 numel(const Shape& s) {
    I64 n = 1;
    for (auto d : s) n = checked_mul(n, d);
    return n;
}
Shape contiguous(const Shape& s) {
    Shape st(s.size(), 1);
    for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = checked_mul(st[i], std::max<I64>(1, s[i]));
    return st;
}
std::string shape_str(const Shape& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

// ATen's view rule (TensorUtils computeStride): the new shape is a view of
// (shape, stride) when every run of dims it merges or splits is contiguous
// within itself. Returns the view's strides, or nullopt (reshape copies).
std::optional<Shape> view_strides(const Shape& shape, const Shape& stride, const Shape& to) {
    if (numel(shape) == 0 || shape.empty()) return contiguous(to);
    Shape out(to.size(), 1);
    auto view_d = static_cast<std::int64_t>(to.size()) - 1;
    I64 chunk = stride.back(), tensor_n = 1, view_n = 1;
    for (auto td = static_cast<std::int64_t>(shape.size()) - 1; td >= 0; --td) {
        const auto u = static_cast<std::size_t>(td);
        tensor_n = checked_mul(tensor_n, shape[u]);
        if (td == 0 || (shape[u - 1] != 1 && stride[u - 1] != checked_mul(tensor_n, chunk))) {
            while (view_d >= 0 && (view_n < tensor_n || to[static_cast<std::size_t>(view_d)] == 1)) {
                out[static_cast<std::size_t>(view_d)] = checked_mul(view_n, chunk);
                view_n = checked_mul(view_n, to[static_cast<std::size_t>(view_d)]);
                --view_d;
            }
            if (view_n != tensor_n) return std::nullopt;
            if (td > 0) {
                chunk = stride[u - 1];
                tensor_n = 1;
                view_n = 1;
            }
        }
    }
    if (view_d != -1) return std::nullopt;
    return out;
}

// One value at one probe.
struct PV {
    bool set = false;
    int dtype = 0;
    Shape shape, stride;
    int root = -1;  // value whose storage this one is (itself when new)
    bool has_data = false;
    std::vector<double> data;  // small tensors: integers and scalars
};

enum class VKind : std::uint8_t { Input, Param, Buffer, Node };

struct Value {
    std::string name;
    VKind kind = VKind::Node;
    const onnx::TensorProto* init = nullptr;  // initializer (or Identity of one)
    int alias_init = -1;                       // Identity(initializer): the initializer's value
    int producer = -1;                         // node index
    std::vector<std::pair<int, int>> uses;     // (node, input slot)
    bool graph_output = false;
};

class Reader {
public:
    Reader(const onnx::ModelProto& m, std::string origin, OnnxOptions opts)
        : g_(m.graph()), origin_(std::move(origin)), opts_(std::move(opts)) {}
    ModelGraph run();

private:
    const onnx::GraphProto& g_;
    std::string origin_;
    OnnxOptions opts_;
    std::vector<Value> vals_;
    std::unordered_map<std::string, int> by_name_;
    std::vector<std::vector<int>> node_in_, node_out_;  // value ids (-1: omitted optional input)
    int cur_node_ = -1;
    bool has_seq_ = false;
    std::map<std::pair<int, int>, int> sym_dims_;  // (input value, dim) -> 0 batch, 1 sequence
    std::vector<std::vector<PV>> probes_;
    std::vector<std::string> notes_;

    [[noreturn]] void node_fail(const std::string& why) const {
        const auto& n = g_.node(cur_node_);
        fail(ErrorCode::Unsupported, "graph.node[" + std::to_string(cur_node_) + "]",
             origin_ + ": node " + std::to_string(cur_node_) + " '" + n.name() + "' (" + n.op_type() + "): " + why);
    }
    [[noreturn]] void bad(const std::string& field, const std::string& why) const {
        fail(ErrorCode::ParseError, field, origin_ + ": " + field + ": " + why);
    }
    int value_id(const std::string& name, bool create);
    void index();
    void classify_initializers();
    void probe(I64 b, I64 s, std::vector<PV>& pv);
    void eval_node(int ni, std::vector<PV>& pv);
    ModelGraph lower();

    // attribute helpers (current node)
    const onnx::AttributeProto* attr(const char* name) const;
    I64 attr_i(const char* name, I64 def) const;
    double attr_f(const char* name, double def) const;
    std::vector<I64> attr_ints(const char* name) const;
    std::string attr_s(const char* name, const std::string& def) const;
    void decode(const onnx::TensorProto& t, PV& v, const std::string& field) const;
};

int Reader::value_id(const std::string& name, bool create) {
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
    if (!create) return -1;
    vals_.push_back(Value{name, VKind::Node, nullptr, -1, -1, {}, false});
    const int id = static_cast<int>(vals_.size() - 1);
    by_name_.emplace(name, id);
    return id;
}

const onnx::AttributeProto* Reader::attr(const char* name) const {
    const auto& n = g_.node(cur_node_);
    for (const auto& a : n.attribute())
        if (a.name() == name) return &a;
    return nullptr;
}
I64 Reader::attr_i(const char* name, I64 def) const {
    const auto* a = attr(name);
    if (!a) return def;
    if (a->type() != onnx::AttributeProto::INT) node_fail(std::string("attribute ") + name + " must be an int");
    return a->i();
}
double Reader::attr_f(const char* name, double def) const {
    const auto* a = attr(name);
    if (!a) return def;
    if (a->type() != onnx::AttributeProto::FLOAT) node_fail(std::string("attribute ") + name + " must be a float");
    return static_cast<double>(a->f());
}
std::vector<I64> Reader::attr_ints(const char* name) const {
    const auto* a = attr(name);
    if (!a) return {};
    if (a->type() != onnx::AttributeProto::INTS) node_fail(std::string("attribute ") + name + " must be ints");
    if (a->ints_size() > kMaxRank * 2) node_fail(std::string("attribute ") + name + " has too many entries");
    return {a->ints().begin(), a->ints().end()};
}
std::string Reader::attr_s(const char* name, const std::string& def) const {
    const auto* a = attr(name);
    if (!a) return def;
    if (a->type() != onnx::AttributeProto::STRING) node_fail(std::string("attribute ") + name + " must be a string");
    return a->s();
}

void Reader::decode(const onnx::TensorProto& t, PV& v, const std::string& field) const {
    v.dtype = t.data_type();
    if (elem_size(v.dtype) == 0) bad(field + ".data_type", "unsupported tensor type " + std::to_string(v.dtype));
    if (t.dims_size() > kMaxRank) bad(field + ".dims", "more than " + std::to_string(kMaxRank) + " dims");
    v.shape.clear();
    for (auto d : t.dims()) {
        if (d < 0) bad(field + ".dims", "negative dimension " + std::to_string(d));
        v.shape.push_back(d);
    }
    const I64 n = numel(v.shape);
    v.stride = contiguous(v.shape);
    v.has_data = false;
    if (t.data_location() == onnx::TensorProto::EXTERNAL || n > kMaxDataElems) return;
    std::vector<double> d;
    if (t.has_raw_data()) {
        const std::string& raw = t.raw_data();
        if (static_cast<I64>(raw.size()) != checked_mul(n, elem_size(v.dtype)))
            bad(field + ".raw_data", std::to_string(raw.size()) + " bytes for " + std::to_string(n) + " elements of type " + std::to_string(v.dtype));
        const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
        for (I64 i = 0; i < n; ++i) {
            const auto* q = p + i * elem_size(v.dtype);
            std::uint64_t u = 0;
            for (I64 k = elem_size(v.dtype); k-- > 0;) u = (u << 8) | q[k];
            double x = 0;
            switch (v.dtype) {
                case kFloat: { float f; std::uint32_t w = static_cast<std::uint32_t>(u); std::memcpy(&f, &w, 4); x = static_cast<double>(f); break; }
                case kF64: std::memcpy(&x, &u, 8); break;
                case kI64: x = static_cast<double>(static_cast<std::int64_t>(u)); break;
                case kI32: x = static_cast<double>(static_cast<std::int32_t>(static_cast<std::uint32_t>(u))); break;
                case kI8: x = static_cast<double>(static_cast<std::int8_t>(static_cast<std::uint8_t>(u))); break;
                case kI16: x = static_cast<double>(static_cast<std::int16_t>(static_cast<std::uint16_t>(u))); break;
                default: x = static_cast<double>(u); break;
            }
            d.push_back(x);
        }
    } else if (t.int64_data_size() > 0) {
        for (auto x : t.int64_data()) d.push_back(static_cast<double>(x));
    } else if (t.int32_data_size() > 0) {
        for (auto x : t.int32_data()) d.push_back(static_cast<double>(x));
    } else if (t.float_data_size() > 0) {
        for (auto x : t.float_data()) d.push_back(static_cast<double>(x));
    } else if (t.double_data_size() > 0) {
        for (auto x : t.double_data()) d.push_back(x);
    } else {
        return;  // no payload: metadata only
    }
    if (static_cast<I64>(d.size()) != n) bad(field, std::to_string(d.size()) + " values for dims " + shape_str(v.shape));
    v.data = std::move(d);
    v.has_data = true;
}

void Reader::index() {
    if (g_.node_size() > kMaxNodes) bad("graph.node", "more than " + std::to_string(kMaxNodes) + " nodes");
    for (int i = 0; i < g_.initializer_size(); ++i) {
        const auto& t = g_.initializer(i);
        const std::string f = "graph.initializer[" + std::to_string(i) + "]";
        if (t.name().empty()) bad(f + ".name", "empty");
        if (by_name_.count(t.name())) bad(f + ".name", "'" + t.name() + "' defined twice");
        const int id = value_id(t.name(), true);
        vals_[static_cast<std::size_t>(id)].kind = VKind::Param;
        vals_[static_cast<std::size_t>(id)].init = &t;
        PV probe_check;
        decode(t, probe_check, f);
    }
    int real_inputs = 0;
    for (int i = 0; i < g_.input_size(); ++i) {
        const auto& in = g_.input(i);
        if (by_name_.count(in.name())) continue;  // an initializer listed as input (IR < 4)
        const std::string f = "graph.input[" + std::to_string(i) + "]";
        if (in.name().empty()) bad(f + ".name", "empty");
        if (!in.type().has_tensor_type()) bad(f + ".type", "not a tensor");
        const auto& tt = in.type().tensor_type();
        if (elem_size(tt.elem_type()) == 0) bad(f + ".type.elem_type", "unsupported " + std::to_string(tt.elem_type()));
        const int id = value_id(in.name(), true);
        vals_[static_cast<std::size_t>(id)].kind = VKind::Input;
        const auto& sh = tt.shape();
        if (sh.dim_size() > kMaxRank || sh.dim_size() == 0) bad(f + ".type.shape", "rank must be 1.." + std::to_string(kMaxRank));
        std::map<std::string, int> names;
        for (int d = 0; d < sh.dim_size(); ++d) {
            const auto& dim = sh.dim(d);
            const bool symbolic = dim.has_dim_param() || !dim.has_dim_value() || dim.dim_value() <= 0;
            if (d == 0) {
                sym_dims_[{id, 0}] = 0;  // dim 0 is the batch, symbolic or not
                if (!symbolic && dim.dim_value() != 1)
                    notes_.push_back("input " + in.name() + " has a fixed batch " + std::to_string(dim.dim_value()) + ": read as the symbolic batch");
                continue;
            }
            if (!symbolic) {
                if (dim.dim_value() > (I64{1} << 31)) bad(f + ".type.shape.dim[" + std::to_string(d) + "]", "too large");
                continue;
            }
            if (dim.has_dim_param() && dim.dim_param() == sh.dim(0).dim_param() && sh.dim(0).has_dim_param()) {
                bad(f + ".type.shape.dim[" + std::to_string(d) + "]", "the batch symbol again");
            }
            sym_dims_[{id, d}] = 1;
            has_seq_ = true;
        }
        ++real_inputs;
    }
    if (real_inputs == 0) bad("graph.input", "no graph input besides initializers");
    node_in_.resize(static_cast<std::size_t>(g_.node_size()));
    node_out_.resize(static_cast<std::size_t>(g_.node_size()));
    for (int i = 0; i < g_.node_size(); ++i) {
        cur_node_ = i;
        const auto& n = g_.node(i);
        if (!n.domain().empty() && n.domain() != "ai.onnx") node_fail("domain '" + n.domain() + "' is not supported (standard ONNX ops only)");
        for (const auto& a : n.attribute())
            if (a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS || a.has_g())
                node_fail("subgraphs (If/Loop/Scan) are not supported");
        for (int k = 0; k < n.input_size(); ++k) {
            if (n.input(k).empty()) {
                node_in_[static_cast<std::size_t>(i)].push_back(-1);
                continue;
            }
            const int id = value_id(n.input(k), false);
            if (id < 0) node_fail("input '" + n.input(k) + "' is not defined before this node");
            vals_[static_cast<std::size_t>(id)].uses.emplace_back(i, k);
            node_in_[static_cast<std::size_t>(i)].push_back(id);
        }
        for (int k = 0; k < n.output_size(); ++k) {
            if (n.output(k).empty()) {
                node_out_[static_cast<std::size_t>(i)].push_back(-1);
                continue;
            }
            if (by_name_.count(n.output(k))) node_fail("output '" + n.output(k) + "' is defined twice");
            const int id = value_id(n.output(k), true);
            vals_[static_cast<std::size_t>(id)].producer = i;
            node_out_[static_cast<std::size_t>(i)].push_back(id);
        }
    }
    if (g_.output_size() == 0) bad("graph.output", "no graph output");
    for (int i = 0; i < g_.output_size(); ++i) {
        const int id = value_id(g_.output(i).name(), false);
        if (id < 0) bad("graph.output[" + std::to_string(i) + "]", "'" + g_.output(i).name() + "' is not produced by any node");
        vals_[static_cast<std::size_t>(id)].graph_output = true;
    }
}

// Parameters vs buffers (docs/research/onnx.md §7).
void Reader::classify_initializers() {
    auto ends_with = [](const std::string& s, std::string_view suf) {
        return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
    };
    // Identity(initializer) outputs (eval exports' value dedup) are separate tensors of the same shape.
    for (int i = 0; i < g_.node_size(); ++i) {
        const auto& n = g_.node(i);
        const auto& in = node_in_[static_cast<std::size_t>(i)];
        if (n.op_type() == "Identity" && in.size() == 1 && in[0] >= 0 && vals_[static_cast<std::size_t>(in[0])].init &&
            !node_out_[static_cast<std::size_t>(i)].empty() && node_out_[static_cast<std::size_t>(i)][0] >= 0) {
            Value& v = vals_[static_cast<std::size_t>(node_out_[static_cast<std::size_t>(i)][0])];
            v.init = vals_[static_cast<std::size_t>(in[0])].init;
            v.alias_init = in[0];
            v.kind = VKind::Param;
        }
    }
    // Slots that hold shapes, indices, masks or constants, never weights.
    auto non_weight_slot = [](const std::string& op, int slot) {
        if (op == "BatchNormalization") return slot >= 3;
        if (op == "Reshape" || op == "Expand" || op == "Tile" || op == "Unsqueeze" || op == "Squeeze" || op == "Split" ||
            op == "Pad" || op == "ReduceMean" || op == "ReduceSum" || op == "TopK")
            return slot >= 1;
        if (op == "Slice" || op == "Resize" || op == "Upsample" || op == "Dropout" || op == "Trilu") return slot >= 1;
        if (op == "Gather" || op == "GatherElements") return slot == 1;
        if (op == "Where") return slot == 0;
        if (op == "ConstantOfShape" || op == "Range" || op == "Shape" || op == "Size") return true;
        if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") return slot >= 1;
        return false;
    };
    for (std::size_t id = 0; id < vals_.size(); ++id) {
        Value& v = vals_[id];
        if (!v.init) continue;
        bool weight_use = false, any_use = false;
        for (auto [ni, slot] : v.uses) {
            const auto& op = g_.node(ni).op_type();
            if (op == "Identity" && v.alias_init < 0) continue;  // counted through its output
            any_use = true;
            if (!non_weight_slot(op, slot)) weight_use = true;
        }
        const std::string& nm = v.name;
        const bool known = ends_with(nm, "running_mean") || ends_with(nm, "running_var") || ends_with(nm, "num_batches_tracked") ||
                           ends_with(nm, "inv_freq") || nm == "attn.bias" || ends_with(nm, ".attn.bias") || ends_with(nm, "masked_bias") ||
                           ends_with(nm, "position_ids");  // load.cpp is_known_buffer's names
        const bool buffer = !is_float(v.init->data_type()) || known || (any_use && !weight_use);
        v.kind = buffer ? VKind::Buffer : VKind::Param;
    }
}

Shape broadcast(const Shape& a, const Shape& b, bool& ok) {
    const std::size_t n = std::max(a.size(), b.size());
    Shape r(n, 1);
    ok = true;
    for (std::size_t i = 0; i < n; ++i) {
        const I64 x = i < n - a.size() ? 1 : a[i - (n - a.size())];
        const I64 y = i < n - b.size() ? 1 : b[i - (n - b.size())];
        if (x != y && x != 1 && y != 1) ok = false;
        r[i] = x == 1 ? y : x;
    }
    return r;
}

void Reader::probe(I64 b, I64 s, std::vector<PV>& pv) {
    pv.assign(vals_.size(), PV{});
    for (int i = 0; i < g_.input_size(); ++i) {
        const int id = value_id(g_.input(i).name(), false);
        if (id < 0 || vals_[static_cast<std::size_t>(id)].kind != VKind::Input) continue;
        PV& v = pv[static_cast<std::size_t>(id)];
        const auto& tt = g_.input(i).type().tensor_type();
        v.dtype = tt.elem_type();
        for (int d = 0; d < tt.shape().dim_size(); ++d) {
            auto it = sym_dims_.find({id, d});
            v.shape.push_back(it == sym_dims_.end() ? tt.shape().dim(d).dim_value() : (it->second == 0 ? b : s));
        }
        v.stride = contiguous(v.shape);
        v.root = id;
        v.set = true;
    }
    for (std::size_t id = 0; id < vals_.size(); ++id)
        if (vals_[id].init && vals_[id].alias_init < 0) {
            decode(*vals_[id].init, pv[id], "initializer " + vals_[id].name);
            pv[id].root = static_cast<int>(id);
            pv[id].set = true;
        }
    for (int i = 0; i < g_.node_size(); ++i) eval_node(i, pv);
}

void Reader::eval_node(int ni, std::vector<PV>& pv) {
    cur_node_ = ni;
    const auto& n = g_.node(ni);
    const std::string& op = n.op_type();
    const auto& ins = node_in_[static_cast<std::size_t>(ni)];
    const auto& outs = node_out_[static_cast<std::size_t>(ni)];
    auto nin = [&](std::size_t k) { return k < ins.size() && ins[k] >= 0; };
    auto in = [&](std::size_t k) -> const PV& {
        if (!nin(k)) node_fail("input " + std::to_string(k) + " is missing");
        const PV& v = pv[static_cast<std::size_t>(ins[k])];
        if (!v.set) node_fail("input " + std::to_string(k) + " has no shape");
        return v;
    };
    auto need_in = [&](std::size_t lo, std::size_t hi) {
        if (ins.size() < lo || ins.size() > hi)
            node_fail("expects " + std::to_string(lo) + (lo == hi ? "" : ".." + std::to_string(hi)) + " inputs, has " + std::to_string(ins.size()));
        for (std::size_t k = 0; k < lo; ++k) (void)in(k);
    };
    auto data_of = [&](std::size_t k, const char* what) -> const std::vector<double>& {
        const PV& v = in(k);
        if (!v.has_data) node_fail(std::string(what) + " (input " + std::to_string(k) + ") is not a constant gpumem can fold");
        return v.data;
    };
    auto out_id = [&](std::size_t k) { return k < outs.size() ? outs[k] : -1; };
    if (outs.empty() || out_id(0) < 0) node_fail("has no output");
    auto set_out = [&](std::size_t k, int dtype, Shape shape) -> PV& {
        static PV sink;
        const int id = out_id(k);
        if (id < 0) { sink = PV{}; return sink; }
        if (shape.size() > static_cast<std::size_t>(kMaxRank)) node_fail("output rank " + std::to_string(shape.size()) + " exceeds " + std::to_string(kMaxRank));
        for (auto d : shape) if (d < 0) node_fail("negative output dimension in " + shape_str(shape));
        PV& o = pv[static_cast<std::size_t>(id)];
        o = PV{};
        o.set = true;
        o.dtype = dtype;
        o.stride = contiguous(shape);
        o.shape = std::move(shape);
        (void)numel(o.shape);
        o.root = id;
        return o;
    };
    auto view_out = [&](std::size_t k, const PV& src, Shape shape, Shape stride) -> PV& {
        PV& o = set_out(k, src.dtype, std::move(shape));
        o.stride = std::move(stride);
        o.root = src.root;
        return o;
    };
    auto axis_norm = [&](I64 a, std::size_t rank, const char* what) -> std::size_t {
        const auto r = static_cast<I64>(rank);
        if (a < -r || a >= r) node_fail(std::string(what) + " " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
        return static_cast<std::size_t>(a < 0 ? a + r : a);
    };
    auto small = [&](PV& o) { if (numel(o.shape) > kMaxDataElems) { o.has_data = false; o.data.clear(); } };
    auto to_i = [&](double d) -> I64 {
        if (std::isnan(d)) node_fail("a NaN where an integer is expected");
        if (d >= 9.2e18) return INT64_MAX;  // INT64_MAX as Slice's "to the end" rounds up in a double
        if (d <= -9.2e18) return INT64_MIN;
        return static_cast<I64>(d);
    };
    // reshape-style result: a view when ATen's rule allows, a copy otherwise
    auto reshape_out = [&](const PV& x, Shape to) {
        if (numel(to) != numel(x.shape)) node_fail("cannot reshape " + shape_str(x.shape) + " to " + shape_str(to));
        if (auto st = view_strides(x.shape, x.stride, to)) {
            PV& o = view_out(0, x, to, *st);
            if (x.has_data) { o.has_data = true; o.data = x.data; }
        } else {
            PV& o = set_out(0, x.dtype, to);
            if (x.has_data) { o.has_data = true; o.data = x.data; }
        }
    };
    // elementwise with broadcasting; folds small data through f
    auto binary = [&](int out_dtype, auto f) {
        need_in(2, 2);
        const PV& a = in(0);
        const PV& c = in(1);
        bool ok = true;
        Shape sh = broadcast(a.shape, c.shape, ok);
        if (!ok) node_fail("cannot broadcast " + shape_str(a.shape) + " with " + shape_str(c.shape));
        const bool fold = a.has_data && c.has_data && numel(sh) <= kMaxDataElems;
        std::vector<double> d;
        if (fold) {
            const I64 nn = numel(sh);
            const Shape st = contiguous(sh);
            auto at = [&](const PV& v, I64 flat) {
                I64 idx = 0, mul = 1;
                for (std::size_t i = v.shape.size(); i-- > 0;) {
                    const std::size_t oi = i + (sh.size() - v.shape.size());
                    const I64 coord = (flat / st[oi]) % sh[oi];
                    idx += (v.shape[i] == 1 ? 0 : coord) * mul;
                    mul *= v.shape[i];
                }
                return v.data[static_cast<std::size_t>(idx)];
            };
            for (I64 i = 0; i < nn; ++i) d.push_back(f(at(a, i), at(c, i)));
        }
        PV& o = set_out(0, out_dtype == 0 ? a.dtype : out_dtype, sh);
        if (fold) { o.has_data = true; o.data = std::move(d); }
    };
    auto unary = [&](auto f) {
        need_in(1, 1);
        const PV& x = in(0);
        PV& o = set_out(0, x.dtype, x.shape);
        if (x.has_data) { o.has_data = true; for (double v : x.data) o.data.push_back(f(v)); }
    };
    auto int_div = [&](double a, double c) {
        if (c == 0) node_fail("division by zero in shape arithmetic");
        return std::trunc(a / c);
    };

    if (op == "Constant") {
        const auto* a = attr("value");
        PV& o = set_out(0, kFloat, {});
        if (a) {
            if (a->type() != onnx::AttributeProto::TENSOR) node_fail("attribute value must be a tensor");
            decode(a->t(), o, "graph.node[" + std::to_string(ni) + "].value");
            o.stride = contiguous(o.shape);
        } else if (const auto* f = attr("value_float")) {
            o.dtype = kFloat; o.has_data = true; o.data = {static_cast<double>(f->f())};
        } else if (const auto* iv = attr("value_int")) {
            o.dtype = kI64; o.has_data = true; o.data = {static_cast<double>(iv->i())};
        } else if (const auto* is = attr("value_ints")) {
            o.dtype = kI64; o.shape = {is->ints_size()}; o.stride = {1}; o.has_data = true;
            for (auto x : is->ints()) o.data.push_back(static_cast<double>(x));
        } else if (const auto* fs = attr("value_floats")) {
            o.dtype = kFloat; o.shape = {fs->floats_size()}; o.stride = {1}; o.has_data = true;
            for (auto x : fs->floats()) o.data.push_back(static_cast<double>(x));
        } else {
            node_fail("has no value attribute gpumem reads");
        }
        o.root = out_id(0);
    } else if (op == "Identity") {
        need_in(1, 1);
        const PV& x = in(0);
        PV& o = view_out(0, x, x.shape, x.stride);
        o.has_data = x.has_data; o.data = x.data;
    } else if (op == "Cast") {
        need_in(1, 1);
        const PV& x = in(0);
        const I64 to = attr_i("to", -1);
        if (elem_size(static_cast<int>(to)) == 0) node_fail("attribute to=" + std::to_string(to) + " is not a supported type");
        PV tmp = x;
        PV& o = to == x.dtype ? view_out(0, x, x.shape, x.stride) : set_out(0, static_cast<int>(to), x.shape);
        o.dtype = static_cast<int>(to);
        if (tmp.has_data) {
            o.has_data = true; o.data = tmp.data;
            if (is_int(o.dtype)) for (auto& v : o.data) v = o.dtype == kBool ? (v != 0 ? 1 : 0) : std::trunc(v);
        }
    } else if (op == "Shape") {
        need_in(1, 1);
        const PV& x = in(0);
        const auto r = static_cast<I64>(x.shape.size());
        I64 st = attr_i("start", 0), en = attr_i("end", r);
        if (st < 0) st += r;
        if (en < 0) en += r;
        st = std::clamp<I64>(st, 0, r);
        en = std::clamp<I64>(en, 0, r);
        Shape dims(x.shape.begin() + st, x.shape.begin() + std::max(st, en));
        PV& o = set_out(0, kI64, {static_cast<I64>(dims.size())});
        o.has_data = true;
        for (auto d : dims) o.data.push_back(static_cast<double>(d));
    } else if (op == "Size") {
        need_in(1, 1);
        PV& o = set_out(0, kI64, {});
        o.has_data = true; o.data = {static_cast<double>(numel(in(0).shape))};
    } else if (op == "Gather") {
        need_in(2, 2);
        const PV& x = in(0);
        const PV& idx = in(1);
        if (x.shape.empty()) node_fail("data must have rank >= 1");
        const std::size_t ax = axis_norm(attr_i("axis", 0), x.shape.size(), "axis");
        Shape sh(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(ax));
        sh.insert(sh.end(), idx.shape.begin(), idx.shape.end());
        sh.insert(sh.end(), x.shape.begin() + static_cast<std::ptrdiff_t>(ax) + 1, x.shape.end());
        if (idx.shape.empty() && idx.has_data) {  // select: a view
            Shape st(x.stride.begin(), x.stride.begin() + static_cast<std::ptrdiff_t>(ax));
            st.insert(st.end(), x.stride.begin() + static_cast<std::ptrdiff_t>(ax) + 1, x.stride.end());
            PV& o = view_out(0, x, sh, st);
            if (x.has_data && x.shape.size() == 1) {
                I64 k = to_i(idx.data[0]);
                if (k < 0) k += x.shape[0];
                if (k < 0 || k >= x.shape[0]) node_fail("index " + std::to_string(k) + " out of range");
                o.has_data = true; o.data = {x.data[static_cast<std::size_t>(k)]};
            }
        } else {
            PV& o = set_out(0, x.dtype, sh);
            if (x.has_data && idx.has_data && x.shape.size() == 1) {
                o.has_data = true;
                for (double dk : idx.data) {
                    I64 k = to_i(dk);
                    if (k < 0) k += x.shape[0];
                    if (k < 0 || k >= x.shape[0]) node_fail("index " + std::to_string(k) + " out of range");
                    o.data.push_back(x.data[static_cast<std::size_t>(k)]);
                }
            }
        }
    } else if (op == "Unsqueeze" || op == "Squeeze") {
        need_in(1, 2);
        const PV& x = in(0);
        std::vector<I64> axes = attr_ints("axes");
        if (nin(1)) for (double d : data_of(1, "axes")) axes.push_back(to_i(d));
        Shape sh = x.shape, st = x.stride;
        if (op == "Unsqueeze") {
            const std::size_t r = x.shape.size() + axes.size();
            std::vector<std::size_t> ax;
            for (auto a : axes) ax.push_back(axis_norm(a, r, "axis"));
            std::sort(ax.begin(), ax.end());
            for (auto a : ax) {
                if (a > sh.size()) node_fail("axis out of range");
                const I64 s_in = a < st.size() ? st[a] * sh[a] : 1;
                sh.insert(sh.begin() + static_cast<std::ptrdiff_t>(a), 1);
                st.insert(st.begin() + static_cast<std::ptrdiff_t>(a), s_in);
            }
        } else {
            std::vector<std::size_t> ax;
            if (axes.empty()) { for (std::size_t i = 0; i < sh.size(); ++i) if (sh[i] == 1) ax.push_back(i); }
            else for (auto a : axes) ax.push_back(axis_norm(a, sh.size(), "axis"));
            std::sort(ax.begin(), ax.end());
            ax.erase(std::unique(ax.begin(), ax.end()), ax.end());
            for (auto it = ax.rbegin(); it != ax.rend(); ++it) {
                if (sh[*it] != 1) node_fail("cannot squeeze dim " + std::to_string(*it) + " of " + shape_str(x.shape));
                sh.erase(sh.begin() + static_cast<std::ptrdiff_t>(*it));
                st.erase(st.begin() + static_cast<std::ptrdiff_t>(*it));
            }
        }
        PV& o = view_out(0, x, sh, st);
        o.has_data = x.has_data; o.data = x.data;
    } else if (op == "Concat") {
        if (ins.empty()) node_fail("has no inputs");
        const PV& x0 = in(0);
        if (x0.shape.empty()) node_fail("inputs must have rank >= 1");
        const std::size_t ax = axis_norm(attr_i("axis", 0), x0.shape.size(), "axis");
        Shape sh = x0.shape;
        sh[ax] = 0;
        bool fold = true;
        std::vector<double> d;
        for (std::size_t k = 0; k < ins.size(); ++k) {
            const PV& x = in(k);
            if (x.shape.size() != sh.size()) node_fail("inputs differ in rank");
            for (std::size_t i = 0; i < sh.size(); ++i)
                if (i != ax && x.shape[i] != x0.shape[i]) node_fail("input " + std::to_string(k) + " " + shape_str(x.shape) + " does not match " + shape_str(x0.shape));
            sh[ax] = checked_add(sh[ax], x.shape[ax]);
            fold = fold && x.has_data && sh.size() == 1;
            if (fold) d.insert(d.end(), x.data.begin(), x.data.end());
        }
        PV& o = set_out(0, x0.dtype, sh);
        if (fold) { o.has_data = true; o.data = std::move(d); }
    } else if (op == "Slice") {
        need_in(3, 5);
        const PV& x = in(0);
        const auto& starts = data_of(1, "starts");
        const auto& ends = data_of(2, "ends");
        std::vector<double> axes, steps;
        if (nin(3)) axes = data_of(3, "axes");
        if (nin(4)) steps = data_of(4, "steps");
        if (ends.size() != starts.size() || (!axes.empty() && axes.size() != starts.size()) || (!steps.empty() && steps.size() != starts.size()))
            node_fail("starts, ends, axes and steps differ in length");
        Shape sh = x.shape, st = x.stride;
        std::vector<I64> first(sh.size(), 0), step_of(sh.size(), 1);
        for (std::size_t k = 0; k < starts.size(); ++k) {
            const std::size_t a = axis_norm(axes.empty() ? static_cast<I64>(k) : to_i(axes[k]), sh.size(), "axis");
            const I64 dim = x.shape[a];
            const I64 step = steps.empty() ? 1 : to_i(steps[k]);
            if (step == 0 || step == INT64_MIN) node_fail("step " + std::to_string(step) + " is not supported");
            I64 b0 = to_i(starts[k]), e0 = to_i(ends[k]);
            if (b0 < 0) b0 = b0 < -dim ? 0 : b0 + dim;
            if (e0 < 0) e0 = e0 < -dim ? -1 : e0 + dim;
            I64 len = 0;
            if (step > 0) {
                b0 = std::clamp<I64>(b0, 0, dim);
                e0 = std::clamp<I64>(e0, 0, dim);
                len = e0 > b0 ? (e0 - b0 + step - 1) / step : 0;
            } else {
                b0 = std::clamp<I64>(b0, 0, dim - 1);
                e0 = std::clamp<I64>(e0, -1, dim - 1);
                len = b0 > e0 ? (b0 - e0 + (-step) - 1) / (-step) : 0;
            }
            sh[a] = len;
            st[a] = checked_mul(st[a], step > 0 ? step : 1);
            first[a] = b0;
            step_of[a] = step;
        }
        const bool neg = std::any_of(step_of.begin(), step_of.end(), [](I64 v) { return v < 0; });
        PV& o = neg ? set_out(0, x.dtype, sh) : view_out(0, x, sh, st);
        if (x.has_data && x.shape.size() == 1) {
            o.has_data = true;
            for (I64 i = 0; i < sh[0]; ++i) o.data.push_back(x.data[static_cast<std::size_t>(first[0] + i * step_of[0])]);
        }
    } else if (op == "Reshape") {
        need_in(2, 2);
        const PV& x = in(0);
        const auto& spec = data_of(1, "shape");
        if (spec.size() > static_cast<std::size_t>(kMaxRank)) node_fail("shape has too many dims");
        const bool allowzero = attr_i("allowzero", 0) != 0;
        Shape to;
        int infer = -1;
        I64 known = 1;
        for (std::size_t i = 0; i < spec.size(); ++i) {
            I64 d = to_i(spec[i]);
            if (d == 0 && !allowzero) {
                if (i >= x.shape.size()) node_fail("shape copies dim " + std::to_string(i) + " the input lacks");
                d = x.shape[i];
            }
            if (d == -1) {
                if (infer >= 0) node_fail("shape has two -1 dims");
                infer = static_cast<int>(i);
                to.push_back(1);
                continue;
            }
            if (d < 0) node_fail("shape has a negative dim " + std::to_string(d));
            to.push_back(d);
            known = checked_mul(known, d);
        }
        if (infer >= 0) {
            if (known == 0 || numel(x.shape) % known != 0) node_fail("cannot reshape " + shape_str(x.shape) + " with -1 in " + shape_str(to));
            to[static_cast<std::size_t>(infer)] = numel(x.shape) / known;
        }
        reshape_out(x, to);
    } else if (op == "Flatten") {
        need_in(1, 1);
        const PV& x = in(0);
        const std::size_t ax = attr_i("axis", 1) == static_cast<I64>(x.shape.size()) ? x.shape.size() : axis_norm(attr_i("axis", 1), x.shape.size(), "axis");
        I64 a = 1, c = 1;
        for (std::size_t i = 0; i < x.shape.size(); ++i) (i < ax ? a : c) = checked_mul(i < ax ? a : c, x.shape[i]);
        reshape_out(x, {a, c});
    } else if (op == "Transpose") {
        need_in(1, 1);
        const PV& x = in(0);
        std::vector<I64> perm = attr_ints("perm");
        if (perm.empty()) for (std::size_t i = x.shape.size(); i-- > 0;) perm.push_back(static_cast<I64>(i));
        if (perm.size() != x.shape.size()) node_fail("perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(x.shape.size()));
        std::vector<char> seen(perm.size(), 0);
        Shape sh, st;
        for (auto p : perm) {
            const std::size_t a = axis_norm(p, x.shape.size(), "perm entry");
            if (seen[a]) node_fail("perm is not a permutation");
            seen[a] = 1;
            sh.push_back(x.shape[a]);
            st.push_back(x.stride[a]);
        }
        view_out(0, x, sh, st);
    } else if (op == "Expand") {
        need_in(2, 2);
        const PV& x = in(0);
        Shape want;
        for (double d : data_of(1, "shape")) want.push_back(to_i(d));
        bool ok = true;
        Shape sh = broadcast(x.shape, want, ok);
        if (!ok) node_fail("cannot expand " + shape_str(x.shape) + " to " + shape_str(want));
        Shape st(sh.size(), 0);
        for (std::size_t i = 0; i < x.shape.size(); ++i) {
            const std::size_t oi = i + sh.size() - x.shape.size();
            st[oi] = x.shape[i] == sh[oi] ? x.stride[i] : 0;
        }
        PV& o = view_out(0, x, sh, st);
        if (x.has_data && numel(x.shape) == 1 && numel(sh) <= kMaxDataElems) { o.has_data = true; o.data.assign(static_cast<std::size_t>(numel(sh)), x.data[0]); }
    } else if (op == "ConstantOfShape") {
        need_in(1, 1);
        Shape sh;
        for (double d : data_of(0, "shape")) sh.push_back(to_i(d));
        PV val;
        val.dtype = kFloat;
        val.data = {0.0};
        val.has_data = true;
        if (const auto* a = attr("value")) {
            if (a->type() != onnx::AttributeProto::TENSOR) node_fail("attribute value must be a tensor");
            decode(a->t(), val, "graph.node[" + std::to_string(ni) + "].value");
            if (!val.has_data || val.data.size() != 1) node_fail("value must hold one element");
        }
        PV& o = set_out(0, val.dtype, sh);
        if (numel(sh) <= kMaxDataElems) { o.has_data = true; o.data.assign(static_cast<std::size_t>(numel(sh)), val.data[0]); }
    } else if (op == "Range") {
        need_in(3, 3);
        const double st = data_of(0, "start").at(0), lim = data_of(1, "limit").at(0), dl = data_of(2, "delta").at(0);
        if (dl == 0) node_fail("delta 0");
        const double cnt = std::ceil((lim - st) / dl);
        if (!(cnt < 1e9)) node_fail("too many elements");
        const I64 len = std::max<I64>(0, static_cast<I64>(cnt));
        PV& o = set_out(0, in(0).dtype, {len});
        if (len <= kMaxDataElems) { o.has_data = true; for (I64 i = 0; i < len; ++i) o.data.push_back(st + static_cast<double>(i) * dl); }
    } else if (op == "Add") {
        binary(0, [](double a, double c) { return a + c; });
    } else if (op == "Sub") {
        binary(0, [](double a, double c) { return a - c; });
    } else if (op == "Mul") {
        binary(0, [](double a, double c) { return a * c; });
    } else if (op == "Div") {
        const bool integer = is_int(in(0).dtype);
        binary(0, [&](double a, double c) { return integer ? int_div(a, c) : a / c; });
    } else if (op == "Pow") {
        binary(in(0).dtype, [](double a, double c) { return std::pow(a, c); });
    } else if (op == "Max") {
        binary(0, [](double a, double c) { return std::max(a, c); });
    } else if (op == "Min") {
        binary(0, [](double a, double c) { return std::min(a, c); });
    } else if (op == "Mod") {
        binary(0, [&](double a, double c) { if (c == 0) node_fail("mod by zero"); return std::fmod(a, c); });
    } else if (op == "Equal") {
        binary(kBool, [](double a, double c) { return a == c ? 1.0 : 0.0; });
    } else if (op == "Less") {
        binary(kBool, [](double a, double c) { return a < c ? 1.0 : 0.0; });
    } else if (op == "Greater") {
        binary(kBool, [](double a, double c) { return a > c ? 1.0 : 0.0; });
    } else if (op == "LessOrEqual") {
        binary(kBool, [](double a, double c) { return a <= c ? 1.0 : 0.0; });
    } else if (op == "GreaterOrEqual") {
        binary(kBool, [](double a, double c) { return a >= c ? 1.0 : 0.0; });
    } else if (op == "And") {
        binary(kBool, [](double a, double c) { return (a != 0 && c != 0) ? 1.0 : 0.0; });
    } else if (op == "Or") {
        binary(kBool, [](double a, double c) { return (a != 0 || c != 0) ? 1.0 : 0.0; });
    } else if (op == "Not") {
        unary([](double a) { return a != 0 ? 0.0 : 1.0; });
        pv[static_cast<std::size_t>(out_id(0))].dtype = kBool;
    } else if (op == "Neg") {
        unary([](double a) { return -a; });
    } else if (op == "Abs" || op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "Erf" || op == "Gelu" || op == "Sqrt" ||
               op == "Reciprocal" || op == "Exp" || op == "Log" || op == "Cos" || op == "Sin" || op == "LeakyRelu" || op == "Elu" ||
               op == "Softplus" || op == "HardSigmoid" || op == "HardSwish" || op == "Floor" || op == "Ceil" || op == "Round") {
        need_in(1, 1);
        set_out(0, in(0).dtype, in(0).shape);
    } else if (op == "Clip") {
        need_in(1, 3);
        set_out(0, in(0).dtype, in(0).shape);
    } else if (op == "Where") {
        need_in(3, 3);
        bool ok1 = true, ok2 = true;
        Shape sh = broadcast(broadcast(in(0).shape, in(1).shape, ok1), in(2).shape, ok2);
        if (!ok1 || !ok2) node_fail("cannot broadcast the condition and both branches");
        const bool fold = in(0).has_data && in(1).has_data && in(2).has_data && in(0).shape == sh && in(1).shape == sh && in(2).shape == sh;
        PV& o = set_out(0, in(1).dtype, sh);
        if (fold) {
            o.has_data = true;
            for (std::size_t i = 0; i < in(0).data.size(); ++i) o.data.push_back(in(0).data[i] != 0 ? in(1).data[i] : in(2).data[i]);
        }
    } else if (op == "Trilu") {
        need_in(1, 2);
        if (in(0).shape.size() < 2) node_fail("input must have rank >= 2");
        set_out(0, in(0).dtype, in(0).shape);
    } else if (op == "Softmax" || op == "LogSoftmax") {
        need_in(1, 1);
        (void)axis_norm(attr_i("axis", -1), in(0).shape.size(), "axis");
        set_out(0, in(0).dtype, in(0).shape);
    } else if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceProd") {
        need_in(1, 2);
        const PV& x = in(0);
        std::vector<I64> axes = attr_ints("axes");
        if (nin(1)) for (double d : data_of(1, "axes")) axes.push_back(to_i(d));
        const bool keep = attr_i("keepdims", 1) != 0;
        std::vector<char> red(x.shape.size(), axes.empty() ? 1 : 0);
        for (auto a : axes) red[axis_norm(a, x.shape.size(), "axis")] = 1;
        Shape sh;
        for (std::size_t i = 0; i < x.shape.size(); ++i) {
            if (!red[i]) sh.push_back(x.shape[i]);
            else if (keep) sh.push_back(1);
        }
        set_out(0, x.dtype, sh);
    } else if (op == "MatMul") {
        need_in(2, 2);
        Shape a = in(0).shape, c = in(1).shape;
        if (a.empty() || c.empty()) node_fail("operands must have rank >= 1");
        const bool a1 = a.size() == 1, c1 = c.size() == 1;
        if (a1) a.insert(a.begin(), 1);
        if (c1) c.push_back(1);
        if (a.back() != c[c.size() - 2]) node_fail("inner dims differ: " + shape_str(in(0).shape) + " x " + shape_str(in(1).shape));
        bool ok = true;
        Shape batch = broadcast(Shape(a.begin(), a.end() - 2), Shape(c.begin(), c.end() - 2), ok);
        if (!ok) node_fail("batch dims do not broadcast: " + shape_str(in(0).shape) + " x " + shape_str(in(1).shape));
        Shape sh = batch;
        if (!a1) sh.push_back(a[a.size() - 2]);
        if (!c1) sh.push_back(c.back());
        set_out(0, in(0).dtype, sh);
    } else if (op == "Gemm") {
        need_in(2, 3);
        const Shape& a = in(0).shape;
        const Shape& c = in(1).shape;
        if (a.size() != 2 || c.size() != 2) node_fail("A and B must be 2-D, got " + shape_str(a) + " and " + shape_str(c));
        const bool ta = attr_i("transA", 0) != 0, tb = attr_i("transB", 0) != 0;
        const I64 m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], k2 = tb ? c[1] : c[0], nn = tb ? c[0] : c[1];
        if (k != k2) node_fail("inner dims differ: " + shape_str(a) + " x " + shape_str(c));
        set_out(0, in(0).dtype, {m, nn});
    } else if (op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool") {
        const bool conv = op == "Conv" || op == "ConvTranspose";
        need_in(conv ? 2 : 1, conv ? 3 : 1);
        const PV& x = in(0);
        if (x.shape.size() < 3) node_fail("input must be [N, C, spatial...], got " + shape_str(x.shape));
        const std::size_t sp = x.shape.size() - 2;
        Shape kernel;
        I64 out_c = x.shape[1];
        const I64 group = attr_i("group", 1);
        if (conv) {
            const Shape& w = in(1).shape;
            if (w.size() != x.shape.size()) node_fail("weight " + shape_str(w) + " does not match input " + shape_str(x.shape));
            if (group <= 0 || x.shape[1] % group != 0) node_fail("group " + std::to_string(group) + " does not divide " + std::to_string(x.shape[1]) + " channels");
            if (op == "Conv") {
                if (w[1] * group != x.shape[1]) node_fail("weight " + shape_str(w) + " expects " + std::to_string(w[1] * group) + " input channels, input has " + std::to_string(x.shape[1]));
                out_c = w[0];
            } else {
                if (w[0] != x.shape[1]) node_fail("weight " + shape_str(w) + " does not match " + std::to_string(x.shape[1]) + " input channels");
                out_c = checked_mul(w[1], group);
            }
            kernel.assign(w.begin() + 2, w.end());
        } else {
            kernel = attr_ints("kernel_shape");
        }
        if (kernel.size() != sp) node_fail("kernel_shape has " + std::to_string(kernel.size()) + " dims for " + std::to_string(sp) + " spatial dims");
        std::vector<I64> strides = attr_ints("strides"), dil = attr_ints("dilations"), pads = attr_ints("pads"), opad = attr_ints("output_padding");
        if (strides.empty()) strides.assign(sp, 1);
        if (dil.empty()) dil.assign(sp, 1);
        if (pads.empty()) pads.assign(2 * sp, 0);
        if (opad.empty()) opad.assign(sp, 0);
        if (strides.size() != sp || dil.size() != sp || pads.size() != 2 * sp || opad.size() != sp) node_fail("strides/dilations/pads do not match the spatial rank");
        const std::string ap = attr_s("auto_pad", "NOTSET");
        if (ap != "NOTSET" && ap != "VALID") node_fail("auto_pad " + ap + " is not supported");
        const bool ceil_mode = attr_i("ceil_mode", 0) != 0;
        Shape sh = {x.shape[0], out_c};
        for (std::size_t i = 0; i < sp; ++i) {
            if (kernel[i] <= 0 || strides[i] <= 0 || dil[i] <= 0 || pads[i] < 0 || pads[i + sp] < 0 || opad[i] < 0)
                node_fail("kernel, strides and dilations must be positive and pads non-negative");
            if (kernel[i] > (I64{1} << 20) || strides[i] > (I64{1} << 20) || dil[i] > (I64{1} << 20) || pads[i] > (I64{1} << 20) || pads[i + sp] > (I64{1} << 20))
                node_fail("kernel, strides, dilations or pads too large");
            const I64 ek = (kernel[i] - 1) * dil[i] + 1;
            if (op == "ConvTranspose") {
                sh.push_back(checked_add(checked_mul(strides[i], x.shape[i + 2] - 1) + opad[i] + ek, -(pads[i] + pads[i + sp])));
            } else {
                const I64 span = x.shape[i + 2] + pads[i] + pads[i + sp] - ek;
                if (span < 0) node_fail("kernel " + std::to_string(ek) + " is larger than the padded input " + shape_str(x.shape));
                sh.push_back((ceil_mode ? (span + strides[i] - 1) / strides[i] : span / strides[i]) + 1);
            }
        }
        set_out(0, x.dtype, sh);
        if (op == "MaxPool" && out_id(1) >= 0) set_out(1, kI64, sh);
    } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
        need_in(1, 1);
        Shape sh = in(0).shape;
        if (sh.size() < 3) node_fail("input must be [N, C, spatial...]");
        for (std::size_t i = 2; i < sh.size(); ++i) sh[i] = 1;
        set_out(0, in(0).dtype, sh);
    } else if (op == "BatchNormalization") {
        need_in(5, 5);
        const PV& x = in(0);
        if (x.shape.size() < 2) node_fail("input must be [N, C, ...]");
        for (std::size_t k = 1; k < 5; ++k)
            if (in(k).shape != Shape{x.shape[1]}) node_fail("input " + std::to_string(k) + " " + shape_str(in(k).shape) + " is not [" + std::to_string(x.shape[1]) + "]");
        set_out(0, x.dtype, x.shape);
        for (std::size_t k = 1; k < outs.size(); ++k) set_out(k, kFloat, {x.shape[1]});
    } else if (op == "LayerNormalization") {
        need_in(1, 3);
        const PV& x = in(0);
        const std::size_t ax = axis_norm(attr_i("axis", -1), x.shape.size(), "axis");
        Shape st(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(ax));
        for (std::size_t i = ax; i < x.shape.size(); ++i) st.push_back(1);
        for (std::size_t k = 1; k < 3; ++k)
            if (nin(k) && numel(in(k).shape) != numel(Shape(x.shape.begin() + static_cast<std::ptrdiff_t>(ax), x.shape.end())))
                node_fail("scale/bias " + shape_str(in(k).shape) + " do not match the normalized dims of " + shape_str(x.shape));
        set_out(0, x.dtype, x.shape);
        set_out(1, kFloat, st);
        set_out(2, kFloat, st);
    } else if (op == "Dropout") {
        need_in(1, 3);
        const PV& x = in(0);
        set_out(0, x.dtype, x.shape);
        set_out(1, kBool, x.shape);
    } else if (op == "Split") {
        need_in(1, 2);
        const PV& x = in(0);
        if (x.shape.empty()) node_fail("input must have rank >= 1");
        const std::size_t ax = axis_norm(attr_i("axis", 0), x.shape.size(), "axis");
        std::vector<I64> parts = attr_ints("split");
        if (nin(1)) for (double d : data_of(1, "split")) parts.push_back(to_i(d));
        if (parts.empty()) {
            const auto k = static_cast<I64>(outs.size());
            const I64 nout = attr_i("num_outputs", k);
            if (nout <= 0 || nout != k) node_fail("num_outputs does not match the outputs");
            const I64 each = (x.shape[ax] + nout - 1) / nout;
            for (I64 i = 0; i < nout; ++i) parts.push_back(std::min(each, x.shape[ax] - i * each));
        }
        if (parts.size() != outs.size()) node_fail("split has " + std::to_string(parts.size()) + " parts for " + std::to_string(outs.size()) + " outputs");
        I64 total = 0;
        for (auto p : parts) { if (p < 0) node_fail("negative split"); total = checked_add(total, p); }
        if (total != x.shape[ax]) node_fail("split sums to " + std::to_string(total) + ", dim is " + std::to_string(x.shape[ax]));
        for (std::size_t k = 0; k < outs.size(); ++k) {
            Shape sh = x.shape;
            sh[ax] = parts[k];
            view_out(k, x, sh, x.stride);
        }
    } else if (op == "Resize" || op == "Upsample") {
        need_in(1, 4);
        const PV& x = in(0);
        Shape sh = x.shape;
        const std::size_t scales_slot = op == "Upsample" ? 1 : 2;
        if (nin(3) && in(3).has_data && !in(3).data.empty()) {
            if (in(3).data.size() != sh.size()) node_fail("sizes do not match the rank");
            for (std::size_t i = 0; i < sh.size(); ++i) sh[i] = to_i(in(3).data[i]);
        } else if (nin(scales_slot) && in(scales_slot).has_data && !in(scales_slot).data.empty()) {
            const auto& sc = in(scales_slot).data;
            if (sc.size() != sh.size()) node_fail("scales do not match the rank");
            for (std::size_t i = 0; i < sh.size(); ++i) {
                if (!(sc[i] > 0 && sc[i] < 1e6)) node_fail("scale out of range");
                sh[i] = static_cast<I64>(std::floor(static_cast<double>(sh[i]) * sc[i]));
            }
        } else {
            node_fail("needs constant scales or sizes");
        }
        set_out(0, x.dtype, sh);
    } else if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") {
        need_in(2, 3);
        const std::string red = attr_s("reduction", "mean");
        set_out(0, kFloat, red == "none" ? in(1).shape : Shape{});
        if (out_id(1) >= 0) set_out(1, in(0).dtype, in(0).shape);
    } else if (op == "Tile") {
        need_in(2, 2);
        const auto& reps = data_of(1, "repeats");
        if (reps.size() != in(0).shape.size()) node_fail("repeats do not match the rank");
        Shape sh = in(0).shape;
        for (std::size_t i = 0; i < sh.size(); ++i) sh[i] = checked_mul(sh[i], to_i(reps[i]));
        set_out(0, in(0).dtype, sh);
    } else {
        node_fail("op type is not supported by gpumem's ONNX reader (docs/onnx.md lists the supported ops)");
    }
    for (auto id : outs)
        if (id >= 0) small(pv[static_cast<std::size_t>(id)]);
}

ModelGraph Reader::run() {
    index();
    classify_initializers();
    const std::vector<std::pair<I64, I64>> pts = has_seq_ ? std::vector<std::pair<I64, I64>>{{1, 6}, {1, 9}, {1, 13}, {2, 9}}
                                                          : std::vector<std::pair<I64, I64>>{{1, 1}, {2, 1}};
    probes_.resize(pts.size());
    for (std::size_t k = 0; k < pts.size(); ++k) probe(pts[k].first, pts[k].second, probes_[k]);
    return lower();
}

ModelGraph Reader::lower() {
    const std::vector<PV>& P = probes_.back();  // (2, 9): the structural probe
    const std::size_t nv = vals_.size();
    auto init_rooted = [&](int v) { return P[static_cast<std::size_t>(v)].root >= 0 && vals_[static_cast<std::size_t>(P[static_cast<std::size_t>(v)].root)].init != nullptr; };
    auto is_const = [&](int v) { return v < 0 || !P[static_cast<std::size_t>(v)].set || P[static_cast<std::size_t>(v)].has_data || init_rooted(v); };
    auto scalar_const = [&](int v) { return v >= 0 && (P[static_cast<std::size_t>(v)].has_data || init_rooted(v)) && numel(P[static_cast<std::size_t>(v)].shape) == 1; };
    auto single_use = [&](int v) { return v >= 0 && vals_[static_cast<std::size_t>(v)].uses.size() == 1 && !vals_[static_cast<std::size_t>(v)].graph_output; };
    auto producer_op = [&](int v) -> std::string { const int p = v >= 0 ? vals_[static_cast<std::size_t>(v)].producer : -1; return p >= 0 ? g_.node(p).op_type() : ""; };
    const int nn = g_.node_size();

    // Extent fit over the probes.
    auto fit = [&](int v, bool& independent) -> Extent {
        std::vector<I64> n;
        for (const auto& pr : probes_) n.push_back(numel(pr[static_cast<std::size_t>(v)].shape));
        const std::string nm = vals_[static_cast<std::size_t>(v)].name;
        Extent e;
        I64 one_b = 0, two_b = 0;
        if (has_seq_) {
            // n(s) at s = 6, 9, 13 (batch 1): divided differences.
            if ((n[1] - n[0]) % 3 != 0 || (n[2] - n[1]) % 4 != 0) goto not_poly;
            {
                const I64 d1 = (n[1] - n[0]) / 3, d2 = (n[2] - n[1]) / 4;
                if ((d2 - d1) % 7 != 0) goto not_poly;
                e.c2 = (d2 - d1) / 7;
                e.c1 = d1 - e.c2 * 15;
                e.c0 = n[0] - e.c1 * 6 - e.c2 * 36;
                one_b = n[1];
                two_b = n[3];
            }
        } else {
            e.c0 = n[0];
            one_b = n[0];
            two_b = n[1];
        }
        if (two_b == 2 * one_b) { independent = false; return e; }
        if (two_b == one_b) { independent = true; return e; }
        fail(ErrorCode::Unsupported, nm, origin_ + ": tensor '" + nm + "' (node '" + g_.node(vals_[static_cast<std::size_t>(v)].producer < 0 ? 0 : vals_[static_cast<std::size_t>(v)].producer).name() + "') does not grow linearly with the batch");
    not_poly:
        fail(ErrorCode::Unsupported, nm, origin_ + ": the size of tensor '" + nm + "' is not c0 + c1*s + c2*s^2 in the sequence length");
    };

    BlockBuilder bb("graph", 1, DType::F32);
    std::vector<TensorId> tid(nv, -1);
    std::vector<char> rg(nv, 0);
    // A 16-bit export (its float initializers fp16/bf16) states the model's own upcasts:
    // its fp32 tensors stay fp32 whatever the precision (RMSNorm's .to(float32)),
    // its 16-bit ones follow the precision. An fp32 export cannot tell them apart.
    const bool half_export = std::any_of(vals_.begin(), vals_.end(), [](const Value& v) {
        return v.init != nullptr && (v.init->data_type() == kF16 || v.init->data_type() == kBF16);
    });
    auto role_of = [half_export](int dt) {
        if (dt == kFloat && half_export) return ActRole::Float32;
        return is_float(dt) ? ActRole::Stream : (dt == kBool || dt == kU8 || dt == kI8) ? ActRole::Mask8 : ActRole::Index64;
    };
    auto make = [&](int v, ActRole role, TensorId alias = -1) -> TensorId {
        bool ind = false;
        const Extent e = fit(v, ind);
        const TensorId t = bb.tensor(vals_[static_cast<std::size_t>(v)].name, e, role, alias);
        bb.block().tensors[static_cast<std::size_t>(t)].per_batch = !ind;
        tid[static_cast<std::size_t>(v)] = t;
        return t;
    };
    auto extra = [&](const std::string& name, Extent e, ActRole role, bool ind) {
        const TensorId t = bb.tensor(name, e, role);
        bb.block().tensors[static_cast<std::size_t>(t)].per_batch = !ind;
        return t;
    };

    // Graph inputs.
    for (std::size_t v = 0; v < nv; ++v)
        if (vals_[v].kind == VKind::Input) {
            bool ind = false;
            const Extent e = fit(static_cast<int>(v), ind);
            tid[v] = bb.data(vals_[v].name, e, role_of(P[v].dtype));
        }

    // Parameters and buffers, attached to the first op that consumes them through views.
    std::vector<std::vector<std::int32_t>> attach(static_cast<std::size_t>(nn));
    auto is_view_op = [](const std::string& op) {
        return op == "Transpose" || op == "Identity" || op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Expand" || op == "Cast" ||
               op == "Flatten" || op == "Slice";
    };
    I64 n_params = 0, n_buffers = 0;
    for (std::size_t v = 0; v < nv; ++v) {
        const Value& val = vals_[v];
        if (!val.init) continue;
        bool through_identity_only = !val.uses.empty();
        for (auto [ni, slot] : val.uses) through_identity_only = through_identity_only && g_.node(ni).op_type() == "Identity" && val.alias_init < 0;
        if (through_identity_only) continue;  // counted as the Identity outputs
        Param p;
        p.name = val.name;
        for (auto d : val.init->dims()) p.shape.push_back(d);
        if (p.shape.empty()) p.shape = {1};
        if (numel(p.shape) == 0) continue;
        p.dtype = val.init->data_type() == kF16 ? DType::F16 : val.init->data_type() == kBF16 ? DType::BF16 : DType::F32;
        p.trainable = val.kind == VKind::Param;
        p.component = Component::Other;
        int at = -1;
        std::vector<int> frontier{static_cast<int>(v)};
        for (std::size_t guard = 0; !frontier.empty() && at < 0 && guard < 64; ++guard) {
            const int cur = frontier.back();
            frontier.pop_back();
            for (auto [ni, slot] : vals_[static_cast<std::size_t>(cur)].uses) {
                const auto& op = g_.node(ni).op_type();
                if (is_view_op(op) && slot == 0) {
                    for (int o : node_out_[static_cast<std::size_t>(ni)]) if (o >= 0) frontier.push_back(o);
                } else if (at < 0) {
                    at = ni;
                    if (op == "Gather") p.component = Component::Embeddings;
                    if (op == "LayerNormalization" || op == "BatchNormalization") p.component = Component::Norms;
                    if ((op == "MatMul" || op == "Gemm") && p.shape.size() == 2) p.linear_weight = true;
                }
            }
        }
        p.module = p.name.substr(0, p.name.rfind('.'));
        if (auto dot = p.module.rfind('.'); dot != std::string::npos) p.module = p.module.substr(dot + 1);
        (p.trainable ? n_params : n_buffers) += numel(p.shape);
        bb.block().params.push_back(std::move(p));
        const auto pi = static_cast<std::int32_t>(bb.block().params.size() - 1);
        if (val.kind == VKind::Param && at >= 0) attach[static_cast<std::size_t>(at)].push_back(pi);
        rg[v] = val.kind == VKind::Param ? 1 : 0;
    }

    // Fused patterns: GELU's Erf chain and SiLU.
    std::vector<char> skip(static_cast<std::size_t>(nn), 0);
    std::vector<int> fused_x(static_cast<std::size_t>(nn), -1);
    std::vector<BlockBuilder::Act> fused_act(static_cast<std::size_t>(nn), BlockBuilder::Act::GELU);
    auto only_consumer = [&](int v) -> int { return single_use(v) ? vals_[static_cast<std::size_t>(v)].uses[0].first : -1; };
    auto other_in = [&](int ni, int v) -> int {
        const auto& in = node_in_[static_cast<std::size_t>(ni)];
        if (in.size() != 2) return -2;
        return in[0] == v ? in[1] : in[1] == v ? in[0] : -2;
    };
    for (int i = 0; i < nn; ++i) {
        const auto& n = g_.node(i);
        const auto& in = node_in_[static_cast<std::size_t>(i)];
        const auto& out = node_out_[static_cast<std::size_t>(i)];
        if (in.empty() || out.empty() || in[0] < 0 || out[0] < 0) continue;
        if (n.op_type() == "Erf" && producer_op(in[0]) == "Div") {
            const int div = vals_[static_cast<std::size_t>(in[0])].producer;
            const auto& din = node_in_[static_cast<std::size_t>(div)];
            if (din.size() != 2 || !scalar_const(din[1]) || !single_use(in[0])) continue;
            const int x = din[0];
            const int add = only_consumer(out[0]);
            if (add < 0 || g_.node(add).op_type() != "Add" || !scalar_const(other_in(add, out[0]))) continue;
            const int aout = node_out_[static_cast<std::size_t>(add)][0];
            const int m1 = only_consumer(aout);
            if (m1 < 0 || g_.node(m1).op_type() != "Mul" || other_in(m1, aout) != x) continue;
            const int m1out = node_out_[static_cast<std::size_t>(m1)][0];
            const int m2 = only_consumer(m1out);
            if (m2 < 0 || g_.node(m2).op_type() != "Mul" || !scalar_const(other_in(m2, m1out))) continue;
            skip[static_cast<std::size_t>(div)] = skip[static_cast<std::size_t>(i)] = skip[static_cast<std::size_t>(add)] = skip[static_cast<std::size_t>(m1)] = 1;
            fused_x[static_cast<std::size_t>(m2)] = x;
            fused_act[static_cast<std::size_t>(m2)] = BlockBuilder::Act::GELU;
        } else if (n.op_type() == "Sigmoid") {
            const int m = only_consumer(out[0]);
            if (m < 0 || g_.node(m).op_type() != "Mul" || other_in(m, out[0]) != in[0]) continue;
            skip[static_cast<std::size_t>(i)] = 1;
            fused_x[static_cast<std::size_t>(m)] = in[0];
            fused_act[static_cast<std::size_t>(m)] = BlockBuilder::Act::SiLU;
        }
    }

    bool training_export = false, eval_norm = false;
    TensorId loss_out = -1;
    std::vector<char> linear_out(nv, 0);
    for (int i = 0; i < nn; ++i) {
        if (skip[static_cast<std::size_t>(i)]) continue;
        cur_node_ = i;
        const auto& n = g_.node(i);
        const std::string& op = n.op_type();
        const std::string name = n.name().empty() ? op + "_" + std::to_string(i) : n.name();
        const auto& ins = node_in_[static_cast<std::size_t>(i)];
        const auto& outs = node_out_[static_cast<std::size_t>(i)];
        auto I = [&](std::size_t k) { return k < ins.size() ? ins[k] : -1; };
        auto O = [&](std::size_t k) { return k < outs.size() ? outs[k] : -1; };
        auto T = [&](int v) { return v >= 0 ? tid[static_cast<std::size_t>(v)] : -1; };
        auto R = [&](int v) { return v >= 0 && rg[static_cast<std::size_t>(v)] != 0; };
        auto sv = [&](std::vector<SavedRef>& s, int v, bool param_only = false, bool cast = false) {
            if (T(v) >= 0) s.push_back(SavedRef{T(v), cast, param_only});
        };
        bool all_const = true;
        for (int o : outs) all_const = all_const && is_const(o);
        if (all_const) continue;
        bool any_rg = !attach[static_cast<std::size_t>(i)].empty();
        for (int v : ins) any_rg = any_rg || R(v);
        for (int o : outs)
            if (o >= 0) rg[static_cast<std::size_t>(o)] = any_rg && is_float(P[static_cast<std::size_t>(o)].dtype) ? 1 : 0;
        std::vector<TensorId> in_t;
        for (int v : ins) if (T(v) >= 0) in_t.push_back(T(v));
        const int x = I(0);
        const PV* px = x >= 0 ? &P[static_cast<std::size_t>(x)] : nullptr;
        auto new_out = [&](std::size_t k, ActRole role) -> TensorId {
            const int o = O(k);
            if (o < 0 || is_const(o)) return -1;
            return make(o, role);
        };
        auto finish = [&](OpKind kind, std::vector<TensorId> out_t, std::vector<SavedRef> saved) -> Op& {
            Op& o = bb.op(kind, name, in_t, std::move(out_t), std::move(saved));
            o.params = attach[static_cast<std::size_t>(i)];
            return o;
        };
        auto simple = [&](OpKind kind, ActRole role, std::vector<SavedRef> saved) {
            std::vector<TensorId> out_t;
            for (std::size_t k = 0; k < outs.size(); ++k)
                if (TensorId t = new_out(k, k == 0 ? role : role_of(P[static_cast<std::size_t>(O(k))].dtype)); t >= 0) out_t.push_back(t);
            return &finish(kind, std::move(out_t), std::move(saved));
        };
        // a reshaped/viewed operand: the same storage when ATen can view it, else a copy
        auto folded = [&](int v, const Shape& to) -> TensorId {
            if (T(v) < 0) return -1;
            const PV& p = P[static_cast<std::size_t>(v)];
            if (numel(to) == numel(p.shape) && view_strides(p.shape, p.stride, to)) return T(v);
            const TensorId c = bb.tensor(vals_[static_cast<std::size_t>(v)].name + ".contiguous", bb.info(T(v)).extent, bb.info(T(v)).role);
            bb.block().tensors[static_cast<std::size_t>(c)].per_batch = bb.info(T(v)).per_batch;
            bb.op(OpKind::Elementwise, name + ".contiguous", {T(v)}, {c});
            return c;
        };
        if (fused_x[static_cast<std::size_t>(i)] >= 0) {
            const int fx = fused_x[static_cast<std::size_t>(i)];
            const TensorId xt = T(fx);
            const TensorId out = new_out(0, xt >= 0 ? bb.info(xt).role : ActRole::Stream);
            rg[static_cast<std::size_t>(O(0))] = R(fx) ? 1 : 0;
            std::vector<SavedRef> s;
            if (R(fx)) sv(s, fx);
            Op& o = bb.op(OpKind::Activation, name, {xt}, {out}, std::move(s));
            o.params = attach[static_cast<std::size_t>(i)];
            continue;
        }
        const bool view_like = op == "Identity" || op == "Unsqueeze" || op == "Squeeze" || op == "Transpose" || op == "Slice" || op == "Expand" ||
                               op == "Split" || op == "Reshape" || op == "Flatten" || op == "Cast" ||
                               (op == "Gather" && !init_rooted(x) && I(1) >= 0 && P[static_cast<std::size_t>(I(1))].shape.empty() &&
                                P[static_cast<std::size_t>(I(1))].has_data);
        if (op == "Add" && ins.size() == 2) {
            // nn.Linear on >2-D: matmul then an in-place bias add (at::linear, ATen Linear.cpp @v1.13.1)
            for (int k = 0; k < 2; ++k) {
                const int a = ins[static_cast<std::size_t>(k)], c = ins[static_cast<std::size_t>(1 - k)];
                if (a >= 0 && linear_out[static_cast<std::size_t>(a)] && single_use(a) && init_rooted(c) && P[static_cast<std::size_t>(c)].shape.size() == 1 && T(a) >= 0) {
                    const TensorId out = make(O(0), bb.info(T(a)).role, T(a));
                    finish(OpKind::Add, {out}, {});
                    goto next_node;
                }
            }
        }
        if (view_like) {
            std::vector<TensorId> out_t;
            const TensorId src = T(x);
            for (std::size_t k = 0; k < outs.size(); ++k) {
                const int o = O(k);
                if (o < 0 || is_const(o)) continue;
                const bool same = P[static_cast<std::size_t>(o)].root == P[static_cast<std::size_t>(x)].root && src >= 0;
                // A float-to-float Cast shares its source's storage whenever both resolve to
                // one dtype (the model graph's alias_of: `.to()` returns its input then). The
                // fp32 copy softmax(x, dtype=float32) makes is none for CUDA fp16 (ATen's fused
                // half_to_float kernel, aten/src/ATen/native/SoftMax.cpp).
                const bool cast = op == "Cast" && src >= 0 && is_float(P[static_cast<std::size_t>(o)].dtype) && is_float(P[static_cast<std::size_t>(x)].dtype);
                ActRole role = same ? bb.info(src).role : role_of(P[static_cast<std::size_t>(o)].dtype);
                if (cast && role == ActRole::Float32)
                    for (const auto& [use, slot] : vals_[static_cast<std::size_t>(o)].uses)
                        if (slot == 0 && (g_.node(use).op_type() == "Softmax" || g_.node(use).op_type() == "LogSoftmax")) role = ActRole::Float32UnlessHalf;
                out_t.push_back(make(o, role, same || cast ? src : -1));
            }
            bool any_new = false;
            for (auto t : out_t) any_new = any_new || bb.info(t).alias_of < 0;
            finish(op == "Cast" ? OpKind::Cast : any_new ? OpKind::Elementwise : OpKind::View, std::move(out_t), {});
            continue;
        }
        if (op == "MatMul" || op == "Gemm") {
            const int a = I(0), c = I(1);
            const PV& pa = P[static_cast<std::size_t>(a)];
            const PV& pc = P[static_cast<std::size_t>(c)];
            const TensorId out = new_out(0, ActRole::Lowered);
            std::vector<SavedRef> s;
            const bool ta = op == "Gemm" && attr_i("transA", 0) != 0, tb = op == "Gemm" && attr_i("transB", 0) != 0;
            if (init_rooted(c) && pc.shape.size() == 2 && !init_rooted(a)) {
                // addmm / mm on input.view(-1, in): saves the (folded) input for the weight grad
                const I64 in_f = tb ? pc.shape[1] : pc.shape[0], out_f = tb ? pc.shape[0] : pc.shape[1];
                const TensorId af = pa.shape.size() >= 3 ? folded(a, {numel(pa.shape) / std::max<I64>(1, pa.shape.back()), pa.shape.back()}) : T(a);
                if (af >= 0) s.push_back(SavedRef{af, true, true});
                Op& o = finish(OpKind::Linear, {out}, std::move(s));
                o.in_features = in_f;
                o.out_features = out_f;
                if (out >= 0) o.flops = extent_mul(bb.info(out).extent, checked_mul(2, in_f));
                if (O(0) >= 0) linear_out[static_cast<std::size_t>(O(0))] = 1;
                continue;
            }
            (void)ta;
            TensorId af = T(a), cf = T(c);
            const std::size_t ra = pa.shape.size(), rc = pc.shape.size();
            if (op == "MatMul" && (ra >= 3 || rc >= 3)) {
                if (rc <= 2) {
                    af = folded(a, {numel(pa.shape) / std::max<I64>(1, pa.shape.back()), pa.shape.back()});
                } else {
                    // matmul → expand + reshape to [batch, n, m] + bmm (ATen LinearAlgebra.cpp matmul @v1.13.1)
                    const Shape& po = P[static_cast<std::size_t>(O(0))].shape;
                    I64 batch = 1;
                    for (std::size_t k = 0; k + 2 < po.size(); ++k) batch = checked_mul(batch, po[k]);
                    auto fold3 = [&](int v, const PV& p) -> TensorId {
                        if (T(v) < 0) return -1;
                        const I64 rows = p.shape.size() >= 2 ? p.shape[p.shape.size() - 2] : 1;
                        I64 own = 1;
                        for (std::size_t k = 0; k + 2 < p.shape.size(); ++k) own = checked_mul(own, p.shape[k]);
                        if (own != batch) return folded(v, {-1});  // broadcast batch: expand + reshape copies
                        return folded(v, {batch, rows, p.shape.back()});
                    };
                    af = fold3(a, pa);
                    cf = fold3(c, pc);
                }
            }
            if (R(c) && af >= 0) s.push_back(SavedRef{af, true, init_rooted(c)});
            if (R(a) && cf >= 0) s.push_back(SavedRef{cf, true, init_rooted(a)});
            Op& o = finish(OpKind::Matmul, {out}, std::move(s));
            if (out >= 0) o.flops = extent_mul(bb.info(out).extent, checked_mul(2, pa.shape.back()));
            continue;
        }
        if (op == "Conv" || op == "ConvTranspose") {
            std::vector<SavedRef> s;
            sv(s, x, true, true);
            simple(OpKind::Conv2d, ActRole::Lowered, std::move(s));
            continue;
        }
        if (op == "BatchNormalization") {
            const I64 tm = attr_i("training_mode", outs.size() > 1 ? 1 : 0);
            training_export = training_export || tm != 0;
            eval_norm = eval_norm || tm == 0;
            const TensorId out = new_out(0, bb.info(T(x)).role);
            std::vector<SavedRef> s;
            sv(s, x);
            std::vector<TensorId> out_t{out};
            if (tm != 0) {
                // native_batch_norm(training) saves fp32 save_mean / save_invstd of [C] (derivatives.yaml L1147-1149)
                const I64 c = px->shape[1];
                for (const char* what : {".save_mean", ".save_invstd"}) {
                    const TensorId st = extra(name + what, Extent::per_sample(c), ActRole::Float32, true);
                    out_t.push_back(st);
                    s.push_back(SavedRef{st, false, false});
                }
            }
            finish(OpKind::BatchNorm2d, std::move(out_t), std::move(s));
            continue;
        }
        if (op == "LayerNormalization") {
            const TensorId out = new_out(0, half_export && P[static_cast<std::size_t>(O(0))].dtype == kFloat ? ActRole::Float32 : ActRole::Upcast);
            bool rows_ind = false;
            const Extent rows = O(1) >= 0 ? fit(O(1), rows_ind) : Extent{};
            std::vector<TensorId> out_t{out};
            std::vector<SavedRef> s;
            sv(s, x);
            const std::size_t ax = static_cast<std::size_t>(attr_i("axis", -1) < 0 ? attr_i("axis", -1) + static_cast<I64>(px->shape.size()) : attr_i("axis", -1));
            I64 norm = 1;
            for (std::size_t k = ax; k < px->shape.size(); ++k) norm = checked_mul(norm, px->shape[k]);
            const Extent r = O(1) >= 0 ? rows : extent_div(bb.info(T(x)).extent, norm);
            for (const char* what : {".mean", ".rstd"}) {
                const TensorId st = extra(name + what, r, ActRole::Float32, !bb.info(T(x)).per_batch);
                out_t.push_back(st);
                s.push_back(SavedRef{st, false, false});
            }
            Op& o = finish(OpKind::LayerNorm, std::move(out_t), std::move(s));
            if (out >= 0) o.flops = extent_mul(bb.info(out).extent, 8);
            continue;
        }
        if (op == "Dropout") {
            double p = attr_f("ratio", 0.5);
            bool train = false;
            if (I(1) >= 0 && P[static_cast<std::size_t>(I(1))].has_data && !P[static_cast<std::size_t>(I(1))].data.empty()) p = P[static_cast<std::size_t>(I(1))].data[0];
            if (I(2) >= 0 && P[static_cast<std::size_t>(I(2))].has_data && !P[static_cast<std::size_t>(I(2))].data.empty()) train = P[static_cast<std::size_t>(I(2))].data[0] != 0;
            if (!(p >= 0 && p <= 1)) node_fail("ratio " + std::to_string(p) + " is not in [0, 1]");
            training_export = training_export || train;
            if (!train || p == 0) {  // aten::dropout returns its input
                const TensorId src = T(x);
                const TensorId out = O(0) >= 0 && !is_const(O(0)) ? make(O(0), src >= 0 ? bb.info(src).role : ActRole::Stream, src) : -1;
                finish(OpKind::View, {out}, {});
                continue;
            }
            // native_dropout saves its bool mask (derivatives.yaml L580-582)
            const TensorId out = new_out(0, bb.info(T(x)).role);
            TensorId mask = O(1) >= 0 ? make(O(1), ActRole::Mask8) : extra(name + ".mask", bb.info(T(x)).extent, ActRole::Mask8, !bb.info(T(x)).per_batch);
            finish(OpKind::Dropout, {out, mask}, {SavedRef{mask, false, false}});
            continue;
        }
        if (op == "MaxPool" || op == "GlobalMaxPool") {
            const TensorId out = new_out(0, bb.info(T(x)).role);
            const TensorId idx = O(1) >= 0 ? make(O(1), ActRole::Index64) : extra(name + ".indices", bb.info(out).extent, ActRole::Index64, !bb.info(out).per_batch);
            std::vector<SavedRef> s;
            if (any_rg) { sv(s, x); s.push_back(SavedRef{idx, false, false}); }
            finish(OpKind::MaxPool2d, {out, idx}, std::move(s));
            continue;
        }
        if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") {
            const TensorId loss = new_out(0, ActRole::Float32);
            std::vector<TensorId> out_t{loss};
            std::vector<SavedRef> s;
            if (op == "SoftmaxCrossEntropyLoss") {
                const TensorId lp = O(1) >= 0 ? make(O(1), ActRole::Float32) : extra(name + ".log_prob", bb.info(T(x)).extent, ActRole::Float32, !bb.info(T(x)).per_batch);
                out_t.push_back(lp);
                s.push_back(SavedRef{lp, false, false});
            }
            sv(s, I(1));
            finish(OpKind::Loss, std::move(out_t), std::move(s));
            if (O(0) >= 0 && vals_[static_cast<std::size_t>(O(0))].graph_output) loss_out = loss;
            continue;
        }
        {
            std::vector<SavedRef> s;
            OpKind kind = OpKind::Elementwise;
            ActRole role = px ? role_of(px->dtype) : ActRole::Stream;
            if (T(x) >= 0) role = bb.info(T(x)).role;
            const int c = I(1);
            if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "Elu") {
                kind = OpKind::Activation;
                if (any_rg) s.push_back(SavedRef{-2, false, false});  // the output, below
            } else if (op == "Exp" || op == "Sqrt" || op == "Reciprocal") {
                if (any_rg) s.push_back(SavedRef{-2, false, false});
            } else if (op == "Softmax" || op == "LogSoftmax") {
                kind = OpKind::Softmax;
                // fp32 under autocast. In a 16-bit export the model's own softmax(dtype=
                // float32) stays fp32: torch.onnx.export writes it as Softmax then
                // Cast(to=FLOAT) (the cast then shares the softmax's fp32 storage).
                role = ActRole::Upcast;
                if (half_export) {
                    bool to_fp32 = P[static_cast<std::size_t>(O(0))].dtype == kFloat;
                    for (const auto& [use, slot] : vals_[static_cast<std::size_t>(O(0))].uses) {
                        const auto& nd = g_.node(use);
                        if (nd.op_type() != "Cast") continue;
                        for (const auto& a : nd.attribute())
                            if (a.name() == "to" && a.i() == kFloat) to_fp32 = true;
                    }
                    if (to_fp32) role = ActRole::Float32;
                }
                if (any_rg) s.push_back(SavedRef{-2, false, false});
            } else if (op == "Gelu" || op == "Erf" || op == "Cos" || op == "Sin" || op == "Log" || op == "Abs" || op == "LeakyRelu" || op == "Clip" ||
                       op == "Softplus" || op == "HardSwish" || op == "HardSigmoid" || op == "Pow") {
                if (op == "Gelu" || op == "LeakyRelu" || op == "HardSwish") kind = OpKind::Activation;
                if (R(x)) sv(s, x);
            } else if (op == "Mul") {
                kind = OpKind::Mul;
                if (R(x) && !scalar_const(c)) sv(s, c);
                if (R(c) && !scalar_const(x)) sv(s, x);
            } else if (op == "Div") {
                if (R(x) && !scalar_const(c)) sv(s, c);
                if (R(c)) { sv(s, x); sv(s, c); }
            } else if (op == "Add" || op == "Sub") {
                kind = OpKind::Add;
                if (c >= 0 && T(c) >= 0 && T(x) >= 0 && bb.info(T(c)).role == ActRole::Float32) role = ActRole::Float32;
            } else if (op == "Where") {
                if (R(I(1)) || R(I(2))) sv(s, x);
                role = T(I(1)) >= 0 ? bb.info(T(I(1))).role : T(I(2)) >= 0 ? bb.info(T(I(2))).role : ActRole::Stream;
            } else if (op == "Gather") {
                if (init_rooted(x)) kind = OpKind::Embedding, role = ActRole::Stream;
                if (any_rg) sv(s, c);
            } else if (op == "AveragePool" || op == "GlobalAveragePool") {
                kind = op == "AveragePool" ? OpKind::AvgPool2d : OpKind::AdaptiveAvgPool2d;
                if (any_rg) sv(s, x);
            } else if (op == "ReduceMax" || op == "ReduceMin") {
                if (R(x)) { sv(s, x); s.push_back(SavedRef{-2, false, false}); }
            }
            // ReduceMean/ReduceSum (torch >= 2.0 keeps sizes only), Concat, Neg, Resize, Tile, Trilu,
            // comparisons, Range, ConstantOfShape and type-changing Cast save nothing.
            const bool out_saved = std::any_of(s.begin(), s.end(), [](const SavedRef& r) { return r.tensor == -2; });
            s.erase(std::remove_if(s.begin(), s.end(), [](const SavedRef& r) { return r.tensor == -2; }), s.end());
            const Op* o = simple(kind, role, std::move(s));
            if (out_saved && !o->outputs.empty()) bb.block().ops.back().saved.push_back(SavedRef{o->outputs.front(), false, false});
            if (kind == OpKind::Softmax && !o->outputs.empty()) bb.block().ops.back().flops = extent_mul(bb.info(o->outputs.front()).extent, 5);
        }
    next_node:;
    }

    // The loss.
    int gout = -1;
    for (int k = 0; k < g_.output_size() && gout < 0; ++k) gout = value_id(g_.output(k).name(), false);
    TensorId out = loss_out;
    const std::string loss = opts_.loss.empty() ? "sum" : opts_.loss;
    if (out < 0) {
        const TensorId t = gout >= 0 ? tid[static_cast<std::size_t>(gout)] : -1;
        if (t < 0) fail(ErrorCode::Unsupported, "graph.output", origin_ + ": graph.output[0] '" + (gout >= 0 ? vals_[static_cast<std::size_t>(gout)].name : "") + "' is a constant, not computed from the inputs");
        if (g_.output_size() > 1) notes_.push_back("the graph has " + std::to_string(g_.output_size()) + " outputs: the loss reads the first, " + vals_[static_cast<std::size_t>(gout)].name);
        if (loss == "sum" || loss == "mean") {
            if (opts_.loss.empty()) notes_.push_back("the graph's output is not a loss and no --loss was given: backward of out.sum() assumed");
            out = bb.sum_loss(t, "loss." + loss);
        } else if (loss == "cross-entropy") {
            const Shape& sh = P[static_cast<std::size_t>(gout)].shape;
            if (sh.size() < 2 || !is_float(P[static_cast<std::size_t>(gout)].dtype) || !bb.info(t).per_batch)
                fail(ErrorCode::InvalidArgument, "loss", origin_ + ": --loss cross-entropy needs float logits [batch, ..., classes]; the graph output " + vals_[static_cast<std::size_t>(gout)].name + " is " + shape_str(sh));
            const Extent e = bb.info(t).extent;
            out = bb.cross_entropy(t, e, extent_div(e, sh.back()), false, "loss");
        } else if (loss == "none") {
            out = t;
        } else {
            fail(ErrorCode::InvalidArgument, "loss", "--loss \"" + loss + "\" is not one of sum, mean, cross-entropy, none");
        }
    } else if (!opts_.loss.empty() && opts_.loss != "none") {
        notes_.push_back("the graph computes its own loss: --loss " + opts_.loss + " ignored");
    }

    // Constant operands have no tensor: drop them from op lists.
    for (Op& o : bb.block().ops) {
        std::erase_if(o.inputs, [](TensorId t) { return t < 0; });
        std::erase_if(o.outputs, [](TensorId t) { return t < 0; });
        std::erase_if(o.saved, [](const SavedRef& r) { return r.tensor < 0; });
    }
    ModelGraph g;
    g.name = g_.name().empty() || g_.name() == "main_graph" || g_.name() == "torch_jit" ? "onnx" : g_.name();
    g.family = "onnx";
    g.source = "onnx";
    g.has_sequence = has_seq_;
    g.blocks.push_back(bb.finish(out));
    if (training_export)
        notes_.push_back("exported in training mode: BatchNorm batch statistics and dropout masks as the graph states them");
    else if (eval_norm || std::any_of(vals_.begin(), vals_.end(), [](const Value& v) { return v.name.rfind("onnx::", 0) == 0 && v.init; }))
        notes_.push_back("exported in eval mode: dropout is gone and folded weights may differ from the module's; re-export with "
                         "torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False) for training estimates");
    if (std::none_of(vals_.begin(), vals_.end(), [](const Value& v) { return v.init != nullptr && (v.init->data_type() == kF16 || v.init->data_type() == kBF16); }))
        // torch.onnx.export records `.to(float32)` of an fp32 tensor as nothing, so an fp32
        // export has no trace of the upcasts a 16-bit run makes (RMSNorm's hidden_states.to
        // (float32), softmax(dtype=float32)): tests/onnx_test.cpp measures LLaMA 16-21% low.
        notes_.push_back("exported in fp32: the model's explicit fp32 upcasts are not in the file, so 16-bit precisions can be "
                         "low (up to ~20% of activations for LLaMA-style RMSNorm); export in the 16-bit dtype you train in, or "
                         "use gpumem trace, which sees them");
    notes_.push_back(std::to_string(n_params) + " trainable parameters and " + std::to_string(n_buffers) + " buffer elements read from " +
                     std::to_string(g_.initializer_size()) + " initializers");
    g.notes = std::move(notes_);
    return g;
}


}  // namespace

Result<ModelGraph> load_onnx_bytes(std::string_view bytes, const std::string& origin, const OnnxOptions& opts) {
    return capture([&]() -> ModelGraph {
        if (static_cast<I64>(bytes.size()) > opts.max_file_bytes)
            fail(ErrorCode::InvalidArgument, origin, origin + ": " + std::to_string(bytes.size()) + " bytes exceed the limit of " + std::to_string(opts.max_file_bytes));
        if (bytes.size() > static_cast<std::size_t>(INT32_MAX)) fail(ErrorCode::InvalidArgument, origin, origin + ": larger than 2 GiB (protobuf's limit)");
        onnx::ModelProto m;
        google::protobuf::io::ArrayInputStream ais(bytes.data(), static_cast<int>(bytes.size()));
        google::protobuf::io::CodedInputStream cis(&ais);
        cis.SetRecursionLimit(64);
        cis.SetTotalBytesLimit(INT32_MAX);
        if (!m.ParseFromCodedStream(&cis) || !cis.ConsumedEntireMessage())
            fail(ErrorCode::ParseError, origin, origin + ": not an ONNX model (protobuf ModelProto did not parse: truncated or corrupt)");
        if (!m.has_graph()) fail(ErrorCode::ParseError, "graph", origin + ": graph: missing");
        bool default_opset = false;
        for (const auto& o : m.opset_import())
            if ((o.domain().empty() || o.domain() == "ai.onnx") && o.version() >= 7) default_opset = true;
        if (!default_opset) fail(ErrorCode::ParseError, "opset_import", origin + ": opset_import: no ai.onnx opset >= 7 (the file is cut short or not a model)");
        Reader r(m, origin, opts);
        return r.run();
    });
}

Result<ModelGraph> load_onnx_file(const std::string& path, const OnnxOptions& opts) {
    return capture([&]() -> ModelGraph {
        namespace fs = std::filesystem;
        // A regular file of at most max_file_bytes (a FIFO or device is
        // refused before it is opened), read in full.
        const std::string bytes = read_input_file(path, opts.max_file_bytes, "model (.onnx)");
        auto g = take(load_onnx_bytes(bytes, path, opts));
        std::string stem = fs::path(path).stem().string();
        if (g.name.empty() || g.name == "onnx") g.name = stem;
        return g;
    });
}

}  // namespace gpumem
