// The analytic estimate's allocator cache (memory/estimate.cpp): one block of
// the largest tensor the step frees stays cached, rounded to the 2 MiB
// segment granularity. Which tensor that is depends on the job: a layer's
// largest for inference (the prompt's prefill runs the output layer on its
// last position only), a unit's gathered parameters under ZeRO-3 / FSDP.
// Expected sizes are computed here from the models' config.json shapes; the
// device totals are checked against the step simulation of the same job.
#include <gtest/gtest.h>

#include <cmath>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// Llama-3.2-1B (config.json): hidden 2048, intermediate 8192, vocab 128256, tied embedding.
constexpr std::int64_t kHidden = 2048, kIntermediate = 8192, kVocab = 128256;

EstimateResult run(const EstimateRequest& r, bool simulate) {
    const ModelGraph g = load_model(r.model).value();
    auto e = simulate ? simulate_estimate(g, r) : estimate(g, r);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
    return std::move(e).value();
}

double rel(Bytes a, Bytes b) { return (static_cast<double>(a.count()) - static_cast<double>(b.count())) / static_cast<double>(b.count()); }

Bytes round_2mib(std::int64_t bytes) { return Bytes((bytes + MiB(2).count() - 1) / MiB(2).count() * MiB(2).count()); }

}  // namespace

// An 8,192-token prompt, batch 2, fp16: the largest tensor of a layer is an
// MLP projection's output, 2 x 8192 x 8192 x 2 bytes = 256 MiB; the output
// layer's logits are one position's, 2 x 128256 x 4 bytes (fp32) = 1 MiB. The
// whole prompt's fp32 logits (2 x 8192 x 128256 x 4 = 7.8 GiB, what training
// computes) are never made: counting them put the analytic device total at
// 2.7x the simulated one.
TEST(AnalyticCache, InferenceKeepsALayersLargestTensorNotThePromptsLogits) {
    const EstimateRequest r = request_from_json({{"model", "llama-3.2-1b"}, {"mode", "infer"}, {"batch", 2}, {"seq", 8192}, {"gen-len", 1},
                                                 {"precision", "fp16"}, {"gpu-memory", "1024TiB"}})
                                  .value();
    const EstimateResult a = run(r, false);
    const Bytes mlp_out(r.batch * r.seq.value() * kIntermediate * 2);  // fp16
    EXPECT_EQ(test::breakdown_row(a, "allocator_overhead"), round_2mib(mlp_out.count()));
    const EstimateResult s = run(r, true);
    EXPECT_LE(std::fabs(rel(a.per_gpu.total_device, s.per_gpu.total_device)), 0.05)
        << format_bytes(a.per_gpu.total_device) << " analytic vs " << format_bytes(s.per_gpu.total_device) << " simulated";
}

// FSDP (hybrid, 8 GPUs), LoRA on a 128-token sequence. The root unit holds
// the tied embedding, 128256 x 2048 bf16 = 501 MiB, gathered at the forward's
// start and held to the end of the backward (memory/parallel.hpp
// fsdp_holds_root): counted in the peak, not cached. Each layer is gathered
// and freed at its use: its parameters in bf16 with the q_proj and
// v_proj adapters (rank 64: 64 x 2048 + 2048 x 64 and 64 x 2048 + 512 x 64),
// 117 MiB, a block cached beside the largest activation's, the chunked
// loss's fp32 logits, 2 x 128 x 128256 x 4 bytes = 125 MiB. The device total
// agrees with the simulated one (the simulator's cache: 191 MiB).
TEST(AnalyticCache, ShardedParametersKeepTheLargestGatheredUnitCached) {
    const EstimateRequest r = request_from_json({{"model", "llama-3.2-1b"}, {"mode", "lora"}, {"batch", 2}, {"seq", 128}, {"lora-rank", 64},
                                                 {"precision", "bf16"}, {"recompute", "none"}, {"cross-entropy", "chunked"}, {"gpus", 8},
                                                 {"fsdp", "hybrid"}, {"gpu-memory", "1024TiB"}})
                                  .value();
    const EstimateResult a = run(r, false);
    constexpr std::int64_t kKv = 512;  // 8 key/value heads of 64
    const std::int64_t layer = 2 * kHidden * kHidden + 2 * kHidden * kKv + 3 * kHidden * kIntermediate + 2 * kHidden;
    const std::int64_t adapters = (64 * kHidden + kHidden * 64) + (64 * kHidden + kKv * 64);
    const std::int64_t logits_fp32 = r.batch * r.seq.value() * kVocab * 4;
    // The layer's count checked against the published total (Llama-3.2-1B:
    // 1,235,814,400 parameters, tests/fixtures/groundtruth/param_counts.json):
    // 16 layers, the tied embedding and the final norm.
    EXPECT_EQ(16 * layer + kVocab * kHidden + kHidden, 1235814400);
    EXPECT_EQ(test::breakdown_row(a, "allocator_overhead"), round_2mib((layer + adapters) * 2 + logits_fp32));
    const EstimateResult s = run(r, true);
    EXPECT_LE(std::fabs(rel(a.per_gpu.total_device, s.per_gpu.total_device)), 0.05)
        << format_bytes(a.per_gpu.total_device) << " analytic vs " << format_bytes(s.per_gpu.total_device) << " simulated";
    EXPECT_LE(std::fabs(rel(a.per_gpu.peak_allocated, s.per_gpu.peak_allocated)), 0.02)
        << format_bytes(a.per_gpu.peak_allocated) << " analytic vs " << format_bytes(s.per_gpu.peak_allocated) << " simulated";
}
