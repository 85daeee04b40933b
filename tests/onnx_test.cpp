// Tests of the ONNX reader (src/model/onnx.cpp) on the fixtures that
// scripts/onnx_fixtures.py exports with torch 1.13 (tests/fixtures/onnx/).
// Every expected number comes from that script's sidecar expected.json
// (torch's parameter counts and the CPU oracle's saved-tensor bytes) or from
// a calculation written here, never from gpumem's own output.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include <onnx/onnx.pb.h>  // generated from onnx/onnx.proto by protoc (CMakeLists.txt)

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/model/onnx.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

const nlohmann::json& expected() {
    static const nlohmann::json j = test::read_json("tests/fixtures/onnx/expected.json");
    return j;
}
std::string fixture(const std::string& name) { return test::source_path("tests/fixtures/onnx/" + name + ".onnx"); }
std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
ModelGraph load(const std::string& name, const std::string& loss = "") {
    OnnxOptions o;
    o.loss = loss;
    auto r = load_onnx_file(fixture(name), o);
    EXPECT_TRUE(r.ok()) << name << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : ModelGraph{};
}
EstimateResult run(const ModelGraph& g, Mode mode, std::int64_t b, std::int64_t s) {
    EstimateRequest req;
    req.mode = mode;
    req.precision = Precision::FP32;
    req.attention = Attention::Eager;
    req.batch = b;
    if (g.has_sequence) req.seq = s;
    auto r = estimate(g, req);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : EstimateResult{};
}

}  // namespace

TEST(Onnx, ExactTrainableParameterCounts) {
    for (const auto& [name, m] : expected()["models"].items()) {
        for (const char* kind : {"_train", "_eval"}) {
            const ModelGraph g = load(name + kind);
            // torch: sum(p.numel() for p in model.parameters()), tied weights once
            EXPECT_EQ(g.trainable_params(), m["trainable"].get<std::int64_t>()) << name << kind;
            // exported buffers are a subset of model.buffers() (num_batches_tracked and unused ones are not exported)
            const std::int64_t buffers = g.total_params() - g.trainable_params();
            EXPECT_LE(buffers, m["buffers"].get<std::int64_t>()) << name << kind;
        }
    }
}

TEST(Onnx, BatchNormRunningStatsAreBuffers) {
    // TinyCNN: bn1 (8 channels) and bn2 (16): running_mean + running_var = 2 * (8 + 16) elements.
    const ModelGraph g = load("cnn_train");
    EXPECT_EQ(g.total_params() - g.trainable_params(), 2 * (8 + 16));
    for (const Param& p : g.blocks.at(0).params) {
        if (p.name.find("running_") != std::string::npos) {
            EXPECT_FALSE(p.trainable) << p.name;
        }
    }
}

TEST(Onnx, TrainingSavedTensorsWithinTwoPercentOfOracle) {
    for (const auto& [name, m] : expected()["models"].items()) {
        for (const auto& loss : {std::string("sum"), std::string("mean"), std::string("cross-entropy")}) {
            const ModelGraph g = load(name + "_train", loss);
            EXPECT_EQ(g.has_sequence, m["has_seq"].get<bool>());
            for (const auto& pt : m["points"]) {
                const std::int64_t b = pt["batch"], s = pt["seq"];
                const double want = pt["saved_bytes"][loss].get<double>();
                const double got = static_cast<double>(run(g, Mode::Train, b, s).per_gpu.activations.count());
                EXPECT_NEAR(got / want, 1.0, 0.02) << name << " loss=" << loss << " b=" << b << " s=" << s << " want " << want << " got " << got;
            }
        }
    }
}

