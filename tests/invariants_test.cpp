// Invariant (metamorphic) tests over generated grids of jobs (tests/job_grid.hpp).
//
// The analytic estimate and the step simulation are two views of one model:
// the planner searches with the first, `estimate` reports the second, so on
// every job both answer they must agree. Further invariants any correct
// distributed model satisfies:
//   - per-GPU memory never increases when data parallelism grows under
//     ZeRO-3 / FSDP (each rank holds 1/dp of the states);
//   - memory is flat in gradient accumulation once the pipeline schedule's
//     in-flight micro-batches are reached;
//   - a one-GPU layout equals the single-GPU answer;
//   - the headline is the maximum over pipeline ranks;
//   - the sharded states of all ranks sum to the unsharded total (up to the
//     padding of flat buffers to the shard group).
// A failure prints the job as the gpumem command that reproduces it.
// GPUMEM_GRID_REPORT=1 prints every job's numbers (for investigating).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <functional>
#include <iomanip>
#include <sstream>
#include <optional>
#include <tuple>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"
#include "gpumem/sim/trace.hpp"
#include "test_util.hpp"
#include "job_grid.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

bool report() { return std::getenv("GPUMEM_GRID_REPORT") != nullptr; }

EstimateResult must(const Result<EstimateResult>& r, const EstimateRequest& req) {
    if (!r) throw std::runtime_error(request_to_command(req) + ": " + r.error().message);
    return r.value();
}

EstimateResult analytic(EstimateRequest req) {
    req.analytic = true;
    return must(estimate(grid_model(req.model), req), req);
}

EstimateResult simulated(EstimateRequest req) {
    req.analytic = false;
    return must(simulate_estimate(grid_model(req.model), req), req);
}

double pct(double d) { return std::round(d * 1000.0) / 10.0; }
// pct(d) as text with one decimal (std::to_string prints six).
std::string pct_text(double d) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1) << pct(d);
    return o.str();
}

double rel(Bytes a, Bytes b) { return (static_cast<double>(a.count()) - static_cast<double>(b.count())) / static_cast<double>(std::max<std::int64_t>(1, b.count())); }

// A regression job of a fixed moment: the analytic view no more than 3% under
// the simulator (the direction the planner cannot afford) nor 5% over.
void expect_close(Bytes analytic_peak, Bytes simulated_peak, const EstimateRequest& r, const std::string& what = "") {
    const std::string msg = what + "analytic " + format_bytes(analytic_peak) + " vs simulated " + format_bytes(simulated_peak) + ": " + request_to_command(r);
    EXPECT_GE(rel(analytic_peak, simulated_peak), -0.03) << msg;
    EXPECT_LE(rel(analytic_peak, simulated_peak), 0.05) << msg;
}
void expect_close(const EstimateRequest& r) { expect_close(analytic(r).per_gpu.peak_allocated, simulated(r).per_gpu.peak_allocated, r); }

// Analytic and simulated peak_allocated within 5% on every job of a grid.
void check_jobs(GridKind kind, const std::vector<GridJob>& jobs);

// The device totals, what "fits" compares. The analytic path keeps one
// largest-tensor block cached (memory/estimate.cpp); the simulator's cache is
// the allocator's, its fragmentation included, so the totals agree less
// closely than the peaks (on the default seeds, 57-88% of a grid's jobs
// within 5%; single jobs up to 38% under and 35% over at other seeds). These
// bounds catch a rule gone wrong for a whole class of jobs (an inference
// job's analytic cache once counted training's whole-sequence logits: 2-10x
// the simulated reserved of 8k-token prompts), not the fragmentation the
// analytic path leaves to the simulator: no job's analytic total below half
// the simulated one or above 1.75x (inference 1.15x: its working set is the
// simulator's), and at least `within5` of the jobs within 5%. The shares
// hold at GPUMEM_GRID_SEED 12 and 29 (GPUMEM_GRID_SCALE=2) as at the defaults.
struct DeviceBounds {
    double under, over, within5;
};
DeviceBounds device_bounds(GridKind k) {
    switch (k) {
        case GridKind::Expert: return {0.5, 0.75, 0.75};
        case GridKind::Inference: return {0.5, 0.15, 0.7};
        case GridKind::Sharded: return {0.5, 0.75, 0.45};
        default: return {0.5, 0.75, 0.5};
    }
}

void check_agreement(GridKind kind, int count, std::uint64_t seed) {
    const auto jobs = job_grid(kind, count, seed);
    ASSERT_GE(static_cast<int>(jobs.size()), count * 9 / 10) << "too few valid jobs drawn for " << kind_name(kind);
    check_jobs(kind, jobs);
}

void check_jobs(GridKind kind, const std::vector<GridJob>& jobs) {
    int failures = 0;
    double worst = 0;
    double dev_under = 0, dev_over = 0;
    std::string dev_under_job, dev_over_job;
    std::size_t dev_within = 0;
    for (const auto& j : jobs) {
        const EstimateResult s = simulated(j.req);
        const EstimateResult a = analytic(j.req);
        const double dt = rel(a.per_gpu.total_device, s.per_gpu.total_device);
        const std::string dev = format_bytes(a.per_gpu.total_device) + " vs simulated " + format_bytes(s.per_gpu.total_device) + " (" +
                                pct_text(dt) + "%): " + request_to_command(j.req);
        if (dt < dev_under) dev_under = dt, dev_under_job = dev;
        if (dt > dev_over) dev_over = dt, dev_over_job = dev;
        if (std::fabs(dt) <= 0.05) ++dev_within;
        if (report()) std::cout << kind_name(kind) << " device " << pct(dt) << "% analytic " << dev << "\n";
        // Every rank the simulation ran, against the analytic view of that rank.
        std::vector<std::tuple<std::string, Bytes, Bytes>> pairs;
        if (s.parallel) {
            for (const auto& st : s.parallel->stages)
                if (st.simulated)
                    pairs.emplace_back("stage " + std::to_string(st.stage) + " (" + st.contents + ", analytic " + st.peak_phase + ")",
                                       st.allocated + s.per_gpu.cublas_workspace, st.simulated_peak_allocated);
        } else {
            pairs.emplace_back("analytic " + a.per_gpu.peak_phase + ", simulated " + s.per_gpu.peak_phase, a.per_gpu.peak_allocated,
                               s.per_gpu.peak_allocated);
        }
        for (const auto& [what, an, si] : pairs) {
            const double d = rel(an, si);
            worst = std::max(worst, std::fabs(d));
            if (report())
                std::cout << kind_name(kind) << " " << (std::fabs(d) > 0.05 ? "BAD " : "ok  ") << pct(d) << "% analytic " << format_bytes(an)
                          << " simulated " << format_bytes(si) << " " << what << "  " << request_to_command(j.req) << "\n";
            if (std::fabs(d) > 0.05) {
                ++failures;
                ADD_FAILURE() << what << ": analytic " << format_bytes(an) << " vs simulated " << format_bytes(si) << " (" << pct(d)
                              << "%): " << request_to_command(j.req);
                if (failures > 20 && !report()) return;
            }
        }
    }
    const DeviceBounds b = device_bounds(kind);
    const double within = static_cast<double>(dev_within) / static_cast<double>(std::max<std::size_t>(1, jobs.size()));
    EXPECT_GE(dev_under, -b.under) << "analytic device total under the simulated by more than " << pct(b.under) << "%: " << dev_under_job;
    EXPECT_LE(dev_over, b.over) << "analytic device total over the simulated by more than " << pct(b.over) << "%: " << dev_over_job;
    EXPECT_GE(within, b.within5) << "device totals within 5%: " << pct(within) << "% of " << kind_name(kind) << " jobs";
    std::cout << kind_name(kind) << ": " << jobs.size() << " jobs, worst disagreement " << pct(worst) << "%; device totals " << pct(dev_under) << "% to +"
              << pct(dev_over) << "%, " << pct(within) << "% of jobs within 5%\n";
}

}  // namespace

