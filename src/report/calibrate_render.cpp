#include "gpumem/report/calibrate_render.hpp"

#include <nlohmann/json.hpp>

namespace gpumem {

namespace {
nlohmann::json figures(const PerGpu& p) {
    return {{"peak_allocated", p.peak_allocated.count()}, {"peak_reserved", p.peak_reserved.count()}, {"total_device", p.total_device.count()}};
}
std::string opt(const std::optional<Bytes>& b) { return b ? format_bytes(*b) : std::string("-"); }
}  // namespace

nlohmann::json calibrate_to_json(const CalibrateResult& r) {
    nlohmann::json j = calibration_to_json(r.calibration);
    j["before"] = figures(r.before.per_gpu);
    j["after"] = figures(r.after.per_gpu);
    return j;
}

std::string render_calibrate(const CalibrateResult& r, Format f) {
    if (f == Format::Json) return calibrate_to_json(r).dump(2) + "\n";
    const Calibration& c = r.calibration;
    Table t;
    t.header = {"figure", "measured", "gpumem", "calibrated"};
    t.right_align = {false, true, true, true};
    t.rows.push_back({"peak_allocated", opt(c.measured_allocated), format_bytes(r.before.per_gpu.peak_allocated), format_bytes(r.after.per_gpu.peak_allocated)});
    t.rows.push_back({"peak_reserved", opt(c.measured_reserved), format_bytes(r.before.per_gpu.peak_reserved), format_bytes(r.after.per_gpu.peak_reserved)});
    t.rows.push_back({"total_device", opt(c.measured_total), format_bytes(r.before.per_gpu.total_device), format_bytes(r.after.per_gpu.total_device)});
    Table terms;
    terms.header = {"term", "constant", "per byte of working set", "at this job"};
    terms.right_align = {false, true, true, true};
    const auto [extras, frag] = calibration_terms(c, c.working_set);
    terms.rows.push_back({"extras", format_bytes(c.extras.constant), std::to_string(c.extras.per_working_set), format_bytes(extras)});
    terms.rows.push_back({"fragmentation", format_bytes(c.fragmentation.constant), std::to_string(c.fragmentation.per_working_set), format_bytes(frag)});
    terms.rows.push_back({"context", format_bytes(c.context), "0", format_bytes(c.context)});
    std::string out = "calibration of `" + c.job_command + "` from " + c.source + "\n\n" + render_table(t, f) + "\n" + render_table(terms, f);
    out += "\nworking set " + format_bytes(c.working_set) + "; residual " + std::to_string(100.0 * c.residual).substr(0, 5) +
           "% (the calibrated range's half-width at this job)\n";
    if (f == Format::Text) out += "save it: the same command with --format json > calib.json; use it: gpumem estimate ... --calibration calib.json\n";
    return out;
}

}  // namespace gpumem
