// The CLI's output contract and its handling of bad input: a one-line
// message naming the file/field and the fix, exit code 2, never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

using gpumem::test::expect_input_error;
using gpumem::test::run_cli;

namespace {

std::string temp_file(const std::string& name, const std::string& content) { return gpumem::test::process_scratch().write(name, content); }

// A safetensors file: 8-byte little-endian header length, JSON header, data.
std::string safetensors(const std::string& header, std::uint64_t declared_len, std::size_t data_bytes) {
    std::string s;
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((declared_len >> (8 * i)) & 0xff));
    s += header;
    s += std::string(data_bytes, '\0');
    return s;
}

}  // namespace

TEST(Cli, EstimateJsonContract) {
    const auto r = run_cli("estimate llama-3-8b --batch 4 --seq 4096 --gpu A100-80GB --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["params"]["total"].get<std::int64_t>(), 8030261248);  // param_counts.json
    for (const char* k : {"weights", "gradients", "optimizer_states", "activations", "kv_cache", "peak_allocated",
                          "peak_reserved", "total_device"})
        EXPECT_TRUE(j["per_gpu"][k].is_number_integer()) << k;
    EXPECT_TRUE(j["per_gpu"]["fits"].is_boolean());
    // AMP bf16 + AdamW: fp32 weights, fp32 grads, two fp32 moments.
    EXPECT_EQ(j["per_gpu"]["weights"].get<std::int64_t>(), 4 * 8030261248LL);
    EXPECT_EQ(j["per_gpu"]["optimizer_states"].get<std::int64_t>(), 8 * 8030261248LL);
    // 8B full fine-tuning with AdamW needs > 128 GB of model states: no 80 GB GPU fits it.
    EXPECT_FALSE(j["per_gpu"]["fits"].get<bool>());
}

TEST(Cli, FormatsAndListings) {
    EXPECT_EQ(run_cli("models").exit_code, 0);
    EXPECT_NE(run_cli("models --format csv").out.find("llama-3-8b,llama"), std::string::npos);
    EXPECT_NE(run_cli("gpus").out.find("H100-80GB"), std::string::npos);
    const auto md = run_cli("estimate gpt2 --seq 1024 --format markdown");
    EXPECT_EQ(md.exit_code, 0);
    EXPECT_NE(md.out.find("| part |"), std::string::npos);
    const auto csv = run_cli("estimate gpt2 --seq 1024 --format csv");
    // CSV: plain numbers, the unit in the header, and the verdict (issue 11's contract)
    EXPECT_EQ(csv.out.rfind("part,bytes,detail\n", 0), 0u);
    EXPECT_NE(csv.out.find("\ncapacity,85018542080,H100-80GB\n"), std::string::npos);  // 79.18 GiB = 81080 MiB, as CUDA reports it (gpu_catalog.cpp)
    EXPECT_NE(csv.out.find("\nfits,1,fits\n"), std::string::npos);
    const auto p = run_cli("params gpt2 --format json");
    EXPECT_EQ(nlohmann::json::parse(p.out)["params"]["total"].get<std::int64_t>(), 124439808);
    const auto seven = run_cli("estimate --params 7B --precision fp16 --optimizer adam --format json");
    const auto j = nlohmann::json::parse(seven.out);
    EXPECT_EQ(j["per_gpu"]["weights"].get<std::int64_t>() + j["per_gpu"]["gradients"].get<std::int64_t>() +
                  j["per_gpu"]["optimizer_states"].get<std::int64_t>(),
              112'000'000'000);
}

TEST(CliBadInput, MalformedAndTruncatedJson) {
    const auto bad = temp_file("bad.json", "{\"model_type\": \"llama\", \"hidden_size\": }");
    expect_input_error(run_cli("estimate " + bad), "bad.json");
    const auto trunc = temp_file("truncated.json", "{\"model_type\": \"llama\", \"hidden_size\": 4096, ");
    expect_input_error(run_cli("params " + trunc), "truncated.json");
}

TEST(CliBadInput, MissingOrWrongField) {
    const auto wrong = temp_file("wrong.json", R"({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100})");
    expect_input_error(run_cli("estimate " + wrong), "hidden_size");
    const auto unknown = temp_file("unknown.json", R"({"model_type": "foo"})");
    const auto r = run_cli("estimate " + unknown);
    expect_input_error(r, "model_type");
    EXPECT_NE(r.err.find("llama"), std::string::npos) << "should list supported types: " << r.err;
    const auto layers = temp_file("layers.json", R"({"name": "x", "input": {"shape": [8]}, "layers": [{"type": "linear", "out": 4}], "loss": "sum"})");
    expect_input_error(run_cli("estimate " + layers), "in");
}

TEST(CliBadInput, SafetensorsHeaders) {
    const gpumem::test::ScratchDir scratch("st_bad");
    const auto& dir = scratch.path();
    const std::string config = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})";
    std::ofstream(dir / "config.json") << config;
    auto write = [&](const std::string& content) { std::ofstream(dir / "model.safetensors", std::ios::binary) << content; };

    // Header length beyond the end of the file.
    write(safetensors("{}", 1'000'000, 0));
    expect_input_error(run_cli("estimate " + dir.string()), "model.safetensors");
    // Overlapping data offsets.
    const std::string overlap = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
    write(safetensors(overlap, overlap.size(), 24));
    expect_input_error(run_cli("estimate " + dir.string()), "overlap");
    // A shape whose byte count overflows 64 bits.
    const std::string huge = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}})";
    write(safetensors(huge, huge.size(), 16));
    expect_input_error(run_cli("estimate " + dir.string()), "a");
}

TEST(CliBadInput, Flags) {
    expect_input_error(run_cli("estimate gpt2 --batch 0"), "--batch");
    expect_input_error(run_cli("estimate gpt2 --batch -3"), "--batch");
    expect_input_error(run_cli("estimate gpt2 --precision fp8"), "--precision");
    expect_input_error(run_cli("estimate gpt2 --optimizer adamx"), "adamw");
    expect_input_error(run_cli("estimate gpt2 --gpu Z100"), "--gpu");
    expect_input_error(run_cli("estimate gpt2 --gpu-memory lots"), "--gpu-memory");
    expect_input_error(run_cli("estimate no-such-model"), "no-such-model");
    expect_input_error(run_cli("estimate --params -7B"), "params");
    expect_input_error(run_cli("estimate llama-2-7b --mode lora --lora-targets nothing_here"), "lora-targets");
}

TEST(CliBadInput, SequenceBeyondMaximumWarns) {
    const auto r = run_cli("estimate gpt2 --seq 4096 --format json");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.err.find("warning"), std::string::npos);
    EXPECT_NE(r.err.find("1024"), std::string::npos);  // gpt2's n_positions
    EXPECT_FALSE(nlohmann::json::parse(r.out)["warnings"].empty());
}
