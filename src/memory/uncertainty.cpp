// Error bands per prediction path and the ranges of an estimate
// (gpumem/memory/uncertainty.hpp, gpumem/memory/calibration.hpp).
#include "gpumem/memory/uncertainty.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string_view>

#include "gpumem/memory/calibration.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/serving.hpp"

namespace gpumem {

const std::vector<ErrorBand>& error_bands() {
    static const std::vector<ErrorBand> t = {
#include "error_bands.inc"
    };
    return t;
}

namespace {
// A training job's kind of layout in the band paths ("train/<kind>/<framework>").
std::string_view train_kind(const Job& job) {
    const ParallelConfig& c = job.layout.cfg;
    return c.zero > 0                           ? "zero"
           : c.fsdp != Fsdp::None               ? "fsdp"
           : c.tp > 1 || c.pp > 1 || c.cp > 1   ? "tp-pp"
           : c.gpus > 1                         ? "dp"
                                                : "single";
}

// The band paths of a job, most specific first, each handed to `f` until it
// returns true: band_paths() lists them, band_for() stops at the first band
// written (one lookup per estimate, no list built).
template <class F>
void visit_band_paths(const Job& job, F&& f) {
    if (!job.train) {
        if (!f(std::string_view("infer"))) f(std::string_view("all"));
        return;
    }
    const std::string_view kind = train_kind(job);
    std::string path = "train/";
    path += kind;
    const std::size_t kind_end = path.size();
    path += '/';
    path += to_string(job.framework.framework);
    if (f(std::string_view(path)) || f(std::string_view(path).substr(0, kind_end))) return;
    if (kind != "single" && f(std::string_view("train/distributed"))) return;
    if (!f(std::string_view("train"))) f(std::string_view("all"));
}
}  // namespace

std::vector<std::string> band_paths(const Job& job) {
    std::vector<std::string> out;
    visit_band_paths(job, [&](std::string_view p) {
        out.emplace_back(p);
        return false;
    });
    return out;
}

const ErrorBand& band_for_paths(const std::vector<std::string>& paths) {
    const auto& t = error_bands();
    for (const auto& p : paths)
        for (const auto& b : t)
            if (p == b.path) return b;
    return t.front();  // "all" sorts first and is always written
}

const ErrorBand& band_for(const Job& job) {
    const auto& t = error_bands();
    const ErrorBand* found = nullptr;
    visit_band_paths(job, [&](std::string_view p) {
        for (const auto& b : t)
            if (p == b.path) found = &b;
        return found != nullptr;
    });
    return found ? *found : t.front();  // "all" sorts first and is always written
}


namespace {

Bytes scaled(Bytes b, double f) { return Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(b.count()) * f))); }

Range ratio_range(Bytes expected, double lo, double hi) { return {scaled(expected, lo), expected, scaled(expected, hi)}; }

// Calibrated: the calibration's relative residual around the expected value,
// plus the band's larger relative width applied to the change from the
// calibrated job's uncalibrated prediction.
Range calibrated_range(Bytes expected, Bytes uncalibrated, Bytes at_calibration, double residual, double band) {
    const double delta = std::abs(static_cast<double>((uncalibrated - at_calibration).count()));
    const double half = residual * static_cast<double>(expected.count()) + band * delta;
    const auto h = Bytes(static_cast<std::int64_t>(std::llround(half)));
    const Bytes low = expected - h;
    return {low < Bytes(0) ? Bytes(0) : low, expected, expected + h};
}

std::string pct(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", x);
    return buf;
}

}  // namespace

