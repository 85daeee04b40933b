// vLLM's paged KV cache arithmetic (memory/paged_kv.hpp) against public vLLM
// start-up logs (tests/fixtures/groundtruth/vllm_startup_logs.json): from the
// "Available KV cache memory" a log prints, the blocks, "GPU KV cache size: N
// tokens" and "Maximum concurrency" it prints, for every V1 row whose model
// gpumem has as a preset and whose layers are all full attention; and the
// weights per rank against "Model loading took X GiB".
#include <gtest/gtest.h>

#include <algorithm>
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
    {"meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"}, {"Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"},
    {"Qwen/Qwen3-8B", "qwen3-8b"},                         {"microsoft/phi-4", "phi-4"},
    {"google/gemma-2-9b-it", "gemma-2-9b-it"},             {"Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b-instruct"},
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
        if (!row["max_num_batched_tokens"].is_null()) r.max_num_batched_tokens = row["max_num_batched_tokens"].get<std::int64_t>();
        // The log rounds the budget to 0.01 GiB: the blocks agree within that.
        const double gib = row["available_kv_cache_gib"].get<double>();
        r.available = {Bytes(static_cast<std::int64_t>(gib * 1073741824.0))};
        const auto res = paged_kv_cache(*g.value().transformer, r);
        ASSERT_TRUE(res.ok()) << res.error().message;
        const std::int64_t logged = row["num_gpu_blocks"].get<std::int64_t>();
        const double slack = std::ceil(0.005 * 1073741824.0 / static_cast<double>(res.value().stages[0].page.count() * res.value().group_size));
        EXPECT_NEAR(static_cast<double>(res.value().num_blocks), static_cast<double>(logged), slack) << row["id"];
        // From the logged blocks, the logged tokens and concurrency exactly.
        r.available = {res.value().stages[0].page * checked_mul(logged, res.value().group_size)};
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

// Gemma-2-9B (42 layers, even ones sliding over 4096 tokens; 8 KV heads x 256)
// on one H100, vLLM 0.19, max_model_len 8192, max_num_batched_tokens 8192: two
// groups of 21 layers share blocks of 16 x 8 x 256 x 2 x 2 B = 131,072 B; the
// log (llm-d-planner v0.19.0, tests/fixtures/groundtruth/vllm_startup_logs.json
// llmd-h100-gemma2-9b-tp1) prints num_gpu_blocks 21110, "GPU KV cache size:
// 168,880 tokens" (21110 // 2 x 16) and "Maximum concurrency for 8,192 tokens
// per request: 20.60x" (21110 / (512 + cdiv(min(4095 + 8192, 8192), 16) + 1)).
TEST(PagedKv, SlidingWindowGroupsGemma2) {
    const auto g = load_model("gemma-2-9b-it");
    ASSERT_TRUE(g.ok());
    const TransformerDims& d = *g.value().transformer;
    EXPECT_EQ(d.sliding_window, 4096);
    PagedKvRequest r;
    r.max_model_len = 8192;
    r.max_num_batched_tokens = 8192;
    r.available = {Bytes(21110LL * 21 * 131072)};
    const auto res = paged_kv_cache(d, r);
    ASSERT_TRUE(res.ok()) << res.error().message;
    EXPECT_EQ(res.value().groups, 2);
    EXPECT_EQ(res.value().group_size, 21);
    EXPECT_EQ(res.value().stages[0].page.count(), 131072);
    EXPECT_EQ(res.value().num_blocks, 21110);
    EXPECT_EQ(res.value().kv_cache_tokens, 168880);
    EXPECT_NEAR(res.value().max_concurrency, 20.60, 0.005);
}

