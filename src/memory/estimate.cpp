#include "gpumem/memory/estimate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "gpumem/model/load.hpp"

namespace gpumem {

ParamSummary summarize_params(const ModelGraph& g) {
    ParamSummary s;
    s.total = g.total_params();
    s.trainable = g.trainable_params();
    if (g.params_only > 0) {
        s.by_component.emplace_back("total (count only)", g.params_only);
        return s;
    }
    std::array<std::int64_t, kComponentCount> comp{};
    std::map<std::string, std::int64_t> dt;
    for (const auto& b : g.blocks)
        for (const auto& p : b.params) {
            const std::int64_t n = checked_mul(b.repeat, p.numel());
            auto& c = comp[static_cast<std::size_t>(p.component)];
            c = checked_add(c, n);
            auto& d = dt[std::string(dtype_name(p.dtype))];
            d = checked_add(d, n);
        }
    for (int i = 0; i < kComponentCount; ++i)
        if (comp[static_cast<std::size_t>(i)] != 0)
            s.by_component.emplace_back(component_name(static_cast<Component>(i)), comp[static_cast<std::size_t>(i)]);
    for (const auto& [k, v] : dt) s.by_dtype.emplace_back(k, v);
    return s;
}

namespace {

DType half_of(Precision p) {
    return (p == Precision::FP16 || p == Precision::AmpFP16) ? DType::F16 : DType::BF16;
}

// One trainable tensor shape (count identical tensors).
struct TrainTensor {
    std::vector<std::int64_t> shape;
    std::int64_t count = 1;
    [[nodiscard]] std::int64_t numel() const {
        std::int64_t n = count;
        for (auto d : shape) n = checked_mul(n, d);
        return n;
    }
};

// Optimizer state bytes for one tensor. Layouts:
//  SGD: none; SGD momentum: momentum_buffer; Adam/AdamW: exp_avg + exp_avg_sq
//  (torch/optim/adam.py _init_group); Lion: exp_avg (lucidrains/lion-pytorch);
//  AdamW 8-bit: bitsandbytes Optimizer2State: uint8 state1/state2 + fp32
//  absmax per 256-element block, tensors with < 4096 elements keep fp32
//  states (min_8bit_size); Adafactor (transformers.optimization.Adafactor,
//  beta1=None): fp32 exp_avg_sq_row [.., rows] + exp_avg_sq_col [.., cols] for
//  >= 2-D tensors, a full fp32 exp_avg_sq for 1-D, plus a scalar RMS.
Bytes optimizer_bytes(Optimizer o, const TrainTensor& t, DType state) {
    const std::int64_t n = t.numel();
    switch (o) {
        case Optimizer::SGD: return Bytes(0);
        case Optimizer::SGDMomentum:
        case Optimizer::Lion: return dtype_bytes(state, n);
        case Optimizer::Adam:
        case Optimizer::AdamW: return dtype_bytes(state, n) * 2;
        case Optimizer::AdamW8bit: {
            std::int64_t per = 1;
            for (auto d : t.shape) per = checked_mul(per, d);
            if (per < 4096) return dtype_bytes(DType::F32, n) * 2;
            const std::int64_t blocks = (per + 255) / 256;
            return Bytes(checked_mul(t.count, checked_add(checked_mul(2, per), checked_mul(2 * 4, blocks))));
        }
        case Optimizer::Adafactor: {
            if (t.shape.size() >= 2) {
                std::int64_t lead = 1;
                for (std::size_t i = 0; i + 2 < t.shape.size(); ++i) lead = checked_mul(lead, t.shape[i]);
                const std::int64_t rows = t.shape[t.shape.size() - 2], cols = t.shape.back();
                return Bytes(checked_mul(t.count, checked_add(checked_mul(4 * lead, checked_add(rows, cols)), 4)));
            }
            return Bytes(checked_mul(t.count, checked_add(checked_mul(4, t.shape.empty() ? 1 : t.shape[0]), 4)));
        }
    }
    return Bytes(0);
}

// Weight bytes of one parameter under weight quantization (bitsandbytes
// Linear8bitLt / Linear4bit, GPTQ-style int4). Only nn.Linear weights are
// quantized; lm_head stays in the compute dtype (bnb's default skip list).
Bytes quantized_bytes(Quant q, const Param& p, DType fallback) {
    const bool quantizable = p.linear_weight && p.module != "lm_head" && p.shape.size() == 2;
    if (q == Quant::None || !quantizable) return dtype_bytes(fallback, p.numel());
    const std::int64_t per = p.shape[0] * p.shape[1];
    std::int64_t b = 0;
    switch (q) {
        case Quant::Int8:  // int8 weight + fp32 row scale (SCB) per output row
            b = checked_add(per, 4 * p.shape[0]);
            break;
        case Quant::NF4: {  // 4-bit + double-quantized absmax (blocksize 64; uint8 absmax,
                            // fp32 second-level absmax per 256 blocks, 256-entry fp32 code table)
            const std::int64_t blocks = (per + 63) / 64;
            b = (per + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 1024 + 64 + 4;
            break;
        }
        case Quant::Int4: {  // GPTQ group 128: packed int4 + fp16 scale + packed int4 zero per group
            const std::int64_t groups = (per + 127) / 128;
            b = (per + 1) / 2 + 2 * groups + (groups + 1) / 2;
            break;
        }
        case Quant::None: break;
    }
    return Bytes(checked_mul(b, p.count));
}

void check(bool ok, const char* field, const std::string& msg) {
    if (!ok) fail(ErrorCode::InvalidArgument, field, msg);
}

std::vector<std::string> default_lora_targets(const ModelGraph& g) {
    // PEFT's default target modules per model_type
    // (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
    const std::string& f = g.family;
    if (f == "gpt2") return {"c_attn"};
    if (f == "bert" || f == "roberta") return {"query", "value"};
    if (f == "t5") return {"q", "v"};
    if (f == "gpt_neox") return {"query_key_value"};
    if (f == "falcon") return {"query_key_value"};
    if (f == "phi") return {"q_proj", "v_proj"};
    if (f == "phi3") return {"qkv_proj"};
    if (f == "deepseek_v2" || f == "deepseek_v3") return {"q_proj", "kv_a_proj_with_mqa", "q_a_proj", "q_b_proj", "kv_b_proj"};
    return {"q_proj", "v_proj"};
}

}  // namespace

Result<EstimateResult> estimate(const ModelGraph& g, const EstimateRequest& req_in) {
    return capture([&]() -> EstimateResult {
        EstimateResult out;
        EstimateRequest req = req_in;
        const bool train = req.mode != Mode::Infer;
        const bool lora = req.mode == Mode::Lora || req.mode == Mode::QLora;

        check(req.batch >= 1, "batch", "--batch must be a positive integer (got " + std::to_string(req.batch) + ")");
        check(req.grad_accum >= 1, "grad-accum", "--grad-accum must be a positive integer (got " + std::to_string(req.grad_accum) + ")");
        check(req.gen_len >= 0, "gen-len", "--gen-len must be zero or positive (got " + std::to_string(req.gen_len) + ")");
        if (req.seq) check(*req.seq >= 1, "seq", "--seq must be a positive integer (got " + std::to_string(*req.seq) + ")");
        if (lora) check(req.lora_rank >= 1, "lora-rank", "--lora-rank must be a positive integer (got " + std::to_string(req.lora_rank) + ")");

        if (!req.precision) req.precision = train ? Precision::AmpBF16 : Precision::BF16;
        if (!req.quant) req.quant = req.mode == Mode::QLora ? Quant::NF4 : Quant::None;
        if (req.mode == Mode::QLora && *req.quant == Quant::None)
            fail(ErrorCode::InvalidArgument, "quant", "--mode qlora needs a quantized base: use --quant nf4 (or int4/int8)");
        if (req.mode == Mode::Train && *req.quant != Quant::None)
            fail(ErrorCode::InvalidArgument, "quant",
                 "--quant applies to frozen weights: use --mode qlora or --mode infer, or --quant none for full training");
        if (lora && req.lora_targets.empty()) req.lora_targets = default_lora_targets(g);

        const Precision prec = *req.precision;
        const bool amp = prec == Precision::AmpBF16 || prec == Precision::AmpFP16;
        const DType half = half_of(prec);
        const DType stream = (prec == Precision::FP32 || amp) ? DType::F32 : half;
        const DType lowered = prec == Precision::FP32 ? DType::F32 : half;

        auto gpu = find_gpu(req.gpu);
        if (!gpu) throw InputError(gpu.error());
        out.gpu = gpu.value();
        const Bytes capacity = req.gpu_memory.value_or(out.gpu.memory);
        if (req.gpu_memory) out.gpu.memory = *req.gpu_memory;

        std::int64_t seq = 1;
        try {
            if (req.seq) (void)Extent::per_token2(1).elements(req.batch, checked_add(*req.seq, req.gen_len));
        } catch (const OverflowError&) {
            fail(ErrorCode::Overflow, "batch",
                 "--batch " + std::to_string(req.batch) + " with --seq " + std::to_string(*req.seq) +
                     ": tensor sizes overflow 64 bits; use a smaller batch or sequence");
        }
        if (g.has_sequence) {
            const std::int64_t def = g.max_positions > 0 ? std::min<std::int64_t>(2048, g.max_positions) : 2048;
            seq = req.seq.value_or(def);
            if (!req.seq) out.assumptions.push_back("--seq not given: using " + std::to_string(seq));
            const std::int64_t total = checked_add(seq, req.mode == Mode::Infer ? req.gen_len : 0);
            if (g.max_positions > 0 && total > g.max_positions)
                out.warnings.push_back("sequence length " + std::to_string(total) + " exceeds the model's maximum of " +
                                       std::to_string(g.max_positions) +
                                       " positions (max_position_embeddings); the estimate assumes it runs anyway");
        } else if (req.seq) {
            out.warnings.push_back("--seq is ignored: this model has a fixed input shape (the batch comes from --batch)");
        }
        req.seq = seq;
        out.seq = seq;

        out.model_name = g.name;
        out.model_source = g.source;
        out.family = g.family;
        out.params = summarize_params(g);
        out.assumptions.insert(out.assumptions.end(), g.notes.begin(), g.notes.end());

        // ---- model states ------------------------------------------------------
        // Weight dtype: fp32 for fp32 and autocast (torch.autocast keeps fp32
        // parameters), 16-bit for pure fp16/bf16; LoRA/QLoRA bases are loaded
        // in 16 bits (or quantized) and frozen; inference uses the precision.
        DType wdt = stream;
        if (lora && prec != Precision::FP32) wdt = half;
        const Quant quant = *req.quant;
        Bytes weights;
        std::vector<TrainTensor> trainable;
        std::int64_t largest_linear = 0;  // elements of the largest quantizable weight
        std::int64_t trainable_params = 0;
        if (g.params_only > 0) {
            weights = dtype_bytes(wdt, g.params_only);
            if (!lora) {
                trainable.push_back({{g.params_only}, 1});
                trainable_params = g.params_only;
            }
            out.assumptions.push_back("--params: model states only; activations, KV cache and transients are not modelled");
        } else {
            for (const auto& b : g.blocks)
                for (const auto& p : b.params) {
                    weights += quantized_bytes(quant, p, wdt) * b.repeat;
                    if (p.linear_weight && p.module != "lm_head" && p.shape.size() == 2)
                        largest_linear = std::max(largest_linear, checked_mul(p.shape[0], p.shape[1]));
                    if (train && !lora && p.trainable) {
                        trainable.push_back({p.shape, checked_mul(p.count, b.repeat)});
                        trainable_params = checked_add(trainable_params, checked_mul(p.numel(), b.repeat));
                    }
                }
            if (lora) {
                for (const auto& b : g.blocks)
                    for (const auto& op : b.ops)
                        if (lora_applies(op, req.lora_targets)) {
                            // A linear op standing for E routed experts (weights with
                            // count E) gets one adapter per expert, as PEFT wraps each.
                            const std::int64_t copies = checked_mul(
                                b.repeat, op.params.empty() ? 1 : b.params[static_cast<std::size_t>(op.params.front())].count);
                            trainable.push_back({{req.lora_rank, op.in_features}, copies});
                            trainable.push_back({{op.out_features, req.lora_rank}, copies});
                            trainable_params = checked_add(trainable_params,
                                checked_mul(copies, checked_mul(req.lora_rank, checked_add(op.in_features, op.out_features))));
                        }
                if (trainable_params == 0) {
                    std::string mods;
                    std::map<std::string, int> seen;
                    for (const auto& b : g.blocks)
                        for (const auto& op : b.ops)
                            if (op.kind == OpKind::Linear) {
                                auto d = op.name.rfind('.');
                                std::string leaf = d == std::string::npos ? op.name : op.name.substr(d + 1);
                                if (!seen[leaf]++) mods += (mods.empty() ? "" : ",") + leaf;
                            }
                    fail(ErrorCode::InvalidArgument, "lora-targets",
                         "--lora-targets matches no linear layer of this model; its linear modules are: " + mods);
                }
            }
        }
        out.trainable_params = trainable_params;
        // bitsandbytes 4-bit matmuls dequantize the whole weight to the compute
        // dtype for each call (bnb.functional.dequantize_4bit): one layer's worth
        // is in flight at a time. LLM.int8 multiplies in int8 and does not.
        const Bytes dequant = (quant == Quant::NF4 || quant == Quant::Int4)
                                  ? dtype_bytes(prec == Precision::FP32 ? DType::F32 : half, largest_linear)
                                  : Bytes(0);
        // Adapters are kept in fp32 under autocast (PEFT autocast_adapter_dtype).
        const DType tdt = lora ? (amp || prec == Precision::FP32 ? DType::F32 : half) : wdt;
        Bytes adapter_weights;
        if (lora) {
            adapter_weights = dtype_bytes(tdt, trainable_params);
            weights += adapter_weights;
        }
        Bytes grads, master, opt_states;
        DType state_dt = DType::F32;
        if (train) {
            grads = dtype_bytes(tdt, trainable_params);
            if (prec == Precision::FP16 && !lora) {
                // fp16 weights and grads with an fp32 master copy (ZeRO paper's
                // mixed precision, apex O2 / DeepSpeed fp16): 2 + 2 + 4 + optimizer.
                master = dtype_bytes(DType::F32, trainable_params);
                state_dt = DType::F32;
            } else {
                state_dt = (prec == Precision::BF16 && !lora) ? DType::BF16 : (lora ? (tdt == DType::F32 ? DType::F32 : tdt) : DType::F32);
            }
            for (const auto& t : trainable) opt_states += optimizer_bytes(req.optimizer, t, state_dt);
        }

        // ---- activations -------------------------------------------------------
        ActivationContext actx;
        actx.batch = req.batch;
        actx.seq = seq;
        actx.stream = (lora && prec != Precision::FP32) ? (amp ? DType::F32 : half) : stream;
        if (lora && amp) actx.stream = half;  // 16-bit base: the residual stream is 16-bit
        actx.lowered = lowered;
        actx.autocast = amp;
        actx.recompute = req.recompute;
        actx.attention = req.attention;
        actx.train_base = !lora;
        if (lora) {
            actx.lora_targets = req.lora_targets;
            actx.lora_rank = req.lora_rank;
        }
        ActivationResult act;
        if (g.params_only == 0) act = saved_activations(g, actx);
        out.activation_detail = act;

        const std::int64_t cublas_handles = train ? 2 : 1;  // main thread + autograd's backward thread
        const Bytes cublas = out.gpu.cublas_workspace * cublas_handles;

        PerGpu& pg = out.per_gpu;
        pg.weights = weights;
        pg.gradients = grads;
        pg.master_weights = master;
        pg.optimizer_states = opt_states + master;
        pg.cublas_workspace = cublas;
        pg.capacity = capacity;

        const TransformerDims* td = g.transformer ? &*g.transformer : nullptr;
        if (train) {
            pg.activations = act.saved;
            const bool grads_persist = req.grad_accum > 1 || req.zero_grad == ZeroGrad::Zero;
            const Bytes g_acc = grads_persist ? grads : Bytes(0);
            // Loss head: logits -> .float() -> log_softmax (saved); backward
            // materializes fp32 grads of log_softmax's output and input.
            Bytes logits_fp32;
            if (td && act.logits > Bytes(0))
                logits_fp32 = dtype_bytes(DType::F32, checked_mul(checked_mul(req.batch, seq), td->vocab));
            // Custom models: `out = model(x); loss = loss_fn(out); loss.backward()`
            // keeps `out` alive through backward. HF models return logits but the
            // Trainer drops them before backward.
            const Bytes held_output = td ? Bytes(0) : act.loss_input;
            if (!td && held_output > Bytes(0))
                out.assumptions.push_back("training loop keeps the model output (" + format_bytes(held_output) + ") alive through backward");
            const Bytes t_fwd = held_output + max(act.logits + (actx.lowered != DType::F32 ? logits_fp32 : Bytes(0)), dequant) + act.autocast_cache_unsaved;
            const Bytes t_bwd = max(max(logits_fp32 * 2 + (actx.lowered != DType::F32 ? act.logits : Bytes(0)), dequant),
                                    act.backward_grad_pair) +
                                held_output +
                                act.recompute_transient;
            // Optimizer temporaries (torch/optim/adam.py): foreach allocates
            // one state-sized list at once (_foreach_sqrt of exp_avg_sq; Lion's
            // _foreach_sign); the for-loop path two temporaries of one tensor
            // (sqrt, then the division); fused kernels none. bitsandbytes and
            // Adafactor work tensor by tensor (Adafactor: update, grad^2, rms).
            std::int64_t largest_trainable = 0;
            for (const auto& t : trainable) {
                std::int64_t per = 1;
                for (auto d : t.shape) per = checked_mul(per, d);
                largest_trainable = std::max(largest_trainable, per);
            }
            Bytes t_opt;
            const bool adam_like = req.optimizer == Optimizer::Adam || req.optimizer == Optimizer::AdamW || req.optimizer == Optimizer::Lion;
            if (adam_like && req.optimizer_impl == OptimizerImpl::Foreach) t_opt = dtype_bytes(state_dt, trainable_params);
            else if (adam_like && req.optimizer_impl == OptimizerImpl::ForLoop) t_opt = dtype_bytes(state_dt, checked_mul(2, largest_trainable));
            else if (req.optimizer == Optimizer::Adafactor) t_opt = dtype_bytes(DType::F32, checked_mul(3, largest_trainable));
            const Bytes states = weights + pg.optimizer_states;
            const Bytes fwd = states + g_acc + pg.activations + t_fwd;
            const Bytes bwd = states + g_acc + pg.activations + t_bwd;
            const Bytes opt = states + grads + t_opt;
            Bytes peak = fwd;
            pg.peak_phase = "forward";
            pg.transient = t_fwd;
            if (bwd > peak) { peak = bwd; pg.peak_phase = "backward"; pg.transient = t_bwd; }
            if (opt > peak) { peak = opt; pg.peak_phase = "optimizer"; pg.transient = t_opt; }
            pg.peak_allocated = peak + cublas;
            // Rows live at the peak.
            const bool act_live = pg.peak_phase != "optimizer";
            const Bytes grads_live = act_live ? g_acc : grads;
            const Bytes act_live_b = act_live ? pg.activations : Bytes(0);
            out.breakdown.push_back({"weights", "weights", weights - adapter_weights,
                                     lora ? std::string("frozen base, ") + std::string(dtype_name(wdt)) + (quant != Quant::None ? std::string(", ") + to_string(quant) + " linear weights" : "")
                                          : std::string(dtype_name(wdt)) + " parameters"});
            if (lora) out.breakdown.push_back({"adapter_weights", "LoRA adapters", adapter_weights, std::to_string(trainable_params) + " params, " + std::string(dtype_name(tdt))});
            out.breakdown.push_back({"master_weights", "fp32 master weights", master, master > Bytes(0) ? "fp16 training keeps an fp32 copy" : "none"});
            out.breakdown.push_back({"gradients", "gradients", grads_live,
                                     std::string(dtype_name(tdt)) + (grads_live == grads ? "" : ", freed before this phase (set_to_none)") +
                                         (req.grad_accum > 1 ? ", kept across micro-batches" : (grads_persist ? ", kept (zero_grad without set_to_none)" : ""))});
            out.breakdown.push_back({"optimizer_states", "optimizer states", opt_states,
                                     std::string(to_string(req.optimizer)) + ", " + std::string(dtype_name(state_dt))});
            out.breakdown.push_back({"activations", "activations (saved for backward)", act_live_b - (act_live ? act.autocast_weight_casts + act.lora_adapters : Bytes(0)),
                                     act_live ? "b=" + std::to_string(req.batch) + (g.has_sequence ? " s=" + std::to_string(seq) : std::string()) + ", " + to_string(req.recompute) + " recompute" + (td ? std::string(", ") + to_string(req.attention) + " attention" : std::string()) : "freed before the optimizer step"});
            if (act.autocast_weight_casts > Bytes(0))
                out.breakdown.push_back({"autocast_weight_casts", "autocast 16-bit weight copies", act_live ? act.autocast_weight_casts : Bytes(0), "saved by matmuls for backward"});
            if (lora) out.breakdown.push_back({"lora_activations", "LoRA adapter activations", act_live ? act.lora_adapters : Bytes(0), "inputs and rank-r outputs of adapters"});
            out.breakdown.push_back({"transient", "temporaries at the peak", pg.transient, "phase: " + pg.peak_phase});
        } else {
            // Inference: weights + KV cache + transient activations of prefill.
            const std::int64_t total_len = checked_add(seq, req.gen_len);
            const DType kvdt = req.kv_dtype.value_or(lowered);
            Bytes kv;
            Bytes prefill;
            if (td) {
                kv = dtype_bytes(kvdt, checked_mul(checked_mul(td->kv_elements_per_token, req.batch), total_len));
                const std::int64_t bs = checked_mul(req.batch, seq);
                Bytes attn_tmp;
                if (req.attention == Attention::Eager) {
                    // scores (lowered) + fp32 softmax + cast back, per layer, freed after it
                    attn_tmp = Bytes(checked_mul(checked_mul(checked_mul(bs, seq), td->heads),
                                                 2 * dtype_bits(lowered) / 8 + 4));
                }
                const Bytes mlp_tmp = dtype_bytes(lowered, checked_mul(checked_mul(bs, std::max<std::int64_t>(td->intermediate, 1)),
                                                                        td->experts > 0 ? 3 * std::max<std::int64_t>(td->experts_per_token, 1) : 3));
                const Bytes hidden = dtype_bytes(lowered, checked_mul(bs, td->hidden)) * 4;
                // Generation computes logits for the last position only (logits_to_keep=1), upcast to fp32.
                const Bytes logits = dtype_bytes(lowered, checked_mul(req.batch, td->vocab)) +
                                     dtype_bytes(DType::F32, checked_mul(req.batch, td->vocab));
                prefill = hidden + max(max(attn_tmp, mlp_tmp), dequant) + logits;
                out.assumptions.push_back("KV cache: " + std::to_string(td->kv_elements_per_token) + " elements per token (all layers), " +
                                          std::string(dtype_name(kvdt)) + ", prompt " + std::to_string(seq) + " + " + std::to_string(req.gen_len) + " generated");
            } else if (g.params_only == 0) {
                Bytes ws;
                for (const auto& b : act.blocks) ws = max(ws, b.working_set);
                prefill = ws;
            }
            pg.kv_cache = kv;
            pg.transient = prefill;
            pg.peak_phase = req.gen_len > 0 ? "decode" : "prefill";
            pg.peak_allocated = weights + kv + prefill + cublas;
            out.breakdown.push_back({"weights", "weights", weights,
                                     std::string(dtype_name(wdt)) + (quant != Quant::None ? std::string(", ") + to_string(quant) + " linear weights" : "")});
            out.breakdown.push_back({"kv_cache", "KV cache", kv, "batch " + std::to_string(req.batch) + ", " + std::to_string(total_len) + " tokens"});
            out.breakdown.push_back({"transient", "activations in flight", prefill, "prefill working set and last-token logits"});
        }
        out.breakdown.push_back({"cublas_workspace", "cuBLAS workspaces", cublas,
                                 std::to_string(cublas_handles) + " x " + format_bytes(out.gpu.cublas_workspace)});

        // Caching allocator: blocks freed earlier stay reserved and a new
        // request that fits no cached block gets a fresh segment. The analytic
        // path keeps one largest-tensor-sized block cached (rounded to the 2 MiB
        // segment granularity); fragmentation beyond that needs the step
        // simulator (issue 3).
        const Bytes overhead = act.largest_tensor.round_up(MiB(2).count());
        pg.allocator_overhead = overhead;
        pg.peak_reserved = pg.peak_allocated + overhead;
        pg.cuda_context = req.cuda_context.value_or(out.gpu.cuda_context);
        pg.total_device = pg.peak_reserved + pg.cuda_context;
        pg.fits = pg.total_device <= capacity;
        out.breakdown.push_back({"allocator_overhead", "allocator cache (reserved - allocated)", overhead, "one largest-tensor block kept cached, 2 MiB segments"});
        out.breakdown.push_back({"cuda_context", "CUDA context (outside PyTorch)", pg.cuda_context,
                                 req.cuda_context ? "--cuda-context" : "default for " + out.gpu.name + " with lazy module loading"});
        // Invariant: rows sum to the total.
        Bytes sum;
        for (const auto& r : out.breakdown) sum += r.bytes;
        if (sum != pg.total_device) {
            out.breakdown.push_back({"unattributed", "unattributed", pg.total_device - sum, "rounding of the peak phase"});
        }

        out.assumptions.push_back(std::string("precision ") + to_string(prec) + ": weights " + std::string(dtype_name(wdt)) +
                                  ", activations " + std::string(dtype_name(actx.stream)) + "/" + std::string(dtype_name(lowered)));
        if (train) {
            out.assumptions.push_back(std::string("optimizer ") + to_string(req.optimizer) + " (" + to_string(req.optimizer_impl) + " implementation), states " + std::string(dtype_name(state_dt)));
            out.assumptions.push_back(req.zero_grad == ZeroGrad::SetToNone ? "zero_grad(set_to_none=True): gradients exist from backward to the optimizer step"
                                                                           : "zero_grad(set_to_none=False): gradients stay allocated between steps");
        }
        if (td) out.assumptions.push_back(std::string("attention ") + to_string(req.attention) + (req.attention == Attention::Flash ? " (SDPA/flash: no s^2 scores kept)" : " (scores and softmax kept)"));
        out.assumptions.push_back("CUDA context " + format_bytes(pg.cuda_context) + " (nvidia-smi minus reserved; override with --cuda-context)");
        out.request = req;
        return out;
    });
}

Result<EstimateResult> estimate(const EstimateRequest& req) {
    if (req.params_count) {
        if (*req.params_count <= 0)
            return Error{ErrorCode::InvalidArgument, "--params must be positive", "params"};
        auto g = params_only_graph(*req.params_count);
        return estimate(g, req);
    }
    if (req.model.empty())
        return Error{ErrorCode::InvalidArgument, "no model given: name a preset (gpumem models), a config.json, a model folder, a layer-list JSON, or use --params", "model"};
    auto g = load_model(req.model);
    if (!g) return g.error();
    return estimate(g.value(), req);
}

}  // namespace gpumem
