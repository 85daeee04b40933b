// Builds a tiny ONNX model in C++ with the generated protobuf classes only (libonnx_proto):
// the way gpumem's unit tests can make fixtures without Python. Initializers carry dims and
// data_type but no data (as a model whose data is external would look once parsed), plus one
// EXTERNAL initializer to exercise that path.
#include <fstream>
#include <iostream>
#include "onnx/onnx_pb.h"

static void dims(onnx::TensorShapeProto* s, std::initializer_list<const char*> sym, std::initializer_list<long> v) {
    for (auto p : sym) s->add_dim()->set_dim_param(p);
    for (auto d : v) s->add_dim()->set_dim_value(d);
}
static onnx::TensorProto* init(onnx::GraphProto* g, const char* name, std::initializer_list<long> d, bool external = false) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    long n = 1;
    for (auto x : d) { t->add_dims(x); n *= x; }
    if (external) {
        t->set_data_location(onnx::TensorProto::EXTERNAL);
        auto* e = t->add_external_data(); e->set_key("location"); e->set_value("weights.bin");
        e = t->add_external_data(); e->set_key("length"); e->set_value(std::to_string(4 * n));
    } else {
        t->mutable_raw_data()->assign(static_cast<std::size_t>(4 * n), '\0');
    }
    return t;
}
int main(int argc, char** argv) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.set_producer_name("make_fixture.cpp");
    auto* op = m.add_opset_import(); op->set_domain(""); op->set_version(17);
    auto* g = m.mutable_graph();
    g->set_name("fixture_mlp");
    auto* x = g->add_input(); x->set_name("x");
    x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    dims(x->mutable_type()->mutable_tensor_type()->mutable_shape(), {"batch"}, {16});
    init(g, "fc1.weight", {32, 16}, true); init(g, "fc1.bias", {32});
    auto* n = g->add_node(); n->set_op_type("Gemm"); n->set_name("/fc1/Gemm");
    n->add_input("x"); n->add_input("fc1.weight"); n->add_input("fc1.bias"); n->add_output("h");
    auto* a = n->add_attribute(); a->set_name("transB"); a->set_type(onnx::AttributeProto::INT); a->set_i(1);
    n = g->add_node(); n->set_op_type("Relu"); n->set_name("/act/Relu"); n->add_input("h"); n->add_output("y");
    auto* y = g->add_output(); y->set_name("y");
    y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    std::ofstream f(argc > 1 ? argv[1] : "fixture.onnx", std::ios::binary);
    return m.SerializeToOstream(&f) ? 0 : 1;
}
