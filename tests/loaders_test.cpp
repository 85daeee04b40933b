// Tests of the model loaders: presets, dispatch, config.json errors,
// safetensors headers (single file, sharded, malformed), layer lists and
// --params parsing. Expected values are computed independently in the tests
// (from shapes written here) or read from tests/fixtures/groundtruth.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <chrono>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpumem/model/load.hpp"
#include "gpumem/model/safetensors.hpp"
#include "test_util.hpp"
#ifdef GPUMEM_HAVE_SERVER
#include <httplib.h>

#include "gpumem/server/server.hpp"
#endif

namespace fs = std::filesystem;
using nlohmann::json;
using namespace gpumem;

namespace {

const std::string kSrc = GPUMEM_SOURCE_DIR;

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

// A fresh temporary folder, removed at the end of its scope (numbered: a
// test may hold two).
class TempDir : public gpumem::test::ScratchDir {
public:
    TempDir() : ScratchDir("loaders_" + std::to_string(++made_)) {}

private:
    static inline int made_ = 0;
};

// ---- safetensors writer -----------------------------------------------------

struct T {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
};

std::int64_t elem_size(const std::string& dt) {
    static const std::map<std::string, std::int64_t> m{{"F64", 8},     {"F32", 4},     {"F16", 2}, {"BF16", 2},
                                                       {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
                                                       {"I16", 2},     {"I8", 1},      {"U8", 1},  {"BOOL", 1}};
    return m.at(dt);
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
}

// Writes the 8-byte little-endian length, `header` and `data_bytes` zero bytes.
void write_raw_safetensors(const std::string& path, const std::string& header, std::int64_t data_bytes,
                           std::uint64_t declared_len = UINT64_MAX) {
    std::ofstream out(path, std::ios::binary);
    const std::uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    const std::string zeros(static_cast<std::size_t>(data_bytes), '\0');
    out << zeros;
}

// A valid file: tensors laid out back to back in the given order.
void write_safetensors(const std::string& path, const std::vector<T>& tensors) {
    json h = json::object();
    std::int64_t off = 0;
    for (const auto& t : tensors) {
        const std::int64_t nb = numel(t.shape) * elem_size(t.dtype);
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + nb}}};
        off += nb;
    }
    h["__metadata__"] = {{"format", "pt"}};
    std::string text = h.dump();
    while (text.size() % 8 != 0) text.push_back(' ');  // the format pads headers with spaces
    write_raw_safetensors(path, text, off);
}

// Tiny Llama checkpoint: names as transformers saves LlamaForCausalLM.
const char* kTinyLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": 16,
  "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "hidden_act": "silu"
})";

std::vector<T> tiny_llama_tensors() {
    std::vector<T> v;
    v.push_back({"model.embed_tokens.weight", "BF16", {100, 16}});
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
            v.push_back({p + "self_attn." + m + ".weight", "BF16", {16, 16}});
        v.push_back({p + "mlp.gate_proj.weight", "BF16", {32, 16}});
        v.push_back({p + "mlp.up_proj.weight", "BF16", {32, 16}});
        v.push_back({p + "mlp.down_proj.weight", "BF16", {16, 32}});
        v.push_back({p + "input_layernorm.weight", "F32", {16}});
        v.push_back({p + "post_attention_layernorm.weight", "F32", {16}});
    }
    v.push_back({"model.norm.weight", "F32", {16}});
    v.push_back({"lm_head.weight", "BF16", {100, 16}});
    return v;
}

// ---- saved-for-backward bytes, computed here from the graph -----------------

std::int64_t fp32_role_bytes(ActRole r) {
    switch (r) {
        case ActRole::Index64:
            return 8;
        case ActRole::Mask8:
            return 1;
        default:
            return 4;  // fp32 training: Stream, Lowered and Float32 are all 4 bytes
    }
}

// Distinct storages saved by ops of a block, fp32 precision (aliases share storage).
std::int64_t saved_bytes_fp32(const Block& b, std::int64_t batch) {
    std::set<TensorId> roots;
    for (const auto& op : b.ops)
        for (const auto& s : op.saved) {
            TensorId t = s.tensor;
            while (b.tensors[static_cast<std::size_t>(t)].alias_of >= 0)
                t = b.tensors[static_cast<std::size_t>(t)].alias_of;
            roots.insert(t);
        }
    std::int64_t bytes = 0;
    for (TensorId t : roots) {
        const auto& ti = b.tensors[static_cast<std::size_t>(t)];
        bytes += ti.extent.elements(batch, 1) * fp32_role_bytes(ti.role);
    }
    return bytes;
}

}  // namespace

// ============================================================================
// Presets and dispatch
// ============================================================================

TEST(Presets, ListHasEveryGroundTruthModel) {
    const json gt = read_json(kSrc + "/tests/fixtures/groundtruth/param_counts.json");
    const auto& ps = presets();
    ASSERT_GE(ps.size(), gt.size());  // the ground-truth models plus extra presets (octocoder)
    EXPECT_TRUE(std::is_sorted(ps.begin(), ps.end(), [](const auto& a, const auto& b) { return a.name < b.name; }));
    for (const auto& [name, entry] : gt.items()) {
        auto it = std::find_if(ps.begin(), ps.end(), [&](const PresetInfo& p) { return p.name == name; });
        ASSERT_NE(it, ps.end()) << name;
        // "meta-llama/Meta-Llama-3-8B (same dims: Llama-3.1-8B)" starts with the hf id.
        EXPECT_EQ(entry["model"].get<std::string>().rfind(it->hf_id, 0), 0u) << name << ": " << it->hf_id;
        EXPECT_FALSE(it->hf_id.empty()) << name;
        EXPECT_FALSE(it->model_type.empty()) << name;
        EXPECT_NE(preset_config_text(name), nullptr) << name;
    }
    EXPECT_EQ(preset_config_text("no-such-model"), nullptr);
}

TEST(Presets, LoadGpt2) {
    auto g = load_model("gpt2");
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->name, "gpt2");
    EXPECT_EQ(g->source, "preset");
    EXPECT_TRUE(g->has_sequence);
    const json gt = read_json(kSrc + "/tests/fixtures/groundtruth/param_counts.json");
    EXPECT_EQ(g->total_params(), gt["gpt2"]["params"].get<std::int64_t>());
    // Preset configs carry no torch_dtype: float32 is assumed and said so.
    EXPECT_TRUE(std::any_of(g->notes.begin(), g->notes.end(),
                            [](const std::string& n) { return n.find("float32") != std::string::npos; }));
}

