// gpumem/plan/sweep.hpp — memory over a grid of batch sizes and sequence
// lengths (`gpumem sweep MODEL --batch 1,2,4,8 --seq 512,1024,2048`).
//
// The model is loaded once; every (batch, seq) combination of the two lists
// is estimated with the same settings (the rest of the EstimateRequest), by
// the step simulation (simulate_estimate) or, with simulate = false or
// base.analytic, by the analytic path (estimate). Points come in a fixed
// order: sequence length outer, batch size inner, each list in the order the
// user gave it — for seqs {512, 1024} and batches {1, 2}:
//   (b1, s512), (b2, s512), (b1, s1024), (b2, s1024).
//
// When exactly one axis varies (several batches at one seq, or several seqs
// at one batch) total_device, in MB = 2^20 bytes, is fitted against that axis
// by least squares, as a line (a·x + b) and as a parabola (a·x² + b·x + c).
// The parabola is chosen only when its x² term matters: |a|·x_max² is more
// than 1% of the fitted value at x_max, and it leaves at most half of the
// line's residual. That shape test is made on peak_allocated (live tensor
// bytes), not on total_device: the caching allocator's reserved-but-free
// slack jumps with segment reuse in simulated peaks and would pass for
// curvature; the coefficients are fitted to total_device (memory is linear in batch; it is quadratic in sequence
// length only while attention scores are materialised, i.e. eager attention —
// flash attention keeps it linear).
// The peak is the largest of several phases (forward/backward vs. the
// optimizer step), so the total is piecewise: at small sizes the optimizer
// step, whose memory does not grow with batch or seq, can be the peak. The fit
// uses the points that peak in the same phase as the largest x (the regime
// that extrapolates) and lists the others as excluded, when at least two
// points remain.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/fields.hpp"
#include "gpumem/memory/request.hpp"

namespace gpumem {


struct SweepPoint {
    std::int64_t batch = 0;
    std::int64_t seq = 0;                 // the sequence length used (defaults filled in)
    PerGpu per_gpu;                       // weights, gradients, optimizer_states, activations, kv_cache,
                                          // peak_allocated, peak_reserved, total_device, fits, ...
    std::vector<BreakdownRow> breakdown;  // live at the peak; sums to per_gpu.total_device
    std::vector<std::string> warnings;
};

// y = coef[0]·x^n + ... + coef[n] (highest power first), y in MB (2^20 bytes).
struct PolyFit {
    std::vector<double> coef;
    double r2 = 0;  // coefficient of determination (1 when every point is on the curve)
    [[nodiscard]] double operator()(double x) const;
};

struct SweepFit {
    std::string axis;           // "batch" or "seq": the axis that varies
    std::int64_t fixed = 0;     // the value of the other axis
    PolyFit linear;             // a·x + b
    std::optional<PolyFit> quadratic;  // a·x² + b·x + c (needs 3 distinct x values)
    bool quadratic_chosen = false;
    double quadratic_share = 0;  // of a parabola fitted to peak_allocated: |a|·x_max² / its value at
                                 // x_max (0 without a quadratic fit); > 0.01 is one condition of the choice
    [[nodiscard]] const PolyFit& chosen() const { return quadratic_chosen ? *quadratic : linear; }
    std::string formula;        // of the chosen fit: "0.00123·x² + 0.6039·x + 437.9 MB"
    std::string peak_phase;     // the phase the fitted points peak in
    std::vector<std::int64_t> excluded;  // x values left out: their peak is in another phase
    std::string note;           // why points were left out ("" when none were)
};

struct SweepResult {
    std::string model_name;
    std::string family;
    std::string gpu;
    Bytes capacity;
    bool simulated = false;          // peaks from the step simulation (false: analytic)
    EstimateRequest request;         // the base request with defaults filled in (of the first point)
    std::vector<std::int64_t> batches;  // as swept (defaults filled in)
    std::vector<std::int64_t> seqs;
    std::vector<SweepPoint> points;  // seq outer, batch inner
    std::optional<SweepFit> fit;     // only when exactly one axis varies
};

// Loads the model once and estimates every point. Errors: a non-positive or
// duplicate value (field "batch" / "seq"), and the first point whose estimate
// fails (its message prefixed with the point, e.g. "batch 4, seq 8192: ...").
// The most points one sweep runs is kMaxSweepPoints (gpumem/memory/fields.hpp):
// each is a whole estimate; a larger grid is an error naming --batches / --seqs.

Result<SweepResult> sweep(const SweepRequest& req);

// "1,2,4,8" -> {1, 2, 4, 8}. Spaces around values are allowed; an empty list,
// an empty item, a value that is not a positive integer or a repeated value is
// an error naming the flag: `--batch: "x" is not a positive integer`.
Result<std::vector<std::int64_t>> parse_int_list(std::string_view text, std::string_view flag);

// Least-squares polynomial fit of degree 1 or 2 (y in any unit). Needs at
// least degree + 1 distinct x values; otherwise returns an empty coef.
PolyFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y, int degree);
// Fits total_device (MB) against the varying axis; nullopt when neither or
// both axes vary.
std::optional<SweepFit> fit_sweep(const std::vector<SweepPoint>& points);
// "0.00123·x² + 0.6039·x + 437.9 MB" (4 significant digits).
std::string format_fit(const PolyFit& f, std::string_view unit = "MB");

}  // namespace gpumem
