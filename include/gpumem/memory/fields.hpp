// gpumem/memory/fields.hpp — the one table of request fields.
//
// Every input any command takes (a job's model, batch, precision, layout, the
// time model's options, the planner's restrictions, ...) is one row here:
// its name (the CLI flag without "--" and the JSON key, '-' or '_'), type and
// unit, default, allowed values, help text, help group, the commands and
// modes it applies to, and where it lands in the Request. The CLI options and
// their --help, the JSON reader and writer, the reproducing command line, the
// Python keyword arguments and stubs, the shell completions, the man page and
// the web page's form are all generated from (or driven by) this table, so a
// new field is one row.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"

namespace gpumem {

// The commands of the CLI, the HTTP service (/v1/<name>) and Python.
enum class Command : std::uint8_t {
    Estimate, Timeline, Fit, Advise, Plan, Sweep, Doctor, Params, Snapshot, CompatDeepSpeed, CompatMegatron, Models, Gpus, Serving, Calibrate, Count
};
const char* to_string(Command);  // "estimate", ..., "compat-deepspeed"
Result<Command> parse_command(std::string_view name);
const std::vector<Command>& all_commands();

enum class FieldType : std::uint8_t {
    String,      // free text
    Path,        // a file name (never read by the HTTP service)
    Int,         // whole number
    Number,      // real number
    Bool,        // true/false; on the command line --name / --no-name
    Size,        // bytes: text needs a unit (24GiB, 80GB), a JSON number is bytes
    Percent,     // a fraction: "5%" or 0.05
    Count,       // a parameter count: 7B, 125M or a whole number
    Enum,        // one of `values`
    IntList,     // "1,2,4" or [1, 2, 4]
    StringList,  // "q_proj,v_proj" or ["q_proj", "v_proj"]
    EnumList,    // several of `values`
    Object,      // a JSON object (an uploaded config.json)
};
const char* to_string(FieldType);

// Mode bits (Mode::Train = 1, Lora = 2, QLora = 4, Infer = 8).
constexpr std::uint8_t mode_bit(Mode m) { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(m)); }
constexpr std::uint8_t kAllModes = 0x0f;

struct Field {
    std::string name;          // "grad-accum"
    FieldType type = FieldType::String;
    // The texts are string literals of the table (memory/fields.cpp): views,
    // so that building the table at start-up copies none of them.
    std::string_view group;    // "job", "precision", "savers", "layout", "gpu", "time", ...
    std::string_view help;
    std::string_view unit;     // "bytes", "tokens", "sequences", "GB/s", "" ...
    std::uint32_t commands = 0;  // bit per Command
    std::uint8_t modes = kAllModes;
    std::vector<std::string> values;   // Enum / EnumList choices
    std::vector<std::string> aliases;  // other CLI spellings ("batch-list")
    std::string_view default_text;     // a default computed from other fields, in words
    nlohmann::json default_value;      // the default as JSON; null when none or computed
    std::optional<double> min, max;    // Int / Number / Size / Count / list-entry range (inclusive)
    // Why the range ends where it does (docs/limits.md): limits on fields whose
    // size drives work or memory sit far above real use, so that an absurd
    // value is refused up front instead of overflowing or exhausting memory.
    std::string_view limit;
    std::optional<std::int64_t> max_items;  // IntList / StringList / EnumList: most entries
    bool positional = false;           // the CLI's first argument (MODEL, MESSAGE, FILE)
    bool required = false;
    bool cli_only = false;             // an output of the command line (--format, --timeline)
    // Where the value lands: set() takes the canonical JSON value;
    // get() returns it (null when unset).
    std::function<void(Request&, const nlohmann::json&)> set;
    std::function<nlohmann::json(const Request&)> get;

    [[nodiscard]] bool in(Command c) const { return (commands >> static_cast<unsigned>(c)) & 1u; }
    std::string key;           // the JSON key: name with underscores, "grad_accum" (set with the table)
    [[nodiscard]] const std::string& json_key() const { return key; }
    [[nodiscard]] std::string flag() const { return "--" + name; }
};

// The table, in help order.
const std::vector<Field>& fields();
// The fields of one command, in help order.
const std::vector<const Field*>& fields_of(Command c);  // built once per command
// The command's positional argument (MODEL, MESSAGE or FILE); the other
// fields marked positional are --flags of that command (doctor's --model).
const Field* positional_of(Command c);
// By name, dashes or underscores, any case; nullptr when absent.
const Field* find_field(std::string_view name);
// The row of that name which applies to command c (two commands may give one
// name different rows: `quant` is a job's QLoRA type and serving's GGUF type),
// else the first of that name.
const Field* find_field(std::string_view name, Command c);
// The help groups in order, with their titles.
const std::vector<std::pair<std::string, std::string>>& field_groups();

// One raw value (JSON, or the text a command line gave) to the field's
// canonical JSON value, checking type, unit and range; the error names the
// field and the fix.
Result<nlohmann::json> canonical_value(const Field& f, const nlohmann::json& raw);

// Most points one sweep may ask for (batches x seqs): each is a whole estimate,
// up to ~1 s simulated for an 8B model, so 256 points bound a sweep to minutes.
inline constexpr std::int64_t kMaxSweepPoints = 256;

// Reads a request body for a command: keys are field names ('-' or '_');
// an unknown key or one that does not apply to the command is an error with
// a did-you-mean.
Result<Request> parse_request(Command c, const nlohmann::json& body);
// The fields of a command that differ from their defaults, as canonical JSON
// (underscored keys, table order).
nlohmann::json request_json(const Request& r, Command c);
// `gpumem <command> MODEL --flag value ...` with the fields that differ
// from their defaults: re-runs the request as it was.
std::string request_command(const Request& r, Command c);

// The table for the page, Python and docs: {"fields": [...], "groups": [...],
// "commands": [...]}.
nlohmann::json fields_json();

}  // namespace gpumem
