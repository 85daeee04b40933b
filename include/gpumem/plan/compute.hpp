// gpumem/plan/compute.hpp — compute, time and cost of a job.
//
// Training FLOPs per step follow Kaplan et al. 2020 / Narayanan et al. 2021:
// 6·N·D (forward 2ND + backward 4ND) for N parameters (active parameters for
// MoE) and D tokens, 8·N·D with full recompute (one more forward), the
// selective-recompute share of the attention core, and the attention term
// 12·L·h·s per token (fwd+bwd) that dominates long sequences; LoRA skips the
// frozen base's weight gradients (4ND -> 2ND for the base).
//
// Step time is built from separate, visible parts, never from one end-to-end
// utilisation with overheads added on top of it:
//   compute    each pipeline rank's FLOPs per micro-batch at the GEMM
//              efficiency (and, for fused attention, the attention-kernel
//              efficiency; causal kernels skip the masked half) of the GPU
//              and dtype -- compute-only efficiencies calibrated on published
//              runs (docs/compute.md: fit and residuals);
//   exposed communication  tensor-, context-, expert- and pipeline-parallel
//              transfers on each micro-batch's critical path, data-parallel
//              gradient reduction / parameter gathers, each hidden behind the
//              compute it overlaps with where the framework overlaps it;
//   bubble     the pipeline fill and drain of the 1F1B / interleaved schedule
//              from every rank's own time (uneven splits included);
//   optimizer  the step over the rank's shard, memory-bound.
// Inference: prefill is compute-bound at the same efficiencies, decode is
// bandwidth-bound (weights + KV cache read per generated token).
// Formulas, defaults and sources: docs/compute.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/graph.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {


// Where one optimizer step's time goes on the slowest pipeline rank; the
// parts sum to step_seconds (training, no --mfu / --achieved-tflops).
struct TimeBreakdown {
    double compute = 0;          // FLOPs at the compute-only efficiencies
    double tp = 0, cp = 0, ep = 0, pp = 0;  // exposed communication inside the micro-batches
    double bubble = 0;           // pipeline fill and drain
    double dp = 0;               // exposed data-parallel reduction / gathers
    double optimizer = 0;        // the step over the rank's shard (memory-bound)
    double offload = 0;          // optimizer offload: PCIe transfers and the CPU step
};

struct ComputeResult {
    double flops_per_step = 0;       // whole job (all GPUs), one optimizer step, as executed (recompute included)
    double flops_per_token = 0;
    double model_flops_per_step = 0; // 6ND (without recompute): what MFU is defined on
    double peak_tflops = 0;          // per GPU for the precision (16-bit peak for --fp8 runs)
    double mfu = 0;                  // model FLOPs utilisation: predicted, or as given
    std::string mfu_source;          // "predicted", "--mfu", "--achieved-tflops"
    double gemm_efficiency = 0;      // compute-only efficiencies used (fraction of the peak)
    double attention_efficiency = 0;
    std::string efficiency_source;
    double compute_seconds = 0;      // per step on the slowest rank (inference: the whole generate())
    double comm_seconds = 0;         // per step, exposed (not hidden behind compute)
    double comm_total_seconds = 0;   // all communication per step before overlap
    double bubble_seconds = 0;       // pipeline bubble per step
    TimeBreakdown breakdown;
    double step_seconds = 0;
    double tokens_per_step = 0;
    double tokens_per_second = 0;
    std::optional<double> total_seconds;   // for --tokens
    std::optional<double> gpu_hours;
    std::optional<double> cost;
    // Inference.
    double prefill_seconds = 0;
    double decode_tokens_per_second = 0;   // per sequence
    double decode_seconds_per_token = 0;
    double decode_tokens_per_second_total = 0;  // all sequences of all replicas
    double generation_seconds = 0;              // prefill + gen_len decode steps
    bool decode_memory_bound = true;            // bandwidth (true) or compute bound
    double active_params = 0;                   // N of model_flops (routed experts x K/E)
    std::vector<std::string> assumptions;
};

Result<ComputeResult> compute_time(const ModelGraph& g, const Job& job, const EstimateResult& memory, const ComputeOptions& opt);

// The estimate every front end runs: memory (simulated peaks) and time.
struct FullEstimate {
    EstimateResult memory;
    ComputeResult time;
};
// `sopt`: the simulation's settings (a front end that prints no timeline
// leaves it out: SimulateOptions::timeline).
Result<FullEstimate> estimate_with_time(const EstimateRequest& req, const ComputeOptions& opt, const SimulateOptions& sopt = {});

// Compute-only efficiencies of a GPU: the fraction of its dense peak that
// large GEMMs reach in training (16-bit, or FP8 for --fp8 linears) and that
// fused attention kernels reach on the FLOPs they execute. Calibrated on the
// published runs of tests/fixtures/groundtruth/throughput_published.json
// (fit and residuals: docs/compute.md); assumptions for GPUs without runs.
struct ComputeEfficiency {
    double gemm = 0;
    double gemm_fp8 = 0;      // 0: no FP8 tensor cores
    double attention = 0;
    const char* source = "";
};
ComputeEfficiency default_efficiency(const GpuSpec& gpu, DType compute);

// Default link bandwidths per GPU and direction, GB/s: the intra-node link
// (NVLink, Infinity Fabric or PCIe) and the usual scale-out NIC per GPU.
double default_intra_node_gbs(const GpuSpec& gpu);
double default_inter_node_gbs(const GpuSpec& gpu);

}  // namespace gpumem