TEST(GridAgreement, SingleGpu) { check_agreement(GridKind::Single, 400, 1); }
TEST(GridAgreement, DataParallel) { check_agreement(GridKind::DataParallel, 200, 2); }
TEST(GridAgreement, Sharded) { check_agreement(GridKind::Sharded, 400, 3); }
TEST(GridAgreement, TensorParallel) { check_agreement(GridKind::Tensor, 300, 4); }
TEST(GridAgreement, Pipeline) { check_agreement(GridKind::Pipeline, 400, 5); }
TEST(GridAgreement, ContextParallel) { check_agreement(GridKind::Context, 150, 6); }
TEST(GridAgreement, ExpertParallel) { check_agreement(GridKind::Expert, 150, 7); }
TEST(GridAgreement, Inference) { check_agreement(GridKind::Inference, 300, 8); }

// Jobs drawn by the grids with other seeds (103, 101), kept here: the moments
// at the end of backward once missed a tensor the simulator holds there.
//   - fp32 GPT-2 (tied embedding), full recompute, at the first layer's
//     rebuild: the output layer's contribution to the tied embedding's
//     gradient, waiting in autograd's input buffer for the embedding's own
//     (5.1% under the simulator before);
//   - Qwen2-0.5B with the logits kept bound by the loop, at the first layer's
//     rebuild and the embedding's gradient: the held logits (7% under).
// The analytic view must not fall more than 3% under the simulator on them.
TEST(GridAgreement, EndOfBackwardMoments) {
    const std::vector<nlohmann::json> jobs = {
        {{"model", "gpt2"}, {"batch", 3}, {"seq", 2048}, {"precision", "fp32"}, {"optimizer", "adafactor"}, {"optimizer-impl", "fused"},
         {"recompute", "full"}, {"cross-entropy", "fused-linear"}, {"kernels", "te"}, {"gpu-memory", "1024TiB"}},
        {{"model", "qwen2-0.5b"}, {"batch", 3}, {"seq", 512}, {"precision", "amp-bf16"}, {"optimizer", "adam"}, {"recompute", "full"},
         {"activation-offload", true}, {"cross-entropy", "fused"}, {"logits", "kept"}, {"gpus", 2}, {"zero", 1}, {"offload-optimizer", "cpu"},
         {"gpu-memory", "1024TiB"}}};
    for (const auto& body : jobs) {
        expect_close(request_from_json(body).value());
    }
}

// A pipeline's cool-down backward: 1F1B with as many micro-batches as stages
// runs every forward of stage 0 before its first backward, so the forward
// peak holds no gradient; the second backward holds all of them with pp - 1
// micro-batches in flight, and there (full recompute: a layer rebuilt) stage
// 0 peaks. The analytic view counted only the forward peak's gradients and
// was 6.5% under the simulator on stage 0 (found with GPUMEM_GRID_SEED=100).
TEST(GridAgreement, CoolDownBackwardHoldsTheGradients) {
    const EstimateRequest r = request_from_json({{"model", "phi-2"}, {"batch", 3}, {"seq", 8192}, {"grad-accum", 4}, {"precision", "fp32"},
                                                 {"optimizer", "sgd"}, {"recompute", "full"}, {"cross-entropy", "fused"}, {"kernels", "fused"},
                                                 {"gpus", 8}, {"pp", 4}, {"distributed-optimizer", true}, {"gpu-memory", "1024TiB"}})
                                  .value();
    const EstimateResult s = simulated(r);
    ASSERT_TRUE(s.parallel);
    bool seen = false;
    for (const auto& st : s.parallel->stages) {
        if (st.stage != 0) continue;
        ASSERT_TRUE(st.simulated);
        seen = true;
        expect_close(st.allocated + s.per_gpu.cublas_workspace, st.simulated_peak_allocated, r, "stage 0: ");
    }
    EXPECT_TRUE(seen);
}

// A LoRA adapter's input is alive at the adapter's moment (the layer holds it
// until it returns) and, where nothing saves it, adds to the moment: the last
// adapter of a rebuilt layer (down_proj: its input is the [b, s,
// intermediate] product, which a frozen base does not save) peaks over every
// save of the layer. The analytic view left it out and was 4-6% under the
// simulator on these jobs (single GPU, 1F1B, and the interleaved job
// GPUMEM_GRID_SEED=700 found).
TEST(GridAgreement, AdapterInputHeldAtItsMoment) {
    nlohmann::json base = {{"model", "qwen2-0.5b"}, {"mode", "lora"}, {"batch", 3}, {"seq", 2048}, {"precision", "amp-bf16"}, {"recompute", "full"},
                           {"lora-targets", "all-linear"}, {"cross-entropy", "fused-linear"}, {"gpu-memory", "1024TiB"}};
    nlohmann::json pp = base, interleaved = base;
    pp.update({{"gpus", 2}, {"pp", 2}});
    interleaved.update({{"gpus", 2}, {"pp", 2}, {"grad-accum", 8}, {"pp-schedule", "interleaved"}, {"vpp", 2}});
    for (const auto& body : {base, pp, interleaved}) {
        expect_close(request_from_json(body).value());
    }
}

