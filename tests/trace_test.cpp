// Traced model graphs (bindings/python/gpumem/tracer.py, issue 14) against the
// CPU oracle (oracle/trace_oracle.py: the same models run for real on the CPU
// with torch 1.13, fp32; tests/fixtures/traced/oracle.json — and again with
// torch 2.6, Debian trixie's python3-torch: tests/fixtures/traced-torch2/, the
// trace and the real run both made by that torch) and against gpumem's own
// builders for the Hugging Face families traced. Every test runs over both sets.
//
// The graphs were traced on the meta device; the oracle's numbers come from a
// separate real run: saved-tensor bytes (saved_tensors_hooks, deduplicated by
// storage, parameters and buffers left out) and two AdamW(foreach=False) steps
// under the profiler (live bytes). torch 1.13's LLaMA RMSNorm keeps mean()'s
// input, which torch >= 2.0 does not; the trace answers for 2.x (modern_saves)
// so those bytes (the fixture's saved_bytes_1_13_only, (2L+1)*b*s*h*4) come
// off the oracle where they are alive, as in step_oracle_test.cpp. The torch
// 2.6 run keeps no such bytes (its saved_bytes_1_13_only is 0): there the
// oracle is compared as measured.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

ModelGraph traced(const std::string& rel) {
    auto g = load_model(test::source_path(rel));
    EXPECT_TRUE(g.ok()) << rel << ": " << (g.ok() ? "" : g.error().message);
    return std::move(g).value();
}

double ratio(Bytes got, std::int64_t want) { return static_cast<double>(got.count()) / static_cast<double>(want); }
double ratio(Bytes got, Bytes want) { return ratio(got, want.count()); }

// gpumem's built-in builder for a traced replica's config.json.
ModelGraph builder_of(const nlohmann::json& m) {
    auto g = load_hf_config_json(test::oracle_hf_config(m["hf_config"], m["hf_family"]), "oracle config");
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
    return std::move(g).value();
}

// The step oracles' request (fp32, eager, for-loop AdamW, live bytes only);
// fixed-shape models take no sequence.
EstimateRequest oracle_request(const nlohmann::json& pt, bool has_seq) {
    EstimateRequest req = test::oracle_step_request(pt);
    if (!has_seq) req.seq.reset();
    return req;
}

std::string job_text(const std::string& graph, const EstimateRequest& r) {
    std::string s = "gpumem estimate " + graph + " --mode train --precision " + std::string(r.precision ? to_string(*r.precision) : "amp-bf16") + " --attention eager --batch " + std::to_string(r.batch);
    if (r.seq) s += " --seq " + std::to_string(*r.seq);
    return s;
}

// The oracle fixtures: torch 1.13 (bookworm) and torch 2.6 (trixie).
const char* const kOracles[] = {"tests/fixtures/traced/oracle.json", "tests/fixtures/traced-torch2/oracle.json"};

}  // namespace

TEST(Trace, BothTorchVersionsWereRun) {
    EXPECT_EQ(test::read_json(kOracles[0])["torch_version"].get<std::string>().rfind("1.13", 0), 0u);
    EXPECT_EQ(test::read_json(kOracles[1])["torch_version"].get<std::string>().rfind("2.", 0), 0u);
}

TEST(Trace, ParameterCountsEqualTorch) {
    for (const char* oracle : kOracles) {
        SCOPED_TRACE(oracle);
        const auto fx = test::read_json(oracle);
        ASSERT_GE(fx["models"].size(), 6u);
        for (const auto& m : fx["models"]) {
            const ModelGraph g = traced(m["graph"]);
            EXPECT_EQ(g.total_params(), m["params"].get<std::int64_t>()) << m["name"];
            EXPECT_EQ(g.trainable_params(), m["trainable_params"].get<std::int64_t>()) << m["name"];
            EXPECT_EQ(g.has_sequence, m["has_sequence"].get<bool>()) << m["name"];
        }
    }
}

TEST(Trace, SavedActivationsWithinTwoPercentOfTheCpuRun) {
    for (const char* oracle : kOracles) {
        SCOPED_TRACE(oracle);
        const auto fx = test::read_json(oracle);
        int checked = 0;
        for (const auto& m : fx["models"]) {
            const ModelGraph g = traced(m["graph"]);
            for (const auto& pt : m["points"]) {
                const EstimateRequest req = oracle_request(pt, m["has_sequence"]);
                auto r = estimate(g, req);
                ASSERT_TRUE(r.ok()) << r.error().message;
                const std::int64_t want = pt["saved_bytes"].get<std::int64_t>() - pt["saved_bytes_1_13_only"].get<std::int64_t>();
                EXPECT_NEAR(ratio(r.value().per_gpu.activations, want), 1.0, 0.02)
                    << job_text(m["graph"], req) << ": gpumem " << r.value().per_gpu.activations.count() << " B, CPU run " << want << " B";
                ++checked;
            }
        }
        EXPECT_GE(checked, 14);
    }
}

