// gpumem/report/plan_render.hpp — prints `gpumem plan` results.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/planner.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json plan_to_json(const PlanResult& r);
std::string render_plan(const PlanResult& r, Format f);

}  // namespace gpumem
