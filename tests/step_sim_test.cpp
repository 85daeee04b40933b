// The step simulator against the seed's measurements and against the
// analytic model (the two must agree on the steady-state parts).
#include <gtest/gtest.h>

#include <cmath>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
double mib(Bytes b) { return static_cast<double>(b.count()) / kMiB; }

EstimateResult sim(const std::string& model, EstimateRequest req) {
    auto g = load_model(model.find('/') != std::string::npos ? test::source_path(model) : model);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
    auto r = simulate_estimate(g.value(), req);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    EXPECT_TRUE(r.value().simulation.has_value());
    return r.value();
}
}  // namespace

// Seed 000 (tests/fixtures/groundtruth/measured.json, seed_notes cn-toy-mlp-fp32):
// forward adds 168.125 MiB (outputs 160 MiB + the first cuBLAS workspace),
// memory_allocated after backward is 168.28 MiB, the first step peaks at
// 360.27 MiB during backward. Within 0.5%.
TEST(StepSim, SeedToyMlpFirstStep) {
    const auto gt = test::read_json("tests/fixtures/groundtruth/measured.json");
    nlohmann::json values;
    for (const auto& s : gt["seed_notes"])
        if (s["id"] == "cn-toy-mlp-fp32") values = s["values"];
    ASSERT_FALSE(values.is_null());
    EstimateRequest req;
    req.batch = 10240;
    req.precision = Precision::FP32;
    req.optimizer = Optimizer::AdamW;
    req.gpu = "A100-80GB";  // pre-Hopper: 8.125 MiB cuBLAS workspaces, as measured
    const auto r = sim("tests/fixtures/models/toy_mlp.json", req);
    const auto& s = *r.simulation;
    const double params = values["params"].get<double>(), input = values["input"].get<double>();
    EXPECT_NEAR(mib(s.after_forward) - params - input, values["forward_activations_measured_first_time"].get<double>(),
                0.005 * values["forward_activations_measured_first_time"].get<double>());
    EXPECT_NEAR(mib(s.after_backward), values["after_backward"].get<double>(), 0.005 * values["after_backward"].get<double>());
    EXPECT_NEAR(mib(s.first_step_peak_allocated), values["peak"].get<double>(), 0.005 * values["peak"].get<double>());
    EXPECT_EQ(s.peak_phase, "backward");
}

// With no allocator (live tensor bytes), memory at the end of the first
// forward is exactly weights + saved activations + the 4-byte loss: the
// simulator and the analytic saved-tensor model agree.
TEST(StepSim, AgreesWithAnalyticActivations) {
    struct Case {
        const char* model;
        Precision p;
        Attention a;
        Recompute rc;
    };
    const Case cases[] = {
        {"gpt2", Precision::FP32, Attention::Eager, Recompute::None},
        {"gpt2", Precision::AmpBF16, Attention::Flash, Recompute::None},
        {"smollm2-135m", Precision::BF16, Attention::Eager, Recompute::None},
        {"smollm2-135m", Precision::AmpBF16, Attention::Flash, Recompute::Selective},
        {"smollm2-135m", Precision::BF16, Attention::Flash, Recompute::Full},
        {"qwen2-0.5b", Precision::AmpBF16, Attention::Flash, Recompute::None},
        {"bert-base-uncased", Precision::FP32, Attention::Eager, Recompute::None},
        {"t5-small", Precision::FP32, Attention::Eager, Recompute::None},
    };
    for (const auto& c : cases) {
        EstimateRequest req;
        req.batch = 2;
        req.seq = 128;
        req.precision = c.p;
        req.attention = c.a;
        req.recompute = c.rc;
        req.allocator = AllocatorKind::None;
        const auto r = sim(c.model, req);
        const auto& s = *r.simulation;
        EXPECT_EQ(s.after_forward.count(), (r.per_gpu.weights + r.per_gpu.activations).count() + 4)
            << c.model << " " << to_string(c.p) << " " << to_string(c.a) << " " << to_string(c.rc) << " diff " << (s.after_forward.count() - (r.per_gpu.weights + r.per_gpu.activations).count() - 4);
        // After backward: weights + gradients + the loss (the batch is saved, then freed... it is
        // still held by the loop variable).
        EXPECT_GE(s.after_backward.count(), (r.per_gpu.weights + r.per_gpu.gradients).count()) << c.model;
        // The optimizer step creates the states.
        EXPECT_EQ(s.after_optimizer - s.after_backward, r.per_gpu.optimizer_states) << c.model;
    }
}

