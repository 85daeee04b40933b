// vLLM's paged KV cache arithmetic (memory/paged_kv.hpp) against public vLLM
// start-up logs (tests/fixtures/groundtruth/vllm_startup_logs.json): from the
// "Available KV cache memory" a log prints, the blocks, "GPU KV cache size: N
// tokens" and "Maximum concurrency" it prints, for every V1 row whose model
// gpumem has as a preset and whose layers are all full attention; and the
// weights per rank against "Model loading took X GiB".
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/paged_kv.hpp"
#include "gpumem/model/load.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

const std::map<std::string, std::string> kPresets = {
    {"meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"},
    {"Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"},
};

}  // namespace

TEST(PagedKv, VllmLogsBlocksTokensAndConcurrency) {
    const auto fx = test::read_json("tests/fixtures/groundtruth/vllm_startup_logs.json");
    int checked = 0;
    for (const auto& row : fx["rows"]) {
        if (row["engine"] != "V1" || row["available_kv_cache_gib"].is_null() || row["num_gpu_blocks"].is_null()) continue;
        const auto it = kPresets.find(row["model"].get<std::string>());
        if (it == kPresets.end() || !row["quantization"].is_null() || row["pipeline_parallel_size"].get<int>() != 1) continue;
        const auto g = load_model(it->second);
        ASSERT_TRUE(g.ok()) << g.error().message;
        PagedKvRequest r;
        r.tp = row["tensor_parallel_size"].get<std::int64_t>();
        r.max_model_len = row["max_model_len"].get<std::int64_t>();
        r.kv_dtype = row["kv_cache_dtype"] == "fp8" ? DType::F8_E4M3 : DType::BF16;
        // The log rounds the budget to 0.01 GiB: the blocks agree within that.
        const double gib = row["available_kv_cache_gib"].get<double>();
        r.available = {Bytes(static_cast<std::int64_t>(gib * 1073741824.0))};
        const auto res = paged_kv_cache(*g.value().transformer, r);
        ASSERT_TRUE(res.ok()) << res.error().message;
        const std::int64_t logged = row["num_gpu_blocks"].get<std::int64_t>();
        const double slack = std::ceil(0.005 * 1073741824.0 / static_cast<double>(res.value().stages[0].page.count() * res.value().stages[0].layers));
        EXPECT_NEAR(static_cast<double>(res.value().num_blocks), static_cast<double>(logged), slack) << row["id"];
        // From the logged blocks, the logged tokens and concurrency exactly.
        r.available = {res.value().stages[0].page * checked_mul(logged, res.value().stages[0].layers)};
        const auto at = paged_kv_cache(*g.value().transformer, r);
        ASSERT_TRUE(at.ok());
        EXPECT_EQ(at.value().num_blocks, logged) << row["id"];
        EXPECT_EQ(at.value().kv_cache_tokens, row["kv_cache_tokens"].get<std::int64_t>()) << row["id"];
        EXPECT_NEAR(at.value().max_concurrency, row["max_concurrency"].get<double>(), 0.005) << row["id"];
        EXPECT_TRUE(at.value().fits_one_request);
        // "Model loading took X GiB": gpumem's weights per rank within 1%
        // (bf16, the rank's share of every tensor-parallel weight).
        if (row["kv_cache_dtype"] != "fp8") {
            EstimateRequest q;
            q.mode = Mode::Infer;
            q.precision = Precision::BF16;
            q.batch = 1;
            q.seq = 16;
            q.analytic = true;
            q.parallel.tp = r.tp;
            q.parallel.gpus = r.tp;
            const auto e = estimate(g.value(), q);
            ASSERT_TRUE(e.ok()) << e.error().message;
            const double w = static_cast<double>(e.value().per_gpu.weights.count()) / 1073741824.0;
            EXPECT_NEAR(w / row["model_loading_gib"].get<double>(), 1.0, 0.01) << row["id"];
        }
        ++checked;
    }
    EXPECT_GE(checked, 5);
}

// vLLM's get_pp_indices: the remainder goes to the second-to-last stage and
// backwards (61 layers on 4 stages: 15, 15, 16, 15; 5 on 3: 2, 2, 1).
TEST(PagedKv, PipelineLayersAsVllmSplitsThem) {
    EXPECT_EQ(vllm_pp_layers(61, 4), (std::vector<std::int64_t>{15, 15, 16, 15}));
    EXPECT_EQ(vllm_pp_layers(5, 3), (std::vector<std::int64_t>{2, 2, 1}));
    EXPECT_EQ(vllm_pp_layers(32, 2), (std::vector<std::int64_t>{16, 16}));
}

// One request of max_model_len must fit (vLLM refuses to start otherwise):
// Llama-3.1-8B at 131072 tokens needs 131072 x 32 layers x 2 x 8 heads x 128
// x 2 B = 16 GiB; tp beyond the 8 key/value heads replicates them (1 per rank).
TEST(PagedKv, OneRequestMustFitAndHeadsReplicate) {
    const auto g = load_model("llama-3.1-8b");
    ASSERT_TRUE(g.ok());
    PagedKvRequest r;
    r.max_model_len = 131072;
    r.available = {GiB(16) - Bytes(1)};
    auto res = paged_kv_cache(*g.value().transformer, r);
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(res.value().needed_per_request, GiB(16));
    EXPECT_FALSE(res.value().fits_one_request);
    r.available = {GiB(16)};
    EXPECT_TRUE(paged_kv_cache(*g.value().transformer, r).value().fits_one_request);
    r.tp = 16;
    EXPECT_EQ(paged_kv_cache(*g.value().transformer, r).value().stages[0].kv_heads, 1);
    r.tp = 4;
    EXPECT_EQ(paged_kv_cache(*g.value().transformer, r).value().stages[0].kv_heads, 2);
}
