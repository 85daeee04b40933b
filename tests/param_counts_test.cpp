// Parameter counts of the 37 preset configs must equal
// sum(p.numel() for p in model.parameters()) of the transformers class named
// in tests/fixtures/groundtruth/param_counts.json, exactly.
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpumem/model/transformer.hpp"

namespace gpumem {
namespace {

using json = nlohmann::json;

json read_json(const std::string& rel) {
    const std::string path = std::string(GPUMEM_SOURCE_DIR) + "/" + rel;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
}

ModelGraph build_preset(const std::string& name) {
    const json cfg = read_json("data/presets/configs/" + name + ".json");
    auto spec = parse_hf_config(cfg, name + ".json");
    if (!spec.ok()) throw std::runtime_error(spec.error().message);
    return build_transformer(spec.value(), DType::BF16);
}

std::map<Component, std::int64_t> by_component(const ModelGraph& g) {
    std::map<Component, std::int64_t> out;
    for (const auto& b : g.blocks)
        for (const auto& p : b.params) out[p.component] += b.repeat * p.numel();
    return out;
}

std::int64_t block_params(const ModelGraph& g, const std::string& block) {
    std::int64_t n = 0;
    for (const auto& b : g.blocks)
        if (b.name == block)
            for (const auto& p : b.params) n += b.repeat * p.numel();
    return n;
}

TEST(ParamCounts, AllPresetsExact) {
    const json truth = read_json("tests/fixtures/groundtruth/param_counts.json");
    ASSERT_EQ(truth.size(), 37u);
    for (const auto& [name, entry] : truth.items()) {
        SCOPED_TRACE(name + " (" + entry.at("counted_as").get<std::string>() + ")");
        const ModelGraph g = build_preset(name);
        EXPECT_EQ(g.total_params(), entry.at("params").get<std::int64_t>());
        EXPECT_EQ(g.trainable_params(), g.total_params());
        ASSERT_TRUE(g.transformer.has_value());
        EXPECT_GT(g.blocks.size(), 2u);
        EXPECT_EQ(g.blocks.front().name, "embeddings");
        EXPECT_EQ(g.blocks.back().name, "head");
    }
}

TEST(ParamCounts, Llama3ComponentSplit) {
    const ModelGraph g = build_preset("llama-3-8b");
    // Untied: the embedding and lm_head are two 128256 x 4096 matrices.
    EXPECT_EQ(block_params(g, "embeddings"), std::int64_t{128256} * 4096);
    EXPECT_EQ(block_params(g, "head"), std::int64_t{128256} * 4096 + 4096);  // + final RMSNorm
    auto c = by_component(g);
    EXPECT_EQ(c[Component::Embeddings], std::int64_t{128256} * 4096);
    EXPECT_EQ(c[Component::Head], std::int64_t{128256} * 4096);
    // q, o: 4096x4096; k, v: 4096x1024 (8 kv heads of 128), 32 layers.
    EXPECT_EQ(c[Component::Attention], std::int64_t{32} * (2 * 4096 * 4096 + 2 * 4096 * 1024));
    EXPECT_EQ(c[Component::Mlp], std::int64_t{32} * 3 * 4096 * 14336);
    EXPECT_EQ(c[Component::Norms], std::int64_t{32} * 2 * 4096 + 4096);
    const auto& d = *g.transformer;
    EXPECT_EQ(d.layers, 32);
    EXPECT_EQ(d.kv_heads, 8);
    EXPECT_EQ(d.head_dim, 128);
    EXPECT_EQ(d.kv_elements_per_token, std::int64_t{32} * 2 * 8 * 128);
    // Parameter names and LoRA module names.
    bool found = false;
    for (const auto& b : g.blocks)
        for (const auto& p : b.params)
            if (p.name == "self_attn.q_proj.weight") {
                found = true;
                EXPECT_EQ(p.module, "q_proj");
                EXPECT_TRUE(p.linear_weight);
                EXPECT_TRUE(b.checkpointable);
                EXPECT_EQ(b.repeat, 32);
            }
    EXPECT_TRUE(found);
}

TEST(ParamCounts, Gpt2TiedHead) {
    const ModelGraph g = build_preset("gpt2");
    auto c = by_component(g);
    EXPECT_EQ(c[Component::Head], 0);  // lm_head tied to wte
    EXPECT_EQ(c[Component::Embeddings], std::int64_t{50257} * 768 + 1024 * 768);
    EXPECT_EQ(block_params(g, "head"), 2 * 768);  // ln_f only
    // Conv1D weights are stored [in, out] and still count as linear weights.
    bool found = false;
    for (const auto& b : g.blocks)
        for (const auto& p : b.params)
            if (p.name == "attn.c_attn.weight") {
                found = true;
                EXPECT_EQ(p.shape, (std::vector<std::int64_t>{768, 2304}));
                EXPECT_TRUE(p.linear_weight);
                EXPECT_EQ(p.module, "c_attn");
            }
    EXPECT_TRUE(found);
}

TEST(ParamCounts, DeepseekV3Layout) {
    const ModelGraph g = build_preset("deepseek-v3");
    // 3 dense layers, then 58 MoE layers.
    ASSERT_EQ(g.blocks.size(), 4u);
    EXPECT_EQ(g.blocks[1].repeat, 3);
    EXPECT_EQ(g.blocks[2].repeat, 58);
    auto c = by_component(g);
    EXPECT_EQ(c[Component::Experts], std::int64_t{58} * 256 * 3 * 7168 * 2048);
    EXPECT_EQ(c[Component::Router], std::int64_t{58} * (256 * 7168 + 256));  // + e_score_correction_bias
    const auto& d = *g.transformer;
    EXPECT_EQ(d.experts, 256);
    EXPECT_EQ(d.experts_per_token, 8);
    EXPECT_EQ(d.kv_elements_per_token, std::int64_t{61} * (512 + 64));
}

TEST(ParamCounts, T5SharedEmbeddingAndRelativeBias) {
    const ModelGraph g = build_preset("t5-small");
    auto c = by_component(g);
    EXPECT_EQ(c[Component::Embeddings], std::int64_t{32128} * 512);  // shared, counted once
    EXPECT_EQ(c[Component::Head], 0);                                // lm_head tied
    // relative_attention_bias: one [32 buckets, 8 heads] table per stack.
    std::int64_t rel = 0;
    for (const auto& b : g.blocks)
        for (const auto& p : b.params)
            if (p.module == "relative_attention_bias") rel += b.repeat * p.numel();
    EXPECT_EQ(rel, 2 * 32 * 8);
    EXPECT_TRUE(g.transformer->encoder_decoder);
}

TEST(ParamCounts, BertPoolerAndMaskedLm) {
    const ModelGraph base = build_preset("bert-base-uncased");
    EXPECT_EQ(block_params(base, "head"), 768 * 768 + 768);  // pooler
    json cfg = read_json("data/presets/configs/bert-base-uncased.json");
    cfg["architectures"] = json::array({"BertForMaskedLM"});
    auto spec = parse_hf_config(cfg, "bert-mlm.json");
    ASSERT_TRUE(spec.ok());
    const ModelGraph mlm = build_transformer(spec.value(), DType::BF16);
    // No pooler; transform dense (h*h + h) + LayerNorm (2h) + decoder bias (vocab), decoder weight tied.
    EXPECT_EQ(mlm.total_params(), 109482240 - (768 * 768 + 768) + (768 * 768 + 768) + 2 * 768 + 30522);
}

TEST(ParamCounts, Gpt2Defaults) {
    // A config with only model_type takes GPT2Config's defaults: gpt2 small.
    auto spec = parse_hf_config(json{{"model_type", "gpt2"}}, "x.json");
    ASSERT_TRUE(spec.ok());
    EXPECT_EQ(spec->intermediate, 4 * 768);
    EXPECT_EQ(spec->max_positions, 1024);
    EXPECT_DOUBLE_EQ(spec->attn_dropout, 0.1);
    EXPECT_FALSE(spec->notes.empty());
    EXPECT_EQ(build_transformer(spec.value(), DType::F32).total_params(), 124439808);
    // attribute_map alias: hidden_size for n_embd.
    auto alias = parse_hf_config(json{{"model_type", "gpt2"}, {"hidden_size", 1024}, {"num_attention_heads", 16}},
                                 "x.json");
    ASSERT_TRUE(alias.ok());
    EXPECT_EQ(alias->hidden, 1024);
    EXPECT_EQ(alias->head_dim, 64);
}

TEST(ParamCounts, DeepseekV2LiteNullQLoraRank) {
    json cfg = read_json("data/presets/configs/deepseek-v2.json");
    cfg["q_lora_rank"] = nullptr;
    auto spec = parse_hf_config(cfg, "v2lite.json");
    ASSERT_TRUE(spec.ok());
    EXPECT_EQ(spec->q_lora_rank, 0);
    const ModelGraph g = build_transformer(spec.value(), DType::BF16);
    // q_a_proj (5120x1536) + q_a_layernorm (1536) + q_b_proj (1536x128*192) replaced by q_proj (5120x128*192).
    const std::int64_t per_layer = 5120 * 1536 + 1536 + 1536 * 128 * 192 - 5120 * 128 * 192;
    EXPECT_EQ(g.total_params(), 235741434880 - 60 * per_layer);
}

TEST(ParamCountsErrors, UnknownModelTypeListsSupported) {
    auto r = parse_hf_config(json{{"model_type", "foo"}}, "config.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::Unsupported);
    EXPECT_EQ(r.error().field, "model_type");
    EXPECT_NE(r.error().message.find("config.json: unsupported model_type \"foo\""), std::string::npos);
    for (const auto& t : supported_model_types()) EXPECT_NE(r.error().message.find(t), std::string::npos) << t;
    auto missing = parse_hf_config(json{{"hidden_size", 4}}, "config.json");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code, ErrorCode::Unsupported);
    EXPECT_EQ(missing.error().field, "model_type");
}

TEST(ParamCountsErrors, WrongTypeNamesField) {
    auto r = parse_hf_config(json{{"model_type", "llama"}, {"num_hidden_layers", "abc"}}, "models/x/config.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().field, "num_hidden_layers");
    EXPECT_EQ(r.error().message,
              "models/x/config.json: field \"num_hidden_layers\" must be a positive integer (got \"abc\")");
    auto b = parse_hf_config(json{{"model_type", "llama"}, {"tie_word_embeddings", "yes"}}, "c.json");
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.error().field, "tie_word_embeddings");
    auto f = parse_hf_config(json{{"model_type", "gpt2"}, {"n_layer", 1.5}}, "c.json");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error().field, "n_layer");
    auto notobj = parse_hf_config(json::array({1, 2}), "c.json");
    ASSERT_FALSE(notobj.ok());
    auto mt = parse_hf_config(json{{"model_type", 3}}, "c.json");
    ASSERT_FALSE(mt.ok());
    EXPECT_EQ(mt.error().field, "model_type");
}

TEST(ParamCountsErrors, NonPositiveSizes) {
    auto r = parse_hf_config(json{{"model_type", "llama"}, {"hidden_size", -4096}}, "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().field, "hidden_size");
    EXPECT_NE(r.error().message.find("must be a positive integer (got -4096)"), std::string::npos);
    auto z = parse_hf_config(json{{"model_type", "bert"}, {"num_attention_heads", 0}}, "c.json");
    ASSERT_FALSE(z.ok());
    EXPECT_EQ(z.error().field, "num_attention_heads");
    auto huge = parse_hf_config(json{{"model_type", "llama"}, {"vocab_size", 1e30}}, "c.json");
    ASSERT_FALSE(huge.ok());
    EXPECT_EQ(huge.error().field, "vocab_size");
}

TEST(ParamCountsErrors, HeadsMustDivideHidden) {
    auto r = parse_hf_config(json{{"model_type", "llama"}, {"hidden_size", 1000}, {"num_attention_heads", 3}},
                             "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().field, "hidden_size");
    EXPECT_NE(r.error().message.find("not divisible"), std::string::npos);
    // An explicit head_dim makes it valid (as in transformers).
    auto ok = parse_hf_config(
        json{{"model_type", "llama"}, {"hidden_size", 1000}, {"num_attention_heads", 3}, {"head_dim", 64},
             {"num_key_value_heads", 1}},
        "c.json");
    EXPECT_TRUE(ok.ok());
    auto kv = parse_hf_config(json{{"model_type", "llama"}, {"num_key_value_heads", 5}}, "c.json");
    ASSERT_FALSE(kv.ok());
    EXPECT_EQ(kv.error().field, "num_key_value_heads");
}

TEST(ParamCounts, OtherFamiliesBuild) {
    // Families without a preset: defaults of their configuration classes.
    for (const char* t : {"gemma2", "qwen2_moe", "falcon"}) {
        SCOPED_TRACE(t);
        auto spec = parse_hf_config(json{{"model_type", t}}, "c.json");
        ASSERT_TRUE(spec.ok()) << spec.error().message;
        const ModelGraph g = build_transformer(spec.value(), DType::BF16);
        EXPECT_GT(g.total_params(), 0);
    }
    // Falcon-7B: 6,921,720,704 parameters (multi-query, parallel attention, tied head).
    auto f7 = parse_hf_config(json{{"model_type", "falcon"}}, "c.json");
    EXPECT_EQ(build_transformer(f7.value(), DType::BF16).total_params(), 6921720704);
    // Gemma2-2B: 2,614,341,888 parameters.
    auto g2 = parse_hf_config(json{{"model_type", "gemma2"}}, "c.json");
    EXPECT_EQ(build_transformer(g2.value(), DType::BF16).total_params(), 2614341888);
    // Qwen1.5-MoE-A2.7B: 14,315,784,192 parameters.
    auto qm = parse_hf_config(json{{"model_type", "qwen2_moe"}}, "c.json");
    EXPECT_EQ(build_transformer(qm.value(), DType::BF16).total_params(), 14315784192);
}

TEST(ParamCounts, UserConfigsMatchPublishedTotals) {
    struct Case {
        const char* what;
        json cfg;
        std::int64_t params;
    };
    const Case cases[] = {
        {"google/flan-t5-base (gated-gelu, untied lm_head)",
         {{"model_type", "t5"}, {"vocab_size", 32128}, {"d_model", 768}, {"d_kv", 64}, {"d_ff", 2048},
          {"num_layers", 12}, {"num_heads", 12}, {"feed_forward_proj", "gated-gelu"}, {"tie_word_embeddings", false}},
         247577856},
        {"facebook/opt-350m (project_in/out, post-norm, no final norm)",
         {{"model_type", "opt"}, {"vocab_size", 50272}, {"hidden_size", 1024}, {"num_hidden_layers", 24},
          {"num_attention_heads", 16}, {"ffn_dim", 4096}, {"word_embed_proj_dim", 512},
          {"do_layer_norm_before", false}},
         331196416},
        {"FacebookAI/roberta-base as RobertaForMaskedLM",
         {{"model_type", "roberta"}, {"vocab_size", 50265}, {"max_position_embeddings", 514}, {"type_vocab_size", 1},
          {"architectures", {"RobertaForMaskedLM"}}},
         124697433},
        {"deepseek-ai/DeepSeek-V2-Lite (q_lora_rank null)",
         {{"model_type", "deepseek_v2"}, {"vocab_size", 102400}, {"hidden_size", 2048}, {"num_hidden_layers", 27},
          {"num_attention_heads", 16}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"intermediate_size", 10944},
          {"moe_intermediate_size", 1408}, {"n_routed_experts", 64}, {"n_shared_experts", 2},
          {"num_experts_per_tok", 6}, {"first_k_dense_replace", 1}},
         15706484224},
        {"microsoft/phi-1_5",
         {{"model_type", "phi"}, {"vocab_size", 51200}, {"hidden_size", 2048}, {"num_hidden_layers", 24},
          {"num_attention_heads", 32}, {"intermediate_size", 8192}, {"partial_rotary_factor", 0.5}},
         1418270720},
        {"tiiuae/falcon-40b (new decoder architecture, 2 norms)",
         {{"model_type", "falcon"}, {"vocab_size", 65024}, {"hidden_size", 8192}, {"num_attention_heads", 128},
          {"num_kv_heads", 8}, {"num_hidden_layers", 60}, {"new_decoder_architecture", true}},
         41303293952},
    };
    for (const auto& k : cases) {
        SCOPED_TRACE(k.what);
        auto spec = parse_hf_config(k.cfg, "c.json");
        ASSERT_TRUE(spec.ok()) << spec.error().message;
        EXPECT_EQ(build_transformer(spec.value(), DType::BF16).total_params(), k.params);
    }
}

}  // namespace
}  // namespace gpumem
