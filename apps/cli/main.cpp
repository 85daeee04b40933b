// gpumem command-line front end: parses flags into the shared request
// structure, calls the library, prints with a renderer, maps errors to exit 2.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/report/render.hpp"

using namespace gpumem;

namespace {

int report_error(const Error& e) {
    std::fprintf(stderr, "gpumem: error: %s\n", e.message.c_str());
    return 2;
}

template <class T>
T unwrap(Result<T> r) {
    if (!r) throw InputError(r.error());
    return std::move(r).value();
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s + ",") {
        if (c == ',') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else if (c != ' ') {
            cur.push_back(c);
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"gpumem: predict, explain and plan GPU memory of deep-learning training and inference"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "gpumem 0.1.0");
    std::string format = "text";

    auto* models = app.add_subcommand("models", "list the built-in model presets");
    models->add_option("--format", format, "text|json|csv|markdown");
    auto* gpus = app.add_subcommand("gpus", "list the built-in GPU catalog");
    gpus->add_option("--format", format, "text|json|csv|markdown");

    std::string model;
    std::string params_text;
    auto* params = app.add_subcommand("params", "count parameters by component and dtype");
    params->add_option("model", model, "preset name, config.json, model folder or layer-list JSON");
    params->add_option("--params", params_text, "a parameter count only, e.g. 7B");
    params->add_option("--format", format, "text|json|csv|markdown");

    auto* est = app.add_subcommand("estimate", "per-GPU memory of a training or inference job, part by part");
    est->add_option("model", model, "preset name, config.json, model folder or layer-list JSON");
    est->add_option("--params", params_text, "a parameter count only (model states only), e.g. 7B");
    std::string optimizer_impl = "foreach", zero_grad = "set-to-none";
    std::string mode = "train", precision, optimizer = "adamw", recompute = "none", attention = "flash", quant, kv_dtype,
                lora_targets, gpu = "H100-80GB", gpu_memory, cuda_context;
    std::int64_t batch = 1, grad_accum = 1, lora_rank = 16, gen_len = 0;
    std::optional<std::int64_t> seq;
    est->add_option("--mode", mode, "train|lora|qlora|infer")->capture_default_str();
    est->add_option("--batch", batch, "micro-batch size per GPU")->capture_default_str();
    est->add_option("--seq", seq, "sequence length (prompt length for inference)");
    est->add_option("--grad-accum", grad_accum, "gradient accumulation steps")->capture_default_str();
    est->add_option("--precision", precision, "fp32|fp16|bf16|amp-fp16|amp-bf16 (default amp-bf16 train, bf16 infer)");
    est->add_option("--optimizer", optimizer, "sgd|sgd-momentum|adam|adamw|adamw-8bit|adafactor|lion")->capture_default_str();
    est->add_option("--optimizer-impl", optimizer_impl, "foreach|fused|for-loop (torch.optim implementation)")->capture_default_str();
    est->add_option("--zero-grad", zero_grad, "set-to-none|zero (PyTorch >= 2.0 frees gradients; 1.x zeroes them)")->capture_default_str();
    est->add_option("--recompute", recompute, "none|selective|full")->capture_default_str();
    est->add_option("--attention", attention, "eager|flash")->capture_default_str();
    est->add_option("--lora-rank", lora_rank, "LoRA rank")->capture_default_str();
    est->add_option("--lora-targets", lora_targets, "comma-separated module names, or all-linear (default: PEFT's per-model defaults)");
    est->add_option("--quant", quant, "none|int8|int4|nf4 (default nf4 for qlora)");
    est->add_option("--kv-dtype", kv_dtype, "KV-cache dtype (default: activation dtype)");
    est->add_option("--gen-len", gen_len, "generated tokens (inference)")->capture_default_str();
    est->add_option("--gpu", gpu, "GPU from the catalog (gpumem gpus)")->capture_default_str();
    est->add_option("--gpu-memory", gpu_memory, "override the GPU's capacity, e.g. 24GiB");
    est->add_option("--cuda-context", cuda_context, "override the CUDA context size, e.g. 1343MiB");
    est->add_option("--format", format, "text|json|csv|markdown")->capture_default_str();

    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::string what = e.what();
        std::replace(what.begin(), what.end(), '\n', ' ');
        const std::string sub = app.get_subcommands().empty() ? "" : " " + app.get_subcommands().front()->get_name();
        std::fprintf(stderr, "gpumem: error: %s (run 'gpumem%s --help' for the flags)\n", what.c_str(), sub.c_str());
        return 2;
    }

    try {
        const Format fmt = unwrap(parse_format(format));
        if (*models) {
            std::fputs(render_models(presets(), fmt).c_str(), stdout);
            return 0;
        }
        if (*gpus) {
            std::fputs(render_gpus(gpu_catalog(), fmt).c_str(), stdout);
            return 0;
        }
        if (*params) {
            ModelGraph g = !params_text.empty() ? params_only_graph(unwrap(parse_param_count(params_text)))
                                                : unwrap(model.empty() ? Result<ModelGraph>(Error{ErrorCode::InvalidArgument, "params: name a model (preset, config.json, folder, layer-list JSON) or give --params", "model"})
                                                                       : load_model(model));
            std::fputs(render_params(g, summarize_params(g), fmt).c_str(), stdout);
            return 0;
        }
        EstimateRequest req;
        req.model = model;
        if (!params_text.empty()) req.params_count = unwrap(parse_param_count(params_text));
        req.mode = unwrap(parse_mode(mode));
        req.batch = batch;
        req.seq = seq;
        req.grad_accum = grad_accum;
        if (!precision.empty()) req.precision = unwrap(parse_precision(precision));
        req.optimizer = unwrap(parse_optimizer(optimizer));
        req.recompute = unwrap(parse_recompute(recompute));
        req.optimizer_impl = unwrap(parse_optimizer_impl(optimizer_impl));
        req.zero_grad = unwrap(parse_zero_grad(zero_grad));
        req.attention = unwrap(parse_attention(attention));
        req.lora_rank = lora_rank;
        req.lora_targets = split_commas(lora_targets);
        if (!quant.empty()) req.quant = unwrap(parse_quant(quant));
        if (!kv_dtype.empty()) {
            auto d = parse_dtype(kv_dtype);
            if (!d) throw InputError(Error{ErrorCode::InvalidArgument, "--kv-dtype: unknown dtype \"" + kv_dtype + "\"; use fp16, bf16, fp32, fp8 or int8", "kv-dtype"});
            req.kv_dtype = *d;
        }
        req.gen_len = gen_len;
        req.gpu = gpu;
        if (!gpu_memory.empty()) req.gpu_memory = unwrap(parse_size(gpu_memory, "gpu-memory"));
        if (!cuda_context.empty()) req.cuda_context = unwrap(parse_size(cuda_context, "cuda-context"));
        const EstimateResult r = unwrap(estimate(req));
        for (const auto& w : r.warnings) std::fprintf(stderr, "gpumem: warning: %s\n", w.c_str());
        std::fputs(render_estimate(r, fmt).c_str(), stdout);
        return 0;
    } catch (const InputError& e) {
        return report_error(e.error());
    } catch (const OverflowError& e) {
        return report_error(Error{ErrorCode::Overflow, std::string("a size overflows 64 bits: ") + e.what(), ""});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpumem: internal error: %s\n", e.what());
        return 3;
    }
}
