// One rank of the job and its pipeline schedule: the rank's weights and
// buffers, model chunks run forward and backward in the schedule's order
// (pipeline receive buffers, gradient buckets), micro-batches, steps, and
// build_step_trace(), the entry point (see gpumem/sim/step.hpp).
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "gpumem/memory/features.hpp"
#include "step_internal.hpp"

namespace gpumem::sim {

namespace detail {

void StepBuilder::rank_setup() {
    // This rank's weights (its stage's layers, tp/ep slices, dp shards when the
    // parameters are sharded, nothing when offloaded), then adapters and fp32
    // master weights (sharded with the optimizer states), then Megatron's
    // main-gradient buffer.
    em_.phase = Phase::Setup;
    const Layout& lay = job_.layout;
    const bool offload_opt = lay.cfg.offload_optimizer != Offload::None;
    for (const auto& rt : tensors_) {
        if (rt.adapter || rt.stored <= Bytes(0)) continue;
        const std::int32_t label = rt.tied_copy ? em_.label("output layer (tied embedding copy) (weight)")
                                                : em_.label(g_.blocks[static_cast<std::size_t>(rt.block)].name + "." +
                                                            g_.blocks[static_cast<std::size_t>(rt.block)].params[static_cast<std::size_t>(rt.param)].name + " (weight)");
        for (std::int64_t k = 0; k < rt.copies; ++k) em_.alloc(rt.stored, label);
    }
    const std::int32_t alabel = em_.label("LoRA adapters");
    const std::int32_t mlabel = em_.label("fp32 master weights");
    Bytes grads;
    for (const auto& rt : tensors_) {
        if (!rt.trainable) continue;
        for (std::int64_t k = 0; k < rt.copies; ++k) {
            if (rt.adapter && rt.stored > Bytes(0)) em_.alloc(rt.stored, alabel);
            if (job_.master > Bytes(0) && !offload_opt) em_.alloc(dtype_bytes(DType::F32, rt.sharded_elems(shard_opt_)), mlabel);
        }
        grads += dtype_bytes(job_.tdt, rt.sharded_elems(shard_grads_)) * rt.copies;
    }
    if (grad_buffer_) em_.alloc(grads, em_.label("parameter gradients (fp32 main-gradient buffer)"));
    // Per block instance: its 16-bit parameters when gathered and its trainable
    // gradients before the reduce-scatter.
    block_gather_.assign(plans_.size(), Bytes(0));
    block_grad_.assign(plans_.size(), Bytes(0));
    block_flat_.assign(plans_.size(), Bytes(0));
    for (const auto& rt : tensors_) {
        if (rt.block < 0) continue;
        const auto bi = static_cast<std::size_t>(rt.block);
        std::int64_t inst = 0;
        for (auto v : par_->instance_stage[bi]) inst += (v % pp_) == rank_ ? 1 : 0;
        const std::int64_t per_instance = rt.copies / std::max<std::int64_t>(1, inst);
        block_gather_[bi] += dtype_bytes(job_.half, checked_mul(rt.elems, per_instance));
        if (rt.trainable) block_grad_[bi] += dtype_bytes(job_.tdt, checked_mul(rt.elems, per_instance));
        if (rt.flat_grad > Bytes(0)) {  // FSDP1 + LoRA (features.hpp): reduce-scattered with the layer's gradients
            block_grad_[bi] += rt.flat_grad * per_instance;
            block_flat_[bi] += rt.flat_grad * per_instance;
        }
    }
    root_gather_ = Bytes(0);
    root_held_ = 0;
    if (gather_ && fsdp_holds_root(g_, job_) && plans_.size() >= 3) {
        root_gather_ = block_gather_.front() + block_gather_.back();
        block_gather_.front() = Bytes(0);
        block_gather_.back() = Bytes(0);
    }
    em_.mark();
}

// CUDA graphs (--cuda-graphs, memory/framework.hpp): a graphed block's forward
// and backward allocate from the graphs' private pool. torch.compile(mode=
// "reduce-overhead") graphs the whole compiled forward and backward and runs
// its warm-up in the pool too (pytorch/pytorch torch/_inductor/
// cudagraph_trees.py@00008d32e650 CUDAWarmupNode), so every step; Megatron-Core
// records its layers in the first step, which runs eager, and captures them at
// its end (NVIDIA/Megatron-LM megatron/core/transformer/cuda_graphs.py@d98e8a64ddf3
// L732-743, L1655-1710): the layers from the second step on.
int StepBuilder::graph_stream(const BlockPlan& p) const {
    switch (job_.framework.cuda_graphs) {
        case CudaGraphs::Compile: return kGraphPoolStream;
        case CudaGraphs::Megatron: return p.blk->checkpointable && em_.step >= 1 ? kGraphPoolStream : 0;
        case CudaGraphs::None: break;
    }
    return 0;
}

std::vector<Instance> StepBuilder::forward_chunk(std::int64_t chunk) {
    em_.phase = Phase::Forward;
    chunk_ = chunk;
    auto& slot_batch = chunk_batch_[static_cast<std::size_t>(chunk)];
    auto& slot_result = chunk_result_[static_cast<std::size_t>(chunk)];
    prev_batch_refs_ = std::move(slot_batch);
    batch_refs_.clear();
    prev_result_refs_ = std::move(slot_result);
    result_refs_.clear();
    std::vector<Instance> stack;
    std::int64_t ck_index = 0;
    std::int64_t x = 0;
    bool rg = false;
    const auto& units = chunks_[static_cast<std::size_t>(chunk)];
    // FSDP's root unit: gathered by the root's pre-forward, before the embedding.
    if (root_gather_ > Bytes(0) && first_vstage(chunk) && root_held_ == 0)
        root_held_ = em_.alloc(root_gather_, em_.label("embeddings and output layer (gathered parameters: FSDP root unit)"));
    if (!first_vstage(chunk) && g_.transformer && !units.empty()) {
        // Activations received from the previous stage.
        const Bytes in = dtype_bytes(job_.actx.stream, checked_mul(checked_mul(job_.req.batch, plans_[units.front().first].seq), g_.transformer->hidden));
        x = em_.alloc(job_.layout.cfg.sp ? in.ceil_div(job_.layout.cfg.tp) : in, recv_label());
        rg = true;
    }
    for (std::size_t u = 0; u < units.size(); ++u) {
        const auto [pi, n] = units[u];
        const BlockPlan& p = plans_[pi];
        for (std::int64_t r = 0; r < n; ++r) {
            const Bytes next = r + 1 < n ? block_gather_[pi] : (u + 1 < units.size() ? block_gather_[units[u + 1].first] : Bytes(0));
            if (p.blk->name == "head") em_.phase = Phase::Loss;
            // Every N-th checkpointable instance of the chunk, the first N, or
            // chunks of N rebuilt at once (memory/activations.hpp).
            const std::int64_t k = p.checkpointed ? ck_index++ : 0;
            const bool ck = p.checkpointed && checkpointed_instance(k, job_.actx);
            const std::int64_t grp = p.checkpointed ? recompute_group(job_.actx) : 1;
            em_.stream = graph_stream(p);
            instance_in_chunk_ = r;
            Instance in = forward(p, x, rg, true, !ck && grp == 1, next);
            em_.stream = 0;
            in.checkpointed = ck;
            if (grp > 1) {
                in.group = grp;
                in.group_pos = k % grp;
            }
            const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(p.blk->output)]);
            if (ck && job_.actx.activation_offload) {
                // Copied to CPU memory; the GPU copy goes once the next layer has read it.
                in.offloaded = p.bytes[static_cast<std::size_t>(p.storage[0])];
                em_.unref(x);
            } else if (ck) {
                in.checkpoint = x;  // keep our reference on the layer input
            } else {
                em_.unref(x);
            }
            x = in.gid[out_st];
            rg = in.rg[static_cast<std::size_t>(p.blk->output)] != 0;
            stack.push_back(std::move(in));
        }
    }
    em_.unref(prefetched_);
    prefetched_ = 0;
    em_.unref(x);  // the loss scalar / the output sent to the next stage (deallocated after the send)
    for (auto id : dropped_casts_) em_.unref(id);
    dropped_casts_.clear();
    for (auto id : forward_refs_) em_.unref(id);
    forward_refs_.clear();
    release_previous_batch();
    for (auto id : prev_result_refs_) em_.unref(id);
    prev_result_refs_.clear();
    slot_batch = std::move(batch_refs_);
    slot_result = std::move(result_refs_);
    batch_refs_.clear();
    result_refs_.clear();
    em_.mark();
    out_.steps.back().after_forward = em_.live();
    return stack;
}

