// gpumem command-line front end: flags -> request JSON (the field table) ->
// run() (the same call the HTTP service and Python make) -> renderer.
// Errors exit 2 with one line naming the field and the fix; 3 is a bug.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/core/version.hpp"
#include "gpumem/report/sweep_render.hpp"
#include "gpumem/report/timeline_render.hpp"
#include "trace_command.hpp"

using namespace gpumem;
using json = nlohmann::json;

namespace {

bool ends_with(const std::string& s, const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail(ErrorCode::Io, flag + 2, std::string(flag) + " " + path + ": cannot write this file");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
}

void write_timeline(const EstimateResult& r, const std::string& path) {
    if (!r.simulation) fail(ErrorCode::InvalidArgument, "timeline", "--timeline needs the step simulation (drop --analytic; --params has no graph to simulate)");
    std::string text;
    if (ends_with(path, ".svg"))
        text = render_timeline_svg(*r.simulation, r.model_name + " - " + to_string(r.request().mode) + " on " + r.gpu().name, r.per_gpu.capacity);
    else if (ends_with(path, ".json")) {
        json j = timeline_to_json(*r.simulation);
        j["schema_version"] = kSchemaVersion;
        text = j.dump(1) + "\n";
    }
    else if (ends_with(path, ".csv"))
        text = render_timeline_csv(*r.simulation);
    else
        fail(ErrorCode::InvalidArgument, "timeline", "--timeline " + path + ": use a file name ending in .csv, .json or .svg");
    write_file(path, text, "--timeline");
}

const char* type_name(FieldType t) {
    switch (t) {
        case FieldType::Int: return "INT";
        case FieldType::Number: return "NUMBER";
        case FieldType::Size: return "SIZE";
        case FieldType::Percent: return "PERCENT";
        case FieldType::Count: return "COUNT";
        case FieldType::Enum: return "NAME";
        case FieldType::IntList: return "INT,...";
        case FieldType::StringList:
        case FieldType::EnumList: return "NAME,...";
        case FieldType::Path: return "FILE";
        default: return "TEXT";
    }
}

// One subcommand built from the field table: raw texts per field.
struct Sub {
    Command command;
    CLI::App* app = nullptr;
    std::map<std::string, std::string> text;  // field name -> what the flag got
    std::map<std::string, bool> flags;        // bool fields given
};

// Does an argument name this field's flag ("--batch", "--batch=4",
// "--no-sp", an alias)?
bool names_field(const std::string& arg, const Field& f) {
    if (arg.rfind("--", 0) != 0) return false;
    const std::string_view name = std::string_view(arg).substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    if (name == f.name || (f.type == FieldType::Bool && name.rfind("no-", 0) == 0 && name.substr(3) == f.name)) return true;
    return std::find(f.aliases.begin(), f.aliases.end(), name) != f.aliases.end();
}

// The command's flags, from the field table. CLI11 checks every new option
// against all earlier ones, so registering ~150 flags costs more than the
// estimate (issue 16): when every flag on the command line is a field of this
// command, only those are registered; --help, or a flag that is not a field
// (the error and its did-you-mean), registers them all.
void add_fields(Sub& s, const std::vector<std::string>& args) {
    const std::vector<const Field*>& all = fields_of(s.command);
    bool every = false;
    for (const auto& a : args) {
        if (a.empty() || a[0] != '-') continue;
        if (a == "--help" || a == "-h" || a.rfind("--", 0) != 0 ||
            std::none_of(all.begin(), all.end(), [&](const Field* f) { return names_field(a, *f); })) {
            every = true;
            break;
        }
    }
    const Field* positional = positional_of(s.command);
    for (const Field* f : all) {
        if (f->type == FieldType::Object || f->name == "data") continue;  // JSON requests only
        if (!every && f != positional && std::none_of(args.begin(), args.end(), [&](const std::string& a) { return names_field(a, *f); }))
            continue;
        const std::string help = field_help(*f);
        std::string group(f->group);
        for (const auto& [k, title] : field_groups())
            if (k == f->group) group = title;
        if (f == positional) {
            auto* o = s.app->add_option(f->name, s.text[f->name], help);
            if (f->required) o->required();
            continue;
        }
        if (f->type == FieldType::Bool) {
            const std::string name = f->name;
            s.app->add_flag_function(f->flag() + ",!--no-" + f->name, [&s, name](std::int64_t n) { s.flags[name] = n > 0; }, help)->group(group);
            continue;
        }
        std::string names = f->flag();
        for (const auto& a : f->aliases) names += ",--" + a;
        s.app->add_option(names, s.text[f->name], help)->group(group)->type_name(type_name(f->type));
    }
    for (const auto& ci : command_infos())
        if (ci.command == s.command) {
            std::string footer = "\nExamples:\n";
            for (const auto& e : ci.examples) footer += "  " + e + "\n";
            s.app->footer(footer);
        }
}

json body_of(const Sub& s) {
    json body = json::object();
    const Field* positional = positional_of(s.command);
    for (const auto& [name, value] : s.text) {
        const Field* f = find_field(name, s.command);
        auto* opt = f && f == positional ? s.app->get_option_no_throw(name) : s.app->get_option_no_throw("--" + name);
        if (opt && opt->count() > 0) body[name] = value;
    }
    for (const auto& [name, v] : s.flags) body[name] = v;
    return body;
}

// "--batch 4" for bool flags written with a value ("--sp true") become
// "--sp=true"; CLI11 takes a flag's value only with '='.
std::vector<std::string> normalize_args(int argc, char** argv) {
    std::vector<std::string> a(argv + 1, argv + argc);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string& x = a[i];
        if (x.rfind("--", 0) == 0 && x.find('=') == std::string::npos && i + 1 < a.size()) {
            const Field* f = find_field(x.substr(2));
            const std::string& v = a[i + 1];
            if (f && f->type == FieldType::Bool && (v == "true" || v == "false")) {
                out.push_back(x + "=" + v);
                ++i;
                continue;
            }
        }
        out.push_back(x);
    }
    return out;
}

