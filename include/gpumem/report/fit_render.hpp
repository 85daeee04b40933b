// gpumem/report/fit_render.hpp — prints `gpumem fit` results.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/fit.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json fit_to_json(const FitResult& r);
std::string render_fit(const FitResult& r, Format f);

}  // namespace gpumem