void StepBuilder::backward_chunk(std::int64_t chunk, std::vector<Instance>& stack) {
    em_.phase = Phase::Backward;
    chunk_ = chunk;
    grad_key_ = 0;
    slice_key_ = 0;
    std::int64_t g = 0;
    if (!last_vstage(chunk) && !stack.empty()) {
        // The gradient of this stage's output, received from the next stage.
        const Instance& top = stack.back();
        const auto out_st = static_cast<std::size_t>(top.plan->storage[static_cast<std::size_t>(top.plan->blk->output)]);
        g = em_.alloc(top.plan->bytes[out_st], recv_grad_label());
    }
    if (bucket_ == 0 && job_.layout.dp > 1 && job_.train && !job_.lora) {
        // Persistent communication buckets: torch DDP copies gradients into flat
        // buckets (gradient_as_bucket_view=False); DeepSpeed ZeRO keeps one
        // reduce bucket (contiguous_gradients) of reduce_bucket_size elements.
        const ParallelConfig& c = job_.layout.cfg;
        std::int64_t elems = 0;
        for (const auto& rt : tensors_)
            if (rt.trainable) elems = checked_add(elems, checked_mul(rt.elems, rt.copies));
        Bytes b;
        if (c.zero == 0 && c.fsdp == Fsdp::None && !c.distributed_optimizer) b = dtype_bytes(job_.tdt, elems);
        else if (c.zero >= 1) b = dtype_bytes(job_.half, std::min(c.zero_bucket_elements, elems));
        bucket_ = em_.alloc(b, em_.label("gradient buckets"));
        if (bucket_ == 0) bucket_ = -1;
    }
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
        Instance& in = *it;
        const auto pi = static_cast<std::size_t>(in.plan - plans_.data());
        const Bytes next = std::next(it) != stack.rend() ? block_gather_[static_cast<std::size_t>(std::next(it)->plan - plans_.data())] : Bytes(0);
        em_.stream = graph_stream(*in.plan);
        if (in.group > 0) {
            // A Megatron uniform chunk (megatron/core/recompute.py@d98e8a64ddf3
            // L157-166): re-run the forward of all its layers from the first
            // one's kept input, then their backward, last to first.
            const auto last = static_cast<std::size_t>(std::distance(it, stack.rend()) - 1);
            const std::size_t start = last - static_cast<std::size_t>(in.group_pos);
            Instance& head = stack[start];
            if (head.offloaded > Bytes(0)) head.checkpoint = em_.alloc(head.offloaded, em_.label(head.plan->blk->name + " input (back from CPU)"));
            std::vector<Instance> re;
            std::int64_t x = head.checkpoint;
            recomputing_ = true;
            for (std::size_t j = start; j <= last; ++j) {
                em_.stream = graph_stream(*stack[j].plan);
                re.push_back(forward(*stack[j].plan, x, stack[j].input_rg, true, true, Bytes(0)));
                em_.unref(x);  // our reference on the input (the layer keeps what it saves)
                const auto ost = static_cast<std::size_t>(stack[j].plan->storage[static_cast<std::size_t>(stack[j].plan->blk->output)]);
                x = re.back().gid[ost];
            }
            recomputing_ = false;
            em_.unref(x);  // the chunk's recomputed output itself is not needed
            head.checkpoint = 0;
            for (std::size_t j = re.size(); j-- > 0;) {
                em_.stream = graph_stream(*re[j].plan);
                const std::size_t at = start + j;
                const Bytes nx = at > 0 ? block_gather_[static_cast<std::size_t>(stack[at - 1].plan - plans_.data())] : Bytes(0);
                g = backward(re[j], g, nx);
            }
            for (auto id : dropped_casts_) em_.unref(id);
            dropped_casts_.clear();
            for (std::size_t j = start; j <= last; ++j) release_extra(stack[j]);
            instances_.give(re);
            it += static_cast<std::ptrdiff_t>(in.group_pos);  // the chunk's other instances are done
            em_.stream = 0;
            continue;
        }
        if (in.checkpointed) {
            // Re-run the layer's forward from the kept input, then its backward.
            if (in.offloaded > Bytes(0)) in.checkpoint = em_.alloc(in.offloaded, em_.label(in.plan->blk->name + " input (back from CPU)"));
            recomputing_ = true;
            Instance re = forward(*in.plan, in.checkpoint, in.input_rg, true, true, Bytes(0));
            recomputing_ = false;
            const auto out_st = static_cast<std::size_t>(in.plan->storage[static_cast<std::size_t>(in.plan->blk->output)]);
            em_.unref(re.gid[out_st]);  // the recomputed output itself is not needed
            em_.unref(in.checkpoint);
            g = backward(re, g, next);
            // Weight copies autocast made during the recompute and nobody saved.
            for (auto id : dropped_casts_) em_.unref(id);
            dropped_casts_.clear();
            // What the first forward kept for its backward (SHARD_GRAD_OP's parameters).
            release_extra(in);
            instances_.give(std::move(re));
        } else {
            g = backward(in, g, next);
        }
        em_.stream = 0;
        (void)pi;
    }
    // The root's post-backward, after the embedding's backward, reshards it.
    if (root_held_ != 0 && first_vstage(chunk)) {
        em_.unref(root_held_);
        root_held_ = 0;
    }
    em_.unref(prefetched_);
    prefetched_ = 0;
    em_.unref(g);  // the input gradient (sent to the previous stage)
    instances_.give(stack);  // their backward is done (the caller drops the emptied stack)
    em_.mark();
    out_.steps.back().after_backward = em_.live();
}

