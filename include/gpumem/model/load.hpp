// gpumem/model/load.hpp — one entry point for every way a user names a model.
//
//   "llama-3-8b"               built-in preset (configs embedded in the binary)
//   path/to/config.json        Hugging Face config
//   path/to/model_dir/         config.json + *.safetensors headers (weights never read)
//   path/to/model.json         layer-list JSON for custom models ({"layers": [...]})
//   Qwen/Qwen3-8B[@revision]   a Hugging Face model id in the local hub cache
//                              (its config.json + safetensors headers, read offline)
//   --params 7B                a parameter count only (model states, no activations)
//
// load_model tries an existing file or folder, then a preset name (or a
// preset's HF id), then the Hugging Face cache; with files = false
// (ModelLoadOptions) presets only. All of them return a ModelGraph or an
// Error naming the file and field. The HTTP service takes presets only and
// never reaches the file or cache loaders (ModelLoadOptions::files = false).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/model/onnx.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct PresetInfo {
    std::string name;        // "llama-3-8b"
    std::string model_type;  // "llama"
    std::string hf_id;       // "meta-llama/Meta-Llama-3-8B"
    // Other Hugging Face ids whose config.json has the same architecture
    // (instruction-tuned variants): they resolve to this preset too.
    std::vector<std::string> same_architecture;
    std::string source;      // where the embedded config.json was copied from (data/presets/index.json)
};

const std::vector<PresetInfo>& presets();
// The embedded config.json text of a preset, or nullptr.
const char* preset_config_text(std::string_view name);

// How load_model may resolve a spec. `files` false: built-in presets only; no
// file, folder or Hugging Face cache is looked at, even when a folder in the
// working directory has the preset's name (the HTTP service: requests never
// touch the server's files). `onnx`: how a .onnx MODEL is read (its --loss).
struct ModelLoadOptions {
    OnnxOptions onnx;
    bool files = true;
    ModelLoadOptions() = default;
    ModelLoadOptions(OnnxOptions o) : onnx(std::move(o)) {}  // NOLINT(google-explicit-constructor)
};

Result<ModelGraph> load_model(const std::string& spec, const ModelLoadOptions& opts = {});
// The same graph, shared: a built-in preset is built once per process and
// then handed out (the embedded configs never change), which the service and
// the bindings call per request; anything else is loaded as load_model does.
Result<std::shared_ptr<const ModelGraph>> load_model_shared(const std::string& spec, const ModelLoadOptions& opts = {});
Result<ModelGraph> load_preset(std::string_view name);
Result<ModelGraph> load_hf_config_file(const std::string& path);
Result<ModelGraph> load_hf_config_json(const nlohmann::json& config, std::string_view origin);
Result<ModelGraph> load_model_dir(const std::string& dir);
Result<ModelGraph> load_layer_list_file(const std::string& path);
Result<ModelGraph> load_layer_list_json(const nlohmann::json& doc, std::string_view origin);

// The Hugging Face hub cache folder, resolved as huggingface_hub does
// (constants.py): $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub. The folder need not exist.
std::string hf_hub_cache_dir();
// "ORG/NAME" or "ORG/NAME@REVISION" from that cache, offline: the snapshot that
// refs/main (or refs/REVISION, or snapshots/REVISION) names, else the only or
// newest snapshot with a config.json; loaded like a model folder. NotFound,
// naming the cache folder and the `huggingface-cli download` command, when it
// is not cached.
Result<ModelGraph> load_hf_cached(const std::string& model_id);
ModelGraph params_only_graph(std::int64_t params);

// "7B", "1.5e9", "125M", "70b", "1234567" -> parameter count.
Result<std::int64_t> parse_param_count(std::string_view text);

}  // namespace gpumem