TEST(Onnx, EvalExportSavesLessThanTrainingExport) {
    // eval exports have no dropout masks and BatchNorm keeps no batch statistics
    for (const char* name : {"cnn", "vit", "gpt2"}) {
        const ModelGraph tr = load(std::string(name) + "_train"), ev = load(std::string(name) + "_eval");
        const auto a = run(tr, Mode::Train, 2, 16).per_gpu.activations, e = run(ev, Mode::Train, 2, 16).per_gpu.activations;
        EXPECT_LT(e.count(), a.count()) << name;
        bool train_note = false, eval_note = false;
        for (const auto& n : tr.notes) train_note = train_note || n.find("training mode") != std::string::npos;
        for (const auto& n : ev.notes) eval_note = eval_note || n.find("eval mode") != std::string::npos;
        EXPECT_TRUE(train_note) << name;
        EXPECT_TRUE(eval_note || std::string(name) == "vit" || std::string(name) == "gpt2") << name;
    }
}

TEST(Onnx, InferenceIsWeightsPlusAWorkingSet) {
    // Weights: every exported initializer in fp32 = 4 bytes x (trainable + buffer elements).
    // Working set (no_grad liveness walk): at least the largest single module output of an eval
    // forward and at most the input plus every module output and every intermediate kept alive
    // at once; the sidecar's sum of module outputs (forward hooks on leaf modules) is an upper
    // bound for models whose functional ops (residual adds, reshapes, attention matmuls) are small
    // next to their modules' outputs; we allow 2x that sum.
    for (const auto& [name, m] : expected()["models"].items()) {
        const ModelGraph g = load(name + "_eval");
        for (const auto& pt : m["points"]) {
            const std::int64_t b = pt["batch"], s = pt["seq"];
            const auto e = run(g, Mode::Infer, b, s);
            EXPECT_EQ(e.per_gpu.weights.count(), 4 * g.total_params()) << name;
            const auto& ev = pt["eval"];
            const std::int64_t act = e.per_gpu.activations.count() + e.per_gpu.transient.count();
            EXPECT_GE(act, ev["largest_module_output"].get<std::int64_t>()) << name << " b=" << b;
            EXPECT_LE(act, 2 * (ev["sum_module_outputs"].get<std::int64_t>() + ev["input"].get<std::int64_t>())) << name << " b=" << b;
        }
    }
}

TEST(Onnx, LossVariants) {
    // mean and sum save nothing (MeanBackward0 / SumBackward0 keep sizes); cross-entropy keeps
    // log_softmax's output (b*s*V fp32) and the int64 labels.
    const auto& m = expected()["models"]["gpt2"];
    const auto pt = m["points"][1];
    const std::int64_t b = pt["batch"], s = pt["seq"];
    const auto sum = run(load("gpt2_train", "sum"), Mode::Train, b, s).per_gpu.activations.count();
    const auto mean = run(load("gpt2_train", "mean"), Mode::Train, b, s).per_gpu.activations.count();
    const auto ce = run(load("gpt2_train", "cross-entropy"), Mode::Train, b, s).per_gpu.activations.count();
    EXPECT_EQ(sum, mean);
    EXPECT_EQ(ce - sum, b * s * 512 * 4 + b * s * 8);  // vocab 512
    OnnxOptions bad;
    bad.loss = "hinge";
    auto r = load_onnx_file(fixture("gpt2_train"), bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().field, "loss");
}

TEST(Onnx, ExternalDataIsNeverOpened) {
    // the fixtures' float initializers are EXTERNAL (location weights.bin) and that file does not exist
    std::ifstream f(test::source_path("tests/fixtures/onnx/weights.bin"));
    EXPECT_FALSE(f.good());
    EXPECT_GT(load("resnet18_train").trainable_params(), 11000000);
}

TEST(Onnx, CliEstimate) {
    const auto r = test::run_cli("estimate " + fixture("cnn_train") + " --batch 4");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("1594 trainable parameters"), std::string::npos) << r.out;  // TinyCNN (expected.json)
    const auto m = load_model(fixture("llama_train"));
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m.value().trainable_params(), expected()["models"]["llama"]["trainable"].get<std::int64_t>());
}

TEST(OnnxFuzz, EveryPrefixFails) {
    const std::string f = read_bytes(fixture("cnn_train"));
    ASSERT_TRUE(load_onnx_bytes(f, "cnn").ok());
    for (std::size_t n = 0; n < f.size(); ++n) {
        const auto r = load_onnx_bytes(std::string_view(f).substr(0, n), "cnn");
        ASSERT_FALSE(r.ok()) << "prefix " << n;
        EXPECT_FALSE(r.error().message.empty());
    }
}