void set_serving_uncertainty(ServingResult& r) {
    const bool llama = r.engine == "llama.cpp";
    const std::string eng = llama ? "llama.cpp" : r.engine == "vllm" && r.engine_version.find("V0") != std::string::npos ? "vllm-v0" : r.engine;
    const std::string kvq = llama ? "kv_buffer" : eng == "vllm-v0" ? "kv_pool" : "kv_tokens";
    const std::string kvb = llama ? "kv_buffer" : "kv_pool";
    const std::string wq = llama ? "model_buffer" : "weights";
    const ErrorBand& kv = band_for_paths({"serve/" + eng + "/" + kvq, "serve/" + kvq, "serve"});
    const ErrorBand& kvbytes = band_for_paths({"serve/" + eng + "/" + kvb, "serve/" + kvb, "serve"});
    const ErrorBand& w = band_for_paths({"serve/" + eng + "/" + wq, "serve/" + wq, "serve"});
    ServingUncertainty& u = r.uncertainty;
    u.kv_path = kv.path;
    u.kv_bytes_path = kvbytes.path;
    u.kv_bytes_ratio_low = kvbytes.ratio_low;
    u.kv_bytes_ratio_high = kvbytes.ratio_high;
    u.weights_path = w.path;
    u.kv_rows = kv.rows;
    u.weights_rows = w.rows;
    u.kv_ratio_low = kv.ratio_low;
    u.kv_ratio_high = kv.ratio_high;
    u.weights_ratio_low = w.ratio_low;
    u.weights_ratio_high = w.ratio_high;
    u.kv_cache_low = scaled(r.per_gpu.kv_cache, kvbytes.ratio_low);
    u.kv_cache_high = scaled(r.per_gpu.kv_cache, kvbytes.ratio_high);
    u.kv_tokens_low = static_cast<std::int64_t>(std::floor(static_cast<double>(r.kv_cache_tokens) * kv.ratio_low));
    u.kv_tokens_high = static_cast<std::int64_t>(std::floor(static_cast<double>(r.kv_cache_tokens) * kv.ratio_high));
    u.concurrency_low = r.max_concurrency * kv.ratio_low;
    u.concurrency_high = r.max_concurrency * kv.ratio_high;
    u.weights_low = scaled(r.per_gpu.weights, w.ratio_low);
    u.weights_high = scaled(r.per_gpu.weights, w.ratio_high);
}

// The basis line of an uncalibrated band, made the first time the band is
// used (a one-shot CLI call uses one band).
static std::string band_basis(const ErrorBand& b) {
    static std::mutex mutex;
    static std::vector<std::string> lines(error_bands().size());
    const auto i = static_cast<std::size_t>(&b - error_bands().data());
    const std::lock_guard<std::mutex> lock(mutex);
    if (lines[i].empty())
        lines[i] = "measured/predicted " + pct(b.ratio_low) + "-" + pct(b.ratio_high) + " over " + std::to_string(b.rows) +
                   " public measurements of path " + b.path + " (5% trimmed at each end; scripts/error_bands.py)";
    return lines[i];
}

void set_uncertainty(EstimateResult& r) {
    Uncertainty& u = r.uncertainty;
    const PerGpu& pg = r.per_gpu;
    const ErrorBand& b = band_for(*r.job);
    u.path = b.path;
    const Calibration* cal = r.request().calibration.get();
    if (!cal) {
        u.rows = b.rows;
        u.ratio_low = b.ratio_low;
        u.ratio_high = b.ratio_high;
        u.calibrated = false;
        u.basis = band_basis(b);
        u.allocated = ratio_range(pg.peak_allocated, b.ratio_low, b.ratio_high);
        u.reserved = ratio_range(pg.peak_reserved, b.ratio_low, b.ratio_high);
        u.total = ratio_range(pg.total_device, b.ratio_low, b.ratio_high);
    } else {
        // apply_calibration() kept the uncalibrated figures in the breakdown's
        // calibration rows: expected - those rows is the uncalibrated value.
        Bytes extras, frag, ctx;
        for (const auto& row : r.breakdown) {
            if (row.key == "calibration_extras") extras = row.bytes;
            if (row.key == "calibration_fragmentation") frag = row.bytes;
            if (row.key == "calibration_context") ctx = row.bytes;
        }
        const double w = std::max(1.0 - b.ratio_low, b.ratio_high - 1.0);
        u.rows = 0;
        u.calibrated = true;
        u.ratio_low = u.ratio_high = 1.0;
        u.basis = "calibration residual " + pct(100.0 * cal->residual) + "% at the calibrated job, plus " + pct(100.0 * w) +
                  "% (path " + b.path + "'s error band) of the change from it";
        u.allocated = calibrated_range(pg.peak_allocated, pg.peak_allocated - extras, cal->predicted_allocated, cal->residual, w);
        u.reserved = calibrated_range(pg.peak_reserved, pg.peak_reserved - extras - frag, cal->predicted_reserved, cal->residual, w);
        u.total = calibrated_range(pg.total_device, pg.total_device - extras - frag - ctx, cal->predicted_total, cal->residual, w);
    }
    const Bytes cap = pg.capacity;
    u.verdict = u.total.high <= cap   ? "fits"
                : pg.fits             ? "fits, but within the error band"
                : u.total.low <= cap  ? "does not fit, but within the error band"
                                      : "does not fit";
}

void finish_estimate(EstimateResult& r) {
    if (r.request().calibration) apply_calibration(r, *r.request().calibration);
    set_uncertainty(r);
}

}  // namespace gpumem
