// src/model/load.cpp — model spec dispatch, presets, HF configs, model
// folders (config.json + safetensors headers) and --params counts.
#include "gpumem/model/load.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "gpumem/model/safetensors.hpp"
#include "gpumem/model/transformer.hpp"
#include "load_internal.hpp"

namespace gpumem::embedded {
struct EmbeddedPreset {
    const char* name;
    const char* json;
};
extern const EmbeddedPreset kPresets[];
extern const std::size_t kPresetCount;
extern const char* const kPresetIndex;
}  // namespace gpumem::embedded

namespace gpumem {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------
// Shared helpers (load_internal.hpp)
// ---------------------------------------------------------------------------
namespace detail {

std::string read_text_file(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) fail(ErrorCode::NotFound, path, path + ": no such file");
    if (fs::is_directory(path, ec)) fail(ErrorCode::InvalidArgument, path, path + ": is a folder, expected a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::Io, path, path + ": cannot open the file for reading (check its permissions)");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(ErrorCode::Io, path, path + ": read error");
    return ss.str();
}

json parse_json_text(const std::string& text, std::string_view origin) {
    try {
        return json::parse(text);
    } catch (const json::parse_error& e) {
        // nlohmann: "[json.exception.parse_error.101] parse error at line 1, column 57:
        //            syntax error while parsing object - unexpected end of input; expected ..."
        std::string what = e.what();
        std::string reason = what;
        if (auto p = what.find("column "); p != std::string::npos) {
            if (auto c = what.find(": ", p); c != std::string::npos) reason = what.substr(c + 2);
        }
        if (auto p = reason.find(" - "); p != std::string::npos && reason.rfind("syntax error", 0) == 0)
            reason = reason.substr(p + 3);
        const bool truncated = reason.find("end of input") != std::string::npos;
        const std::string fix = truncated ? "check the file is complete" : "check the JSON syntax near that byte";
        fail(ErrorCode::ParseError, std::string(origin),
             std::string(origin) + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + reason + "; " + fix);
    }
}

json read_json_file(const std::string& path) {
    return parse_json_text(read_text_file(path), path);
}

const char* json_kind(const json& j) {
    switch (j.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::object:
            return "an object";
        case json::value_t::array:
            return "an array";
        case json::value_t::string:
            return "a string";
        case json::value_t::boolean:
            return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
            return "an integer";
        case json::value_t::number_float:
            return "a number";
        default:
            return "a value";
    }
}

}  // namespace detail

namespace {

__extension__ typedef __int128 i128;

std::string lower(std::string_view s) {
    std::string r(s);
    for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

struct PresetTable {
    std::vector<PresetInfo> infos;            // sorted by name
    std::map<std::string, const char*> text;  // name -> embedded config text
};

const PresetTable& preset_table() {
    static const PresetTable table = [] {
        PresetTable t;
        json index = json::object();
        try {
            index = json::parse(embedded::kPresetIndex);
        } catch (const json::exception&) {
            index = json::object();  // index is build-time data; a broken one only loses hf ids
        }
        for (std::size_t i = 0; i < embedded::kPresetCount; ++i) {
            const auto& p = embedded::kPresets[i];
            PresetInfo info;
            info.name = p.name;
            try {
                const json cfg = json::parse(p.json);
                if (cfg.contains("model_type") && cfg["model_type"].is_string())
                    info.model_type = cfg["model_type"].get<std::string>();
            } catch (const json::exception&) {
            }
            if (index.is_object() && index.contains(info.name) && index[info.name].is_object()) {
                const auto& e = index[info.name];
                if (e.contains("hf_id") && e["hf_id"].is_string()) info.hf_id = e["hf_id"].get<std::string>();
            }
            t.text[info.name] = p.json;
            t.infos.push_back(std::move(info));
        }
        std::sort(t.infos.begin(), t.infos.end(),
                  [](const PresetInfo& a, const PresetInfo& b) { return a.name < b.name; });
        return t;
    }();
    return table;
}

// Case-insensitive preset name or Hugging Face id -> canonical preset name.
std::optional<std::string> resolve_preset(std::string_view spec) {
    const std::string s = lower(spec);
    for (const auto& p : preset_table().infos)
        if (lower(p.name) == s || (!p.hf_id.empty() && lower(p.hf_id) == s)) return p.name;
    return std::nullopt;
}

std::vector<std::string> suggest_presets(std::string_view spec) {
    const std::string s = lower(spec);
    std::vector<std::pair<std::size_t, std::string>> scored;
    for (const auto& p : preset_table().infos) {
        const std::string n = lower(p.name);
        std::size_t d = edit_distance(s, n);
        // Also compare against the hf id's last path component ("Meta-Llama-3-8B").
        if (!p.hf_id.empty()) {
            std::string id = lower(p.hf_id);
            if (auto slash = id.rfind('/'); slash != std::string::npos) id = id.substr(slash + 1);
            d = std::min(d, edit_distance(s, id));
        }
        const bool substring = s.size() >= 3 && (n.find(s) != std::string::npos || s.find(n) != std::string::npos);
        const std::size_t limit = std::max<std::size_t>(2, s.size() / 3);
        if (d <= limit || substring) scored.emplace_back(substring ? std::min<std::size_t>(d, 1) : d, p.name);
    }
    std::sort(scored.begin(), scored.end());
    std::vector<std::string> out;
    for (const auto& [d, n] : scored) {
        if (out.size() == 4) break;
        out.push_back(n);
    }
    return out;
}

// Weight dtype from config.json: "torch_dtype" (or the newer "dtype" key).
DType config_weight_dtype(const json& config, std::vector<std::string>& notes) {
    for (const char* key : {"torch_dtype", "dtype"}) {
        if (!config.contains(key)) continue;
        const auto& v = config[key];
        if (v.is_string()) {
            if (auto t = parse_dtype(v.get<std::string>())) return *t;
            notes.push_back(std::string("config ") + key + " \"" + v.get<std::string>() +
                            "\" is not a concrete dtype; weights assumed float32");
            return DType::F32;
        }
    }
    notes.push_back("config.json has no torch_dtype: stored weights listed as float32 (gpumem params; estimates use --precision)");
    return DType::F32;
}

std::string path_stem_name(const std::string& path) {
    fs::path p(path);
    if (p.filename() == "config.json" && p.has_parent_path() && !p.parent_path().filename().empty())
        return p.parent_path().filename().string();
    return p.stem().string();
}

std::string dir_name(const std::string& dir) {
    fs::path p = fs::path(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    std::string n = p.filename().string();
    if (n.empty() || n == ".") {
        std::error_code ec;
        n = fs::absolute(dir, ec).lexically_normal().filename().string();
    }
    return n.empty() ? dir : n;
}

}  // namespace

// ---------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------
const std::vector<PresetInfo>& presets() {
    return preset_table().infos;
}

const char* preset_config_text(std::string_view name) {
    const auto canonical = resolve_preset(name);
    if (!canonical) return nullptr;
    const auto& t = preset_table().text;
    auto it = t.find(*canonical);
    return it == t.end() ? nullptr : it->second;
}

Result<ModelGraph> load_preset(std::string_view name) {
    const auto canonical = resolve_preset(name);
    if (!canonical) {
        std::string msg = "unknown preset \"" + std::string(name) + "\" (run 'gpumem models' for the list)";
        if (auto s = suggest_presets(name); !s.empty()) {
            msg += "; did you mean: ";
            for (std::size_t i = 0; i < s.size(); ++i) msg += (i ? ", " : "") + s[i];
            msg += "?";
        }
        return Error{ErrorCode::NotFound, msg, std::string(name)};
    }
    const char* text = preset_table().text.at(*canonical);
    return detail::guard([&]() -> Result<ModelGraph> {
        const json cfg = detail::parse_json_text(text, "preset " + *canonical);
        auto r = load_hf_config_json(cfg, "preset " + *canonical);
        if (!r) return r;
        ModelGraph g = std::move(r).value();
        g.name = *canonical;
        g.source = "preset";
        return g;
    });
}

// ---------------------------------------------------------------------------
// Hugging Face config.json
// ---------------------------------------------------------------------------
Result<ModelGraph> load_hf_config_json(const nlohmann::json& config, std::string_view origin) {
    return detail::guard([&]() -> Result<ModelGraph> {
        if (!config.is_object())
            fail(ErrorCode::ParseError, std::string(origin),
                 std::string(origin) + ": expected a JSON object (a Hugging Face config.json), got " +
                     detail::json_kind(config));
        auto spec = parse_hf_config(config, origin);
        if (!spec) return spec.error();
        std::vector<std::string> dtype_notes;
        const DType wdt = config_weight_dtype(config, dtype_notes);
        ModelGraph g = build_transformer(spec.value(), wdt);
        if (g.name.empty()) {
            if (config.contains("_name_or_path") && config["_name_or_path"].is_string() &&
                !config["_name_or_path"].get<std::string>().empty())
                g.name = config["_name_or_path"].get<std::string>();
            else
                g.name = std::string(origin);
        }
        g.source = "config.json";
        // build_transformer may already have copied the spec's notes; add the missing ones.
        for (const auto& n : spec.value().notes)
            if (std::find(g.notes.begin(), g.notes.end(), n) == g.notes.end()) g.notes.push_back(n);
        for (auto& n : dtype_notes) g.notes.push_back(std::move(n));
        return g;
    });
}

Result<ModelGraph> load_hf_config_file(const std::string& path) {
    return detail::guard([&]() -> Result<ModelGraph> {
        const json cfg = detail::read_json_file(path);
        auto r = load_hf_config_json(cfg, path);
        if (!r) return r;
        ModelGraph g = std::move(r).value();
        if (!(cfg.contains("_name_or_path") && cfg["_name_or_path"].is_string() &&
              !cfg["_name_or_path"].get<std::string>().empty()))
            g.name = path_stem_name(path);
        return g;
    });
}

// ---------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------
Result<ModelGraph> load_model(const std::string& spec) {
    if (spec.empty())
        return Error{ErrorCode::InvalidArgument,
                     "no model given: name a built-in preset (run 'gpumem models'), a config.json, a model folder "
                     "or a layer-list JSON",
                     "model"};
    std::error_code ec;
    if (fs::is_directory(spec, ec)) return load_model_dir(spec);
    if (fs::exists(spec, ec)) {
        return detail::guard([&]() -> Result<ModelGraph> {
            if (fs::path(spec).extension() == ".safetensors")
                fail(ErrorCode::InvalidArgument, spec,
                     spec +
                         ": a safetensors file alone has no architecture; pass the folder that holds it and its "
                         "config.json");
            const json doc = detail::read_json_file(spec);
            const bool has_layers = doc.is_object() && doc.contains("layers");
            const bool has_type = doc.is_object() && doc.contains("model_type");
            // A layer list has a "layers" array; an HF config with a scalar "layers" field is still a config.
            if (has_layers && (doc["layers"].is_array() || !has_type)) return load_layer_list_json(doc, spec);
            if (has_type) {
                auto r = load_hf_config_json(doc, spec);
                if (!r) return r;
                ModelGraph g = std::move(r).value();
                if (!(doc.contains("_name_or_path") && doc["_name_or_path"].is_string() &&
                      !doc["_name_or_path"].get<std::string>().empty()))
                    g.name = path_stem_name(spec);
                return g;
            }
            fail(ErrorCode::ParseError, spec,
                 spec +
                     ": not a model description: a Hugging Face config.json has \"model_type\" and a layer list "
                     "has \"layers\", this file has neither");
        });
    }
    if (resolve_preset(spec)) return load_preset(spec);

    std::string msg =
        "unknown model \"" + spec + "\": not a file, a folder or a built-in preset (run 'gpumem models' for the list)";
    if (auto s = suggest_presets(spec); !s.empty()) {
        msg += "; did you mean: ";
        for (std::size_t i = 0; i < s.size(); ++i) msg += (i ? ", " : "") + s[i];
        msg += "?";
    }
    return Error{ErrorCode::NotFound, msg, spec};
}

// ---------------------------------------------------------------------------
// Model folder: config.json + safetensors headers
// ---------------------------------------------------------------------------
namespace {

// Tensors stored in checkpoints that are buffers, not parameters
// (model.parameters() does not list them).
bool is_known_buffer(const std::string& name) {
    auto ends_with = [&](std::string_view suf) {
        return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    auto is_component = [&](std::string_view leaf) {  // exactly `leaf` or ending in ".leaf"
        return name == leaf || ends_with(std::string(".") + std::string(leaf));
    };
    return ends_with("rotary_emb.inv_freq") || is_component("attn.bias") || is_component("attn.masked_bias") ||
           ends_with("position_ids");
}

// Adds `n` params to a repeat-1 block so that total_params() grows by n.
void add_unattributed(ModelGraph& g, std::int64_t n) {
    Param p;
    p.name = "(unattributed from safetensors)";
    p.shape = {n};
    p.component = Component::Other;
    p.module = "(unattributed)";
    for (auto it = g.blocks.rbegin(); it != g.blocks.rend(); ++it) {
        if (it->repeat == 1) {
            p.dtype = it->params.empty() ? DType::F32 : it->params.front().dtype;
            it->params.push_back(std::move(p));
            return;
        }
    }
    Block b;
    b.name = "unattributed";
    b.tensors.push_back(TensorInfo{"(no input)", {}, ActRole::Stream, -1, {}});
    b.params.push_back(std::move(p));
    g.blocks.insert(g.blocks.begin(), std::move(b));
}

}  // namespace

Result<ModelGraph> load_model_dir(const std::string& dir) {
    return detail::guard([&]() -> Result<ModelGraph> {
        const fs::path root(dir);
        const fs::path config = root / "config.json";
        std::error_code ec;
        if (!fs::is_regular_file(config, ec))
            fail(ErrorCode::NotFound, dir,
                 dir +
                     ": no config.json in this folder; gpumem needs the model's config.json for the architecture "
                     "(download it next to the *.safetensors files)");
        auto r = load_hf_config_file(config.string());
        if (!r) return r;
        ModelGraph g = std::move(r).value();
        g.name = dir_name(dir);

        // Which safetensors files hold the weights.
        std::vector<fs::path> files;
        const fs::path index = root / "model.safetensors.index.json";
        if (fs::is_regular_file(index, ec)) {
            const json idx = detail::read_json_file(index.string());
            if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
                fail(ErrorCode::ParseError, index.string(),
                     index.string() + ": \"weight_map\" (tensor name -> shard file) is missing or not an object");
            std::set<std::string> shards;
            for (const auto& [tensor, file] : idx["weight_map"].items()) {
                if (!file.is_string())
                    fail(ErrorCode::ParseError, index.string(),
                         index.string() + ": weight_map[\"" + tensor + "\"] must be a file name (string)");
                shards.insert(file.get<std::string>());
            }
            for (const auto& s : shards) {
                const fs::path p = root / s;
                if (!fs::is_regular_file(p, ec))
                    fail(ErrorCode::NotFound, p.string(),
                         p.string() +
                             ": shard listed in model.safetensors.index.json is missing; download it (only "
                             "its header is read)");
                files.push_back(p);
            }
        } else if (fs::is_regular_file(root / "model.safetensors", ec)) {
            files.push_back(root / "model.safetensors");
        } else {
            for (const auto& e : fs::directory_iterator(root, ec))
                if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
            std::sort(files.begin(), files.end());
        }
        if (files.empty()) {
            g.notes.push_back("no *.safetensors in " + dir + ": parameter count from config.json");
            return g;
        }

        // Read each header once; the headers are the authority for what is stored.
        std::map<std::string, DType> tensor_dtype;  // counted tensors (deduplicated by name)
        std::map<std::string, std::int64_t> tensor_numel;
        std::vector<std::string> excluded;
        std::int64_t excluded_elems = 0;
        std::size_t n_tensors = 0;
        for (const auto& f : files) {
            auto h = read_safetensors_header(f.string());
            if (!h) return h.error();
            for (const auto& t : h.value().tensors) {
                ++n_tensors;
                if (is_known_buffer(t.name)) {
                    excluded.push_back(t.name);
                    excluded_elems = checked_add(excluded_elems, t.numel);
                    continue;
                }
                tensor_dtype[t.name] = t.dtype;
                tensor_numel[t.name] = t.numel;
            }
        }

        // Whether the graph has a separate lm_head (an untied head). A checkpoint
        // that stores lm_head.weight for a tied model holds the embedding twice;
        // model.parameters() lists it once.
        bool graph_has_lm_head = false;
        for (const auto& b : g.blocks)
            for (const auto& p : b.params)
                if (p.name.find("lm_head") != std::string::npos) graph_has_lm_head = true;
        if (!graph_has_lm_head && tensor_numel.count("lm_head.weight") && tensor_numel.size() > 1) {
            const bool has_embed = std::any_of(tensor_numel.begin(), tensor_numel.end(), [](const auto& kv) {
                return kv.first.find("embed_tokens.weight") != std::string::npos ||
                       kv.first.find("wte.weight") != std::string::npos ||
                       kv.first.find("word_embeddings.weight") != std::string::npos ||
                       kv.first.find("embed_in.weight") != std::string::npos || kv.first == "shared.weight";
            });
            if (has_embed) {
                tensor_numel.erase("lm_head.weight");
                tensor_dtype.erase("lm_head.weight");
                g.notes.push_back(
                    "safetensors stores lm_head.weight but the config ties it to the input embeddings: counted once");
            }
        }

        std::int64_t header_total = 0;
        std::map<DType, std::int64_t> count_by_dtype;
        std::map<DType, std::int64_t> bytes_by_dtype;
        for (const auto& [name, n] : tensor_numel) {
            header_total = checked_add(header_total, n);
            const DType dt = tensor_dtype[name];
            count_by_dtype[dt] = checked_add(count_by_dtype[dt], n);
            bytes_by_dtype[dt] = checked_add(bytes_by_dtype[dt], dtype_bytes(dt, n).count());
        }
        DType main_dtype = DType::F32;
        std::int64_t best = -1;
        for (const auto& [dt, by] : bytes_by_dtype)
            if (by > best) best = by, main_dtype = dt;
        g.header_dtype_counts.assign(count_by_dtype.begin(), count_by_dtype.end());

        // Per-parameter dtype: match graph names ("self_attn.q_proj.weight") to
        // checkpoint names ("model.layers.0.self_attn.q_proj.weight") by dotted
        // suffix, longest first; names with no match take the dominant dtype.
        std::unordered_map<std::string, std::map<DType, std::int64_t>> by_suffix;
        for (const auto& [name, dt] : tensor_dtype) {
            std::size_t pos = 0;
            for (;;) {
                const std::string suf = name.substr(pos);
                if (suf.find('.') == std::string::npos) break;  // keep at least "module.weight"
                by_suffix[suf][dt] += 1;
                pos = name.find('.', pos);
                if (pos == std::string::npos) break;
                ++pos;
            }
        }
        std::int64_t matched = 0, unmatched = 0;
        for (auto& b : g.blocks) {
            for (auto& p : b.params) {
                bool found = false;
                std::size_t pos = 0;
                while (!found) {
                    const std::string suf = p.name.substr(pos);
                    if (suf.find('.') == std::string::npos) break;
                    if (auto it = by_suffix.find(suf); it != by_suffix.end()) {
                        DType d = it->second.begin()->first;
                        std::int64_t c = -1;
                        for (const auto& [dt, k] : it->second)
                            if (k > c) c = k, d = dt;
                        p.dtype = d;
                        found = true;
                        break;
                    }
                    pos = p.name.find('.', pos);
                    if (pos == std::string::npos) break;
                    ++pos;
                }
                if (!found) p.dtype = main_dtype;
                (found ? matched : unmatched) += 1;
            }
        }

        const std::int64_t graph_total = g.total_params();
        const std::int64_t diff = header_total - graph_total;
        if (diff > 0) {
            // The checkpoint holds parameters the config-derived graph does not
            // know about: count them (the headers are the authority) as model
            // state with no activations.
            add_unattributed(g, diff);
            g.notes.push_back("safetensors headers hold " + std::to_string(header_total) + " parameters, " +
                              std::to_string(diff) + " more than the architecture from config.json (" +
                              std::to_string(graph_total) + "): added as \"(unattributed from safetensors)\"");
        } else if (diff < 0) {
            // Fewer stored than the architecture implies: a Param cannot hold a
            // negative count, and shrinking real layers would distort the
            // activation model, so the config count is kept and the gap reported.
            // Typical causes: quantized checkpoints packing several values per
            // stored element, or tensors derived at load time.
            g.notes.push_back("safetensors headers hold " + std::to_string(header_total) + " parameters, " +
                              std::to_string(-diff) + " fewer than the architecture from config.json (" +
                              std::to_string(graph_total) +
                              "); keeping the config count (packed/quantized weights or tensors built at load time)");
        }
        g.source = "safetensors";
        g.notes.push_back("parameter count from safetensors headers (" + std::to_string(n_tensors) + " tensors in " +
                          std::to_string(files.size()) + " files)");
        g.notes.push_back(std::string("weights stored as ") + std::string(dtype_name(main_dtype)) +
                          " (dominant dtype by bytes in the safetensors headers)");
        if (!excluded.empty()) {
            std::string ex = "excluded " + std::to_string(excluded.size()) + " buffer tensor(s) (" +
                             std::to_string(excluded_elems) + " elements) that are not parameters, e.g. " +
                             excluded.front();
            g.notes.push_back(ex);
        }
        if (unmatched > 0 && matched == 0)
            g.notes.push_back("no graph parameter name matched a checkpoint tensor name; all parameters take " +
                              std::string(dtype_name(main_dtype)));
        return g;
    });
}

// ---------------------------------------------------------------------------
// --params
// ---------------------------------------------------------------------------
ModelGraph params_only_graph(std::int64_t params) {
    ModelGraph g;
    g.name = std::to_string(params) + " parameters";
    g.family = "params-only";
    g.source = "--params";
    g.params_only = params;
    g.has_sequence = false;
    g.notes.push_back(
        "--params gives a parameter count only: model states (weights, gradients, optimizer) are "
        "estimated, activations are not modelled");
    return g;
}

Result<std::int64_t> parse_param_count(std::string_view text) {
    const std::string orig(text);
    auto bad = [&](const std::string& why) {
        return Error{ErrorCode::InvalidArgument,
                     "invalid parameter count \"" + orig + "\" (--params): " + why +
                         "; expected a positive number with an optional K/M/B/T suffix, e.g. 7B, 1.5e9, 125M",
                     "--params"};
    };
    std::string s;
    for (char c : text)
        if (!std::isspace(static_cast<unsigned char>(c)) && c != '_' && c != ',') s.push_back(c);
    if (s.empty()) return bad("empty");
    std::size_t i = 0;
    if (s[i] == '+') ++i;
    if (i < s.size() && s[i] == '-') return bad("a parameter count cannot be negative");
    // Mantissa digits as an exact integer with a decimal exponent.
    i128 mant = 0;
    int exp10 = 0;
    bool any_digit = false, overflow = false;
    auto push_digit = [&](char c) {
        if (mant > (static_cast<i128>(1) << 100)) {
            overflow = true;
            return;
        }
        mant = mant * 10 + (c - '0');
    };
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) push_digit(s[i++]), any_digit = true;
    if (i < s.size() && s[i] == '.') {
        ++i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
            push_digit(s[i++]);
            any_digit = true;
            --exp10;
        }
    }
    if (!any_digit) return bad("not a number");
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E') && i + 1 < s.size() &&
        (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '+' || s[i + 1] == '-')) {
        ++i;
        int sign = 1;
        if (s[i] == '+' || s[i] == '-') sign = s[i++] == '-' ? -1 : 1;
        if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return bad("bad exponent");
        int e = 0;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
            e = std::min(e * 10 + (s[i++] - '0'), 1000);
        }
        exp10 += sign * e;
    }
    if (i < s.size()) {
        const std::string suf = lower(s.substr(i));
        if (suf == "k")
            exp10 += 3;
        else if (suf == "m")
            exp10 += 6;
        else if (suf == "b" || suf == "g")
            exp10 += 9;
        else if (suf == "t")
            exp10 += 12;
        else
            return bad("unknown suffix \"" + s.substr(i) + "\"");
    }
    if (overflow)
        return Error{ErrorCode::Overflow, "parameter count \"" + orig + "\" (--params) does not fit in 64 bits", "--params"};
    const i128 limit = static_cast<i128>(INT64_MAX);
    while (exp10 > 0 && mant != 0) {
        mant *= 10;
        --exp10;
        if (mant > limit)
            return Error{ErrorCode::Overflow, "parameter count \"" + orig + "\" (--params) does not fit in 64 bits", "--params"};
    }
    if (exp10 < 0) {
        i128 div = 1;
        while (exp10 < 0 && div < limit) div *= 10, ++exp10;
        if (exp10 < 0)
            mant = 0;
        else
            mant = (mant + div / 2) / div;  // round to the nearest whole parameter
    }
    if (mant > limit)
        return Error{ErrorCode::Overflow, "parameter count \"" + orig + "\" (--params) does not fit in 64 bits", "--params"};
    if (mant <= 0) return bad("a model needs at least one parameter");
    return static_cast<std::int64_t>(mant);
}

}  // namespace gpumem