TEST(Presets, CaseInsensitiveAndHfId) {
    auto a = load_model("GPT2");
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->name, "gpt2");
    auto b = load_model("meta-llama/Meta-Llama-3-8B");
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(b->name, "llama-3-8b");
    EXPECT_EQ(b->source, "preset");
}

// Instruction-tuned ids (what `vllm serve` commands name) share their base
// model's config.json architecture (same dims, vocabulary and positions; only
// generation settings differ), so they resolve to the base preset.
TEST(Presets, InstructIdsResolveToTheirBase) {
    const json gt = read_json(kSrc + "/tests/fixtures/groundtruth/param_counts.json");
    for (const auto& [id, preset] : std::vector<std::pair<std::string, std::string>>{
             {"meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"},
             {"meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"},
             {"meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"},
             {"meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"}}) {
        auto g = load_model(id);
        ASSERT_TRUE(g.ok()) << id << ": " << g.error().message;
        EXPECT_EQ(g->name, preset) << id;
    }
    // The one of them with a ground-truth count: Meta-Llama-3-8B's 8,030,261,248.
    auto instruct = load_model("meta-llama/Meta-Llama-3-8B-Instruct");
    ASSERT_TRUE(instruct.ok());
    EXPECT_EQ(instruct->total_params(), gt["llama-3-8b"]["params"].get<std::int64_t>());
}

TEST(Presets, UnknownModelSuggestsSimilarNames) {
    auto r = load_model("lama-3-8b");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::NotFound);
    const std::string& m = r.error().message;
    EXPECT_NE(m.find("unknown model \"lama-3-8b\""), std::string::npos) << m;
    EXPECT_NE(m.find("not a built-in preset"), std::string::npos) << m;
    EXPECT_NE(m.find("not a file or folder"), std::string::npos) << m;
    EXPECT_NE(m.find("gpumem models"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean: llama-3-8b"), std::string::npos) << m;

    // A name that cannot be a Hugging Face id (a missing .json) says so without the cache.
    auto rj = load_model("no-such-config.json");
    ASSERT_FALSE(rj.ok());
    EXPECT_EQ(rj.error().code, ErrorCode::NotFound);
    EXPECT_NE(rj.error().message.find("not a file, a folder or a built-in preset"), std::string::npos)
        << rj.error().message;
    EXPECT_EQ(rj.error().message.find("Hugging Face cache"), std::string::npos) << rj.error().message;

    auto r2 = load_model("gpt3");
    ASSERT_FALSE(r2.ok());
    EXPECT_NE(r2.error().message.find("gpt2"), std::string::npos) << r2.error().message;

    auto r3 = load_model("");
    ASSERT_FALSE(r3.ok());
}

// ============================================================================
// Hugging Face hub cache
// ============================================================================

namespace {

// Sets (or, with nullptr, unsets) environment variables for one test and
// restores the previous values afterwards.
class EnvGuard {
public:
    EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
        for (const auto& [name, value] : vars) {
            const char* old = std::getenv(name);
            saved_.push_back({name, old != nullptr, old ? old : ""});
            if (value)
                ::setenv(name, value, 1);
            else
                ::unsetenv(name);
        }
    }
    ~EnvGuard() {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            if (it->had)
                ::setenv(it->name.c_str(), it->value.c_str(), 1);
            else
                ::unsetenv(it->name.c_str());
        }
    }
    EnvGuard(const EnvGuard&) = delete;
    EnvGuard& operator=(const EnvGuard&) = delete;

private:
    struct Saved {
        std::string name;
        bool had;
        std::string value;
    };
    std::vector<Saved> saved_;
};

// Every variable huggingface_hub's constants.py reads for the cache location.
constexpr const char* kHfCacheVars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"};

std::string file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Writes `text` as blobs/<blob> of the repo folder and links
// snapshots/<commit>/<file> to it, as huggingface_hub lays out its cache.
void cache_file(const fs::path& repo_dir, const std::string& commit, const std::string& file, const std::string& blob,
                const std::string& text) {
    fs::create_directories(repo_dir / "blobs");
    fs::create_directories(repo_dir / "snapshots" / commit);
    {
        std::ofstream out(repo_dir / "blobs" / blob, std::ios::binary);
        out << text;
    }
    fs::create_symlink(fs::path("../../blobs") / blob, repo_dir / "snapshots" / commit / file);
}

void write_ref(const fs::path& repo_dir, const std::string& ref, const std::string& commit) {
    fs::create_directories((repo_dir / "refs" / ref).parent_path());
    std::ofstream out(repo_dir / "refs" / ref, std::ios::binary);
    out << commit;  // huggingface_hub writes the bare hash, no newline
}

// Real configs: data/presets/configs/*.json are byte-identical copies of
// shared/groundtruth/configs/*.json, and tests/fixtures/groundtruth/param_counts.json
// of shared/groundtruth/param_counts.json (transformers' parameter counts).
std::string groundtruth_config(const std::string& name) {
    return file_text(kSrc + "/data/presets/configs/" + name + ".json");
}
std::int64_t groundtruth_params(const std::string& name) {
    return read_json(kSrc + "/tests/fixtures/groundtruth/param_counts.json")[name]["params"].get<std::int64_t>();
}

