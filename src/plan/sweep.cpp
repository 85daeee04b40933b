#include "gpumem/plan/sweep.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <set>
#include <utility>

#include "gpumem/core/budget.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

std::string field_of(std::string_view flag) {
    std::string f(flag);
    while (!f.empty() && f.front() == '-') f.erase(f.begin());
    return f;
}

std::string flag_of(std::string_view flag) {
    if (!flag.empty() && flag.front() == '-') return std::string(flag);
    return "--" + std::string(flag);
}

// Solves the n x n system a·x = b (Gaussian elimination, partial pivoting).
template <std::size_t N>
std::optional<std::array<double, N>> solve(std::array<std::array<double, N>, N> a, std::array<double, N> b) {
    for (std::size_t c = 0; c < N; ++c) {
        std::size_t p = c;
        for (std::size_t r = c + 1; r < N; ++r)
            if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
        if (std::fabs(a[p][c]) < 1e-12) return std::nullopt;
        std::swap(a[p], a[c]);
        std::swap(b[p], b[c]);
        for (std::size_t r = c + 1; r < N; ++r) {
            const double f = a[r][c] / a[c][c];
            for (std::size_t k = c; k < N; ++k) a[r][k] -= f * a[c][k];
            b[r] -= f * b[c];
        }
    }
    std::array<double, N> x{};
    for (std::size_t i = N; i-- > 0;) {
        double s = b[i];
        for (std::size_t k = i + 1; k < N; ++k) s -= a[i][k] * x[k];
        x[i] = s / a[i][i];
    }
    return x;
}

template <std::size_t N>
std::optional<std::array<double, N>> fit_scaled(const std::vector<double>& t, const std::vector<double>& y) {
    // Normal equations in the centred, scaled variable t: sum t^(i+j) c_j = sum y t^i.
    std::array<std::array<double, N>, N> a{};
    std::array<double, N> b{};
    for (std::size_t k = 0; k < t.size(); ++k) {
        std::array<double, 2 * N - 1> pw{};
        pw[0] = 1;
        for (std::size_t i = 1; i < pw.size(); ++i) pw[i] = pw[i - 1] * t[k];
        for (std::size_t i = 0; i < N; ++i) {
            for (std::size_t j = 0; j < N; ++j) a[i][j] += pw[i + j];
            b[i] += y[k] * pw[i];
        }
    }
    return solve<N>(a, b);
}

std::string num(double v) {
    const double a = std::fabs(v);
    char buf[64];
    std::snprintf(buf, sizeof buf, a >= 1e4 ? "%.0f" : "%.4g", a);
    return buf;
}

}  // namespace

double PolyFit::operator()(double x) const {
    double y = 0;
    for (double c : coef) y = y * x + c;
    return y;
}

Result<std::vector<std::int64_t>> parse_int_list(std::string_view text, std::string_view flag) {
    const std::string f = flag_of(flag), field = field_of(flag);
    std::vector<std::int64_t> out;
    std::set<std::int64_t> seen;
    if (trim(text).empty())
        return Error{ErrorCode::InvalidArgument, f + ": empty list; give comma-separated positive integers, e.g. 1,2,4,8", field};
    std::size_t pos = 0;
    while (true) {
        const std::size_t comma = text.find(',', pos);
        const std::string_view item = trim(text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos));
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty())
            return Error{ErrorCode::InvalidArgument, f + ": empty item in \"" + std::string(text) + "\"; give comma-separated positive integers, e.g. 1,2,4,8", field};
        if (ec == std::errc::result_out_of_range)
            return Error{ErrorCode::InvalidArgument, f + ": \"" + std::string(item) + "\" is too large", field};
        if (ec != std::errc() || end != item.data() + item.size() || v <= 0)
            return Error{ErrorCode::InvalidArgument, f + ": \"" + std::string(item) + "\" is not a positive integer", field};
        if (!seen.insert(v).second)
            return Error{ErrorCode::InvalidArgument, f + ": " + std::to_string(v) + " is listed twice", field};
        out.push_back(v);
        if (comma == std::string_view::npos) break;
        pos = comma + 1;
    }
    return out;
}

PolyFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y, int degree) {
    PolyFit f;
    if (x.size() != y.size() || degree < 1 || degree > 2) return f;
    std::set<double> distinct(x.begin(), x.end());
    if (distinct.size() < static_cast<std::size_t>(degree) + 1) return f;
    const double n = static_cast<double>(x.size());
    double m = 0;
    for (double v : x) m += v;
    m /= n;
    double s = 0;
    for (double v : x) s = std::max(s, std::fabs(v - m));
    if (s <= 0) return f;
    std::vector<double> t;
    t.reserve(x.size());
    for (double v : x) t.push_back((v - m) / s);
    if (degree == 1) {
        const auto c = fit_scaled<2>(t, y);
        if (!c) return f;
        // y = c0 + c1 (x - m)/s
        f.coef = {(*c)[1] / s, (*c)[0] - (*c)[1] * m / s};
    } else {
        const auto c = fit_scaled<3>(t, y);
        if (!c) return f;
        const double c0 = (*c)[0], c1 = (*c)[1], c2 = (*c)[2];
        f.coef = {c2 / (s * s), c1 / s - 2 * c2 * m / (s * s), c0 - c1 * m / s + c2 * m * m / (s * s)};
    }
    double ymean = 0;
    for (double v : y) ymean += v;
    ymean /= n;
    double ss_res = 0, ss_tot = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        ss_res += (y[i] - f(x[i])) * (y[i] - f(x[i]));
        ss_tot += (y[i] - ymean) * (y[i] - ymean);
    }
    f.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1.0;
    return f;
}

std::string format_fit(const PolyFit& f, std::string_view unit) {
    if (f.coef.empty()) return "";
    const std::size_t deg = f.coef.size() - 1;
    std::string out;
    for (std::size_t i = 0; i < f.coef.size(); ++i) {
        const double c = f.coef[i];
        const std::size_t power = deg - i;
        if (c == 0 && power > 0) continue;
        const std::string term = num(c) + (power == 2 ? "·x²" : power == 1 ? "·x" : "");
        if (out.empty()) out = (c < 0 ? "-" : "") + term;
        else out += (c < 0 ? " - " : " + ") + term;
    }
    return out + " " + std::string(unit);
}

std::optional<SweepFit> fit_sweep(const std::vector<SweepPoint>& points) {
    std::set<std::int64_t> bs, ss;
    for (const auto& p : points) {
        bs.insert(p.batch);
        ss.insert(p.seq);
    }
    const bool batch_varies = bs.size() > 1, seq_varies = ss.size() > 1;
    if (batch_varies == seq_varies) return std::nullopt;
    SweepFit fit;
    fit.axis = batch_varies ? "batch" : "seq";
    fit.fixed = batch_varies ? *ss.begin() : *bs.begin();
    auto x_of = [&](const SweepPoint& p) { return batch_varies ? p.batch : p.seq; };
    const SweepPoint* last = &points.front();
    for (const auto& p : points)
        if (x_of(p) > x_of(*last)) last = &p;
    fit.peak_phase = last->per_gpu.peak_phase;
    std::size_t same = 0;
    for (const auto& p : points) same += p.per_gpu.peak_phase == fit.peak_phase ? 1 : 0;
    const bool split = same >= 2 && same < points.size();
    std::vector<double> x, y, ya;
    for (const auto& p : points) {
        if (split && p.per_gpu.peak_phase != fit.peak_phase) {
            fit.excluded.push_back(x_of(p));
            continue;
        }
        x.push_back(static_cast<double>(x_of(p)));
        y.push_back(p.per_gpu.total_device.mib());
        ya.push_back(p.per_gpu.peak_allocated.mib());
    }
    if (split) {
        std::sort(fit.excluded.begin(), fit.excluded.end());
        std::string xs;
        for (auto v : fit.excluded) xs += (xs.empty() ? "" : ", ") + std::to_string(v);
        fit.note = "fitted on the points that peak in " + fit.peak_phase + "; " + fit.axis + " " + xs +
                   (fit.excluded.size() == 1 ? " peaks" : " peak") + " in another phase and " +
                   (fit.excluded.size() == 1 ? "is" : "are") + " left out";
    }
    fit.linear = fit_polynomial(x, y, 1);
    if (fit.linear.coef.empty()) return std::nullopt;
    PolyFit q = fit_polynomial(x, y, 2);
    if (!q.coef.empty()) {
        // The shape is decided on peak_allocated (live tensor bytes): the
        // caching allocator's reserved-but-free slack, part of total_device,
        // jumps with segment reuse and would pass for curvature.
        const PolyFit la = fit_polynomial(x, ya, 1), qa = fit_polynomial(x, ya, 2);
        const double xmax = *std::max_element(x.begin(), x.end());
        const double at_max = std::fabs(qa(xmax));
        fit.quadratic_share = at_max > 0 ? std::fabs(qa.coef[0]) * xmax * xmax / at_max : 0.0;
        // The x² term must matter at the largest x (> 1% of the value) and
        // the parabola must explain at least half of what the line leaves.
        fit.quadratic_chosen = fit.quadratic_share > 0.01 && (1 - qa.r2) <= 0.5 * (1 - la.r2);
        fit.quadratic = std::move(q);
    }
    fit.formula = format_fit(fit.chosen());
    return fit;
}