// Parameter counts of the 2025-26 presets from their config.json by the
// architecture's own formula (transformers modeling_qwen3.py / modeling_qwen3_moe.py):
// embeddings V x H (tied: once), per layer q, k, v, o, the MLP (gate, up, down;
// MoE: a router H x E and E experts of 3 x H x moe_I), two norms of H and the
// q/k norms of head_dim, and the final norm. Qwen3-8B's card says 8.2B,
// Qwen3-30B-A3B's 30.5B.
TEST(Presets, Qwen3CountsByFormula) {
    const auto count = [](std::int64_t V, std::int64_t H, std::int64_t L, std::int64_t nh, std::int64_t nkv, std::int64_t hd, std::int64_t I,
                          std::int64_t E, std::int64_t moeI, bool tied) {
        const std::int64_t attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H;
        const std::int64_t mlp = E > 0 ? H * E + E * 3 * H * moeI : 3 * H * I;
        return V * H * (tied ? 1 : 2) + L * (attn + mlp + 2 * H + 2 * hd) + H;
    };
    EXPECT_EQ(load_model("qwen3-8b").value().total_params(), count(151936, 4096, 36, 32, 8, 128, 12288, 0, 0, false));
    EXPECT_EQ(load_model("qwen3-0.6b").value().total_params(), count(151936, 1024, 28, 16, 8, 128, 3072, 0, 0, true));
    EXPECT_EQ(load_model("qwen3-30b-a3b").value().total_params(), count(151936, 2048, 48, 32, 4, 128, 6144, 128, 768, false));
    EXPECT_NEAR(static_cast<double>(load_model("qwen3-8b").value().total_params()) / 1e9, 8.2, 0.05);
    EXPECT_NEAR(static_cast<double>(load_model("qwen3-30b-a3b").value().total_params()) / 1e9, 30.5, 0.05);
}

// DeepSeek-V2-Lite (MLA: one latent of kv_lora_rank 512 + rope 64 per token
// and layer, 27 layers) on one H100, vLLM 0.19: a block is 16 x 576 x 2 B =
// 18,432 B per layer; the log (tests/fixtures/groundtruth/vllm_hybrid_logs.json
// llmd-h100-deepseek-v2-lite-tp1) prints 1,505,552 tokens (94,097 blocks of 16)
// and "Maximum concurrency for 8,192 tokens per request: 183.78x" (94,097 / 512).
TEST(PagedKv, MlaLatentPages) {
    const auto g = load_model("deepseek-v2-lite");
    ASSERT_TRUE(g.ok());
    PagedKvRequest r;
    r.max_model_len = 8192;
    r.tp = 2;  // the latent is not split by tensor parallelism
    r.available = {Bytes(94097LL * 27 * 18432)};
    const auto res = paged_kv_cache(*g.value().transformer, r);
    ASSERT_TRUE(res.ok()) << res.error().message;
    EXPECT_EQ(res.value().stages[0].page.count(), 18432);
    EXPECT_EQ(res.value().kv_cache_tokens, 1505552);
    EXPECT_NEAR(res.value().max_concurrency, 183.78, 0.005);
}

// gpt-oss-20b from its config.json by modeling_gpt_oss.py's modules: per
// layer q/k/v/o with biases, one sink per head, a biased router over 32
// experts, each expert a biased gate_up_proj [2880 -> 5760] and down_proj
// [2880 -> 2880], two norms; untied embeddings of 201,088 x 2880; final norm.
// The model card says 21B parameters.
TEST(Presets, GptOssCountByFormula) {
    const std::int64_t H = 2880, heads = 64, kv = 8, hd = 64, E = 32, I = 2880, V = 201088, L = 24;
    const std::int64_t attn = (H * heads * hd + heads * hd) + 2 * (H * kv * hd + kv * hd) + (heads * hd * H + H) + heads;
    const std::int64_t moe = (H * E + E) + E * (H * 2 * I + 2 * I + I * H + H);
    const std::int64_t expect = 2 * V * H + L * (attn + moe + 2 * H) + H;
    EXPECT_EQ(load_model("gpt-oss-20b").value().total_params(), expect);
    EXPECT_NEAR(static_cast<double>(expect) / 1e9, 21.0, 0.1);
    const ModelGraph g = load_model("gpt-oss-20b").value();
    const TransformerDims& d = *g.transformer;
    EXPECT_EQ(d.sliding_window, 128);  // layer_types: sliding and full attention alternate
    EXPECT_EQ(std::count(d.sliding_layers.begin(), d.sliding_layers.end(), true), 12);
}

