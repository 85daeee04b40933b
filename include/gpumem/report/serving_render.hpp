// gpumem/report/serving_render.hpp — prints `gpumem serving` results.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/memory/serving.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json serving_to_json(const ServingResult& r);
std::string render_serving(const ServingResult& r, Format f);

}  // namespace gpumem