// FSDP SHARD_GRAD_OP keeps every unit gathered from its forward to its own
// backward, after which it reshards: the embedding's backward, the last,
// still holds the embedding unit's parameters. The analytic view's
// end-of-backward moments had let go of all of them and were 5.6% under the
// simulator on this job (opt-125m ties its output layer to the embedding;
// GPUMEM_GRID_SEED=500).
TEST(GridAgreement, GradOpEmbeddingUnitAtTheEndOfBackward) {
    const EstimateRequest r = request_from_json({{"model", "opt-125m"}, {"batch", 2}, {"seq", 64}, {"grad-accum", 4}, {"precision", "fp32"},
                                                 {"optimizer", "lion"}, {"optimizer-impl", "foreach"}, {"recompute", "full"}, {"attention", "eager"},
                                                 {"gpus", 2}, {"fsdp", "grad-op"}, {"fsdp-version", 1}, {"no-sync", true}, {"gpu-memory", "1024TiB"}})
                                  .value();
    expect_close(r);
}

// QLoRA under FSDP: the first layer's backward, the last of the step (the
// embedding's unit prefetched), dequantizes its 4-bit weights like every other
// layer's. The backward-end moment counted the layer's gradient pair without
// the dequantized weight (32 MiB for llama-3.2-1b's MLP projections), 5% under
// the simulator (GPUMEM_GRID_SEED=800).
TEST(GridAgreement, QloraDequantAtTheEndOfBackward) {
    const EstimateRequest r = request_from_json({{"model", "llama-3.2-1b"}, {"mode", "qlora"}, {"seq", 128}, {"grad-accum", 2}, {"precision", "bf16"},
                                                 {"recompute", "none"}, {"framework", "torchtune"}, {"cross-entropy", "fused-linear"}, {"logits", "kept"},
                                                 {"gpus", 16}, {"fsdp", "full"}, {"no-sync", true}, {"gpu-memory", "1024TiB"}})
                                  .value();
    expect_close(r);
}

// The residual stream's gradient during a layer's backward. A residual add
// hands its input a new gradient (b x s x h) that waits in autograd's input
// buffer while the branch behind it runs its backward, beside that branch's
// own gradient pair; the analytic view counted the pairs alone, and counted
// a rebuilt layer's kept (or fetched) input twice, once as the checkpoint and
// once among the saves that read it, which hid one b x s x h of the two. A
// pipeline's middle stages carried a stand-in (the received gradient) and
// agreed; one GPU, tensor parallel alone and the last stage did not
// (Pythia-160M fp32, b 3, s 8192, full recompute: -1.6%, -2.6%, -4.4%; with
// activation offload on tp 2, -3.6%). In the simulator GPT-NeoX's parallel
// residual at dense_4h_to_h's backward holds the block input's gradient, the
// attention branch's and the MLP output's (3 x 3*8192*768*4 bytes at tp 2, not
// sequence parallel) and the new [b, s, 4h/tp] input gradient: 360 MiB of
// activation gradients. Every stage of every layout agrees within 1%.
TEST(GridAgreement, ResidualGradientDuringTheBranchBackward) {
    auto base = [] {
        return request_from_json({{"model", "pythia-160m"}, {"batch", 3}, {"seq", 8192}, {"precision", "fp32"}, {"recompute", "full"},
                                  {"cross-entropy", "fused-linear"}, {"logits", "kept"}, {"gpu-memory", "1024TiB"}})
            .value();
    };
    std::vector<EstimateRequest> jobs;
    for (int offload = 0; offload < 2; ++offload)
        for (const auto& [gpus, tp, pp] : {std::tuple{1, 1, 1}, std::tuple{2, 2, 1}, std::tuple{8, 2, 4}}) {
            EstimateRequest r = base();
            r.activation_offload = offload != 0;
            r.parallel.gpus = gpus;
            r.parallel.tp = tp;
            r.parallel.pp = pp;
            jobs.push_back(r);
        }
    for (const EstimateRequest& r : jobs) {
        const EstimateResult s = simulated(r), a = analytic(r);
        if (!s.parallel) {
            EXPECT_NEAR(rel(a.per_gpu.peak_allocated, s.per_gpu.peak_allocated), 0.0, 0.01) << request_to_command(r);
            continue;
        }
        for (const auto& st : s.parallel->stages) {
            if (!st.simulated) continue;
            EXPECT_NEAR(rel(st.allocated + s.per_gpu.cublas_workspace, st.simulated_peak_allocated), 0.0, 0.01)
                << "stage " << st.stage << ": " << request_to_command(r);
        }
    }
    // The simulator's activation gradients at the tp 2 peak (dense_4h_to_h's backward).
    EstimateRequest r = base();
    r.activation_offload = true;
    r.parallel.gpus = 2;
    r.parallel.tp = 2;
    const std::int64_t bsh = std::int64_t{3} * 8192 * 768 * 4, bs4h_tp = std::int64_t{3} * 8192 * (4 * 768 / 2) * 4;
    Bytes act_grads(-1);
    for (const auto& row : simulated(r).breakdown)
        if (row.key == "activation_gradients") act_grads = row.bytes;
    EXPECT_EQ(act_grads, Bytes(3 * bsh + bs4h_tp)) << request_to_command(r);
}

// A checkpointed layer's forward: it frees its intermediates as it goes
// instead of saving them, but while it runs they are alive over everything in
// flight (op-level selective checkpointing keeps only every other matmul's
// output and the attention output; offloaded activations keep the layer's
// input on the GPU until it returns). Before the output layer has saved
// anything, with two micro-batches in flight on the first of two pipeline
// stages, that is where SmolLM2-135M peaks; the analytic view counted what is
// in flight alone (5.5% under the simulator, of which 3.7% is the
// allocator's rounding of mid-size blocks it cannot place; the rest the
// running layer's up/gate products and residual stream). Compared here
// without the allocator (requested bytes, the simulator's
// AllocatorMode::None): -1.9% before with offloading, +0.4% now; within 1%.
TEST(GridAgreement, CheckpointedLayerForwardHoldsItsIntermediates) {
    for (const bool offload : {true, false}) {
        const EstimateRequest r = request_from_json({{"model", "smollm2-135m"}, {"batch", 3}, {"seq", 1024}, {"grad-accum", 12}, {"precision", "amp-bf16"},
                                                     {"optimizer", "sgd"}, {"recompute", "ops"}, {"activation-offload", offload}, {"cross-entropy", "fused"},
                                                     {"kernels", "te"}, {"gpus", 2}, {"pp", 2}, {"gpu-memory", "1024TiB"}})
                                      .value();
        const ModelGraph g = load_model("smollm2-135m").value();
        const Job job = resolve_job(g, r).value();
        const ParallelResult par = parallel_memory(g, job);
        sim::StepTraceOptions so;
        so.parallel = &par;
        so.stage = 0;
        so.cublas_workspaces = true;
        so.cublas_workspace = job.gpu.cublas_workspace;
        sim::ReplayOptions none;
        none.mode = sim::AllocatorMode::None;
        const Bytes requested = sim::replay(sim::build_step_trace(g, job, so).trace, none).peak_allocated;
        // (the stage's allocated bytes are the analytic view's without the cuBLAS workspaces, as in check_jobs)
        EXPECT_NEAR(rel(par.stages[0].allocated + analytic(r).per_gpu.cublas_workspace, requested), 0.0, 0.01) << "stage 0: " << request_to_command(r);
        EXPECT_EQ(par.stages[0].peak_phase, "forward") << request_to_command(r);
    }
}

