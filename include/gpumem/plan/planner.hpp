// gpumem/plan/planner.hpp — the fastest layout that fits.
//
// The planner enumerates layouts for a global batch on N GPUs -- tensor
// parallelism inside a node (GPUs per node from the GPU catalog or
// --gpus-per-node; larger tp only when asked with --only-tp), context
// parallelism, pipeline parallelism with Megatron's even and uneven splits and
// the interleaved schedule, expert parallelism, and the sharding a
// practitioner would pick (none, Megatron's distributed optimizer, ZeRO-2/3,
// FSDP, HSDP, optimizer offload as a last resort) -- with recompute and the
// micro-batch size. The user's precision and optimizer stay fixed unless
// --search-precision / --search-optimizer (or --only-precision /
// --only-optimizer) ask for alternatives: numerics are the user's.
//
// Every candidate is scored with the same analytic estimate and time model
// that `gpumem estimate --analytic` prints (there is no separate reduced
// model to disagree with them); memory is monotone in the micro-batch, so each
// family of candidates is bisected rather than evaluated point by point, and
// a family whose model states alone exceed the GPU is dropped before any
// estimate (memory/parallel.hpp model_states_floor, a floor under every
// estimate of the job). The fastest are confirmed by the step simulation,
// which must agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/plan/compute.hpp"

namespace gpumem {


struct PlanCandidate {
    EstimateRequest request;          // the full settings
    Bytes total_device;               // analytic estimate (or confirmed by simulation)
    double step_seconds = 0;
    double tokens_per_second = 0;
    TimeBreakdown time;               // the step's parts
    bool confirmed = false;           // re-checked by the step simulation
    bool fits_confirmed = true;
    PerGpu per_gpu;                   // analytic, or simulated when confirmed
};

struct PlanResult {
    std::int64_t evaluated = 0;       // candidate configurations decided (exactly, or by monotonicity in the micro-batch)
    std::int64_t estimates = 0;       // analytic estimates run (none for the families the model-states floor rules out)
    std::int64_t fitting = 0;         // configurations that fit
    double seconds = 0;               // search wall time
    std::int64_t gpus_per_node = 0;
    std::vector<PlanCandidate> top;   // best first
    std::vector<PlanCandidate> pareto;  // memory / throughput front
    std::string why;                  // why the best one wins
    std::vector<std::string> assumptions;
};

Result<PlanResult> plan(const PlanRequest& req);

}  // namespace gpumem
