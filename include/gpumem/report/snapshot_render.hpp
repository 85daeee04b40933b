// gpumem/report/snapshot_render.hpp — output of `gpumem snapshot FILE`.
//
// The summary of a real PyTorch memory snapshot (state at the dump) and, when
// given, the replay of its event trace through the allocator model. JSON top
// level: integers peak_allocated / peak_reserved (from the replay when there
// is one, else the state at the dump: peak_source says which), then
// "snapshot" (state figures), "segment_sizes", "top_allocations", "traces",
// "ooms", "allocator_settings", "trace_conversion", "replay", "notes".
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/report/render.hpp"
#include "gpumem/sim/snapshot.hpp"

namespace gpumem {

nlohmann::json snapshot_to_json(const sim::SnapshotSummary& s, const sim::ReplayResult* replay);
std::string render_snapshot(const sim::SnapshotSummary& s, const sim::ReplayResult* replay, Format f);

}  // namespace gpumem
