// gpumem/report/timeline_render.hpp — the simulated memory timeline as CSV,
// JSON or an SVG plot a person can read (allocated and reserved over the
// step's events, phases shaded and labelled, the peak marked).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/memory/estimate.hpp"

namespace gpumem {

std::string render_timeline_csv(const SimulationSummary& s);
nlohmann::json timeline_to_json(const SimulationSummary& s);
std::string render_timeline_svg(const SimulationSummary& s, const std::string& title, Bytes capacity);

}  // namespace gpumem
