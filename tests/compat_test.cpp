// Compatibility reports: DeepSpeed's ZeRO-2/3 model-state estimators and
// Megatron-LM's theoretical memory report, checked against published
// printouts (tests/fixtures/groundtruth/measured.json), independent hand
// calculations written out below, and values printed by the tools' own
// functions (DeepSpeed v0.16.5 38327e07f6cd, Megatron-LM d98e8a64ddf3).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "gpumem/model/load.hpp"
#include "gpumem/plan/compat.hpp"
#include "gpumem/report/compat_render.hpp"
#include "test_util.hpp"

using namespace gpumem;
using nlohmann::json;

namespace {

constexpr std::int64_t kT0Params = 2'783'959'040;   // bigscience/T0_3B as AutoModel (T5Model)
constexpr std::int64_t kT0Largest = 65'798'144;     // shared embedding 32128 x 2048

Param param(std::string name, std::vector<std::int64_t> shape, std::int64_t count = 1) {
    Param p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.count = count;
    return p;
}

std::string gib2(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
}
std::string gib2(std::int64_t bytes) { return gib2(static_cast<double>(bytes) / 1073741824.0); }

DeepSpeedEstimate cold(int stage, std::int64_t P, std::int64_t L, std::int64_t G, std::int64_t N, double f = 1.5) {
    DeepSpeedColdInput in;
    in.stage = stage;
    in.total_params = P;
    in.largest_layer_params = L;
    in.gpus_per_node = G;
    in.nodes = N;
    in.additional_buffer_factor = f;
    auto r = deepspeed_estimate_cold(in);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
}

}  // namespace

// ------------------------------------------------------------------ DeepSpeed

TEST(CompatDeepSpeed, Zero3MatchesEveryMeasuredPrintoutRow) {
    const json doc = test::read_json("tests/fixtures/groundtruth/measured.json");
    const json& rows = doc.at("deepspeed_estimator_printouts");
    ASSERT_EQ(rows.size(), 12u);
    for (const auto& want : rows) {
        SCOPED_TRACE(want.at("id").get<std::string>());
        const auto e = cold(3, want.at("params"), want.at("largest_layer_params"), want.at("num_gpus_per_node"), want.at("num_nodes"));
        const bool param_cpu = want.at("offload_param") == "cpu";
        const bool opt_cpu = want.at("offload_optimizer") == "cpu";
        const bool zero_init = want.at("zero_init") == 1;
        int found = 0;
        for (const auto& r : e.rows) {
            if (*r.offload_param != param_cpu || r.offload_optimizer != opt_cpu || *r.zero_init != zero_init) continue;
            ++found;
            EXPECT_EQ(gib2(r.cpu_bytes), gib2(want.at("per_cpu_GiB").get<double>()));
            EXPECT_EQ(gib2(r.gpu_bytes), gib2(want.at("per_gpu_GiB").get<double>()));
        }
        EXPECT_EQ(found, 1);
    }
}

