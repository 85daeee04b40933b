// A training step's forward and backward, block by block and op by op: the
// tensors each op allocates, saves for backward and frees, gradients, autocast
// copies, recompute, and ZeRO-3 / FSDP parameter gathering (see gpumem/sim/step.hpp).
#include <algorithm>
#include <functional>

#include "gpumem/memory/features.hpp"
#include "gpumem/memory/fp8.hpp"
#include "gpumem/model/rewrite.hpp"
#include "step_internal.hpp"

namespace gpumem::sim::detail {

namespace {

bool is_matmul(OpKind k) { return k == OpKind::Linear || k == OpKind::Matmul || k == OpKind::Conv2d; }

// A tensor of a block at the plan's sequence length, in another dtype (the
// 16-bit copy autocast saves, flash's fp32 accumulator), split as the tensor is.
Bytes tensor_bytes(const BlockPlan& p, std::size_t t, DType dt, const ActivationContext& base) {
    ActivationContext c = base;
    c.seq = p.seq;
    return activation_bytes(p.blk->tensors[t], dt, p.split[t] != 0, c);
}

}  // namespace

// Tensors are this rank's share (activation_bytes: seq / cp tokens, tp split
// tensor by tensor), exactly as the analytic view counts them.
BlockPlan plan_block(const Block& b, const Job& job, std::int64_t seq, bool inference, Emitter& em, const Layout& lay) {
    BlockPlan p;
    p.blk = &b;
    p.seq = seq;
    ActivationContext c = job.actx;
    c.seq = seq;
    const std::int64_t tp = std::max<std::int64_t>(1, lay.cfg.tp);
    const std::size_t n = b.tensors.size();
    p.dt.resize(n);
    p.bytes.resize(n);
    p.storage.resize(n);
    p.uses.assign(n, 0);
    p.label.resize(n);
    p.split = tp_split_flags(b);
    p.sac_kept = sac_kept_ops(b);
    for (std::size_t i = 0; i < n; ++i) {
        const TensorInfo& t = b.tensors[i];
        p.dt[i] = resolve_role(t.role, c);
        p.bytes[i] = activation_bytes(t, p.dt[i], p.split[i] != 0, c);
        p.storage[i] = static_cast<TensorId>(i);
        if (t.alias_of >= 0 && p.dt[static_cast<std::size_t>(t.alias_of)] == p.dt[i])
            p.storage[i] = p.storage[static_cast<std::size_t>(t.alias_of)];
        p.label[i] = em.label(b.name + "." + t.name);
    }
    const std::size_t nops = b.ops.size();
    {
        ForwardStructure f = forward_structure(b, p.storage, c.attention, inference);
        p.skip = std::move(f.skip);
        p.site_of_op = std::move(f.site_of_op);
        p.uses = std::move(f.uses);
    }

    p.has_weight.assign(nops, 0);
    p.weight_cast.assign(nops, Bytes(0));
    p.weight_cast_uncached.assign(nops, 0);
    p.weight_cast_label.assign(nops, -1);
    p.dequant.assign(nops, Bytes(0));
    p.tied_grad.assign(nops, Bytes(0));
    p.param_grads.assign(nops, {});
    p.param_index.assign(nops, {});
    p.lora.assign(nops, 0);
    p.lora_in.assign(nops, AdapterInput{});
    p.lora_share.assign(nops, -1);
    p.quant_saves.assign(nops, 0);
    p.lora_a.assign(nops, Bytes(0));
    p.lora_b.assign(nops, Bytes(0));
    p.lora_grads.assign(nops, {});
    p.fp8_copies.assign(nops, {});
    p.fp8_state.assign(nops, {});
    for (std::size_t o = 0; o < nops; ++o) {
        const Op& op = b.ops[o];
        p.has_weight[o] = !op.params.empty() || (op.kind == OpKind::Linear && op.in_features > 0) || op.kind == OpKind::Embedding;
        // Elements of the op's weights on this rank (tp splits the first
        // dimension, ep the routed experts), as rank_tensors() counts them.
        std::int64_t elems = 0;
        for (auto pi : op.params) {
            const Param& prm = b.params[static_cast<std::size_t>(pi)];
            const std::int64_t per = rank_param_elems(prm, tp);
            const std::int64_t copies = prm.component == Component::Experts ? (prm.count + lay.cfg.ep - 1) / lay.cfg.ep : prm.count;
            elems = checked_add(elems, checked_mul(per, copies));
            // Transformer Engine's FP8 weight workspace of each tensor (rank_tensors' shape).
            const Fp8WeightAllocs fa = inference ? Fp8WeightAllocs{} : fp8_weight_allocs(job, prm, rank_param_shape(prm, tp));
            if (fa.total() > Bytes(0))
                for (std::int64_t k = 0; k < copies; ++k) {
                    p.fp8_copies[o].insert(p.fp8_copies[o].end(), fa.copies.begin(), fa.copies.end());
                    p.fp8_state[o].insert(p.fp8_state[o].end(), fa.state.begin(), fa.state.end());
                }
            if (job.train && !job.lora)
                for (std::int64_t k = 0; k < copies; ++k) {
                    p.param_grads[o].push_back(dtype_bytes(job.tdt, per));
                    p.param_index[o].push_back(static_cast<std::int32_t>(pi));
                }
        }
        if (op.params.empty() && op.kind == OpKind::Linear) {
            // A tied head is split like the embedding it shares (vocab-parallel).
            elems = checked_mul((op.out_features + tp - 1) / tp, op.in_features);
            p.tied_grad[o] = dtype_bytes(job.tdt, elems);
        }
        // bitsandbytes 4-bit layers dequantize their weight to the compute dtype
        // for every matmul (forward and backward), one layer at a time; LLM.int8
        // casts its weight back to 16 bits in backward only (job.cpp).
        if ((dequantizes(job.quant) || (job.quant == Quant::Int8 && !inference)) && op.kind == OpKind::Linear)
            for (auto pi : op.params) {
                const Param& prm = b.params[static_cast<std::size_t>(pi)];
                if (quantized_weight(prm, job.quant, c.quantize_head))
                    p.dequant[o] = dtype_bytes(c.lowered, prm.shape[0] * prm.shape[1]).ceil_div(tp);
            }
        // bitsandbytes keeps a frozen quantized layer's input for backward when
        // it requires grad (activations.cpp quantized_saves_input).
        if (!inference && quantized_saves_input(c) && quantized_op(b, op, c.quant, c.quantize_head)) p.quant_saves[o] = 1;
        if (!inference && c.autocast && c.weight_cache && !job.lora && job.wdt == DType::F32 && is_matmul(op.kind) && p.has_weight[o])
            p.weight_cast[o] = dtype_bytes(c.lowered, elems);
        // Frozen fp32 base weights under autocast (ActivationContext::frozen_weight_casts):
        // cast per call, not cached, kept only for the input's gradient.
        if (!inference && c.autocast && c.frozen_weight_casts && job.wdt == DType::F32 && p.has_weight[o] &&
            (op.kind == OpKind::Linear || op.kind == OpKind::Matmul) && !quantized_op(b, op, c.quant, c.quantize_head)) {
            p.weight_cast[o] = dtype_bytes(c.lowered, elems);
            p.weight_cast_uncached[o] = 1;
        }
        // (The copy is made at every forward of the op: its label once here.)
        if (p.weight_cast[o] > Bytes(0)) p.weight_cast_label[o] = em.label(b.name + "." + op.name + " (autocast weight copy)");
        if (job.lora && !inference && lora_applies(op, c.lora_targets)) {
            p.lora[o] = 1;
            const auto x = static_cast<std::size_t>(op.inputs.front());
            p.lora_share[o] = shared_adapter_input(b, o, c);
            p.lora_in[o] = p.lora_share[o] >= 0 ? AdapterInput{} : adapter_input(b, op, op.inputs.front(), p.dt[x], p.split[x] != 0, c);
            const std::int64_t rows = activation_elements(b.tensors[x], c) / std::max<std::int64_t>(1, op.in_features);
            p.lora_a[o] = dtype_bytes(c.lowered, checked_mul(rows, c.lora_rank));
            p.lora_b[o] = dtype_bytes(c.lowered, checked_mul(rows, op.out_features));
            std::int64_t copies = op.params.empty() ? 1 : b.params[static_cast<std::size_t>(op.params.front())].count;
            if (!op.params.empty() && b.params[static_cast<std::size_t>(op.params.front())].component == Component::Experts)
                copies = (copies + lay.cfg.ep - 1) / lay.cfg.ep;
            for (std::int64_t k = 0; k < copies; ++k) {
                p.lora_grads[o].push_back(dtype_bytes(job.tdt, checked_mul(c.lora_rank, op.in_features)));
                p.lora_grads[o].push_back(dtype_bytes(job.tdt, checked_mul(c.lora_rank, op.out_features)));
            }
        }
    }
    for (std::size_t o = 0; o < nops; ++o) {
        if (b.ops[o].kind != OpKind::Loss || b.ops[o].chunks <= 1) continue;
        for (std::size_t h = 0; h < o; ++h)
            if (is_output_head(b.ops[h]) && !b.ops[h].outputs.empty()) {
                p.head_op = h;
                p.loss_chunks = b.ops[o].chunks;
            }
        if (p.loss_chunks <= 1) continue;
        const LossChunkGrads lc = loss_chunk_grads(b, p.head_op, o);
        const auto bytes_of = [&](TensorId t) { return t >= 0 ? p.bytes[static_cast<std::size_t>(t)] : Bytes(0); };
        p.loss_chunk_grad = loss_chunk_transient(bytes_of(lc.logp), bytes_of(lc.cast), bytes_of(lc.logits), p.loss_chunks);
    }
    p.checkpointed = !inference && (c.recompute == Recompute::Full || c.recompute == Recompute::Ops) && b.checkpointable;
    return p;
}

void StepBuilder::workspace(bool autograd_thread) {
    if (!opt_.cublas_workspaces) return;
    bool& done = autograd_thread ? ws_autograd_ : ws_main_;
    if (done) return;
    done = true;
    // Never freed: the handle's workspace lives as long as the process.
    em_.alloc(opt_.cublas_workspace, em_.label(autograd_thread ? "cuBLAS workspace (autograd thread)" : "cuBLAS workspace (main thread)"));
}

std::int32_t StepBuilder::plan_label(PlanLabel kind, const BlockPlan& p) {
    auto text = [&] {
        const std::string& name = p.blk->name;
        switch (kind) {
            case PlanLabel::Gathered: return name + " (gathered parameters)";
            case PlanLabel::Logsumexp: return name + ".attention.logsumexp";
            case PlanLabel::ActivationGradients: return name + " (activation gradients)";
        }
        return name;
    };
    // (A plan outside plans_, inference's decode plans: not cached.)
    const std::less<const BlockPlan*> before;
    if (before(&p, plans_.data()) || !before(&p, plans_.data() + plans_.size())) return em_.label(text());
    const auto plan = static_cast<std::size_t>(&p - plans_.data());
    auto& cache = plan_labels_[static_cast<std::size_t>(kind)];
    if (cache.size() != plans_.size()) cache.assign(plans_.size(), -1);
    std::int32_t& l = cache[plan];
    if (l < 0) l = em_.label(text());
    return l;
}

void StepBuilder::release_extra(Instance& in) {
    for (auto id : in.extra) em_.unref(id);
    in.extra.clear();
    if (in.held_key && final_mb_) {
        // The syncing backward frees the unit in its post-backward hook.
        if (const auto it = unsharded_.find(*in.held_key); it != unsharded_.end()) {
            em_.unref(it->second);
            unsharded_.erase(it);
        }
        in.held_key.reset();
    }
}

std::int64_t StepBuilder::gather(std::size_t plan, Bytes next) {
    // The layer's parameters (the prefetched part becomes part of them), then
    // the next layer's prefetch: FSDP's BACKWARD_PRE / forward prefetch gathers
    // the whole next unit, DeepSpeed ZeRO-3 up to stage3_prefetch_bucket_size
    // elements (deepspeed/runtime/zero/config.py L208, 5e7), both capped by
    // stage3_max_live_parameters (L231, 1e9).
    const std::int32_t label = plan_label(PlanLabel::Gathered, plans_[plan]);
    const Bytes size = block_gather_[plan];
    em_.unref(prefetched_);
    prefetched_ = 0;
    const std::int64_t id = em_.alloc(size, label);
    const ParallelConfig& c = job_.layout.cfg;
    Bytes pre = c.fsdp != Fsdp::None ? next : std::min(next, dtype_bytes(job_.half, c.zero3_prefetch_elements));
    if (c.zero == 3) {
        const Bytes cap = dtype_bytes(job_.half, c.zero3_max_live_elements);
        pre = size >= cap ? Bytes(0) : std::min(pre, cap - size);
    }
    if (pre > Bytes(0)) prefetched_ = em_.alloc(pre, label);
    return id;
}
Instance StepBuilder::forward(const BlockPlan& p, std::int64_t input, bool input_rg, bool grad_mode, bool keep_saves, Bytes next_gather) {
    const Block& b = *p.blk;
    const ActivationContext& c = job_.actx;
    const bool selective = c.recompute == Recompute::Selective && c.attention != Attention::Flash;
    // Op-level selective checkpointing: a checkpointed instance keeps every
    // other matmul's output and the fused attention outputs (op_sac_saved).
    const bool sac = !keep_saves && grad_mode && c.recompute == Recompute::Ops && b.checkpointable;
    Instance in = instances_.take();
    in.plan = &p;
    in.input = input;
    in.input_rg = input_rg;
    // Transformer Engine quantizes each weight into a workspace its module
    // caches on the instance's first forward (linear.py@d0067d0da6cb
    // L1958-1961, L2068-2071): made then, in the general pool, never freed.
    const bool fp8_new = grad_mode && !recomputing_ && fp8_made_.emplace(chunk_, static_cast<std::size_t>(&p - plans_.data()), instance_in_chunk_).second;
    // ZeRO-3 / FSDP: all-gather the layer's parameters before its forward
    // (the part not prefetched already) and prefetch the next layer's.
    std::int64_t gathered = 0;
    // SHARD_GRAD_OP keeps the layer's parameters from its first forward to its
    // backward: a checkpointed layer's recompute reuses them.
    if (gather_ && grad_mode && !(recomputing_ && job_.layout.cfg.fsdp == Fsdp::GradOp)) {
        const auto plan = static_cast<std::size_t>(&p - plans_.data());
        if (hold_unsharded_) {
            // Still unsharded from an earlier micro-batch's forward (no
            // all-gather, no prefetch), or gathered now and held.
            const auto key = std::make_tuple(chunk_, plan, instance_in_chunk_);
            // The instance's reference goes with its extras at its backward;
            // the map's with the syncing backward (release_extra).
            const auto it = unsharded_.find(key);
            if (it != unsharded_.end()) {
                gathered = it->second;
            } else {
                gathered = gather(plan, next_gather);
                unsharded_.emplace(key, gathered);
            }
            em_.ref(gathered);
            in.held_key = key;
        } else {
            gathered = gather(plan, next_gather);
        }
    }
    const std::size_t n = b.tensors.size();
    in.gid.assign(n, 0);
    in.rg.assign(n, 0);
    in.saves.assign(b.ops.size(), {});
    in.lora_input.assign(b.ops.size(), 0);
    std::vector<std::int32_t>& uses = uses_;
    uses.assign(p.uses.begin(), p.uses.end());
    const auto st0 = static_cast<std::size_t>(p.storage[0]);
    const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(b.output)]);
    in.gid[st0] = input;
    in.rg[0] = input_rg ? 1 : 0;
    const std::string& provides = b.tensors[0].shared_key;
    if (!provides.empty() && grad_mode) {
        // This block's input is read by later blocks (T5's encoder output).
        em_.ref(input);
        shared_[provides] = {input, input_rg};
    }
    if (uses[st0] > 0) em_.ref(input);
    if (out_st == st0) em_.ref(input);  // handed on unchanged

    auto keep = [&](std::size_t o, std::int64_t id) {
        em_.ref(id);
        in.saves[o].push_back(id);
    };
    auto read_done = [&](TensorId t) {
        const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
        if (uses[st] > 0 && --uses[st] == 0) em_.unref(in.gid[st]);
    };

    for (std::size_t o = 0; o < b.ops.size(); ++o) {
        const Op& op = b.ops[o];
        if (p.skip[o]) {
            if (p.site_of_op[o] < 0) continue;
            // Fused SDPA/flash attention: output + fp32 logsumexp [b, heads, s];
            // backward needs 16-bit q, k, v, the output and the logsumexp.
            const AttentionSite& s = b.attention[static_cast<std::size_t>(p.site_of_op[o])];
            const auto ost = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.out)]);
            in.gid[ost] = em_.alloc(p.bytes[ost], p.label[ost]);
            if (ost == out_st) em_.ref(in.gid[ost]);
            const bool rg = grad_mode && in.rg[static_cast<std::size_t>(s.q)];
            in.rg[static_cast<std::size_t>(s.out)] = rg ? 1 : 0;
            workspace(false);
            if (rg && keep_saves) {
                for (auto t : {s.q, s.k, s.v}) {
                    const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
                    if (c.autocast && p.dt[st] != c.lowered)
                        in.saves[o].push_back(em_.alloc(tensor_bytes(p, st, c.lowered, c), p.label[st]));
                    else
                        keep(o, in.gid[st]);
                }
                keep(o, in.gid[ost]);
                // LitGPT: the saved v is a view of the fused QKV output (its q and k parts too).
                if (qkv_view_keeps_fused(b, s, c)) {
                    const auto vst = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.v)]);
                    in.saves[o].push_back(em_.alloc(p.bytes[vst] * 2, em_.label(b.name + ".attention.fused_qkv (q, k parts kept by v)")));
                }
                // fp32 logsumexp [b, heads, s], heads split over tp.
                // (the queries' length: the decoder's for a decoder's attention, query_len)
                const bool dec_q = b.tensors[static_cast<std::size_t>(s.q)].axis != SeqAxis::Main && c.decoder_seq > 0;
                in.saves[o].push_back(em_.alloc(dtype_bytes(DType::F32, (checked_mul(checked_mul(c.batch, s.heads), dec_q ? c.decoder_seq : p.seq) + c.tp - 1) /
                                                                            std::max<std::int64_t>(1, c.tp)),
                                                plan_label(PlanLabel::Logsumexp, p)));
            }
            if (rg && sac) {
                em_.ref(in.gid[ost]);
                in.extra.push_back(in.gid[ost]);
                in.extra.push_back(em_.alloc(dtype_bytes(DType::F32, (checked_mul(checked_mul(c.batch, s.heads), p.seq) + c.tp - 1) / std::max<std::int64_t>(1, c.tp)),
                                             plan_label(PlanLabel::Logsumexp, p)));
            }
            for (auto t : {s.q, s.k, s.v}) read_done(t);
            if (uses[ost] == 0) em_.unref(in.gid[ost]);
            continue;
        }
        bool any_in_rg = false;
        for (auto t : op.inputs) any_in_rg = any_in_rg || in.rg[static_cast<std::size_t>(t)];
        const bool base_tr = grad_mode && job_.train && !job_.lora && p.has_weight[o];
        const bool lora = grad_mode && p.lora[o];
        const bool any_grad = grad_mode && (any_in_rg || base_tr || lora);
        std::vector<std::size_t> unread;
        const std::int64_t dq = em_.alloc(job_.dequant_in_forward ? p.dequant[o] : Bytes(0), p.label[static_cast<std::size_t>(op.outputs.empty() ? 0 : op.outputs.front())]);
        for (auto t : op.outputs) {
            const auto ti = static_cast<std::size_t>(t);
            in.rg[ti] = (any_grad && op.kind != OpKind::Input) ? 1 : 0;
            const auto st = static_cast<std::size_t>(p.storage[ti]);
            if (st != ti) continue;  // a view or same-dtype cast: no new storage
            if (op.kind == OpKind::Input && !b.tensors[ti].shared_key.empty()) {
                auto it = shared_.find(b.tensors[ti].shared_key);
                if (it != shared_.end()) {
                    // Not a new input: the tensor an earlier block provided.
                    in.gid[st] = it->second.first;
                    in.rg[ti] = it->second.second ? 1 : 0;
                    em_.ref(in.gid[st]);
                    if (uses[st] == 0) unread.push_back(st);
                    continue;
                }
            }
            in.gid[st] = em_.alloc(p.bytes[st], p.label[st]);
            // Selective recompute: the checkpointed attention core keeps its
            // inputs q, k, v for the backward (taken as they are made, before
            // their last forward read would free them).
            if (selective && keep_saves && grad_mode && any_grad)
                for (const auto& site : b.attention)
                    for (auto qkv : {site.q, site.k, site.v})
                        if (static_cast<std::size_t>(p.storage[static_cast<std::size_t>(qkv)]) == st &&
                            std::find(in.extra.begin(), in.extra.end(), in.gid[st]) == in.extra.end()) {
                            em_.ref(in.gid[st]);
                            in.extra.push_back(in.gid[st]);
                        }
            if (st == out_st) em_.ref(in.gid[st]);
            if (uses[st] == 0) unread.push_back(st);
            if (op.kind == OpKind::Input && grad_mode) {
                // The training loop's `batch` variable holds the inputs until the
                // next batch replaces it.
                em_.ref(in.gid[st]);
                batch_refs_.push_back(in.gid[st]);
                release_previous_batch();
            }
        }
        em_.unref(dq);
        if (sac && p.sac_kept[o]) {
            const auto id = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.outputs.front())])];
            em_.ref(id);
            in.extra.push_back(id);
        }
        if (grad_mode && is_output_head(op) &&
            !op.outputs.empty()) {
            // `logits` is a local of the model's forward: alive through the loss,
            // dropped when forward returns (the Trainer keeps only the loss);
            // loops that bind it (nanoGPT's `logits, loss = model(X, Y)`) hold
            // it until the next micro-batch rebinds it.
            const auto id = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.outputs.front())])];
            em_.ref(id);
            if (job_.framework.logits == LogitsLifetime::Kept) result_refs_.push_back(id);
            else forward_refs_.push_back(id);
        }
        if (fp8_new && (!p.fp8_copies[o].empty() || !p.fp8_state[o].empty())) {
            const int stream = em_.stream;
            em_.stream = 0;
            const std::string at = b.name + "." + op.name;
            for (const Bytes& a : p.fp8_state[o]) em_.alloc(a, em_.label(at + " (fp8 scaling state)"));
            for (const Bytes& a : p.fp8_copies[o]) em_.alloc(a, em_.label(at + " (fp8 weight copy)"));
            em_.stream = stream;
        }
        if (is_matmul(op.kind)) workspace(false);
        // Autocast caches a 16-bit copy of each fp32 weight for the forward; the
        // matmul keeps it for backward when its input needs a gradient.
        if (grad_mode && p.weight_cast[o] > Bytes(0)) {
            const auto w = em_.alloc(p.weight_cast[o], p.weight_cast_label[o]);
            if (keep_saves && any_in_rg) in.saves[o].push_back(w);
            else if (p.weight_cast_uncached[o]) em_.unref(w);
            else dropped_casts_.push_back(w);
        }
        const bool record = any_grad && keep_saves && !(selective && (op.flags & kAttnCore));
        if (record)
            for (const SavedRef& s : op.saved) {
                if (s.only_for_param_grad && !base_tr) continue;
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.tensor)]);
                if (s.autocast_cast && c.autocast && p.dt[st] != c.lowered)
                    in.saves[o].push_back(em_.alloc(tensor_bytes(p, st, c.lowered, c), p.label[st]));
                else
                    keep(o, in.gid[st]);
            }
        // A frozen quantized linear keeping its input (bitsandbytes MatMul8bitLt,
        // MatMul4Bit before 0.43.2; activations.cpp quantized_saves_input): the
        // input itself, or the 4-bit layer's cast of it to the compute dtype.
        if (record && any_in_rg && !base_tr && p.quant_saves[o]) {
            const auto x = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.inputs.front())]);
            std::int64_t id = 0;
            if (job_.quant == Quant::Int8 || p.dt[x] == c.lowered) {
                id = in.gid[x];
                keep(o, id);
            } else {
                id = em_.alloc(tensor_bytes(p, x, c.lowered, c), p.label[x]);
                in.saves[o].push_back(id);
            }
            // MatMul4Bit before 0.43.2 keeps it as a context attribute
            // (ctx.tensors), which backward does not free: it lives with the
            // graph, and a loop holding the logits holds the graph until the
            // next micro-batch rebinds them (activations.hpp quant_held).
            if (job_.quant != Quant::Int8 && !recomputing_ && job_.framework.logits == LogitsLifetime::Kept) {
                em_.ref(id);
                result_refs_.push_back(id);
            }
        }
        if (lora) {
            // PEFT lora.Linear (activations.cpp adapter_input): x cast to the
            // adapters' dtype (kept by the layer's local `x` until it returns),
            // dropout's output and bool mask, lora_A's saved input (x itself, its
            // own autocast cast, or the cast / dropped tensor); lora_B keeps A's
            // [rows, r] output; B's output is added in.
            // A fused-QKV adapter (LitGPT, shared_adapter_input) reuses the
            // first one's saved input (its adapter_input is empty).
            const AdapterInput& ai = p.lora_in[o];
            const std::int32_t il = em_.label(b.name + "." + op.name + ".lora_input");
            const std::int64_t cv = em_.alloc(ai.convert, il);
            std::int64_t dropped = 0;
            if (ai.mask > Bytes(0)) {
                dropped = em_.alloc(ai.dropped, il);
                const auto m = em_.alloc(ai.mask, em_.label(b.name + "." + op.name + ".lora_dropout.mask"));
                if (keep_saves) in.saves[o].push_back(m);
                else em_.unref(m);
            }
            const std::int64_t share = p.lora_share[o];
            if (share >= 0) {
                if (keep_saves && in.lora_input[static_cast<std::size_t>(share)] != 0) keep(o, in.lora_input[static_cast<std::size_t>(share)]);
            } else if (ai.saves_x) {
                if (keep_saves) keep(o, in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.inputs.front())])]);
            } else if (ai.cast) {
                const auto cc = em_.alloc(ai.copy, il);
                if (keep_saves) {
                    in.saves[o].push_back(cc);
                    in.lora_input[o] = cc;
                } else {
                    em_.unref(cc);
                }
            } else if (keep_saves) {
                in.lora_input[o] = dropped != 0 ? dropped : cv;
                keep(o, in.lora_input[o]);
            }
            const auto a = em_.alloc(p.lora_a[o], em_.label(b.name + "." + op.name + ".lora_A"));
            if (keep_saves) in.saves[o].push_back(a);
            else em_.unref(a);
            em_.unref(dropped);  // dropout's output: a temporary of the expression
            if (qkv_lora_zero_pad(b, o, c)) {
                // LoRAQKVLinear.zero_pad: index_copy_ keeps B's output (its source).
                const auto zb = em_.alloc(p.lora_b[o], em_.label(b.name + "." + op.name + ".lora_B (index_copy_ source)"));
                if (keep_saves) in.saves[o].push_back(zb);
                else em_.unref(zb);
            } else {
                em_.transient(p.lora_b[o], em_.label(b.name + "." + op.name + ".lora_B"));
            }
            em_.unref(cv);
        }
        if (op.kind == OpKind::Loss && grad_mode) {
            // `loss = loss_fn(out)`: a 4-byte fp32 scalar the loop keeps until the
            // next iteration rebinds it; a custom loop's `out = model(x)` likewise
            // (HF's Trainer drops the outputs and keeps the loss).
            result_refs_.push_back(em_.alloc(Bytes(4), em_.label("loss")));
            if (!g_.transformer && !g_.loss_in_forward && !op.inputs.empty()) {
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.inputs.front())]);
                em_.ref(in.gid[st]);
                result_refs_.push_back(in.gid[st]);
            }
        }
        for (auto st : unread) em_.unref(in.gid[st]);
        for (auto t : op.inputs) read_done(t);
    }
    if (gathered != 0) {
        if (job_.layout.cfg.fsdp == Fsdp::GradOp) in.extra.push_back(gathered);  // kept until backward (SHARD_GRAD_OP)
        else em_.unref(gathered);  // resharded after forward
    }
    return in;
}

