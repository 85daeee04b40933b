#include "gpumem/report/fit_render.hpp"

#include <nlohmann/json.hpp>

namespace gpumem {

namespace {
nlohmann::json axis_json(const FitAxis& a) {
    return {{"axis", a.axis},
            {"largest", a.largest},
            {"probes", a.probes},
            {"total_device_at_largest", a.total_at_largest.count()},
            {"total_device_next", a.total_next.count()},
            {"capacity", a.capacity.count()},
            {"limit", a.limit}};
}
}  // namespace

nlohmann::json fit_to_json(const FitResult& r) {
    return {{"model", r.model}, {"gpu", r.gpu}, {"batch", axis_json(r.batch)}, {"seq", axis_json(r.seq)}, {"assumptions", r.assumptions}};
}

std::string render_fit(const FitResult& r, Format f) {
    if (f == Format::Json) return fit_to_json(r).dump(2) + "\n";
    Table t;
    t.header = {"axis", "largest that fits", "device memory there", "what stops the next step"};
    t.right_align = {false, true, true, false};
    for (const FitAxis* a : {&r.batch, &r.seq}) {
        if (a->axis.empty()) continue;
        t.rows.push_back({a->axis == "batch" ? "micro-batch" : "sequence length", a->largest > 0 ? std::to_string(a->largest) : "none",
                          a->largest > 0 ? format_bytes(a->total_at_largest) + " of " + format_bytes(a->capacity) : "-", a->limit});
    }
    if (f == Format::Csv || f == Format::Markdown) return render_table(t, f);
    std::string out = r.model + " on " + r.gpu + "\n\n" + render_table(t, f) + "\nassumptions:\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    return out;
}

}  // namespace gpumem
