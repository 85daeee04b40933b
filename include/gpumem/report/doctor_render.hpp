// gpumem/report/doctor_render.hpp — prints the OOM doctor's diagnosis.
//
// Same conventions as render.hpp: the library computes (plan/doctor.hpp),
// these functions only format. JSON sizes are integers in bytes; text and
// Markdown print GiB for people; CSV is the ranked remedies table.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/doctor.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json oom_report_to_json(const OomReport& r);
nlohmann::json doctor_to_json(const DoctorResult& d);
std::string render_doctor(const DoctorResult& d, Format f);

}  // namespace gpumem