void StepBuilder::param_grad(Bytes bytes, std::int32_t label, const std::vector<std::vector<std::int64_t>>& step) {
    // Callers pass their block's activation-gradient label; parameter
    // gradients get their own so that reports can tell them apart.
    (void)label;
    // Megatron's fp32 main-gradient buffer exists from the start; weight
    // gradients accumulate into it in place (gradient_accumulation_fusion).
    if (grad_buffer_) return;
    if (param_grad_label_ < 0) param_grad_label_ = em_.label("parameter gradients");
    label = param_grad_label_;
    const auto key = std::make_pair(chunk_, grad_key_++);
    std::int64_t& slot = grads_[key];
    if (slot == 0) {
        if (job_.amp && job_.tdt == DType::F32) {
            // The matmul yields a 16-bit gradient; autocast's cast backward makes it fp32.
            const auto half = em_.alloc(Bytes(bytes.count() / 2), label);
            slot = em_.alloc(bytes, label);
            em_.unref(half);
        } else {
            slot = em_.alloc(bytes, label);
        }
    } else {
        // Accumulation: the new gradient is computed, added in place and freed.
        em_.transient(bytes, label);
    }
    // Optimizer in backward: the post-accumulate-grad hook steps the tensor(s)
    // and zero_grad(set_to_none=True) frees the gradient (features.hpp).
    if (inbwd_ && !step.empty()) {
        for (const auto& shape : step) step_in_backward(shape);
        em_.unref(slot);
        slot = 0;
    }
}

