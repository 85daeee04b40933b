// Distributed layouts: invariants, the ZeRO paper's model-state numbers, and
// layout errors that name the constraint and the nearest valid values.
#include <gtest/gtest.h>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {
EstimateResult run(EstimateRequest req) {
    auto r = estimate(req);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
}
Bytes states(const EstimateResult& r) { return r.per_gpu.weights + r.per_gpu.gradients + r.per_gpu.optimizer_states; }
std::string error_of(EstimateRequest req) {
    auto r = estimate(req);
    return r.ok() ? std::string("(no error)") : r.error().message;
}
}  // namespace

// ZeRO paper (Rajbhandari et al. 2019), Figure 1: 7.5B parameters, 64 GPUs,
// mixed-precision Adam (K = 12): 120 / 31.4 / 16.6 / 1.9 GB per GPU
// (tests/fixtures/groundtruth/measured.json, zero-model-states-7.5B-64gpu).
TEST(Parallel, ZeroPaperModelStates) {
    const auto gt = test::read_json("tests/fixtures/groundtruth/measured.json");
    nlohmann::json ref;
    for (const auto& f : gt["formula_references"])
        if (f["id"] == "zero-model-states-7.5B-64gpu") ref = f["per_gpu_GB"];
    ASSERT_FALSE(ref.is_null());
    EstimateRequest req;
    req.params_count = 7'500'000'000;
    req.precision = Precision::FP16;
    req.optimizer = Optimizer::Adam;
    req.parallel.gpus = 64;
    const std::pair<int, const char*> rows[] = {{0, "baseline_DP"}, {1, "ZeRO-1 (P_os)"}, {2, "ZeRO-2 (P_os+g)"}, {3, "ZeRO-3 (P_os+g+p)"}};
    for (const auto& [stage, key] : rows) {
        req.parallel.zero = stage;
        const auto r = run(req);
        EXPECT_NEAR(states(r).gb(), ref[key].get<double>(), 1e-6) << key;
    }
}

// One GPU with a layout spelled out is the single-GPU answer; data parallelism
// without sharding keeps everything per GPU and adds DDP's gradient buckets.
TEST(Parallel, TrivialLayoutEqualsSingleGpu) {
    EstimateRequest req;
    req.model = "llama-3.2-1b";
    req.seq = 1024;
    const auto single = run(req);
    req.parallel.gpus = 8;
    const auto ddp = run(req);
    EXPECT_EQ(ddp.per_gpu.weights, single.per_gpu.weights);
    EXPECT_EQ(ddp.per_gpu.gradients, single.per_gpu.gradients);
    EXPECT_EQ(ddp.per_gpu.optimizer_states, single.per_gpu.optimizer_states);
    EXPECT_EQ(ddp.per_gpu.activations, single.per_gpu.activations);
    ASSERT_TRUE(ddp.parallel.has_value());
    // torch DDP copies gradients into buckets (gradient_as_bucket_view=False).
    EXPECT_EQ(ddp.parallel->stages[0].comm_buffers, single.per_gpu.gradients);
}

// ZeRO-3 on N GPUs: model states are ZeRO-0's / N (up to padding of the flat
// buffers to a multiple of N elements), plus the gathered layers in flight.
TEST(Parallel, Zero3ShardsEverything) {
    EstimateRequest req;
    req.model = "llama-3-8b";
    req.seq = 2048;
    req.parallel.gpus = 16;
    req.parallel.nodes = 2;
    const auto z0 = run(req);
    req.parallel.zero = 3;
    const auto z3 = run(req);
    const std::int64_t n = 16;
    const double per_param_bytes = static_cast<double>(states(z0).count()) / 8030261248.0;
    EXPECT_NEAR(static_cast<double>(states(z3).count()), static_cast<double>(states(z0).count()) / n, per_param_bytes * n);
    EXPECT_GT(z3.parallel->stages[0].gathered_params, Bytes(0));
    EXPECT_EQ(z3.per_gpu.activations, z0.per_gpu.activations);
    req.parallel.zero = 1;
    const auto z1 = run(req);
    EXPECT_EQ(z1.per_gpu.weights, z0.per_gpu.weights);
    EXPECT_EQ(z1.per_gpu.gradients, z0.per_gpu.gradients);
    EXPECT_LT(z1.per_gpu.optimizer_states, z0.per_gpu.optimizer_states.ceil_div(n) + Bytes(64));
    req.parallel.zero = 2;
    const auto z2 = run(req);
    EXPECT_LT(z2.per_gpu.gradients, z0.per_gpu.gradients.ceil_div(n) + Bytes(64));
    req.parallel.zero = 3;
    req.parallel.offload_optimizer = Offload::Cpu;
    req.parallel.offload_params = Offload::Cpu;
    const auto off = run(req);
    EXPECT_EQ(off.per_gpu.optimizer_states, Bytes(0));
    EXPECT_EQ(off.per_gpu.weights, Bytes(0));
    EXPECT_GT(off.parallel->cpu_per_node, Bytes(0));
}

