// gpumem/memory/calibration.hpp — terms fitted to one measured run, applied
// to every later estimate (--calibration FILE).
//
// A user who has run a job once knows what no formula does: the CUDA context
// of their driver, the extras of their framework (kernel images, workspaces,
// buffers the model does not name) and their allocator's fragmentation. The
// calibration keeps the difference between what they measured and what
// gpumem predicted for that job, split into
//   extras        at the allocated level (max_memory_allocated), or at the
//                 lowest level measured when allocated is not,
//   fragmentation reserved - allocated beyond the model's (both measured),
//   context       outside PyTorch beyond the model's (nvidia-smi and reserved
//                 measured): a constant.
// Extras and fragmentation are each a constant plus a part proportional to
// the job's working set (saved activations in training; KV cache and
// temporaries in inference), because the unknowns that grow with the batch
// (cached activation blocks, framework buffers sized by the batch) dominate
// where activations do. One measurement cannot tell the two parts apart, so
// the split is a rule (docs/calibration.md): the residual is proportional
// when the working set is at least as large as the residual (slope clamped to
// +-0.5), else constant. The uncertainty of a calibrated estimate is the
// calibration's relative residual plus the path's error band applied to the
// part of the prediction that changed from the calibrated job.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"

namespace gpumem {

struct EstimateResult;

struct CalibrationTerm {
    Bytes constant;                // added to every job (signed)
    double per_working_set = 0.0;  // times the job's working set
};

struct Calibration {
    static constexpr int kVersion = 1;
    std::string job_command;   // the calibrated job, as a gpumem command line
    nlohmann::json job;        // its request JSON (field table keys)
    std::string source;        // what was measured ("max_memory_reserved, nvidia-smi", "snapshot FILE")
    std::optional<Bytes> measured_allocated, measured_reserved, measured_total;
    // gpumem's own figures for that job, without calibration.
    Bytes predicted_allocated, predicted_reserved, predicted_total;
    Bytes working_set;         // the job's working set
    CalibrationTerm extras;
    CalibrationTerm fragmentation;
    Bytes context;             // constant
    // |measured - predicted| / measured at the highest level measured: the
    // relative half-width of a calibrated range at the calibrated job.
    double residual = 0.0;
};

// The working set the proportional parts scale with.
Bytes calibration_working_set(const EstimateResult& r);
// The terms for a job of this working set: {extras, fragmentation}.
std::pair<Bytes, Bytes> calibration_terms(const Calibration& c, Bytes working_set);

// The file format "gpumem-calibration", version 1 (docs/calibration.md).
nlohmann::json calibration_to_json(const Calibration& c);
// Refuses documents that are not a version-1 calibration, and values out of
// range, naming the field.
Result<Calibration> calibration_from_json(const nlohmann::json& j);
// Reads and parses a calibration file.
Result<Calibration> load_calibration(const std::string& path);

// Applies c to an uncalibrated estimate: named breakdown rows
// (calibration_extras, calibration_fragmentation, calibration_context),
// per-GPU peaks and fits, and an assumption naming the calibrated job.
void apply_calibration(EstimateResult& r, const Calibration& c);

}  // namespace gpumem
