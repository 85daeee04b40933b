// libFuzzer target: the field table's text -> value conversions
// (src/memory/fields.cpp), as command-line flags reach them. An input is
// "NAME=TEXT": NAME picks the field (when it names none, its bytes' sum
// picks one), TEXT is the flag's text. The text goes
// through canonical_value (type, unit and range checks), then through
// parse_request for every command the field applies to, as the CLI passes
// `--name TEXT`; the same text is also read by parse_param_count (--params,
// DeepSpeed's --largest-layer-params) and parse_command. When the text is
// JSON, the value is also given as JSON, as the service and Python pass it.
// Answers: a value or an Error (through the `guarded` ladder).
// Corpus: fuzz/corpus/fields/ (fuzz/make_corpus.py: each field's default and
// allowed values).
#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "gpumem/api/api.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/memory/fields.hpp"

namespace {
void feed(const gpumem::Field& f, const nlohmann::json& raw) {
    const auto v = gpumem::guarded([&] { return gpumem::take(gpumem::canonical_value(f, raw)).dump(); });
    gpumem_fuzz::check_error_message(v);
    for (const gpumem::Command c : gpumem::all_commands()) {
        if (!f.in(c)) continue;
        nlohmann::json body = nlohmann::json::object();
        body[f.json_key()] = raw;
        const auto r = gpumem::guarded([&] {
            const gpumem::Request req = gpumem::take(gpumem::parse_request(c, body));
            return gpumem::request_json(req, c).dump() + gpumem::request_command(req, c);
        });
        gpumem_fuzz::check_error_message(r);
    }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto input = gpumem_fuzz::as_text(data, size);
    const auto eq = input.find('=');
    const std::string_view name = input.substr(0, eq == std::string_view::npos ? 0 : eq);
    const std::string text(eq == std::string_view::npos ? input : input.substr(eq + 1));
    const gpumem::Field* found = gpumem::find_field(name);
    if (!found) {
        std::size_t sum = 0;
        for (const char ch : name) sum += static_cast<unsigned char>(ch);
        found = &gpumem::fields()[sum % gpumem::fields().size()];
    }
    const gpumem::Field& f = *found;
    feed(f, nlohmann::json(text));
    gpumem_fuzz::check_error_message(gpumem::parse_param_count(text));
    gpumem_fuzz::check_error_message(gpumem::parse_command(text));
    try {
        gpumem::check_json_depth(text, "value");
    } catch (const gpumem::InputError&) {
        return 0;
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) feed(f, j);
    return 0;
}
