// _gpumem: the private extension behind the Python package gpumem.
// call(command, body_json, time_limit_s) -> json text, over api_call(), and
// call_value(...) -> the same answer as Python objects, what json.loads of
// that text gives, built from the answer directly (writing the text and
// reading it back were two thirds of an analytic gpumem.estimate() call).
// Every failure of a request becomes gpumem.GpumemError (a
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
std::variant<nlohmann::json, CallError> call_checked(const std::string& command, const std::string& body_json, double time_limit_s) {
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
        return std::move(r).value();
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

// The answer as text: a CallError where it cannot be written (a string that
// is not UTF-8: nlohmann::json::dump throws).
std::variant<std::string, CallError> dumped(const nlohmann::json& j) {
    try {
        return j.dump();
    } catch (const nlohmann::json::exception& e) {
        return CallError{"parse_error", "", std::string("bad JSON request: ") + e.what()};
    } catch (const std::bad_alloc&) {
        return CallError{"out_of_memory", "", "the request needs more memory than is available; ask for less"};
    } catch (const std::exception& e) {
        return CallError{"internal", "", std::string("internal error: ") + e.what()};
    }
}

// What json.loads(j.dump()) gives, built directly: null, a non-finite number
// (which dump writes as null) -> None; integers -> int; other numbers ->
// float (dump writes the shortest text that reads back as the same double);
// objects in their (sorted) order. A new reference, or null: a string is not
// UTF-8, where dump throws (the caller then takes the text path and its
// error), or Python is out of memory (its error is then cleared too: the
// text path meets the same). The CPython calls directly: pybind11's
// accessors took twice as long.
PyObject* to_python(const nlohmann::json& j) {
    using V = nlohmann::json::value_t;
    switch (j.type()) {
        case V::null:
        case V::discarded: Py_RETURN_NONE;
        case V::boolean:
            if (j.get<bool>()) Py_RETURN_TRUE;
            Py_RETURN_FALSE;
        case V::number_integer: return PyLong_FromLongLong(j.get<std::int64_t>());
        case V::number_unsigned: return PyLong_FromUnsignedLongLong(j.get<std::uint64_t>());
        case V::number_float: {
            const double d = j.get<double>();
            if (!std::isfinite(d)) Py_RETURN_NONE;
            return PyFloat_FromDouble(d);
        }
        case V::string: {
            const std::string& t = j.get_ref<const std::string&>();
            return PyUnicode_DecodeUTF8(t.data(), static_cast<Py_ssize_t>(t.size()), "strict");
        }
        case V::array: {
            PyObject* out = PyList_New(static_cast<Py_ssize_t>(j.size()));
            if (!out) return nullptr;
            Py_ssize_t i = 0;
            for (const auto& v : j) {
                PyObject* x = to_python(v);
                if (!x) {
                    Py_DECREF(out);
                    return nullptr;
                }
                PyList_SET_ITEM(out, i++, x);  // (steals x)
            }
            return out;
        }
        case V::object: {
            PyObject* out = PyDict_New();
            if (!out) return nullptr;
            for (const auto& [k, v] : j.get_ref<const nlohmann::json::object_t&>()) {
                PyObject* key = PyUnicode_DecodeUTF8(k.data(), static_cast<Py_ssize_t>(k.size()), "strict");
                PyObject* x = key ? to_python(v) : nullptr;
                const bool ok = x && PyDict_SetItem(out, key, x) == 0;
                Py_XDECREF(key);
                Py_XDECREF(x);
                if (!ok) {
                    Py_DECREF(out);
                    return nullptr;
                }
            }
            return out;
        }
        case V::binary: break;  // (no answer holds one: dump's own text then)
    }
    return nullptr;
}

py::handle error_type;  // gpumem.GpumemError (set when the module is made)

[[noreturn]] void raise(const CallError& e) {
    py::object exc = error_type(e.message);
    exc.attr("code") = e.code;
    exc.attr("field") = e.field;
    PyErr_SetObject(error_type.ptr(), exc.ptr());
    throw py::error_already_set();
}

}  // namespace

PYBIND11_MODULE(_gpumem, m) {
    m.doc() = "gpumem's JSON entry point (private; use the gpumem package)";
    error_type = py::exception<void>(m, "GpumemError", PyExc_ValueError).release();

    // The request and the writing of its text run without the GIL; the
    // Python objects are made with it.
    auto run = [](const std::string& command, const std::string& body_json, double time_limit_s) {
        std::variant<nlohmann::json, CallError> r;
        {
            py::gil_scoped_release nogil;
            r = call_checked(command, body_json, time_limit_s);
        }
        if (const auto* e = std::get_if<CallError>(&r)) raise(*e);
        return std::get<nlohmann::json>(std::move(r));
    };
    auto text = [](const nlohmann::json& answer) {
        std::variant<std::string, CallError> t;
        {
            py::gil_scoped_release nogil;
            t = dumped(answer);
        }
        if (const auto* e = std::get_if<CallError>(&t)) raise(*e);
        return std::get<std::string>(std::move(t));
    };
    m.def(
        "call",
        [run, text](const std::string& command, const std::string& body_json, double time_limit_s) -> std::string {
            return text(run(command, body_json, time_limit_s));
        },
        py::arg("command"), py::arg("body_json") = "{}", py::arg("time_limit_s") = 0.0,
        "Run one gpumem command on a JSON request body; returns the JSON result text. time_limit_s > 0 cancels work "
        "running longer (GpumemError, code \"timeout\").");
    m.def(
        "call_value",
        [run, text](const std::string& command, const std::string& body_json, double time_limit_s) -> py::object {
            const nlohmann::json answer = run(command, body_json, time_limit_s);
            if (PyObject* v = to_python(answer)) return py::reinterpret_steal<py::object>(v);
            PyErr_Clear();
            // Not UTF-8 somewhere: the text path, with its error (or its text).
            return py::module_::import("json").attr("loads")(text(answer));
        },
        py::arg("command"), py::arg("body_json") = "{}", py::arg("time_limit_s") = 0.0,
        "call() returning the answer as Python objects (what json.loads of call()'s text gives).");
    m.attr("commands") = gpumem::api_commands();
    m.def("fields", [] { return gpumem::fields_json().dump(); }, "The request field table as JSON text.");
    m.def("version", [] { return std::string(gpumem::version()); }, "gpumem's version.");
}
