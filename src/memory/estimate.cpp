#include "gpumem/memory/estimate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "gpumem/memory/features.hpp"
#include "gpumem/memory/fp8.hpp"
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
    constexpr std::size_t kDTypes = static_cast<std::size_t>(DType::Int4) + 1;
    std::array<std::int64_t, kDTypes> dt{};
    std::array<bool, kDTypes> seen{};
    for (const auto& b : g.blocks)
        for (const auto& p : b.params) {
            const std::int64_t n = checked_mul(b.repeat, p.numel());
            auto& c = comp[static_cast<std::size_t>(p.component)];
            c = checked_add(c, n);
            const auto k = static_cast<std::size_t>(p.dtype);
            dt[k] = checked_add(dt[k], n);
            seen[k] = true;
        }
    s.by_component.reserve(kComponentCount);
    s.by_dtype.reserve(kDTypes);
    for (int i = 0; i < kComponentCount; ++i)
        if (comp[static_cast<std::size_t>(i)] != 0)
            s.by_component.emplace_back(component_name(static_cast<Component>(i)), comp[static_cast<std::size_t>(i)]);
    for (std::size_t k = 0; k < kDTypes; ++k)
        if (seen[k]) s.by_dtype.emplace_back(std::string(dtype_name(static_cast<DType>(k))), dt[k]);
    std::sort(s.by_dtype.begin(), s.by_dtype.end());  // by the dtypes' names (names are unique)
    return s;
}


namespace {

// Transformer Engine's cached FP8 weight copies (memory/fp8.hpp).
BreakdownRow fp8_weights_row(const Job& job, const StageMemory& m) {
    const Fp8Recipe r = job.req.fp8_recipe;
    std::string how = r == Fp8Recipe::MXFP8 || r == Fp8Recipe::NVFP4
                          ? std::string(r == Fp8Recipe::NVFP4 ? "FP4" : "MXFP8") + " row- and column-wise copies of every linear weight with block scales"
                      : te_needs_transpose(job.gpu.compute_capability) ? "FP8 copy and transpose of every linear weight (" + job.gpu.name + ")"
                                                                         : "one FP8 copy of every linear weight (" + job.gpu.name + ": no transpose)";
    if (r == Fp8Recipe::Delayed) how += ", amax history " + std::to_string(te_amax_history(job)) + " x 5 fp32 per GEMM";
    return {"fp8_weight_copies", "FP8 weight copies and scaling state", m.fp8_weights, how + ", kept across micro-batches (Transformer Engine)"};
}

}  // namespace

