// gpumem/model/graph_json.hpp — gpumem's model graph as a file.
//
// A model gpumem did not build itself (a traced PyTorch module, an imported
// ONNX graph, a graph edited by hand) reaches every command as one JSON
// document that holds the whole ModelGraph (model/graph.hpp): its blocks with
// their parameters, activation tensors (symbolic extents c0 + c1*s + c2*s^2
// per sample, dtype roles, aliases), ops with what autograd saves, attention
// sites, and the transformer facts the KV-cache and serving formulas read.
//
//   {"format": "gpumem-model-graph", "version": 1, "name": ..., "blocks": [...], ...}
//
// docs/model-graph.md documents every field. Writing then reading a graph
// gives the same graph (tests/graph_json_test.cpp checks it for every preset
// through the estimates). Reading is hostile-input safe: every index, enum
// and size is checked and a bad field is named in the error.
#pragma once
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

inline constexpr std::string_view kGraphFormat = "gpumem-model-graph";
inline constexpr int kGraphFormatVersion = 1;

// The graph as a document (deterministic key order).
nlohmann::json graph_to_json(const ModelGraph& g);

// Reads a document written by graph_to_json (or by gpumem.trace / an
// importer). `origin` names the file in error messages.
Result<ModelGraph> graph_from_json(const nlohmann::json& doc, std::string_view origin);

// True when a JSON document declares itself a gpumem model graph.
bool is_graph_json(const nlohmann::json& doc);

}  // namespace gpumem
