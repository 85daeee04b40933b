// Calibration terms: the file format and how they change an estimate
// (gpumem/memory/calibration.hpp; fitted by plan/calibrate.cpp).
#include "gpumem/memory/calibration.hpp"

#include <cmath>

#include "gpumem/core/input.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"

namespace gpumem {

namespace {
using json = nlohmann::json;
constexpr const char* kFormat = "gpumem-calibration";
// A slope beyond this would mean the working set is mis-modelled by more than
// half: the calibration refuses such files (and the fit clamps to it).
constexpr double kMaxSlope = 0.5;

Bytes scaled(Bytes b, double f) { return Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(b.count()) * f))); }

json term_json(const CalibrationTerm& t) { return json{{"constant", t.constant.count()}, {"per_working_set", t.per_working_set}}; }

Error bad(const std::string& field, const std::string& what) {
    return Error{ErrorCode::InvalidArgument, "calibration: " + field + " " + what + " (write a new file with gpumem calibrate)", "calibration"};
}
}  // namespace

Bytes calibration_working_set(const EstimateResult& r) {
    return r.job && !r.job->train ? r.per_gpu.kv_cache + r.per_gpu.transient : r.per_gpu.activations;
}

std::pair<Bytes, Bytes> calibration_terms(const Calibration& c, Bytes ws) {
    return {c.extras.constant + scaled(ws, c.extras.per_working_set), c.fragmentation.constant + scaled(ws, c.fragmentation.per_working_set)};
}

json calibration_to_json(const Calibration& c) {
    auto opt = [](const std::optional<Bytes>& b) { return b ? json(b->count()) : json(); };
    return json{{"format", kFormat},
                {"version", Calibration::kVersion},
                {"job_command", c.job_command},
                {"job", c.job},
                {"source", c.source},
                {"measured", {{"peak_allocated", opt(c.measured_allocated)}, {"peak_reserved", opt(c.measured_reserved)}, {"total_device", opt(c.measured_total)}}},
                {"predicted", {{"peak_allocated", c.predicted_allocated.count()}, {"peak_reserved", c.predicted_reserved.count()}, {"total_device", c.predicted_total.count()}}},
                {"working_set", c.working_set.count()},
                {"terms", {{"extras", term_json(c.extras)}, {"fragmentation", term_json(c.fragmentation)}, {"context", c.context.count()}}},
                {"residual", c.residual}};
}

