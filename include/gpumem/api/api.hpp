// gpumem/api/api.hpp — the one entry point every front end calls.
//
// The CLI (flags -> request JSON), the HTTP service (POST /v1/<command>) and
// the Python bindings (keyword arguments) all build a JSON body whose keys
// are the field table's names (gpumem/memory/fields.hpp), and call run():
// parse_request -> the library -> an Answer holding the typed result. The
// front end prints it with render() (text, CSV, Markdown, JSON) or sends
// answer_json(). Errors come back as Error (code, message, field) through one
// ladder (guarded) for the front end to map (exit 2, HTTP 4xx, ValueError).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/core/input.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/fields.hpp"
#include "gpumem/memory/serving.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/plan/advisor.hpp"
#include "gpumem/plan/calibrate.hpp"
#include "gpumem/plan/compat.hpp"
#include "gpumem/plan/compute.hpp"
#include "gpumem/plan/doctor.hpp"
#include "gpumem/plan/fit.hpp"
#include "gpumem/plan/planner.hpp"
#include "gpumem/plan/sweep.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/sim/snapshot.hpp"

namespace gpumem {

// The version of every JSON answer's shape (docs/schema/): bumped when a
// field is removed or changes meaning; new fields keep it.
inline constexpr int kSchemaVersion = 1;

struct ParamsAnswer {
    ModelGraph graph;
    ParamSummary summary;
};
struct ModelsAnswer {};
struct GpusAnswer {};

struct Answer {
    Command command = Command::Estimate;
    Request request;
    std::variant<FullEstimate, ParamsAnswer, FitResult, AdviceResult, PlanResult, SweepResult, DoctorResult, sim::SnapshotReport,
                 DeepSpeedEstimate, MegatronMemoryReport, ModelsAnswer, GpusAnswer, ServingResult, CalibrateResult>
        result;
};

struct CallOptions {
    bool allow_paths = false;  // read files named in the request (CLI, Python), not the HTTP service
};

// Runs one command on a parsed request.
Result<Answer> run(Command c, const Request& r, const CallOptions& o = {});
// Parses the body and runs it.
Result<Answer> run(Command c, const nlohmann::json& body, const CallOptions& o = {});
// The answer as JSON (the CLI's --format json): with "schema_version".
nlohmann::json answer_json(const Answer& a);
// The answer for people or scripts.
std::string render(const Answer& a, Format f);

// One call for JSON front ends: command name + body -> JSON answer.
Result<nlohmann::json> api_call(std::string_view command, const nlohmann::json& body, bool allow_paths = false);
// `snapshot` for raw uploaded bytes (a pickle is binary, not a JSON string):
// options take the snapshot command's fields (alloc-conf, device, replay).
Result<nlohmann::json> api_snapshot_bytes(std::string_view data, const nlohmann::json& options);
// Names of the commands api_call takes.
const std::vector<std::string>& api_commands();
// Throws InputError (parse_error, naming `origin`) when a parsed JSON value
// nests deeper than max_depth arrays/objects; iterative, so safe on any value.
// run(), api_call() and api_snapshot_bytes() check their bodies with it; text
// is checked with check_json_depth(std::string_view, ...) (core/input.hpp)
// before it is parsed.
void check_json_depth(const nlohmann::json& value, std::string_view origin, int max_depth = kMaxJsonDepth);

// The error ladder every front end shares: runs f, turning InputError,
// OverflowError and JSON type errors into Error.
template <class F>
auto guarded(F&& f) -> decltype(capture(std::forward<F>(f))) {
    try {
        return capture(std::forward<F>(f));
    } catch (const nlohmann::json::exception& e) {
        return Error{ErrorCode::ParseError, std::string("bad JSON value: ") + e.what(), ""};
    }
}

}  // namespace gpumem

namespace gpumem {

// What each command is for, with examples: the CLI's --help, the man page
// and the completions read this.
struct CommandInfo {
    Command command;
    std::string cli;                    // "estimate", "compat deepspeed"
    std::string summary;
    std::vector<std::string> examples;  // full command lines
};
const std::vector<CommandInfo>& command_infos();  // CLI order (timeline is JSON-only)

// Shell completion for bash, zsh or fish, generated from the field table.
Result<std::string> completion_script(std::string_view shell);
// The man page (roff), generated from the field table.
std::string man_page();

}  // namespace gpumem

namespace gpumem {
// One field's help line: text, allowed values, unit and default.
std::string field_help(const Field& f);
}  // namespace gpumem