bool has_note(const ModelGraph& g, const std::string& text) {
    return std::any_of(g.notes.begin(), g.notes.end(),
                       [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

// Ids that are no preset's name or Hugging Face id, so only the cache can answer.
const std::string kCachedId = "gpumem-test/TinyLlama-copy";
const std::string kCachedFolder = "models--gpumem-test--TinyLlama-copy";
const std::string kCommitMain = "1111111111111111111111111111111111111111";
const std::string kCommitOld = "0000000000000000000000000000000000000000";

}  // namespace

TEST(HfCache, ResolvesFromHfHubCacheWithRefsMain) {
    TempDir d;
    const fs::path hub = fs::path(d.str()) / "hub";
    const fs::path repo = hub / kCachedFolder;
    cache_file(repo, kCommitMain, "config.json", "blob-tinyllama", groundtruth_config("tinyllama-1.1b"));
    cache_file(repo, kCommitOld, "config.json", "blob-gpt2", groundtruth_config("gpt2"));
    write_ref(repo, "main", kCommitMain);
    // The older snapshot is newer on disk: refs/main, not the timestamp, decides.
    fs::last_write_time(repo / "blobs" / "blob-gpt2", fs::file_time_type::clock::now() + std::chrono::hours(1));
    EnvGuard env{{"HF_HUB_CACHE", hub.c_str()}, {"HUGGINGFACE_HUB_CACHE", nullptr}, {"HF_HOME", "/nonexistent"}};

    ASSERT_EQ(preset_config_text(kCachedId), nullptr);
    EXPECT_EQ(hf_hub_cache_dir(), hub.string());

    auto g = load_model(kCachedId);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->total_params(), groundtruth_params("tinyllama-1.1b"));  // 1,100,048,384
    EXPECT_EQ(g->name, kCachedId);
    EXPECT_EQ(g->source, "hf-cache config.json");
    EXPECT_TRUE(has_note(*g, (repo / "snapshots" / kCommitMain).string())) << g->notes.front();
    EXPECT_TRUE(has_note(*g, "refs/main -> " + kCommitMain));

    auto direct = load_hf_cached(kCachedId);
    ASSERT_TRUE(direct.ok()) << direct.error().message;
    EXPECT_EQ(direct->total_params(), groundtruth_params("tinyllama-1.1b"));

    // Case-insensitive id, as the Hub treats them.
    auto upper = load_model("GPUMEM-TEST/tinyllama-COPY");
    ASSERT_TRUE(upper.ok()) << upper.error().message;
    EXPECT_EQ(upper->total_params(), groundtruth_params("tinyllama-1.1b"));

    // @revision: a commit hash (snapshots/<hash>) or a ref name (refs/<name>).
    auto old = load_model(kCachedId + "@" + kCommitOld);
    ASSERT_TRUE(old.ok()) << old.error().message;
    EXPECT_EQ(old->total_params(), groundtruth_params("gpt2"));  // 124,439,808
    EXPECT_EQ(old->name, kCachedId + "@" + kCommitOld);
    write_ref(repo, "v1.0", kCommitOld);
    auto tag = load_model(kCachedId + "@v1.0");
    ASSERT_TRUE(tag.ok()) << tag.error().message;
    EXPECT_EQ(tag->total_params(), groundtruth_params("gpt2"));
    auto main = load_model(kCachedId + "@main");
    ASSERT_TRUE(main.ok()) << main.error().message;
    EXPECT_EQ(main->total_params(), groundtruth_params("tinyllama-1.1b"));

    auto missing_rev = load_model(kCachedId + "@no-such-branch");
    ASSERT_FALSE(missing_rev.ok());
    EXPECT_EQ(missing_rev.error().code, ErrorCode::NotFound);
    const std::string& m = missing_rev.error().message;
    EXPECT_NE(m.find("revision \"no-such-branch\" is not in the Hugging Face cache"), std::string::npos) << m;
    EXPECT_NE(m.find("huggingface-cli download " + kCachedId + " config.json --revision no-such-branch"),
              std::string::npos)
        << m;

    // A preset's Hugging Face id still resolves to the preset, not the cache.
    auto preset = load_model("openai-community/gpt2");
    ASSERT_TRUE(preset.ok()) << preset.error().message;
    EXPECT_EQ(preset->source, "preset");
}

TEST(HfCache, NewestSnapshotWithoutRefsMain) {
    TempDir d;
    const fs::path hub = fs::path(d.str()) / "hub";
    const fs::path repo = hub / kCachedFolder;
    cache_file(repo, kCommitOld, "config.json", "blob-gpt2", groundtruth_config("gpt2"));
    cache_file(repo, kCommitMain, "config.json", "blob-tinyllama", groundtruth_config("tinyllama-1.1b"));
    fs::create_directories(repo / "snapshots" / "2222222222222222222222222222222222222222");  // no config.json
    const auto now = fs::file_time_type::clock::now();
    fs::last_write_time(repo / "blobs" / "blob-gpt2", now - std::chrono::hours(2));
    fs::last_write_time(repo / "blobs" / "blob-tinyllama", now - std::chrono::hours(1));
    EnvGuard env{{"HF_HUB_CACHE", hub.c_str()}, {"HUGGINGFACE_HUB_CACHE", nullptr}};

    auto g = load_model(kCachedId);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->total_params(), groundtruth_params("tinyllama-1.1b"));
    EXPECT_TRUE(has_note(*g, "the newest of 2 cached snapshots with a config.json, " + kCommitMain));
}

TEST(HfCache, HfHomeXdgAndHomeFallbacks) {
    TempDir d;
    const fs::path home = fs::path(d.str()) / "hf-home";
    const fs::path repo = home / "hub" / kCachedFolder;
    cache_file(repo, kCommitMain, "config.json", "blob-qwen2", groundtruth_config("qwen2-0.5b"));
    write_ref(repo, "main", kCommitMain);
    {
        EnvGuard env{{"HF_HUB_CACHE", nullptr}, {"HUGGINGFACE_HUB_CACHE", nullptr}, {"HF_HOME", home.c_str()},
                     {"XDG_CACHE_HOME", "/nonexistent-xdg"}};
        EXPECT_EQ(hf_hub_cache_dir(), (home / "hub").string());
        auto g = load_model(kCachedId);
        ASSERT_TRUE(g.ok()) << g.error().message;
        EXPECT_EQ(g->total_params(), groundtruth_params("qwen2-0.5b"));  // 494,032,768
        EXPECT_TRUE(has_note(*g, "the Hugging Face cache: " + (home / "hub").string()));
    }
    {
        // The legacy HUGGINGFACE_HUB_CACHE comes before HF_HOME; HF_HUB_CACHE before both.
        EnvGuard env{{"HF_HUB_CACHE", nullptr}, {"HUGGINGFACE_HUB_CACHE", "/legacy"}, {"HF_HOME", home.c_str()}};
        EXPECT_EQ(hf_hub_cache_dir(), "/legacy");
        EnvGuard env2{{"HF_HUB_CACHE", "/new"}};
        EXPECT_EQ(hf_hub_cache_dir(), "/new");
    }
    {
        EnvGuard env{{"HF_HUB_CACHE", nullptr}, {"HUGGINGFACE_HUB_CACHE", nullptr}, {"HF_HOME", nullptr},
                     {"XDG_CACHE_HOME", "/xdg"}};
        EXPECT_EQ(hf_hub_cache_dir(), "/xdg/huggingface/hub");
    }
    {
        EnvGuard env{{"HF_HUB_CACHE", nullptr}, {"HUGGINGFACE_HUB_CACHE", nullptr}, {"HF_HOME", nullptr},
                     {"XDG_CACHE_HOME", nullptr}, {"HOME", "/home/someone"}};
        EXPECT_EQ(hf_hub_cache_dir(), "/home/someone/.cache/huggingface/hub");
        EnvGuard env2{{"HF_HOME", "~/hf"}};  // "~" is expanded as huggingface_hub does
        EXPECT_EQ(hf_hub_cache_dir(), "/home/someone/hf/hub");
    }
}

