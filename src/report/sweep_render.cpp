#include "gpumem/report/sweep_render.hpp"

#include "svg_util.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

using json = nlohmann::json;

std::string gib2(Bytes b) { return fmt::format("{:.2f}", b.gib()); }

json fit_json(const PolyFit& f) { return {{"coef", f.coef}, {"r2", f.r2}, {"formula", format_fit(f)}}; }

using svg::esc;
using svg::nice_step;

constexpr std::array<const char*, kSweepComponents> kColors{"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#bab0ac"};

std::string fit_line_text(const SweepFit& f) {
    return fmt::format("fit vs {} ({} {}): {} (R² {:.4f}, {})", f.axis == "batch" ? "batch size" : "sequence length",
                       f.axis == "batch" ? "seq" : "batch", f.fixed, f.formula, f.chosen().r2, f.quadratic_chosen ? "quadratic" : "linear");
}

}  // namespace

const std::array<const char*, kSweepComponents>& sweep_component_names() {
    static const std::array<const char*, kSweepComponents> names{"weights", "gradients", "optimizer states", "activations", "KV cache", "other"};
    return names;
}

std::array<Bytes, kSweepComponents> sweep_stack(const SweepPoint& p) {
    std::array<Bytes, kSweepComponents> s{};
    Bytes sum;
    for (const auto& row : p.breakdown) {
        std::size_t i = 5;
        if (row.key == "weights" || row.key == "adapter_weights") i = 0;
        else if (row.key == "gradients") i = 1;
        else if (row.key == "optimizer_states" || row.key == "master_weights") i = 2;
        else if (row.key == "activations" || row.key == "activation_gradients") i = 3;
        else if (row.key == "kv_cache") i = 4;
        if (i == 5) continue;
        s[i] += row.bytes;
        sum += row.bytes;
    }
    // Everything else, so that the stack is exactly the total on the device
    // (also when a breakdown is empty or does not sum to it).
    s[5] = p.per_gpu.total_device - sum;
    return s;
}

json sweep_to_json(const SweepResult& r) {
    json pts = json::array();
    for (const auto& p : r.points) {
        const auto& g = p.per_gpu;
        json rows = json::array();
        for (const auto& b : p.breakdown) rows.push_back({{"key", b.key}, {"label", b.label}, {"bytes", b.bytes.count()}});
        pts.push_back({{"batch", p.batch},
                       {"seq", p.seq},
                       {"weights", g.weights.count()},
                       {"gradients", g.gradients.count()},
                       {"optimizer_states", g.optimizer_states.count()},
                       {"activations", g.activations.count()},
                       {"kv_cache", g.kv_cache.count()},
                       {"peak_allocated", g.peak_allocated.count()},
                       {"peak_reserved", g.peak_reserved.count()},
                       {"total_device", g.total_device.count()},
                       {"fits", g.fits},
                       {"peak_phase", g.peak_phase},
                       {"breakdown", std::move(rows)},
                       {"warnings", p.warnings}});
    }
    json fit = nullptr;
    if (r.fit) {
        const auto& f = *r.fit;
        fit = {{"axis", f.axis},
               {"fixed", f.fixed},
               {"unit", "MB (2^20 bytes)"},
               {"chosen", f.quadratic_chosen ? "quadratic" : "linear"},
               {"formula", f.formula},
               {"linear", fit_json(f.linear)},
               {"quadratic", f.quadratic ? fit_json(*f.quadratic) : json(nullptr)},
               {"quadratic_share", f.quadratic_share},
               {"peak_phase", f.peak_phase},
               {"excluded", f.excluded},
               {"note", f.note}};
    }
    return {{"model", r.model_name},
            {"family", r.family},
            {"gpu", r.gpu},
            {"capacity", r.capacity.count()},
            {"simulated", r.simulated},
            {"batches", r.batches},
            {"seqs", r.seqs},
            {"points", std::move(pts)},
            {"fit", std::move(fit)}};
}

