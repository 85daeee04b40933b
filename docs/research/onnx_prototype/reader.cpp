// reader.cpp — minimal ONNX graph reader against Debian bookworm's libonnx-dev 1.12
// (ONNX_ML=1, ONNX_NAMESPACE=onnx) and libprotobuf-dev 3.21.
//
//   reader MODEL.onnx [--symbolic-batch NAME]
//
// Reads the main .onnx file only (initializers stored as external data keep
// data_location=EXTERNAL + external_data {location, offset, length} entries; the
// data file is never opened), prints inputs / initializers / nodes, runs ONNX
// shape inference with data propagation and prints the inferred value_info.
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "onnx/defs/schema.h"
#include "onnx/onnx_pb.h"
#include "onnx/shape_inference/implementation.h"

namespace {

std::string dims_str(const onnx::TensorShapeProto& s) {
    std::string r = "[";
    for (int i = 0; i < s.dim_size(); ++i) {
        const auto& d = s.dim(i);
        if (i) r += ", ";
        if (d.has_dim_value()) r += std::to_string(d.dim_value());
        else if (d.has_dim_param()) r += d.dim_param();
        else r += "?";
    }
    return r + "]";
}

std::string type_str(const onnx::TypeProto& t) {
    if (!t.has_tensor_type()) return "<non-tensor type>";
    const auto& tt = t.tensor_type();
    std::string r = onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(tt.elem_type()));
    if (tt.has_shape()) r += " " + dims_str(tt.shape());
    else r += " <rank unknown>";
    return r;
}

std::string attr_str(const onnx::AttributeProto& a) {
    std::ostringstream o;
    o << a.name() << "=";
    switch (a.type()) {
        case onnx::AttributeProto::INT: o << a.i(); break;
        case onnx::AttributeProto::FLOAT: o << a.f(); break;
        case onnx::AttributeProto::STRING: o << '"' << a.s() << '"'; break;
        case onnx::AttributeProto::INTS:
            o << "[";
            for (int i = 0; i < a.ints_size(); ++i) o << (i ? "," : "") << a.ints(i);
            o << "]";
            break;
        case onnx::AttributeProto::FLOATS:
            o << "[";
            for (int i = 0; i < a.floats_size(); ++i) o << (i ? "," : "") << a.floats(i);
            o << "]";
            break;
        case onnx::AttributeProto::TENSOR: {
            const auto& t = a.t();
            o << "tensor(" << onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t.data_type()))
              << " dims=[";
            for (int i = 0; i < t.dims_size(); ++i) o << (i ? "," : "") << t.dims(i);
            o << "]";
            // small int64 constants (Reshape shapes, axes) are worth seeing
            if (t.data_type() == onnx::TensorProto::INT64) {
                if (t.int64_data_size()) {
                    o << " int64_data=";
                    for (int i = 0; i < t.int64_data_size() && i < 8; ++i) o << (i ? "," : "") << t.int64_data(i);
                } else if (!t.raw_data().empty() && t.raw_data().size() <= 64) {
                    o << " raw=";
                    for (std::size_t i = 0; i + 8 <= t.raw_data().size(); i += 8) {
                        std::int64_t v;
                        std::memcpy(&v, t.raw_data().data() + i, 8);  // little-endian per the ONNX spec
                        o << (i ? "," : "") << v;
                    }
                }
            } else if (t.data_type() == onnx::TensorProto::FLOAT && t.dims_size() == 0) {
                float v = t.float_data_size() ? t.float_data(0) : 0.f;
                if (t.raw_data().size() == 4) std::memcpy(&v, t.raw_data().data(), 4);
                o << " value=" << v;  // e.g. Dropout ratio
            } else if (t.data_type() == onnx::TensorProto::BOOL && t.dims_size() == 0) {
                int v = t.int32_data_size() ? t.int32_data(0) : 0;
                if (t.raw_data().size() == 1) v = t.raw_data()[0];
                o << " value=" << (v ? "true" : "false");  // e.g. Dropout training_mode
            }
            o << ")";
            break;
        }
        case onnx::AttributeProto::GRAPH: o << "<graph " << a.g().name() << ", " << a.g().node_size() << " nodes>"; break;
        default: o << "<type " << a.type() << ">";
    }
    return o.str();
}

}  // namespace

