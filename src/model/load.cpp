// src/model/load.cpp — model spec dispatch, presets, HF configs, model
// folders (config.json + safetensors headers) and --params counts.
#include "gpumem/model/load.hpp"
#include "gpumem/model/graph_json.hpp"
#include "gpumem/core/input.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdlib>
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

std::string read_text_file(const std::string& path, std::string_view what) {
    // Regular files only (a FIFO or /dev/zero would never end), at most
    // kMaxConfigBytes: no model description comes near that size.
    return read_input_file(path, kMaxConfigBytes, what);
}

json parse_json_text(const std::string& text, std::string_view origin) {
    check_json_depth(text, origin);
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

Error fs_error(const std::filesystem::filesystem_error& e) {
    const std::string path = !e.path1().empty() ? e.path1().string() : std::string("model folder");
    if (e.code() == std::errc::too_many_symbolic_link_levels)
        return Error{ErrorCode::InvalidArgument,
                     path + ": too many levels of symbolic links (a link loop?); remove the loop or give the real file", path};
    return Error{ErrorCode::Io, path + ": cannot read (" + e.code().message() + "); check the path and its permissions", path};
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
                if (e.contains("source") && e["source"].is_string()) info.source = e["source"].get<std::string>();
                if (e.contains("same_architecture") && e["same_architecture"].is_array())
                    for (const auto& id : e["same_architecture"])
                        if (id.is_string()) info.same_architecture.push_back(id.get<std::string>());
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
    for (const auto& p : preset_table().infos) {
        if (lower(p.name) == s || (!p.hf_id.empty() && lower(p.hf_id) == s)) return p.name;
        for (const auto& id : p.same_architecture)
            if (lower(id) == s) return p.name;
    }
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
        ModelGraph g;
        try {
            g = build_transformer(spec.value(), wdt);
            // Every estimate multiplies the parameter count by up to ~20 bytes
            // (weights, gradients, optimizer states, copies): keep 64x representable.
            (void)checked_mul(g.total_params(), 64);
        } catch (const OverflowError& e) {
            // The config's sizes multiply past 64 bits: name them.
            const TransformerSpec& t = spec.value();
            std::string sizes = "hidden_size=" + std::to_string(t.hidden) + ", intermediate_size=" + std::to_string(t.intermediate) +
                                ", vocab_size=" + std::to_string(t.vocab) + ", num_hidden_layers=" + std::to_string(t.layers) +
                                ", num_attention_heads=" + std::to_string(t.heads);
            if (t.experts > 0) sizes += ", experts=" + std::to_string(t.experts) + " of moe_intermediate_size=" + std::to_string(t.moe_intermediate);
            fail(ErrorCode::Overflow, "hidden_size",
                 std::string(origin) + ": the model is too large to represent: its parameter and byte counts overflow 64 bits (" + e.what() +
                     ") with " + sizes + "; check these values");
        }
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
// Hugging Face hub cache (offline; nothing is downloaded)
// ---------------------------------------------------------------------------
namespace {

std::string env_value(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

// os.path.expanduser for "~" and "~/..." (a "~user" prefix is left as is).
std::string expand_user(const std::string& p) {
    if (p.empty() || p[0] != '~' || (p.size() > 1 && p[1] != '/')) return p;
    const std::string home = env_value("HOME");
    return home.empty() ? p : home + p.substr(1);
}

struct HfId {
    std::string repo;      // "Qwen/Qwen3-8B"
    std::string revision;  // after '@' ("main", a branch, tag or commit hash), "" if none
};

bool hf_id_segment_ok(std::string_view seg) {
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    if (seg.empty() || seg.size() > 96 || !word(seg.front()) || !word(seg.back())) return false;
    for (char c : seg)
        if (!word(c) && c != '-' && c != '.') return false;
    return true;
}

// A model id as the Hub accepts it (huggingface_hub utils/_validators.py,
// validate_repo_id: "^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$", no "--" or "..",
// not ending in ".git"), with an optional "@revision". Names that end like a
// file ("x.json", "model.safetensors") are taken as missing files, not ids.
std::optional<HfId> parse_hf_id(std::string_view spec) {
    HfId id;
    const auto at = spec.find('@');
    id.repo = std::string(spec.substr(0, at));
    if (at != std::string_view::npos) {
        id.revision = std::string(spec.substr(at + 1));
        if (id.revision.empty() || id.revision.front() == '/' || id.revision.back() == '/') return std::nullopt;
        for (char c : id.revision)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != '/')
                return std::nullopt;
        for (const auto& part : fs::path(id.revision))
            if (part == ".." || part == ".") return std::nullopt;
    }
    const auto slash = id.repo.find('/');
    if (slash != std::string::npos) {
        if (!hf_id_segment_ok(std::string_view(id.repo).substr(0, slash)) ||
            !hf_id_segment_ok(std::string_view(id.repo).substr(slash + 1)))
            return std::nullopt;
    } else if (!hf_id_segment_ok(id.repo)) {
        return std::nullopt;
    }
    if (id.repo.find("--") != std::string::npos || id.repo.find("..") != std::string::npos) return std::nullopt;
    const std::string low = lower(id.repo);
    for (const char* ext : {".git", ".json", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".txt"}) {
        const std::string e(ext);
        if (low.size() >= e.size() && low.compare(low.size() - e.size(), e.size(), e) == 0) return std::nullopt;
    }
    return id;
}

// "models--{org}--{name}" (huggingface_hub file_download.py, repo_folder_name).
std::string hf_repo_folder_name(const std::string& repo) {
    std::string out = "models";
    std::size_t start = 0;
    for (;;) {
        const auto slash = repo.find('/', start);
        out += "--" + repo.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    return out;
}

std::string hf_fetch_command(const HfId& id) {
    std::string rev = id.revision.empty() ? "" : " --revision " + id.revision;
    return "huggingface-cli download " + id.repo + " config.json" + rev + " (or: hf download " + id.repo +
           " config.json" + rev + ")";
}

std::string trimmed(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    std::size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
}

struct HfSnapshot {
    fs::path dir;       // <cache>/models--org--name/snapshots/<hash>
    std::string how;    // how the snapshot was chosen, for the model's notes
};

// The cached snapshot folder of `id`, nullopt when the repo has no folder in
// the cache. A repo folder that is there but unusable (no snapshot with a
// config.json, an unknown revision) throws InputError NotFound with the fix.
std::optional<HfSnapshot> find_hf_snapshot(const HfId& id, const fs::path& cache) {
    std::error_code ec;
    const std::string folder = hf_repo_folder_name(id.repo);
    fs::path repo_dir = cache / folder;
    if (!fs::is_directory(repo_dir, ec)) {
        // The Hub treats ids case-insensitively; the cache keeps the spelling
        // used at download time ("models--Qwen--Qwen3-8B").
        repo_dir.clear();
        if (fs::is_directory(cache, ec)) {
            const std::string want = lower(folder);
            for (const auto& e : fs::directory_iterator(cache, ec))
                if (lower(e.path().filename().string()) == want && e.is_directory(ec)) {
                    repo_dir = e.path();
                    break;
                }
        }
        if (repo_dir.empty()) return std::nullopt;
    }
    const fs::path snapshots = repo_dir / "snapshots";
    const std::string fetch = "fetch it with " + hf_fetch_command(id) + " and re-run";
    auto has_config = [&](const fs::path& snap) { return fs::is_regular_file(snap / "config.json", ec); };
    // refs/<name> holds the commit hash a branch or tag points to
    // (huggingface_hub file_download.py, try_to_load_from_cache).
    auto read_ref = [&](const std::string& name) -> std::optional<std::string> {
        const fs::path ref = repo_dir / "refs" / name;
        if (!fs::is_regular_file(ref, ec)) return std::nullopt;
        std::string hash = trimmed(detail::read_text_file(ref.string(), "Hugging Face cache ref"));
        const bool ok = !hash.empty() && std::all_of(hash.begin(), hash.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) != 0;
        });
        if (!ok)
            fail(ErrorCode::ParseError, ref.string(),
                 ref.string() + ": expected a commit hash in this Hugging Face cache ref; delete the file or re-run " +
                     hf_fetch_command(id));
        return hash;
    };

    if (!id.revision.empty()) {
        const auto hash = read_ref(id.revision);
        const fs::path snap = snapshots / (hash ? *hash : id.revision);
        if (!fs::is_directory(snap, ec))
            fail(ErrorCode::NotFound, id.repo + "@" + id.revision,
                 id.repo + "@" + id.revision + ": revision \"" + id.revision + "\" is not in the Hugging Face cache (" +
                     repo_dir.string() + " has no refs/" + id.revision + " and no snapshots/" + id.revision + "); " +
                     fetch);
        if (!has_config(snap))
            fail(ErrorCode::NotFound, (snap / "config.json").string(),
                 (snap / "config.json").string() + ": the cached snapshot of " + id.repo + "@" + id.revision +
                     " has no config.json; " + fetch);
        return HfSnapshot{snap, hash ? "refs/" + id.revision + " -> " + *hash : "snapshot " + id.revision};
    }

    if (const auto hash = read_ref("main")) {
        const fs::path snap = snapshots / *hash;
        if (has_config(snap)) return HfSnapshot{snap, "refs/main -> " + *hash};
    }
    // No usable refs/main: the only, or newest, snapshot that has a config.json.
    std::vector<std::pair<fs::file_time_type, fs::path>> found;
    if (fs::is_directory(snapshots, ec))
        for (const auto& e : fs::directory_iterator(snapshots, ec))
            if (e.is_directory(ec) && has_config(e.path())) {
                std::error_code tec;
                const auto t = fs::last_write_time(e.path() / "config.json", tec);
                found.emplace_back(tec ? fs::file_time_type::min() : t, e.path());
            }
    if (found.empty())
        fail(ErrorCode::NotFound, repo_dir.string(),
             id.repo + " is in the Hugging Face cache (" + repo_dir.string() +
                 ") but no snapshot there has a config.json; " + fetch);
    std::sort(found.begin(), found.end());
    const fs::path snap = found.back().second;
    std::string how = found.size() == 1 ? "the only cached snapshot with a config.json, " + snap.filename().string()
                                        : "the newest of " + std::to_string(found.size()) +
                                              " cached snapshots with a config.json, " + snap.filename().string();
    return HfSnapshot{snap, how + " (no usable refs/main)"};
}

// Loads a located snapshot like a model folder (config.json + safetensors
// headers). A sharded checkpoint whose index is cached but whose shards are
// not (a partial download) falls back to config.json alone.
Result<ModelGraph> load_hf_snapshot(const HfId& id, const HfSnapshot& hit) {
    return detail::guard([&]() -> Result<ModelGraph> {
        std::error_code ec;
        std::string missing_shard;
        const fs::path index = hit.dir / "model.safetensors.index.json";
        if (fs::is_regular_file(index, ec)) {
            const json idx = detail::read_json_file(index.string());
            if (idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object())
                for (const auto& [tensor, file] : idx["weight_map"].items())
                    if (file.is_string() && !fs::is_regular_file(hit.dir / file.get<std::string>(), ec)) {
                        missing_shard = file.get<std::string>();
                        break;
                    }
        }
        auto r = missing_shard.empty() ? load_model_dir(hit.dir.string())
                                       : load_hf_config_file((hit.dir / "config.json").string());
        if (!r) return r;
        ModelGraph g = std::move(r).value();
        g.name = id.revision.empty() ? id.repo : id.repo + "@" + id.revision;
        g.source = "hf-cache " + g.source;
        g.notes.push_back("read offline from the Hugging Face cache: " + hit.dir.string() + " (" + hit.how + ")");
        if (!missing_shard.empty())
            g.notes.push_back("shard " + missing_shard +
                              " of model.safetensors.index.json is not in the cache: parameter count from config.json");
        return g;
    });
}

}  // namespace

std::string hf_hub_cache_dir() {
    // huggingface_hub src/huggingface_hub/constants.py: HF_HUB_CACHE, else the
    // legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
    // $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; "~" is
    // expanded. An empty variable counts as unset.
    for (const char* var : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
        if (const std::string v = env_value(var); !v.empty()) return expand_user(v);
    std::string home = env_value("HF_HOME");
    if (home.empty()) {
        std::string xdg = env_value("XDG_CACHE_HOME");
        if (xdg.empty()) xdg = "~/.cache";
        home = (fs::path(expand_user(xdg)) / "huggingface").string();
    }
    return (fs::path(expand_user(home)) / "hub").string();
}

Result<ModelGraph> load_hf_cached(const std::string& model_id) {
    const auto id = parse_hf_id(model_id);
    if (!id)
        return Error{ErrorCode::InvalidArgument,
                     "\"" + model_id +
                         "\" is not a Hugging Face model id: expected ORG/NAME (letters, digits, '-', '_', '.'), "
                         "optionally with @REVISION",
                     model_id};
    const fs::path cache = hf_hub_cache_dir();
    return detail::guard([&]() -> Result<ModelGraph> {
        const auto hit = find_hf_snapshot(*id, cache);
        if (!hit)
            return Error{ErrorCode::NotFound,
                         id->repo + " is not in the Hugging Face cache (" + cache.string() + " has no " +
                             hf_repo_folder_name(id->repo) +
                             "; set HF_HUB_CACHE or HF_HOME if the cache is elsewhere); fetch only its config with " +
                             hf_fetch_command(*id) + ", then re-run",
                         model_id};
        return load_hf_snapshot(*id, *hit);
    });
}

// ---------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------
Result<ModelGraph> load_model(const std::string& spec, const ModelLoadOptions& opts) {
    if (spec.empty())
        return Error{ErrorCode::InvalidArgument,
                     "no model given: name a built-in preset (run 'gpumem models'), a config.json, a model folder "
                     "or a layer-list JSON",
                     "model"};
    if (!opts.files) {  // presets only: nothing on disk is looked at
        if (resolve_preset(spec)) return load_preset(spec);
        std::string msg = "unknown model \"" + spec +
                          "\": the service takes built-in presets only and reads no files (GET /v1/models lists them; "
                          "send a Hugging Face config.json inline as \"config\")";
        if (auto s = suggest_presets(spec); !s.empty()) {
            msg += "; did you mean: ";
            for (std::size_t i = 0; i < s.size(); ++i) msg += (i ? ", " : "") + s[i];
            msg += "?";
        }
        return Error{ErrorCode::NotFound, msg, "model"};
    }
    const OnnxOptions& onnx = opts.onnx;
    std::error_code ec;
    if (fs::is_directory(spec, ec)) return load_model_dir(spec);
    const bool exists = fs::exists(spec, ec);
    if (ec == std::errc::too_many_symbolic_link_levels)
        return detail::fs_error(fs::filesystem_error("model", spec, ec));
    if (exists) {
        return detail::guard([&]() -> Result<ModelGraph> {
            if (fs::path(spec).extension() == ".onnx") return take(load_onnx_file(spec, onnx));
            if (fs::path(spec).extension() == ".safetensors")
                fail(ErrorCode::InvalidArgument, spec,
                     spec +
                         ": a safetensors file alone has no architecture; pass the folder that holds it and its "
                         "config.json");
            const json doc = detail::read_json_file(spec);
            if (is_graph_json(doc)) return graph_from_json(doc, spec);
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
                     ": not a model description: a Hugging Face config.json has \"model_type\", a layer list "
                     "has \"layers\" and a gpumem model graph has \"format\": \"gpumem-model-graph\"; this file has none of them");
        });
    }
    if (resolve_preset(spec)) return load_preset(spec);

    std::string did_you_mean;
    if (auto s = suggest_presets(spec); !s.empty()) {
        did_you_mean = "did you mean: ";
        for (std::size_t i = 0; i < s.size(); ++i) did_you_mean += (i ? ", " : "") + s[i];
        did_you_mean += "?";
    }

    // Last: a Hugging Face model id in the local hub cache, read offline.
    if (const auto id = parse_hf_id(spec)) {
        const fs::path cache = hf_hub_cache_dir();
        std::optional<HfSnapshot> hit;
        if (auto located = detail::guard([&]() -> Result<bool> {
                hit = find_hf_snapshot(*id, cache);
                return true;
            });
            !located)
            return located.error();  // in the cache but unusable: that error has the fix
        if (hit) return load_hf_snapshot(*id, *hit);
        std::string msg = "unknown model \"" + spec +
                          "\": not a built-in preset (run 'gpumem models' for the list" +
                          (did_you_mean.empty() ? "" : "; " + did_you_mean) +
                          "), not a file or folder, and not in the Hugging Face cache (" + cache.string() +
                          " has no " + hf_repo_folder_name(id->repo) +
                          "; set HF_HUB_CACHE or HF_HOME if the cache is elsewhere); if it is a Hugging Face model id, "
                          "fetch only its config with " +
                          hf_fetch_command(*id) + ", then re-run";
        return Error{ErrorCode::NotFound, msg, spec};
    }

    std::string msg =
        "unknown model \"" + spec + "\": not a file, a folder or a built-in preset (run 'gpumem models' for the list)";
    if (!did_you_mean.empty()) msg += "; " + did_you_mean;
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
        // Only suffixes no longer than the longest graph name can match, so
        // only those are kept: a checkpoint name of 200,000 dotted parts costs
        // a few short strings, not 200,000 copies of itself.
        std::size_t longest_graph_name = 0;
        for (const auto& b : g.blocks)
            for (const auto& p : b.params) longest_graph_name = std::max(longest_graph_name, p.name.size());
        std::unordered_map<std::string, std::map<DType, std::int64_t>> by_suffix;
        for (const auto& [name, dt] : tensor_dtype) {
            std::size_t pos = 0;
            if (name.size() > longest_graph_name) {
                // The first component boundary at or after size - longest.
                pos = name.find('.', name.size() - longest_graph_name - 1);
                if (pos == std::string::npos) continue;
                ++pos;
            }
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