std::string render_sweep(const SweepResult& r, Format f) {
    if (f == Format::Json) return sweep_to_json(r).dump(2) + "\n";
    Table t;
    const bool csv = f == Format::Csv;
    if (csv)
        t.header = {"batch", "seq", "weights_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes", "kv_cache_bytes",
                    "peak_allocated_bytes", "peak_reserved_bytes", "total_device_bytes", "fits"};
    else
        t.header = {"batch", "seq", "weights", "grads", "optimizer", "activations", "kv", "peak allocated", "reserved", "total", "fits"};
    t.right_align = {true, true, true, true, true, true, true, true, true, true, false};
    for (const auto& p : r.points) {
        const auto& g = p.per_gpu;
        auto cell = [&](Bytes b) { return csv ? std::to_string(b.count()) : gib2(b); };
        t.rows.push_back({std::to_string(p.batch), std::to_string(p.seq), cell(g.weights), cell(g.gradients), cell(g.optimizer_states),
                          cell(g.activations), cell(g.kv_cache), cell(g.peak_allocated), cell(g.peak_reserved), cell(g.total_device),
                          csv ? (g.fits ? "true" : "false") : (g.fits ? "yes" : "NO")});
    }
    if (csv) return render_table(t, f);
    const std::string head = fmt::format("{} ({}) on {} ({}): {} point{}, {} peaks; sizes in GiB", r.model_name, r.family, r.gpu,
                                         format_bytes(r.capacity), r.points.size(), r.points.size() == 1 ? "" : "s",
                                         r.simulated ? "simulated" : "analytic");
    std::string out = f == Format::Markdown ? "### " + head + "\n\n" : head + "\n\n";
    out += render_table(t, f);
    if (r.fit) {
        const auto& ft = *r.fit;
        out += "\n" + std::string(f == Format::Markdown ? "**" : "") + fit_line_text(ft) + (f == Format::Markdown ? "**" : "") + "\n";
        if (f == Format::Markdown) out += "\n";
        out += fmt::format("{}linear:    {} (R² {:.6f})\n", f == Format::Markdown ? "- " : "  ", format_fit(ft.linear), ft.linear.r2);
        if (ft.quadratic)
            out += fmt::format("{}quadratic: {} (R² {:.6f}; x² term {:.2f}% of the value at the largest {})\n", f == Format::Markdown ? "- " : "  ",
                               format_fit(*ft.quadratic), ft.quadratic->r2, 100 * ft.quadratic_share, ft.axis);
        if (!ft.note.empty()) out += (f == Format::Markdown ? "- " : "  ") + ft.note + "\n";
    }
    std::vector<std::string> warnings;
    for (const auto& p : r.points)
        for (const auto& w : p.warnings)
            if (std::find(warnings.begin(), warnings.end(), w) == warnings.end()) warnings.push_back(w);
    if (!warnings.empty()) {
        out += "\n" + std::string(f == Format::Markdown ? "**Warnings:**\n\n" : "Warnings:\n");
        for (const auto& w : warnings) out += "- " + w + "\n";
    }
    return out;
}