// Did-you-mean for a mistyped flag or subcommand, from the parse error.
std::string suggestion(const CLI::App& app, const std::vector<std::string>& args) {
    const CLI::App* sub = nullptr;
    for (const auto* s : app.get_subcommands()) sub = s;
    if (sub)
        for (const auto* s : sub->get_subcommands()) sub = s;
    std::vector<std::string> known;
    const CLI::App* scope = sub ? sub : &app;
    for (const auto* o : scope->get_options()) {
        for (const auto& n : o->get_lnames()) known.push_back("--" + n);
        for (const auto& n : o->get_fnames()) known.push_back("--" + n);
    }
    std::vector<std::string> subs;
    for (const auto* s : scope->get_subcommands({})) subs.push_back(s->get_name());
    for (const auto& a : args) {
        if (a.rfind("--", 0) == 0) {
            const std::string name = a.substr(0, a.find('='));
            if (std::find(known.begin(), known.end(), name) == known.end()) {
                const std::string d = did_you_mean(name, known);
                if (!d.empty()) return "unknown flag " + name + d;
            }
        } else if (!sub && !a.empty() && a[0] != '-') {
            if (std::find(subs.begin(), subs.end(), a) == subs.end()) {
                const std::string d = did_you_mean(a, subs);
                return "unknown command \"" + a + "\"" + (d.empty() ? "; commands: " + [&] {
                    std::string l;
                    for (const auto& s : subs) l += (l.empty() ? "" : ", ") + s;
                    return l;
                }() : d);
            }
            break;
        }
    }
    return "";
}

// The words before the first flag: the command ("estimate", "compat deepspeed").
std::vector<std::string> command_words(int argc, char** argv) {
    std::vector<std::string> w;
    for (int i = 1; i < argc && w.size() < 2; ++i) {
        if (argv[i][0] == '-') break;
        w.emplace_back(argv[i]);
    }
    return w;
}