TEST(HfCache, SafetensorsHeadersInTheCache) {
    TempDir d;
    const fs::path hub = fs::path(d.str()) / "hub";
    const fs::path repo = hub / kCachedFolder;
    cache_file(repo, kCommitMain, "config.json", "blob-config", kTinyLlamaConfig);
    write_safetensors(d.file("model.safetensors"), tiny_llama_tensors());
    cache_file(repo, kCommitMain, "model.safetensors", "blob-weights", file_text(d.file("model.safetensors")));
    write_ref(repo, "main", kCommitMain);
    EnvGuard env{{"HF_HUB_CACHE", hub.c_str()}, {"HUGGINGFACE_HUB_CACHE", nullptr}};

    std::int64_t expected = 0;
    for (const auto& t : tiny_llama_tensors()) expected += numel(t.shape);
    auto g = load_model(kCachedId);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->source, "hf-cache safetensors");
    EXPECT_EQ(g->total_params(), expected);
    EXPECT_TRUE(has_note(*g, "parameter count from safetensors headers"));

    // A sharded checkpoint with only its index cached: config.json alone, said so.
    const fs::path repo2 = hub / "models--gpumem-test--sharded";
    cache_file(repo2, kCommitMain, "config.json", "blob-config", kTinyLlamaConfig);
    const json index = {{"weight_map", {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"}}}};
    cache_file(repo2, kCommitMain, "model.safetensors.index.json", "blob-index", index.dump());
    write_ref(repo2, "main", kCommitMain);
    auto s = load_model("gpumem-test/sharded");
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->source, "hf-cache config.json");
    EXPECT_EQ(s->total_params(), expected);  // the config's count equals the headers' for this checkpoint
    EXPECT_TRUE(has_note(*s, "model-00001-of-00002.safetensors of model.safetensors.index.json is not in the cache"));
}

TEST(HfCache, NotFoundNamesTheCacheAndTheDownloadCommand) {
    TempDir d;
    const fs::path hub = fs::path(d.str()) / "empty-hub";
    EnvGuard env{{"HF_HUB_CACHE", hub.c_str()}, {"HUGGINGFACE_HUB_CACHE", nullptr}};

    auto r = load_model("example-org/Unlisted-8B");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::NotFound);
    EXPECT_EQ(r.error().field, "example-org/Unlisted-8B");
    const std::string& m = r.error().message;
    EXPECT_NE(m.find("unknown model \"example-org/Unlisted-8B\""), std::string::npos) << m;
    EXPECT_NE(m.find("not a built-in preset"), std::string::npos) << m;
    EXPECT_NE(m.find("not a file or folder"), std::string::npos) << m;
    EXPECT_NE(m.find("not in the Hugging Face cache (" + hub.string() + " has no models--example-org--Unlisted-8B"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("huggingface-cli download example-org/Unlisted-8B config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("hf download example-org/Unlisted-8B config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("then re-run"), std::string::npos) << m;

    auto direct = load_hf_cached("example-org/Unlisted-8B");
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.error().code, ErrorCode::NotFound);
    EXPECT_NE(direct.error().message.find(hub.string()), std::string::npos) << direct.error().message;

    // In the cache, but only the weights were fetched: that is said, with the fix.
    const fs::path repo = hub / "models--example-org--Unlisted-8B";
    fs::create_directories(repo / "snapshots" / kCommitMain);
    write_ref(repo, "main", kCommitMain);
    auto partial = load_model("example-org/Unlisted-8B");
    ASSERT_FALSE(partial.ok());
    EXPECT_EQ(partial.error().code, ErrorCode::NotFound);
    EXPECT_NE(partial.error().message.find("no snapshot there has a config.json"), std::string::npos)
        << partial.error().message;
    EXPECT_NE(partial.error().message.find("huggingface-cli download example-org/Unlisted-8B config.json"), std::string::npos);

    // Not an id at all.
    auto bad = load_hf_cached("../etc/passwd");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::InvalidArgument);
    auto traversal = load_model("example-org/Unlisted-8B@../../x");
    ASSERT_FALSE(traversal.ok());
    EXPECT_EQ(traversal.error().message.find("Hugging Face cache"), std::string::npos) << traversal.error().message;
}

#ifdef GPUMEM_HAVE_SERVER
// The HTTP service takes presets only: a cached Hugging Face id is refused
// before any loader runs (server.cpp, check_model), whatever the cache holds.
TEST(HfCache, HttpServiceDoesNotReadTheCache) {
    TempDir d;
    const fs::path hub = fs::path(d.str()) / "hub";
    const fs::path repo = hub / kCachedFolder;
    cache_file(repo, kCommitMain, "config.json", "blob-tinyllama", groundtruth_config("tinyllama-1.1b"));
    write_ref(repo, "main", kCommitMain);
    EnvGuard env{{"HF_HUB_CACHE", hub.c_str()}, {"HUGGINGFACE_HUB_CACHE", nullptr}};
    ASSERT_TRUE(load_model(kCachedId).ok());  // the CLI would read it

    gpumem::server::ServerOptions opt;
    gpumem::server::Server server(opt);
    ASSERT_TRUE(server.start("127.0.0.1", 0)) << server.error();
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(60, 0);
    for (const std::string& model : {kCachedId, kCachedId + "@main", kCachedId + "@" + kCommitMain}) {
        auto r = c.Post("/v1/estimate", json({{"model", model}, {"batch", 1}, {"seq", 128}}).dump(),
                        "application/json");
        ASSERT_TRUE(r) << model;
        EXPECT_EQ(r->status, 404) << model;
        const json body = json::parse(r->body);
        EXPECT_EQ(body["error"]["field"], "model") << model;
        EXPECT_NE(body["error"]["message"].get<std::string>().find("presets only"), std::string::npos) << r->body;
    }
    server.stop();
}
#endif