void StepBuilder::run() {
    out_.steps.clear();
    const Layout& lay = job_.layout;
    par_ = opt_.parallel;
    rank_ = opt_.stage;
    pp_ = std::max<std::int64_t>(1, lay.cfg.pp);
    vpp_ = std::max<std::int64_t>(1, lay.vpp);
    chunks_.assign(static_cast<std::size_t>(vpp_), {});
    chunk_batch_.assign(static_cast<std::size_t>(vpp_), {});
    chunk_result_.assign(static_cast<std::size_t>(vpp_), {});
    for (std::int64_t c = 0; c < vpp_; ++c) {
        const std::int64_t v = c * pp_ + rank_;
        for (std::size_t i = 0; i < g_.blocks.size(); ++i) {
            std::int64_t n = 0;
            for (auto s : par_->instance_stage[i]) n += s == v ? 1 : 0;
            if (n > 0) chunks_[static_cast<std::size_t>(c)].emplace_back(i, n);
        }
    }
    tensors_ = rank_tensors(g_, job_, par_->instance_stage, rank_);
    const ParallelConfig& c = lay.cfg;
    gather_ = c.zero == 3 || c.fsdp != Fsdp::None;
    shard_grads_ = lay.dp > 1 && (c.zero >= 2 || c.fsdp != Fsdp::None);
    shard_opt_ = c.zero >= 1 || c.fsdp != Fsdp::None || c.distributed_optimizer;
    grad_buffer_ = job_.train && job_.master > Bytes(0) && job_.tdt == DType::F32;
    inbwd_ = in_backward_optimizer(job_);
    no_sync_ = shard_grads_ && c.no_sync && job_.req.grad_accum > 1;
    hold_unsharded_ = gather_ && no_sync_ && c.fsdp == Fsdp::GradOp && c.fsdp_version == 1;
    unsharded_.clear();
    for (const auto& rt : tensors_) tied_owned_ = tied_owned_ || rt.tied_copy;
    if (!job_.train) {
        inference();
        return;
    }
    const std::int64_t seq = std::max<std::int64_t>(1, job_.seq / c.cp);
    plans_.reserve(g_.blocks.size());
    for (std::size_t i = 0; i < g_.blocks.size(); ++i)
        plans_.push_back(plan_block(g_.blocks[i], job_, seq, false, em_, lay));
    rank_setup();
    const Bytes after_setup = em_.live();
    const std::int64_t m = job_.req.grad_accum;
    const bool steady = opt_.steady_state != nullptr && !opt_.all_micro_batches;
    // Without steady-state detection: micro-batches beyond the schedule's
    // steady state allocate and free what earlier ones did
    // (pipeline_steady_micro_batches); the allocator's cache can still settle
    // over a few dozen more (a segment more or less), so up to
    // kFullMicroBatches run in full (approximate).
    constexpr std::int64_t kFullMicroBatches = 64;
    const std::int64_t m_cut = std::max(pipeline_steady_micro_batches(pp_, vpp_, m, rank_), std::min(m, kFullMicroBatches - kFullMicroBatches % pp_));
    const std::int64_t m_sim = opt_.all_micro_batches || steady ? m : m_cut;
    out_.approximate = out_.approximate || m_sim < m;
    if (m_sim < m)
        out_.notes.push_back("grad-accum " + std::to_string(m) + ": micro-batches after the first " + std::to_string(m_sim) +
                             " allocate and free what earlier ones did; " + std::to_string(m_sim) + " simulated per step (approximate)");
    const std::vector<PipelineOp> schedule = pipeline_schedule(pp_, vpp_, m_sim, rank_);
    const auto n_ops = static_cast<std::int64_t>(schedule.size());
    // Steady-state detection (StepTraceOptions::steady_state): boundaries from
    // `warm` on are compared, at most `window` of them. Tensors allocated
    // before the base boundary are named by id, later ones by age; the base
    // moves on every `rebase` boundaries without a match (a tensor that lives
    // to the step's end, made after the base, would never look the same).
    // Under 1F1B the live tensors repeat after the warm-up, but the allocator's
    // cache settles slowly: llama-3-8b/70b pp 4 repeat after about 200
    // micro-batches of the second step, pp 16 after 250, mixtral-8x7b pp 16
    // after 700 (periods of 2 pp chunks), so the window grows with pp. Under
    // the interleaved schedule the live tensors repeat every 4 pp vpp chunk
    // operations, but tensors of one size take different small-pool blocks
    // from one period to the next. Compared over long lags (one base after
    // every chunk's first backward, every 2 pp vpp-th boundary kept), the
    // state did come back on llama-3.2-1b and llama-3-8b pp 4 vpp 2 (seq
    // 256): after 11 periods (352 operations), found 500-4,600 operations in,
    // at 5-10x this detection's cost and up to 170 MB. On qwen2-0.5b's first
    // rank it did not within 14,000 operations: the signature's length (the
    // block layout) wanders without a short cycle. No state repetition makes
    // the interleaved answer exact in general, so it keeps the short window
    // and the 64-micro-batch cut, approximate (within 1% of a full replay on
    // tests/sim_fast_path_test.cpp's grid).
    const std::int64_t warm = 2 * pp_ * vpp_ + 2;
    const std::int64_t window = vpp_ > 1 ? 16 * pp_ * vpp_ + 128 : 64 * pp_ + 512;
    const std::int64_t rebase = 8 * pp_ * vpp_ + 32;
    // The state is compared every `stride` = 2 pp vpp boundaries only: the
    // periods found are multiples of it (2 pp chunks under 1F1B, 4 pp vpp or
    // 11 x 4 pp vpp interleaved, above), so a state that repeats is found all
    // the same, at most a stride later, for a 2 pp vpp-th of the signatures'
    // cost (a third to a half of the simulation's time before: CPU time of
    // `estimate` for llama-3.1-405b tp 2 pp 32 vpp 4, 31 ranks simulated,
    // 2.9 s -> 1.7 s; llama-3-70b tp 8 pp 8 1F1B grad-accum 256 1.2 s -> 0.6 s).
    const std::int64_t stride = 2 * pp_ * vpp_;
    // Detection costs about twice what it can save per operation: up to the
    // cut, the probe (a second pass of the allocator model over every event,
    // plus the signatures) runs beside the trace, and the replay still covers
    // every event before the cut. So a schedule is simulated whole, without
    // looking for its steady state, when a cut could not come early enough to
    // pay for it; the answer is the same either way (a cut is exact, a whole
    // schedule is the full replay).
    // - A pipeline (pp > 1), 1F1B or interleaved, when its operations fit in
    //   the window (or it has no more micro-batches than the cut without
    //   detection, m_cut): 1F1B caches settle only after a few hundred
    //   chunks (above), interleaved ones rarely. CPU time of `estimate`, one
    //   thread, detection vs whole: llama-3-70b tp 8 pp 4 grad-accum 64
    //   298 ms vs 106 ms, pp 8 grad-accum 256 616 ms vs 240 ms; llama-3.2-1b
    //   pp 4 grad-accum 256 65 ms vs 69 ms (its cut came early).
    // - One GPU (pp = 1) below kDetectMinMicroBatches: its state repeats
    //   within the first micro-batches, and detection then costs what about
    //   12 micro-batches do in full. Build and replay, one thread, best of 3,
    //   qwen2-0.5b / gpt2 / llama-3-8b at seq 1024 (since the probe's dense
    //   tables): grad-accum 8 11.3 / 4.4 / 15.4 ms detecting vs 8.7 / 2.7 /
    //   11.1 ms whole; 12: 11.2 / 4.4 / 15.7 vs 11.7 / 4.1 / 17.4; 16: 11.1 /
    //   4.3 / 15.7 vs 15.9 / 4.6 / 20.9 (it was 24 when detection cost what
    //   15 to 28 micro-batches did).
    // StepTraceOptions::detect_always overrides both (run_builder's second
    // try when the whole schedule would exceed kMaxTraceEvents).
    const bool can_detect = steady && n_ops > warm + 4;
    const bool worth = pp_ == 1 ? m >= kDetectMinMicroBatches : n_ops > warm + window && m_cut < m;
    const bool detect = can_detect && (worth || opt_.detect_always);
    skipped_detection_ = can_detect && !detect;
    std::optional<StateProbe> probe;
    if (detect) {
        probe.emplace(*opt_.steady_state);
        em_.track_live();
    }
    auto same_kind = [&](const PipelineOp& a, const PipelineOp& b) {
        return a.forward == b.forward && a.chunk == b.chunk && (a.forward || (a.micro_batch != m - 1 && b.micro_batch != m - 1));
    };
    auto hash_of = [](const std::vector<std::int64_t>& v) {
        std::uint64_t h = 1469598103934665603ULL;
        for (auto x : v) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ULL;
        return h;
    };
    // (After the first op where a quarter of the ops is none: one GPU without
    // gradient accumulation runs a forward and a backward per step.)
    const std::int64_t reserve_at = std::max<std::int64_t>(std::min(n_ops / 4, 8 * pp_ * vpp_), n_ops >= 2 ? 1 : 0);
    for (int s = 0; s < opt_.steps; ++s) {
        em_.step = s;
        // torch.compile(mode="reduce-overhead") warms up in the first step and
        // records its graphs in the second (the capture empties the cache).
        if (job_.framework.cuda_graphs == CudaGraphs::Compile && s == 1) em_.empty_cache();
        out_.steps.push_back({});
        out_.steps.back().after_setup = after_setup;
        std::map<std::pair<std::int64_t, std::int64_t>, std::vector<Instance>> inflight;
        struct Boundary {
            std::int64_t op, event;
            std::vector<std::int64_t> sig;
        };
        std::vector<Boundary> seen;
        std::unordered_map<std::uint64_t, std::vector<std::size_t>> by_hash;
        std::int64_t base_id = 0;
        bool cut = !detect;
        for (std::int64_t x = 0; x < n_ops; ++x) {
            // The trace's room, reserved once from the events of the first
            // quarter of the ops projected over the whole run (within the event
            // cap) when every op runs (no steady-state cut can shorten it):
            // growing by doubling copied the events and touched their pages
            // again, a fifth of a long pipeline's simulation in page faults.
            // A schedule simulated whole for want of a cut worth looking for,
            // projected past the event limit, stops here: run_builder tries
            // again with detection (a cut may keep it within the limit).
            if (!detect && s == 0 && x == reserve_at && x > 0) {
                auto& ev = out_.trace.events;
                const double projected = static_cast<double>(ev.size()) * static_cast<double>(opt_.steps * n_ops) / static_cast<double>(x);
                if (skipped_detection_ && projected > static_cast<double>(kMaxTraceEvents)) throw TraceTooLarge(kMaxTraceEvents);
                // A projection from one op is rough (a backward emits more than
                // its forward): twice it (room never written is never touched).
                const double margin = x == 1 ? 2.0 : 1.25;
                // (Storage handed back from an earlier trace that holds the
                // projection already is kept: recycle_trace_storage.)
                if (static_cast<double>(ev.capacity()) < projected)
                    ev.reserve(static_cast<std::size_t>(std::min(projected * margin, static_cast<double>(kMaxTraceEvents))));
            }
            if (!cut && x >= warm && (x - warm) % rebase == 0) {
                base_id = em_.next_id();
                seen.clear();
                by_hash.clear();
            }
            if (!cut && x >= warm && (x - warm) % stride == 0) {
                if (x > warm + window) throw NoSteadyState{};
                probe->feed(out_.trace);
                Boundary b{x, static_cast<std::int64_t>(out_.trace.events.size()), probe->signature(base_id, em_.next_id())};
                em_.append_refs(b.sig, base_id);
                const std::uint64_t h = hash_of(b.sig);
                for (const std::size_t k : by_hash[h]) {
                    const Boundary& j = seen[k];
                    if (j.sig != b.sig) continue;
                    // The state at x is the state at j.op: the schedule from x
                    // on repeats the d chunks since j.op (micro-batches shifted
                    // by `delta`) up to `end`.
                    const std::int64_t d = x - j.op;
                    const std::int64_t delta = schedule[static_cast<std::size_t>(x)].micro_batch - schedule[static_cast<std::size_t>(j.op)].micro_batch;
                    std::int64_t end = x;
                    while (end < n_ops) {
                        const PipelineOp& a = schedule[static_cast<std::size_t>(end)];
                        const PipelineOp& p = schedule[static_cast<std::size_t>(end - d)];
                        if (!same_kind(a, p) || a.micro_batch - p.micro_batch != delta) break;
                        ++end;
                    }
                    const std::int64_t periods = (end - x) / d;
                    if (periods < 1) continue;
                    out_.trace.cuts.push_back(TraceCut{j.event, b.event, periods});
                    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<Instance>> moved;
                    for (auto& [key, v] : inflight) moved[std::make_pair(key.first + periods * delta, key.second)] = std::move(v);
                    inflight = std::move(moved);
                    x += periods * d;
                    cut = true;
                    break;
                }
                if (!cut) {
                    by_hash[h].push_back(seen.size());
                    seen.push_back(std::move(b));
                } else {
                    seen.clear();
                    by_hash.clear();
                    if (x >= n_ops) break;
                }
            }
            const PipelineOp& op = schedule[static_cast<std::size_t>(x)];
            const auto key = std::make_pair(op.micro_batch, op.chunk);
            if (op.forward) {
                inflight[key] = forward_chunk(op.chunk);
            } else {
                auto it = inflight.find(key);
                if (it == inflight.end()) continue;
                final_mb_ = op.micro_batch == m_sim - 1;  // no_sync: the step's reduce-scatter
                backward_chunk(op.chunk, it->second);
                inflight.erase(it);
            }
        }
        // A CUDA graph capture begins with torch.cuda.empty_cache()
        // (pytorch/pytorch torch/cuda/graphs.py@006be72d443c graph.__enter__):
        // Megatron captures after the first step's backward (megatron/core/
        // pipeline_parallel/schedules.py@d98e8a64ddf3 L888-889).
        if (job_.framework.cuda_graphs == CudaGraphs::Megatron && s == 0) em_.empty_cache();
        // FSDP1's post-backward callback reshards what no hook did (_catch_all_reshard).
        for (const auto& [key, id] : unsharded_) em_.unref(id);
        unsharded_.clear();
        optimizer_step(s);
    }
}

}  // namespace detail

