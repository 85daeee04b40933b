// Internal to the serving engines (serving_*.cpp, llamacpp.cpp): reading an
// engine's own command line (`vllm serve ...`, `llama-server ...`) flag by
// flag with the engine's spelling, and the checks every engine model shares.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/memory/serving.hpp"

namespace gpumem::engine_args {

inline void check(bool ok, const char* field, const std::string& msg) {
    if (!ok) fail(ErrorCode::InvalidArgument, field, msg);
}

// An integer flag value, all of it ("--max-model-len 32k" is an error naming the flag).
inline std::int64_t to_int(const std::string& engine, const std::string& flag, const std::string& v) {
    std::int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || v.empty()) fail(ErrorCode::InvalidArgument, "command", engine + " " + flag + " takes an integer (got \"" + v + "\")");
    return n;
}

// A number flag value (`--gpu-memory-utilization 0.9`, `--cpu-offload-gb 4`), all of it.
inline double to_number(const std::string& engine, const std::string& flag, const char* field, const std::string& v) {
    char* end = nullptr;
    const double u = std::strtod(v.c_str(), &end);
    check(end && *end == '\0' && !v.empty(), field, engine + " " + flag + " takes a number (got \"" + v + "\")");
    return u;
}

// --request-len (default: the engine's longest request, out.max_model_len) and
// --output-len (min(256, half the request)), checked against that limit;
// `limit` names it and `fix` says what the engine does and how to change it.
inline void set_request_len(ServingResult& out, const ServingOptions& o, const std::string& limit, const std::string& fix) {
    out.request_len = o.request_len.value_or(out.max_model_len);
    check(out.request_len >= 1, "request-len", "--request-len must be a positive number of tokens");
    check(out.request_len <= out.max_model_len, "request-len",
          "--request-len " + std::to_string(out.request_len) + " is longer than " + limit + " " + std::to_string(out.max_model_len) + ": " + fix);
    out.output_len = o.output_len.value_or(std::min<std::int64_t>(256, out.request_len / 2));
    check(out.output_len >= 0 && out.output_len < out.request_len, "output-len",
          "--output-len must be at least 0 and shorter than the request (" + std::to_string(out.request_len) + " tokens)");
}

// Walks argv from `first`: each argument once, a `--flag=value` split into the
// flag and its inline value; value() takes the inline value or the next argument.
class FlagReader {
public:
    FlagReader(const std::vector<std::string>& argv, std::size_t first, std::string engine) : argv_(argv), i_(first), engine_(std::move(engine)) {}

    // The next argument; false at the end.
    bool next() {
        if (started_) ++i_;
        started_ = true;
        if (i_ >= argv_.size()) return false;
        flag_ = argv_[i_];
        inline_.clear();
        has_inline_ = false;
        if (flag_.rfind("--", 0) == 0)
            if (const auto eq = flag_.find('='); eq != std::string::npos) {
                inline_ = flag_.substr(eq + 1);
                flag_ = flag_.substr(0, eq);
                has_inline_ = true;
            }
        return true;
    }
    [[nodiscard]] const std::string& flag() const { return flag_; }
    [[nodiscard]] bool is_flag() const { return !flag_.empty() && flag_[0] == '-'; }
    [[nodiscard]] std::size_t index() const { return i_; }
    void set_flag(std::string f) { flag_ = std::move(f); }
    // The flag's value: inline, else the next argument.
    std::string value() {
        if (has_inline_) return inline_;
        check(i_ + 1 < argv_.size(), "command", engine_ + " " + flag_ + " needs a value");
        return argv_[++i_];
    }
    // The next argument when it is one of `allowed` (an optional value: `-fa` or `-fa on`).
    bool take_if(const std::vector<std::string>& allowed, std::string* out) {
        if (has_inline_) {
            *out = inline_;
            return true;
        }
        if (i_ + 1 < argv_.size())
            for (const auto& a : allowed)
                if (argv_[i_ + 1] == a) {
                    *out = argv_[++i_];
                    return true;
                }
        return false;
    }
    [[nodiscard]] bool has_inline() const { return has_inline_; }

private:
    const std::vector<std::string>& argv_;
    std::size_t i_;
    std::string engine_;
    std::string flag_, inline_;
    bool has_inline_ = false, started_ = false;
};

}  // namespace gpumem::engine_args