// FSDP1 SHARD_GRAD_OP under no_sync frees no unit's gathered parameters in
// its post-backward until gradients sync (torch/distributed/fsdp/
// _runtime_utils.py _should_free_in_backward): from the second micro-batch on
// every unit is unsharded, so at the peak each rank holds all of Qwen2-0.5B's
// 494,032,768 parameters in bf16 beside the unsharded gradients, in both
// views; fully_shard (FSDP2) reshards after every backward.
TEST(GridAgreement, Fsdp1GradOpNoSyncHoldsEveryUnit) {
    auto row = [](const EstimateResult& e, const std::string& key) {
        for (const auto& r : e.breakdown)
            if (r.key == key) return r.bytes;
        return Bytes(-1);
    };
    EstimateRequest r = request_from_json({{"model", "qwen2-0.5b"}, {"seq", 64}, {"grad-accum", 2}, {"precision", "bf16"}, {"optimizer", "sgd-momentum"},
                                           {"recompute", "none"}, {"cross-entropy", "fused"}, {"gpus", 8}, {"fsdp", "grad-op"}, {"fsdp-version", 1},
                                           {"no-sync", true}, {"gpu-memory", "1024TiB"}})
                            .value();
    const Bytes all_params(2 * std::int64_t{494032768});
    const EstimateResult sim1 = simulated(r), ana1 = analytic(r);
    EXPECT_EQ(row(sim1, "gathered_params"), all_params) << request_to_command(r);
    EXPECT_EQ(row(ana1, "gathered_params"), all_params) << request_to_command(r);
    // The peak: the end of the first micro-batch's backward, with every
    // unit still gathered and every unsharded gradient made (under fully_shard
    // only the embedding's unit is gathered then).
    r.parallel.fsdp_version = 2;
    EXPECT_GT(sim1.per_gpu.peak_allocated, simulated(r).per_gpu.peak_allocated) << request_to_command(r);
    EXPECT_GT(ana1.per_gpu.peak_allocated, analytic(r).per_gpu.peak_allocated) << request_to_command(r);
}

// FSDP's root unit (memory/parallel.hpp fsdp_holds_root): PyTorch does not
// reshard the root after its forward, so where the root holds the embeddings
// and the output layer they stay gathered from the forward's start to the end
// of the backward. At the peak (the backward's start) both views then hold
// the root unit beside a layer: Llama-3.2-1B's tied embedding and final norm,
// (128256 x 2048 + 2048) x 2 bytes; Pythia-160M's two untied 50304 x 768
// embeddings and final LayerNorm, (2 x 50304 x 768 + 2 x 768) x 2 bytes, with
// FSDP1 (--fsdp-version 1), torchtune's and LitGPT's wrapping; under
// fully_shard with an untied output layer (the default framework) the
// embedding is a unit of its own, gathered at its use only. (LitGPT copies a
// tied embedding into its own output layer: its root holds both.) The two
// views agree on every job.
TEST(GridAgreement, FsdpRootUnitHeldThroughTheStep) {
    const Bytes llama_root((128256 * std::int64_t{2048} + 2048) * 2), pythia_root((2 * 50304 * std::int64_t{768} + 2 * 768) * 2);
    struct Case {
        const char* model;
        const char* how;
        Bytes root;  // the root unit's parameters
        bool held;   // gathered at the peak (else less than the root is)
    };
    const std::vector<Case> cases = {{"llama-3.2-1b", "", llama_root, true},          {"llama-3.2-1b", "v1", llama_root, true},
                                     {"llama-3.2-1b", "torchtune", llama_root, true}, {"llama-3.2-1b", "litgpt", llama_root * 2, true},
                                     {"pythia-160m", "", pythia_root, false},         {"pythia-160m", "v1", pythia_root, true},
                                     {"pythia-160m", "torchtune", pythia_root, true}, {"pythia-160m", "litgpt", pythia_root, true}};
    auto row = [](const EstimateResult& e, const std::string& key) {
        for (const auto& r : e.breakdown)
            if (r.key == key) return r.bytes;
        return Bytes(-1);
    };
    for (const Case& c : cases) {
        nlohmann::json j = {{"model", c.model}, {"batch", 1}, {"seq", 1024}, {"precision", "bf16"}, {"gpus", 8}, {"fsdp", "full"},
                            {"gpu-memory", "1024TiB"}};
        if (std::string(c.how) == "v1") j["fsdp-version"] = 1;
        else if (*c.how) j["framework"] = c.how;
        const EstimateRequest r = request_from_json(j).value();
        const EstimateResult sim = simulated(r), ana = analytic(r);
        const Bytes gathered = row(sim, "gathered_params");
        if (c.held) {
            EXPECT_GE(gathered, c.root) << request_to_command(r);
        } else {
            EXPECT_LT(gathered, c.root) << request_to_command(r);
        }
        EXPECT_NEAR(static_cast<double>(ana.per_gpu.peak_allocated.count()) / static_cast<double>(sim.per_gpu.peak_allocated.count()), 1.0, 0.02)
            << request_to_command(r);
    }
}

// A layer's forward comes before the output layer has saved anything. With
// ZeRO-3 / FSDP a layer's moment gathers two layers, the output layer's the
// embedding's unit; Llama-3.2-1B's output layer saves 128256-wide chunks of
// logits under the chunked loss. The analytic view counted those saves at the
// layers' moment (with the layers' gather): 7.3% (FSDP) and 9.6% (ZeRO-3)
// above the simulation.
TEST(GridAgreement, LayerForwardBeforeTheOutputLayerSaves) {
    for (const std::string shard : {"fsdp-full", "fsdp-hybrid", "zero3"})
        for (const char* loss : {"chunked", "full"}) {
            nlohmann::json j = {{"model", "llama-3.2-1b"}, {"mode", "lora"}, {"batch", 2}, {"seq", 128}, {"lora-rank", 64}, {"precision", "bf16"},
                                {"recompute", "none"}, {"cross-entropy", loss}, {"gpus", 8}, {"gpu-memory", "1024TiB"}};
            if (shard == "zero3") j["zero"] = 3;
            else j["fsdp"] = shard == "fsdp-full" ? "full" : "hybrid";
            const EstimateRequest r = request_from_json(j).value();
            const double sim = static_cast<double>(simulated(r).per_gpu.peak_allocated.count());
            const double ana = static_cast<double>(analytic(r).per_gpu.peak_allocated.count());
            EXPECT_NEAR(ana / sim, 1.0, 0.02) << request_to_command(r);
        }
}