Result<Calibration> calibration_from_json(const json& j) {
    if (!j.is_object()) return bad("document", "must be a JSON object");
    if (!j.contains("format") || j["format"] != kFormat) return bad("format", std::string("must be \"") + kFormat + "\"");
    if (!j.contains("version") || !j["version"].is_number_integer()) return bad("version", "must be an integer");
    if (j["version"].get<std::int64_t>() != Calibration::kVersion)
        return bad("version", std::to_string(j["version"].get<std::int64_t>()) + " is not supported (this gpumem reads version 1)");
    Calibration c;
    // A byte count: an integer within +-1 PiB (no GPU has more).
    constexpr std::int64_t kLimit = std::int64_t{1} << 50;
    auto bytes = [&](const json& o, const char* key, const std::string& path, bool nullable, bool nonneg) -> Result<std::optional<Bytes>> {
        if (!o.is_object() || !o.contains(key)) return bad(path, "is missing");
        const json& v = o[key];
        if (v.is_null() && nullable) return std::optional<Bytes>();
        if (!v.is_number_integer()) return bad(path, "must be an integer number of bytes");
        const std::int64_t n = v.get<std::int64_t>();
        if (n > kLimit || n < -kLimit || (nonneg && n < 0)) return bad(path, "is out of range");
        return std::optional<Bytes>(Bytes(n));
    };
    auto slope = [&](const json& o, const std::string& path) -> Result<double> {
        if (!o.is_object() || !o.contains("per_working_set") || !o["per_working_set"].is_number()) return bad(path + ".per_working_set", "must be a number");
        const double s = o["per_working_set"].get<double>();
        if (!std::isfinite(s) || std::abs(s) > kMaxSlope) return bad(path + ".per_working_set", "must lie within -0.5..0.5");
        return s;
    };
#define TAKE(dst, expr)              \
    {                                \
        auto t_ = (expr);            \
        if (!t_) return t_.error();  \
        dst = std::move(t_).value(); \
    }
    if (!j.contains("job_command") || !j["job_command"].is_string()) return bad("job_command", "must be a string");
    c.job_command = j["job_command"].get<std::string>();
    if (!j.contains("job") || !j["job"].is_object()) return bad("job", "must be an object");
    c.job = j["job"];
    if (!j.contains("source") || !j["source"].is_string()) return bad("source", "must be a string");
    c.source = j["source"].get<std::string>();
    if (!j.contains("measured") || !j["measured"].is_object()) return bad("measured", "must be an object");
    TAKE(c.measured_allocated, bytes(j["measured"], "peak_allocated", "measured.peak_allocated", true, true));
    TAKE(c.measured_reserved, bytes(j["measured"], "peak_reserved", "measured.peak_reserved", true, true));
    TAKE(c.measured_total, bytes(j["measured"], "total_device", "measured.total_device", true, true));
    if (!c.measured_allocated && !c.measured_reserved && !c.measured_total) return bad("measured", "has no figure");
    if (!j.contains("predicted") || !j["predicted"].is_object()) return bad("predicted", "must be an object");
    std::optional<Bytes> b;
    TAKE(b, bytes(j["predicted"], "peak_allocated", "predicted.peak_allocated", false, true));
    c.predicted_allocated = *b;
    TAKE(b, bytes(j["predicted"], "peak_reserved", "predicted.peak_reserved", false, true));
    c.predicted_reserved = *b;
    TAKE(b, bytes(j["predicted"], "total_device", "predicted.total_device", false, true));
    c.predicted_total = *b;
    TAKE(b, bytes(j, "working_set", "working_set", false, true));
    c.working_set = *b;
    if (!j.contains("terms") || !j["terms"].is_object()) return bad("terms", "must be an object");
    const json& t = j["terms"];
    if (!t.contains("extras") || !t["extras"].is_object()) return bad("terms.extras", "must be an object");
    if (!t.contains("fragmentation") || !t["fragmentation"].is_object()) return bad("terms.fragmentation", "must be an object");
    TAKE(b, bytes(t["extras"], "constant", "terms.extras.constant", false, false));
    c.extras.constant = *b;
    TAKE(c.extras.per_working_set, slope(t["extras"], "terms.extras"));
    TAKE(b, bytes(t["fragmentation"], "constant", "terms.fragmentation.constant", false, false));
    c.fragmentation.constant = *b;
    TAKE(c.fragmentation.per_working_set, slope(t["fragmentation"], "terms.fragmentation"));
    TAKE(b, bytes(t, "context", "terms.context", false, false));
    c.context = *b;
#undef TAKE
    if (!j.contains("residual") || !j["residual"].is_number()) return bad("residual", "must be a number");
    c.residual = j["residual"].get<double>();
    if (!std::isfinite(c.residual) || c.residual < 0 || c.residual > 1) return bad("residual", "must lie within 0..1");
    return c;
}

Result<Calibration> load_calibration(const std::string& path) {
    // A regular file of at most kMaxConfigBytes, nested no deeper than
    // kMaxJsonDepth (a calibration file nests 3 levels).
    auto text = capture([&] {
        std::string t = read_input_file(path, kMaxConfigBytes, "calibration");
        check_json_depth(t, path);
        return t;
    });
    if (!text) {
        Error e = text.error();
        e.message = "calibration: " + e.message;
        e.field = "calibration";
        return e;
    }
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded()) return Error{ErrorCode::InvalidArgument, "calibration: " + path + " is not JSON", "calibration"};
    return calibration_from_json(j);
}

void apply_calibration(EstimateResult& r, const Calibration& c) {
    PerGpu& pg = r.per_gpu;
    const auto [extras, frag] = calibration_terms(c, calibration_working_set(r));
    pg.peak_allocated += extras;
    pg.allocator_overhead += frag;
    pg.peak_reserved += extras + frag;
    pg.cuda_context += c.context;
    pg.total_device += extras + frag + c.context;
    pg.fits = pg.total_device <= pg.capacity && !(r.simulation && r.simulation->oom);
    const std::string from = " (fitted to " + c.source + " of `" + c.job_command + "`)";
    r.breakdown.push_back({"calibration_extras", "calibration: framework extras and workspaces", extras,
                           format_bytes(c.extras.constant) + " + " + std::to_string(c.extras.per_working_set) + " x working set " +
                               format_bytes(calibration_working_set(r)) + from});
    r.breakdown.push_back({"calibration_fragmentation", "calibration: allocator fragmentation", frag,
                           format_bytes(c.fragmentation.constant) + " + " + std::to_string(c.fragmentation.per_working_set) + " x working set" + from});
    r.breakdown.push_back({"calibration_context", "calibration: outside PyTorch beyond the CUDA context", c.context, "constant" + from});
    r.assumptions.push_back("calibrated with " + c.source + " measured for `" + c.job_command + "`: extras " + format_bytes(extras) +
                            ", fragmentation " + format_bytes(frag) + ", context " + format_bytes(c.context) + " added (docs/calibration.md)");
}

}  // namespace gpumem
