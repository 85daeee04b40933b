// libFuzzer target: a service request without HTTP. An input is
// "COMMAND\nBODY": the first line names the command (as POST /v1/<command>;
// when it names none, its bytes' sum picks one of api_commands()), the rest
// is the JSON body.
// The body goes where the service sends it: depth check and JSON parsing (the
// service's own step, repeated here with the shared helpers), then run() with
// allow_paths = false under a WorkBudget, as the service's worker threads do,
// and every renderer on the answer (text, JSON, CSV, Markdown).
// Answers: a value, an Error (InputError, OverflowError and JSON type errors
// through the `guarded` ladder every front end uses) or BudgetExceeded.
// Corpus: fuzz/corpus/api/ (fuzz/make_corpus.py: one body per command).
#include <algorithm>
#include <chrono>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "gpumem/api/api.hpp"
#include "gpumem/core/budget.hpp"
#include "gpumem/core/input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto input = gpumem_fuzz::as_text(data, size);
    const auto nl = input.find('\n');
    const std::string_view first = input.substr(0, nl == std::string_view::npos ? 0 : nl);
    const std::string_view text = nl == std::string_view::npos ? input : input.substr(nl + 1);
    const auto& commands = gpumem::api_commands();
    std::string command(first);
    if (std::find(commands.begin(), commands.end(), command) == commands.end()) {
        std::size_t sum = 0;
        for (const char ch : first) sum += static_cast<unsigned char>(ch);
        command = commands[sum % commands.size()];
    }
    try {
        gpumem::check_json_depth(text, "request body");
    } catch (const gpumem::InputError&) {
        return 0;
    }
    const nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return 0;
    try {
        const gpumem::WorkBudget budget(std::chrono::milliseconds(2000));
        const auto r = gpumem::guarded([&]() -> int {
            const gpumem::Command c = gpumem::take(gpumem::parse_command(command));
            const gpumem::Answer a = gpumem::take(gpumem::run(c, body, gpumem::CallOptions{}));
            for (const auto f : {gpumem::Format::Text, gpumem::Format::Json, gpumem::Format::Csv, gpumem::Format::Markdown})
                (void)gpumem::render(a, f);
            (void)gpumem::answer_json(a).dump();
            return 0;
        });
        gpumem_fuzz::check_error_message(r);
    } catch (const gpumem::BudgetExceeded&) {
    }
    return 0;
}