// FSDP's backward prefetch: a layer's backward gathers the layer before it;
// only the last layer's forward prefetches the output layer. Pythia's untied
// output layer (50304 x 768, 77 MB in bf16, five layers' worth) counted at the
// layers' backward moments put the analytic view 4-7% above the simulation.
TEST(GridAgreement, LayerBackwardPrefetchesTheLayerBefore) {
    for (const char* rc : {"none", "selective", "full"}) {
        const EstimateRequest r = request_from_json({{"model", "pythia-160m"}, {"mode", "lora"}, {"batch", 3}, {"seq", 512}, {"grad-accum", 8},
                                                     {"precision", "bf16"}, {"recompute", rc}, {"attention", "eager"}, {"framework", "litgpt"},
                                                     {"cross-entropy", "fused-linear"}, {"kernels", "te"}, {"gpus", 2}, {"fsdp", "full"},
                                                     {"fsdp-version", 1}, {"gpu-memory", "1024TiB"}})
                                      .value();
        const double sim = static_cast<double>(simulated(r).per_gpu.peak_allocated.count());
        const double ana = static_cast<double>(analytic(r).per_gpu.peak_allocated.count());
        EXPECT_NEAR(ana / sim, 1.0, 0.025) << request_to_command(r);
    }
}

// Megatron's uniform recompute rebuilds N layers at once; ZeRO-3 prefetches
// the embedding's unit (Pythia's 50304 x 768, under the 5e7-element bucket)
// only at the first layer's backward, when one layer's rebuild is left. The
// analytic view put the whole chunk's rebuild with that prefetch: 5.5% above
// the simulation on the job drawn here (with torch.compile's graphs, where
// that moment is the peak). One layer per chunk is checked beside it.
TEST(GridAgreement, UniformChunkRebuildBeforeTheEmbeddingPrefetch) {
    for (const std::int64_t layers : {3, 1}) {
        const EstimateRequest r =
            request_from_json({{"model", "pythia-160m"}, {"mode", "lora"}, {"batch", 2}, {"seq", 1024}, {"grad-accum", 4}, {"lora-rank", 64},
                               {"lora-targets", "all-linear"}, {"precision", "amp-bf16"}, {"recompute", "full"}, {"attention", "eager"},
                               {"recompute-method", "uniform"}, {"recompute-num-layers", layers}, {"cross-entropy", "full"}, {"kernels", "fused"},
                               {"cuda-graphs", "compile"}, {"gpus", 32}, {"gpus-per-node", 8}, {"zero", 3}, {"gpu-memory", "1024TiB"}})
                .value();
        const double sim = static_cast<double>(simulated(r).per_gpu.peak_allocated.count());
        const double ana = static_cast<double>(analytic(r).per_gpu.peak_allocated.count());
        EXPECT_NEAR(ana / sim, 1.0, 0.025) << request_to_command(r);
    }
}

// no_sync over two micro-batches: the second micro-batch, the only one that
// adds to gradients made before, is also the one that syncs, so each unit's
// post-backward reduce-scatters its accumulated gradient and frees it. When
// the tied embedding's gradient is accumulated (the backward's last moment,
// and the peak of a model with a large vocabulary and no optimizer states)
// every other unit holds its slice only. The analytic view counted every
// unsharded gradient there: 10-14% above the simulation on these jobs
// (smollm2-135m: 1.02 GiB against 948.78 MiB). With three micro-batches the
// second accumulates without syncing and both views keep every unsharded
// gradient at that moment. FSDP1 full and hybrid sharding, FSDP2, tied
// (SmolLM2, GPT-2, Qwen2) and untied (Pythia) embeddings.
TEST(GridAgreement, NoSyncTwoMicroBatchesSyncBeforeTheEmbedding) {
    for (const char* model : {"smollm2-135m", "gpt2", "qwen2-0.5b", "pythia-160m"})
        for (const std::string fsdp : {"full", "hybrid", "full2"})
            for (const std::int64_t m : {2, 3}) {
                nlohmann::json j = {{"model", model}, {"batch", 2}, {"seq", 64}, {"grad-accum", m}, {"precision", "fp32"}, {"optimizer", "sgd"},
                                    {"recompute", "none"}, {"framework", "nanogpt"}, {"gpus", 16}, {"no-sync", true}, {"gpu-memory", "1024TiB"}};
                j["fsdp"] = fsdp == "full2" ? "full" : fsdp;
                if (fsdp == "full2") j["fsdp-version"] = 2;
                const EstimateRequest r = request_from_json(j).value();
                const double sim = static_cast<double>(simulated(r).per_gpu.peak_allocated.count());
                const double ana = static_cast<double>(analytic(r).per_gpu.peak_allocated.count());
                EXPECT_NEAR(ana / sim, 1.0, 0.02) << request_to_command(r);
            }
}

// A model whose layers differ (Qwen3-Next: gated-DeltaNet and gated-attention
// layers alternate, so its graph is a run of blocks, not one repeated block):
// training on one GPU with every recompute setting (recompute-every and
// Megatron's methods counted across the runs) and generation on one GPU,
// with the default framework. Still apart by up to 12% and so not drawn here
// (the analytic view mostly above the simulation): tensor, pipeline and
// context parallelism with full recompute, other frameworks' loops with
// LoRA, data-parallel and ZeRO jobs near 5% (a tiny Qwen3-MoE is 4-5% apart
// on the same jobs), and tensor-parallel generation of MoE layers (Qwen3-MoE
// too) - tracked in the issue notes.
TEST(GridAgreement, LayersThatDiffer) {
    const std::string tiny = test::source_path("tests/fixtures/configs/tiny-qwen3-next.json");
    for (const GridKind kind : {GridKind::Single, GridKind::Inference}) {
        Rng rng(21 + static_cast<std::uint64_t>(kind));
        std::vector<GridJob> jobs;
        const auto want = static_cast<std::size_t>(grid_count(150));
        for (int tries = 0; jobs.size() < want && tries < 3000 * grid_count(1); ++tries) {
            GridJob j = draw_job(rng, kind);
            j.req.model = tiny;
            j.req.framework.reset();
            if (kind == GridKind::Inference) j.req.parallel = {};
            if (grid_valid(j.req)) jobs.push_back(std::move(j));
        }
        ASSERT_GE(jobs.size(), 140u) << kind_name(kind);
        check_jobs(kind, jobs);
    }
}