TEST(ConfigJson, MalformedAndTruncatedJsonNameTheFile) {
    TempDir d;
    d.write("bad.json", "{\"model_type\": \"gpt2\", \"n_layer\": , \"n_head\": 12}");
    d.write("trunc.json", "{\"model_type\": \"gpt2\", \"n_layer\": 12, \"n_embd\": 768");
    d.write("empty.json", "");

    auto bad = load_model(d.file("bad.json"));
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::ParseError);
    EXPECT_NE(bad.error().message.find("bad.json"), std::string::npos) << bad.error().message;
    EXPECT_NE(bad.error().message.find("invalid JSON at byte 35"), std::string::npos) << bad.error().message;

    auto trunc = load_model(d.file("trunc.json"));
    ASSERT_FALSE(trunc.ok());
    EXPECT_EQ(trunc.error().code, ErrorCode::ParseError);
    const std::string& m = trunc.error().message;
    EXPECT_NE(m.find("trunc.json: invalid JSON at byte"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected end of input"), std::string::npos) << m;
    EXPECT_NE(m.find("check the file is complete"), std::string::npos) << m;

    auto empty = load_hf_config_file(d.file("empty.json"));
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.error().code, ErrorCode::ParseError);
    EXPECT_NE(empty.error().message.find("empty.json"), std::string::npos);

    auto ll = load_layer_list_file(d.file("trunc.json"));
    ASSERT_FALSE(ll.ok());
    EXPECT_EQ(ll.error().code, ErrorCode::ParseError);
    EXPECT_NE(ll.error().message.find("trunc.json"), std::string::npos);
}

TEST(ConfigJson, NeitherConfigNorLayerList) {
    TempDir d;
    d.write("other.json", R"({"hello": 1})");
    auto r = load_model(d.file("other.json"));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("other.json"), std::string::npos);
    EXPECT_NE(r.error().message.find("model_type"), std::string::npos);
    EXPECT_NE(r.error().message.find("layers"), std::string::npos);
}

TEST(ConfigJson, FileDispatchAndDtype) {
    TempDir d;
    d.write("tiny.json", kTinyLlamaConfig);
    auto g = load_model(d.file("tiny.json"));
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->source, "config.json");
    EXPECT_EQ(g->name, "tiny");
    // torch_dtype bfloat16 -> parameters stored in bf16.
    for (const auto& b : g->blocks)
        for (const auto& p : b.params) EXPECT_EQ(p.dtype, DType::BF16) << p.name;
    std::int64_t expected = 0;
    for (const auto& t : tiny_llama_tensors()) expected += numel(t.shape);
    EXPECT_EQ(g->total_params(), expected);
}

// ============================================================================
// safetensors
// ============================================================================

TEST(Safetensors, SingleFileHeaderCounts) {
    TempDir d;
    const auto tensors = tiny_llama_tensors();
    write_safetensors(d.file("model.safetensors"), tensors);
    auto h = read_safetensors_header(d.file("model.safetensors"));
    ASSERT_TRUE(h.ok()) << h.error().message;
    ASSERT_EQ(h->tensors.size(), tensors.size());
    EXPECT_TRUE(std::is_sorted(h->tensors.begin(), h->tensors.end(),
                               [](const auto& a, const auto& b) { return a.name < b.name; }));
    std::int64_t n = 0, got = 0;
    for (const auto& t : tensors) n += numel(t.shape);
    for (const auto& e : h->tensors) got += e.numel;
    EXPECT_EQ(got, n);
    EXPECT_EQ(h->file_size, static_cast<std::int64_t>(fs::file_size(d.file("model.safetensors"))));
    auto it =
        std::find_if(h->tensors.begin(), h->tensors.end(), [](const auto& e) { return e.name == "model.norm.weight"; });
    ASSERT_NE(it, h->tensors.end());
    EXPECT_EQ(it->dtype, DType::F32);
    EXPECT_EQ(it->shape, (std::vector<std::int64_t>{16}));
}

TEST(Safetensors, ModelFolderSingleFile) {
    TempDir d;
    d.write("config.json", kTinyLlamaConfig);
    auto tensors = tiny_llama_tensors();
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4}});  // a buffer
    write_safetensors(d.file("model.safetensors"), tensors);

    std::int64_t expected = 0, bf16 = 0, f32 = 0;
    for (const auto& t : tiny_llama_tensors()) {
        expected += numel(t.shape);
        (t.dtype == "BF16" ? bf16 : f32) += numel(t.shape);
    }
    auto g = load_model(d.str());
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->source, "safetensors");
    EXPECT_EQ(g->total_params(), expected);
    ASSERT_EQ(g->header_dtype_counts.size(), 2u);
    std::map<DType, std::int64_t> counts(g->header_dtype_counts.begin(), g->header_dtype_counts.end());
    EXPECT_EQ(counts[DType::BF16], bf16);
    EXPECT_EQ(counts[DType::F32], f32);
    bool note = false, excluded = false;
    for (const auto& n : g->notes) {
        note |= n.find("parameter count from safetensors headers (" + std::to_string(tensors.size()) +
                       " tensors in 1 files)") != std::string::npos;
        excluded |= n.find("rotary_emb.inv_freq") != std::string::npos;
    }
    EXPECT_TRUE(note);
    EXPECT_TRUE(excluded);
    // Dominant dtype by bytes is bf16; norms matched by name keep fp32.
    for (const auto& b : g->blocks)
        for (const auto& p : b.params) {
            const bool is_norm = p.name.size() >= 11 && p.name.find("norm.weight") != std::string::npos;
            EXPECT_EQ(p.dtype, is_norm ? DType::F32 : DType::BF16) << p.name;
        }
}

