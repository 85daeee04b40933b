// gpumem/memory/features.hpp — optimizer and loading options that both views
// of a job (the analytic estimate and the step simulation) share:
//
//   paged optimizers       bitsandbytes PagedAdamW / PagedAdamW8bit keep the
//                          states of large tensors in CUDA managed memory,
//                          outside PyTorch's caching allocator: a row of their
//                          own in the device total (nvidia-smi), not in
//                          max_memory_allocated / max_memory_reserved;
//   optimizer in backward  torchtune's optimizer_in_bwd: each parameter is
//                          stepped and its gradient freed in its
//                          post-accumulate-grad hook, so at most one tensor's
//                          gradient and update temporaries are in flight;
//   FSDP1 + LoRA           a wrapped layer's FlatParameter mixes frozen and
//                          trainable weights: it requires grad as a whole and
//                          its gradient covers the frozen weights too;
//   load phase             from_pretrained's peak while the weights arrive,
//                          a separate peak the headline takes the maximum of.
//
// The sources (framework files and lines at a named commit) are cited where
// each rule is implemented (features.cpp, job.cpp, parallel.cpp, sim/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/request.hpp"

namespace gpumem {

struct EstimateResult;

// Checks the options of this file against each other and the layout (called
// by resolve_job with the quantization resolved); each error names its field.
void validate_features(const EstimateRequest& req, bool train, std::vector<std::string>& warnings);

// Optimizer in backward is in effect (Megatron's fp32 main-gradient buffer,
// which the flag is rejected with, never frees its gradients).
bool in_backward_optimizer(const Job& job);

// Temporaries of one tensor's update (`state` is the tensor its optimizer
// states cover): the per-tensor share of the full step's rule in
// parallel.cpp — foreach _foreach_sqrt (one state-sized tensor), the for-loop
// path's two, Adafactor's two fp32 ones, fused and bitsandbytes kernels none;
// plus the fp32 copy of an fp16 gradient when fp32 master weights are kept.
Bytes step_temporaries(const Job& job, const TrainTensor& state);

// One parameter stepped inside backward: its gradient `grad` (with autocast's
// 16-bit gradient cast to fp32 first when `amp_cast`) and then the update's
// temporaries beside it.
Bytes in_backward_step(const Job& job, const TrainTensor& state, Bytes grad, bool amp_cast);

// FSDP1 with LoRA: frozen weights of layers holding adapters get gradients.
bool fsdp1_flat_grads(const Job& job);

// The load phase of one rank: the weights as they arrive and the largest
// tensor in flight (an unquantized weight before bitsandbytes quantizes it,
// the cast of an fp32-loaded weight, an unsharded layer under FSDP / ZeRO-3).
struct LoadPhase {
    Bytes allocated;   // peak allocated bytes while loading
    Bytes weights;     // the weights at that moment (load dtype)
    Bytes in_flight;   // the tensor in flight on top of them
    std::string detail;
};
// Rank `rank`'s load phase from its stages and tensors (ParallelResult's
// instance_stage and stage_tensors[rank]).
LoadPhase load_phase(const ModelGraph& g, const Job& job, std::int64_t rank, const std::vector<std::vector<std::int32_t>>& stages,
                     const std::vector<RankTensor>& tensors);

// Adds what lies outside the step's allocator peak to an estimate (analytic
// or simulated): the paged optimizer states of rank `m` (their own row, in
// total_device) and the load phase (per_gpu.load_peak; the headline is the
// larger of load and step), from the layout's `par` (its rank tensors and
// NCCL memory); `m` is one of par.stages.
void finish_outside_allocator(EstimateResult& r, const ModelGraph& g, const ParallelResult& par, const StageMemory& m);

}  // namespace gpumem