int main(int argc, char** argv) {
    GOOGLE_PROTOBUF_VERIFY_VERSION;
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.onnx [--symbolic-batch NAME]\n", argv[0]);
        return 2;
    }
    std::string sym_batch;
    std::unordered_map<std::string, std::int64_t> fixed;  // --fix NAME=VALUE: a symbolic dim made concrete
    for (int i = 2; i + 1 < argc; ++i) {
        if (std::string(argv[i]) == "--symbolic-batch") sym_batch = argv[i + 1];
        if (std::string(argv[i]) == "--fix") {
            std::string kv = argv[i + 1];
            auto eq = kv.find('=');
            if (eq != std::string::npos) fixed[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
        }
    }

    std::ifstream f(argv[1], std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", argv[1]);
        return 1;
    }
    onnx::ModelProto model;
    {
        google::protobuf::io::IstreamInputStream zin(&f);
        google::protobuf::io::CodedInputStream cin(&zin);
        cin.SetTotalBytesLimit(std::numeric_limits<int>::max());  // protobuf's hard 2 GiB cap
        cin.SetRecursionLimit(64);  // nested subgraphs (If/Loop bodies); default is 100
        if (!model.ParseFromCodedStream(&cin) || !cin.ConsumedEntireMessage()) {
            std::fprintf(stderr, "%s: not a valid ONNX ModelProto\n", argv[1]);
            return 1;
        }
    }
    const auto& g = model.graph();
    std::cout << "ir_version " << model.ir_version() << ", producer " << model.producer_name() << " "
              << model.producer_version() << ", opsets:";
    for (const auto& o : model.opset_import()) std::cout << " " << (o.domain().empty() ? "ai.onnx" : o.domain()) << "=" << o.version();
    std::cout << "\n";

    std::cout << "\ninputs (" << g.input_size() << ")\n";
    for (const auto& in : g.input()) std::cout << "  " << in.name() << ": " << type_str(in.type()) << "\n";
    std::cout << "outputs (" << g.output_size() << ")\n";
    for (const auto& out : g.output()) std::cout << "  " << out.name() << ": " << type_str(out.type()) << "\n";

    std::cout << "\ninitializers (" << g.initializer_size() << ")\n";
    std::int64_t total = 0;
    for (const auto& t : g.initializer()) {
        std::int64_t n = 1;
        std::string d = "[";
        for (int i = 0; i < t.dims_size(); ++i) {
            n *= t.dims(i);
            d += (i ? ", " : "") + std::to_string(t.dims(i));
        }
        d += "]";
        total += n;
        std::cout << "  " << t.name() << " " << d << " "
                  << onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t.data_type()))
                  << " numel=" << n;
        if (t.data_location() == onnx::TensorProto::EXTERNAL) {
            std::cout << " EXTERNAL{";
            for (int i = 0; i < t.external_data_size(); ++i)
                std::cout << (i ? " " : "") << t.external_data(i).key() << "=" << t.external_data(i).value();
            std::cout << "}";
        } else {
            std::cout << " raw_bytes=" << t.raw_data().size();
        }
        std::cout << "\n";
    }
    std::cout << "  total initializer elements " << total << "\n";

    std::cout << "\nnodes (" << g.node_size() << ")\n";
    for (const auto& n : g.node()) {
        std::cout << "  " << (n.domain().empty() ? "" : n.domain() + "::") << n.op_type() << " '" << n.name() << "' (";
        for (int i = 0; i < n.input_size(); ++i) std::cout << (i ? ", " : "") << n.input(i);
        std::cout << ") -> (";
        for (int i = 0; i < n.output_size(); ++i) std::cout << (i ? ", " : "") << n.output(i);
        std::cout << ")";
        for (const auto& a : n.attribute()) std::cout << " " << attr_str(a);
        std::cout << "\n";
    }

    // Symbolic batch: give dim 0 of every non-initializer graph input a dim_param.
    if (!sym_batch.empty()) {
        std::unordered_set<std::string> inits;
        for (const auto& t : g.initializer()) inits.insert(t.name());
        for (auto& in : *model.mutable_graph()->mutable_input()) {
            if (inits.count(in.name()) || !in.type().has_tensor_type()) continue;
            auto* shp = in.mutable_type()->mutable_tensor_type()->mutable_shape();
            if (shp->dim_size() > 0) shp->mutable_dim(0)->set_dim_param(sym_batch);
        }
    }

    for (auto& in : *model.mutable_graph()->mutable_input()) {
        if (!in.type().has_tensor_type() || !in.type().tensor_type().has_shape()) continue;
        for (auto& d : *in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim())
            if (d.has_dim_param() && fixed.count(d.dim_param())) d.set_dim_value(fixed[d.dim_param()]);
    }
    // graph outputs carry the exporter's symbolic dims too; drop their shapes so inference recomputes them
    if (!fixed.empty())
        for (auto& out : *model.mutable_graph()->mutable_output())
            if (out.type().has_tensor_type()) out.mutable_type()->mutable_tensor_type()->clear_shape();

    // Shape inference: check_type=false, error_mode=0 (node errors swallowed),
    // data propagation on (Shape->Gather->Concat->Reshape chains of dynamic exports).
    model.mutable_graph()->clear_value_info();
    try {
        onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                           onnx::ShapeInferenceOptions{false, 0, true});
    } catch (const std::exception& e) {
        std::cout << "\nshape inference failed: " << e.what() << "\n";
    }
    std::cout << "\nvalue_info after InferShapes (" << model.graph().value_info_size() << ")\n";
    for (const auto& vi : model.graph().value_info()) std::cout << "  " << vi.name() << ": " << type_str(vi.type()) << "\n";
    std::cout << "outputs after InferShapes\n";
    for (const auto& out : model.graph().output()) std::cout << "  " << out.name() << ": " << type_str(out.type()) << "\n";
    google::protobuf::ShutdownProtobufLibrary();
    return 0;
}