TEST(Safetensors, ModelFolderShardedWithIndex) {
    TempDir d;
    d.write("config.json", kTinyLlamaConfig);
    auto tensors = tiny_llama_tensors();
    tensors.push_back({"model.extra_projection.weight", "BF16", {7, 3}});  // not in the architecture
    const std::size_t half = tensors.size() / 2;
    std::vector<T> a(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(half));
    std::vector<T> b(tensors.begin() + static_cast<std::ptrdiff_t>(half), tensors.end());
    write_safetensors(d.file("model-00001-of-00002.safetensors"), a);
    write_safetensors(d.file("model-00002-of-00002.safetensors"), b);
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    d.write("model.safetensors.index.json", index.dump(1));
    // A stray file not in the index is ignored.
    write_safetensors(d.file("stray.safetensors"), {{"x", "F32", {1000}}});

    std::int64_t expected = 0;
    for (const auto& t : tensors) expected += numel(t.shape);
    auto g = load_model_dir(d.str());
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->total_params(), expected);  // headers are the authority
    bool note = false, unattributed = false;
    for (const auto& n : g->notes)
        note |= n.find("(" + std::to_string(tensors.size()) + " tensors in 2 files)") != std::string::npos;
    for (const auto& blk : g->blocks)
        for (const auto& p : blk.params)
            if (p.name == "(unattributed from safetensors)") {
                unattributed = true;
                EXPECT_EQ(p.numel(), 21);
                EXPECT_EQ(p.component, Component::Other);
            }
    EXPECT_TRUE(note);
    EXPECT_TRUE(unattributed);
}

TEST(Safetensors, MissingShardAndConfig) {
    TempDir d;
    d.write("config.json", kTinyLlamaConfig);
    write_safetensors(d.file("model-00001-of-00002.safetensors"), {{"model.embed_tokens.weight", "BF16", {100, 16}}});
    json index = {{"weight_map",
                   {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                    {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
    d.write("model.safetensors.index.json", index.dump());
    auto r = load_model(d.str());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::NotFound);
    EXPECT_NE(r.error().message.find("model-00002-of-00002.safetensors"), std::string::npos) << r.error().message;

    TempDir e;
    write_safetensors(e.file("model.safetensors"), {{"w", "F32", {4}}});
    auto r2 = load_model(e.str());
    ASSERT_FALSE(r2.ok());
    EXPECT_EQ(r2.error().code, ErrorCode::NotFound);
    EXPECT_NE(r2.error().message.find("config.json"), std::string::npos) << r2.error().message;
}

TEST(Safetensors, HeaderLengthBeyondFile) {
    TempDir d;
    write_raw_safetensors(d.file("short.safetensors"), R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4,
                          100000);
    auto r = read_safetensors_header(d.file("short.safetensors"));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("short.safetensors"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("truncated or not a safetensors file"), std::string::npos) << r.error().message;

    write_raw_safetensors(d.file("zero.safetensors"), "", 16, 0);
    auto z = read_safetensors_header(d.file("zero.safetensors"));
    ASSERT_FALSE(z.ok());
    EXPECT_NE(z.error().message.find("zero.safetensors"), std::string::npos);

    d.write("tiny.safetensors", "abc");
    EXPECT_FALSE(read_safetensors_header(d.file("tiny.safetensors")).ok());

    // Garbage: a text file's first 8 bytes read as a huge length.
    d.write("text.safetensors", "this is not a safetensors file at all");
    auto t = read_safetensors_header(d.file("text.safetensors"));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("text.safetensors"), std::string::npos);
}

TEST(Safetensors, OverlappingOffsetsNameBothTensors) {
    const std::string h = R"({"alpha":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                              "beta":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
    auto r = parse_safetensors_header(h, 24, "ov.safetensors");
    ASSERT_FALSE(r.ok());
    const std::string& m = r.error().message;
    EXPECT_NE(m.find("ov.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("alpha"), std::string::npos) << m;
    EXPECT_NE(m.find("beta"), std::string::npos) << m;

    // Same check through a real file.
    TempDir d;
    write_raw_safetensors(d.file("ov.safetensors"), h, 24);
    auto f = read_safetensors_header(d.file("ov.safetensors"));
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.error().message.find("beta"), std::string::npos);
}

TEST(Safetensors, OffsetsMustMatchShapeAndFit) {
    auto r = parse_safetensors_header(R"({"w.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", 100,
                                      "m.safetensors");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("w.weight"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("12"), std::string::npos) << r.error().message;  // 2*3*2 bytes needed

    auto past = parse_safetensors_header(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", 16, "m.st");
    ASSERT_FALSE(past.ok());
    EXPECT_NE(past.error().message.find("\"w\""), std::string::npos) << past.error().message;

    auto neg = parse_safetensors_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 16, "m.st");
    ASSERT_FALSE(neg.ok());

    auto ok = parse_safetensors_header(
        R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},
            "a":{"dtype":"BOOL","shape":[],"data_offsets":[16,17]},"e":{"dtype":"F16","shape":[0,5],"data_offsets":[17,17]}})",
        17, "m.st");
    ASSERT_TRUE(ok.ok()) << ok.error().message;
    ASSERT_EQ(ok->tensors.size(), 3u);
    EXPECT_EQ(ok->tensors[0].name, "a");
    EXPECT_EQ(ok->tensors[0].numel, 1);  // a scalar
    EXPECT_EQ(ok->tensors[1].dtype, DType::I64);
    EXPECT_EQ(ok->tensors[2].numel, 0);
}

TEST(Safetensors, ShapeOverflowAndUnknownDtype) {
    auto r = parse_safetensors_header(
        R"({"huge":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}})", 16, "o.st");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::Overflow);
    EXPECT_NE(r.error().message.find("huge"), std::string::npos) << r.error().message;

    auto u = parse_safetensors_header(R"({"cplx":{"dtype":"C64","shape":[2],"data_offsets":[0,16]}})", 16, "u.st");
    ASSERT_FALSE(u.ok());
    EXPECT_EQ(u.error().code, ErrorCode::Unsupported);
    EXPECT_NE(u.error().message.find("cplx"), std::string::npos) << u.error().message;
    EXPECT_NE(u.error().message.find("C64"), std::string::npos) << u.error().message;

    auto j = parse_safetensors_header("{\"a\": ", 16, "j.st");
    ASSERT_FALSE(j.ok());
    EXPECT_NE(j.error().message.find("j.st"), std::string::npos);
}

// ============================================================================
// Layer lists
// ============================================================================