// `gpumem serve ...` runs gpumem-serve, installed beside gpumem: only the
// service links the HTTP library (and OpenSSL, brotli, zlib through it).
int exec_server(char** argv) {
    std::string dir;
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) dir.assign(buf, static_cast<std::size_t>(n));
    else dir = argv[0];
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    const std::string exe = dir + "gpumem-serve";
    argv[0] = const_cast<char*>(exe.c_str());
    ::execv(exe.c_str(), argv);
    std::fprintf(stderr, "gpumem: error: serve: %s cannot be run (%s); this build has no HTTP service: install libcpp-httplib-dev "
                         "(scripts/setup.sh) and rebuild, or install gpumem-serve beside gpumem\n",
                 exe.c_str(), std::strerror(errno));
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    // `gpumem trace ...` hands its whole command line to the PyTorch tracer.
    if (argc >= 2 && std::string(argv[1]) == "trace") return gpumem::cli::run_trace_command(std::vector<std::string>(argv + 2, argv + argc));
    if (argc >= 2 && std::string(argv[1]) == "serve") return exec_server(argv);
    CLI::App app{"gpumem: predict, explain and plan GPU memory of deep-learning training and inference"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("gpumem ") + version());
    app.footer("\nRun 'gpumem COMMAND --help' for a command's flags. Shell completion: gpumem completion bash|zsh|fish.");

    std::vector<std::string> args = normalize_args(argc, argv);
    // `gpumem serving ... -- <the engine's own command line>`
    std::vector<std::string> engine_argv;
    if (const auto dd = std::find(args.begin(), args.end(), "--"); dd != args.end()) {
        engine_argv.assign(dd + 1, args.end());
        args.erase(dd, args.end());
    }

    // Only the command being run is built, with only the flags given
    // (add_fields): building every command's parser cost more than the
    // estimate itself (issue 16). The top level's --help, a mistyped command
    // and `completion`/`man` build the list of commands, without flags.
    const std::vector<std::string> words = command_words(argc, argv);
    const std::string selected = words.size() >= 2 && words[0] == "compat" ? words[0] + " " + words[1] : words.empty() ? "" : words[0];
    const bool one = std::any_of(command_infos().begin(), command_infos().end(), [&](const CommandInfo& ci) { return ci.cli == selected; });
    std::vector<Sub> subs;
    subs.reserve(command_infos().size());
    CLI::App* compat = nullptr;
    // `gpumem --version` needs no commands at all.
    const bool version_only = words.empty() && std::find(args.begin(), args.end(), "--version") != args.end() &&
                              std::none_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
    for (const auto& ci : command_infos()) {
        if ((one && ci.cli != selected) || version_only) continue;
        Sub s;
        s.command = ci.command;
        if (ci.cli.rfind("compat ", 0) == 0) {
            if (!compat) {
                compat = app.add_subcommand("compat", "reproduce the memory reports of DeepSpeed and Megatron-LM");
                compat->require_subcommand(1);
            }
            s.app = compat->add_subcommand(ci.cli.substr(7), ci.summary);
        } else {
            s.app = app.add_subcommand(ci.cli, ci.summary);
        }
        subs.push_back(std::move(s));
        if (one) add_fields(subs.back(), args);  // after the move: the flag callbacks hold &subs.back()
    }

    std::string shell;
    CLI::App* completion = nullptr;
    CLI::App* man = nullptr;
    if (!one && !version_only) {
        completion = app.add_subcommand("completion", "print a shell completion script (generated from the flag table)");
        completion->add_option("shell", shell, "bash, zsh or fish")->required();
        completion->footer("\nExamples:\n  gpumem completion bash > ~/.local/share/bash-completion/completions/gpumem\n  gpumem completion fish > ~/.config/fish/completions/gpumem.fish\n");
        man = app.add_subcommand("man", "print the man page (roff)");
        // Listed for --help; main() hands `gpumem trace ...` to the tracer before parsing.
        app.add_subcommand("trace", "trace a PyTorch model (SCRIPT.py:FUNCTION, on the meta device, with your python + torch) into a model graph file any command takes as MODEL; 'gpumem trace --help' for its flags");
        // Listed for --help; main() hands `gpumem serve ...` to gpumem-serve before parsing.
        app.add_subcommand("serve", "serve the JSON API and the web page over HTTP (POST /v1/estimate, ...; loopback only unless --host; docs/security.md); 'gpumem serve --help' for its flags");
    }

    try {
        std::vector<std::string> rev(args.rbegin(), args.rend());
        app.parse(rev);
    } catch (const CLI::Success& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::string what = e.what();
        std::replace(what.begin(), what.end(), '\n', ' ');
        const std::string hint = suggestion(app, args);
        std::string sub;
        for (const auto* s : app.get_subcommands()) {
            sub = " " + s->get_name();
            for (const auto* t : s->get_subcommands()) sub += " " + t->get_name();
        }
        std::fprintf(stderr, "gpumem: error: %s (run 'gpumem%s --help' for the flags)\n", hint.empty() ? what.c_str() : hint.c_str(), sub.c_str());
        return 2;
    }

    try {
        if (completion && *completion) {
            std::fputs(take(completion_script(shell)).c_str(), stdout);
            return 0;
        }
        if (man && *man) {
            std::fputs(man_page().c_str(), stdout);
            return 0;
        }
        for (auto& s : subs) {
            if (!s.app->parsed()) continue;
            json body = body_of(s);
            if (!engine_argv.empty()) {
                if (s.command != Command::Serving && s.command != Command::Fit)
                    fail(ErrorCode::InvalidArgument, "command", "an engine command line after -- is for gpumem serving and gpumem fit");
                body["command"] = engine_argv;
            }
            if (s.command == Command::Doctor && body.value("message", "") == "-") {
                std::string message;
                char buf[4096];
                std::size_t n;
                // At most kMaxTextBytes: `gpumem doctor - < /dev/zero` ends.
                while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
                    if (static_cast<std::int64_t>(message.size() + n) > kMaxTextBytes)
                        fail(ErrorCode::InvalidArgument, "message",
                             "message: standard input is longer than the " + format_bytes(Bytes(kMaxTextBytes)) +
                                 " limit for an out-of-memory message; pipe only the error (e.g. through grep -A3 OutOfMemory)");
                    message.append(buf, n);
                }
                body["message"] = message;
            }
            const Request req = take(parse_request(s.command, body));
            CallOptions o;
            o.allow_paths = true;
            const Answer a = take(run(s.command, req, o));
            if (const auto* fe = std::get_if<FullEstimate>(&a.result)) {
                for (const auto& w : fe->memory.warnings) std::fprintf(stderr, "gpumem: warning: %s\n", w.c_str());
                if (!req.other.timeline.empty()) write_timeline(fe->memory, req.other.timeline);
            }
            if (s.command == Command::Calibrate && !req.other.out.empty()) write_file(req.other.out, render(a, Format::Json), "--out");
            if (const auto* sw = std::get_if<SweepResult>(&a.result); sw && !req.other.plot.empty())
                write_file(req.other.plot, render_sweep_svg(*sw, sw->model_name + " on " + sw->gpu, sw->capacity), "--plot");
            std::fputs(render(a, take(parse_format(req.other.format))).c_str(), stdout);
            return 0;
        }
        return 0;
    } catch (const InputError& e) {
        std::fprintf(stderr, "gpumem: error: %s\n", e.error().message.c_str());
        return 2;
    } catch (const OverflowError& e) {
        std::fprintf(stderr, "gpumem: error: a size overflows 64 bits: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpumem: internal error: %s\n", e.what());
        return 3;
    }
}
