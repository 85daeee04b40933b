// gpumem/report/calibrate_render.hpp — prints `gpumem calibrate`'s answer:
// JSON is the calibration file itself (with the estimate before and after),
// so `--format json > calib.json` saves it for --calibration.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/calibrate.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json calibrate_to_json(const CalibrateResult& r);
std::string render_calibrate(const CalibrateResult& r, Format f);

}  // namespace gpumem
