// gpumem serving --engine llama.cpp (memory/llamacpp.hpp) against public
// llama.cpp load logs (tests/fixtures/groundtruth/llamacpp_logs.json: the
// buffers each log prints, with the settings it ran with) and against the
// rules read from llama.cpp's source (docs/research/llamacpp.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "gpumem/memory/llamacpp.hpp"
#include "gpumem/memory/serving.hpp"
#include "gpumem/model/load.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

constexpr double kMiB = 1048576.0;
double mib(Bytes b) { return static_cast<double>(b.count()) / kMiB; }

// Fixture rows whose model has a preset here, and the llama.cpp era whose
// rules the build that printed them follows (builds before the 2025-07..12
// changes: "2025-06"; the fixture's llama_cpp_build says which).
struct Case {
    const char* preset;
    const char* era;
};
const std::map<std::string, Case> kCases = {
    {"ci-pythia-2.8b-f16", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q2_k", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q3_k", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q4_0", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q4_k", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q5_k", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q6_k", {"pythia-2.8b", "2025-06"}},
    {"ci-pythia-2.8b-q8_0", {"pythia-2.8b", "2025-06"}},
    {"ollama-r1-distill-llama8b-q4km", {"llama-3.1-8b", "2025-06"}},
    {"mistral7b-v01-q4km-ngl20", {"mistral-7b-v0.1", "2025-06"}},
    {"phi3-mini-q4km-ub256", {"phi-3-mini", "2025-06"}},
    {"llama32-3b-q4km", {"llama-3.2-3b", "2026-04"}},
    {"metal-llama3-8b-np1", {"llama-3-8b", "2026-04"}},
    {"metal-llama3-8b-np4", {"llama-3-8b", "2026-04"}},
    {"metal-llama3-8b-q8kv", {"llama-3-8b", "2026-04"}},
    {"cpu-llama31-8b-q3kl-131k", {"llama-3.1-8b", "2025-06"}},
    {"graviton3-dolphin-llama31-8b-q4_0", {"llama-3.1-8b", "2025-06"}},
    {"ollama-gb10-llama31-8b-q4_0", {"llama-3.1-8b", "2026-04"}},
    {"qwen3-4b-q4km", {"qwen3-4b", "2026-04"}},
    {"jina-v4-qwen25vl3b-q8_0-ub4096", {"qwen2.5-3b-instruct", "2025-06"}},  // the VL model's text stack: Qwen2.5-3B's shape
};

// The Pythia CI rows name the file type by its file (q3_k = Q3_K_M, q4_k = Q4_K_M, q5_k = Q5_K_M).
std::string file_type_of(const nlohmann::json& row) { return row["ftype"].get<std::string>(); }

struct LoadRun {
    std::string id;
    ServingResult r;
    nlohmann::json row;
};

std::vector<LoadRun> runs() {
    const auto fx = test::read_json("tests/fixtures/groundtruth/llamacpp_logs.json");
    std::vector<LoadRun> out;
    for (const auto& row : fx["logs"]) {
        const std::string id = row["id"].get<std::string>();
        const auto it = kCases.find(id);
        if (it == kCases.end()) continue;
        EstimateRequest job;
        job.model = it->second.preset;
        job.gpu = "RTX-4090";
        job.gpu_memory = GiB(1024);  // the logs' cards differ; capacity does not change the buffers
        ServingOptions o;
        o.engine = Engine::LlamaCpp;
        o.engine_version = it->second.era;
        o.quant = file_type_of(row);
        if (row["ngl"].is_number()) o.n_gpu_layers = row["ngl"].get<std::int64_t>();
        o.ctx_size = row["n_ctx"].get<std::int64_t>();
        if (row["n_batch"].is_number()) o.max_num_batched_tokens = row["n_batch"].get<std::int64_t>();
        if (row["n_ubatch"].is_number()) o.ubatch_size = row["n_ubatch"].get<std::int64_t>();
        if (row["flash_attn"].is_boolean()) o.flash_attn = row["flash_attn"].get<bool>() ? "on" : "off";
        o.cache_type_k = row["type_k"].get<std::string>();
        o.cache_type_v = row["type_v"].get<std::string>();
        if (row["n_parallel"].is_number()) o.max_num_seqs = row["n_parallel"].get<std::int64_t>();
        auto r = serving_memory(job, o);
        EXPECT_TRUE(r.ok()) << id << ": " << (r.ok() ? "" : r.error().message);
        if (r.ok()) out.push_back({id, r.value(), row});
    }
    return out;
}

}  // namespace

