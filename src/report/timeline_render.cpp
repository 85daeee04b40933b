#include "gpumem/report/timeline_render.hpp"

#include "svg_util.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

std::string render_timeline_csv(const SimulationSummary& s) {
    std::string out = "event,step,phase,allocated_bytes,reserved_bytes\n";
    for (const auto& p : s.timeline)
        out += fmt::format("{},{},{},{},{}\n", p.event, p.step + 1, p.phase, p.allocated.count(), p.reserved.count());
    return out;
}

nlohmann::json timeline_to_json(const SimulationSummary& s) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : s.timeline)
        pts.push_back({{"event", p.event}, {"step", p.step + 1}, {"phase", p.phase}, {"allocated", p.allocated.count()}, {"reserved", p.reserved.count()}});
    return {{"allocator", s.allocator}, {"events", s.events}, {"timeline", pts}};
}

namespace {
using svg::esc;
using svg::nice_step;
}  // namespace

std::string render_timeline_svg(const SimulationSummary& s, const std::string& title, Bytes capacity) {
    const double W = 960, H = 480, L = 80, R = 20, T = 50, B = 60;
    const double pw = W - L - R, ph = H - T - B;
    double ymax = 0;
    std::int64_t xmax = 1;
    for (const auto& p : s.timeline) {
        ymax = std::max({ymax, p.allocated.gib(), p.reserved.gib()});
        xmax = std::max(xmax, p.event);
    }
    const bool show_cap = capacity > Bytes(0) && capacity.gib() < ymax * 1.6;
    if (show_cap) ymax = std::max(ymax, capacity.gib());
    if (ymax <= 0) ymax = 1;
    const double ystep = nice_step(ymax, 6);
    const double ytop = std::ceil(ymax / ystep) * ystep;
    auto X = [&](double e) { return L + pw * e / static_cast<double>(xmax); };
    auto Y = [&](double g) { return T + ph * (1.0 - g / ytop); };

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H, W, H);
    o += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
    o += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", L, esc(title));
    // Phase bands.
    const char* fills[] = {"#f3f6fb", "#fbf7f0"};
    std::size_t band = 0;
    for (std::size_t i = 0; i < s.timeline.size();) {
        std::size_t j = i;
        while (j + 1 < s.timeline.size() && s.timeline[j + 1].phase == s.timeline[i].phase && s.timeline[j + 1].step == s.timeline[i].step) ++j;
        const double x0 = X(static_cast<double>(s.timeline[i].event));
        const double x1 = X(static_cast<double>(j + 1 < s.timeline.size() ? s.timeline[j + 1].event : s.timeline[j].event));
        o += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>\n", x0, T, std::max(0.5, x1 - x0), ph, fills[band++ % 2]);
        if (x1 - x0 > 40)
            o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{} {}</text>\n", (x0 + x1) / 2, T + 14,
                             esc(s.timeline[i].phase), s.timeline[i].step + 1);
        i = j + 1;
    }
    // Axes and grid.
    for (double g = 0; g <= ytop + 1e-9; g += ystep) {
        o += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", L, Y(g), L + pw, Y(g));
        o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g} GiB</text>\n", L - 6, Y(g) + 4, g);
    }
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", L, T + ph, L + pw, T + ph);
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", L, T, L, T + ph);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">allocator events (alloc/free) in execution order</text>\n", L + pw / 2, H - 20);
    if (show_cap) {
        o += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c00\" stroke-dasharray=\"6,4\"/>\n", L, Y(capacity.gib()), L + pw, Y(capacity.gib()));
        o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#c00\">GPU capacity</text>\n", L + pw - 4, Y(capacity.gib()) - 4);
    }
    auto line = [&](bool reserved, const char* color) {
        std::string pts;
        for (const auto& p : s.timeline)
            pts += fmt::format("{:.1f},{:.1f} ", X(static_cast<double>(p.event)), Y(reserved ? p.reserved.gib() : p.allocated.gib()));
        return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, pts);
    };
    if (s.allocator == "pytorch") o += line(true, "#e08a00");
    o += line(false, "#1f5fbf");
    // Peak marker.
    const SimulationSummary::Sample* peak = nullptr;
    for (const auto& p : s.timeline)
        if (!peak || p.allocated > peak->allocated) peak = &p;
    if (peak) {
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#1f5fbf\"/>\n", X(static_cast<double>(peak->event)), Y(peak->allocated.gib()));
        o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#1f5fbf\">peak {} ({} {})</text>\n", X(static_cast<double>(peak->event)) + 6,
                         Y(peak->allocated.gib()) - 6, esc(format_bytes(peak->allocated)), esc(peak->phase), peak->step + 1);
    }
    // Legend.
    o += fmt::format("<rect x=\"{}\" y=\"32\" width=\"12\" height=\"3\" fill=\"#1f5fbf\"/><text x=\"{}\" y=\"38\">allocated (max_memory_allocated)</text>\n", L + 360, L + 376);
    if (s.allocator == "pytorch")
        o += fmt::format("<rect x=\"{}\" y=\"32\" width=\"12\" height=\"3\" fill=\"#e08a00\"/><text x=\"{}\" y=\"38\">reserved (max_memory_reserved)</text>\n", L + 600, L + 616);
    o += "</svg>\n";
    return o;
}

}  // namespace gpumem