TEST(CompatDeepSpeed, Zero3RowOrderBytesAndPrintout) {
    // DeepSpeed's loops: cpu_offload in [True, False] x cpu_offload_params in
    // [True, False] (skipping params offload without optimizer offload) x
    // zero_init in [True, False]. Bytes for T0_3B on 1 GPU, by hand:
    //   4L = 263,192,576
    //   param+opt offload: gpu 4L; cpu 18P*1.5 = 75,166,894,080 (both zero_init:
    //     max(4*1, 18) = 18)
    //   opt offload:  gpu 4L + 2P = 5,831,110,656; cpu 16P*1.5 = 66,815,016,960
    //   no offload:   gpu 4L + 18P = 50,374,455,296;
    //                 cpu zero_init=1 4L*1*1.5 = 394,788,864, zero_init=0 4P*1.5 = 16,703,754,240
    const auto e = cold(3, kT0Params, kT0Largest, 1, 1);
    ASSERT_EQ(e.rows.size(), 6u);
    const std::int64_t P = kT0Params, L = kT0Largest;
    struct Want { bool param, opt, init; std::int64_t cpu, gpu; };
    const Want want[] = {
        {true, true, true, 18 * P * 3 / 2, 4 * L},          {true, true, false, 18 * P * 3 / 2, 4 * L},
        {false, true, true, 16 * P * 3 / 2, 4 * L + 2 * P}, {false, true, false, 16 * P * 3 / 2, 4 * L + 2 * P},
        {false, false, true, 4 * L * 3 / 2, 4 * L + 18 * P}, {false, false, false, 4 * P * 3 / 2, 4 * L + 18 * P},
    };
    for (std::size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(*e.rows[i].offload_param, want[i].param) << i;
        EXPECT_EQ(e.rows[i].offload_optimizer, want[i].opt) << i;
        EXPECT_EQ(*e.rows[i].zero_init, want[i].init) << i;
        EXPECT_EQ(e.rows[i].cpu_bytes, want[i].cpu) << i;
        EXPECT_EQ(e.rows[i].gpu_bytes, want[i].gpu) << i;
    }
    EXPECT_EQ(want[0].cpu, 75'166'894'080);
    EXPECT_EQ(want[4].gpu, 50'374'455'296);
    // The printout published in transformers' DeepSpeed docs (Python <= 3.10 formats OffloadDeviceEnum.cpu as "cpu ").
    EXPECT_EQ(deepspeed_printout(e),
              "Estimated memory needed for params, optim states and gradients for a:\n"
              "HW: Setup with 1 node, 1 GPU per node.\n"
              "SW: Model with 2783M total params, 65M largest layer params.\n"
              "  per CPU  |  per GPU |   Options\n"
              "   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
              "   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
              "   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
              "   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
              "    0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
              "   15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
}

TEST(CompatDeepSpeed, Zero3TruncationsAndMaxBranchesMatchDeepSpeed) {
    // Values returned by DeepSpeed v0.16.5's estimate_zero3_model_states_mem_needs
    // (cpu, gpu) for odd inputs: int() truncation of 2P/(N*G), of P*16/N*1.1,
    // and max(4*G, 18/N) picking either side.
    auto e = cold(3, 1'000'003, 7, 3, 7, 1.1);
    const std::int64_t want_small[6][2] = {{2828579, 28},  {13200039, 28},    {2514293, 95266},
                                           {13200039, 95266}, {92, 857173}, {13200039, 857173}};
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(e.rows[static_cast<std::size_t>(i)].cpu_bytes, want_small[i][0]) << i;
        EXPECT_EQ(e.rows[static_cast<std::size_t>(i)].gpu_bytes, want_small[i][1]) << i;
    }
    // 70B-class model, 3 nodes x 8 GPUs, factor 1.25.
    e = cold(3, 70'553'706'496, 1'052'770'304, 8, 3, 1.25);
    const std::int64_t want_big[6][2] = {{529152798720, 4211081216},   {2822148259840, 4211081216}, {470358043306, 10090556757},
                                         {2822148259840, 10090556757}, {42110812160, 57126361088},  {2822148259840, 57126361088}};
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(e.rows[static_cast<std::size_t>(i)].cpu_bytes, want_big[i][0]) << i;
        EXPECT_EQ(e.rows[static_cast<std::size_t>(i)].gpu_bytes, want_big[i][1]) << i;
    }
}

TEST(CompatDeepSpeed, Zero2IndependentFormula) {
    // stage_1_and_2.py, written out independently:
    //   offload_optimizer=cpu : gpu = 2P,              cpu = int(P * max(4*N*G, 16) * f)
    //   offload_optimizer=none: gpu = 2P + int(18P/(N*G)), cpu = int(P * 4 * G * f)
    // T0_3B (P = 2,783,959,040), 1 GPU, f = 1.5, by hand:
    //   cpu offload: gpu 2P = 5,567,918,080 B = 5.19 GiB; cpu 16P*1.5 = 24P = 66,815,016,960 B = 62.23 GiB
    //   no offload : gpu 2P + 18P = 20P = 55,679,180,800 B = 51.86 GiB; cpu 4P*1.5 = 6P = 16,703,754,240 B = 15.56 GiB
    // 2 GPUs: no offload gpu 2P + 9P = 30,623,549,440; cpu 4P*2*1.5 = 33,407,508,480; offload unchanged (max(8,16) = 16).
    const auto formula = [](std::int64_t P, std::int64_t G, std::int64_t N, double f, bool offload) {
        const std::int64_t gpus = N * G;
        if (offload) return std::pair{static_cast<std::int64_t>(static_cast<double>(P * std::max<std::int64_t>(4 * gpus, 16)) * f), 2 * P};
        return std::pair{static_cast<std::int64_t>(static_cast<double>(P * 4 * G) * f),
                         2 * P + static_cast<std::int64_t>(static_cast<double>(18 * P) / static_cast<double>(gpus))};
    };
    const std::int64_t P = kT0Params;
    auto e = cold(2, P, 0, 1, 1);
    ASSERT_EQ(e.rows.size(), 2u);
    EXPECT_TRUE(e.rows[0].offload_optimizer);
    EXPECT_FALSE(e.rows[1].offload_optimizer);
    EXPECT_FALSE(e.rows[0].offload_param.has_value());
    EXPECT_FALSE(e.rows[0].zero_init.has_value());
    EXPECT_EQ(e.rows[0].gpu_bytes, 5'567'918'080);
    EXPECT_EQ(e.rows[0].cpu_bytes, 66'815'016'960);
    EXPECT_EQ(e.rows[1].gpu_bytes, 55'679'180'800);
    EXPECT_EQ(e.rows[1].cpu_bytes, 16'703'754'240);
    EXPECT_EQ(deepspeed_printout(e),
              "Estimated memory needed for params, optim states and gradients for a:\n"
              "HW: Setup with 1 node, 1 GPU per node.\n"
              "SW: Model with 2783M total params.\n"
              "  per CPU  |  per GPU |   Options\n"
              "   62.23GB |   5.19GB | offload_optimizer=cpu \n"
              "   15.56GB |  51.86GB | offload_optimizer=none\n");
    e = cold(2, P, 0, 2, 1);
    EXPECT_EQ(e.rows[1].gpu_bytes, 30'623'549'440);
    EXPECT_EQ(e.rows[1].cpu_bytes, 33'407'508'480);
    EXPECT_EQ(e.rows[0].cpu_bytes, 66'815'016'960);
    for (auto [P2, G, N, f] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, double>{P, 1, 1, 1.5},
                               {P, 2, 1, 1.5}, {70'553'706'496, 8, 3, 1.25}, {1'000'003, 3, 7, 1.1}, {6'738'415'616, 4, 1, 1.5}}) {
        const auto got = cold(2, P2, 0, G, N, f);
        for (std::size_t i = 0; i < 2; ++i) {
            const auto [cpu, gpu] = formula(P2, G, N, f, i == 0);
            EXPECT_EQ(got.rows[i].cpu_bytes, cpu) << P2 << " " << G << "x" << N << " row " << i;
            EXPECT_EQ(got.rows[i].gpu_bytes, gpu) << P2 << " " << G << "x" << N << " row " << i;
        }
    }
    // DeepSpeed's own values for the odd case (truncations).
    const auto odd = cold(2, 1'000'003, 0, 3, 7, 1.1);
    EXPECT_EQ(odd.rows[0].cpu_bytes, 92'400'277);
    EXPECT_EQ(odd.rows[1].gpu_bytes, 2'857'151);
}

TEST(CompatDeepSpeed, LargestLayerFromGraphModules) {
    ModelGraph g;
    g.name = "toy";
    Block emb;
    emb.name = "embeddings";
    emb.params.push_back(param("embed_tokens.weight", {100, 8}));
    Block layers;
    layers.name = "layers";
    layers.repeat = 4;
    layers.params.push_back(param("self_attn.q_proj.weight", {30, 30}));
    layers.params.push_back(param("self_attn.q_proj.bias", {30}));   // same module as q_proj.weight: 930
    layers.params.push_back(param("self_attn.k_proj.weight", {20, 30}));
    layers.params.push_back(param("mlp.experts.w1.weight", {25, 30}, 64));  // 64 modules of 750
    g.blocks = {emb, layers};
    EXPECT_EQ(deepspeed_largest_layer_params(g), 930);
    g.blocks[1].params[0].shape = {20, 20};  // q_proj now 420: the embedding (800) is the largest
    EXPECT_EQ(deepspeed_largest_layer_params(g), 800);
    g.blocks[1].params[3].shape = {30, 30};  // one expert tensor, 900
    EXPECT_EQ(deepspeed_largest_layer_params(g), 900);
    EXPECT_EQ(deepspeed_largest_layer_params(params_only_graph(7'000'000'000)), 0);
}

TEST(CompatDeepSpeed, AllLiveLlama2MatchesPublishedPrintout) {
    // estimate_zero3_model_states_mem_needs_all_live(AutoModelForCausalLM
    // "meta-llama/Llama-2-7b-hf", num_gpus_per_node=4) as published: 6738M total,
    // 131M largest (embed_tokens and the untied lm_head, 32000 x 4096 each).
    auto g = load_preset("llama-2-7b");
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->total_params(), 6'738'415'616);
    EXPECT_EQ(deepspeed_largest_layer_params(*g), 131'072'000);
    auto e = deepspeed_estimate_live(*g, 3, 4, 1);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->function, "estimate_zero3_model_states_mem_needs_all_live");
    EXPECT_EQ(deepspeed_printout(*e),
              "Estimated memory needed for params, optim states and gradients for a:\n"
              "HW: Setup with 1 node, 4 GPUs per node.\n"
              "SW: Model with 6738M total params, 131M largest layer params.\n"
              "  per CPU  |  per GPU |   Options\n"
              "  169.44GB |   0.49GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
              "  169.44GB |   0.49GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
              "  150.62GB |   3.63GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
              "  150.62GB |   3.63GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
              "    2.93GB |  28.73GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
              "  150.62GB |  28.73GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
}

TEST(CompatDeepSpeed, AllLiveT5SharedEmbeddingIsTheLargestLayer) {
    // t5-base: the shared embedding (32128 x 768, tied with lm_head) is the largest module.
    auto g = load_preset("t5-base");
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(deepspeed_largest_layer_params(*g), 32128 * 768);
}

TEST(CompatDeepSpeed, OptionsEntryPoint) {
    DeepSpeedOptions o;
    o.stage = 3;
    o.params = "2783959040";
    o.largest_layer_params = "65798144";
    auto e = deepspeed_estimate(o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->rows.size(), 6u);
    EXPECT_EQ(e->function, "estimate_zero3_model_states_mem_needs_all_cold");

    o.largest_layer_params.clear();
    e = deepspeed_estimate(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "largest-layer-params");

    o.stage = 2;  // stage 2 needs no largest layer
    e = deepspeed_estimate(o);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->rows.size(), 2u);

    o.stage = 1;
    e = deepspeed_estimate(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "stage");

    o.stage = 3;
    o.model = "llama-2-7b";  // MODEL and --params together
    e = deepspeed_estimate(o);
    ASSERT_FALSE(e.ok());

    o.params.clear();
    o.gpus_per_node = 4;
    e = deepspeed_estimate(o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->input.largest_layer_params, 131'072'000);
    EXPECT_EQ(e->model, "llama-2-7b");

    o.gpus_per_node = 0;
    e = deepspeed_estimate(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "gpus-per-node");

    DeepSpeedOptions bad;
    bad.params = "seven";
    e = deepspeed_estimate(bad);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "params");
}

TEST(CompatDeepSpeed, JsonAndTables) {
    const json z3 = deepspeed_rows_to_json(cold(3, kT0Params, kT0Largest, 2, 1));
    ASSERT_EQ(z3.at("rows").size(), 6u);
    for (const auto& r : z3.at("rows")) {
        std::set<std::string> keys;
        for (auto it = r.begin(); it != r.end(); ++it) keys.insert(it.key());
        EXPECT_EQ(keys, (std::set<std::string>{"offload_param", "offload_optimizer", "zero_init", "cpu_bytes", "gpu_bytes"}));
    }
    EXPECT_EQ(z3["rows"][0]["offload_param"], "cpu");
    EXPECT_EQ(z3["rows"][2]["offload_param"], "none");
    EXPECT_EQ(z3["rows"][0]["zero_init"], 1);
    EXPECT_EQ(z3["rows"][5]["cpu_bytes"], 33'407'508'480);  // 4P * 2 GPUs * 1.5
    EXPECT_EQ(z3["params"], kT0Params);
    EXPECT_EQ(z3["largest_layer_params"], kT0Largest);
    EXPECT_EQ(z3["gpus_per_node"], 2);
    EXPECT_EQ(z3["nodes"], 1);
    EXPECT_EQ(z3["stage"], 3);

    const json z2 = deepspeed_rows_to_json(cold(2, kT0Params, 0, 1, 1));
    ASSERT_EQ(z2.at("rows").size(), 2u);
    for (const auto& r : z2.at("rows")) {
        std::set<std::string> keys;
        for (auto it = r.begin(); it != r.end(); ++it) keys.insert(it.key());
        EXPECT_EQ(keys, (std::set<std::string>{"offload_optimizer", "cpu_bytes", "gpu_bytes"}));
    }
    EXPECT_FALSE(z2.contains("largest_layer_params"));
    EXPECT_EQ(json::parse(render_deepspeed(cold(2, kT0Params, 0, 1, 1), Format::Json)), z2);

    const std::string csv = render_deepspeed(cold(3, kT0Params, kT0Largest, 1, 1), Format::Csv);
    EXPECT_EQ(csv.substr(0, csv.find('\n')), "per CPU (GiB),per GPU (GiB),offload_param,offload_optimizer,zero_init,cpu_bytes,gpu_bytes");
    EXPECT_NE(csv.find("70.00,0.25,cpu,cpu,1,75166894080,263192576\n"), std::string::npos);
    const std::string md = render_deepspeed(cold(3, kT0Params, kT0Largest, 1, 1), Format::Markdown);
    EXPECT_NE(md.find("| 15.56 | 46.91 | none | none | 0 | 16703754240 | 50374455296 |"), std::string::npos);
    EXPECT_EQ(render_deepspeed(cold(3, kT0Params, kT0Largest, 1, 1), Format::Text), deepspeed_printout(cold(3, kT0Params, kT0Largest, 1, 1)));
}

// ------------------------------------------------------------------ Megatron

namespace {

MegatronArgs gpt3_175b() {
    MegatronArgs a;
    a.num_layers = 96;
    a.hidden_size = 12288;
    a.ffn_hidden_size = 4 * 12288;
    a.num_attention_heads = 96;
    a.kv_channels = 128;
    a.padded_vocab_size = 51200;  // 50257 padded to a multiple of 128 * tp = 1024
    a.seq_length = 2048;
    a.micro_batch_size = 1;
    a.tensor_model_parallel_size = 8;
    a.pipeline_model_parallel_size = 8;
    a.data_parallel_size = 8;
    a.world_size = 512;
    a.expert_tensor_parallel_size = 8;
    a.sequence_parallel = true;
    a.recompute_granularity = "selective";
    a.use_distributed_optimizer = true;
    a.num_microbatches = 192;
    return a;
}

json read_args_json(const std::string& text) { return json::parse(text); }

}  // namespace

TEST(CompatMegatron, Gpt3HandCalculation) {
    // GPT-3 175B, tp 8, pp 8, dp 8, sequence parallel + selective recompute,
    // distributed optimizer, 192 micro-batches. h = 12288, L = 96, V = 51200.
    // Weights (Megatron ignores biases and position embeddings):
    //   per layer: attention 2h*h*(1 + 1)*1 = 4h^2, MLP 2*h*4h = 8h^2, two LayerNorms 2*h*2 = 4h
    //   TP-sharded on stage 0: (L*12h^2 / pp + V*h) / tp
    //     = (173,946,175,488 / 8 + 629,145,600) / 8 = 2,796,552,192
    //   replicated on stage 0: (L*4h + 2h) / pp = (4,718,592 + 24,576) / 8 = 592,896
    //   most loaded shard: 2,797,145,088 params x (6 + 12/dp = 7.5) bytes = 20,978,588,160 B
    // Activations (Table 2 of arXiv:2205.05198, first stage):
    //   sbh = 2048*1*12288 = 25,165,824; per layer sbh*(18 + 4*4) = 855,638,016
    //   x96 = 82,141,249,536; + 8*s*b*pp = 131,072; + s*b*h*pp = 201,326,592
    //   x min(1, 192/8) = x1; no output layer on stage 0 (pp > 1); / tp = 10,292,838,400 B
    const std::int64_t h = 12288, L = 96, V = 51200, s = 2048, pp = 8, tp = 8;
    const std::int64_t tp_sharded = (L * 12 * h * h / pp + V * h) / tp;
    const std::int64_t replicated = (L * 4 * h + 2 * h) / pp;
    EXPECT_EQ(tp_sharded, 2'796'552'192);
    EXPECT_EQ(replicated, 592'896);
    const double weights = static_cast<double>(tp_sharded + replicated) * 7.5;
    const std::int64_t sbh = s * h;
    const std::int64_t act = (sbh * 34 * L + 8 * s * pp + sbh * pp) / tp;
    EXPECT_EQ(act, 10'292'838'400);

    auto r = megatron_theoretical_memory(gpt3_175b());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->weight_and_optimizer_bytes, weights);
    EXPECT_EQ(r->weight_and_optimizer_bytes, 20'978'588'160.0);
    EXPECT_EQ(r->activation_bytes, static_cast<double>(act));
    EXPECT_EQ(r->total_bytes, weights + static_cast<double>(act));
    EXPECT_EQ(r->activation_formula, "compute_activation_memory");
    EXPECT_EQ(r->params_most_loaded_shard, 2'797'145'088.0);
    // Megatron's verbose output for these arguments (report_theoretical_memory at d98e8a64ddf3).
    EXPECT_EQ(r->printout,
              "Number of parameters in transformer block in billions:  173.95\n"
              "Number of active parameters in transformer block in billions:  173.95\n"
              "Number of parameters in embedding layers in billions: 0.63\n"
              "Total number of parameters in billions: 174.58\n"
              "Total number of active parameters in billions: 174.58\n"
              "Number of parameters in most loaded shard in billions: 2.7971\n"
              "Number of parameters in other shards in billions: 2.7185\n"
              "compute_activation_memory with SP\n"
              "Activation memory footprint per transformer layer: 102.0 MB\n"
              "Number of in-flight microbatches: 8\n"
              "Theoretical memory footprints: weight and optimizer=20006.74 MB, activation=9816.02 MB, total=29822.76 MB\n\n");
    EXPECT_EQ(render_megatron(*r, Format::Text), r->printout);
}

TEST(CompatMegatron, Gpt3SmallWithoutSequenceParallelHandCalculation) {
    // GPT-3 1.3B: L 24, h 2048, 16 heads, V 50257 -> 50432 (multiple of 128*tp = 256),
    // s 2048, b 4, tp 2, pp 1, dp 4, no SP -> compute_activation_memory_without_sp.
    //   weights: TP-sharded (24*12h^2 + V*h)/2 = (1,207,959,552 + 103,284,736)/2 = 655,622,144
    //            replicated 24*4h + 2h = 200,704 -> 655,822,848 params x 18 B = 11,804,811,264 B
    //   activations: sbh = 2048*4*2048 = 16,777,216; per layer sbh*(10 + 24/2) = 369,098,752 (352.0 MB)
    //            x24 = 8,858,370,048; + 8*s*b = 65,536; + sbh = 16,777,216 -> 8,875,212,800
    //            + (s*b*V/tp + sbh)*2 = (206,569,472 + 16,777,216)*2 = 446,693,376 -> 9,321,906,176
    //            x1.05 = 9,788,001,484.8 B
    const json j = read_args_json(R"({"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 50257,
        "seq_length": 2048, "micro_batch_size": 4, "tensor_model_parallel_size": 2, "world_size": 8})");
    auto a = megatron_args_from_json(j);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->padded_vocab_size, 50432);
    EXPECT_EQ(a->ffn_hidden_size, 8192);
    EXPECT_EQ(a->kv_channels, 128);
    EXPECT_EQ(a->data_parallel_size, 4);
    auto r = megatron_theoretical_memory(*a);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->weight_and_optimizer_bytes, 655'822'848.0 * 18);
    EXPECT_DOUBLE_EQ(r->activation_bytes, 9'321'906'176.0 * 1.05);
    EXPECT_EQ(r->activation_bytes, 9788001484.800001);  // Megatron's float
    EXPECT_EQ(r->activation_formula, "compute_activation_memory_without_sp");
    EXPECT_NE(r->printout.find("Activation memory footprint per transformer layer (precise, without SP): 352.0 MB\n"), std::string::npos);
    EXPECT_NE(r->printout.find("weight and optimizer=11257.95 MB, activation=9334.57 MB, total=20592.51 MB"), std::string::npos);
}

TEST(CompatMegatron, GqaSwigluHandCalculation) {
    // Llama-3-8B-like: L 32, h 4096, 32 heads, 8 query groups, kv 128, ffn 14336,
    // SwiGLU, RMSNorm, untied embeddings, V 128256, s 8192, b 1, tp 2, dp 8,
    // SP + selective, distributed optimizer.
    //   attention 2h^2 * (1 + 8/32) * (128*32/4096) = 2.5h^2 = 41,943,040
    //   MLP 2*h*14336*1.5 = 176,160,768; RMSNorms 2*h*1 = 8,192
    //   TP-sharded: (32*(41,943,040 + 176,160,768) + V*h)/2 + V*h/2 (untied output layer, pp = 1)
    //             = (6,979,321,856 + 525,336,576)/2 + 262,668,288 = 4,014,997,504
    //   replicated: 32*8192 + 4096 (final norm) = 266,240 -> 4,015,263,744 params
    //   bytes: x (6 + 12/8) = 30,114,478,080
    //   activations: sbh = 33,554,432; per layer sbh*(18 + 4*14336/4096) = 32*sbh = 1,073,741,824
    //     x32 = 34,359,738,368; + 8*s = 65,536; + sbh = 33,554,432
    //     + sbh*4*(1 + 128256/4096) = 134,217,728 * 32.3125 = 4,336,910,336 -> 38,730,268,672; /2 = 19,365,134,336
    const json j = read_args_json(R"({"--num-layers": 32, "--hidden-size": 4096, "--ffn-hidden-size": 14336,
        "--num-attention-heads": 32, "--group-query-attention": true, "--num-query-groups": 8, "--swiglu": true,
        "--normalization": "RMSNorm", "--untie-embeddings-and-output-weights": true, "--disable-bias-linear": true,
        "--vocab-size": 128256, "--seq-length": 8192, "--micro-batch-size": 1, "--tensor-model-parallel-size": 2,
        "--data-parallel-size": 8, "--sequence-parallel": true, "--recompute-activations": true,
        "--use-distributed-optimizer": true, "--global-batch-size": 64})");
    auto a = megatron_args_from_json(j);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->padded_vocab_size, 128256);
    EXPECT_EQ(a->recompute_granularity, "selective");
    EXPECT_EQ(a->num_microbatches, 8);
    EXPECT_EQ(a->world_size, 16);
    auto r = megatron_theoretical_memory(*a);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->params_most_loaded_shard, 4'015'263'744.0);
    EXPECT_EQ(r->weight_and_optimizer_bytes, 30'114'478'080.0);
    EXPECT_EQ(r->activation_bytes, 19'365'134'336.0);
    EXPECT_EQ(r->weight_and_optimizer_mb, 30'114'478'080.0 / 1048576.0);
    EXPECT_NE(r->printout.find("Activation memory footprint per transformer layer: 512.0 MB\n"), std::string::npos);
    EXPECT_NE(r->printout.find("weight and optimizer=28719.40 MB, activation=18468.03 MB, total=47187.44 MB"), std::string::npos);
}

TEST(CompatMegatron, MoeMlaMtpAndPipelineMatchMegatron) {
    // Values returned by Megatron-LM d98e8a64ddf3's own functions for the same arguments.
    // Mixtral-like: 8 experts top-2, EP 4, tp 2, pp 4 x vpp 2, 16 micro-batches.
    auto mix = megatron_args_from_json(read_args_json(R"({"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
        "num_attention_heads": 32, "group_query_attention": true, "num_query_groups": 8, "padded_vocab_size": 32768,
        "seq_length": 4096, "micro_batch_size": 1, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
        "num_layers_per_virtual_pipeline_stage": 4, "world_size": 32, "expert_model_parallel_size": 4,
        "sequence_parallel": true, "recompute_granularity": "selective", "use_distributed_optimizer": true, "swiglu": true,
        "normalization": "RMSNorm", "untie_embeddings_and_output_weights": true, "add_bias_linear": false,
        "num_experts": 8, "moe_ffn_hidden_size": 14336, "moe_router_topk": 2, "num_microbatches": 16})"));
    ASSERT_TRUE(mix.ok()) << mix.error().message;
    EXPECT_EQ(mix->virtual_pipeline_model_parallel_size, 2);
    EXPECT_EQ(mix->data_parallel_size, 4);
    auto r = megatron_theoretical_memory(*mix);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->weight_and_optimizer_bytes, 27484038144.0);
    EXPECT_EQ(r->activation_bytes, 11857387520.0);
    EXPECT_EQ(r->printout,
              "Number of parameters in transformer block in billions:  46.44\n"
              "Number of active parameters in transformer block in billions:  12.62\n"
              "Number of parameters in embedding layers in billions: 0.27\n"
              "Total number of parameters in billions: 46.71\n"
              "Total number of active parameters in billions: 12.89\n"
              "Number of parameters in most loaded shard in billions: 1.6445\n"
              "Number of parameters in other shards in billions: 1.5774\n"
              "compute_activation_memory with SP\n"
              "Activation memory footprint per transformer layer: 256.0 MB\n"
              "Memory penalty from interleaved schedule: 1.38\n"
              "Number of in-flight microbatches: 6\n"
              "Theoretical memory footprints: weight and optimizer=26210.82 MB, activation=11308.09 MB, total=37518.91 MB\n\n");

    // DeepSeek-V2-Lite-like: MLA, 64 experts top-6 + shared expert, first layer dense, 1 MTP layer, full recompute.
    json ds = read_args_json(R"({"num_layers": 27, "hidden_size": 2048, "ffn_hidden_size": 10944, "num_attention_heads": 16,
        "padded_vocab_size": 102400, "seq_length": 4096, "micro_batch_size": 1, "data_parallel_size": 8,
        "expert_model_parallel_size": 8, "use_distributed_optimizer": true, "swiglu": true, "normalization": "RMSNorm",
        "untie_embeddings_and_output_weights": true, "add_bias_linear": false, "num_experts": 64,
        "moe_ffn_hidden_size": 1408, "moe_router_topk": 6, "moe_shared_expert_intermediate_size": 2816,
        "multi_latent_attention": true, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
        "v_head_dim": 128, "mtp_num_layers": 1, "recompute_granularity": "full"})");
    json pattern = json::array({0});
    for (int i = 1; i < 27; ++i) pattern.push_back(1);
    ds["moe_layer_freq"] = pattern;
    auto dsa = megatron_args_from_json(ds);
    ASSERT_TRUE(dsa.ok()) << dsa.error().message;
    r = megatron_theoretical_memory(*dsa);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->weight_and_optimizer_bytes, 43705368576.0);
    EXPECT_EQ(r->activation_bytes, 8993041612.800001);
    EXPECT_NE(r->printout.find("Number of parameters in mtp block in billions:  0.58\n"), std::string::npos);
    EXPECT_NE(r->printout.find("Total number of active parameters in billions: 3.25\n"), std::string::npos);
    EXPECT_NE(r->printout.find("weight and optimizer=41680.69 MB, activation=8576.43 MB, total=50257.12 MB"), std::string::npos);
    // The same pattern as a string list (--moe-layer-freq "[0,1,...]").
    ds["moe_layer_freq"] = pattern.dump();
    EXPECT_EQ(megatron_theoretical_memory(megatron_args_from_json(ds).value())->weight_and_optimizer_bytes, 43705368576.0);

    // Fewer micro-batches (3) than pipeline stages (4): activations scaled by 3/4.
    auto few = megatron_args_from_json(read_args_json(R"({"num_layers": 24, "hidden_size": 1536, "num_attention_heads": 12,
        "kv_channels": 128, "padded_vocab_size": 50304, "seq_length": 1024, "micro_batch_size": 2,
        "pipeline_model_parallel_size": 4, "data_parallel_size": 3, "global_batch_size": 18})"));
    ASSERT_TRUE(few.ok()) << few.error().message;
    EXPECT_EQ(few->num_microbatches, 3);
    r = megatron_theoretical_memory(*few);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->weight_and_optimizer_bytes, 4449129984.0);
    EXPECT_EQ(r->activation_bytes, 2031405465.6000001);
    EXPECT_EQ(r->in_flight_microbatches, 3);
}

TEST(CompatMegatron, ArgumentDefaultsAndErrors) {
    // SwiGLU default ffn: int((4*4096*2/3)/64)*64 = 10880; tp 1 turns sequence parallel off.
    auto a = megatron_args_from_json(read_args_json(R"({"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
        "vocab_size": 32000, "seq_length": 128, "micro_batch_size": 1, "swiglu": true, "sequence_parallel": true,
        "recompute_granularity": "selective", "some_unrelated_flag": [1, 2], "virtual_pipeline_model_parallel_size": null})"));
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->ffn_hidden_size, 10880);
    EXPECT_FALSE(a->sequence_parallel);
    EXPECT_EQ(a->padded_vocab_size, 32000);
    EXPECT_EQ(megatron_theoretical_memory(*a)->activation_formula, "compute_activation_memory_without_sp");
    EXPECT_EQ(megatron_padded_vocab_size(50257, 128, 8), 51200);
    EXPECT_EQ(megatron_padded_vocab_size(50257, 128, 1), 50304);

    const auto err = [](const std::string& text) {
        auto r = megatron_args_from_json(json::parse(text));
        EXPECT_FALSE(r.ok()) << text;
        return r.ok() ? Error{} : r.error();
    };
    Error e = err(R"({"num_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1})");
    EXPECT_EQ(e.field, "hidden_size");
    EXPECT_NE(e.message.find("hidden_size"), std::string::npos);
    e = err(R"({"num_layers": "two", "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1})");
    EXPECT_EQ(e.field, "num_layers");
    EXPECT_NE(e.message.find("integer"), std::string::npos);
    e = err(R"({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 4, "seq_length": 8, "micro_batch_size": 1})");
    EXPECT_EQ(e.field, "padded_vocab_size");
    e = err(R"({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1, "swiglu": "yes"})");
    EXPECT_EQ(e.field, "swiglu");
    e = err(R"({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 0})");
    EXPECT_EQ(e.field, "micro_batch_size");
    e = err(R"({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1,
               "tensor_model_parallel_size": 4, "world_size": 2})");
    EXPECT_EQ(e.field, "world_size");
    e = err(R"J({"num_layers": 4, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1,
               "num_experts": 4, "moe_layer_freq": "([1]*3+[0]*1)"})J");
    EXPECT_EQ(e.field, "moe_layer_freq");
    e = err(R"({"num_layers": 4, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1,
               "num_experts": 4, "moe_layer_freq": [1, 0]})");
    EXPECT_EQ(e.field, "moe_layer_freq");
    e = err(R"({"num_layers": 4, "hidden_size": 8, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1,
               "normalization": "BatchNorm"})");
    EXPECT_EQ(e.field, "normalization");
    e = err(R"([1, 2])");
    e = err(R"({"num_layers": 2, "hidden_size": 10, "num_attention_heads": 4, "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1})");
    EXPECT_EQ(e.field, "kv_channels");

    // Hybrid Mamba models: Megatron prints that it cannot report.
    auto hy = megatron_args_from_json(read_args_json(R"({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 4,
        "vocab_size": 10, "seq_length": 8, "micro_batch_size": 1, "hybrid_layer_pattern": "M*M*"})"));
    ASSERT_TRUE(hy.ok());
    auto hr = megatron_theoretical_memory(*hy);
    ASSERT_FALSE(hr.ok());
    EXPECT_EQ(hr.error().code, ErrorCode::Unsupported);
}