// Model buffers: the per-tensor types of llama-quantize's mix, CUDA's padding
// and the mmap span give every logged size to the printed precision (0.01 MiB)
// plus what the file holds that a config does not (rope_freqs 256 B; the
// dolphin file's 2 extra vocabulary rows, 0.02 MiB); Metal rows print whole MiB.
TEST(LlamaCpp, ModelBuffersMatchPublicLogs) {
    int checked = 0;
    for (const LoadRun& x : runs()) {
        const auto& mb = x.row["model_buffer_mib"];
        const bool metal = mb.contains("MTL0");
        const double tol = metal ? 1.0 : 0.03;
        if (mb.contains("CUDA0") || metal) {
            const double logged = mb.contains("CUDA0") ? mb["CUDA0"].get<double>() : mb["MTL0"].get<double>();
            EXPECT_NEAR(mib(x.r.per_gpu.weights), logged, tol) << x.id;
            ++checked;
        }
        if (mb.contains("CPU_Mapped")) {
            EXPECT_NEAR(mib(x.r.host->model_mapped), mb["CPU_Mapped"].get<double>(), 0.03) << x.id;
            ++checked;
        }
        if (mb.contains("CPU")) {  // CPU-only runs: the whole file
            EXPECT_NEAR(mib(x.r.host->model_mapped), mb["CPU"].get<double>(), 0.03) << x.id;
            ++checked;
        }
    }
    EXPECT_GE(checked, 20);
}

// KV buffers: cells x the device's layers x (K row + V row), exact.
TEST(LlamaCpp, KvBuffersMatchPublicLogs) {
    int checked = 0;
    for (const LoadRun& x : runs()) {
        const auto& kv = x.row["kv_buffer_mib"];
        for (const auto& [dev, v] : kv.items()) {
            const double logged = v.get<double>();
            const double got = dev == "CPU" ? mib(x.r.host->kv_cache) : dev == "total" ? mib(x.r.per_gpu.kv_cache + x.r.host->kv_cache) : mib(x.r.per_gpu.kv_cache);
            EXPECT_NEAR(got, logged, 0.005) << x.id << " " << dev;
            ++checked;
        }
    }
    EXPECT_GE(checked, 17);
}

// Compute buffers are estimates fitted to these logs (docs/research/llamacpp.md
// 3c): within 2% where the build's reserve graph is the one the fit describes.
TEST(LlamaCpp, ComputeBuffersWithinTwoPercentOfOlderBuilds) {
    int checked = 0;
    for (const LoadRun& x : runs()) {
        if (x.r.engine_version != "2025-06") continue;
        const auto& cb = x.row["compute_buffer_mib"];
        if (cb.contains("CUDA0")) {
            EXPECT_NEAR(mib(x.r.per_gpu.activation_peak) / cb["CUDA0"].get<double>(), 1.0, 0.02) << x.id;
            ++checked;
        }
        const char* host = cb.contains("CUDA_Host") ? "CUDA_Host" : cb.contains("CPU") ? "CPU" : nullptr;
        if (host) {
            EXPECT_NEAR(mib(x.r.host->compute) / cb[host].get<double>(), 1.0, 0.02) << x.id << " " << host;
            ++checked;
        }
    }
    EXPECT_GE(checked, 20);
}

