// gpumem/plan/fit.hpp — the largest micro-batch and the longest sequence that fit.
//
// Each probe is a full estimate (the step simulation by default), so "fits"
// includes the caching allocator's reserved memory, the CUDA context and NCCL,
// not only tensor bytes. The search doubles until a probe does not fit, then
// bisects; the answer says what stops the next step up (which part grows and
// by how much the next value would exceed the GPU).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"

namespace gpumem {

struct FitRequest {
    EstimateRequest base;       // model and settings; batch/seq give the other axis
    bool simulate = true;       // false: analytic estimates (faster, less exact)
    std::int64_t max_batch = 1 << 20;
    std::int64_t max_seq = 1 << 22;
};

struct FitAxis {
    std::string axis;                 // "batch" or "seq"
    std::int64_t largest = 0;         // 0: not even the smallest value fits
    std::int64_t probes = 0;
    Bytes total_at_largest;           // total_device at `largest`
    Bytes total_next;                 // total_device at largest + 1 (or the next probe)
    Bytes capacity;
    std::string limit;                // what stops the next step up
};

struct FitResult {
    std::string model;
    std::string gpu;
    FitAxis batch;   // at the request's sequence length
    FitAxis seq;     // at the request's micro-batch
    std::vector<std::string> assumptions;
};

Result<FitResult> fit(const FitRequest& req);

}  // namespace gpumem