Result<EstimateResult> analytic_estimate(const ModelGraph& g, const EstimateRequest& req_in) {
    auto resolved = resolve_job(g, req_in);
    if (!resolved) return resolved.error();
    return capture([&]() -> EstimateResult {
        EstimateResult out;
        Job resolved_job = std::move(resolved).value();
        // (Moved, not copied: nothing reads the job's own.)
        out.assumptions = std::exchange(resolved_job.assumptions, {});
        out.warnings = std::exchange(resolved_job.warnings, {});
        out.job = std::make_shared<const Job>(std::move(resolved_job));
        const Job& job = *out.job;
        const EstimateRequest& req = job.req;
        out.model_name = g.name;
        out.model_source = g.source;
        out.family = g.family;
        const ModelGraph& jg = job_graph(g, job);  // (the job's rewrites applied)
        out.params = summarize_params(jg);
        const bool train = job.train;
        ActivationMemo memo;  // the block walks, shared with the pipeline chunks below
        if (g.params_only == 0) out.activation_detail = saved_activations(jg, job.actx, nullptr, false, &memo);
        const ActivationResult& act = out.activation_detail;

        const std::int64_t cublas_handles = train ? 2 : 1;  // main thread + autograd's backward thread
        const Bytes cublas = job.gpu.cublas_workspace * cublas_handles;

        // Every job is a layout: one GPU is one stage of one rank. The rank with
        // the largest peak is the answer.
        ParallelResult par = parallel_memory(g, job, g.params_only == 0 ? &act : nullptr, &memo);
        const StageMemory& m = par.stages[static_cast<std::size_t>(par.most_loaded)];
        const bool dist = !job.layout.cfg.trivial();

        PerGpu& pg = out.per_gpu;
        pg.weights = m.weights;
        pg.gradients = m.gradients;
        pg.master_weights = m.master_weights;
        pg.optimizer_states = m.optimizer_states;
        pg.activations = m.activations;
        pg.kv_cache = m.kv_cache;
        pg.transient = m.transient;
        pg.cublas_workspace = cublas;
        pg.capacity = job.capacity;
        pg.peak_allocated = m.allocated + cublas;
        pg.peak_phase = dist ? "stage " + std::to_string(m.stage) + " (" + m.contents + "), " + m.peak_phase : m.peak_phase;
        // Caching allocator: blocks freed earlier stay reserved and a new request
        // that fits no cached block gets a fresh segment. The analytic path keeps
        // one largest-tensor-sized block cached (rounded to the 2 MiB segment
        // granularity); fragmentation beyond that is the step simulator's.
        // The largest tensor the step frees:
        // - training: the largest the forward or backward makes (memory/activations.hpp);
        // - inference: the prompt runs through the layers without autograd and
        //   the output layer on its last position only (generate's
        //   logits_to_keep=1, as the simulator's prefill, sim/step_inference.cpp):
        //   a layer's largest tensor or one position's fp32 logits, not
        //   training's whole-sequence logits (counted, they made the analytic
        //   reserved of 8k-token prompts 2-10x the simulated on the test grid);
        // - ZeRO-3 / FSDP: also a unit's gathered parameters, one block gathered
        //   and freed at each use (the root unit's, a tied 128k-token embedding,
        //   outweighs every activation of a short sequence). A unit is gathered
        //   while activations are made, so its block and the largest
        //   activation's are two blocks, both cached (one block for both, the
        //   larger: the sharded test grid's device totals within 5% of the
        //   simulated ones 56.5%, 56.6% and 61.1% of the jobs at
        //   GPUMEM_GRID_SEED default, 12 and 29; with both 57.5%, 56.5%, 62.9%).
        //   FSDP's root unit, held through the step (memory/parallel.hpp
        //   fsdp_holds_root), is not among them.
        // (Inference: the prompt's pieces, also the breakdown's rows below.)
        const InferencePieces ip = train ? InferencePieces{} : inference_pieces(g, job);
        Bytes act_largest = act.largest_tensor;
        // (A parameters-only model has no block walk: its largest stays 0.)
        if (!train && jg.transformer && act.blocks.size() == jg.blocks.size() && !jg.blocks.empty()) {
            act_largest = ip.logits_fp32;
            for (std::size_t i = 0; i + 1 < act.blocks.size(); ++i) act_largest = max(act_largest, act.blocks[i].largest_tensor);
        }
        const Bytes largest = dist ? act_largest.ceil_div(std::max<std::int64_t>(1, job.layout.cfg.tp) * std::max<std::int64_t>(1, job.layout.cfg.cp))
                                   : act_largest;
        pg.allocator_overhead = (largest + m.largest_gathered).round_up(MiB(2).count());
        pg.peak_reserved = pg.peak_allocated + pg.allocator_overhead;
        bool lazy_states_rule = false;
        // Optimizer states created by the first step (torch.optim, TE / apex
        // FusedAdam; DeepSpeed ZeRO allocates them at initialisation): when a
        // state tensor is larger than any block the first step's activations
        // left cached, the states and the step's temporaries take fresh
        // segments on top of what the first forward/backward reserved.
        // (With CUDA graphs the activations' blocks are the graph pool's, which no
        // eager allocation reuses anyway: the pool rule below replaces this one.)
        const bool graphs = train && job.framework.cuda_graphs != CudaGraphs::None;
        if (train && !graphs && !job.lora && job.layout.cfg.zero == 0 && job.layout.cfg.offload_optimizer == Offload::None && !job.trainable.empty()) {
            const Bytes lazy = m.optimizer_states - m.master_weights;
            std::int64_t tensors = 0;
            for (const auto& t : job.trainable) tensors = checked_add(tensors, t.count);
            const std::int64_t per_rank = std::max<std::int64_t>(1, tensors / std::max<std::int64_t>(1, job.layout.cfg.pp));
            const Bytes typical_state = lazy.ceil_div(per_rank * (job.req.optimizer == Optimizer::Adam || job.req.optimizer == Optimizer::AdamW ? 2 : 1));
            const Bytes held = m.weights + m.optimizer_states + m.fp8_weights + m.comm_buffers + m.gradients;
            const Bytes step_temps = m.optimizer_peak > held ? m.optimizer_peak - held : Bytes(0);
            if (lazy > Bytes(0) && typical_state > largest) {
                const Bytes lazy_reserved = m.forward_backward_peak + step_temps + cublas;
                if (lazy_reserved > pg.peak_reserved) {
                    pg.allocator_overhead = lazy_reserved - pg.peak_allocated;
                    pg.peak_reserved = lazy_reserved;
                    lazy_states_rule = true;
                }
            }
        }
        // CUDA graphs (memory/framework.hpp): the graph pool's segments no tensor
        // uses at the peak, and the general pool's own peak elsewhere.
        Bytes graph_idle;
        if (graphs) {
            graph_idle = m.graph_pool_idle;
            // torch.compile's graphs hold every activation: no activation block
            // is cached in the general pool (the rule above is the pool's).
            if (job.framework.cuda_graphs == CudaGraphs::Compile) pg.allocator_overhead = Bytes(0);
            pg.allocator_overhead += m.graph_general_extra;
            pg.peak_reserved = pg.peak_allocated + pg.allocator_overhead + graph_idle;
            pg.allocator_overhead += graph_idle;  // reserved - allocated; the pool's part has its own row
        }
        pg.cuda_context = req.cuda_context.value_or(req.cuda_lazy_loading ? job.gpu.cuda_context : job.gpu.cuda_context_eager);
        pg.total_device = pg.peak_reserved + pg.cuda_context + par.nccl_outside;
        pg.fits = pg.total_device <= job.capacity;

        const bool opt_phase = m.peak_phase == "optimizer";
        const Bytes grads_live = m.gradients_at_peak;
        const Bytes act_live = opt_phase ? Bytes(0) : m.activations_at_peak;
        const std::string where = dist ? "pipeline stage " + std::to_string(m.stage) + " (" + m.contents + ")" : std::string();
        // Room for the rows below at once (11-17 of them; growing moved every
        // row's strings 4 times, 2% of a 70B estimate).
        out.breakdown.reserve(24);
        if (train && !dist) {
            const bool lora = job.lora;
            const Bytes adapters = lora ? job.adapter_weights : Bytes(0);
            out.breakdown.push_back({"weights", "weights", m.weights - adapters,
                                     lora ? std::string("frozen base, ") + std::string(dtype_name(job.wdt)) +
                                                (job.quant != Quant::None ? std::string(", ") + to_string(job.quant) + " linear weights" : "")
                                          : std::string(dtype_name(job.wdt)) + " parameters"});
            if (lora)
                out.breakdown.push_back({"adapter_weights", "LoRA adapters", adapters,
                                         std::to_string(job.trainable_params) + " params, " + std::string(dtype_name(job.tdt))});
            out.breakdown.push_back({"master_weights", "fp32 master weights", m.master_weights,
                                     m.master_weights > Bytes(0) ? "fp16 training keeps an fp32 copy" : "none"});
            out.breakdown.push_back({"gradients", "gradients", grads_live,
                                     std::string(dtype_name(job.tdt)) +
                                         (in_backward_optimizer(job) ? ", each freed in its hook (optimizer in backward)"
                                          : opt_phase ? ""
                                                      : (m.gradients_kept ? ", kept across micro-batches / between steps" : ", none yet at this phase"))});
            out.breakdown.push_back({"optimizer_states", "optimizer states", m.optimizer_states - m.master_weights,
                                     std::string(to_string(req.optimizer)) + ", " + std::string(dtype_name(job.state_dt))});
            if (m.fp8_weights > Bytes(0)) out.breakdown.push_back(fp8_weights_row(job, m));
            // The activations alive at the peak in three rows: autocast's
            // weight casts, then the adapters' outputs, each at most what is
            // left of act_live, then the rest. At a peak with fewer activations
            // alive than the casts and adapters hold (the end of backward) the
            // remainder is in the temporaries.
            const Bytes casts_row = std::min(act_live, opt_phase ? Bytes(0) : act.autocast_weight_casts);
            const Bytes lora_row = std::min(act_live - casts_row, opt_phase || !lora ? Bytes(0) : act.lora_adapters);
            out.breakdown.push_back({"activations", "activations (saved for backward)", act_live - casts_row - lora_row,
                                     !opt_phase ? "b=" + std::to_string(req.batch) + (g.has_sequence ? " s=" + std::to_string(job.seq) : std::string()) + ", " +
                                                      to_string(req.recompute) + " recompute" +
                                                      (g.transformer ? std::string(", ") + to_string(req.attention) + " attention" : std::string())
                                                : "freed before the optimizer step"});
            if (act.autocast_weight_casts > Bytes(0))
                out.breakdown.push_back({"autocast_weight_casts", "autocast 16-bit weight copies", casts_row, "saved by matmuls for backward"});
            if (lora) out.breakdown.push_back({"lora_activations", "LoRA adapter activations", lora_row, "rank-r outputs of the adapters (their inputs, casts, dropped copies and masks are counted as activations)"});
            out.breakdown.push_back({"transient", "temporaries at the peak", m.transient, "phase: " + m.peak_phase});
            out.breakdown.push_back({"allocator_rounding", "allocator rounding", m.rounding, "blocks of the weights, gradients and states beyond their bytes"});
        } else if (train) {
            const ParallelConfig& c = job.layout.cfg;
            // Rows moved in, not copied out of an initializer list (its strings
            // were a dozen heap allocations per estimate of a planner's search).
            out.breakdown.push_back({"weights", "weights", m.weights, where + (c.offload_params != Offload::None ? ", offloaded" : "")});
            out.breakdown.push_back({"gradients", "gradients", grads_live,
                 (job.layout.shard > 1 && (c.zero >= 2 || c.fsdp != Fsdp::None) ? "sharded over " + std::to_string(job.layout.shard) + " ranks" : "full copy per rank") +
                     std::string(opt_phase ? "" : (m.gradients_kept ? ", kept across micro-batches" : ", none yet at this phase"))});
            out.breakdown.push_back({"optimizer_states", "optimizer states (incl. master weights)", m.optimizer_states,
                 c.offload_optimizer != Offload::None ? "offloaded"
                                                      : "sharded over " + std::to_string(c.zero >= 1 || c.fsdp != Fsdp::None || c.distributed_optimizer ? job.layout.shard : 1) + " ranks"});
            out.breakdown.push_back({"activations", "activations (micro-batches in flight)", act_live,
                 opt_phase ? "freed before the optimizer step"
                           : std::to_string(m.in_flight) + (job.layout.vpp > 1 ? " model chunk(s)" : " micro-batch(es)") + " in flight"});
            out.breakdown.push_back({"gathered_params", "gathered parameters (ZeRO-3 / FSDP)", opt_phase ? Bytes(0) : m.gathered_params, "unsharded layers in flight"});
            out.breakdown.push_back({"comm_buffers", "communication buffers", m.comm_buffers, "DDP/ZeRO gradient buckets"});
            out.breakdown.push_back({"transient", "temporaries", m.transient, "phase: " + m.peak_phase});
            out.breakdown.push_back({"allocator_rounding", "allocator rounding", m.rounding, "blocks of the weights, gradients and states beyond their bytes"});
            if (m.fp8_weights > Bytes(0)) out.breakdown.insert(out.breakdown.begin() + 3, fp8_weights_row(job, m));
        } else {
            out.breakdown.push_back({"weights", "weights", m.weights,
                                     (dist ? where + ", " : std::string()) + std::string(dtype_name(job.wdt)) +
                                         (job.quant != Quant::None ? std::string(", ") + to_string(job.quant) + " linear weights" : "")});
            out.breakdown.push_back({"kv_cache", "KV cache", m.kv_cache,
                                     "batch " + std::to_string(req.batch) + ", " + std::to_string(ip.total_len) + " tokens" +
                                         (dist && job.layout.cfg.tp > 1 ? ", this rank's key/value heads" : "")});
            out.breakdown.push_back({"transient", "activations in flight", m.transient, "prefill working set and last-token logits"});
            out.breakdown.push_back({"allocator_rounding", "allocator rounding", m.rounding, "blocks of the weights beyond their bytes"});
            if (g.transformer) {
                const TransformerDims& td = *g.transformer;
                const std::int64_t lin = td.layers - td.kv_layers();
                out.assumptions.push_back("KV cache: " + std::to_string(td.kv_elements_per_token) + " elements per token (" +
                                          (lin > 0 ? "the " + std::to_string(td.kv_layers()) + " attention layers" : std::string("all layers")) + "), " +
                                          std::string(dtype_name(ip.kv_dtype)) + ", prompt " + std::to_string(job.seq) + " + " +
                                          std::to_string(req.gen_len) + " generated");
                if (lin > 0)
                    out.assumptions.push_back("linear-attention state: " + std::to_string(lin) + " layers x " +
                                              format_bytes(td.hf_linear_state_bytes(1, 1, ip.kv_dtype)) +
                                              " per sequence (convolution state in the cache dtype, recurrent state in fp32), made by the prefill");
            }
        }
        out.breakdown.push_back({"cublas_workspace", "cuBLAS workspaces", cublas,
                                 std::to_string(cublas_handles) + " x " + format_bytes(job.gpu.cublas_workspace)});
        if (graphs)
            out.breakdown.push_back({"cuda_graph_pool", "CUDA graph pool (reserved, unused at the peak)", graph_idle,
                                     "private pool of " + format_bytes(m.graph_pool) + " (" +
                                         (job.framework.cuda_graphs == CudaGraphs::Compile ? "torch.compile reduce-overhead: forward, backward and gradients"
                                                                                           : "Megatron per-layer graphs: the layers' activations and temporaries") +
                                         ") that eager allocations cannot use"});
        out.breakdown.push_back({"allocator_overhead", "allocator cache (reserved - allocated)", pg.allocator_overhead - graph_idle,
                                 lazy_states_rule ? "optimizer states created at the first step take new segments on top of the activations' cached blocks"
                                 : graphs && job.framework.cuda_graphs == CudaGraphs::Compile
                                     ? "the general pool's own peak (" + format_bytes(m.graph_general_extra) +
                                           " more: the eager optimizer step) falls where the graph pool is not at its peak; no activation is cached outside the pool"
                                 : graphs && m.graph_general_extra > Bytes(0)
                                     ? "one largest-tensor block kept cached, 2 MiB segments; the general pool's own peak (" +
                                           format_bytes(m.graph_general_extra) + " more) falls where the graph pool is not at its peak"
                                     : "one largest-tensor block kept cached, 2 MiB segments; fragmentation beyond it is the step simulation's (run without --analytic)"});
        out.breakdown.push_back({"cuda_context", "CUDA context (outside PyTorch)", pg.cuda_context,
                                 req.cuda_context ? "--cuda-context"
                                                  : "default for " + job.gpu.name + (req.cuda_lazy_loading ? " with lazy module loading" : " with eager module loading")});
        if (dist)
            out.breakdown.push_back({"nccl", "NCCL buffers (outside PyTorch)", par.nccl_outside,
                                     format_bytes(job.layout.cfg.nccl_per_communicator) + " per communicator"});
        // Invariant: rows sum to the total.
        Bytes sum;
        for (const auto& r : out.breakdown) sum += r.bytes;
        if (sum != pg.total_device) out.breakdown.push_back({"unattributed", "unattributed", pg.total_device - sum, "rounding of the peak phase"});
        // Outside the step's allocator peak: paged optimizer states, the load phase.
        finish_outside_allocator(out, g, par, m);

        if (dist) out.assumptions.insert(out.assumptions.end(), par.notes.begin(), par.notes.end());
        out.assumptions.push_back(std::string("precision ") + to_string(job.prec) + ": weights " + std::string(dtype_name(job.wdt)) +
                                  ", activations " + std::string(dtype_name(job.actx.stream)) + "/" + std::string(dtype_name(job.lowered)));
        if (train) {
            out.assumptions.push_back(std::string("optimizer ") + to_string(req.optimizer) + " (" + to_string(job.opt_impl) + " implementation), states " +
                                      std::string(dtype_name(job.state_dt)));
            out.assumptions.push_back(in_backward_optimizer(job)
                                          ? "optimizer in backward (torchtune optimizer_in_bwd): each parameter stepped in its post-accumulate-grad "
                                            "hook and its gradient freed there; no full set of gradients, optimizer.step() empty"
                                      : req.zero_grad == ZeroGrad::SetToNone ? "zero_grad(set_to_none=True): gradients exist from backward to the optimizer step"
                                                                             : "zero_grad(set_to_none=False): gradients stay allocated between steps");
        }
        if (g.transformer)
            out.assumptions.push_back(std::string("attention ") + to_string(req.attention) +
                                      (req.attention == Attention::Flash ? " (SDPA/flash: no s^2 scores kept)" : " (scores and softmax kept)"));
        out.assumptions.push_back("CUDA context " + format_bytes(pg.cuda_context) + " (nvidia-smi minus reserved; override with --cuda-context)");
        if (!g.transformer && !g.loss_in_forward && g.params_only == 0 && train && act.loss_input > Bytes(0))
            out.assumptions.push_back("training loop keeps the model output (" + format_bytes(act.loss_input) + ") alive through backward");
        if (dist) out.parallel = std::move(par);
        return out;
    });
}

Result<std::shared_ptr<const Job>> estimate_job(const ModelGraph& g, const EstimateResult* est, const EstimateRequest& req) {
    if (est && est->job) return est->job;
    auto job = resolve_job(g, req);
    if (!job) return job.error();
    return std::make_shared<const Job>(std::move(job).value());
}

Result<EstimateResult> estimate(const ModelGraph& g, const EstimateRequest& req) {
    auto r = analytic_estimate(g, req);
    if (!r) return r;
    return capture([&]() -> EstimateResult {
        EstimateResult out = std::move(r).value();
        finish_estimate(out);
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
    auto g = load_model_shared(req.model, model_options(req));
    if (!g) return g.error();
    return estimate(*g.value(), req);
}

}  // namespace gpumem