namespace {
const char* kToyMlp = R"({
  "name": "toy-mlp",
  "input": {"shape": [1024], "dtype": "float32"},
  "layers": [
    {"type": "linear", "in": 1024, "out": 1024, "bias": true},
    {"type": "linear", "in": 1024, "out": 1024},
    {"type": "linear", "in": 1024, "out": 2048}
  ],
  "loss": "sum"
})";
}  // namespace

TEST(LayerList, ToyMlpParamsAndSavedBytes) {
    auto g = load_layer_list_json(json::parse(kToyMlp), "toy.json");
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->name, "toy-mlp");
    EXPECT_EQ(g->family, "layers");
    EXPECT_EQ(g->source, "layer-list");
    EXPECT_FALSE(g->has_sequence);
    ASSERT_EQ(g->blocks.size(), 1u);
    EXPECT_EQ(g->blocks[0].name, "layers");
    EXPECT_EQ(g->blocks[0].repeat, 1);
    const std::int64_t params = 2 * (1024 * 1024 + 1024) + (1024 * 2048 + 2048);
    EXPECT_EQ(params, 4198400);
    EXPECT_EQ(g->total_params(), params);

    // Saved for backward at batch 10240 in fp32: the input of each Linear
    // (the model input and the outputs of the first two linears), 10240x1024
    // floats each; sum() saves nothing.
    const std::int64_t batch = 10240;
    const std::int64_t one = batch * 1024 * 4;
    EXPECT_EQ(one, 40LL * 1024 * 1024);
    EXPECT_EQ(saved_bytes_fp32(g->blocks[0], batch), 3 * one);
    EXPECT_EQ(3 * one, 120LL * 1024 * 1024);
}

TEST(LayerList, ConvNetShapeTracking) {
    const char* net = R"({
      "input": {"shape": [3, 32, 32]},
      "layers": [
        {"type": "conv2d", "in": 3, "out": 16, "kernel": 3, "padding": 1},
        {"type": "relu"},
        {"type": "maxpool2d", "kernel": 2},
        {"type": "flatten"},
        {"type": "linear", "in": 4096, "out": 10}
      ],
      "loss": "cross_entropy"
    })";
    auto g = load_layer_list_json(json::parse(net), "cnn.json");
    ASSERT_TRUE(g.ok()) << g.error().message;
    const std::int64_t conv = 16 * 3 * 3 * 3 + 16;
    const std::int64_t fc = 16 * 16 * 16 * 10 + 10;
    EXPECT_EQ(g->total_params(), conv + fc);
    EXPECT_EQ(g->name, "cnn");
    // Saved (fp32, batch 1): conv input 3*32*32, relu output 16*32*32 (also the
    // max-pool input), max-pool int64 indices 16*16*16, flatten (a view of the
    // pooled map) saved by the linear 16*16*16, log_softmax output 10, label 1.
    const std::int64_t expected =
        4 * (3 * 32 * 32) + 4 * (16 * 32 * 32) + 8 * (16 * 16 * 16) + 4 * (16 * 16 * 16) + 4 * 10 + 8 * 1;
    EXPECT_EQ(saved_bytes_fp32(g->blocks[0], 1), expected);

    // Mismatch: the pooled, flattened map has 4096 features.
    json bad = json::parse(net);
    bad["layers"][4]["in"] = 1024;
    auto e = load_layer_list_json(bad, "cnn.json");
    ASSERT_FALSE(e.ok());
    const std::string& m = e.error().message;
    EXPECT_NE(m.find("cnn.json: layers[4] (linear): \"in\" is 1024 but the previous layer outputs 4096 features"),
              std::string::npos)
        << m;

    // Stride and padding formula: conv k5 s2 p0 on 32 -> floor((32-5)/2)+1 = 14.
    json s = json::parse(net);
    s["layers"][0] = {{"type", "conv2d"}, {"in", 3}, {"out", 16}, {"kernel", 5}, {"stride", 2}};
    s["layers"][4]["in"] = 16 * 7 * 7;
    auto g2 = load_layer_list_json(s, "s.json");
    ASSERT_TRUE(g2.ok()) << g2.error().message;

    json c = json::parse(net);
    c["layers"][0]["in"] = 1;
    auto e2 = load_layer_list_json(c, "cnn.json");
    ASSERT_FALSE(e2.ok());
    EXPECT_NE(e2.error().message.find("layers[0] (conv2d): \"in\" is 1 but the input has 3 channels"),
              std::string::npos)
        << e2.error().message;
}

TEST(LayerList, Vgg16MatchesTorchvision) {
    auto g = load_model(kSrc + "/tests/fixtures/models/vgg16.json");
    ASSERT_TRUE(g.ok()) << g.error().message;
    const json tv = read_json(kSrc + "/tests/fixtures/groundtruth/torchvision_param_counts.json");
    std::int64_t published = 0;
    for (const auto& e : tv)
        if (e["id"] == "param-tv-vgg16") published = e["published_num_params"].get<std::int64_t>();
    ASSERT_EQ(published, 138357544);
    EXPECT_EQ(g->total_params(), published);
    EXPECT_EQ(g->source, "layer-list");
}

TEST(LayerList, EmbeddingAttentionBatchnormLayernorm) {
    const char* net = R"({
      "input": {"shape": [32], "dtype": "int64"},
      "layers": [
        {"type": "embedding", "num": 1000, "dim": 64},
        {"type": "layernorm", "dim": 64},
        {"type": "multihead_attention", "embed_dim": 64, "heads": 4, "dropout": 0.1},
        {"type": "gelu"},
        {"type": "linear", "in": 64, "out": 10}
      ],
      "loss": "cross_entropy"
    })";
    auto g = load_layer_list_json(json::parse(net), "tx.json");
    ASSERT_TRUE(g.ok()) << g.error().message;
    const std::int64_t E = 64;
    EXPECT_EQ(g->total_params(), 1000 * 64 + 2 * 64 + (4 * E * E + 4 * E) + 64 * 10 + 10);

    json bad = json::parse(net);
    bad["input"]["dtype"] = "float32";
    auto e = load_layer_list_json(bad, "tx.json");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find("layers[0] (embedding)"), std::string::npos) << e.error().message;

    json heads = json::parse(net);
    heads["layers"][2]["heads"] = 5;
    auto h = load_layer_list_json(heads, "tx.json");
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.error().message.find("layers[2].heads"), std::string::npos) << h.error().message;

    const char* bn = R"({"input": {"shape": [8, 10, 10]},
      "layers": [{"type": "batchnorm2d", "features": 8}, {"type": "avgpool2d", "kernel": 2},
                 {"type": "adaptive_avgpool2d", "output": 1}, {"type": "flatten"},
                 {"type": "linear", "in": 8, "out": 2, "bias": false}, {"type": "softmax"}],
      "loss": "mse"})";
    auto b = load_layer_list_json(json::parse(bn), "bn.json");
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(b->total_params(), 2 * 8 + 8 * 2);
}

