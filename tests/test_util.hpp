// Helpers shared by the tests: fixture paths and running the CLI.
#pragma once

#include <algorithm>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"

namespace gpumem::test {

inline std::string source_path(const std::string& rel) { return std::string(GPUMEM_SOURCE_DIR) + "/" + rel; }

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

inline nlohmann::json read_json(const std::string& rel) {
    std::ifstream f(source_path(rel));
    return nlohmann::json::parse(f);
}

// A temporary folder removed when the object goes (tests must not leave
// files behind: CI machines run the suite again and again). ScratchDir(tag)
// names it gpumem_<tag>_<pid>; process_scratch() is one per test program,
// removed at exit.
class ScratchDir {
public:
    explicit ScratchDir(const std::string& tag)
        : path_(std::filesystem::path(::testing::TempDir()) / ("gpumem_" + tag + "_" + std::to_string(::getpid()))) {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
        std::filesystem::create_directories(path_);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }
    [[nodiscard]] std::string str() const { return path_.string(); }
    [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
    // Writes `content` (bytes as given) to `name` in the folder; returns its path.
    std::string write(const std::string& name, const std::string& content) const {
        std::ofstream(path_ / name, std::ios::binary) << content;
        return file(name);
    }

private:
    std::filesystem::path path_;
};

inline const ScratchDir& process_scratch() {
    static const ScratchDir dir("test");
    return dir;
}

struct CliResult {
    int exit_code = 0;
    std::string out;  // stdout
    std::string err;  // stderr
};

// Runs a shell command line and collects its stdout, stderr and exit status.
// The first line where two texts differ, labelled, for a failure message.
inline std::string first_difference(const std::string& a, const std::string& b, const std::string& label_a, const std::string& label_b) {
    std::size_t i = 0, line = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) {
        if (a[i] == '\n') line = i + 1;
        ++i;
    }
    auto upto = [&](const std::string& s) { return s.substr(line, s.find('\n', line) - line); };
    return label_a + ": " + upto(a) + "\n    " + label_b + ": " + upto(b);
}

inline CliResult run_shell(const std::string& command) {
    static int counter = 0;
    const std::string errfile = std::string(::testing::TempDir()) + "gpumem_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
    const std::string cmd = "exec 2>" + errfile + "; " + command;
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    std::size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(errfile);
    std::stringstream ss;
    ss << e.rdbuf();
    r.err = ss.str();
    std::remove(errfile.c_str());
    return r;
}

// Runs build/gpumem with the given argument string (shell-quoted by the caller).
inline CliResult run_cli(const std::string& args) { return run_shell(std::string(GPUMEM_CLI_PATH) + " " + args); }

// The input-error contract of every command: exit status 2 and one line on
// stderr that contains `must_contain` (the field or file and the fix).
inline void expect_input_error(const CliResult& r, const std::string& must_contain) {
    EXPECT_EQ(r.exit_code, 2) << r.err << r.out.substr(0, 200);
    EXPECT_NE(r.err.find(must_contain), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

// The Hugging Face config.json of an oracle case (oracle/activations_oracle.py
// gpt2_config / llama_config keys -> transformers' config keys).
inline nlohmann::json oracle_hf_config(const nlohmann::json& c, const std::string& family) {
    if (family == "gpt2")
        return {{"model_type", "gpt2"},           {"n_embd", c["hidden"]},          {"n_head", c["heads"]},
                {"n_layer", c["layers"]},         {"n_inner", c["intermediate"]},   {"vocab_size", c["vocab"]},
                {"n_positions", c["n_positions"]}, {"resid_pdrop", c["resid_pdrop"]}, {"embd_pdrop", c["embd_pdrop"]},
                {"attn_pdrop", c["attn_pdrop"]},  {"layer_norm_epsilon", c["eps"]}};
    nlohmann::json j = {{"model_type", "llama"},
                        {"hidden_size", c["hidden"]},
                        {"num_attention_heads", c["heads"]},
                        {"num_key_value_heads", c["kv_heads"]},
                        {"num_hidden_layers", c["layers"]},
                        {"intermediate_size", c["intermediate"]},
                        {"vocab_size", c["vocab"]},
                        {"tie_word_embeddings", c["tie_word_embeddings"]},
                        {"max_position_embeddings", 4096},
                        {"rms_norm_eps", c["eps"]}};
    if (c.contains("attention_dropout")) j["attention_dropout"] = c["attention_dropout"];
    return j;
}

// The request of the CPU step oracles (oracle/step_oracle.py, loops_oracle.py):
// fp32, eager attention, the for-loop AdamW, live tensor bytes only.
inline EstimateRequest oracle_step_request(const nlohmann::json& cs) {
    EstimateRequest req;
    req.precision = Precision::FP32;
    req.attention = Attention::Eager;
    req.optimizer = Optimizer::AdamW;
    req.optimizer_impl = OptimizerImpl::ForLoop;
    req.allocator = AllocatorKind::None;
    req.batch = cs["batch"].get<std::int64_t>();
    req.seq = cs["seq"].get<std::int64_t>();
    return req;
}

// torch 1.13 (the oracle) keeps, for every LLaMA RMSNorm, the x^2 input of
// mean() (b*s*h fp32) until that norm's backward; torch >= 2.0 keeps only
// sizes. The bytes to take off the oracle's forward/backward numbers.
inline std::int64_t oracle_mean_saves(const nlohmann::json& cs) {
    if (cs["family"] != "llama") return 0;
    const auto& c = cs["config"];
    return (2 * c["layers"].get<std::int64_t>() + 1) * cs["seq"].get<std::int64_t>() * cs["batch"].get<std::int64_t>() *
           c["hidden"].get<std::int64_t>() * 4;
}

// An oracle step's peak as torch >= 2.0 would show it.
// Where the oracle recorded it (loops_oracle.py inplace_grad_sum), the peak
// with torch >= 2.0's in-place gradient sums in autograd's InputBuffer
// (torch 1.13 allocates `old + new` and frees the old buffer).
inline std::int64_t oracle_modern_peak(const nlohmann::json& step, std::int64_t mean_saves) {
    const nlohmann::json& s = step.contains("inplace_grad_sum") ? step["inplace_grad_sum"] : step;
    const std::string phase = s["peak_phase"];
    return s["peak_bytes"].get<std::int64_t>() - (phase == "forward" || phase == "backward" ? mean_saves : 0);
}

// A small Llama built from its config.json keys (the tests' hand-written models).
struct LlamaShape {
    std::int64_t hidden = 256, heads = 4, kv_heads = 2, layers = 3, intermediate = 688, vocab = 1000;
    bool tied = false;
    std::int64_t max_positions = 4096;
};
inline ModelGraph llama_graph(const LlamaShape& s) {
    const nlohmann::json c = {{"model_type", "llama"},          {"hidden_size", s.hidden},        {"num_attention_heads", s.heads},
                              {"num_key_value_heads", s.kv_heads}, {"num_hidden_layers", s.layers}, {"intermediate_size", s.intermediate},
                              {"vocab_size", s.vocab},          {"max_position_embeddings", s.max_positions}, {"tie_word_embeddings", s.tied}};
    auto g = load_hf_config_json(c, "test");
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
    return std::move(g).value();
}

// A breakdown row's bytes (`missing` when the estimate has no such row), and
// the sum of every row (which must equal per_gpu.total_device).
inline Bytes breakdown_row(const EstimateResult& e, const std::string& key, Bytes missing = Bytes(-1)) {
    for (const auto& r : e.breakdown)
        if (r.key == key) return r.bytes;
    return missing;
}
inline Bytes breakdown_sum(const EstimateResult& e) {
    Bytes s;
    for (const auto& r : e.breakdown) s += r.bytes;
    return s;
}

}  // namespace gpumem::test