namespace {

// recycle_trace_storage's spare: one per thread.
thread_local std::vector<TraceEvent> spare_events;
// A first trace's reservation (8 MiB of address space).
constexpr std::size_t kFirstTraceEvents = std::size_t(1) << 18;

StepTrace run_builder(const ModelGraph& g, const Job& job, const StepTraceOptions& opt) {
    StepTrace out;
    out.trace.events.swap(spare_events);  // (this thread's spare, if any, now empty)
    out.trace.events.clear();
    // Room for a typical trace at once (an 8B step is 13.6k events): the
    // pages of a large reservation are mapped only as events are written,
    // while growing from empty copied the events into fresh pages at each
    // doubling (with the timeline's and the replay's id table's growth, 59
    // of the 620 page faults of a one-off `gpumem estimate llama-3-8b`).
    if (out.trace.events.capacity() == 0) out.trace.events.reserve(kFirstTraceEvents);
    detail::StepBuilder builder(g, job, opt, out);
    StepTraceOptions again = opt;
    try {
        builder.run();
        return out;
    } catch (const detail::StepBuilder::NoSteadyState&) {
        // No period found in the detection window: the 64-micro-batch cut.
        again.steady_state = nullptr;
    } catch (const TraceTooLarge&) {
        // A schedule simulated whole because it looked too short for a cut to
        // pay: with detection its periods may be left out.
        if (!builder.skipped_detection()) throw;
        again.detect_always = true;
    }
    recycle_trace_storage(std::move(out));  // the second try writes into the same storage
    return run_builder(g, job, again);
}

}  // namespace

void recycle_trace_events(std::vector<TraceEvent>& ev) {
    if (ev.capacity() > spare_events.capacity() && ev.capacity() <= static_cast<std::size_t>(kMaxSpareTraceEvents)) spare_events = std::move(ev);
    ev = {};
}

void recycle_trace_storage(StepTrace&& t) { recycle_trace_events(t.trace.events); }

void release_trace_storage() {
    spare_events = std::vector<TraceEvent>{};
    release_replay_storage();
}

StepTrace build_step_trace(const ModelGraph& g_in, const Job& job, const StepTraceOptions& opt) {
    const ModelGraph& g = job_graph(g_in, job);
    if (opt.parallel) return run_builder(g, job, opt);
    // One rank of the job's layout (the whole model on one GPU).
    const ParallelResult par = parallel_memory(g, job);
    StepTraceOptions o = opt;
    o.parallel = &par;
    return run_builder(g, job, o);
}

}  // namespace gpumem::sim