// Pipeline 1F1B: the first stage keeps pp micro-batches in flight and is the
// most loaded; sequence parallelism divides what tensor parallelism leaves
// replicated.
TEST(Parallel, PipelineAndTensorParallelActivations) {
    EstimateRequest req;
    req.model = "llama-3-8b";
    req.seq = 4096;
    req.grad_accum = 8;
    req.parallel.gpus = 8;
    req.parallel.tp = 2;
    req.parallel.pp = 4;
    const auto r = run(req);
    ASSERT_EQ(r.parallel->stages.size(), 4u);
    EXPECT_EQ(r.parallel->stages[0].in_flight, 4);
    EXPECT_EQ(r.parallel->stages[3].in_flight, 1);
    EXPECT_EQ(r.parallel->most_loaded, 0);
    EXPECT_EQ(r.parallel->stages[0].layers, 8);
    req.parallel.sp = true;
    const auto sp = run(req);
    EXPECT_LT(sp.parallel->stages[1].activations, r.parallel->stages[1].activations);
    // With SP every activation of a layer is split: stage 1 (layers only) at tp 2
    // holds half of what tp 1 would hold.
    req.parallel.sp = false;
    req.parallel.tp = 1;
    req.parallel.gpus = 4;
    const auto tp1 = run(req);
    EXPECT_NEAR(static_cast<double>(sp.parallel->stages[1].activations.count()),
                static_cast<double>(tp1.parallel->stages[1].activations.count()) / 2, 1e6);
}

TEST(Parallel, ImpossibleLayoutsNameTheConstraint) {
    EstimateRequest req;
    req.model = "llama-3-8b";  // 32 heads, 8 kv heads, 32 layers
    req.seq = 4096;
    req.parallel.gpus = 48;
    req.parallel.tp = 3;
    EXPECT_NE(error_of(req).find("--tp 3 does not divide the 32 attention heads; use --tp 2 or 4"), std::string::npos) << error_of(req);
    req.parallel.tp = 2;
    req.parallel.pp = 5;
    req.parallel.gpus = 40;
    EXPECT_NE(error_of(req).find("32 layers"), std::string::npos) << error_of(req);
    EXPECT_NE(error_of(req).find("--pp 4 or 8"), std::string::npos) << error_of(req);
    req.parallel.pp = 4;
    req.parallel.gpus = 12;
    EXPECT_NE(error_of(req).find("not divisible by tp x pp x cp = 8"), std::string::npos) << error_of(req);
    req.parallel.gpus = 16;
    req.parallel.zero = 3;
    EXPECT_NE(error_of(req).find("ZeRO stage 0 or 1"), std::string::npos) << error_of(req);
    req.parallel.zero = 0;
    req.parallel.ep = 2;
    EXPECT_NE(error_of(req).find("mixture-of-experts"), std::string::npos) << error_of(req);
    EstimateRequest moe;
    moe.model = "mixtral-8x7b";
    moe.seq = 1024;
    moe.parallel.gpus = 12;
    moe.parallel.ep = 3;
    EXPECT_NE(error_of(moe).find("does not divide the 8 experts; use --ep 2 or 4"), std::string::npos) << error_of(moe);
}

// CLI: the layout flags reach the estimate and the JSON carries every stage.
TEST(Parallel, CliJson) {
    const auto r = test::run_cli("estimate llama-3-8b --gpus 16 --nodes 2 --tp 2 --pp 2 --zero 1 --seq 2048 --grad-accum 4 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["parallel"]["dp"].get<int>(), 4);
    EXPECT_EQ(j["parallel"]["stages"].size(), 2u);
    const auto bad = test::run_cli("estimate llama-3-8b --gpus 10 --tp 4");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.err.find("tp x pp x cp = 4"), std::string::npos) << bad.err;
}

// shared/reference/memory-formulas.md: Megatron bf16 with fp32 gradients keeps
// 2 + 4 + 12 bytes per parameter; the distributed optimizer makes it 6 + 12/DP.
TEST(Parallel, MegatronDistributedOptimizer) {
    EstimateRequest req;
    req.params_count = 7'000'000'000;
    req.precision = Precision::BF16;
    req.parallel.distributed_optimizer = true;
    req.parallel.gpus = 8;
    const auto r = run(req);
    EXPECT_EQ(r.per_gpu.weights.count(), 2 * 7'000'000'000LL);
    EXPECT_EQ(r.per_gpu.gradients.count(), 4 * 7'000'000'000LL);
    EXPECT_EQ(r.per_gpu.optimizer_states.count(), 12 * 7'000'000'000LL / 8);
}

// `gpumem compat deepspeed` prints DeepSpeed's rows; the T0_3B printout in
// measured.json (per GPU 46.91 GB without offload, 0.25 GB with both offloads).
TEST(Parallel, CompatDeepSpeedCli) {
    const auto r = test::run_cli("compat deepspeed --stage 3 --params 2783959040 --largest-layer-params 65798144 --gpus-per-node 1 --nodes 1 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["rows"].size(), 6u);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    EXPECT_NEAR(static_cast<double>(j["rows"][0]["gpu_bytes"].get<std::int64_t>()) / gib, 0.25, 0.005);
    EXPECT_NEAR(static_cast<double>(j["rows"][5]["gpu_bytes"].get<std::int64_t>()) / gib, 46.91, 0.005);
    EXPECT_EQ(test::run_cli("compat deepspeed --stage 4 --params 7B").exit_code, 2);
}