TEST(StepSim, AllocatorAddsRoundingAndCache) {
    EstimateRequest req;
    req.batch = 2;
    req.seq = 256;
    req.allocator = AllocatorKind::None;
    const auto none = sim("smollm2-135m", req);
    req.allocator = AllocatorKind::PyTorch;
    const auto torch = sim("smollm2-135m", req);
    EXPECT_GE(torch.per_gpu.peak_allocated, none.per_gpu.peak_allocated);
    EXPECT_GE(torch.per_gpu.peak_reserved, torch.per_gpu.peak_allocated);
    EXPECT_EQ(none.per_gpu.peak_reserved, none.per_gpu.peak_allocated);
    Bytes sum;
    for (const auto& row : torch.breakdown) sum += row.bytes;
    EXPECT_EQ(sum, torch.per_gpu.total_device);
}

// Expandable segments map memory in pages instead of per-request segments,
// so the cache cannot strand whole segments: reserved memory is lower.
TEST(StepSim, ExpandableSegmentsReduceReserved) {
    EstimateRequest req;
    req.batch = 4;
    req.seq = 1024;
    req.gpu_memory = GiB(1024);
    const auto plain = sim("llama-3.2-1b", req);
    req.alloc_conf = "expandable_segments:True";
    const auto expandable = sim("llama-3.2-1b", req);
    EXPECT_LE(expandable.per_gpu.peak_reserved, plain.per_gpu.peak_reserved);
    EXPECT_EQ(expandable.per_gpu.peak_allocated, plain.per_gpu.peak_allocated);
}

TEST(StepSim, DoesNotFitIsAnAnswer) {
    EstimateRequest req;
    req.batch = 4;
    req.seq = 4096;
    req.gpu = "A100-80GB";
    const auto r = sim("llama-3-8b", req);
    EXPECT_FALSE(r.per_gpu.fits);
    EXPECT_TRUE(r.simulation->oom);
    // The reported peak is what the job needs, far above the card.
    EXPECT_GT(r.per_gpu.peak_allocated, GiB(80));
}

TEST(StepSim, InferenceKvCacheGrows) {
    EstimateRequest req;
    req.mode = Mode::Infer;
    req.batch = 1;
    req.seq = 512;
    req.gen_len = 16;
    req.allocator = AllocatorKind::None;
    const auto r = sim("llama-3.2-1b", req);
    // The cache of prompt + generated tokens is live at the end.
    EXPECT_GE(r.per_gpu.peak_allocated, r.per_gpu.weights + r.per_gpu.kv_cache);
}

// gpumem fit: the largest micro-batch fits and the next one does not (both
// checked with separate estimates here).
TEST(Fit, LargestBatchFitsAndNextDoesNot) {
    const auto r = test::run_cli("fit llama-3.2-1b --gpu A100-40GB --seq 1024 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const std::int64_t b = j["batch"]["largest"].get<std::int64_t>();
    ASSERT_GT(b, 0);
    EstimateRequest req;
    req.model = "llama-3.2-1b";
    req.gpu = "A100-40GB";
    req.seq = 1024;
    req.batch = b;
    EXPECT_TRUE(simulate_estimate(req).value().per_gpu.fits);
    req.batch = b + 1;
    EXPECT_FALSE(simulate_estimate(req).value().per_gpu.fits);
    EXPECT_NE(j["batch"]["limit"].get<std::string>().find("growing most"), std::string::npos);
    const auto none = test::run_cli("fit llama-3-70b --gpu L4 --format json");
    EXPECT_EQ(nlohmann::json::parse(none.out)["batch"]["largest"].get<std::int64_t>(), 0);
}

// gpumem advise: every ranked technique's memory equals a separate estimate of
// the same settings, and the combination it proposes fits when estimated.
TEST(Advise, TechniquesMatchSeparateEstimates) {
    const auto r = test::run_cli("advise llama-3.2-1b --gpu A100-40GB --batch 16 --seq 2048 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_FALSE(j["baseline"]["fits"].get<bool>());
    bool saw_full = false;
    for (const auto& t : j["techniques"]) {
        if (t["key"] != "recompute_full") continue;
        saw_full = true;
        EstimateRequest req;
        req.model = "llama-3.2-1b";
        req.gpu = "A100-40GB";
        req.batch = 16;
        req.seq = 2048;
        req.recompute = Recompute::Full;
        EXPECT_EQ(t["total_device"].get<std::int64_t>(), simulate_estimate(req).value().per_gpu.total_device.count());
    }
    EXPECT_TRUE(saw_full);
    EXPECT_TRUE(j["combination"]["fits"].get<bool>());
    EXPECT_LE(j["combination"]["total_device"].get<std::int64_t>(), j["capacity"].get<std::int64_t>());
}
