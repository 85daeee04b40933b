// `gpumem calibrate`: the calibration terms of one measured job
// (gpumem/plan/calibrate.hpp, gpumem/memory/calibration.hpp).
#include "gpumem/plan/calibrate.hpp"

#include <algorithm>
#include <cmath>

#include "gpumem/memory/fields.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

namespace {

// One residual split into a constant and a part per byte of working set: all
// of it proportional when the working set could explain it (ws >= |e|, the
// slope clamped to +-0.5, the rest constant), else all of it constant.
CalibrationTerm split(Bytes e, Bytes ws) {
    CalibrationTerm t;
    const double mag = std::abs(static_cast<double>(e.count()));
    if (ws > Bytes(0) && static_cast<double>(ws.count()) >= mag) {
        t.per_working_set = std::clamp(static_cast<double>(e.count()) / static_cast<double>(ws.count()), -0.5, 0.5);
        // Whole parts per million keep the file's figure and the applied bytes the same.
        t.per_working_set = std::round(t.per_working_set * 1e6) / 1e6;
    }
    const auto part = Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(ws.count()) * t.per_working_set)));
    t.constant = e - part;
    return t;
}

}  // namespace

Result<CalibrateResult> calibrate(const CalibrateRequest& req) {
    if (!req.allocated && !req.reserved && !req.total)
        return Error{ErrorCode::InvalidArgument,
                     "calibrate: give what the job measured: --measured-allocated, --measured-reserved, --measured-total or --snapshot FILE",
                     "measured-total"};
    for (const auto& [v, name] : {std::pair{req.allocated, "measured-allocated"}, std::pair{req.reserved, "measured-reserved"}, std::pair{req.total, "measured-total"}})
        if (v && *v <= Bytes(0)) return Error{ErrorCode::InvalidArgument, std::string("--") + name + " must be positive", name};
    if (req.allocated && req.reserved && *req.reserved < *req.allocated)
        return Error{ErrorCode::InvalidArgument, "--measured-reserved (" + format_bytes(*req.reserved) + ") is below --measured-allocated (" +
                                                     format_bytes(*req.allocated) + "): reserved memory holds every allocation; check the two figures",
                     "measured-reserved"};
    const std::optional<Bytes> below = req.reserved ? req.reserved : req.allocated;
    if (req.total && below && *req.total < *below)
        return Error{ErrorCode::InvalidArgument, "--measured-total (" + format_bytes(*req.total) + ") is below the allocator's figure (" +
                                                     format_bytes(*below) + "): nvidia-smi counts everything the process reserved plus its context",
                     "measured-total"};
    EstimateRequest job = req.job;
    job.calibration.reset();
    auto before = req.simulate ? simulate_estimate(job) : estimate(job);
    if (!before) return before.error();
    return capture([&]() -> CalibrateResult {
        CalibrateResult out;
        out.before = std::move(before).value();
        const PerGpu& p = out.before.per_gpu;
        Calibration& c = out.calibration;
        c.job_command = request_to_command(job, "estimate");
        c.job = request_to_json(job);
        c.measured_allocated = req.allocated;
        c.measured_reserved = req.reserved;
        c.measured_total = req.total;
        std::vector<std::string> what;
        if (req.allocated) what.emplace_back("max_memory_allocated");
        if (req.reserved) what.emplace_back("max_memory_reserved");
        if (req.total) what.emplace_back("nvidia-smi");
        std::string names;
        for (const auto& w : what) names += (names.empty() ? "" : ", ") + w;
        c.source = req.source.empty() ? names : req.source + " (" + names + ")";
        c.predicted_allocated = p.peak_allocated;
        c.predicted_reserved = p.peak_reserved;
        c.predicted_total = p.total_device;
        c.working_set = calibration_working_set(out.before);
        const Bytes ws = c.working_set;
        // Residuals at each level measured; the lowest goes to the extras, the
        // steps between levels to fragmentation and context.
        // (Plain values with has_ flags: g++ 12 cannot see through nested optionals.)
        const bool ha = req.allocated.has_value(), hr = req.reserved.has_value(), ht = req.total.has_value();
        const Bytes ra = ha ? *req.allocated - p.peak_allocated : Bytes(0);
        const Bytes rr = hr ? *req.reserved - p.peak_reserved : Bytes(0);
        const Bytes rt = ht ? *req.total - p.total_device : Bytes(0);
        const Bytes lowest = ha ? ra : hr ? rr : rt;
        c.extras = split(lowest, ws);
        if (ha && hr) c.fragmentation = split(rr - ra, ws);
        if (ha && ht && !hr) c.fragmentation = split(rt - ra, ws);  // reserved slack and context together
        if (hr && ht) c.context = rt - rr;
        const Bytes top_measured = ht ? *req.total : hr ? *req.reserved : *req.allocated;
        const Bytes top_residual = ht ? rt : hr ? rr : ra;
        c.residual = std::min(1.0, std::abs(static_cast<double>(top_residual.count())) / static_cast<double>(top_measured.count()));
        c.residual = std::round(c.residual * 1e6) / 1e6;
        job.calibration = std::make_shared<const Calibration>(c);
        out.after = take(req.simulate ? simulate_estimate(job) : estimate(job));
        return out;
    });
}

}  // namespace gpumem
