// gpumem/report/advice_render.hpp — prints `gpumem advise` results: seed 001's
// method | speed | memory table with the user's own numbers.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/advisor.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json advice_to_json(const AdviceResult& r);
std::string render_advice(const AdviceResult& r, Format f);

}  // namespace gpumem
