// gpumem/plan/compute.hpp — compute, time and cost of a job.
//
// Training FLOPs per step follow Kaplan et al. 2020 / Narayanan et al. 2021:
// 6·N·D (forward 2ND + backward 4ND) for N parameters (active parameters for
// MoE) and D tokens, 8·N·D with full recompute (one more forward), the
// selective-recompute share of the attention core, and the attention term
// 12·L·h·s per token (fwd+bwd, causal halving documented) that dominates long
// sequences; LoRA skips the frozen base's weight gradients (4ND -> 2ND for the
// base). Time = FLOPs / (GPUs · peak(dtype) · MFU) plus the communication that
// does not overlap, from the layout's volumes and link bandwidths. Inference:
// prefill is compute-bound (2·N per token), decode is bandwidth-bound (weights
// + KV cache read per generated token). Formulas, defaults and sources: docs/compute.md.
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

namespace gpumem {

struct ComputeOptions {
    std::optional<double> mfu;               // model FLOPs utilisation, 0 < mfu <= 1
    std::optional<double> achieved_tflops;   // per GPU, overrides peak x MFU
    std::optional<double> tokens;            // token budget for time / GPU-hours (training)
    std::optional<double> price_per_gpu_hour;  // flag name in errors: --price-per-gpu-hour
    std::optional<double> nvlink_gbs;        // intra-node link, GB/s per GPU (default by GPU)
    std::optional<double> ib_gbs;            // inter-node link, GB/s per GPU (default 50 = 400 Gb/s)
    // Added: fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True or
    // torch.set_float32_matmul_precision("high")); PyTorch's default since 1.12 is False.
    bool tf32 = false;
    // Added: tokens per sample for --params jobs (no graph, so the job's own seq is 1);
    // the CLI passes --seq here. Default 2048.
    std::optional<std::int64_t> seq;
};

struct ComputeResult {
    double flops_per_step = 0;       // whole job (all GPUs), one optimizer step
    double flops_per_token = 0;
    double model_flops_per_step = 0; // 6ND (without recompute): what MFU is defined on
    double peak_tflops = 0;          // per GPU for the precision
    double mfu = 0;                  // used
    std::string mfu_source;          // "default for H100 bf16", "--mfu", "--achieved-tflops"
    double compute_seconds = 0;      // per step (inference: the whole generate(), = generation_seconds)
    double comm_seconds = 0;         // per step, not overlapped
    double comm_total_seconds = 0;   // added: all communication per step before overlap
    double bubble_seconds = 0;       // added: pipeline bubble per step ((pp-1)/(m*vpp) of compute)
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
    double decode_tokens_per_second_total = 0;  // added: all sequences of all replicas
    double generation_seconds = 0;              // added: prefill + gen_len decode steps
    bool decode_memory_bound = true;            // added: bandwidth (true) or compute bound
    double active_params = 0;                   // added: N of model_flops (routed experts x K/E)
    std::vector<std::string> assumptions;
};

Result<ComputeResult> compute_time(const ModelGraph& g, const Job& job, const EstimateResult& memory, const ComputeOptions& opt);

// The estimate every front end runs: memory (simulated peaks) and time.
struct FullEstimate {
    EstimateResult memory;
    ComputeResult time;
};
Result<FullEstimate> estimate_with_time(const EstimateRequest& req, const ComputeOptions& opt);

// Default MFU for a GPU and compute dtype (documented in docs/compute.md).
// DType::F32 means CUDA-core fp32; tensor-core TF32 uses the 16-bit value.
double default_mfu(const GpuSpec& gpu, DType compute, bool training);

// Default intra-node link bandwidth per GPU and direction, GB/s (NVLink, Infinity Fabric or PCIe).
double default_intra_node_gbs(const GpuSpec& gpu);

}  // namespace gpumem
