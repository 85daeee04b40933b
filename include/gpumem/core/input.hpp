// gpumem/core/input.hpp — reading untrusted input within fixed bounds.
//
// Every file gpumem reads (configs, layer lists, model graphs, snapshots,
// Megatron/DeepSpeed arguments, calibration files, OOM text) and every request
// body may be hostile or absurd: a FIFO that never ends, /dev/zero, a 10 GB
// "config", JSON nested 100,000 levels deep. These helpers are the one place
// where such input is bounded before any work is done on it:
//   - read_input_file opens regular files only (after following symlinks),
//     checks the size against a per-format cap before reading, and reads at
//     most that many bytes (a file that grows while read is refused too);
//   - check_json_depth scans JSON text without recursion and refuses nesting
//     deeper than a limit, so that no recursive parser or destructor can
//     exhaust the stack (nlohmann::json destroys values recursively).
// Errors are InputErrors naming the file or field and the limit (docs/security.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpumem {

// Caps per input format, in bytes. Each is far above any real file of its kind
// (the largest HF config.json is ~10 KiB; a tokenizer-free model folder's JSON
// ~100 KiB; a snapshot of a long run ~1 GiB as pickle).
inline constexpr std::int64_t kMaxConfigBytes = 64LL << 20;     // config.json, layer lists, model graphs, args files
inline constexpr std::int64_t kMaxTextBytes = 64LL << 20;       // OOM messages, nvidia-smi text, doctor input
inline constexpr std::int64_t kMaxSnapshotBytes = 4LL << 30;    // torch.cuda.memory._snapshot() pickle or JSON
inline constexpr std::int64_t kMaxModelFileBytes = 1LL << 30;   // ONNX graph (weights may live outside)
inline constexpr std::int64_t kMaxRequestBytes = 8LL << 20;     // one service / Python request body

// Deepest JSON nesting accepted anywhere. Real inputs nest < 10 levels
// (a model graph ~6, a snapshot JSON ~6, an HF config ~4).
inline constexpr int kMaxJsonDepth = 64;

// Reads a whole regular file of at most `cap` bytes. `what` names the kind of
// file in messages ("config", "snapshot"). Throws InputError (exit 2) for a
// missing file, a folder, a FIFO/device/socket, an unreadable file, or one
// larger than `cap` — each with the reason and the fix.
std::string read_input_file(const std::string& path, std::int64_t cap, std::string_view what);

// Same checks without reading: returns the size of a regular file <= cap.
std::int64_t check_input_file(const std::string& path, std::int64_t cap, std::string_view what);

// Throws InputError naming `origin` when `text` (JSON) nests deeper than
// `max_depth` arrays/objects. Linear, no recursion; strings are skipped.
void check_json_depth(std::string_view text, std::string_view origin, int max_depth = kMaxJsonDepth);
// check_json_depth, and also refuses text holding more than `max_values` JSON
// values (counted at every ',', '[' and '{' outside strings): the service's
// bound on what one request body may build. Linear, no recursion.
void check_json_text(std::string_view text, std::string_view origin, int max_depth, std::size_t max_values);

// Text given as a std::string or literal is text (not a JSON string value:
// gpumem/api/api.hpp has an overload for parsed values).
inline void check_json_depth(const std::string& text, std::string_view origin, int max_depth = kMaxJsonDepth) {
    check_json_depth(std::string_view(text), origin, max_depth);
}
inline void check_json_depth(const char* text, std::string_view origin, int max_depth = kMaxJsonDepth) {
    check_json_depth(std::string_view(text), origin, max_depth);
}

// Parses a decimal integer in [lo, hi] from text (no sign games, no trailing
// junk); throws InputError naming `field` with the allowed range otherwise.
std::int64_t parse_int_in_range(std::string_view text, std::string_view field, std::int64_t lo, std::int64_t hi);

}  // namespace gpumem
