// The OOM doctor, part 3: the remedies for a verdict (allocator settings,
// memory outside PyTorch, model-side settings priced with estimate() when the
// run is known), ranked, and combined when no single one is predicted to fit.
#include "gpumem/plan/doctor.hpp"

#include <algorithm>
#include <array>

#include "doctor_internal.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

std::int64_t suggested_max_split_size_mb(Bytes requested) {
    const std::int64_t mib = requested.count() / (1024 * 1024);
    std::int64_t p = 32;
    while (p * 2 <= mib && p < (std::int64_t{1} << 40)) p *= 2;
    return p;
}

namespace {

using detail::gib;
using detail::join;
using detail::kContextAllowance;

// Order used to break ties between remedies with equal standing.
int preference(const std::string& key) {
    static const std::array<const char*, 13> order = {
        "expandable_segments", "max_split_size", "free_outside_memory", "micro_batch", "recompute_full", "recompute_selective",
        "precision_bf16", "precision_amp_bf16", "optimizer_8bit", "adafactor", "lora", "bigger_gpu", "empty_cache"};
    for (std::size_t i = 0; i < order.size(); ++i)
        if (key == order[i]) return static_cast<int>(i);
    return static_cast<int>(order.size());
}

bool is_training(Mode m) { return m != Mode::Infer; }

RemedyPrediction predict(const EstimateResult& e, const DoctorBaseline& base, const DoctorNumbers& n) {
    RemedyPrediction p;
    p.request = e.request();
    p.peak_allocated = e.per_gpu.peak_allocated;
    p.peak_reserved = e.per_gpu.peak_reserved;
    p.total_device = e.per_gpu.total_device;
    p.saving = base.peak_reserved - e.per_gpu.peak_reserved;
    p.fits_message_gpu = e.per_gpu.total_device <= n.total_capacity - n.other_processes;
    return p;
}

struct Variant {
    std::string key;
    std::string title;
    std::string action;
    EstimateRequest req;
};

// The setting a model-side remedy changes; one remedy per setting is combined.
std::string setting_of(const std::string& key) {
    if (key == "micro_batch") return "batch";
    if (key.rfind("recompute", 0) == 0) return "recompute";
    if (key.rfind("precision", 0) == 0) return "precision";
    if (key == "optimizer_8bit" || key == "adafactor") return "optimizer";
    if (key == "lora") return "mode";
    return key;
}

void apply_setting(EstimateRequest& to, const EstimateRequest& from, const std::string& setting) {
    if (setting == "batch") {
        to.batch = from.batch;
        to.grad_accum = from.grad_accum;
    } else if (setting == "recompute") {
        to.recompute = from.recompute;
    } else if (setting == "precision") {
        to.precision = from.precision;
    } else if (setting == "optimizer") {
        to.optimizer = from.optimizer;
    } else if (setting == "mode") {
        to.mode = from.mode;
    }
}

// Greedy: remedies with a positive predicted saving, in rank order, one per
// setting, each kept only if estimate() accepts the combination; stops at the
// first combination that fits.
std::optional<CombinedRemedy> combine(const DoctorResult& d, const std::vector<Variant>& priced, const DoctorNumbers& n) {
    if (!d.baseline) return std::nullopt;
    EstimateRequest cur = d.baseline->request;
    std::optional<CombinedRemedy> out;
    std::vector<std::string> used;
    for (const auto& r : d.remedies) {
        if (!r.prediction || !r.applicable || r.prediction->saving <= Bytes(0)) continue;
        const std::string setting = setting_of(r.key);
        if (std::find(used.begin(), used.end(), setting) != used.end()) continue;
        auto v = std::find_if(priced.begin(), priced.end(), [&](const Variant& x) { return x.key == r.key; });
        if (v == priced.end()) continue;
        EstimateRequest next = cur;
        apply_setting(next, v->req, setting);
        auto e = simulate_estimate(next);
        if (!e) continue;
        used.push_back(setting);
        cur = next;
        if (!out) out = CombinedRemedy{};
        out->keys.push_back(r.key);
        out->actions.push_back(r.action);
        out->prediction = predict(e.value(), *d.baseline, n);
        if (out->prediction.fits_message_gpu) break;
    }
    if (out && out->keys.size() < 2) return std::nullopt;  // a single remedy is already listed
    return out;
}

}  // namespace