namespace {

// Jobs of a kind with a property forced on (e.g. ZeRO-3 for the dp test).
std::vector<GridJob> grid_with(GridKind kind, int count_in, std::uint64_t seed, const std::function<bool(EstimateRequest&)>& adjust) {
    const int count = grid_count(count_in);
    Rng rng(seed);
    std::vector<GridJob> out;
    int tries = 0;
    while (static_cast<int>(out.size()) < count && tries < count * 100) {
        ++tries;
        GridJob j = draw_job(rng, kind);
        if (!adjust(j.req)) continue;
        if (grid_valid(j.req)) out.push_back(std::move(j));
    }
    return out;
}


}  // namespace

// ZeRO-3 / FSDP: every rank holds 1/dp of the states, so adding data-parallel
// ranks never adds memory per GPU (analytic and simulated).
TEST(GridInvariants, MoreDataParallelNeverCostsMemoryWhenSharded) {
    const auto jobs = grid_with(GridKind::Sharded, 120, 11, [](EstimateRequest& r) {
        if (r.parallel.zero != 3 && r.parallel.fsdp != Fsdp::Full) r.parallel.zero = 3, r.parallel.fsdp = Fsdp::None;
        r.parallel.gpus_per_node = 8;
        return r.parallel.gpus <= 16;
    });
    ASSERT_GE(jobs.size(), 100u);
    for (const auto& j : jobs) {
        EstimateRequest more = j.req;
        more.parallel.gpus *= 2;
        for (bool an : {true, false}) {
            const EstimateResult a = an ? analytic(j.req) : simulated(j.req);
            const EstimateResult b = an ? analytic(more) : simulated(more);
            // The tensors' bytes: the caching allocator hands out a cached block
            // whole when what would remain is at most 1 MiB (should_split,
            // sim/allocator.cpp), so allocated bytes follow the allocator's
            // history, not only the tensors (breakdown row allocator_rounding).
            const auto tensors = [](const EstimateResult& e) { return e.per_gpu.peak_allocated - test::breakdown_row(e, "allocator_rounding", Bytes(0)); };
            EXPECT_LE(tensors(b), tensors(a))
                << (an ? "analytic" : "simulated") << ": " << request_to_command(more) << " needs more than " << request_to_command(j.req);
            EXPECT_LE(b.per_gpu.weights + b.per_gpu.gradients + b.per_gpu.optimizer_states,
                      a.per_gpu.weights + a.per_gpu.gradients + a.per_gpu.optimizer_states)
                << request_to_command(more);
        }
    }
}

// Beyond the micro-batches a pipeline schedule keeps in flight, more
// micro-batches (gradient accumulation) change nothing in memory: the live
// bytes not at all from pp + 1 on (interleaved: from the steady groups; the
// analytic view exactly, the simulation
// without the allocator exactly), torch.cuda.max_memory_allocated() within 1.5%
// (the allocator's blocks depend on its cache's history) and the reserved
// memory within 1% and one segment: a large one (20 MiB), or the largest
// tensor's own segment where that is larger (a [vocab, hidden] fp32
// gradient of fused linear cross-entropy can land in a new segment on a
// later micro-batch, as the caching allocator places it by history).
TEST(GridInvariants, FlatInGradientAccumulation) {
    auto jobs = grid_with(GridKind::Pipeline, 80, 12, [](EstimateRequest&) { return true; });
    const auto single = job_grid(GridKind::Single, 60, 13);
    jobs.insert(jobs.end(), single.begin(), single.end());
    for (const auto& j : jobs) {
        const std::int64_t pp = j.req.parallel.pp;
        const bool inter = j.req.parallel.schedule == PipelineSchedule::Interleaved && pp > 1;
        // 1F1B: from pp + 1; interleaved: from the whole groups of pp
        // micro-batches that cover the warm-up (the chunk mix in flight repeats
        // from there).
        const std::int64_t from = inter ? pipeline_steady_micro_batches(pp, j.req.parallel.vpp, 1 << 20, 0) : pp + 1, step = inter ? pp : 1;
        std::optional<EstimateResult> first_a, first_s, first_none;
        for (std::int64_t m : {from, from + step, from + 3 * step, from + 9 * step}) {
            EstimateRequest r = j.req;
            r.grad_accum = m;
            if (!grid_valid(r)) continue;
            EstimateRequest none = r;
            none.allocator = AllocatorKind::None;
            const EstimateResult a = analytic(r), s = simulated(r), n = simulated(none);
            if (!first_a) {
                first_a = a;
                first_s = s;
                first_none = n;
                continue;
            }
            const std::string cmd = "grad-accum " + std::to_string(m) + " vs " + std::to_string(from) + ": " + request_to_command(r);
            EXPECT_EQ(a.per_gpu.peak_allocated, first_a->per_gpu.peak_allocated) << "analytic, " << cmd;
            EXPECT_EQ(n.per_gpu.peak_allocated, first_none->per_gpu.peak_allocated) << "simulated live bytes, " << cmd;
            const double alloc = static_cast<double>(s.per_gpu.peak_allocated.count()), alloc0 = static_cast<double>(first_s->per_gpu.peak_allocated.count());
            EXPECT_NEAR(alloc, alloc0, 0.015 * alloc0) << "simulated allocated, " << cmd;
            const double res = static_cast<double>(s.per_gpu.peak_reserved.count()), res0 = static_cast<double>(first_s->per_gpu.peak_reserved.count());
            double segment = 20.0 * 1024 * 1024;
            if (s.simulation && !s.simulation->top_at_peak.empty())
                segment = std::max(segment, static_cast<double>(s.simulation->top_at_peak.front().size.count()));
            EXPECT_NEAR(res, res0, 0.01 * res0 + segment) << "simulated reserved, " << cmd;
        }
    }
}

