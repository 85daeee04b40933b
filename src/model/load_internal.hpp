// src/model/load_internal.hpp — helpers shared by the loaders (load.cpp,
// layer_list.cpp, safetensors.cpp). Private to src/model.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "gpumem/core/result.hpp"

namespace gpumem::detail {

// Reads a whole regular file of at most kMaxConfigBytes (read_input_file);
// throws InputError naming the path for a missing file, a folder, a FIFO or
// device, or one too large. `what` names the kind of file in messages.
std::string read_text_file(const std::string& path, std::string_view what = "model description");

// Parses JSON text, refusing nesting deeper than kMaxJsonDepth first; a syntax error or truncated document throws InputError
// ParseError: "<origin>: invalid JSON at byte N: <reason>; <fix>".
nlohmann::json parse_json_text(const std::string& text, std::string_view origin);

// read_text_file + parse_json_text.
nlohmann::json read_json_file(const std::string& path);

// Short kind name of a JSON value for messages ("string", "number", ...).
const char* json_kind(const nlohmann::json& j);

// The InputError-style Error for a filesystem error met while reading a model
// folder ("<path>: too many levels of symbolic links ...").
Error fs_error(const std::filesystem::filesystem_error& e);

// capture() that also converts nlohmann's type/range errors into an Error.
template <class F>
auto guard(F&& f) -> decltype(capture(std::forward<F>(f))) {
    try {
        return capture(std::forward<F>(f));
    } catch (const nlohmann::json::exception& e) {
        return Error{ErrorCode::ParseError, std::string("unexpected JSON value: ") + e.what(), ""};
    } catch (const std::filesystem::filesystem_error& e) {
        // A folder walk that meets a link loop, a vanished file or a
        // permission error: name the path, not an internal error.
        return fs_error(e);
    }
}

}  // namespace gpumem::detail
