#include "gpumem/memory/estimate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "gpumem/memory/job.hpp"
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


Result<EstimateResult> estimate(const ModelGraph& g, const EstimateRequest& req_in) {
    auto resolved = resolve_job(g, req_in);
    if (!resolved) return resolved.error();
    return capture([&]() -> EstimateResult {
        const Job& job = resolved.value();
        EstimateResult out;
        EstimateRequest req = job.req;
        out.gpu = job.gpu;
        out.seq = job.seq;
        out.assumptions = job.assumptions;
        out.warnings = job.warnings;
        out.model_name = g.name;
        out.model_source = g.source;
        out.family = g.family;
        out.params = summarize_params(g);
        out.trainable_params = job.trainable_params;
        const bool train = job.train;
        const bool lora = job.lora;
        const Precision prec = job.prec;
        const DType lowered = job.lowered;
        const DType wdt = job.wdt;
        const DType tdt = job.tdt;
        const DType state_dt = job.state_dt;
        const Quant quant = job.quant;
        const std::int64_t seq = job.seq;
        const Bytes capacity = job.capacity;
        const ActivationContext& actx = job.actx;
        const std::vector<TrainTensor>& trainable = job.trainable;
        const std::int64_t trainable_params = job.trainable_params;
        const Bytes weights = job.weights;
        const Bytes adapter_weights = job.adapter_weights;
        const Bytes grads = job.grads;
        const Bytes master = job.master;
        const Bytes opt_states = job.opt_states;
        const Bytes dequant = job.dequant;
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
        pg.cuda_context = req.cuda_context.value_or(req.cuda_lazy_loading ? out.gpu.cuda_context : out.gpu.cuda_context_eager);
        pg.total_device = pg.peak_reserved + pg.cuda_context;
        pg.fits = pg.total_device <= capacity;
        out.breakdown.push_back({"allocator_overhead", "allocator cache (reserved - allocated)", overhead, "one largest-tensor block kept cached, 2 MiB segments"});
        out.breakdown.push_back({"cuda_context", "CUDA context (outside PyTorch)", pg.cuda_context,
                                 req.cuda_context ? "--cuda-context"
                                                  : "default for " + out.gpu.name + (req.cuda_lazy_loading ? " with lazy module loading" : " with eager module loading")});
        if (!job.layout.cfg.trivial()) {
            // Distributed: the most loaded GPU replaces the single-GPU parts.
            ParallelResult par = parallel_memory(g, job, job.layout, pg.transient);
            const StageMemory& m = par.stages[static_cast<std::size_t>(par.most_loaded)];
            pg.weights = m.weights;
            pg.gradients = m.gradients;
            pg.optimizer_states = m.optimizer_states;
            pg.master_weights = job.master > Bytes(0) && m.optimizer_states > Bytes(0)
                                    ? Bytes(static_cast<std::int64_t>(static_cast<double>(m.optimizer_states.count()) *
                                                                      static_cast<double>(job.master.count()) /
                                                                      static_cast<double>((job.opt_states + job.master).count())))
                                    : Bytes(0);
            pg.activations = m.activations;
            pg.transient = m.transient;
            pg.peak_allocated = m.allocated + cublas;
            pg.allocator_overhead = act.largest_tensor.ceil_div(job.layout.cfg.tp).round_up(MiB(2).count());
            pg.peak_reserved = pg.peak_allocated + pg.allocator_overhead;
            pg.total_device = pg.peak_reserved + pg.cuda_context + par.nccl_outside;
            pg.fits = pg.total_device <= capacity;
            pg.peak_phase = "stage " + std::to_string(m.stage) + " (" + m.contents + ")";
            const std::string where = "pipeline stage " + std::to_string(m.stage) + " (" + m.contents + ")";
            out.breakdown = {
                {"weights", "weights", m.weights, where + (job.layout.cfg.offload_params != Offload::None ? ", offloaded" : "")},
                {"gradients", "gradients", m.gradients, job.layout.shard > 1 && (job.layout.cfg.zero >= 2 || job.layout.cfg.fsdp != Fsdp::None) ? "sharded over " + std::to_string(job.layout.shard) + " ranks" : "full copy per rank"},
                {"optimizer_states", "optimizer states (incl. master weights)", m.optimizer_states, job.layout.cfg.offload_optimizer != Offload::None ? "offloaded" : "sharded over " + std::to_string(job.layout.cfg.zero >= 1 || job.layout.cfg.fsdp != Fsdp::None || job.layout.cfg.distributed_optimizer ? job.layout.shard : 1) + " ranks"},
                {"activations", "activations (micro-batches in flight)", m.activations, std::to_string(m.in_flight) + " micro-batch(es) in flight"},
                {"gathered_params", "gathered parameters (ZeRO-3 / FSDP)", m.gathered_params, "unsharded layers in flight"},
                {"comm_buffers", "communication buffers", m.comm_buffers, "DDP/ZeRO buckets, reduce-scatter, pipeline send/recv"},
                {"transient", "temporaries", m.transient, "loss head / activation gradients"},
                {"cublas_workspace", "cuBLAS workspaces", cublas, std::to_string(cublas_handles) + " x " + format_bytes(out.gpu.cublas_workspace)},
                {"allocator_overhead", "allocator cache (reserved - allocated)", pg.allocator_overhead, "one largest-tensor block"},
                {"cuda_context", "CUDA context (outside PyTorch)", pg.cuda_context, "per GPU"},
                {"nccl", "NCCL buffers (outside PyTorch)", par.nccl_outside, format_bytes(job.layout.cfg.nccl_per_communicator) + " per communicator"},
            };
            out.assumptions.insert(out.assumptions.end(), par.notes.begin(), par.notes.end());
            out.parallel = std::move(par);
        }
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
