// Command descriptions, shell completions and the man page: generated from
// the field table (gpumem/memory/fields.hpp) so that they list exactly the
// flags the CLI takes.
#include <algorithm>
#include <set>

#include "gpumem/api/api.hpp"
#include "gpumem/core/version.hpp"

namespace gpumem {

const std::vector<CommandInfo>& command_infos() {
    static const std::vector<CommandInfo> v = {
        {Command::Estimate, "estimate", "per-GPU memory of a training or inference job, part by part, and its step time",
         {"gpumem estimate llama-3-8b --batch 4 --seq 4096 --gpu H100-80GB", "gpumem estimate mixtral-8x7b --gpus 64 --tp 2 --pp 4 --ep 8 --distributed-optimizer",
          "gpumem estimate llama-3-8b --mode infer --batch 16 --seq 8192 --gen-len 512 --format json"}},
        {Command::Serving, "serving", "a model served by vLLM, SGLang, TGI, TensorRT-LLM or llama.cpp: KV-cache tokens, concurrency, per-GPU memory and buffers, host RAM, throughput, and whether it starts",
         {"gpumem serving llama-3.1-8b --gpu H100-80GB --max-model-len 32768", "gpumem serving llama-3.1-8b --gpu A100-40GB -- vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 16384 -tp 2 --kv-cache-dtype fp8",
          "gpumem serving qwen3-8b --gpu H100-80GB -- python -m sglang.launch_server --model-path Qwen/Qwen3-8B --mem-fraction-static 0.85",
          "gpumem serving llama-3.1-8b --quant Q4_K_M --gpu RTX-4090 -- llama-server -ngl 99 -c 16384 -fa on -ctk q8_0 -ctv q8_0"}},
        {Command::Fit, "fit", "the largest micro-batch and the longest sequence that fit the GPU; with --engine, the longest request, the concurrency and (llama.cpp) the offloaded layers that fit that engine",
         {"gpumem fit llama-3-8b --seq 4096 --gpu A100-80GB", "gpumem fit gpt2 --mode infer --gpu L4",
          "gpumem fit llama-3.1-8b --engine llama.cpp --quant Q4_K_M --gpu RTX-4090 --gpu-memory 12GiB --ctx-size 16384"}},
        {Command::Advise, "advise", "each memory-saving technique's saving and time cost for this job, and the cheapest combination that fits",
         {"gpumem advise llama-3-8b --batch 4 --seq 4096 --gpu A100-80GB", "gpumem advise llama-2-13b --gpu RTX-4090-24GB --format markdown"}},
        {Command::Plan, "plan", "search every layout for the fastest one that fits",
         {"gpumem plan llama-3-70b --gpus 64 --gpu H100-80GB --seq 8192", "gpumem plan llama-3.1-405b --gpus 1024 --global-batch 2048 --only-tp 8"}},
        {Command::Sweep, "sweep", "memory (and time) over lists of micro-batch sizes and sequence lengths",
         {"gpumem sweep llama-3-8b --batches 1,2,4,8 --seqs 2048,4096", "gpumem sweep gpt2 --batches 1,2,4 --plot sweep.svg"}},
        {Command::Doctor, "doctor", "explain a CUDA out-of-memory message and rank the remedies",
         {"gpumem doctor \"$(cat oom.txt)\" llama-3-8b --batch 8", "python train.py 2>&1 | grep -A3 OutOfMemory | gpumem doctor -"}},
        {Command::Params, "params", "count parameters by component and dtype", {"gpumem params llama-3-8b", "gpumem params ./my-model/config.json --format csv"}},
        {Command::Snapshot, "snapshot", "summarize a PyTorch memory snapshot and replay it through the allocator model",
         {"gpumem snapshot snapshot.pickle", "gpumem snapshot snapshot.pickle --alloc-conf expandable_segments:True"}},
        {Command::CompatDeepSpeed, "compat deepspeed", "DeepSpeed's estimate_zero2/zero3_model_states_mem_needs (cold from --params, live from a MODEL)",
         {"gpumem compat deepspeed --params 2.78B --stage 3 --gpus-per-node 8", "gpumem compat deepspeed llama-3-8b --stage 2"}},
        {Command::CompatMegatron, "compat megatron", "Megatron-LM's theoretical memory report for a Megatron argument set (JSON)",
         {"gpumem compat megatron gpt3-175b-args.json"}},
        {Command::Calibrate, "calibrate", "fit the unknowns (framework extras, fragmentation, CUDA context) to a job you measured; save the JSON and pass it to any command with --calibration",
         {"gpumem calibrate bert-large-uncased --gpu V100-16GB --seq 512 --batch 4 --attention eager --precision fp32 --measured-total 14949MiB --out calib.json",
          "gpumem estimate bert-large-uncased --gpu V100-16GB --seq 512 --batch 1 --grad-accum 4 --attention eager --precision fp32 --calibration calib.json",
          "gpumem calibrate llama-3.2-1b --batch 4 --seq 2048 --gpu A100-40GB --snapshot snapshot.pickle --measured-total 31GiB"}},
        {Command::Models, "models", "list the built-in model presets", {"gpumem models", "gpumem models --format json"}},
        {Command::Gpus, "gpus", "list the built-in GPU catalog", {"gpumem gpus"}},
    };
    return v;
}

namespace {

std::vector<std::string> flags_of(Command c) {
    std::vector<std::string> out;
    for (const Field* f : fields_of(c)) {
        if (f == positional_of(c) || f->type == FieldType::Object || f->name == "data") continue;
        out.push_back(f->flag());
        for (const auto& a : f->aliases) out.push_back("--" + a);
        if (f->type == FieldType::Bool) out.push_back("--no-" + f->name);
    }
    out.emplace_back("--help");
    return out;
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
    return s;
}

// Fields whose values complete from a fixed list (enums) or from files.
std::string value_case_bash(Command c) {
    std::string s;
    for (const Field* f : fields_of(c)) {
        if (f == positional_of(c)) continue;
        if (f->type == FieldType::Enum) s += "        " + f->flag() + ") COMPREPLY=($(compgen -W \"" + join(f->values) + "\" -- \"$cur\")); return;;\n";
        else if (f->type == FieldType::Path) s += "        " + f->flag() + ") COMPREPLY=($(compgen -f -- \"$cur\")); return;;\n";
    }
    return s;
}

std::string bash() {
    std::string s = "# bash completion for gpumem (generated by `gpumem completion bash` from the request field table)\n_gpumem() {\n"
                    "    local cur prev words cword\n    cur=\"${COMP_WORDS[COMP_CWORD]}\"; prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
                    "    local sub=\"${COMP_WORDS[1]}\"\n    [ \"$sub\" = compat ] && sub=\"compat-${COMP_WORDS[2]}\"\n"
                    "    if [ \"$COMP_CWORD\" -eq 1 ]; then\n        COMPREPLY=($(compgen -W \"";
    std::set<std::string> top;
    for (const auto& ci : command_infos()) top.insert(ci.cli.substr(0, ci.cli.find(' ')));
    top.insert("serve");
    top.insert("completion");
    top.insert("man");
    s += join({top.begin(), top.end()}) + " --help --version\" -- \"$cur\")); return\n    fi\n"
         "    if [ \"${COMP_WORDS[1]}\" = compat ] && [ \"$COMP_CWORD\" -eq 2 ]; then COMPREPLY=($(compgen -W \"deepspeed megatron\" -- \"$cur\")); return; fi\n"
         "    if [ \"${COMP_WORDS[1]}\" = completion ]; then COMPREPLY=($(compgen -W \"bash zsh fish\" -- \"$cur\")); return; fi\n"
         "    case \"$sub\" in\n";
    for (const auto& ci : command_infos()) {
        std::string name = ci.cli;
        std::replace(name.begin(), name.end(), ' ', '-');
        s += "    " + name + ")\n        case \"$prev\" in\n" + value_case_bash(ci.command) + "        esac\n";
        s += "        COMPREPLY=($(compgen -W \"" + join(flags_of(ci.command)) + "\" -- \"$cur\"))\n";
        if (ci.command == Command::Snapshot || ci.command == Command::CompatMegatron) s += "        [[ \"$cur\" != -* ]] && COMPREPLY+=($(compgen -f -- \"$cur\"))\n";
        s += "        ;;\n";
    }
    s += "    esac\n}\ncomplete -F _gpumem gpumem\n";
    return s;
}

std::string quote_help(std::string h) {
    std::string o;
    for (char c : h) {
        if (c == '\'') o += "'\\''";
        else if (c == '[' || c == ']' || c == ':') o += ' ';
        else o.push_back(c);
    }
    return o;
}

std::string zsh() {
    std::string s = "#compdef gpumem\n# zsh completion for gpumem (generated by `gpumem completion zsh` from the request field table)\n_gpumem() {\n"
                    "  local -a cmds\n  cmds=(";
    for (const auto& ci : command_infos())
        if (ci.cli.find(' ') == std::string::npos) s += "'" + ci.cli + ":" + quote_help(ci.summary) + "' ";
    s += "'compat:reproduce the memory reports of DeepSpeed and Megatron-LM' 'serve:serve the JSON API over HTTP' 'completion:print a shell completion script' 'man:print the man page')\n"
         "  if (( CURRENT == 2 )); then _describe command cmds; return; fi\n  local sub=$words[2]\n"
         "  [[ $sub == compat ]] && { if (( CURRENT == 3 )); then _values subcommand deepspeed megatron; return; fi; sub=compat-$words[3]; }\n"
         "  [[ $sub == completion ]] && { _values shell bash zsh fish; return; }\n  case $sub in\n";
    for (const auto& ci : command_infos()) {
        std::string name = ci.cli;
        std::replace(name.begin(), name.end(), ' ', '-');
        s += "  " + name + ")\n    _arguments -s";
        for (const Field* f : fields_of(ci.command)) {
            if (f->type == FieldType::Object || f->name == "data") continue;
            if (f == positional_of(ci.command)) {
                s += " '1:" + f->name + ":" + (f->type == FieldType::Path ? "_files" : " ") + "'";
                continue;
            }
            const std::string h = quote_help(std::string(f->help));
            if (f->type == FieldType::Bool) {
                s += " '" + f->flag() + "[" + h + "]' '--no-" + f->name + "'";
            } else if (f->type == FieldType::Enum) {
                s += " '" + f->flag() + "[" + h + "]:" + f->name + ":(" + join(f->values) + ")'";
            } else if (f->type == FieldType::Path) {
                s += " '" + f->flag() + "[" + h + "]:file:_files'";
            } else {
                s += " '" + f->flag() + "[" + h + "]:" + f->name + ": '";
            }
        }
        s += " ;;\n";
    }
    s += "  esac\n}\n_gpumem \"$@\"\n";
    return s;
}

std::string fish() {
    std::string s = "# fish completion for gpumem (generated by `gpumem completion fish` from the request field table)\ncomplete -c gpumem -f\n";
    std::string tops;
    for (const auto& ci : command_infos())
        if (ci.cli.find(' ') == std::string::npos) {
            s += "complete -c gpumem -n __fish_use_subcommand -a " + ci.cli + " -d '" + quote_help(ci.summary) + "'\n";
        }
    s += "complete -c gpumem -n __fish_use_subcommand -a compat -d 'reproduce the memory reports of DeepSpeed and Megatron-LM'\n"
         "complete -c gpumem -n __fish_use_subcommand -a serve -d 'serve the JSON API over HTTP'\n"
         "complete -c gpumem -n __fish_use_subcommand -a completion -d 'print a shell completion script'\n"
         "complete -c gpumem -n __fish_use_subcommand -a man -d 'print the man page'\n"
         "complete -c gpumem -n '__fish_seen_subcommand_from compat' -a 'deepspeed megatron'\n"
         "complete -c gpumem -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'\n";
    for (const auto& ci : command_infos()) {
        const std::string last = ci.cli.substr(ci.cli.rfind(' ') + 1);
        const std::string cond = "__fish_seen_subcommand_from " + last;
        for (const Field* f : fields_of(ci.command)) {
            if (f == positional_of(ci.command) || f->type == FieldType::Object || f->name == "data") continue;
            s += "complete -c gpumem -n '" + cond + "' -l " + f->name;
            if (f->type == FieldType::Enum) s += " -x -a '" + join(f->values) + "'";
            else if (f->type == FieldType::Path) s += " -r -F";
            else if (f->type != FieldType::Bool) s += " -x";
            s += " -d '" + quote_help(std::string(f->help)) + "'\n";
            if (f->type == FieldType::Bool) s += "complete -c gpumem -n '" + cond + "' -l no-" + f->name + "\n";
        }
        if (ci.command == Command::Snapshot || ci.command == Command::CompatMegatron) s += "complete -c gpumem -n '" + cond + "' -F\n";
    }
    return s;
}

std::string roff(std::string s) {
    std::string o;
    for (char c : s) {
        if (c == '\\') o += "\\\\";
        else if (c == '-') o += "\\-";
        else o.push_back(c);
    }
    if (!o.empty() && (o[0] == '.' || o[0] == '\'')) o = "\\&" + o;
    return o;
}

}  // namespace



Result<std::string> completion_script(std::string_view shell) {
    if (shell == "bash") return bash();
    if (shell == "zsh") return zsh();
    if (shell == "fish") return fish();
    return Error{ErrorCode::InvalidArgument, "completion: unknown shell \"" + std::string(shell) + "\"" + did_you_mean(shell, {"bash", "zsh", "fish"}) + " (use bash, zsh or fish)", "shell"};
}

std::string man_page() {
    std::string s = ".TH GPUMEM 1 \"\" \"gpumem " + std::string(version()) + "\" \"User Commands\"\n.SH NAME\ngpumem \\- predict, explain and plan the GPU memory and time of deep\\-learning training and inference\n"
                    ".SH SYNOPSIS\n.B gpumem\n\\fICOMMAND\\fR [\\fIMODEL\\fR] [\\fIOPTIONS\\fR]\n.SH DESCRIPTION\n"
                    "gpumem computes, part by part, the memory one GPU needs for a training or inference job (weights, gradients, optimizer states, activations, "
                    "temporaries, allocator cache, CUDA context), simulates the step through a model of PyTorch's caching allocator, and plans parallel layouts. "
                    "MODEL is a preset (\\fBgpumem models\\fR), a Hugging Face id in the local cache, a config.json, a model folder or a layer\\-list JSON.\n.SH COMMANDS\n";
    for (const auto& ci : command_infos()) {
        s += ".SS " + roff(ci.cli) + "\n" + roff(ci.summary) + ".\n.PP\nExamples:\n.nf\n";
        for (const auto& e : ci.examples) s += roff(e) + "\n";
        s += ".fi\n";
        for (const auto& [group, title] : field_groups()) {
            bool any = false;
            for (const Field* f : fields_of(ci.command)) {
                if (f->group != group || f->type == FieldType::Object || f->name == "data" || f == positional_of(ci.command)) continue;
                if (!any) s += ".PP\n\\fI" + roff(title) + "\\fR\n";
                any = true;
                s += ".TP\n\\fB" + roff(f->flag()) + "\\fR" + (f->type == FieldType::Bool ? "" : " \\fI" + roff(to_string(f->type)) + "\\fR") + "\n" + roff(field_help(*f)) + "\n";
            }
        }
    }
    s += ".SS serve\nserve the JSON API and the web page over HTTP (POST /v1/\\fIcommand\\fR with the same fields as JSON keys).\n"
         ".SS completion\nprint a completion script: \\fBgpumem completion bash|zsh|fish\\fR.\n"
         ".SH EXIT STATUS\n0 on an answer (\"does not fit\" is an answer), 2 for bad input (the message names the field and the fix), 3 for an internal error.\n"
         ".SH SEE ALSO\nThe README and docs/ of the gpumem sources.\n";
    return s;
}

// One field's help line: text, values, unit and default.
std::string field_help(const Field& f) {
    std::string h(f.help);
    if (!f.values.empty() && f.type != FieldType::Bool) h += " [" + join(f.values, "|") + "]";
    if (!f.unit.empty() && f.type != FieldType::Size) h += " (" + std::string(f.unit) + ")";
    if (f.type == FieldType::Size) h += " (a size with a unit: GiB, GB, MiB, ...)";
    if (!f.default_text.empty()) h += "; default: " + std::string(f.default_text);
    else if (!f.default_value.is_null() && f.type != FieldType::Bool && !(f.default_value.is_string() && f.default_value.get<std::string>().empty()))
        h += "; default: " + (f.default_value.is_string() ? f.default_value.get<std::string>() : f.default_value.dump());
    else if (f.type == FieldType::Bool && f.default_value == true) h += " (default on; --no-" + f.name + " turns it off)";
    return h;
}

}  // namespace gpumem
