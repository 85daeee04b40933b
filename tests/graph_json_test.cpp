// gpumem's model graph as a file (model/graph_json.hpp): every preset, the
// layer-list and fixture models written and read back give the same graph
// (the same document again) and the same estimates as the model itself;
// hostile documents are refused with the field named, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/serving.hpp"
#include "gpumem/model/graph_json.hpp"
#include "gpumem/model/load.hpp"
#include "test_util.hpp"

using namespace gpumem;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string write_temp(const json& doc, const std::string& name) {
    return gpumem::test::process_scratch().write(name, doc.dump());
}

}  // namespace

TEST(GraphJson, EveryPresetRoundTrips) {
    int n = 0;
    for (const auto& p : presets()) {
        const auto g = load_model(p.name);
        ASSERT_TRUE(g.ok()) << p.name << ": " << g.error().message;
        const json doc = graph_to_json(g.value());
        const auto back = graph_from_json(json::parse(doc.dump()), p.name);
        ASSERT_TRUE(back.ok()) << p.name << ": " << back.error().message;
        EXPECT_EQ(graph_to_json(back.value()), doc) << p.name;
        EXPECT_EQ(back.value().total_params(), g.value().total_params()) << p.name;
        ++n;
    }
    EXPECT_GE(n, 80);
}

// The file as MODEL: training (simulated and analytic), generation and vLLM
// serving give the model's own answers.
TEST(GraphJson, FileAsModelGivesTheSameAnswers) {
    for (const std::string name : {"gpt2", "llama-3.1-8b", "mixtral-8x7b", "qwen3-next-80b-a3b-instruct", "gemma-3-4b-it", "t5-small"}) {
        const std::string path = write_temp(graph_to_json(load_model(name).value()), name + ".json");
        for (const bool analytic : {false, true}) {
            for (const Mode mode : {Mode::Train, Mode::Infer}) {
                EstimateRequest a;
                a.model = name;
                a.batch = 2;
                a.seq = 256;
                a.gen_len = mode == Mode::Infer ? 8 : 0;
                a.mode = mode;
                a.analytic = analytic;
                a.gpu_memory = Bytes(std::int64_t{1} << 50);
                EstimateRequest b = a;
                b.model = path;
                const auto ra = estimate(a), rb = estimate(b);
                ASSERT_TRUE(ra.ok()) << name << ": " << ra.error().message;
                ASSERT_TRUE(rb.ok()) << name << ": " << rb.error().message;
                EXPECT_EQ(ra.value().per_gpu.peak_allocated, rb.value().per_gpu.peak_allocated) << name << (analytic ? " analytic" : " simulated");
                EXPECT_EQ(ra.value().per_gpu.peak_reserved, rb.value().per_gpu.peak_reserved) << name;
            }
        }
        if (std::string(name) == "t5-small") continue;  // serving engines need a decoder-only model
        EstimateRequest s;
        s.model = name;
        s.gpu = "H100";
        ServingOptions o;
        o.max_model_len = 4096;
        const auto sa = serving_memory(s, o);
        s.model = path;
        const auto sb = serving_memory(s, o);
        ASSERT_TRUE(sa.ok() && sb.ok()) << name;
        EXPECT_EQ(sa.value().kv_cache_tokens, sb.value().kv_cache_tokens) << name;
        EXPECT_EQ(sa.value().per_gpu.weights, sb.value().per_gpu.weights) << name;
    }
}

