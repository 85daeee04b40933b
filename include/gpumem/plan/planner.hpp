// gpumem/plan/planner.hpp — the fastest layout that fits.
//
// The planner enumerates every valid combination of tp, pp, cp, dp, ZeRO
// stage, recompute, micro-batch and gradient accumulation, optimizer offload,
// precision and optimizer for a global batch on N GPUs, scores each with a
// reduced analytic model (per-layer parameter and activation constants
// precomputed once from the model graph, so a candidate costs a few dozen
// arithmetic operations), keeps those that fit with a headroom margin, ranks
// them by estimated throughput and confirms the best ones with the full
// estimate (step simulation) and the time model. Candidates are scored on all
// cores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/plan/compute.hpp"

namespace gpumem {

struct PlanRequest {
    EstimateRequest base;             // model, seq, gpu, mode ...; parallel.gpus / nodes = the cluster
    std::int64_t global_batch = 0;    // sequences per optimizer step (default: 8 per GPU... see plan.cpp)
    double headroom = 0.05;           // keep this fraction of the GPU free
    std::int64_t top = 10;
    std::int64_t confirm = 5;         // winners re-checked by the simulator
    // Restrictions (empty = search all).
    std::vector<std::int64_t> tp, pp, cp, ep;
    std::vector<int> zero;
    std::vector<Recompute> recompute;
    std::vector<Precision> precision;
    std::vector<Optimizer> optimizer;
    bool allow_offload = true;
    ComputeOptions compute;
    int threads = 0;                  // 0: all cores
};

struct PlanCandidate {
    EstimateRequest request;          // the full settings
    Bytes total_device;               // reduced model (or confirmed by simulation)
    double step_seconds = 0;
    double tokens_per_second = 0;
    bool confirmed = false;           // re-checked by the step simulation
    bool fits_confirmed = true;
    PerGpu per_gpu;                   // for confirmed candidates
};

struct PlanResult {
    std::int64_t evaluated = 0;
    std::int64_t fitting = 0;
    double seconds = 0;               // search wall time
    std::vector<PlanCandidate> top;   // best first
    std::vector<PlanCandidate> pareto;  // memory / throughput front
    std::string why;                  // why the best one wins
    std::vector<std::string> assumptions;
};

Result<PlanResult> plan(const PlanRequest& req);

}  // namespace gpumem
