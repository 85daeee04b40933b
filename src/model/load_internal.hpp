// src/model/load_internal.hpp — helpers shared by the loaders (load.cpp,
// layer_list.cpp, safetensors.cpp). Private to src/model.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "gpumem/core/result.hpp"

namespace gpumem::detail {

// Reads a whole file; throws InputError (NotFound / Io) naming the path.
std::string read_text_file(const std::string& path);

// Parses JSON text; a syntax error or truncated document throws InputError
// ParseError: "<origin>: invalid JSON at byte N: <reason>; <fix>".
nlohmann::json parse_json_text(const std::string& text, std::string_view origin);

// read_text_file + parse_json_text.
nlohmann::json read_json_file(const std::string& path);

// Short kind name of a JSON value for messages ("string", "number", ...).
const char* json_kind(const nlohmann::json& j);

// capture() that also converts nlohmann's type/range errors into an Error.
template <class F>
auto guard(F&& f) -> decltype(capture(std::forward<F>(f))) {
    try {
        return capture(std::forward<F>(f));
    } catch (const nlohmann::json::exception& e) {
        return Error{ErrorCode::ParseError, std::string("unexpected JSON value: ") + e.what(), ""};
    }
}

}  // namespace gpumem::detail
