// gpumem/report/api.hpp — one JSON entry point for every front end.
//
// The HTTP service and the Python bindings call api_call() with a command
// name and a JSON body whose keys are the CLI's flag names ("model", "batch",
// "seq", "grad-accum" or "grad_accum", ...); it builds the same request
// structures the CLI builds and returns the same JSON the CLI prints with
// --format json. Errors come back as Error (code, message, field) for the
// front end to map (HTTP 4xx, Python ValueError).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/core/result.hpp"

namespace gpumem {

// Commands: estimate, params, fit, plan, sweep, advise, doctor, snapshot,
// models, gpus, timeline (estimate's simulated timeline).
// `snapshot` takes {"data": "<file bytes>"} (uploads) or, only when
// allow_paths is true (Python, not the HTTP service), {"path": "..."}.
Result<nlohmann::json> api_call(std::string_view command, const nlohmann::json& body, bool allow_paths = false);

// `snapshot` for raw uploaded bytes (a pickle is binary, not a JSON string):
// options takes "alloc-conf" and "device" as the snapshot command does.
Result<nlohmann::json> api_snapshot_bytes(std::string_view data, const nlohmann::json& options);

const std::vector<std::string>& api_commands();

}  // namespace gpumem