TEST(Trace, StepPeaksWithinTwoPercentOfTheCpuRun) {
    for (const char* oracle : kOracles) {
        SCOPED_TRACE(oracle);
        const auto fx = test::read_json(oracle);
        int checked = 0;
        for (const auto& m : fx["models"]) {
            const ModelGraph g = traced(m["graph"]);
            for (const auto& pt : m["points"]) {
                const EstimateRequest req = oracle_request(pt, m["has_sequence"]);
                auto r = simulate_estimate(g, req);
                ASSERT_TRUE(r.ok()) << r.error().message;
                const auto& s = *r.value().simulation;
                const std::int64_t mean_saves = pt["saved_bytes_1_13_only"].get<std::int64_t>();
                // CPU convolution kernels allocate scratch (im2col columns, reorders) inside
                // convolution_backward; a GPU runs cuDNN there, whose workspace gpumem counts
                // apart (--allocator none leaves it out): the oracle's peak without them.
                auto modern = [&](const nlohmann::json& step) {
                    const std::string phase = step["peak_phase"];
                    return step["peak_bytes_without_cpu_conv_scratch"].get<std::int64_t>() -
                           (phase == "forward" || phase == "backward" ? mean_saves : 0);
                };
                const std::string job = job_text(m["graph"], req) + " --optimizer-impl for-loop --allocator none";
                EXPECT_NEAR(ratio(s.first_step_peak_allocated, modern(pt["step1"])), 1.0, 0.02) << job << " (step 1)";
                EXPECT_NEAR(ratio(s.steady_peak_allocated, modern(pt["step2"])), 1.0, 0.02) << job << " (step 2)";
                EXPECT_NEAR(ratio(s.after_forward, pt["step1"]["after_forward"].get<std::int64_t>() - mean_saves), 1.0, 0.02)
                    << job << " (after forward)";
                ++checked;
            }
        }
        EXPECT_GE(checked, 14);
    }
}

// The Hugging Face families traced (the oracle's GPT-2 and LLaMA replicas,
// which run HF's modeling code op for op) against gpumem's builders for the
// same config.json, over a generated grid of jobs (batch x seq x fp32/bf16):
// the saved activations agree within 2%, and so does the simulated peak in
// fp32 and bf16. (The traced LLaMA found the builder 10% low in bf16 at seq
// 1024: it lacked the fp32 copy of the scores ATen makes before a bfloat16
// softmax(dtype=float32); Bf16StepPeaksWithinTwoPercentOfTheCpuRun below.)
TEST(Trace, HfFamiliesTracedEqualTheBuilders) {
    for (const char* oracle : kOracles) {
        SCOPED_TRACE(oracle);
        const auto fx = test::read_json(oracle);
        int checked = 0;
        for (const auto& m : fx["models"]) {
            if (!m.contains("hf_family")) continue;
            const ModelGraph tg = traced(m["graph"]);
            const ModelGraph bg = builder_of(m);
            for (std::int64_t batch : {1, 2, 8})
                for (std::int64_t seq : {32, 256, 1024})
                    for (Precision prec : {Precision::FP32, Precision::BF16}) {
                        EstimateRequest req;
                        req.mode = Mode::Train;
                        req.precision = prec;
                        req.attention = Attention::Eager;
                        req.batch = batch;
                        req.seq = seq;
                        const std::string job = job_text(m["graph"], req);
                        auto t = estimate(tg, req);
                        auto b = estimate(bg, req);
                        ASSERT_TRUE(t.ok() && b.ok()) << job;
                        EXPECT_NEAR(ratio(t.value().per_gpu.activations, b.value().per_gpu.activations), 1.0, 0.02)
                            << job << ": traced " << t.value().per_gpu.activations.count() << " B, builder "
                            << b.value().per_gpu.activations.count() << " B";
                        auto ts = simulate_estimate(tg, req);
                        auto bs = simulate_estimate(bg, req);
                        ASSERT_TRUE(ts.ok() && bs.ok()) << job;
                        EXPECT_NEAR(ratio(ts.value().per_gpu.peak_allocated, bs.value().per_gpu.peak_allocated), 1.0, 0.02)
                            << job << " (simulated peak)";
                        ++checked;
                    }
        }
        EXPECT_GE(checked, 36);
    }
}

// Pure bfloat16 (the oracle runs model.to(bfloat16) on the CPU): the traced
// LLaMA's simulated step peaks within 2% of the real run, explicit fp32
// upcasts included (RMSNorm's .to(float32), softmax(dtype=float32) and its
// cast back, whose fp32 gradients dominate the backward at long sequences).
// gpumem's built-in LLaMA builder too: it was 10% low here at seq 1024
// before it made the fp32 copy of the scores ATen makes for a bfloat16
// softmax(dtype=float32) (aten/src/ATen/native/SoftMax.cpp softmax(input,
// dim, dtype): only CUDA fp16 takes the fused half_to_float kernel).
TEST(Trace, Bf16StepPeaksWithinTwoPercentOfTheCpuRun) {
    for (const char* oracle : kOracles) {
        SCOPED_TRACE(oracle);
        const auto fx = test::read_json(oracle);
        int checked = 0;
        for (const auto& m : fx["models"]) {
            if (!m.contains("bf16_points")) continue;
            const ModelGraph g = traced(m["graph"]);
            const ModelGraph bg = builder_of(m);
            for (const auto& pt : m["bf16_points"]) {
                EstimateRequest req = oracle_request(pt, true);
                req.precision = Precision::BF16;
                auto r = simulate_estimate(g, req);
                auto b = simulate_estimate(bg, req);
                ASSERT_TRUE(r.ok() && b.ok());
                const std::int64_t mean_saves = pt["saved_bytes_1_13_only"].get<std::int64_t>();
                const std::int64_t want = pt["step2"]["peak_bytes"].get<std::int64_t>() - mean_saves;
                const std::string job = job_text(m["graph"], req) + " --optimizer-impl for-loop --allocator none";
                EXPECT_NEAR(ratio(r.value().simulation->steady_peak_allocated, want), 1.0, 0.02) << job;
                EXPECT_NEAR(ratio(b.value().simulation->steady_peak_allocated, want), 1.0, 0.02) << job << " (the built-in builder)";
                ++checked;
            }
        }
        EXPECT_GE(checked, 3);
    }
}
