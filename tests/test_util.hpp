// Helpers shared by the tests: fixture paths and running the CLI.
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace gpumem::test {

inline std::string source_path(const std::string& rel) { return std::string(GPUMEM_SOURCE_DIR) + "/" + rel; }

inline nlohmann::json read_json(const std::string& rel) {
    std::ifstream f(source_path(rel));
    return nlohmann::json::parse(f);
}

struct CliResult {
    int exit_code = 0;
    std::string out;  // stdout
    std::string err;  // stderr
};

// Runs build/gpumem with the given argument string (shell-quoted by the caller).
inline CliResult run_cli(const std::string& args) {
    static int counter = 0;
    const std::string errfile = std::string(::testing::TempDir()) + "gpumem_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
    const std::string cmd = std::string(GPUMEM_CLI_PATH) + " " + args + " 2>" + errfile;
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

}  // namespace gpumem::test
