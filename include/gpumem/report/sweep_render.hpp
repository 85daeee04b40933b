// gpumem/report/sweep_render.hpp — a batch/sequence sweep (plan/sweep.hpp)
// as a table (text, Markdown, CSV), a JSON document, or an SVG plot.
//
// Table: one row per point (seq outer, batch inner) with the per-GPU fields
// (weights, gradients, optimizer states, saved activations, KV cache, peak
// allocated, peak reserved, total on the device, fits); GiB with two decimals
// in text and Markdown, integer bytes in CSV. Text and Markdown end with the
// fitted curve when one axis varies.
//
// JSON: {"model", "family", "gpu", "capacity", "simulated", "batches",
// "seqs", "points": [{"batch", "seq", "weights", ..., "fits", "peak_phase",
// "breakdown": [{"key", "label", "bytes"}]}], "fit": {...} or null}; byte
// fields are integers, fit coefficients are MB (2^20 bytes).
//
// SVG: stacked bars of what is live at each point's peak (its breakdown rows,
// which sum to total_device) grouped into weights, gradients, optimizer
// states (incl. fp32 master weights), activations (incl. activation
// gradients), KV cache and other (transients, workspaces, allocator caching,
// CUDA context). When one axis varies the x axis is that axis, to scale, with
// the fitted curve and its formula; when both vary there is one group of bars
// per sequence length (in sweep order) and one bar per batch size inside it.
// The GPU capacity is a dashed red line (or a note, when it is more than 2.5×
// the largest total and would flatten the bars). Every stacked segment is one
// <rect class="seg"> with a <title> tooltip.
#pragma once

#include <array>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/plan/sweep.hpp"
#include "gpumem/report/render.hpp"

namespace gpumem {

constexpr std::size_t kSweepComponents = 6;
// "weights", "gradients", "optimizer states", "activations", "KV cache", "other".
const std::array<const char*, kSweepComponents>& sweep_component_names();
// The point's breakdown summed into the six components (sums to total_device).
std::array<Bytes, kSweepComponents> sweep_stack(const SweepPoint& p);

nlohmann::json sweep_to_json(const SweepResult& r);
std::string render_sweep(const SweepResult& r, Format f);
std::string render_sweep_svg(const SweepResult& r, const std::string& title, Bytes capacity);

}  // namespace gpumem
