// gpumem/report/compat_render.hpp — prints the compatibility reports
// (plan/compat.hpp): DeepSpeed's ZeRO estimator table and Megatron-LM's
// theoretical memory report.
//
// DeepSpeed JSON (deepspeed_rows_to_json):
//   {"tool": "estimate_zero3_model_states_mem_needs_all_cold", "stage": 3,
//    "model": "...",                      (only for _all_live)
//    "params": P, "largest_layer_params": L (stage 3 only),
//    "gpus_per_node": G, "nodes": N, "additional_buffer_factor": 1.5,
//    "rows": [{"offload_param": "cpu"|"none", "offload_optimizer": "cpu"|"none",
//              "zero_init": 1|0, "cpu_bytes": int, "gpu_bytes": int}, ...]}
// Stage-2 rows carry "offload_optimizer" only. Devices are DeepSpeed's
// OffloadDeviceEnum values ("cpu"/"none", unpadded); zero_init is 1/0 as the
// printout shows it. Rows are in DeepSpeed's print order.
// Text is DeepSpeed's printout verbatim; Markdown and CSV are tables.
//
// Megatron JSON (megatron_to_json): the three results in bytes (integers,
// Megatron's floats rounded to the nearest byte) and in MB (Megatron's own
// floats, MB = 2^20 bytes), the parameter counts of its verbose output and the
// arguments used. Text is Megatron's verbose printout verbatim.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/compat.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

nlohmann::json deepspeed_rows_to_json(const DeepSpeedEstimate& e);
std::string render_deepspeed(const DeepSpeedEstimate& e, Format f);

nlohmann::json megatron_args_to_json(const MegatronArgs& a);
nlohmann::json megatron_to_json(const MegatronMemoryReport& r);
std::string render_megatron(const MegatronMemoryReport& r, Format f);

}  // namespace gpumem