// The simulation stops at the schedule's steady state (and at 64
// micro-batches): simulating every micro-batch gives the same live bytes on
// every rank, and allocator peaks within 1.5% and a segment.
TEST(GridInvariants, SteadyStateCapIsExact) {
    auto jobs = grid_with(GridKind::Pipeline, 24, 18, [](EstimateRequest& r) {
        r.grad_accum = r.parallel.schedule == PipelineSchedule::Interleaved ? r.parallel.pp * (64 / r.parallel.pp + 2) : 70;
        return true;
    });
    ASSERT_GE(jobs.size(), 20u);
    for (const auto& j : jobs) {
        const ModelGraph& g = grid_model(j.req.model);
        const Job job = resolve_job(g, j.req).value();
        const ParallelResult par = parallel_memory(g, job);
        for (const auto& st : par.stages) {
            sim::StepTraceOptions capped;
            capped.parallel = &par;
            capped.stage = st.stage;
            capped.cublas_workspace = job.gpu.cublas_workspace;
            sim::StepTraceOptions full = capped;
            full.all_micro_batches = true;
            const sim::Trace ta = sim::build_step_trace(g, job, capped).trace, tb = sim::build_step_trace(g, job, full).trace;
            ASSERT_LT(ta.events.size(), tb.events.size());
            sim::ReplayOptions none;
            none.mode = sim::AllocatorMode::None;
            EXPECT_EQ(sim::replay(ta, none).peak_allocated, sim::replay(tb, none).peak_allocated)
                << "stage " << st.stage << ": " << request_to_command(j.req);
            const sim::ReplayResult a = sim::replay(ta, {}), b = sim::replay(tb, {});
            EXPECT_NEAR(static_cast<double>(a.peak_allocated.count()), static_cast<double>(b.peak_allocated.count()),
                        0.015 * static_cast<double>(b.peak_allocated.count()))
                << "stage " << st.stage << ": " << request_to_command(j.req);
            EXPECT_NEAR(static_cast<double>(a.peak_reserved.count()), static_cast<double>(b.peak_reserved.count()),
                        0.01 * static_cast<double>(b.peak_reserved.count()) + 20.0 * 1024 * 1024)
                << "stage " << st.stage << ": " << request_to_command(j.req);
        }
    }
}

// A layout spelled out for one GPU is the single-GPU answer; sharding over
// one rank leaves the model states as they are.
TEST(GridInvariants, OneGpuLayoutIsTheSingleGpuAnswer) {
    const auto jobs = job_grid(GridKind::Single, 150, 14);
    for (const auto& j : jobs) {
        EstimateRequest spelled = j.req;
        spelled.parallel.gpus = 1;
        spelled.parallel.nodes = 1;
        spelled.parallel.gpus_per_node = 1;
        spelled.parallel.tp = spelled.parallel.pp = spelled.parallel.cp = spelled.parallel.ep = 1;
        for (bool an : {true, false}) {
            const EstimateResult a = an ? analytic(j.req) : simulated(j.req);
            const EstimateResult b = an ? analytic(spelled) : simulated(spelled);
            EXPECT_EQ(b.per_gpu.total_device, a.per_gpu.total_device) << request_to_command(spelled);
            EXPECT_EQ(b.per_gpu.peak_allocated, a.per_gpu.peak_allocated) << request_to_command(spelled);
        }
        if (j.req.mode != Mode::Train) continue;
        const EstimateResult single = analytic(j.req);
        for (int variant = 0; variant < 4; ++variant) {
            if (j.req.optimizer_in_backward && variant < 3) continue;  // ZeRO rejects the optimizer in backward
            EstimateRequest sharded = j.req;
            if (variant < 3) sharded.parallel.zero = variant + 1;
            else sharded.parallel.fsdp = Fsdp::Full;
            const EstimateResult s = analytic(sharded);
            EXPECT_EQ(s.per_gpu.weights, single.per_gpu.weights) << request_to_command(sharded);
            EXPECT_EQ(s.per_gpu.gradients, single.per_gpu.gradients) << request_to_command(sharded);
            EXPECT_EQ(s.per_gpu.optimizer_states, single.per_gpu.optimizer_states) << request_to_command(sharded);
        }
    }
}

// The headline is the most loaded rank: no pipeline stage needs more, in the
// analytic table or in the simulation.
TEST(GridInvariants, HeadlineIsTheMaximumOverRanks) {
    const auto jobs = job_grid(GridKind::Pipeline, 150, 15);
    for (const auto& j : jobs) {
        const EstimateResult a = analytic(j.req);
        ASSERT_TRUE(a.parallel.has_value());
        Bytes max_a;
        for (const auto& st : a.parallel->stages) max_a = max(max_a, st.allocated + a.per_gpu.cublas_workspace);
        EXPECT_EQ(a.per_gpu.peak_allocated, max_a) << request_to_command(j.req);
        const EstimateResult s = simulated(j.req);
        for (const auto& st : s.parallel->stages) {
            if (!st.simulated) {
                // Not simulated: its analytic peak is well below the largest.
                EXPECT_LT(static_cast<double>(st.allocated.count()), 0.85 * static_cast<double>(max_a.count())) << request_to_command(j.req);
                continue;
            }
            EXPECT_LE(st.simulated_peak_reserved, s.per_gpu.peak_reserved) << "stage " << st.stage << ": " << request_to_command(j.req);
        }
    }
}

// Sharded states summed over the shard group are the unsharded states, up to
// the padding of each tensor to a multiple of the group; pipeline stages hold
// every parameter once (plus the last stage's copy of a tied embedding).
TEST(GridInvariants, ShardsSumToTheWhole) {
    const auto jobs = grid_with(GridKind::Sharded, 150, 16, [](EstimateRequest& r) {
        r.parallel.offload_optimizer = r.parallel.offload_params = Offload::None;
        return r.mode == Mode::Train && r.parallel.fsdp != Fsdp::Hybrid;
    });
    ASSERT_GE(jobs.size(), 100u);
    for (const auto& j : jobs) {
        // The same job on one data-parallel rank: nothing to shard over.
        EstimateRequest whole = j.req;
        whole.parallel.gpus = 1;
        whole.parallel.gpus_per_node = 0;
        const EstimateResult w = analytic(whole), s = analytic(j.req);
        const std::int64_t n = j.req.parallel.gpus;
        const auto& g = grid_model(j.req.model);
        std::int64_t tensors = 0;
        for (const auto& b : g.blocks)
            for (const auto& p : b.params) tensors += p.count * b.repeat;
        // At most n-1 padding elements per tensor, 8 bytes each at most (fp32 Adam: 2 x 4).
        const Bytes slack = Bytes(tensors * (n - 1) * 8);
        auto check = [&](Bytes part, Bytes all, bool sharded, const char* what) {
            if (!sharded) {
                EXPECT_EQ(part, all) << what << ": " << request_to_command(j.req);
                return;
            }
            EXPECT_GE(part * n, all) << what << ": " << request_to_command(j.req);
            EXPECT_LE(part * n, all + slack) << what << ": " << request_to_command(j.req);
        };
        const auto& c = j.req.parallel;
        check(s.per_gpu.weights, w.per_gpu.weights, c.zero == 3 || c.fsdp != Fsdp::None, "weights");
        check(s.per_gpu.gradients, w.per_gpu.gradients, c.zero >= 2 || c.fsdp != Fsdp::None, "gradients");
        // Flat partitions change Adafactor's factored and 8-bit AdamW's blockwise
        // layouts (a shard is 1-D; small shards keep fp32 states): sums hold
        // for the element-wise optimizers.
        // Paged optimizers: a shard under 1e5 elements leaves managed memory,
        // so the sum holds for allocator + paged states together.
        if (j.req.optimizer != Optimizer::Adafactor && j.req.optimizer != Optimizer::AdamW8bit && j.req.optimizer != Optimizer::PagedAdamW8bit)
            check(s.per_gpu.optimizer_states + s.per_gpu.paged_optimizer_states, w.per_gpu.optimizer_states + w.per_gpu.paged_optimizer_states, true,
                  "optimizer states");
    }
    // Pipeline stages: every parameter once, tied embeddings twice.
    for (const auto& j : job_grid(GridKind::Pipeline, 100, 17)) {
        if (j.req.mode != Mode::Train || j.req.parallel.tp > 1) continue;
        const EstimateResult s = analytic(j.req);
        const auto& g = grid_model(j.req.model);
        std::int64_t sum = 0;
        for (const auto& st : s.parallel->stages) sum += st.params;
        std::int64_t tied = 0;
        for (const Op& op : g.blocks.back().ops)
            if (op.kind == OpKind::Linear && op.params.empty() && op.in_features > 0) tied = op.in_features * op.out_features;
        EXPECT_EQ(sum, g.total_params() + tied) << request_to_command(j.req);
    }
}