std::vector<std::int64_t> StepBuilder::param_state_shape(std::size_t block, std::int32_t param) const {
    const std::int64_t tp = std::max<std::int64_t>(1, job_.layout.cfg.tp);
    for (const auto& rt : tensors_)
        if (rt.block == static_cast<std::int32_t>(block) && rt.param == param) return state_tensor(g_, rt, shard_opt_, tp).shape.to_vector();
    return {};
}

// One tensor's update in its hook: states created by its first step
// (torch.optim _init_group; paged parts outside the allocator), then the
// update's temporaries as optimizer_step() makes them for every tensor.
void StepBuilder::step_in_backward(const std::vector<std::int64_t>& shape) {
    const Optimizer o = job_.req.optimizer;
    const TrainTensor one{shape, 1};
    if (state_label_ < 0) {
        state_label_ = em_.label(std::string("optimizer state (") + to_string(o) + ")");
        temp_label_ = em_.label(std::string("optimizer temporary (") + to_string(job_.opt_impl) + ")");
    }
    if (em_.step == 0) states_.push_back(em_.alloc(optimizer_bytes(o, one, job_.state_dt) - paged_state_bytes(o, one), state_label_));
    const std::int64_t e = one.numel();
    const DType sd = job_.state_dt;
    std::int64_t master = 0;
    if (job_.master > Bytes(0) && job_.tdt != DType::F32) master = em_.alloc(dtype_bytes(DType::F32, e), temp_label_);
    const bool adam_like = o == Optimizer::Adam || o == Optimizer::AdamW || o == Optimizer::Lion;
    if (adam_like && job_.opt_impl == OptimizerImpl::Foreach) {
        em_.transient(dtype_bytes(sd, e), temp_label_);
    } else if ((adam_like && job_.opt_impl == OptimizerImpl::ForLoop) || o == Optimizer::Adafactor) {
        const DType dt = o == Optimizer::Adafactor ? DType::F32 : sd;
        const auto a = em_.alloc(dtype_bytes(dt, e), temp_label_);
        const auto b = em_.alloc(dtype_bytes(dt, e), temp_label_);
        em_.unref(a);
        em_.unref(b);
    }
    em_.unref(master);
}