// The type mix, tensor by tensor, as llama_model_loader counts it: the logs'
// "type q4_K: 193 tensors" lines (f32 counts differ by rope_freqs, which a
// config does not describe).
TEST(LlamaCpp, TensorTypeCountsMatchTheLoaderLines) {
    const auto fx = test::read_json("tests/fixtures/groundtruth/llamacpp_logs.json");
    int checked = 0;
    for (const auto& row : fx["logs"]) {
        const auto it = kCases.find(row["id"].get<std::string>());
        if (it == kCases.end() || !row.contains("tensor_type_counts") || row["tensor_type_counts"].is_null()) continue;
        const ModelGraph g = load_model(it->second.preset).value();
        const LlamaModel m = llama_model_from_graph(g, row["ftype"].get<std::string>(), std::string(it->second.era) == "2025-06").value();
        std::map<std::string, std::int64_t> got;
        for (const auto& [t, n] : tensor_type_counts(m)) got[t] = n;
        for (const auto& [t, n] : row["tensor_type_counts"].items()) {
            if (t == "f32") continue;
            EXPECT_EQ(got[t], n.get<std::int64_t>()) << row["id"] << " " << t;
            ++checked;
        }
    }
    EXPECT_GE(checked, 10);
}

// use_more_bits (llama-quant.cpp L417-419) for 32 layers picks 16: 0-3, 6, 9,
// ..., 27, 28-31; Q4_K_M gives those attn_v and ffn_down tensors q6_K.
TEST(LlamaCpp, Q4KMGivesSixteenLayersQ6K) {
    const LlamaModel m = llama_model_from_graph(load_model("llama-3.1-8b").value(), "Q4_K_M", false).value();
    std::vector<int> q6_layers;
    for (const auto& t : m.tensors)
        if (t.name.find("attn_v.weight") != std::string::npos && std::string(t.type->name) == "q6_K") q6_layers.push_back(t.layer);
    const std::vector<int> expect = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    EXPECT_EQ(q6_layers, expect);
}

// The command line: llama-server's flags, a MODEL before -- standing in for -m.
TEST(LlamaCpp, CommandLine) {
    EstimateRequest job;
    job.model = "llama-3.1-8b";
    job.gpu = "RTX-4090";
    ServingOptions o;
    o.quant = "Q4_K_M";
    o.command = {"llama-server", "-m", "model.gguf", "-ngl", "99", "-c", "16384", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--port", "8080"};
    const ServingResult r = serving_memory(job, o).value();
    EXPECT_EQ(r.engine, "llama.cpp");
    ASSERT_TRUE(r.llamacpp.has_value());
    EXPECT_EQ(r.llamacpp->n_ctx, 16384);
    EXPECT_EQ(r.llamacpp->type_k, "q8_0");
    // 16384 cells x 32 layers x 2 x (1024 / 32 x 34 bytes) (q8_0 rows, ggml-common.h).
    EXPECT_EQ(r.per_gpu.kv_cache.count(), 16384LL * 32 * 2 * (1024 / 32 * 34));
    // llama-server without -np: 4 slots sharing one stream (server.cpp L95-99).
    EXPECT_EQ(r.llamacpp->n_parallel, 4);
    EXPECT_TRUE(r.llamacpp->kv_unified);

    ServingOptions bad = o;
    bad.command = {"llama-server", "-ngl", "99", "--frobnicate"};
    const auto e = serving_memory(job, bad);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find("--frobnicate"), std::string::npos);

    ServingOptions vq = o;  // quantized V without flash attention
    vq.command = {"llama-server", "-fa", "off", "-ctv", "q4_0"};
    const auto e2 = serving_memory(job, vq);
    ASSERT_FALSE(e2.ok());
    EXPECT_NE(e2.error().message.find("flash attention"), std::string::npos);

    ServingOptions noq;  // no file, no --quant
    noq.engine = Engine::LlamaCpp;
    const auto e3 = serving_memory(job, noq);
    ASSERT_FALSE(e3.ok());
    EXPECT_EQ(e3.error().field, "quant");
}