Result<SweepResult> sweep(const SweepRequest& req) {
    return capture([&]() -> Result<SweepResult> {
        // Validate the lists before loading anything (the CLI's parser already
        // rejects these; the library checks again for the other front ends).
        auto check = [](const std::vector<std::int64_t>& v, const char* flag) -> std::optional<Error> {
            std::set<std::int64_t> seen;
            for (std::size_t i = 0; i < v.size(); ++i) {
                if (v[i] <= 0)
                    return Error{ErrorCode::InvalidArgument, std::string("--") + flag + ": \"" + std::to_string(v[i]) + "\" is not a positive integer", flag};
                if (!seen.insert(v[i]).second)
                    return Error{ErrorCode::InvalidArgument, std::string("--") + flag + ": " + std::to_string(v[i]) + " is listed twice", flag};
            }
            return std::nullopt;
        };
        if (auto e = check(req.batches, "batch")) return *e;
        if (auto e = check(req.seqs, "seq")) return *e;
        // Every point is a whole estimate (a step simulation unless --analytic):
        // the grid is bounded so that a sweep stays a sweep, not a batch job.
        const std::size_t nb = std::max<std::size_t>(1, req.batches.size()), ns = std::max<std::size_t>(1, req.seqs.size());
        if (nb > static_cast<std::size_t>(kMaxSweepPoints) / ns)
            return Error{ErrorCode::InvalidArgument,
                         "--batches x --seqs: " + std::to_string(nb) + " x " + std::to_string(ns) + " points; a sweep runs at most " +
                             std::to_string(kMaxSweepPoints) + " estimates: give fewer batch sizes or sequence lengths (a fit needs a handful)",
                         req.batches.size() >= req.seqs.size() ? "batch" : "seq"};

        // Load once (as estimate(req) would).
        ModelGraph g;
        if (req.base.params_count) {
            if (*req.base.params_count <= 0) return Error{ErrorCode::InvalidArgument, "--params must be positive", "params"};
            g = params_only_graph(*req.base.params_count);
        } else {
            if (req.base.model.empty())
                return Error{ErrorCode::InvalidArgument, "no model given: name a preset (gpumem models), a config.json, a model folder, a layer-list JSON, or use --params", "model"};
            auto loaded = load_model(req.base.model, model_options(req.base));
            if (!loaded) return loaded.error();
            g = std::move(loaded).value();
        }

        const std::vector<std::int64_t> batches = req.batches.empty() ? std::vector<std::int64_t>{req.base.batch} : req.batches;
        std::vector<std::optional<std::int64_t>> seqs;
        if (req.seqs.empty()) seqs.push_back(req.base.seq);
        else for (auto s : req.seqs) seqs.emplace_back(s);

        const bool simulate = req.simulate && !req.base.analytic;
        SweepResult out;
        out.batches = batches;
        for (const auto& s : seqs) {
            for (const auto b : batches) {
                check_budget();
                EstimateRequest r = req.base;
                r.batch = b;
                r.seq = s;
                auto e = simulate ? simulate_estimate(g, r) : estimate(g, r);
                if (!e) {
                    Error err = e.error();
                    err.message = "batch " + std::to_string(b) + (s ? ", seq " + std::to_string(*s) : std::string()) + ": " + err.message;
                    return err;
                }
                const EstimateResult& er = e.value();
                if (out.points.empty()) {
                    out.model_name = er.model_name;
                    out.family = er.family;
                    out.gpu = er.gpu().name;
                    out.capacity = er.per_gpu.capacity;
                    out.request = er.request();
                    out.simulated = er.simulation.has_value();
                }
                SweepPoint p;
                p.batch = b;
                p.seq = er.seq();
                p.per_gpu = er.per_gpu;
                p.breakdown = er.breakdown;
                p.warnings = er.warnings;
                out.points.push_back(std::move(p));
            }
            out.seqs.push_back(out.points.back().seq);
        }
        out.fit = fit_sweep(out.points);
        return out;
    });
}

}  // namespace gpumem