std::int64_t StepBuilder::backward(Instance& in, std::int64_t out_grad, Bytes next_gather) {
    const BlockPlan& p = *in.plan;
    const Block& b = *p.blk;
    const ActivationContext& c = job_.actx;
    const bool selective = c.recompute == Recompute::Selective && c.attention != Attention::Flash;
    const std::size_t n = b.tensors.size();
    std::vector<std::int64_t> grad(n, 0);
    const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(b.output)]);
    const auto st0 = static_cast<std::size_t>(p.storage[0]);
    grad[out_st] = out_grad;
    bool recomputed_core = false;
    const std::int32_t glabel = plan_label(PlanLabel::ActivationGradients, *in.plan);
    const auto pi = static_cast<std::size_t>(in.plan - plans_.data());
    std::int64_t gathered = 0, full_grads = 0;
    std::vector<std::int64_t> tied_done;  // tied-weight gradients folded into this block's reduce-scatter
    // Gradients made op by op (unsharded: no sharding, or FSDP under no_sync),
    // else as the layer's one unsharded buffer reduce-scattered at its end.
    const bool per_op = !shard_grads_ || no_sync_;
    const std::size_t first_key = grad_key_;
    if (gather_ && job_.layout.cfg.fsdp != Fsdp::GradOp) gathered = gather(pi, next_gather);
    if (shard_grads_ && !no_sync_ && block_grad_[pi] > Bytes(0)) full_grads = em_.alloc(block_grad_[pi], glabel);
    if (per_op && block_flat_[pi] > Bytes(0)) {
        // FSDP1 + LoRA: the flat parameter's gradient over the frozen weights.
        if (param_grad_label_ < 0) param_grad_label_ = em_.label("parameter gradients");
        std::int64_t& slot = grads_[std::make_pair(chunk_, grad_key_++)];
        if (slot == 0) slot = em_.alloc(block_flat_[pi], param_grad_label_);
        else em_.transient(block_flat_[pi], param_grad_label_);
    }

    auto grad_for = [&](TensorId t) {
        const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
        if (!in.rg[static_cast<std::size_t>(t)] && st != st0) return;
        if (st == st0 && !in.input_rg) return;
        const std::string& key = b.tensors[st].shared_key;
        if (st != st0 && !key.empty()) {
            // Gradients of a shared tensor accumulate across the blocks that read it.
            if (shared_grad_[key] == 0) shared_grad_[key] = em_.alloc(p.bytes[st], glabel);
            return;
        }
        if (grad[st] == 0) grad[st] = em_.alloc(p.bytes[static_cast<std::size_t>(t)], glabel);
    };

    for (std::size_t o = b.ops.size(); o-- > 0;) {
        const Op& op = b.ops[o];
        if (p.skip[o] && p.site_of_op[o] < 0) continue;
        if (p.skip[o]) {
            const AttentionSite& s = b.attention[static_cast<std::size_t>(p.site_of_op[o])];
            const auto ost = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.out)]);
            if (grad[ost] != 0) {
                // Flash backward: fp32 dq accumulator, then dq, dk, dv.
                em_.transient(tensor_bytes(p, static_cast<std::size_t>(s.q), DType::F32, c), glabel);
                for (auto t : {s.q, s.k, s.v}) grad_for(t);
                em_.unref(grad[ost]);
                grad[ost] = 0;
            }
            for (auto id : in.saves[o]) em_.unref(id);
            in.saves[o].clear();
            continue;
        }
        if (selective && (op.flags & kAttnCore) && !recomputed_core) {
            // Selective recompute: rebuild the attention core's saved tensors.
            recomputed_core = true;
            for (std::size_t o2 = 0; o2 < b.ops.size(); ++o2) {
                if (!(b.ops[o2].flags & kAttnCore)) continue;
                for (const SavedRef& s : b.ops[o2].saved) {
                    const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.tensor)]);
                    const bool produced_in_core = std::any_of(b.ops.begin(), b.ops.end(), [&](const Op& x) {
                        return (x.flags & kAttnCore) &&
                               std::find(x.outputs.begin(), x.outputs.end(), static_cast<TensorId>(st)) != x.outputs.end();
                    });
                    if (produced_in_core) in.saves[o2].push_back(em_.alloc(p.bytes[st], p.label[st]));
                    else {
                        em_.ref(in.gid[st]);
                        in.saves[o2].push_back(in.gid[st]);
                    }
                }
            }
        }
        if (op.kind == OpKind::Loss && p.loss_chunks > 1) {
            // A per-chunk loss (Op::chunks): autograd runs each chunk's loss
            // backward in turn, making that chunk's gradient and releasing that
            // chunk's saved tensors (the engine frees a node's saved variables
            // once it has run, torch/csrc/autograd/engine.cpp release_variables),
            // so the saves and the gradients overlap by one chunk. Modelled as
            // one chunk's gradients in flight over everything saved, then the
            // saves released and the logits' gradient made whole (the chunks'
            // gradients, which the output projection reads).
            em_.transient(p.loss_chunk_grad, glabel);
            for (std::size_t o2 = p.head_op + 1; o2 <= o; ++o2) {
                for (auto id : in.saves[o2]) em_.unref(id);
                in.saves[o2].clear();
            }
            grad_for(b.ops[p.head_op].outputs.front());
            continue;
        }
        bool has_out_grad = false;
        for (auto t : op.outputs) has_out_grad = has_out_grad || grad[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)])] != 0;
        const bool root = op.kind == OpKind::Loss;
        if (has_out_grad || root) {
            const bool base_tr = job_.train && !job_.lora && p.has_weight[o];
            const std::int64_t dq = em_.alloc(p.dequant[o], glabel);
            const std::int64_t out_grad_id =
                op.outputs.empty() ? 0 : grad[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.outputs.front())])];
            // An in-place op that computes (relu_, mul_: a traced graph's aliased
            // output): one storage forward, but its backward makes a new gradient
            // for the input (threshold_backward returns a new tensor,
            // derivatives.yaml) and then the output's gradient is released.
            std::int64_t inplace_out_grad = 0;
            if (op.kind == OpKind::Activation || op.kind == OpKind::Mul || op.kind == OpKind::Elementwise)
                for (auto t : op.outputs) {
                    const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
                    for (auto i2 : op.inputs)
                        if (static_cast<std::size_t>(p.storage[static_cast<std::size_t>(i2)]) == st && grad[st] != 0 && inplace_out_grad == 0) {
                            inplace_out_grad = grad[st];
                            grad[st] = 0;
                        }
                }
            for (auto t : op.inputs) {
                const auto ti = static_cast<std::size_t>(t);
                if (p.dt[ti] == DType::I64 || p.dt[ti] == DType::Bool || p.dt[ti] == DType::F8_E4M3) continue;
                const auto st = static_cast<std::size_t>(p.storage[ti]);
                if ((op.flags & kGradViews) && out_grad_id != 0 && grad[st] == 0 && in.rg[ti] && st != st0 &&
                    b.tensors[st].shared_key.empty()) {
                    // A view of the output's gradient: no new memory; it keeps that buffer alive.
                    em_.ref(out_grad_id);
                    grad[st] = out_grad_id;
                    continue;
                }
                grad_for(t);
            }
            em_.unref(inplace_out_grad);
            em_.unref(dq);
            if (is_matmul(op.kind)) workspace(true);
            if (base_tr && p.loss_chunks > 1 && o == p.head_op) {
                // A per-chunk loss projects per chunk too (torchtune's chunked
                // output / LinearCrossEntropyLoss, LitGPT's lm_head_chunk_size):
                // the weight's gradient contributions summed before AccumulateGrad
                // (model/rewrite.hpp chunked_head_grad_transient).
                Bytes w = p.tied_grad[o];
                for (const Bytes& pg : p.param_grads[o]) w += pg;
                em_.transient(chunked_head_grad_transient(w, job_.amp && job_.tdt == DType::F32), glabel);
            }
            if (base_tr && op.params.empty() && op.kind == OpKind::Linear) {
                if (tied_owned_) {
                    // The last pipeline stage's own copy of the tied embedding.
                    if (per_op) param_grad(p.tied_grad[o], glabel);
                } else {
                    // A tied weight (lm_head sharing the embedding): its gradient waits
                    // for the owner's contribution.
                    tied_grads_.emplace_back(p.tied_grad[o], em_.alloc(p.tied_grad[o], glabel));
                }
            }
            if (base_tr && !per_op && !tied_grads_.empty())
                // Sharded gradients: the owner's contribution goes into the layer's
                // unsharded gradient, reduce-scattered below with the tied one.
                for (const Bytes& pg : p.param_grads[o]) {
                    auto tied = std::find_if(tied_grads_.begin(), tied_grads_.end(), [&](const auto& t) { return t.first == pg; });
                    if (tied == tied_grads_.end()) continue;
                    tied_done.push_back(tied->second);
                    tied_grads_.erase(tied);
                }
            if (base_tr && per_op)
                for (std::size_t k = 0; k < p.param_grads[o].size(); ++k) {
                    const Bytes& pg = p.param_grads[o][k];
                    std::vector<std::vector<std::int64_t>> step;
                    if (inbwd_) step.push_back(param_state_shape(pi, p.param_index[o][k]));
                    auto tied = std::find_if(tied_grads_.begin(), tied_grads_.end(), [&](const auto& t) { return t.first == pg; });
                    if (tied != tied_grads_.end()) {
                        // AccumulateGrad adds the second contribution out of place.
                        const auto contrib = em_.alloc(pg, glabel);
                        param_grad(pg, glabel, step);
                        em_.unref(contrib);
                        em_.unref(tied->second);
                        tied_grads_.erase(tied);
                    } else {
                        param_grad(pg, glabel, step);
                    }
                }
            if (p.lora[o]) {
                em_.transient(p.lora_a[o], glabel);
                if (per_op)
                    for (std::size_t k = 0; k < p.lora_grads[o].size(); ++k) {
                        // Adapters in pairs: A [r, in], then B [out, r].
                        const Op& lop = b.ops[o];
                        std::vector<std::vector<std::int64_t>> step;
                        if (inbwd_)
                            step.push_back(k % 2 == 0 ? std::vector<std::int64_t>{c.lora_rank, lop.in_features}
                                                      : std::vector<std::int64_t>{lop.out_features, c.lora_rank});
                        param_grad(p.lora_grads[o][k], glabel, step);
                    }
            }
            // Gradients of this op's outputs are complete and consumed.
            for (auto t : op.outputs) {
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
                bool also_input = false;
                for (auto i2 : op.inputs) also_input = also_input || static_cast<std::size_t>(p.storage[static_cast<std::size_t>(i2)]) == st;
                if (also_input || grad[st] == 0) continue;
                em_.unref(grad[st]);
                grad[st] = 0;
            }
        }
        for (auto id : in.saves[o]) em_.unref(id);
        in.saves[o].clear();
    }
    release_extra(in);
    if (full_grads != 0) {
        // Reduce-scatter: each rank keeps its shard of the layer's gradients;
        // with the optimizer in backward fully_shard then runs each sharded
        // parameter's hooks (features.hpp).
        std::vector<std::vector<std::int64_t>> step;
        if (inbwd_) {
            const std::int64_t tp = std::max<std::int64_t>(1, job_.layout.cfg.tp);
            for (const auto& rt : tensors_) {
                if (!rt.trainable || rt.block != static_cast<std::int32_t>(pi)) continue;
                std::int64_t inst = 0;
                for (auto v : par_->instance_stage[pi]) inst += (v % pp_) == rank_ ? 1 : 0;
                for (std::int64_t k = 0; k < rt.copies / std::max<std::int64_t>(1, inst); ++k) step.push_back(state_tensor(g_, rt, shard_opt_, tp).shape.to_vector());
            }
        }
        param_grad(block_grad_[pi].ceil_div(job_.layout.shard), glabel, step);
        em_.unref(full_grads);
    } else if (shard_grads_ && no_sync_ && final_mb_ && block_grad_[pi] > Bytes(0)) {
        // no_sync's last micro-batch: the accumulated unsharded gradients are
        // reduce-scattered into this rank's slice, then freed. Megatron's fp32
        // main-gradient buffer is that slice (as param_grad's reduce-scatter
        // without no_sync lands in it): nothing more is allocated.
        if (!grad_buffer_) {
            if (param_grad_label_ < 0) param_grad_label_ = em_.label("parameter gradients");
            std::int64_t& slot = grads_[std::make_pair(-1 - chunk_, slice_key_++)];
            const Bytes slice = block_grad_[pi].ceil_div(job_.layout.shard);
            if (slot == 0) slot = em_.alloc(slice, param_grad_label_);
            else em_.transient(slice, param_grad_label_);
        }
        for (std::size_t k = first_key; k < grad_key_; ++k) {
            auto it = grads_.find(std::make_pair(chunk_, k));
            if (it == grads_.end() || it->second == 0) continue;
            em_.unref(it->second);
            it->second = 0;
        }
    }
    for (auto id : tied_done) em_.unref(id);
    em_.unref(gathered);
    std::int64_t input_grad = grad[st0];
    const std::string& provides = b.tensors[0].shared_key;
    if (!provides.empty()) {
        // The provider hands the accumulated gradient of its readers upstream.
        auto it = shared_grad_.find(provides);
        if (it != shared_grad_.end() && it->second != 0) {
            em_.unref(input_grad);
            input_grad = it->second;
            it->second = 0;
        }
        auto sh = shared_.find(provides);
        if (sh != shared_.end()) {
            em_.unref(sh->second.first);
            shared_.erase(sh);
        }
    }
    for (std::size_t i = 0; i < n; ++i)
        if (i != st0 && grad[i] != 0) em_.unref(grad[i]);
    return input_grad;
}

}  // namespace gpumem::sim::detail
