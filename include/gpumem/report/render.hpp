// gpumem/report/render.hpp — turns library results into text, JSON, CSV or Markdown.
//
// Computing is separate from printing: every function here takes a result
// the library already computed and only formats it. The JSON documents are
// the response schema shared by the CLI (--format json), the HTTP service
// and the Python bindings. Output order is deterministic.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/model/graph.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/plan/compute.hpp"

namespace gpumem {

enum class Format { Text, Json, Csv, Markdown };
Result<Format> parse_format(std::string_view s);

nlohmann::json estimate_to_json(const EstimateResult& r, const ComputeResult* time = nullptr);
nlohmann::json params_to_json(const ModelGraph& g, const ParamSummary& s);
nlohmann::json models_to_json(const std::vector<PresetInfo>& p);
nlohmann::json gpus_to_json(const std::vector<GpuSpec>& g);
nlohmann::json error_to_json(const Error& e);

std::string render_estimate(const EstimateResult& r, Format f, const ComputeResult* time = nullptr);
std::string render_params(const ModelGraph& g, const ParamSummary& s, Format f);
std::string render_models(const std::vector<PresetInfo>& p, Format f);
std::string render_gpus(const std::vector<GpuSpec>& g, Format f);

// A generic table: text (aligned), CSV (RFC 4180 quoting) or Markdown.
struct Table {
    std::vector<std::string> header;
    std::vector<std::vector<std::string>> rows;
    std::vector<bool> right_align;  // per column
};
std::string render_table(const Table& t, Format f);

}  // namespace gpumem