TEST(LayerList, Errors) {
    auto err = [](const std::string& text) {
        auto r = load_layer_list_json(json::parse(text), "model.json");
        EXPECT_FALSE(r.ok()) << text;
        return r.ok() ? std::string() : r.error().message;
    };
    std::string m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "lstm", "in": 4}]})");
    EXPECT_NE(m.find("layers[0].type \"lstm\""), std::string::npos) << m;
    EXPECT_NE(m.find("linear"), std::string::npos) << m;
    EXPECT_NE(m.find("multihead_attention"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "linear", "out": 4}]})");
    EXPECT_NE(m.find("layers[0].in"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "linear", "in": 4, "out": 0}]})");
    EXPECT_NE(m.find("layers[0].out"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "linear", "in": 4, "out": -3}]})");
    EXPECT_NE(m.find("layers[0].out"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"in": 4}]})");
    EXPECT_NE(m.find("layers[0].type"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "conv2d", "in": 4, "out": 4, "kernel": 3}]})");
    EXPECT_NE(m.find("[C, H, W]"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [3, 4, 4]}, "layers": [{"type": "conv2d", "in": 3, "out": 4, "kernel": 5}]})");
    EXPECT_NE(m.find("layers[0] (conv2d)"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [0]}, "layers": [{"type": "relu"}]})");
    EXPECT_NE(m.find("input.shape"), std::string::npos) << m;

    m = err(R"({"layers": [{"type": "relu"}]})");
    EXPECT_NE(m.find("input"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "relu"}], "loss": "hinge"})");
    EXPECT_NE(m.find("hinge"), std::string::npos) << m;

    m = err(R"({"input": {"shape": [4]}, "layers": [{"type": "dropout", "p": 1.5}]})");
    EXPECT_NE(m.find("layers[0].p"), std::string::npos) << m;
}

// ============================================================================
// --params
// ============================================================================

TEST(ParamCount, Parses) {
    auto v = [](const char* s) {
        auto r = parse_param_count(s);
        EXPECT_TRUE(r.ok()) << s << ": " << (r.ok() ? "" : r.error().message);
        return r.ok() ? r.value() : -1;
    };
    EXPECT_EQ(v("7B"), 7'000'000'000);
    EXPECT_EQ(v("1.5e9"), 1'500'000'000);
    EXPECT_EQ(v("125M"), 125'000'000);
    EXPECT_EQ(v("70b"), 70'000'000'000);
    EXPECT_EQ(v("350k"), 350'000);
    EXPECT_EQ(v("1234567"), 1'234'567);
    EXPECT_EQ(v("6.7 B"), 6'700'000'000);
    EXPECT_EQ(v(" 1.3T "), 1'300'000'000'000);
    EXPECT_EQ(v("0.5B"), 500'000'000);
    EXPECT_EQ(v("1e3k"), 1'000'000);
    EXPECT_EQ(v("1,234,567"), 1'234'567);
}

TEST(ParamCount, Errors) {
    for (const char* s : {"-7B", "abc", "0", "0.0B", "7X", "", "B", "1.2.3", "7BB", "1e"}) {
        auto r = parse_param_count(s);
        ASSERT_FALSE(r.ok()) << s;
        EXPECT_NE(r.error().message.find(std::string("\"") + s + "\""), std::string::npos) << r.error().message;
    }
    EXPECT_NE(parse_param_count("-7B").error().message.find("negative"), std::string::npos);
    auto big = parse_param_count("1e30");
    ASSERT_FALSE(big.ok());
    EXPECT_EQ(big.error().code, ErrorCode::Overflow);
    auto big2 = parse_param_count("99999999999T");
    ASSERT_FALSE(big2.ok());
    EXPECT_EQ(big2.error().code, ErrorCode::Overflow);
}

TEST(ParamCount, ParamsOnlyGraph) {
    const auto g = params_only_graph(7'000'000'000);
    EXPECT_EQ(g.total_params(), 7'000'000'000);
    EXPECT_EQ(g.family, "params-only");
    EXPECT_EQ(g.source, "--params");
    EXPECT_FALSE(g.has_sequence);
    EXPECT_TRUE(g.blocks.empty());
    ASSERT_FALSE(g.notes.empty());
    EXPECT_NE(g.notes.front().find("activations are not modelled"), std::string::npos);
}

// The readers added for Qwen3-Next and Llama 4 on hostile field values: every
// field of their configs (top level and nested) set in turn to zero, a
// negative, a huge, a fractional, a string, a null, an empty list and an
// object; each load either succeeds or names a field, never crashes.
TEST(ConfigJson, HybridReadersOnHostileValues) {
    TempDir d;
    const std::vector<json> hostile = {0, -3, 1e15, 2.5, "x", nullptr, json::array(), json::object()};
    int errors = 0, loads = 0;
    for (const std::string& rel : {std::string("tests/fixtures/configs/tiny-qwen3-next.json"), std::string("data/presets/configs/llama-4-scout-17b-16e-instruct.json")}) {
        std::ifstream in(test::source_path(rel));
        const json base = json::parse(in);
        std::vector<std::vector<std::string>> paths;
        for (auto it = base.begin(); it != base.end(); ++it) {
            if (it->is_object())
                for (auto jt = it->begin(); jt != it->end(); ++jt) paths.push_back({it.key(), jt.key()});
            else paths.push_back({it.key()});
        }
        for (const auto& path : paths)
            for (const json& v : hostile) {
                json c = base;
                if (path.size() == 1) c[path[0]] = v;
                else c[path[0]][path[1]] = v;
                d.write("c.json", c.dump());
                const auto r = load_hf_config_file(d.file("c.json"));
                if (r.ok()) {
                    ++loads;
                } else {
                    ++errors;
                    EXPECT_FALSE(r.error().message.empty());
                }
            }
    }
    EXPECT_GT(errors, 50);
    EXPECT_GT(loads, 50);
}