namespace detail {

std::optional<Error> add_remedies(DoctorResult& d, const std::optional<EstimateRequest>& run, const VerdictFacts& f) {
    const OomReport& o = d.oom;
    const DoctorNumbers& n = d.numbers;
    const Bytes avoidable_outside = f.avoidable_outside;
    const bool outside_large = f.outside_large;
    const std::string C = gib(n.cached), X = gib(n.requested), T = gib(n.total_capacity);
    std::vector<Remedy> rem;
    std::vector<Variant> priced;  // model-side variants estimate() accepted
    const bool frag = d.verdict == OomVerdict::Fragmented;
    {
        Remedy r;
        r.key = "expandable_segments";
        r.title = "expandable segments";
        r.action = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
        r.saving = n.cached;
        r.basis = "recovers up to the " + C + " reserved but unallocated: one growing segment per stream whose freed pages are reused "
                  "for any size" + std::string(o.wording == "1.x" ? "; needs PyTorch >= 2.1" : "");
        r.addresses_verdict = frag;
        rem.push_back(r);
    }
    {
        Remedy r;
        const std::int64_t mb = suggested_max_split_size_mb(n.requested);
        r.key = "max_split_size";
        r.title = "max_split_size_mb";
        r.action = "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:" + std::to_string(mb);
        r.saving = n.cached;
        r.basis = "up to the " + C + " reserved but unallocated: cached blocks of " + std::to_string(mb) +
                  " MiB or more are no longer split by smaller requests, so they stay whole for requests like this " + X +
                  " one; prevents rather than repairs fragmentation";
        r.addresses_verdict = frag;
        rem.push_back(r);
    }
    if (outside_large || n.other_processes >= MiB(256)) {
        Remedy r;
        r.key = "free_outside_memory";
        r.title = "free memory held outside PyTorch";
        r.action = n.other_processes > Bytes(0)
                       ? "stop or move the other processes on this GPU (nvidia-smi), or pick an idle GPU with CUDA_VISIBLE_DEVICES"
                       : "find what this process allocates outside PyTorch (NCCL buffers, cuDNN/cuBLAS workspaces, other CUDA libraries)";
        r.saving = max(avoidable_outside, n.other_processes);
        r.basis = "the " + gib(*r.saving) + " used outside the allocator beyond a ~" + gib(kContextAllowance) + " CUDA context";
        r.addresses_verdict = d.verdict == OomVerdict::OutsidePytorch;
        rem.push_back(r);
    }

    const bool model_addresses = d.verdict == OomVerdict::Full;
    auto generic = [&](std::string key, std::string title, std::string action, std::string basis) {
        Remedy r;
        r.key = std::move(key);
        r.title = std::move(title);
        r.action = std::move(action);
        r.basis = std::move(basis) + " (not quantified without --model)";
        r.addresses_verdict = model_addresses;
        rem.push_back(r);
    };

    if (!run) {
        d.notes.push_back("no --model given: model-side savings are not quantified; pass --model and the run's settings (--batch, --seq, ...) to price each remedy with gpumem's estimate");
        generic("micro_batch", "halve the micro-batch, double gradient accumulation", "--batch B/2 --grad-accum 2*G",
                "halving the micro-batch roughly halves the saved activations (and the logits); the global batch is unchanged");
        generic("recompute_full", "full activation recompute", "model.gradient_checkpointing_enable() / --recompute full",
                "keeps only each layer's input and recomputes the rest in backward: activations drop to a small fraction, "
                "~30% more compute");
        generic("recompute_selective", "selective activation recompute", "--recompute selective",
                "recomputes the attention internals only; saves less than full recompute");
        generic("precision_bf16", "bf16 weights and optimizer states", "--precision bf16",
                "pure bf16 halves weights, gradients and optimizer states against fp32 (AMP keeps fp32 master weights)");
        generic("optimizer_8bit", "8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit",
                "Adam moments in 8 bits: 2 bytes instead of 8 per parameter");
        generic("adafactor", "Adafactor", "--optimizer adafactor",
                "factored second moment, no first moment: optimizer state a small fraction of Adam's");
        generic("lora", "LoRA", "--mode lora",
                "frozen base weights need no gradients or optimizer states; only the adapters train");
    } else {
        auto base_res = simulate_estimate(*run);
        if (!base_res) return base_res.error();
        const EstimateResult& base = base_res.value();
        DoctorBaseline b;
        b.request = base.request();
        b.model_name = base.model_name;
        b.peak_allocated = base.per_gpu.peak_allocated;
        b.peak_reserved = base.per_gpu.peak_reserved;
        b.total_device = base.per_gpu.total_device;
        b.fits_message_gpu = b.total_device <= n.total_capacity - n.other_processes;
        d.baseline = b;
        if (b.peak_allocated + MiB(64) < n.allocated + n.requested)
            d.findings.push_back("gpumem predicts a peak of " + gib(b.peak_allocated) + " allocated for " + b.model_name +
                                 " with these settings, below the " + gib(n.allocated + n.requested) +
                                 " the message shows was needed: the failing run differs from the settings given "
                                 "(longer sequences, larger batch, tensors kept alive across steps?)");
        else if (!b.fits_message_gpu && d.verdict != OomVerdict::Full)
            d.findings.push_back("gpumem predicts " + gib(b.total_device) + " on the device for these settings, more than this " + T +
                                 " GPU: fixing the " + std::string(to_string(d.verdict)) +
                                 " failure alone will not be enough; see the model-side remedies");
        else if (b.fits_message_gpu)
            d.findings.push_back("gpumem predicts these settings fit this GPU (" + gib(b.total_device) + " of " + T +
                                 "): the failure is likely a transient peak, fragmentation or a longer-than-usual batch");

        const EstimateRequest& br = base.request();
        const bool train = is_training(br.mode);
        const Precision prec = br.precision.value_or(train ? Precision::AmpBF16 : Precision::BF16);
        std::vector<Variant> vars;
        {
            Variant v{"micro_batch", "", "", br};
            if (br.batch >= 2) {
                v.req.batch = br.batch / 2;
                if (train) {
                    v.req.grad_accum = br.grad_accum * 2;
                    v.title = "halve the micro-batch, double gradient accumulation";
                    v.action = "--batch " + std::to_string(v.req.batch) + " --grad-accum " + std::to_string(v.req.grad_accum);
                } else {
                    v.title = "halve the batch";
                    v.action = "--batch " + std::to_string(v.req.batch);
                }
                vars.push_back(v);
            } else {
                Remedy r;
                r.key = "micro_batch";
                r.title = "halve the micro-batch";
                r.action = "--batch 1 already";
                r.applicable = false;
                r.basis = "the micro-batch is already 1; shorten the sequence or use recompute";
                rem.push_back(r);
            }
        }
        if (train) {
            if (br.recompute != Recompute::Full) {
                Variant v{"recompute_full", "full activation recompute", "--recompute full (model.gradient_checkpointing_enable())", br};
                v.req.recompute = Recompute::Full;
                vars.push_back(v);
            }
            if (br.recompute.value_or(Recompute::None) == Recompute::None) {
                Variant v{"recompute_selective", "selective activation recompute", "--recompute selective", br};
                v.req.recompute = Recompute::Selective;
                vars.push_back(v);
            }
            if (prec == Precision::FP32) {
                Variant v{"precision_amp_bf16", "bf16 autocast (AMP)", "--precision amp-bf16", br};
                v.req.precision = Precision::AmpBF16;
                vars.push_back(v);
            }
            if (prec == Precision::FP32 || prec == Precision::AmpBF16 || prec == Precision::AmpFP16) {
                Variant v{"precision_bf16", "bf16 weights and optimizer states", "--precision bf16", br};
                v.req.precision = Precision::BF16;
                vars.push_back(v);
            }
            if (br.optimizer == Optimizer::Adam || br.optimizer == Optimizer::AdamW) {
                Variant v{"optimizer_8bit", "8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit", br};
                v.req.optimizer = Optimizer::AdamW8bit;
                vars.push_back(v);
                Variant a{"adafactor", "Adafactor", "--optimizer adafactor", br};
                a.req.optimizer = Optimizer::Adafactor;
                vars.push_back(a);
            }
            if (br.mode == Mode::Train) {
                Variant v{"lora", "LoRA", "--mode lora --lora-rank " + std::to_string(br.lora_rank), br};
                v.req.mode = Mode::Lora;
                vars.push_back(v);
            }
        } else if (prec == Precision::FP32) {
            Variant v{"precision_bf16", "bf16 weights", "--precision bf16", br};
            v.req.precision = Precision::BF16;
            vars.push_back(v);
        }
        // Allocator settings priced by replaying the simulated step with them.
        for (auto& r : rem) {
            if (r.key != "expandable_segments" && r.key != "max_split_size") continue;
            EstimateRequest q = br;
            const std::string setting = r.action.substr(r.action.find('=') + 1);
            q.alloc_conf = br.alloc_conf.empty() ? setting : br.alloc_conf + "," + setting;
            auto e = simulate_estimate(q);
            if (!e) continue;
            r.prediction = predict(e.value(), b, n);
            r.saving = r.prediction->saving;
            r.basis += "; gpumem simulation of this run: peak reserved " + gib(r.prediction->peak_reserved) + " vs " +
                       gib(b.peak_reserved);
        }
        for (const auto& v : vars) {
            Remedy r;
            r.key = v.key;
            r.title = v.title;
            r.action = v.action;
            auto e = simulate_estimate(v.req);
            if (!e) {
                r.applicable = false;
                r.basis = "estimate rejected this variant: " + e.error().message;
                rem.push_back(r);
                continue;
            }
            r.prediction = predict(e.value(), b, n);
            r.saving = r.prediction->saving;
            r.basis = "gpumem simulation: peak reserved " + gib(r.prediction->peak_reserved) + " vs " + gib(b.peak_reserved) +
                      " for the run as given";
            r.addresses_verdict = model_addresses && r.prediction->saving > Bytes(0);
            rem.push_back(r);
            priced.push_back(v);
        }
    }
    {
        Remedy r;
        r.key = "empty_cache";
        r.title = "torch.cuda.empty_cache()";
        r.action = "none: not a fix";
        r.saving = Bytes(0);
        r.is_fix = false;
        r.basis = "the allocator already released every wholly free cached segment (what empty_cache() does) and retried before "
                  "raising this error; the " + C + " still reserved sits in segments that also hold live tensors, which "
                  "empty_cache() cannot release. Calling it only makes later allocations slower (cudaMalloc/cudaFree synchronize)";
        rem.push_back(r);
    }

    // ---- rank: real, applicable fixes first; those that address the
    // verdict before those that do not; then by saving (known before
    // unknown, larger first); ties by a fixed preference.
    std::stable_sort(rem.begin(), rem.end(), [](const Remedy& a, const Remedy& b) {
        const bool ua = a.is_fix && a.applicable, ub = b.is_fix && b.applicable;
        if (ua != ub) return ua;
        if (a.addresses_verdict != b.addresses_verdict) return a.addresses_verdict;
        if (a.saving.has_value() != b.saving.has_value()) return a.saving.has_value();
        if (a.saving && b.saving && *a.saving != *b.saving) return *a.saving > *b.saving;
        return preference(a.key) < preference(b.key);
    });
    for (std::size_t i = 0; i < rem.size(); ++i) rem[i].rank = static_cast<int>(i) + 1;
    d.remedies = std::move(rem);

    if (d.baseline) {
        std::vector<std::string> fit;
        for (const auto& r : d.remedies)
            if (r.prediction && r.prediction->fits_message_gpu) fit.push_back(r.key);
        if (!fit.empty()) {
            d.notes.push_back("predicted to fit this " + T + " GPU: " + join(fit, ", "));
        } else {
            d.combined = combine(d, priced, n);
            if (d.combined && d.combined->prediction.fits_message_gpu)
                d.notes.push_back("no single model-side remedy is predicted to fit this " + T + " GPU; together " +
                                  join(d.combined->keys, " + ") + " are (" + gib(d.combined->prediction.total_device) + ")");
            else
                d.notes.push_back("no model-side remedy, alone or combined, is predicted to fit this " + T +
                                  " GPU: use more GPUs (sharding: ZeRO/FSDP) or a larger GPU");
        }
    }
    return std::nullopt;
}

}  // namespace detail

}  // namespace gpumem
