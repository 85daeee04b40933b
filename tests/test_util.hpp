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

}  // namespace gpumem::test