TEST(OnnxFuzz, RandomMutations) {
    const std::string base = read_bytes(fixture("cnn_train"));
    std::mt19937_64 rng(20250601);
    static const char kInteresting[] = {'\x00', '\x01', '\x02', '\x07', '\x08', '\x0a', '\x12', '\x1a', '\x22', '\x7f', '\x80', '\xff'};
    int ok = 0, errors = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string d = base;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits && !d.empty(); ++e) {
            const std::size_t pos = rng() % d.size();
            switch (rng() % 5) {
                case 0: d[pos] = static_cast<char>(rng() & 0xff); break;
                case 1: d[pos] = kInteresting[rng() % sizeof kInteresting]; break;
                case 2: d.erase(pos, 1 + rng() % 8); break;
                case 3: d.insert(pos, 1, kInteresting[rng() % sizeof kInteresting]); break;
                case 4: d.resize(pos); break;
            }
        }
        const auto r = load_onnx_bytes(d, "mutated");
        if (r.ok()) {
            ++ok;
            EXPECT_GE(r.value().total_params(), 0);
        } else {
            ++errors;
            EXPECT_FALSE(r.error().message.empty());
        }
    }
    EXPECT_EQ(ok + errors, 3000);
    EXPECT_GT(errors, 0);
}

namespace {
// A two-node graph built with the generated protobuf classes: x [N, 4] -> op -> y.
std::string tiny_model(const std::string& op_type, std::int64_t w_rows) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto* g = m.mutable_graph();
    auto* in = g->add_input();
    in->set_name("x");
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(1);
    tt->mutable_shape()->add_dim()->set_dim_param("N");
    tt->mutable_shape()->add_dim()->set_dim_value(4);
    auto* w = g->add_initializer();
    w->set_name("w");
    w->set_data_type(1);
    w->add_dims(w_rows);
    w->add_dims(3);
    auto* n = g->add_node();
    n->set_name("/fc/MatMul");
    n->set_op_type(op_type);
    n->add_input("x");
    n->add_input("w");
    n->add_output("y");
    g->add_output()->set_name("y");
    return m.SerializeAsString();
}
}  // namespace

TEST(Onnx, ErrorsNameTheNode) {
    auto good = load_onnx_bytes(tiny_model("MatMul", 4), "tiny");
    ASSERT_TRUE(good.ok()) << good.error().message;
    EXPECT_EQ(good.value().trainable_params(), 12);

    auto bad_shape = load_onnx_bytes(tiny_model("MatMul", 5), "tiny");
    ASSERT_FALSE(bad_shape.ok());
    EXPECT_NE(bad_shape.error().message.find("/fc/MatMul"), std::string::npos) << bad_shape.error().message;
    EXPECT_NE(bad_shape.error().message.find("inner dims"), std::string::npos) << bad_shape.error().message;

    auto unsupported = load_onnx_bytes(tiny_model("FusedMatMulX", 4), "tiny");
    ASSERT_FALSE(unsupported.ok());
    EXPECT_NE(unsupported.error().message.find("node 0 '/fc/MatMul' (FusedMatMulX)"), std::string::npos) << unsupported.error().message;
    EXPECT_EQ(unsupported.error().field, "graph.node[0]");
}

TEST(Onnx, NotARegularFile) {
    auto r = load_onnx_file(test::source_path("tests/fixtures/onnx"));
    ASSERT_FALSE(r.ok());
    OnnxOptions small;
    small.max_file_bytes = 100;
    auto big = load_onnx_file(fixture("cnn_train"), small);
    ASSERT_FALSE(big.ok());
    EXPECT_NE(big.error().message.find("larger than the 100 B limit"), std::string::npos) << big.error().message;
}