// The planner drops a layout whose model states alone exceed the GPU without
// estimating it (memory/parallel.hpp model_states_floor): the floor must lie
// under every estimate's peak, or a layout that fits would be dropped. It is
// not trivial either: the most loaded rank's weights are part of it.
TEST(GridInvariants, ModelStatesFloorIsUnderEveryEstimate) {
    int checked = 0;
    for (GridKind kind : {GridKind::Single, GridKind::DataParallel, GridKind::Sharded, GridKind::Tensor, GridKind::Pipeline, GridKind::Context,
                          GridKind::Expert})
        for (const auto& j : job_grid(kind, 150, 40 + static_cast<std::uint64_t>(kind))) {
            if (j.req.mode == Mode::Infer) continue;
            const EstimateResult a = analytic(j.req);
            ASSERT_TRUE(a.job) << request_to_command(j.req);
            const Bytes floor = model_states_floor(grid_model(j.req.model), *a.job);
            EXPECT_LE(floor, a.per_gpu.peak_allocated) << request_to_command(j.req);
            EXPECT_LE(floor, a.per_gpu.total_device) << request_to_command(j.req);
            EXPECT_GE(floor, a.per_gpu.weights) << request_to_command(j.req);
            if (a.parallel) {
                for (const auto& st : a.parallel->stages) {
                    EXPECT_GE(floor, st.weights + st.optimizer_states) << "stage " << st.stage << ": " << request_to_command(j.req);
                }
            }
            ++checked;
        }
    EXPECT_GE(checked, 700);
}

// Every row of a breakdown is a part of the memory: none is negative, in
// either view, on any grid (the rows also sum to the total: tested where
// each view is built).
TEST(GridInvariants, NoNegativeRow) {
    for (const GridKind kind : {GridKind::Single, GridKind::DataParallel, GridKind::Sharded, GridKind::Tensor, GridKind::Pipeline, GridKind::Context,
                                GridKind::Expert, GridKind::Inference}) {
        for (const auto& j : job_grid(kind, 60, 60 + static_cast<std::uint64_t>(kind))) {
            for (const EstimateResult& e : {analytic(j.req), simulated(j.req)})
                for (const auto& row : e.breakdown)
                    EXPECT_GE(row.bytes.count(), 0) << row.key << " " << format_bytes(row.bytes) << ": " << request_to_command(j.req);
        }
    }
    // Found with GPUMEM_GRID_SEED=3000: a QLoRA peak at the end of backward,
    // where no activation is alive, listed the adapters' activations (5.50
    // MiB) anyway and took them back in a negative "unattributed" row.
    const EstimateRequest r = request_from_json({{"model", "mixtral-8x7b"}, {"mode", "qlora"}, {"seq", 128}, {"lora-rank", 64},
                                                 {"lora-targets", "all-linear"}, {"precision", "amp-bf16"}, {"optimizer", "paged-adamw8bit"},
                                                 {"recompute", "selective"}, {"attention", "eager"}, {"gpu-memory", "1024TiB"}})
                                  .value();
    for (const auto& row : analytic(r).breakdown) EXPECT_GE(row.bytes.count(), 0) << row.key << ": " << request_to_command(r);
}

// Megatron's fp32 main-gradient buffer (always present) under FSDP with
// no_sync: the moment at the end of backward counts the buffer, 1/8 of it on
// each of 8 ranks (4 bytes x Qwen2-0.5B's 494,032,768 parameters,
// tests/fixtures/groundtruth/param_counts.json, / 8); the gradients row said
// the unsharded gradients instead and the temporaries row went negative
// (-349.86 MiB; found with GPUMEM_GRID_SEED=100).
TEST(GridInvariants, MainGradientBufferUnderNoSyncIsTheRowCounted) {
    const EstimateRequest r = request_from_json({{"model", "qwen2-0.5b"}, {"batch", 2}, {"seq", 256}, {"grad-accum", 2}, {"precision", "fp16"},
                                                 {"optimizer", "sgd-momentum"}, {"recompute", "none"}, {"framework", "megatron"}, {"gpus", 8},
                                                 {"fsdp", "hybrid"}, {"no-sync", true}, {"gpu-memory", "1024TiB"}})
                                  .value();
    const std::int64_t params = test::read_json("tests/fixtures/groundtruth/param_counts.json")["qwen2-0.5b"]["params"];
    const EstimateResult a = analytic(r);
    ASSERT_NE(a.per_gpu.peak_phase.find("backward"), std::string::npos);
    for (const auto& row : a.breakdown) {
        EXPECT_GE(row.bytes.count(), 0) << row.key;
        if (row.key == "gradients") {
            EXPECT_EQ(row.bytes.count(), 4 * params / 8);
        }
    }
    // The simulator: no_sync's last reduce-scatter lands in that buffer too
    // (it allocated a second fp32 slice of every layer's gradients, and the
    // analytic view was 7.5% under it), so the gradients alive at its peak
    // are the buffer's shard alone, as without no_sync.
    const EstimateResult s = simulated(r);
    for (const auto& row : s.breakdown) {
        if (row.key == "gradients") {
            EXPECT_EQ(row.bytes.count(), 4 * params / 8) << "simulated";
        }
    }
    expect_close(a.per_gpu.peak_allocated, s.per_gpu.peak_allocated, r);
}