// Gemma-3-4B-it (Gemma3ForConditionalGeneration): the language model from
// text_config (34 layers of 2560, 8 heads and 4 KV heads of 256, MLP 10240,
// q/k norms of 256, four norms a layer, tied 262,208-token embeddings) plus
// the SigLIP tower (27 layers of 1152, MLP 4304, 64 x 64 patches of 14 x 14
// x 3) and the projector (1152 x 2560 and a norm). The model card: 4.3B.
TEST(Presets, Gemma3CountByFormula) {
    const std::int64_t H = 2560, L = 34, hd = 256, I = 10240, V = 262208;
    const std::int64_t text = V * H + L * (H * 8 * hd + 2 * H * 4 * hd + 8 * hd * H + 3 * H * I + 4 * H + 2 * hd) + H;
    const std::int64_t vh = 1152, vi = 4304, vl = 27;
    const std::int64_t vision = (3 * 14 * 14 * vh + vh) + 64 * 64 * vh + vl * (4 * vh * vh + 4 * vh + 4 * vh + 2 * vh * vi + vi + vh) + 2 * vh;
    const std::int64_t projector = vh * H + vh;
    EXPECT_EQ(load_model("gemma-3-4b-it").value().total_params(), text + vision + projector);
    EXPECT_NEAR(static_cast<double>(text + vision + projector) / 1e9, 4.3, 0.01);
    const ModelGraph g = load_model("gemma-3-4b-it").value();
    EXPECT_EQ(std::count(g.transformer->sliding_layers.begin(), g.transformer->sliding_layers.end(), true), 29);  // 5 of 6 slide
}

// Qwen3-Next-80B-A3B (Qwen3NextForCausalLM, modeling_qwen3_next.py): 36
// gated-DeltaNet layers (in_proj_qkvz H x (2*16*128 + 2*32*128), in_proj_ba
// H x 2*32, a depthwise conv1d of 8192 x 4, A_log and dt_bias of 32, a gated
// norm of 128, out_proj 4096 x H) and 12 gated-attention layers (q_proj H x
// 2*16*256 for the query and its gate, k/v H x 2*256, o 4096 x H, q/k norms of
// 256); every layer a MoE of 512 experts of 3 x H x 512, a router H x 512, a
// shared expert 3 x H x 512 and its gate H x 1, two norms; untied 151,936 x
// H embeddings and a final norm. 79,674,391,296 is also what a public
// tensor listing of the same architecture without MTP weights totals
// (159,348,782,592 bf16 bytes); the model card says 80B.
TEST(Presets, Qwen3NextCountByFormula) {
    const std::int64_t H = 2048, V = 151936, E = 512, I = 512;
    const std::int64_t gdn = H * (2 * 16 * 128 + 2 * 32 * 128) + H * 64 + 8192 * 4 + 32 + 32 + 128 + 4096 * H;
    const std::int64_t attn = H * 2 * 16 * 256 + 2 * H * 2 * 256 + 16 * 256 * H + 2 * 256;
    const std::int64_t moe = H * E + E * 3 * H * I + 3 * H * I + H;
    const std::int64_t expect = 2 * V * H + 36 * gdn + 12 * attn + 48 * (moe + 2 * H) + H;
    EXPECT_EQ(expect, 79674391296);
    const ModelGraph g = load_model("qwen3-next-80b-a3b-instruct").value();
    EXPECT_EQ(g.total_params(), expect);
    const TransformerDims& d = *g.transformer;
    EXPECT_EQ(d.kv_layers(), 12);  // every 4th layer is full attention
    EXPECT_EQ(d.kv_elements_per_token, 12 * 2 * 2 * 256);
    // transformers' cache per linear layer and sequence: conv_states [8192, 4]
    // in the model dtype, recurrent_states [32, 128, 128] in fp32.
    EXPECT_EQ(d.hf_linear_state_bytes(1, 1, DType::BF16).count(), 8192 * 4 * 2 + 32 * 128 * 128 * 4);
}