std::string render_sweep_svg(const SweepResult& r, const std::string& title, Bytes capacity) {
    const double W = 960, H = 560, L = 80, R = 30, T = 104, B = 80;
    const double pw = W - L - R, ph = H - T - B;
    const auto& names = sweep_component_names();

    std::vector<std::array<Bytes, kSweepComponents>> stacks;
    std::array<bool, kSweepComponents> present{};
    double ymax = 0;
    for (const auto& p : r.points) {
        stacks.push_back(sweep_stack(p));
        for (std::size_t i = 0; i < kSweepComponents; ++i)
            if (stacks.back()[i] > Bytes(0)) present[i] = true;
        ymax = std::max(ymax, p.per_gpu.total_device.gib());
    }
    const double data_max = ymax;
    const bool cap_on_scale = capacity > Bytes(0) && capacity.gib() <= 2.5 * std::max(data_max, 1e-9);
    if (cap_on_scale) ymax = std::max(ymax, capacity.gib());
    if (ymax <= 0) ymax = 1;
    const double ystep = nice_step(ymax * 1.05, 6);
    const double ytop = std::ceil(ymax * 1.05 / ystep) * ystep;
    auto Y = [&](double g) { return T + ph * (1.0 - g / ytop); };

    // Bar positions. One varying axis (or a single point): x to scale.
    // Both varying: one group per seq, one bar per batch in it.
    const bool grouped = r.batches.size() > 1 && r.seqs.size() > 1;
    const bool by_seq = !grouped && r.batches.size() <= 1 && r.seqs.size() > 1;
    auto xval = [&](const SweepPoint& p) { return static_cast<double>(by_seq ? p.seq : p.batch); };
    std::vector<double> cx(r.points.size());
    double bw = 40;
    double xlo = 0, xhi = 1;
    auto X = [&](double v) { return L + pw * (v - xlo) / (xhi - xlo); };
    if (grouped) {
        const double nb = static_cast<double>(r.batches.size()), ng = static_cast<double>(r.seqs.size());
        const double slot = pw / (ng * (nb + 1));
        bw = std::min(60.0, slot * 0.8);
        for (std::size_t i = 0; i < r.points.size(); ++i) {
            const double gi = static_cast<double>(i / r.batches.size()), bi = static_cast<double>(i % r.batches.size());
            cx[i] = L + slot * (gi * (nb + 1) + 1.0 + bi);
        }
    } else {
        std::vector<double> xs;
        for (const auto& p : r.points) xs.push_back(xval(p));
        std::sort(xs.begin(), xs.end());
        double gap = xs.size() > 1 ? xs.back() - xs.front() : std::max(1.0, xs.empty() ? 1.0 : xs.front());
        for (std::size_t i = 1; i < xs.size(); ++i) gap = std::min(gap, xs[i] - xs[i - 1]);
        xlo = xs.empty() ? 0.0 : std::max(0.0, xs.front() - gap);
        xhi = xs.empty() ? 1.0 : xs.back() + 0.6 * gap;
        if (xhi <= xlo) xhi = xlo + 1;
        bw = std::clamp(0.7 * pw * gap / (xhi - xlo), 4.0, 60.0);
        for (std::size_t i = 0; i < r.points.size(); ++i) cx[i] = X(xval(r.points[i]));
    }

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H, W, H);
    o += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
    o += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", L, esc(title));
    o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">total on the device at the peak ({} peaks), stacked by what is live then</text>\n",
                     L, 40, r.simulated ? "simulated" : "analytic");

    // Legend: components present, capacity, fit.
    {
        double lx = L, ly = 52;
        // swatch(x, y) draws the key at (x, y); items wrap onto a second row.
        auto item = [&](const auto& swatch, const std::string& label) {
            const double w = 18 + 6.6 * static_cast<double>(label.size()) + 16;
            if (lx + w > W - R && lx > L) {
                lx = L;
                ly += 18;
            }
            o += swatch(lx, ly) + fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", lx + 18, ly + 10, esc(label));
            lx += w;
        };
        for (std::size_t i = 0; i < kSweepComponents; ++i) {
            if (!present[i]) continue;
            const std::string label = i == 5 ? "other (transients, allocator cache, CUDA context)" : names[i];
            item([&](double x, double y) { return fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>", x, y, kColors[i]); }, label);
        }
        if (cap_on_scale)
            item([](double x, double y) { return fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"2\" stroke-dasharray=\"4,3\"/>", x, y + 6, x + 14, y + 6); },
                 "GPU capacity");
        if (r.fit && !grouped)
            item([](double x, double y) { return fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#222\" stroke-width=\"2\"/>", x, y + 6, x + 14, y + 6); }, "fit");
    }

    // Grid and y axis.
    for (double g = 0; g <= ytop + 1e-9; g += ystep) {
        o += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", L, Y(g), L + pw, Y(g));
        o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g} GiB</text>\n", L - 6, Y(g) + 4, g);
    }
    o += fmt::format("<text transform=\"translate(18,{:.1f}) rotate(-90)\" text-anchor=\"middle\">memory per GPU (GiB)</text>\n", T + ph / 2);

    // Bars.
    for (std::size_t i = 0; i < r.points.size(); ++i) {
        const auto& p = r.points[i];
        double acc = 0;
        for (std::size_t c = 0; c < kSweepComponents; ++c) {
            const Bytes b = stacks[i][c];
            if (b <= Bytes(0)) continue;
            const double y0 = Y(acc), y1 = Y(acc + b.gib());
            o += fmt::format(
                "<rect class=\"seg\" x=\"{:.1f}\" y=\"{:.2f}\" width=\"{:.1f}\" height=\"{:.2f}\" fill=\"{}\"><title>batch {}, seq {}: {} {}</title></rect>\n",
                cx[i] - bw / 2, y1, bw, std::max(0.0, y0 - y1), kColors[c], p.batch, p.seq, names[c], esc(format_bytes(b)));
            acc += b.gib();
        }
        if (bw >= 24)
            o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\">{:.1f}{}</text>\n", cx[i],
                             Y(p.per_gpu.total_device.gib()) - 4, p.per_gpu.fits ? "#333" : "#c00", p.per_gpu.total_device.gib(),
                             p.per_gpu.fits ? "" : " ✗");
    }

    // x axis, ticks and labels.
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", L, T + ph, L + pw, T + ph);
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", L, T, L, T + ph);
    if (grouped) {
        for (std::size_t i = 0; i < r.points.size(); ++i)
            o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n", cx[i], T + ph + 14, r.points[i].batch);
        for (std::size_t gi = 0; gi < r.seqs.size(); ++gi) {
            const double a = cx[gi * r.batches.size()], b = cx[gi * r.batches.size() + r.batches.size() - 1];
            o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-weight=\"bold\">seq {}</text>\n", (a + b) / 2, T + ph + 32,
                             r.seqs[gi]);
        }
        o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">batch size (sequences per GPU), grouped by sequence length (tokens)</text>\n",
                         L + pw / 2, H - 14);
    } else {
        std::vector<std::size_t> order(r.points.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cx[a] < cx[b]; });
        double last = -1e9;
        for (std::size_t i : order) {
            o += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#333\"/>\n", cx[i], T + ph, cx[i], T + ph + 4);
            if (cx[i] - last < 30) continue;
            o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", cx[i], T + ph + 18,
                             by_seq ? r.points[i].seq : r.points[i].batch);
            last = cx[i];
        }
        const std::string axis = by_seq ? fmt::format("sequence length (tokens), batch {}", r.points.empty() ? 0 : r.points.front().batch)
                                        : fmt::format("batch size (sequences per GPU), seq {}", r.points.empty() ? 0 : r.points.front().seq);
        o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, H - 40, esc(axis));
    }

    // Capacity.
    if (capacity > Bytes(0)) {
        if (cap_on_scale) {
            o += fmt::format("<line class=\"capacity\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c00\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
                             L, Y(capacity.gib()), L + pw, Y(capacity.gib()));
            const std::string label = "GPU capacity " + format_bytes(capacity) + " (" + r.gpu + ")";
            const double lw = 6.8 * static_cast<double>(label.size());
            o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"15\" fill=\"white\" fill-opacity=\"0.85\"/>\n", L + pw - 6 - lw,
                             Y(capacity.gib()) - 18, lw + 4);
            o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#c00\">{}</text>\n", L + pw - 4, Y(capacity.gib()) - 6, esc(label));
        } else {
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#c00\">GPU capacity {} ({}) is above the top of the plot</text>\n",
                             L + pw - 4, T - 6, esc(format_bytes(capacity)), esc(r.gpu));
        }
    }

    // Fitted curve and its formula.
    if (r.fit && !grouped && !r.points.empty()) {
        const auto& f = *r.fit;
        double lo = 1e300, hi = -1e300;
        for (const auto& p : r.points) {
            if (std::find(f.excluded.begin(), f.excluded.end(), by_seq ? p.seq : p.batch) != f.excluded.end()) continue;
            lo = std::min(lo, xval(p));
            hi = std::max(hi, xval(p));
        }
        std::string pts;
        for (int k = 0; k <= 80; ++k) {
            const double x = lo + (hi - lo) * k / 80.0;
            pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(f.chosen()(x) / 1024.0));
        }
        o += fmt::format("<polyline class=\"fit\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\" points=\"{}\"/>\n", pts);
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#222\">{}</text>\n", L + 8, T + 16,
                         esc(fmt::format("fit: total = {} ({}, R² {:.4f})", f.formula, f.quadratic_chosen ? "quadratic" : "linear", f.chosen().r2)));
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\" font-size=\"11\">x = {}, MB = 2^20 bytes{}</text>\n", L + 8, T + 31,
                         f.axis == "batch" ? "batch size" : "sequence length", esc(f.note.empty() ? std::string() : "; " + f.note));
    }
    o += "</svg>\n";
    return o;
}

}  // namespace gpumem