// Hostile documents: wrong format or version, indices out of range, bad
// enums, sizes and types, each refused with the field it names.
TEST(GraphJson, HostileDocumentsNameTheField) {
    const json base = graph_to_json(load_model("smollm2-135m").value());
    struct Case {
        std::string what;
        std::function<void(json&)> edit;
        std::string field;
    };
    const std::vector<Case> cases = {
        {"format", [](json& d) { d["format"] = "onnx"; }, "format"},
        {"version", [](json& d) { d["version"] = 7; }, "version"},
        {"no blocks", [](json& d) { d["blocks"] = json::array(); }, "blocks"},
        {"output", [](json& d) { d["blocks"][1]["output"] = 100000; }, "blocks[1].output"},
        {"op input", [](json& d) { d["blocks"][1]["ops"][0]["inputs"] = {-1}; }, "blocks[1].ops[0].inputs"},
        {"op kind", [](json& d) { d["blocks"][1]["ops"][0]["kind"] = "teleport"; }, "blocks[1].ops[0].kind"},
        {"saved", [](json& d) { d["blocks"][1]["ops"][0]["saved"] = {{{"tensor", 99999}}}; }, "blocks[1].ops[0].saved[0].tensor"},
        {"param index", [](json& d) { d["blocks"][1]["ops"][1]["params"] = {999}; }, "blocks[1].ops[1].params"},
        {"shape", [](json& d) { d["blocks"][1]["params"][0]["shape"] = {0, 3}; }, "blocks[1].params[0].shape"},
        {"huge shape", [](json& d) { d["blocks"][1]["params"][0]["shape"] = {1LL << 39, 1LL << 39}; }, "blocks[1].params[0].shape"},
        {"dtype", [](json& d) { d["blocks"][1]["params"][0]["dtype"] = "float7"; }, "blocks[1].params[0].dtype"},
        {"extent", [](json& d) { d["blocks"][1]["tensors"][0]["extent"] = {1, -2, 0}; }, "blocks[1].tensors[0].extent"},
        {"alias", [](json& d) { d["blocks"][1]["tensors"][1]["alias_of"] = 5; }, "blocks[1].tensors[1].alias_of"},
        {"role", [](json& d) { d["blocks"][1]["tensors"][1]["role"] = 3; }, "blocks[1].tensors[1].role"},
        {"repeat", [](json& d) { d["blocks"][1]["repeat"] = 0; }, "blocks[1].repeat"},
        {"layers flags", [](json& d) { d["transformer"]["sliding_layers"] = {true}; }, "transformer.sliding_layers"},
        {"kv heads", [](json& d) { d["transformer"]["kv_heads"] = 7; }, "transformer.kv_heads"},
        {"not an object", [](json& d) { d["blocks"][0] = 3; }, "blocks[0]"},
    };
    for (const auto& c : cases) {
        json d = base;
        c.edit(d);
        const auto r = graph_from_json(d, "g.json");
        ASSERT_FALSE(r.ok()) << c.what;
        EXPECT_EQ(r.error().field, c.field) << c.what << ": " << r.error().message;
        EXPECT_NE(r.error().message.find("g.json"), std::string::npos) << c.what;
    }
    // Random damage: any value replaced anywhere never crashes.
    std::uint64_t seed = 7;
    auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
    const std::vector<json> junk = {json(-1), json(1LL << 45), json("x"), json(nullptr), json::array(), json::object(), json(2.5), json(true)};
    std::vector<json::json_pointer> leaves;
    const json flat = base.flatten();
    for (auto it = flat.begin(); it != flat.end(); ++it) leaves.emplace_back(it.key());
    int refused = 0;
    for (int i = 0; i < 3000; ++i) {
        json d = base;
        d[leaves[next() % leaves.size()]] = junk[next() % junk.size()];
        const auto r = graph_from_json(d, "g.json");
        if (!r.ok()) ++refused;
    }
    EXPECT_GT(refused, 1000);
}

// A file written by an older or newer gpumem is named with its version.
TEST(GraphJson, LoadedThroughLoadModel) {
    json doc = graph_to_json(load_model("gpt2").value());
    const std::string ok = write_temp(doc, "gpt2-graph.json");
    const auto g = load_model(ok);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g.value().total_params(), load_model("gpt2").value().total_params());
    doc["version"] = 2;
    const auto bad = load_model(write_temp(doc, "gpt2-v2.json"));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("version 2"), std::string::npos) << bad.error().message;
}