// Qwen3-Next-80B-A3B on two H200s, vLLM 0.10.2, max_model_len 262,144 (the
// log in tests/fixtures/groundtruth/vllm_hybrid_logs.json
// qwen3next-h200-tp2-v0102): a GDN state per layer and request of 3 x 4096 x
// 2 B (conv) + 16 x 128 x 128 x 2 B (ssm) = 548,864 B; one token's K/V in a
// full layer 1 x 2 x 256 x 2 B = 1,024 B, so blocks of 16 x cdiv(548,864,
// 16,384) = 544 tokens and pages of 557,056 B; 12 full + 36 GDN layers make 4
// groups of 12. From "Available KV cache memory: 44.59 GiB" the log prints
// 973,760 tokens (7,162 // 4 x 544) and "Maximum concurrency for 262,144
// tokens per request: 14.77x" (7,162 / (cdiv(262,144, 544) + 3)).
TEST(PagedKv, LinearAttentionStatePagesQwen3Next) {
    const ModelGraph g = load_model("qwen3-next-80b-a3b-instruct").value();
    PagedKvRequest r;
    r.tp = 2;
    r.max_model_len = 262144;
    r.max_num_batched_tokens = 8192;
    r.available = {Bytes(static_cast<std::int64_t>(44.59 * 1073741824.0))};
    const auto res = paged_kv_cache(*g.transformer, r);
    ASSERT_TRUE(res.ok()) << res.error().message;
    EXPECT_EQ(res.value().state_page.count(), 3 * 4096 * 2 + 16 * 128 * 128 * 2);
    EXPECT_EQ(res.value().block_size, 544);
    EXPECT_EQ(res.value().stages[0].page.count(), 544 * 1024);
    EXPECT_EQ(res.value().groups, 4);
    EXPECT_EQ(res.value().group_size, 12);
    EXPECT_EQ(res.value().num_blocks, 7162);
    EXPECT_EQ(res.value().kv_cache_tokens, 973760);
    EXPECT_NEAR(res.value().max_concurrency, 14.77, 0.005);
    // Prefix caching ("align" mode) holds two state pages per request.
    r.prefix_caching = true;
    EXPECT_NEAR(paged_kv_cache(*g.transformer, r).value().max_concurrency, 7162.0 / (482 + 6), 1e-9);
}

