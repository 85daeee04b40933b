// gpumem/plan/calibrate.hpp — `gpumem calibrate`: fits a calibration
// (memory/calibration.hpp) to one measured job.
//
// Inputs: the job (the usual estimate flags) and what was measured for it:
// max_memory_allocated, max_memory_reserved and/or nvidia-smi's used memory,
// or a torch.cuda.memory._dump_snapshot() file whose replay gives the first
// two. The answer holds the calibration (to save with --out or as JSON) and
// the job's estimate before and after it, which equals the measurement.
#pragma once

#include <optional>
#include <string>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/calibration.hpp"
#include "gpumem/memory/estimate.hpp"

namespace gpumem {

struct CalibrateRequest {
    EstimateRequest job;
    std::optional<Bytes> allocated, reserved, total;
    std::string source;     // names the measurement (a snapshot file, ...)
    bool simulate = true;   // false: the analytic path (--analytic)
};

struct CalibrateResult {
    Calibration calibration;
    EstimateResult before;
    EstimateResult after;
};

Result<CalibrateResult> calibrate(const CalibrateRequest& req);

}  // namespace gpumem