// The ONNX path against the traced path on the same models: each model's
// training export read with --loss sum, and the model traced by gpumem.trace
// with loss="sum" (scripts/onnx_fixtures.py writes both): the saved
// activations and the simulated training peak (fp32, bf16) and the inference
// estimate agree within 2%. LLaMA in bf16 reads its bfloat16 export: an fp32
// export carries none of the model's explicit fp32 upcasts (RMSNorm,
// softmax), which a 16-bit run makes (Bf16ExportKeepsTheModelsUpcasts).
TEST(Onnx, ReproducesTheTracedPath) {
    int checked = 0;
    for (const auto& [name, m] : expected()["models"].items()) {
        const ModelGraph og = load(name + "_train", "sum");
        const ModelGraph eg = load(name + "_eval", "sum");
        const ModelGraph half = name == "llama" ? load("llama_bf16_train", "sum") : ModelGraph{};
        auto tg = load_model(test::source_path("tests/fixtures/onnx/" + name + ".traced.json"));
        ASSERT_TRUE(tg.ok()) << tg.error().message;
        EXPECT_EQ(og.trainable_params(), tg.value().trainable_params()) << name;
        for (const auto& pt : m["points"]) {
            for (Precision prec : {Precision::FP32, Precision::BF16}) {
                EstimateRequest req;
                req.precision = prec;
                req.attention = Attention::Eager;
                req.batch = pt["batch"].get<std::int64_t>();
                if (og.has_sequence) req.seq = pt["seq"].get<std::int64_t>();
                const std::string job = "gpumem estimate tests/fixtures/onnx/" + name + "_train.onnx --loss sum --batch " +
                                        std::to_string(req.batch) + (req.seq ? " --seq " + std::to_string(*req.seq) : "") +
                                        (prec == Precision::BF16 ? " --precision bf16" : " --precision fp32");
                const bool upcasts = name == "llama" && prec != Precision::FP32;
                auto o = simulate_estimate(upcasts ? half : og, req);
                auto t = simulate_estimate(tg.value(), req);
                ASSERT_TRUE(o.ok() && t.ok()) << job;
                const auto ratio = [](Bytes a, Bytes b) { return static_cast<double>(a.count()) / static_cast<double>(b.count()); };
                EXPECT_NEAR(ratio(o.value().per_gpu.activations, t.value().per_gpu.activations), 1.0, 0.02)
                    << job << (upcasts ? " (the bf16 export)" : "") << " (activations)";
                EXPECT_NEAR(ratio(o.value().per_gpu.peak_allocated, t.value().per_gpu.peak_allocated), 1.0, 0.02) << job << " (training peak)";
                req.mode = Mode::Infer;
                auto oi = estimate(eg, req);
                auto ti = estimate(tg.value(), req);
                ASSERT_TRUE(oi.ok() && ti.ok()) << job;
                EXPECT_NEAR(ratio(oi.value().per_gpu.peak_allocated, ti.value().per_gpu.peak_allocated), 1.0, 0.02) << job << " --mode infer (eval export)";
                ++checked;
            }
        }
    }
    EXPECT_GE(checked, 30);
}

// A bfloat16 export states the model's own upcasts (RMSNorm's .to(float32),
// softmax(dtype=float32)) as Cast nodes and fp32 values: read in fp32 it is
// the fp32 export (each cast shares its source's storage then), in bf16 it
// keeps more than the fp32 export, which cannot tell those upcasts apart.
TEST(Onnx, Bf16ExportKeepsTheModelsUpcasts) {
    const ModelGraph half = load("llama_bf16_train", "sum");
    const ModelGraph full = load("llama_train", "sum");
    EXPECT_EQ(half.trainable_params(), full.trainable_params());
    for (std::int64_t s : {32, 256}) {
        EXPECT_EQ(run(half, Mode::Train, 2, s).per_gpu.activations, run(full, Mode::Train, 2, s).per_gpu.activations) << "fp32, seq " << s;
        EstimateRequest req;
        req.precision = Precision::BF16;
        req.attention = Attention::Eager;
        req.batch = 2;
        req.seq = s;
        const auto h = estimate(half, req), f = estimate(full, req);
        ASSERT_TRUE(h.ok() && f.ok());
        EXPECT_GT(h.value().per_gpu.activations, f.value().per_gpu.activations) << "bf16, seq " << s;
    }
}