// Llama-4 Scout and Maverick (Llama4ForConditionalGeneration,
// modeling_llama4.py; docs/research/llama4.md section 2): per layer q/k/v/o
// without biases (40 heads, 8 KV heads of 128), two norms; MoE layers a
// router H x E, E fused experts of H x 2I + I x H and a shared expert of 3 x H
// x I (I = 8192); dense layers 3 x H x 16384; untied 202,048 x H embeddings
// and a final norm; the vision tower (34 layers of 1408 with biased
// attention and MLP of 5632, two LayerNorms each, a 588 -> 1408 patch linear,
// class and 577 position embeddings, pre/post LayerNorms, the pixel-shuffle
// MLP 5632 -> 4096 -> 4096) and the 4096 -> H projector. Published totals:
// the Hugging Face API's safetensors count for Scout, 108,641,793,536, and
// the checkpoint totals a public test quotes for both.
TEST(Presets, Llama4CountByFormula) {
    const std::int64_t H = 5120, V = 202048, I = 8192, Imlp = 16384, L = 48;
    const std::int64_t attn = H * 40 * 128 + 2 * H * 8 * 128 + 40 * 128 * H;
    const auto moe = [&](std::int64_t E) { return H * E + E * (H * 2 * I + I * H) + 3 * H * I; };
    const std::int64_t dense = 3 * H * Imlp;
    const std::int64_t D = 1408, Iv = 5632, Lv = 34;
    const std::int64_t vlayer = 4 * (D * D + D) + (D * Iv + Iv) + (Iv * D + D) + 4 * D;
    const std::int64_t vision = 588 * D + D + 577 * D + 4 * D + Lv * vlayer + (Iv * 4096 + 4096 * 4096) + 4096 * H;
    const std::int64_t scout = 2 * V * H + H + L * (attn + 2 * H) + L * moe(16) + vision;
    const std::int64_t maverick = 2 * V * H + H + L * (attn + 2 * H) + 24 * moe(128) + 24 * dense + vision;
    EXPECT_EQ(scout, 108641793536);
    EXPECT_EQ(maverick, 401583781376);
    EXPECT_EQ(load_model("llama-4-scout-17b-16e-instruct").value().total_params(), scout);
    EXPECT_EQ(load_model("llama-4-maverick-17b-128e-instruct").value().total_params(), maverick);
    const ModelGraph g = load_model("llama-4-scout-17b-16e-instruct").value();
    EXPECT_EQ(g.transformer->attention_chunk, 8192);
    EXPECT_EQ(std::count(g.transformer->chunked_layers.begin(), g.transformer->chunked_layers.end(), true), 36);  // RoPE layers
}

// Llama-4-Scout on four H100s, vLLM 0.19, max_model_len 8192, 8192 batched
// tokens (tests/fixtures/groundtruth/vllm_hybrid_logs.json
// llmd-h100-llama4-scout-tp4): 36 chunked-local layers (chunk 8192) and 12
// global ones, 2 KV heads of 128 per rank, so pages of 16 x 2 x 2 x 128 x 2 B
// = 16,384 B and 4 groups of 12; a request holds 512 blocks in the global
// group and cdiv(min(8192 + 8192, 8192), 16) = 512 in each chunked one. From
// the logged 91,495 blocks: 91,495 // 4 x 16 = 365,968 tokens and
// 91,495 / 2,048 = 44.68x, as the log prints.
TEST(PagedKv, ChunkedLocalAttentionLlama4) {
    const ModelGraph g = load_model("llama-4-scout-17b-16e-instruct").value();
    PagedKvRequest r;
    r.tp = 4;
    r.max_model_len = 8192;
    r.max_num_batched_tokens = 8192;
    r.available = {Bytes(91495LL * 12 * 16384)};
    const auto res = paged_kv_cache(*g.transformer, r);
    ASSERT_TRUE(res.ok()) << res.error().message;
    EXPECT_EQ(res.value().stages[0].page.count(), 16384);
    EXPECT_EQ(res.value().groups, 4);
    EXPECT_EQ(res.value().blocks_per_request, 2048);
    EXPECT_EQ(res.value().kv_cache_tokens, 365968);
    EXPECT_NEAR(res.value().max_concurrency, 44.68, 0.005);
    // Longer requests: the chunked groups stop at chunk + batched tokens.
    r.max_model_len = 65536;
    EXPECT_EQ(paged_kv_cache(*g.transformer, r).value().blocks_per_request, 4096 + 3 * 1024);
}

