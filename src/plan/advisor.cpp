#include "gpumem/plan/advisor.hpp"

#include <algorithm>
#include <functional>

#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

namespace {

struct Candidate {
    std::string key, title, flags, note;
    std::function<bool(EstimateRequest&)> apply;  // false: not applicable to this request
    bool same_gpus = true;                        // usable in the fitting combination
    // The framework's own setting for this remedy ("" where it has none:
    // the remedy is then not offered).
    std::function<std::string(Framework)> setting;
};

bool training(Mode m) { return m != Mode::Infer; }

// The checkpointing a request runs with (the framework's default when unset).
Recompute recompute_of(const EstimateRequest& r) {
    return r.recompute.value_or(framework_profile(r.framework.value_or(Framework::HF)).recompute);
}

// Where each framework exposes a lower-memory loss or activation offloading
// (docs/frameworks.md cites the code); "" where it does not.
std::string loss_setting(Framework f) {
    switch (f) {
        case Framework::HF: return "TrainingArguments(use_liger_kernel=True)";
        case Framework::Axolotl: return "cut_cross_entropy: true";
        case Framework::LlamaFactory: return "enable_liger_kernel: true";
        case Framework::Torchtune: return "loss: _component_: torchtune.modules.loss.LinearCrossEntropyLoss";
        default: return "";
    }
}
std::string offload_setting(Framework f) {
    switch (f) {
        case Framework::Torchtune: return "enable_activation_offloading: True";
        case Framework::HF: return "SFTConfig(activation_offloading=True) (TRL)";
        case Framework::Axolotl: return "activation_offloading: true";
        case Framework::Unsloth: return "use_gradient_checkpointing=\"unsloth\"";
        default: return "";
    }
}

std::vector<Candidate> candidates() {
    std::vector<Candidate> c;
    auto add = [&](std::string key, std::string title, std::string flags, std::string note, std::function<bool(EstimateRequest&)> f,
                   bool same = true) { c.push_back({std::move(key), std::move(title), std::move(flags), std::move(note), std::move(f), same, {}}); };
    add("grad_accum", "gradient accumulation (half micro-batch, twice the steps)", "--batch B/2 --grad-accum 2G",
        "same global batch and result; more, smaller kernels", [](EstimateRequest& r) {
            if (!training(r.mode) || r.batch < 2) return false;
            r.batch /= 2;
            r.grad_accum *= 2;
            return true;
        });
    add("recompute_selective", "selective activation recompute", "--recompute selective", "recomputes the attention core in backward",
        [](EstimateRequest& r) {
            if (!training(r.mode) || recompute_of(r) != Recompute::None) return false;
            r.recompute = Recompute::Selective;
            return true;
        });
    add("recompute_full", "full activation recompute (gradient checkpointing)", "--recompute full",
        "keeps only each layer's input; one extra forward", [](EstimateRequest& r) {
            if (!training(r.mode) || recompute_of(r) == Recompute::Full) return false;
            r.recompute = Recompute::Full;
            return true;
        });
    add("fused_linear_ce", "fused linear cross-entropy (no logits materialised)", "--cross-entropy fused-linear",
        "the output layer and loss run chunk by chunk; same loss", [](EstimateRequest& r) {
            if (!training(r.mode) || r.cross_entropy == CrossEntropy::FusedLinear) return false;
            const Framework f = r.framework.value_or(Framework::HF);
            if (loss_setting(f).empty() || framework_profile(f).cross_entropy == CrossEntropy::FusedLinear) return false;
            r.cross_entropy = CrossEntropy::FusedLinear;
            return true;
        });
    c.back().setting = loss_setting;
    add("activation_offload", "activation offloading to CPU (with full recompute)", "--recompute full --activation-offload",
        "checkpointed layer inputs wait in pinned CPU memory; needs PCIe bandwidth", [](EstimateRequest& r) {
            if (!training(r.mode) || r.activation_offload.value_or(false)) return false;
            const Framework f = r.framework.value_or(Framework::HF);
            if (offload_setting(f).empty() || framework_profile(f).activation_offload) return false;
            if (recompute_of(r) != Recompute::Full && recompute_of(r) != Recompute::Ops) r.recompute = Recompute::Full;
            r.activation_offload = true;
            return true;
        });
    c.back().setting = offload_setting;
    add("flash_attention", "flash / SDPA attention", "--attention flash", "no s x s score matrices; usually faster", [](EstimateRequest& r) {
        if (r.attention == Attention::Flash) return false;
        r.attention = Attention::Flash;
        return true;
    });
    add("mixed_precision", "bf16 mixed precision (autocast)", "--precision amp-bf16", "fp32 master weights kept; faster tensor cores",
        [](EstimateRequest& r) {
            if (!training(r.mode) || !r.precision || *r.precision != Precision::FP32) return false;  // default is already amp-bf16
            r.precision = Precision::AmpBF16;
            return true;
        });
    add("pure_bf16", "pure bf16 weights, gradients and optimizer states", "--precision bf16",
        "halves model states; no fp32 master copy (watch convergence)", [](EstimateRequest& r) {
            if (!training(r.mode) || r.precision == Precision::BF16) return false;
            r.precision = Precision::BF16;
            return true;
        });
    add("adamw_8bit", "8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit", "2 bytes of state per parameter instead of 8",
        [](EstimateRequest& r) {
            if (!training(r.mode) || (r.optimizer != Optimizer::Adam && r.optimizer != Optimizer::AdamW)) return false;
            r.optimizer = Optimizer::AdamW8bit;
            return true;
        });
    add("adafactor", "Adafactor", "--optimizer adafactor", "factored second moment; different convergence", [](EstimateRequest& r) {
        if (!training(r.mode) || r.optimizer == Optimizer::Adafactor || r.optimizer == Optimizer::SGD) return false;
        r.optimizer = Optimizer::Adafactor;
        return true;
    });
    add("offload_optimizer", "optimizer states on the CPU (ZeRO-Offload)", "--zero 2 --offload-optimizer cpu",
        "optimizer step on the CPU; needs host memory and PCIe bandwidth", [](EstimateRequest& r) {
            if (!training(r.mode) || r.parallel.offload_optimizer != Offload::None || r.parallel.fsdp != Fsdp::None || r.parallel.pp > 1) return false;
            if (r.parallel.zero < 2) r.parallel.zero = 2;
            r.parallel.offload_optimizer = Offload::Cpu;
            return true;
        });
    add("lora", "LoRA adapters (frozen base)", "--mode lora", "trains adapters only; quality differs from full fine-tuning",
        [](EstimateRequest& r) {
            if (r.mode != Mode::Train) return false;
            r.mode = Mode::Lora;
            if (r.precision == Precision::FP32) r.precision = Precision::AmpBF16;
            return true;
        });
    add("qlora", "QLoRA (4-bit base + LoRA)", "--mode qlora", "4-bit base weights dequantized per layer; slower matmuls",
        [](EstimateRequest& r) {
            if (r.mode != Mode::Train && r.mode != Mode::Lora) return false;
            r.mode = Mode::QLora;
            r.quant.reset();
            if (r.precision == Precision::FP32) r.precision = Precision::AmpBF16;
            return true;
        });
    add("smaller_batch", "smaller micro-batch (half)", "--batch B/2", "halves the global batch unless accumulation makes it up",
        [](EstimateRequest& r) {
            if (r.batch < 2) return false;
            r.batch /= 2;
            return true;
        });
    add("kv_8bit", "8-bit KV cache", "--kv-dtype fp8", "halves the cache of 16-bit models", [](EstimateRequest& r) {
        if (training(r.mode) || r.kv_dtype == DType::F8_E4M3) return false;
        r.kv_dtype = DType::F8_E4M3;
        return true;
    });
    add("quant_int8", "int8 weights (LLM.int8)", "--quant int8", "slower matmuls", [](EstimateRequest& r) {
        if (training(r.mode) || (r.quant && *r.quant != Quant::None)) return false;
        r.quant = Quant::Int8;
        return true;
    });
    add("quant_nf4", "4-bit weights (nf4)", "--quant nf4", "dequantized per layer", [](EstimateRequest& r) {
        if (training(r.mode) || r.quant == Quant::NF4) return false;
        r.quant = Quant::NF4;
        return true;
    });
    // Techniques that need more GPUs: evaluated on 8 GPUs (or twice the current count).
    auto more = [](EstimateRequest& r) {
        const std::int64_t g = r.parallel.gpus == 1 ? 8 : r.parallel.gpus * 2;
        r.parallel.gpus = g;
        r.parallel.nodes = std::max<std::int64_t>(1, g / 8);
    };
    add("zero1", "ZeRO-1 (optimizer states sharded)", "--gpus N --zero 1", "communication as plain data parallelism", [more](EstimateRequest& r) {
        if (!training(r.mode) || r.parallel.zero >= 1 || r.parallel.fsdp != Fsdp::None) return false;
        if (r.parallel.gpus == 1) more(r);
        r.parallel.zero = 1;
        return true;
    }, false);
    add("zero2", "ZeRO-2 (+ gradients sharded)", "--gpus N --zero 2", "reduce-scatter instead of all-reduce", [more](EstimateRequest& r) {
        if (!training(r.mode) || r.parallel.zero >= 2 || r.parallel.fsdp != Fsdp::None || r.parallel.pp > 1) return false;
        if (r.parallel.gpus == 1) more(r);
        r.parallel.zero = 2;
        return true;
    }, false);
    add("zero3", "ZeRO-3 (+ parameters sharded)", "--gpus N --zero 3", "parameters all-gathered for every layer (1.5x traffic)",
        [more](EstimateRequest& r) {
            if (!training(r.mode) || r.parallel.zero >= 3 || r.parallel.fsdp != Fsdp::None || r.parallel.pp > 1) return false;
            if (r.parallel.gpus == 1) more(r);
            r.parallel.zero = 3;
            return true;
        }, false);
    add("fsdp", "FSDP full sharding", "--gpus N --fsdp full", "PyTorch-native ZeRO-3", [more](EstimateRequest& r) {
        if (!training(r.mode) || r.parallel.fsdp != Fsdp::None || r.parallel.zero > 0) return false;
        if (r.parallel.gpus == 1) more(r);
        r.parallel.fsdp = Fsdp::Full;
        return true;
    }, false);
    add("tensor_parallel", "tensor parallelism (tp 2, with sequence parallelism)", "--gpus 2N --tp 2 --sp",
        "splits every layer; needs fast links", [](EstimateRequest& r) {
            r.parallel.gpus *= 2;
            r.parallel.tp *= 2;
            r.parallel.sp = true;
            return true;
        }, false);
    add("pipeline_parallel", "pipeline parallelism (pp 2)", "--gpus 2N --pp 2 --grad-accum >= 2", "splits the layers; pipeline bubble",
        [](EstimateRequest& r) {
            if (r.parallel.zero >= 2) return false;
            r.parallel.gpus *= 2;
            r.parallel.pp *= 2;
            r.grad_accum = std::max<std::int64_t>(r.grad_accum, r.parallel.pp * 2);
            return true;
        }, false);
    return c;
}

struct Eval {
    bool ok = false;
    Error error;
    EstimateResult r;
    double step = 0;
};

}  // namespace

