// Optimizer and loading options shared by the analytic path and the step
// simulation (gpumem/memory/features.hpp): validation, the per-tensor update
// of an optimizer run inside backward, FSDP1's flat-parameter gradients under
// LoRA, the load phase, and the rows an estimate gets outside the allocator.
#include "gpumem/memory/features.hpp"

#include <algorithm>

#include "gpumem/memory/estimate.hpp"

namespace gpumem {

namespace {

[[noreturn]] void bad(const char* field, const std::string& msg) { fail(ErrorCode::InvalidArgument, field, msg); }

bool quantizable(const Param& p) { return p.linear_weight && !p.output_head && p.module != "lm_head" && p.shape.size() == 2; }

}  // namespace

void validate_features(const EstimateRequest& req, bool train, std::vector<std::string>& warnings) {
    const ParallelConfig& c = req.parallel;
    if (c.fsdp_version != 1 && c.fsdp_version != 2)
        bad("fsdp-version", "--fsdp-version must be 1 (FullyShardedDataParallel) or 2 (fully_shard) (got " + std::to_string(c.fsdp_version) + ")");
    if (!train) return;
    if (c.fsdp == Fsdp::None && c.fsdp_version != 2) warnings.push_back("--fsdp-version applies to --fsdp: ignored without it");
    if (c.no_sync) {
        if (c.fsdp == Fsdp::None)
            bad("no-sync", "--no-sync skips FSDP's reduce-scatter between micro-batches: it needs --fsdp (DDP keeps full gradients "
                           "anyway, and DeepSpeed ZeRO has no no_sync)");
        if (req.grad_accum == 1)
            warnings.push_back("--no-sync has no effect with --grad-accum 1: the step's only micro-batch reduce-scatters its gradients");
        if (req.zero_grad == ZeroGrad::Zero)
            bad("no-sync", "--no-sync with --zero-grad zero (sharded gradients kept between steps beside the unsharded ones) is not "
                           "modelled: use --zero-grad set-to-none");
    }
    if (req.optimizer_in_backward) {
        // torchtune (pytorch/torchtune bd2a0fc7c314) rejects gradient accumulation
        // with the optimizer in backward: recipes/full_finetune_single_device.py
        // L157-160 and recipes/full_finetune_distributed.py L228-232 raise
        // "Gradient accumulation is not supported with optimizer_in_bwd".
        if (req.grad_accum > 1)
            bad("optimizer-in-backward",
                "--optimizer-in-backward steps each parameter as soon as its gradient is accumulated, so gradients cannot "
                "accumulate over micro-batches (torchtune rejects gradient_accumulation_steps > 1 with optimizer_in_bwd): use "
                "--grad-accum 1 (got --grad-accum " + std::to_string(req.grad_accum) + ") or drop --optimizer-in-backward");
        if (c.pp > 1)
            bad("optimizer-in-backward", "--optimizer-in-backward with --pp " + std::to_string(c.pp) +
                                             ": pipeline schedules accumulate gradients over micro-batches; use --pp 1");
        if (c.zero > 0 || c.distributed_optimizer)
            bad("optimizer-in-backward", std::string("--optimizer-in-backward runs torch.optim per parameter in autograd hooks; ") +
                                             (c.zero > 0 ? "DeepSpeed ZeRO" : "Megatron's distributed optimizer") +
                                             " steps its own flat buffers after backward: use --fsdp (torchtune's distributed recipe) or one GPU");
        if (c.offload_optimizer != Offload::None)
            bad("optimizer-in-backward", "--optimizer-in-backward keeps the optimizer on the GPU: drop --offload-optimizer");
        if (c.fsdp != Fsdp::None && c.fsdp_version == 1)
            bad("optimizer-in-backward", "--optimizer-in-backward with FSDP needs --fsdp-version 2: fully_shard calls each sharded "
                                         "parameter's post-accumulate-grad hooks after the reduce-scatter (FSDP1's flat parameters do not)");
        const std::int64_t model_parallel = std::max<std::int64_t>(1, c.tp) * std::max<std::int64_t>(1, c.cp);
        if (c.fsdp == Fsdp::None && c.gpus > model_parallel)
            bad("optimizer-in-backward", "--optimizer-in-backward with data parallelism needs --fsdp: DDP's all-reduce would come "
                                         "after each parameter's step (torchtune's distributed recipe shards with FSDP2)");
        if (req.zero_grad == ZeroGrad::Zero)
            bad("optimizer-in-backward", "--optimizer-in-backward frees each gradient with zero_grad(set_to_none=True) in its hook: "
                                         "--zero-grad zero does not apply");
    }
    // transformers' bitsandbytes quantizers turn torch_dtype=None into float16
    // (huggingface/transformers d91fa5a784e4,
    // src/transformers/quantizers/quantizer_bnb_4bit.py Bnb4BitHfQuantizer.update_dtype).
    if (req.load_dtype == LoadDtype::FP32 && req.quant && *req.quant != Quant::None)
        bad("load-dtype", "--load-dtype fp32 does not apply to a quantized base: transformers' bitsandbytes quantizer loads "
                          "torch_dtype=None as float16; use --load-dtype weights");
}

bool in_backward_optimizer(const Job& job) {
    const bool grad_buffer = job.master > Bytes(0) && job.tdt == DType::F32;
    return job.train && job.req.optimizer_in_backward && !grad_buffer;
}

Bytes step_temporaries(const Job& job, const TrainTensor& state) {
    if (job.layout.cfg.offload_optimizer != Offload::None) return Bytes(0);
    const std::int64_t e = state.numel();
    const Optimizer o = job.req.optimizer;
    const bool adam_like = o == Optimizer::Adam || o == Optimizer::AdamW || o == Optimizer::Lion;
    Bytes t;
    if (adam_like && job.opt_impl == OptimizerImpl::Foreach) t = dtype_bytes(job.state_dt, e);
    else if (adam_like && job.opt_impl == OptimizerImpl::ForLoop) t = dtype_bytes(job.state_dt, e) * 2;
    else if (o == Optimizer::Adafactor) t = dtype_bytes(DType::F32, e) * 2;
    if (job.master > Bytes(0) && job.tdt != DType::F32) t += dtype_bytes(DType::F32, e);
    return t;
}

// torchtune's OptimizerInBackward (pytorch/torchtune bd2a0fc7c314,
// torchtune/modules/optim.py L47-60; torchtune/training/memory.py L222-245 for
// the older register_optim_in_bwd_hooks) builds one optimizer per parameter and
// registers Tensor.register_post_accumulate_grad_hook, whose hook runs
// optimizer.step() and optimizer.zero_grad() (set_to_none) right after
// AccumulateGrad has written the parameter's .grad: the gradient is freed before
// the next one is made.
Bytes in_backward_step(const Job& job, const TrainTensor& state, Bytes grad, bool amp_cast) {
    const Bytes cast = amp_cast ? Bytes(grad.count() / 2) : Bytes(0);
    return grad + max(cast, step_temporaries(job, state));
}

// FSDP1 (pytorch/pytorch fe03cf693c7c, torch/distributed/fsdp/_flat_param.py
// FlatParamHandle._validate_tensors_to_flatten): "For `use_orig_params=True`,
// permit non-uniform `requires_grad`", and the FlatParameter's requires_grad
// is the OR over its tensors (`flat_param_requires_grad =
// flat_param_requires_grad or tensor.requires_grad`), flattened by
// flatten_tensors_into_flat_param(..., requires_grad=flat_param_requires_grad):
// a wrapped layer holding LoRA adapters and frozen base weights has one flat
// parameter whose gradient spans all of it (FSDP1's docs for use_orig_params:
// the gradient memory is "equivalent to not freezing those parameters").
// FSDP2 shards per parameter: frozen parameters get no gradient.
bool fsdp1_flat_grads(const Job& job) {
    return job.train && job.lora && job.layout.cfg.fsdp != Fsdp::None && job.layout.cfg.fsdp_version == 1;
}

LoadPhase load_phase(const ModelGraph& g_in, const Job& job, std::int64_t rank, const std::vector<std::vector<std::int32_t>>& stages,
                     const std::vector<RankTensor>& tensors) {
    const ModelGraph& g = job_graph(g_in, job);
    LoadPhase lp;
    const ParallelConfig& c = job.layout.cfg;
    const std::int64_t tp = std::max<std::int64_t>(1, c.tp);
    const bool sharded = c.zero == 3 || c.fsdp != Fsdp::None;
    // Megatron-style model parallelism builds each rank's shard in place in its
    // parameter dtype: no checkpoint conversion on the GPU.
    const bool in_place = c.tp > 1 || c.pp > 1 || c.distributed_optimizer;
    const bool fp32 = job.req.load_dtype == LoadDtype::FP32 && job.wdt != DType::F32 && !in_place;
    Bytes largest_cast;
    std::vector<Bytes> layer(g.blocks.size());  // one instance's unsharded parameters, load dtype
    for (const auto& rt : tensors) {
        if (rt.adapter) {  // PEFT adds the adapters after loading
            lp.weights += rt.stored * rt.copies;
            continue;
        }
        const bool quantized = job.quant != Quant::None && rt.block >= 0 && rt.param >= 0 &&
                               quantizable(g.blocks[static_cast<std::size_t>(rt.block)].params[static_cast<std::size_t>(rt.param)]);
        Bytes one = rt.stored;
        if (fp32 && !quantized && rt.stored > Bytes(0)) one = dtype_bytes(DType::F32, rt.sharded_elems(sharded));
        lp.weights += one * rt.copies;
        largest_cast = max(largest_cast, rt.stored);
        if (sharded && rt.block >= 0) {
            std::int64_t inst = 0;
            for (auto v : stages[static_cast<std::size_t>(rt.block)]) inst += (v % std::max<std::int64_t>(1, c.pp)) == rank ? 1 : 0;
            const std::int64_t per_instance = rt.copies / std::max<std::int64_t>(1, inst);
            layer[static_cast<std::size_t>(rt.block)] +=
                dtype_bytes(fp32 ? DType::F32 : job.wdt, checked_mul(rt.elems, per_instance));
        }
    }
    std::string how;
    // bitsandbytes quantizes each weight as it reaches the GPU: Params4bit._quantize
    // copies the 16-bit weight to the device, then quantize_4bit (bitsandbytes
    // 95f9af30, bitsandbytes/nn/modules.py L381-383); Int8Params._quantize makes
    // an fp16 copy on the device first (L742-743). transformers hands each
    // weight to Params4bit(...).to(device) one at a time
    // (quantizer_bnb_4bit.py Bnb4BitHfQuantizer.create_quantized_param).
    if (!in_place && (job.quant == Quant::NF4 || job.quant == Quant::Int8) && job.largest_linear > 0) {
        const Bytes w16 = dtype_bytes(job.half, job.largest_linear).ceil_div(tp);
        if (w16 > lp.in_flight) {
            lp.in_flight = w16;
            how = "the largest linear weight in 16 bits before bitsandbytes quantizes it";
        }
    }
    // Loaded in fp32 (torch_dtype not given), then model.to(dtype): each
    // parameter's converted copy is made before its fp32 storage is freed.
    if (fp32 && largest_cast > lp.in_flight) {
        lp.in_flight = largest_cast;
        how = "the fp32 checkpoint cast to " + std::string(dtype_name(job.wdt)) + " tensor by tensor";
    }
    // Sharded parameters: each wrapped layer is materialised unsharded (FSDP's
    // sync_module_states broadcast per unit, ZeRO-3's GatheredParameters per
    // module while loading) before its shard is kept.
    if (sharded && g.params_only == 0) {
        Bytes unit;
        for (const Bytes& b : layer) unit = max(unit, b);
        if (unit > lp.in_flight) {
            lp.in_flight = unit;
            how = "one layer's parameters unsharded before FSDP / ZeRO-3 keeps its shard";
        }
    }
    lp.allocated = lp.weights + lp.in_flight;
    lp.detail = format_bytes(lp.weights) + " of weights" + (fp32 ? " loaded in fp32 (torch_dtype not given)" : "") +
                (lp.in_flight > Bytes(0) ? " + " + format_bytes(lp.in_flight) + " in flight (" + how + ")" : ", streamed in tensor by tensor");
    return lp;
}

void finish_outside_allocator(EstimateResult& r, const ModelGraph& g, const ParallelResult& par, const StageMemory& m) {
    PerGpu& pg = r.per_gpu;
    const Job& job = *r.job;
    // The step simulation finishes an analytic estimate: its lines go once.
    std::erase_if(r.assumptions, [](const std::string& a) { return a.starts_with("paged optimizer: ") || a.starts_with("load phase"); });
    pg.paged_optimizer_states = m.paged_optimizer_states;
    if (m.paged_optimizer_states > Bytes(0)) {
        r.breakdown.push_back({"paged_optimizer_states", "paged optimizer states (CUDA managed memory, outside PyTorch)", m.paged_optimizer_states,
                               "bitsandbytes " + std::string(to_string(job.req.optimizer)) +
                                   ": state1/state2 of tensors of at least 1e5 elements; in nvidia-smi, not in max_memory_allocated/reserved"});
        pg.total_device += m.paged_optimizer_states;
        r.assumptions.push_back("paged optimizer: " + format_bytes(m.paged_optimizer_states) +
                                " of states in cudaMallocManaged memory, counted in the device total; the driver pages them out to "
                                "host memory under pressure, so a device total above the GPU's capacity may still run (slower): "
                                "the verdict is conservative");
    }
    // The load phase: its peak against the step's.
    const LoadPhase lp = load_phase(g, job, m.stage, par.instance_stage, *par.stage_tensors.at(static_cast<std::size_t>(m.stage)));
    pg.load_peak = lp.allocated;
    const Bytes load_total = lp.allocated + pg.cuda_context + par.nccl_outside;
    if (load_total > pg.total_device) {
        r.breakdown.push_back({"load_excess", "loading above the step's peak", load_total - pg.total_device,
                               "from_pretrained: " + lp.detail});
        pg.peak_allocated = max(pg.peak_allocated, lp.allocated);
        pg.peak_reserved = max(pg.peak_reserved, lp.allocated);
        pg.total_device = load_total;
        pg.peak_phase = "load";
        r.assumptions.push_back("load phase peaks above the step: " + format_bytes(lp.allocated) + " allocated (" + lp.detail +
                                "); the headline is the larger of load and step");
    } else {
        r.assumptions.push_back("load phase: " + format_bytes(lp.allocated) + " allocated at most (" + lp.detail +
                                "), below the step's peak; the headline is the larger of load and step");
    }
    if (pg.total_device > pg.capacity) pg.fits = false;
}

}  // namespace gpumem