// -ngl: the output layer first, then the last repeating layers
// (llama-model.cpp@a95a11e5b834 L3048); what does not fit is an answer.
TEST(LlamaCpp, PartialOffloadAndFit) {
    EstimateRequest job;
    job.model = "llama-3.1-8b";
    job.gpu = "RTX-4090";
    job.gpu_memory = GiB(4);
    ServingOptions o;
    o.engine = Engine::LlamaCpp;
    o.quant = "Q4_K_M";
    o.ctx_size = 8192;
    const ServingResult all = serving_memory(job, o).value();
    EXPECT_FALSE(all.per_gpu.fits);
    EXPECT_FALSE(all.error.empty());
    ASSERT_TRUE(all.llamacpp.has_value());
    const std::int64_t k = all.llamacpp->fit_gpu_layers;
    EXPECT_GT(k, 0);
    EXPECT_LT(k, 33);
    o.n_gpu_layers = k;
    const ServingResult part = serving_memory(job, o).value();
    EXPECT_TRUE(part.per_gpu.fits) << part.error;
    EXPECT_TRUE(part.error.empty());
    // k - 1 repeating layers' KV on the GPU, the rest on the host: 8192 cells x 2 x 1024 x 2 bytes per layer.
    const std::int64_t per_layer = 8192LL * 2 * 1024 * 2;
    EXPECT_EQ(part.per_gpu.kv_cache.count(), (k - 1) * per_layer);
    EXPECT_EQ(part.host->kv_cache.count(), (32 - (k - 1)) * per_layer);
    o.n_gpu_layers = k + 1;
    EXPECT_FALSE(serving_memory(job, o).value().per_gpu.fits);
}

// -ts 1,1: the 33 layers (32 blocks and the output layer) are cut at half:
// layer il goes to GPU 0 while il / 33 < 0.5 (llama-model.cpp@a95a11e5b834
// L3014-3057), so GPU 0 holds blocks 0-16 and GPU 1 blocks 17-31 and the output.
TEST(LlamaCpp, TensorSplit) {
    EstimateRequest job;
    job.model = "llama-3.1-8b";
    job.gpu = "RTX-4090";
    ServingOptions o;
    o.engine = Engine::LlamaCpp;
    o.quant = "Q8_0";
    o.ctx_size = 4096;
    const ServingResult one = serving_memory(job, o).value();
    o.tensor_split = "1,1";
    const ServingResult two = serving_memory(job, o).value();
    ASSERT_EQ(two.per_rank.size(), 2u);
    EXPECT_EQ(two.per_rank[0].kv_cache + two.per_rank[1].kv_cache, one.per_gpu.kv_cache);
    const std::int64_t per_layer = 4096LL * 2 * 1024 * 2;
    EXPECT_EQ(two.per_rank[0].kv_cache.count(), 17 * per_layer);
    EXPECT_EQ(two.per_rank[1].kv_cache.count(), 15 * per_layer);
}