Result<AdviceResult> advise(const AdviceRequest& ar) {
    if (ar.base.params_count)
        return Error{ErrorCode::InvalidArgument, "advise needs a model graph (a preset, config.json, folder or layer-list JSON), not --params", "params"};
    auto g = load_model(ar.base.model, model_options(ar.base));
    if (!g) return g.error();
    const ModelGraph& graph = g.value();
    auto eval = [&](const EstimateRequest& r) {
        Eval e;
        auto res = ar.simulate ? simulate_estimate(graph, r) : estimate(graph, r);
        if (!res) {
            e.error = res.error();
            return e;
        }
        auto job = resolve_job(graph, r);
        if (!job) {
            e.error = job.error();
            return e;
        }
        auto t = compute_time(graph, job.value(), res.value(), ar.compute);
        if (!t) {
            e.error = t.error();
            return e;
        }
        e.ok = true;
        e.r = std::move(res).value();
        e.step = t.value().step_seconds;
        return e;
    };
    Eval base = eval(ar.base);
    if (!base.ok) return base.error;

    AdviceResult out;
    out.model = graph.name;
    out.gpu = base.r.gpu().name;
    out.capacity = base.r.per_gpu.capacity;
    out.baseline_total = base.r.per_gpu.total_device;
    out.baseline_fits = base.r.per_gpu.fits;
    out.baseline_step_seconds = base.step;
    out.assumptions = base.r.assumptions;

    const auto cands = candidates();
    std::vector<std::pair<const Candidate*, Technique>> done;
    for (const auto& c : cands) {
        Technique t;
        t.key = c.key;
        t.title = c.title;
        t.flags = c.flags;
        t.note = c.note;
        if (c.setting) {
            const std::string key = c.setting(ar.base.framework.value_or(Framework::HF));
            if (!key.empty()) t.note += " (" + std::string(to_string(ar.base.framework.value_or(Framework::HF))) + ": " + key + ")";
        }
        EstimateRequest r = ar.base;
        if (!c.apply(r)) {
            t.applicable = false;
            t.why_not = "already in use or not applicable to this job";
        } else {
            t.gpus = r.parallel.gpus;
            t.command = request_to_command(r);
            Eval e = eval(r);
            if (!e.ok) {
                t.applicable = false;
                t.why_not = e.error.message;
            } else {
                t.total_device = e.r.per_gpu.total_device;
                t.saving = base.r.per_gpu.total_device - t.total_device;
                t.step_seconds = e.step;
                // Per-GPU step time relative to the baseline (more GPUs share the work).
                t.time_cost = base.step > 0 ? e.step / base.step - 1.0 : 0.0;
                t.fits = e.r.per_gpu.fits;
            }
        }
        done.emplace_back(&c, t);
    }
    // Rank: applicable first, then by memory saved, then by time cost, then key.
    std::stable_sort(done.begin(), done.end(), [](const auto& a, const auto& b) {
        if (a.second.applicable != b.second.applicable) return a.second.applicable;
        if (a.second.saving != b.second.saving) return a.second.saving > b.second.saving;
        if (a.second.time_cost != b.second.time_cost) return a.second.time_cost < b.second.time_cost;
        return a.second.key < b.second.key;
    });
    for (const auto& d : done) out.techniques.push_back(d.second);

    // Cheapest combination on the same GPUs: add techniques in order of time cost
    // per GiB saved until the job fits (each step re-estimated together).
    out.combination_total = base.r.per_gpu.total_device;
    out.combination_fits = base.r.per_gpu.fits;
    if (!base.r.per_gpu.fits) {
        std::vector<const std::pair<const Candidate*, Technique>*> order;
        for (const auto& d : done)
            if (d.second.applicable && d.first->same_gpus && d.second.saving > Bytes(0) && d.first->key != "smaller_batch" &&
                d.first->key != "lora" && d.first->key != "qlora")
                order.push_back(&d);  // keeps the job: same GPUs, global batch and full fine-tuning
        std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
            const double ca = std::max(0.0, a->second.time_cost) / std::max(1e-9, a->second.saving.gib());
            const double cb = std::max(0.0, b->second.time_cost) / std::max(1e-9, b->second.saving.gib());
            return ca < cb;
        });
        EstimateRequest r = ar.base;
        for (const auto* d : order) {
            EstimateRequest next = r;
            if (!d->first->apply(next)) continue;
            Eval e = eval(next);
            if (!e.ok || e.r.per_gpu.total_device >= out.combination_total) continue;
            r = next;
            out.combination.push_back(d->second.key);
            out.combination_flags += (out.combination_flags.empty() ? "" : " ") + d->second.flags;
            out.combination_command = request_to_command(r);
            out.combination_total = e.r.per_gpu.total_device;
            out.combination_time_cost = base.step > 0 ? e.step / base.step - 1.0 : 0.0;
            out.combination_fits = e.r.per_gpu.fits;
            if (out.combination_fits) break;
        }
    }
    return out;
}

}  // namespace gpumem
