// _gpumem: the private extension behind the Python package gpumem. One
// function, call(command, body_json, time_limit_s) -> json text, over
// api_call(). Every failure of a request becomes gpumem.GpumemError (a
// ValueError) with .code and .field, never a crash of the interpreter: bad
// input (InputError, overflow), JSON nested deeper than kMaxJsonDepth (checked
// on the text before it is parsed), work over the time limit ("timeout"),
// memory exhaustion ("out_of_memory") and any other exception ("internal").
// The typed API lives in Python (bindings/python/gpumem/__init__.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/core/budget.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/core/version.hpp"

namespace py = pybind11;

namespace {

struct CallError {
    std::string code, field, message;
};

// Runs one request; any exception is turned into a CallError.
std::variant<std::string, CallError> call_checked(const std::string& command, const std::string& body_json, double time_limit_s) {
    try {
        gpumem::check_json_depth(std::string_view(body_json), "request");
        const nlohmann::json body = body_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(body_json);
        std::optional<gpumem::WorkBudget> budget;
        if (time_limit_s > 0) {
            const double ms = std::min(time_limit_s * 1000.0, 86400000.0);
            budget.emplace(std::chrono::milliseconds(static_cast<std::int64_t>(std::max(1.0, ms))));
        }
        gpumem::Result<nlohmann::json> r = gpumem::api_call(command, body, /*allow_paths=*/true);
        if (!r) return CallError{std::string(gpumem::to_string(r.error().code)), r.error().field, r.error().message};
        return r.value().dump();
    } catch (const gpumem::InputError& e) {
        return CallError{std::string(gpumem::to_string(e.error().code)), e.error().field, e.error().message};
    } catch (const gpumem::OverflowError& e) {
        return CallError{"overflow", "", std::string("size overflows 64 bits: ") + e.what()};
    } catch (const nlohmann::json::exception& e) {
        return CallError{"parse_error", "", std::string("bad JSON request: ") + e.what()};
    } catch (const gpumem::BudgetExceeded& e) {
        return CallError{"timeout", "", e.what()};
    } catch (const std::bad_alloc&) {
        return CallError{"out_of_memory", "", "the request needs more memory than is available; ask for less"};
    } catch (const std::exception& e) {
        return CallError{"internal", "", std::string("internal error: ") + e.what()};
    } catch (...) {
        return CallError{"internal", "", "internal error"};
    }
}

}  // namespace

PYBIND11_MODULE(_gpumem, m) {
    m.doc() = "gpumem's JSON entry point (private; use the gpumem package)";
    static py::handle error_type = py::exception<void>(m, "GpumemError", PyExc_ValueError).release();

    m.def(
        "call",
        [](const std::string& command, const std::string& body_json, double time_limit_s) -> std::string {
            std::variant<std::string, CallError> r;
            {
                py::gil_scoped_release nogil;
                r = call_checked(command, body_json, time_limit_s);
            }
            if (const auto* e = std::get_if<CallError>(&r)) {
                py::object exc = error_type(e->message);
                exc.attr("code") = e->code;
                exc.attr("field") = e->field;
                PyErr_SetObject(error_type.ptr(), exc.ptr());
                throw py::error_already_set();
            }
            return std::get<std::string>(std::move(r));
        },
        py::arg("command"), py::arg("body_json") = "{}", py::arg("time_limit_s") = 0.0,
        "Run one gpumem command on a JSON request body; returns the JSON result text. time_limit_s > 0 cancels work "
        "running longer (GpumemError, code \"timeout\").");
    m.attr("commands") = gpumem::api_commands();
    m.def("fields", [] { return gpumem::fields_json().dump(); }, "The request field table as JSON text.");
    m.def("version", [] { return std::string(gpumem::version()); }, "gpumem's version.");
}