namespace {

// A GGUF v3 header (ggml/include/gguf.h: magic, version, counts, key/values,
// tensor infos; data section aligned to 32), written here independently of
// the reader.
struct GgufWriter {
    std::string b;
    void u32(std::uint32_t v) {
        for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
    void u64(std::uint64_t v) {
        for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
    void str(const std::string& s) {
        u64(s.size());
        b += s;
    }
};

}  // namespace

// A .gguf file: its own tensor types and offsets decide the buffers.
TEST(LlamaCpp, ReadsTheGgufHeader) {
    struct T {
        std::string name;
        std::vector<std::int64_t> ne;
        int type;  // ggml_type: 0 f32, 12 q4_K, 14 q6_K
    };
    std::vector<T> ts = {{"token_embd.weight", {512, 1000}, 12}};
    for (int l = 0; l < 2; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        ts.push_back({p + "attn_norm.weight", {512}, 0});
        ts.push_back({p + "attn_q.weight", {512, 512}, 12});
        ts.push_back({p + "attn_k.weight", {512, 128}, 12});
        ts.push_back({p + "attn_v.weight", {512, 128}, 14});
        ts.push_back({p + "attn_output.weight", {512, 512}, 12});
        ts.push_back({p + "ffn_norm.weight", {512}, 0});
        ts.push_back({p + "ffn_gate.weight", {512, 1024}, 12});
        ts.push_back({p + "ffn_up.weight", {512, 1024}, 12});
        ts.push_back({p + "ffn_down.weight", {1024, 512}, 14});
    }
    ts.push_back({"output_norm.weight", {512}, 0});
    ts.push_back({"output.weight", {512, 1000}, 14});
    // Bytes per tensor from the block sizes (ggml-common.h: q4_K 256 values in
    // 144 bytes, q6_K 256 in 210, f32 4 bytes each).
    const auto bytes = [](const T& t) -> std::int64_t {
        std::int64_t rows = 1;
        for (std::size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
        const std::int64_t row = t.type == 0 ? t.ne[0] * 4 : t.type == 12 ? t.ne[0] / 256 * 144 : t.ne[0] / 256 * 210;
        return row * rows;
    };
    GgufWriter w;
    w.b = "GGUF";
    w.u32(3);
    w.u64(ts.size());
    w.u64(8);
    const auto kv_u32 = [&](const std::string& k, std::uint32_t v) {
        w.str(k);
        w.u32(4);
        w.u32(v);
    };
    w.str("general.architecture");
    w.u32(8);
    w.str("llama");
    kv_u32("llama.block_count", 2);
    kv_u32("llama.embedding_length", 512);
    kv_u32("llama.attention.head_count", 8);
    kv_u32("llama.attention.head_count_kv", 2);
    kv_u32("llama.context_length", 4096);
    kv_u32("llama.feed_forward_length", 1024);
    kv_u32("general.file_type", 15);
    std::uint64_t off = 0;
    for (const T& t : ts) {
        w.str(t.name);
        w.u32(static_cast<std::uint32_t>(t.ne.size()));
        for (auto n : t.ne) w.u64(static_cast<std::uint64_t>(n));
        w.u32(static_cast<std::uint32_t>(t.type));
        w.u64(off);
        off += static_cast<std::uint64_t>((bytes(t) + 31) / 32 * 32);
    }
    while (w.b.size() % 32) w.b.push_back('\0');
    w.b.append(off, '\0');
    const std::string path = (std::filesystem::temp_directory_path() / "gpumem-test-tiny-llama.gguf").string();
    {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        std::fwrite(w.b.data(), 1, w.b.size(), f);
        std::fclose(f);
    }
    EstimateRequest job;
    job.gpu = "RTX-4090";
    ServingOptions o;
    o.command = {"llama-server", "-m", path, "-ngl", "99", "-c", "1024", "-np", "1"};
    const auto r = serving_memory(job, o);
    std::remove(path.c_str());
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::int64_t gpu = 0;
    for (const T& t : ts)
        if (t.name != "token_embd.weight") gpu += (bytes(t) + 127) / 128 * 128;  // 128-byte CUDA buffers; rows of 512 need no padding
    EXPECT_EQ(r.value().per_gpu.weights.count(), gpu);
    EXPECT_EQ(r.value().host->model_mapped.count(), bytes(ts[0]));  // only token_embd stays on the CPU
    // 1024 cells x 2 layers x (K + V rows of 2 heads x 64 in f16).
    EXPECT_EQ(r.value().per_gpu.kv_cache.count(), 1024LL * 2 * (128 * 2 + 128 * 2));
    EXPECT_EQ(r.value().llamacpp->file_type, "Q4_K_M");
}

// gpumem fit --engine: what fits that engine, the same figures serving gives.
TEST(LlamaCpp, FitWithEngine) {
    const auto fit = test::run_cli("fit llama-3.1-8b --engine llama.cpp --quant Q4_K_M --gpu RTX-4090 --gpu-memory 5GiB --ctx-size 8192 --format json");
    const auto serving = test::run_cli("serving llama-3.1-8b --engine llama.cpp --quant Q4_K_M --gpu RTX-4090 --gpu-memory 5GiB --ctx-size 8192 --format json");
    ASSERT_EQ(fit.exit_code, 0) << fit.err;
    ASSERT_EQ(serving.exit_code, 0) << serving.err;
    const auto a = nlohmann::json::parse(fit.out), b = nlohmann::json::parse(serving.out);
    EXPECT_EQ(a["llamacpp"]["fit_gpu_layers"], b["llamacpp"]["fit_gpu_layers"]);
    EXPECT_EQ(a["fit_max_model_len"], b["fit_max_model_len"]);
    // 5 GiB cannot hold all 33 layers: 4.3 GiB of Q4_K_M weights (llama.cpp logs 4403.49 MiB) + 1 GiB of KV (8192 x 32 x 2 x 1024 x 2 B) + 0.5 GiB context.
    EXPECT_LT(a["llamacpp"]["fit_gpu_layers"].get<int>(), 33);
    // fit without --engine keeps the training meaning of --quant.
    const auto q = test::run_cli("fit llama-3.1-8b --mode qlora --quant nf4 --gpu RTX-4090 --analytic --format json");
    EXPECT_EQ(q.exit_code, 0) << q.err;
}

// Sliding-window layers (llama-kv-cache-iswa.cpp@a95a11e5b834 L50): Gemma-3-4B
// has 29 of its 34 layers sliding over 1024 tokens; with -c 16384, one slot and
// -ub 512 they keep PAD256(min(16384, 1024 + 512)) = 1536 cells, the 5 global
// layers 16384; a cell is K + V of 4 heads x 256 in f16 = 4096 bytes a layer.
// --swa-full gives every layer the whole context.
TEST(LlamaCpp, SlidingWindowCells) {
    EstimateRequest job;
    job.model = "gemma-3-4b-it";
    job.gpu = "RTX-4090";
    ServingOptions o;
    o.engine = Engine::LlamaCpp;
    o.quant = "Q4_K_M";
    o.ctx_size = 16384;
    o.max_num_seqs = 1;
    EXPECT_EQ(serving_memory(job, o).value().per_gpu.kv_cache.count(), (5LL * 16384 + 29LL * 1536) * 4096);
    o.swa_full = true;
    EXPECT_EQ(serving_memory(job, o).value().per_gpu.kv_cache.count(), 34LL * 16384 * 4096);
}

// The decode roofline with every layer on the GPU: one token of one request
// reads the model buffer (llama.cpp logs 4403.49 MiB for Llama-3.1-8B Q4_K_M)
// and its KV at the mean context, at 80% of the RTX 4090's 1,008 GB/s (NVIDIA
// datasheet); the KV cell of Llama-3.1-8B is 32 x 2 x 1024 x 2 B.
TEST(LlamaCpp, DecodeRoofline) {
    const auto r = test::run_cli("serving llama-3.1-8b --quant Q4_K_M --gpu RTX-4090 --request-len 4096 --output-len 256 --format json -- llama-server -c 16384 -np 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_FALSE(j["throughput"].empty());
    const double weights = 4403.49 * 1048576.0, mean_ctx = 3840.0 + 128.0, cell = 32.0 * 2 * 1024 * 2;
    EXPECT_NEAR(j["throughput"][0]["decode_tokens_per_second"].get<double>(), 0.8 * 1008e9 / (weights + mean_ctx * cell), 0.5);
}

// Every file type llama-quantize makes (K-quants, IQ1-IQ4, TQ, Q2_K_S,
// MXFP4_MOE), tensor by tensor, against llama.cpp's own snapshot test
// (tests/fixtures/groundtruth/llamacpp_quant_mix.json: tests/snapshots at
// a95a11e5b834, written without an importance matrix) for the models gpumem
// has as presets: each quantized tensor gets the snapshot's type, or the
// section's default where the snapshot names none, and every tensor the
// snapshot names exists.
TEST(LlamaCpp, QuantMixMatchesLlamaCppSnapshots) {
    const auto fx = test::read_json("tests/fixtures/groundtruth/llamacpp_quant_mix.json");
    int sections = 0;
    for (const auto& [model, m] : fx["models"].items()) {
        const ModelGraph g = load_model(m["preset"].get<std::string>()).value();
        for (const auto& [ftype, sec] : m["sections"].items()) {
            const auto built = llama_model_from_graph(g, ftype, false, false);
            ASSERT_TRUE(built.ok()) << model << " " << ftype << ": " << built.error().message;
            std::map<std::string, std::string> ours;
            for (const auto& t : built.value().tensors)
                if (t.ne.size() >= 2 && t.name.find("ffn_gate_inp") == std::string::npos && t.name.find("position_embd") == std::string::npos)
                    ours[t.name] = t.type->name;
            int wrong = 0;
            for (const auto& [name, type] : ours) {
                const auto it = sec["tensors"].find(name);
                const std::string want = it != sec["tensors"].end() ? it->get<std::string>() : sec["default"].get<std::string>();
                if (type != want && ++wrong <= 3) ADD_FAILURE() << model << " " << ftype << " " << name << ": " << type << ", llama.cpp " << want;
            }
            for (const auto& [name, type] : sec["tensors"].items())
                if (!ours.count(name) && ++wrong <= 3) ADD_FAILURE() << model << " " << ftype << ": no tensor " << name << " (llama.cpp " << type.get<std::string>() << ")";
            ++sections;
        }
    }
    EXPECT_EQ(sections, 4 * 33);
}

// Public llama.cpp load logs of files made with llama-quantize's mixes
// ("llama_model_loader: - type X: N tensors"; f32 not compared): lmstudio-
// community's Meta-Llama-3-8B-Instruct IQ3_M (q4_K 68, q6_K 1, iq3_s 157;
// a public notes repository, search-index id 23917178211), bartowski's
// Phi-3-mini-based sum-small IQ1_S, made with an importance matrix before
// #19770 (q2_K 5, q5_K 1, iq2_xxs 32, iq1_s 92; an LM Studio log, id
// 67227775119), and ggml-org's gpt-oss-20b MXFP4_MOE (q8_0 98, mxfp4 72;
// llama.cpp load logs, ids 38767054125, 59932672849).
TEST(LlamaCpp, IqAndMxfp4MixesMatchPublicLogs) {
    struct Case {
        const char* preset;
        const char* ftype;
        bool old_qkv;
        std::map<std::string, std::int64_t> counts;
    };
    const std::vector<Case> cases = {
        {"llama-3-8b", "IQ3_M", false, {{"q4_K", 68}, {"q6_K", 1}, {"iq3_s", 157}}},
        {"phi-3-mini", "IQ1_S", true, {{"q2_K", 5}, {"q5_K", 1}, {"iq2_xxs", 32}, {"iq1_s", 92}}},
        {"gpt-oss-20b", "MXFP4_MOE", false, {{"q8_0", 98}, {"mxfp4", 72}}},
    };
    for (const auto& c : cases) {
        const LlamaModel m = llama_model_from_graph(load_model(c.preset).value(), c.ftype, c.old_qkv).value();
        std::map<std::string, std::int64_t> got;
        for (const auto& [t, n] : tensor_type_counts(m))
            if (t != "f32") got[t] = n;
        EXPECT_EQ(got, c.counts) << c.preset << " " << c.ftype;
    }
}
