// fuzz/fuzz_common.hpp — what every gpumem fuzz target shares.
//
// A target feeds the bytes libFuzzer gives it to one library entry point. An
// InputError, an OverflowError or a Result error is a normal answer to hostile
// input (the CLI prints one line and exits 2); anything else is a finding:
// a crash, a sanitizer report, any other exception (libFuzzer reports an
// uncaught exception as a crash through std::terminate), more than the RSS
// limit, or more than the time limit per input (scripts/fuzz.sh sets both).
//
// File loaders are fuzzed through their file entry points, so that the
// bounded reading (core/input.hpp) is part of what is tested: the bytes are
// written to one scratch file per process, overwritten for every input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>

#include "gpumem/core/result.hpp"

namespace gpumem_fuzz {

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// The scratch file "<TMPDIR>/gpumem-fuzz-<pid>/<name>", holding `bytes`.
// The folder is made once per process; the name keeps the extension a
// loader dispatches on (.json, .onnx).
inline const std::string& write_scratch(std::string_view name, std::string_view bytes) {
    // Made on first use, removed at exit.
    struct Scratch {
        std::string dir;
        Scratch() {
            const char* tmp = std::getenv("TMPDIR");
            dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/gpumem-fuzz-" + std::to_string(::getpid());
            std::filesystem::create_directories(dir);
        }
        ~Scratch() {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
        }
    };
    static const Scratch scratch;
    const std::string& dir = scratch.dir;
    static std::string path;
    path = dir + "/" + std::string(name);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
    return path;
}

// Runs f(); InputError and OverflowError are answers, everything else escapes.
template <class F>
void answer_or_error(F&& f) {
    try {
        f();
    } catch (const gpumem::InputError&) {
    } catch (const gpumem::OverflowError&) {
    }
}

// A Result error must carry a message (the CLI prints it as its one line).
template <class T>
void check_error_message(const gpumem::Result<T>& r) {
    if (!r.ok() && r.error().message.empty()) {
        std::fprintf(stderr, "finding: an error with an empty message\n");
        std::abort();
    }
}

}  // namespace gpumem_fuzz