TEST(CompatMegatron, FileEntryPointAndRenderers) {
    const std::string path = std::string(::testing::TempDir()) + "gpumem_compat_megatron_args.json";
    {
        std::ofstream f(path);
        f << R"({"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 50257,
                 "seq_length": 2048, "micro_batch_size": 4, "tensor_model_parallel_size": 2, "world_size": 8})";
    }
    auto r = megatron_report_from_file(path);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const json j = megatron_to_json(*r);
    EXPECT_EQ(j["weight_and_optimizer_bytes"], 11'804'811'264);
    EXPECT_EQ(j["activation_bytes"], 9'788'001'485);  // 9,788,001,484.8 rounded
    EXPECT_EQ(j["activation_formula"], "compute_activation_memory_without_sp");
    EXPECT_EQ(j["args"]["padded_vocab_size"], 50432);
    EXPECT_EQ(json::parse(render_megatron(*r, Format::Json)), j);
    const std::string csv = render_megatron(*r, Format::Csv);
    EXPECT_NE(csv.find("weight and optimizer,11257.95,11804811264,compute_weight_and_optimizer_memory\n"), std::string::npos);
    EXPECT_NE(render_megatron(*r, Format::Markdown).find("| total | 20592.51 |"), std::string::npos);
    std::remove(path.c_str());

    auto missing = megatron_report_from_file(path + ".does-not-exist");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code, ErrorCode::NotFound);
}

TEST(CompatDeepSpeed, AllLiveT0_3BConfigLargestLayer) {
    // bigscience/T0_3B (t5-v1_1-lm-adapt XL): d_model 2048, gated-gelu, untied lm_head.
    // DeepSpeed's measured printout used AutoModel (T5Model, no lm_head): 2,783,959,040
    // params; gpumem builds the LM (+ lm_head 32128 x 2048 = 65,798,144). The largest
    // module is the 32128 x 2048 embedding either way.
    const json cfg = {{"model_type", "t5"},          {"vocab_size", 32128}, {"d_model", 2048},
                      {"d_kv", 64},                  {"d_ff", 5120},        {"num_layers", 24},
                      {"num_decoder_layers", 24},    {"num_heads", 32},     {"relative_attention_num_buckets", 32},
                      {"feed_forward_proj", "gated-gelu"}, {"tie_word_embeddings", false}};
    auto g = load_hf_config_json(cfg, "T0_3B");
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->total_params(), kT0Params + kT0Largest);
    EXPECT_EQ(deepspeed_largest_layer_params(*g), kT0Largest);
}