// Three small presets by their modules (transformers modeling_gemma2.py,
// modeling_gemma3.py, modeling_phi3.py): Gemma-2-2B-it (tied 256,000 x 2304,
// 26 layers of 8 heads and 4 KV heads of 256, MLP 9216, four norms a layer;
// the model card: 2.61B), Gemma-3-1B-it (tied 262,144 x 1152, 26 layers of
// 4 heads and 1 KV head of 256 with q/k norms, MLP 6912, four norms; 1B) and
// Phi-3.5-mini-instruct (untied 32,064 x 3072, 32 layers with fused qkv and
// gate_up, MLP 8192, two norms; 3.8B).
TEST(Presets, SmallModelsCountByFormula) {
    {
        const std::int64_t V = 256000, H = 2304, L = 26, I = 9216;
        EXPECT_EQ(load_model("gemma-2-2b-it").value().total_params(), V * H + L * (H * 8 * 256 + 2 * H * 4 * 256 + 8 * 256 * H + 3 * H * I + 4 * H) + H);
    }
    {
        const std::int64_t V = 262144, H = 1152, L = 26, I = 6912;
        EXPECT_EQ(load_model("gemma-3-1b-it").value().total_params(),
                  V * H + L * (H * 4 * 256 + 2 * H * 256 + 4 * 256 * H + 3 * H * I + 4 * H + 2 * 256) + H);
    }
    {
        const std::int64_t V = 32064, H = 3072, L = 32, I = 8192;
        EXPECT_EQ(load_model("phi-3.5-mini-instruct").value().total_params(), 2 * V * H + L * (4 * H * H + 3 * H * I + 2 * H) + H);
    }
}

// Every v0.19 log of tests/fixtures/groundtruth/vllm_hybrid_logs.json with a
// logged block count and a preset for its model (sliding-window, chunked-local
// and MLA layouts): from the logged blocks, the logged "GPU KV cache size"
// tokens exactly and "Maximum concurrency" to its two decimals.
TEST(PagedKv, HybridLogsFromLoggedBlocks) {
    const auto fx = test::read_json("tests/fixtures/groundtruth/vllm_hybrid_logs.json");
    int checked = 0;
    for (const auto& row : fx["rows"]) {
        if (row["num_gpu_blocks"].is_null()) continue;
        const auto g = load_model(row["model"].get<std::string>());
        if (!g.ok()) continue;  // no preset for the model
        const auto& st = row["settings"];
        PagedKvRequest r;
        r.tp = row["tp"].get<std::int64_t>();
        r.max_model_len = st["max_model_len"].get<std::int64_t>();
        r.max_num_batched_tokens = st["max_num_batched_tokens"].get<std::int64_t>();
        r.available = {Bytes(std::int64_t{1} << 40)};
        const auto probe = paged_kv_cache(*g.value().transformer, r);
        ASSERT_TRUE(probe.ok()) << row["id"] << ": " << probe.error().message;
        const std::int64_t blocks = row["num_gpu_blocks"].get<std::int64_t>();
        r.available = {probe.value().stages[0].page * checked_mul(blocks, probe.value().group_size)};
        const auto res = paged_kv_cache(*g.value().transformer, r);
        ASSERT_TRUE(res.ok());
        EXPECT_EQ(res.value().num_blocks, blocks) << row["id"];
        EXPECT_EQ(res.value().kv_cache_tokens, row["kv_tokens"].get<std::int64_t>()) << row["id"];
        EXPECT_NEAR(res.value().max_concurrency, row["max_concurrency"].get<double>(), 0.005) << row["id"];
        ++checked;
    }
    EXPECT_GE(checked, 7);  // Gemma 2 (2B, 9B), Gemma 3 (4B, 27B), Llama 4 Scout, gpt-oss-20b, DeepSeek-V2-Lite
}

// Mistral-Small-24B-Instruct-2501 (MistralForCausalLM): untied 131,072 x 5120
// embeddings, 40 layers of 32 heads and 8 KV heads of 128, MLP 32768, two
// norms a layer, a final norm; an evaluation record lists 23.572B.
TEST(Presets, MistralSmallCountByFormula) {
    const std::int64_t V = 131072, H = 5120, L = 40, I = 32768;
    const std::int64_t expect = 2 * V * H + L * (H * 32 * 128 + 2 * H * 8 * 128 + 32 * 128 * H + 3 * H * I + 2 * H) + H;
    EXPECT_EQ(load_model("mistral-small-24b-instruct-2501").value().total_params(), expect);
    EXPECT_NEAR(static_cast<double>(expect) / 1e9, 23.572, 0.0005);
}
