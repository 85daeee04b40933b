// Per-GPU memory of every pipeline rank under a layout (the analytic view).
//
// For each rank: its parameter tensors (rank_tensors: tp/ep/pp split, dp
// shards, tied copies, adapters), the activations of each of its model chunks
// for one micro-batch (saved_activations over the chunk's block instances,
// scaled for tp/sp/cp), the micro-batches its pipeline schedule keeps in
// flight (pipeline_schedule), and two phase peaks:
//
//   forward/backward  W + M + O + G_kept + buffers + activations in flight
//                     + the temporaries of the forward/backward
//   optimizer step    W + M + O + G + buffers + the step's temporaries over
//                     this rank's own (sharded) tensors
//
// W weights, M fp32 master weights, O optimizer states, G gradients (G_kept:
// kept between micro-batches, or always for Megatron's fp32 main-gradient
// buffer). The step simulation (sim/step_*.cpp) runs the same rank from the same
// tensor list and schedule event by event; tests/invariants_test.cpp checks on
// a generated grid of jobs that both agree.
#include "gpumem/memory/parallel.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <tuple>

#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/blocks.hpp"
#include "gpumem/memory/features.hpp"
#include "gpumem/memory/fp8.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/graph.hpp"
#include "gpumem/model/rewrite.hpp"

namespace gpumem {

namespace {

Bytes scale_bytes(Bytes b, double f) { return Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(b.count()) * f))); }

// The model states of one rank from its tensors (the sums parallel_memory's
// rank loop reads): weights, gradients, fp32 master weights, optimizer states
// (paged ones apart), Transformer Engine's FP8 weight copies, the allocator
// rounding of these persistent blocks, and the optimizer-in-backward's step
// in flight at the embedding, the layers and the output layer.
struct RankStates {
    Bytes W, G, M, O, P, F8, round_states, round_grads, inbwd_first, inbwd_tmp, inbwd_head;
    std::int64_t opt_elems = 0, largest_opt = 0, params = 0;
    // Where a tensor's optimizer-in-backward step is in flight, by its block:
    // the embedding (first block), a transformer's output layer (last block)
    // or the layers.
    Bytes& inbwd_slot(const ModelGraph& g, std::int32_t block) {
        if (block == 0) return inbwd_first;
        if (g.transformer && block >= 0 && static_cast<std::size_t>(block) + 1 == g.blocks.size()) return inbwd_head;
        return inbwd_tmp;
    }
};

// How the job's layout holds the states: gradients sharded over dp
// (ZeRO-2/3, FSDP), optimizer states sharded (ZeRO >= 1, FSDP, Megatron's
// distributed optimizer), optimizer states offloaded, the optimizer stepped
// in backward (memory/features.hpp). One definition for parallel_memory and
// model_states_floor.
struct StateFlags {
    bool shard_grads, shard_opt, offload_opt, inbwd;
};
StateFlags state_flags(const Job& job) {
    const Layout& lay = job.layout;
    const ParallelConfig& c = lay.cfg;
    return {lay.dp > 1 && (c.zero >= 2 || c.fsdp != Fsdp::None), c.zero >= 1 || c.fsdp != Fsdp::None || c.distributed_optimizer,
            c.offload_optimizer != Offload::None, in_backward_optimizer(job)};
}

RankStates rank_states(const ModelGraph& g, const Job& job, const std::vector<RankTensor>& tensors, const StateFlags& flags) {
    RankStates st;
    const bool shard_grads = flags.shard_grads, shard_opt = flags.shard_opt, offload_opt = flags.offload_opt, inbwd = flags.inbwd;
    const std::int64_t t = std::max<std::int64_t>(1, job.layout.cfg.tp);
    // (Plain references: clang before 16 cannot capture structured bindings in the lambda below.)
    Bytes &W = st.W, &G = st.G, &M = st.M, &O = st.O, &P = st.P, &F8 = st.F8, &round_states = st.round_states, &round_grads = st.round_grads;
    std::int64_t &opt_elems = st.opt_elems, &largest_opt = st.largest_opt, &params = st.params;
    auto rounding = [](Bytes each, std::int64_t n) { return (allocator_block(each) - each) * n; };
    for (const auto& rt : tensors) {
        W += rt.stored * rt.copies;
        round_states += rounding(rt.stored, rt.copies);
        if (!rt.adapter) params = checked_add(params, checked_mul(rt.elems, rt.copies));
        if (job.train && rt.flat_grad > Bytes(0)) G += (shard_grads ? rt.flat_grad.ceil_div(rt.shard) : rt.flat_grad) * rt.copies;
        if (!rt.trainable || !job.train) continue;
        const std::int64_t ge = rt.sharded_elems(shard_grads), oe = rt.sharded_elems(shard_opt);
        G += dtype_bytes(job.tdt, ge) * rt.copies;
        if (!shard_grads) round_grads += rounding(dtype_bytes(job.tdt, ge), rt.copies);
        if (offload_opt) continue;
        if (job.master > Bytes(0)) {
            M += dtype_bytes(DType::F32, oe) * rt.copies;
            round_states += rounding(dtype_bytes(DType::F32, oe), rt.copies);
        }
        TrainTensor tt = state_tensor(g, rt, shard_opt, t);
        // Paged optimizers: the managed-memory part is outside the allocator.
        const Bytes paged = paged_state_bytes(job.req.optimizer, tt);
        O += optimizer_bytes(job.req.optimizer, tt, job.state_dt) - paged;
        P += paged;
        tt.count = 1;  // one copy of the tensor from here on
        round_states += rounding(optimizer_bytes(job.req.optimizer, tt, job.state_dt) - paged_state_bytes(job.req.optimizer, tt), rt.copies);
        // One tensor's gradient and update in flight (unsharded gradients:
        // its own; sharded: per layer below).
        if (inbwd && !shard_grads) {
            Bytes& slot = st.inbwd_slot(g, rt.tied_copy ? static_cast<std::int32_t>(g.blocks.size()) - 1 : rt.block);
            slot = max(slot, in_backward_step(job, tt, dtype_bytes(job.tdt, ge), job.amp && job.tdt == DType::F32));
        }
        opt_elems = checked_add(opt_elems, checked_mul(oe, rt.copies));
        largest_opt = std::max(largest_opt, oe);
    }
    // Transformer Engine's FP8 weight workspaces and delayed-scaling state
    // (memory/fp8.hpp): made by each linear's first forward and kept across
    // micro-batches and steps, like a model state.
    for (const auto& rt : tensors) {
        if (rt.block < 0 || rt.param < 0 || rt.adapter || rt.tied_copy) continue;
        const Fp8WeightAllocs fa = fp8_weight_allocs(job, g.blocks[static_cast<std::size_t>(rt.block)].params[static_cast<std::size_t>(rt.param)], rt.shape);
        for (const auto* part : {&fa.copies, &fa.state})
            for (const Bytes& a : *part) {
                F8 += a * rt.copies;
                round_states += rounding(a, rt.copies);
            }
    }
    return st;
}

// Ranks that hold the same block instances, and are both or neither the last
// rank, hold the same tensors and states (rank_tensors depends on the rank
// only through that flag): the ranks between a pipeline's first and last are
// computed once. At most kMaxKinds kinds are kept (an even split has three;
// an uneven --pp-layers may make every rank different), so the lookups stay
// O(pp). `stage`: where the kind's tensors are (parallel_memory's stage_tensors).
class RankKinds {
public:
    struct Kind {
        std::vector<std::int64_t> inst;
        bool last = false;
        std::size_t stage = 0;
        RankStates states;
    };
    void clear() { used_ = 0; }
    [[nodiscard]] const Kind* find(const std::vector<std::int64_t>& inst, bool last) const {
        for (std::size_t k = 0; k < used_; ++k)
            if (kinds_[k].last == last && kinds_[k].inst == inst) return &kinds_[k];
        return nullptr;
    }
    void add(const std::vector<std::int64_t>& inst, bool last, std::size_t stage, const RankStates& states) {
        if (used_ >= kMaxKinds) return;
        if (used_ == kinds_.size()) kinds_.emplace_back();
        Kind& k = kinds_[used_++];
        k.inst.assign(inst.begin(), inst.end());
        k.last = last;
        k.stage = stage;
        k.states = states;
    }

private:
    static constexpr std::size_t kMaxKinds = 8;
    std::vector<Kind> kinds_;  // the first used_ are the current call's (storage kept between calls)
    std::size_t used_ = 0;
};

}  // namespace

InferencePieces inference_pieces(const ModelGraph& g, const Job& job) {
    InferencePieces ip;
    const EstimateRequest& req = job.req;
    ip.total_len = checked_add(job.seq, req.gen_len);
    ip.kv_dtype = req.kv_dtype.value_or(job.lowered);
    const DType lowered = job.lowered;
    if (g.transformer) {
        const TransformerDims& td = *g.transformer;
        ip.kv_cache = dtype_bytes(ip.kv_dtype, checked_mul(checked_mul(td.kv_elements_per_token, req.batch), ip.total_len)) +
                      td.hf_linear_state_bytes(req.batch, 1, ip.kv_dtype) * (td.layers - td.kv_layers());
        const std::int64_t bs = checked_mul(req.batch, job.seq);
        if (req.attention == Attention::Eager)
            // scores (lowered) + fp32 softmax + cast back, per layer, freed after it
            ip.attention = Bytes(checked_mul(checked_mul(checked_mul(bs, job.seq), td.heads), 2 * dtype_bits(lowered) / 8 + 4));
        ip.mlp = dtype_bytes(lowered, checked_mul(checked_mul(bs, std::max<std::int64_t>(td.intermediate, 1)),
                                                  td.experts > 0 ? 3 * std::max<std::int64_t>(td.experts_per_token, 1) : 3));
        ip.hidden = dtype_bytes(lowered, checked_mul(bs, td.hidden)) * 4;
        // Generation computes logits for the last position only (logits_to_keep=1), upcast to fp32.
        ip.logits_fp32 = dtype_bytes(DType::F32, checked_mul(req.batch, td.vocab));
        ip.logits = dtype_bytes(lowered, checked_mul(req.batch, td.vocab)) + ip.logits_fp32;
    } else if (g.params_only == 0) {
        ActivationContext c = job.actx;
        const ActivationResult act = saved_activations(g, c);
        for (const auto& b : act.blocks) ip.working_set = max(ip.working_set, b.working_set);
    }
    return ip;
}

ParallelResult parallel_memory(const ModelGraph& g_in, const Job& job) { return parallel_memory(g_in, job, nullptr); }

ParallelResult parallel_memory(const ModelGraph& g_in, const Job& job, const ActivationResult* whole_in, ActivationMemo* memo_in) {
    const ModelGraph& g = job_graph(g_in, job);
    const Layout& lay = job.layout;
    const ParallelConfig& c = lay.cfg;
    ParallelResult res;
    res.layout = lay;
    const std::int64_t p = std::max<std::int64_t>(1, c.pp), t = std::max<std::int64_t>(1, c.tp);
    const std::int64_t vpp = std::max<std::int64_t>(1, lay.vpp);
    const bool graph = g.params_only == 0;
    res.instance_stage = graph ? assign_virtual_stages(g, lay) : std::vector<std::vector<std::int32_t>>{};
    // The rank (v % pp) and model chunk (v / pp) of every virtual stage v that
    // instance_stage names, looked up: a 64-bit division per block instance
    // and rank was a tenth of a 405B estimate.
    std::int32_t stages_named = static_cast<std::int32_t>(p * vpp);
    for (const auto& per_block : res.instance_stage)
        for (auto v : per_block) stages_named = std::max(stages_named, v + 1);
    // Scratch kept per thread, sized once; each list is assigned or cleared
    // before it is read. parallel_memory does not nest. The stage and rank
    // lists: growing them afresh was a fifth of a one-GPU 70B estimate's
    // allocations; the per-rank lists (rank loop below): ~70 allocations a
    // rank.
    struct Instance {
        std::int32_t block, v;
        std::int64_t layer;
    };
    struct RankScratch {
        std::vector<std::int64_t> rank_inst, chunk_inst;
        std::vector<Bytes> chunk_nl, chunk_act, chunk_gather, chunk_grad, chunk_tail_grad, chunk_no_gather;
        std::vector<Bytes> gather_of, grad_of, kept_grad_of, seq_sizes;
        std::vector<int> seq_kind;
        std::vector<PipelineRun> schedule_runs;
    };
    struct Scratch {
        std::vector<std::int64_t> rank_of, chunk_of;
        std::vector<std::vector<Instance>> on_stage, on_rank;
        RankScratch rank;
        RankKinds rank_kinds;
    };
    static thread_local Scratch scratch;
    // (Plain references: clang before 16 cannot capture structured bindings in the lambdas below.)
    auto& rank_of = scratch.rank_of;
    auto& chunk_of = scratch.chunk_of;
    auto& on_stage = scratch.on_stage;
    auto& on_rank = scratch.on_rank;
    RankKinds& rank_kinds = scratch.rank_kinds;
    rank_kinds.clear();
    rank_of.assign(static_cast<std::size_t>(stages_named), 0);
    chunk_of.assign(rank_of.size(), 0);
    for (std::int64_t v = 0; v < stages_named; ++v) {
        rank_of[static_cast<std::size_t>(v)] = v % p;
        chunk_of[static_cast<std::size_t>(v)] = v / p;
    }
    auto rank_v = [&](std::int32_t v) { return rank_of[static_cast<std::size_t>(v)]; };
    auto chunk_v = [&](std::int32_t v) { return chunk_of[static_cast<std::size_t>(v)]; };
    // Every block instance in model order, listed by virtual stage and by
    // rank (its block, virtual stage, and the checkpointable instances before
    // it): each rank below reads its own instances rather than scanning all
    // of them (O(L) per estimate, not O(pp vpp L): a 405B plan's layouts).
    // Grown, never shrunk (a shrink would free the lists' storage that the
    // next call with more stages builds again); only the first stages_named
    // (p) lists are this call's.
    if (on_stage.size() < static_cast<std::size_t>(stages_named)) on_stage.resize(static_cast<std::size_t>(stages_named));
    if (on_rank.size() < static_cast<std::size_t>(p)) on_rank.resize(static_cast<std::size_t>(p));
    for (std::size_t i = 0; i < static_cast<std::size_t>(stages_named); ++i) on_stage[i].clear();
    for (std::size_t i = 0; i < static_cast<std::size_t>(p); ++i) on_rank[i].clear();
    {
        std::int64_t layer = 0;
        for (std::size_t bi = 0; bi < res.instance_stage.size() && bi < g.blocks.size(); ++bi)
            for (auto v : res.instance_stage[bi]) {
                const Instance in{static_cast<std::int32_t>(bi), v, layer};
                on_stage[static_cast<std::size_t>(v)].push_back(in);
                on_rank[static_cast<std::size_t>(rank_v(v))].push_back(in);
                if (g.blocks[bi].checkpointable) ++layer;
            }
    }

    // ---- activations of one micro-batch on one rank ---------------------------------
    // job.actx describes this rank's share: seq / cp tokens, tensors split over
    // tp (tp_split_flags), scores over the whole sequence, capacity factor.
    const TransformerDims* td = g.transformer ? &*g.transformer : nullptr;
    const ActivationContext& ctx = job.actx;
    const std::int64_t s_local = ctx.seq;
    ActivationMemo memo_own;
    ActivationMemo* memo = memo_in ? memo_in : &memo_own;
    ActivationResult whole_own;
    if (job.train && graph && !whole_in) whole_own = saved_activations(g, ctx, nullptr, false, memo);
    const ActivationResult& whole = job.train && graph && whole_in ? *whole_in : whole_own;
    const bool zero3 = c.zero == 3 || c.fsdp != Fsdp::None;          // parameters sharded at rest, gathered per layer
    const bool root_held = zero3 && fsdp_holds_root(g, job);          // FSDP's root unit gathered through the step
    const StateFlags flags = state_flags(job);  // (plain names: clang before 16 cannot capture structured bindings)
    const bool shard_grads = flags.shard_grads, shard_opt = flags.shard_opt, offload_opt = flags.offload_opt, inbwd = flags.inbwd;
    // Optimizer in backward (inbwd, memory/features.hpp): no gradient outlives
    // its hook; FSDP no_sync: gradients kept unsharded between micro-batches.
    const bool keep_unsharded = shard_grads && c.no_sync && lay.micro_batches > 1;
    // Gradients made op by op (as without sharding) rather than as each
    // layer's unsharded buffer reduce-scattered at its end.
    const bool grads_per_op = !shard_grads || keep_unsharded;
    // Megatron mixed precision keeps one fp32 main-gradient buffer for the
    // whole model chunk from the start (param_and_grad_buffer.py); the
    // optimizer reads it in place, no fp32 copy.
    const bool grad_buffer = job.train && job.master > Bytes(0) && job.tdt == DType::F32;
    // Every gradient exists the whole step (zero_grad(set_to_none=False), or
    // that buffer): the schedule walk and the phases below count all of them.
    const bool always = job.req.zero_grad == ZeroGrad::Zero || grad_buffer;
    const Bytes half_unit = dtype_bytes(job.half, 1);
    const std::int64_t m = std::max<std::int64_t>(1, lay.micro_batches);
    const Bytes hidden_tok = g.transformer ? dtype_bytes(job.actx.stream, checked_mul(checked_mul(job.req.batch, s_local), g.transformer->hidden))
                                           : Bytes(0);

    // Single-GPU temporaries (the loss head and the largest backward pair),
    // split so that each rank takes its share.
    // The logits are vocab-parallel over tp (whole.logits is this rank's share;
    // the loss kernel's own tensors are read from the graph below).
    const Bytes logits_low = td ? whole.logits : Bytes(0);
    const Bytes held_output = td || g.loss_in_forward ? Bytes(0) : whole.loss_input;  // custom loops keep `out` through backward
    // The loss kernel as the job runs it (model/rewrite.hpp), on this rank: the
    // fp32 copy in flight, log_softmax's output, the loss input, what the ops
    // after the output layer save, and whether they save the logits
    // themselves. Loops that bind the logits hold them through the step
    // (memory/framework.hpp), the previous micro-batch's during a forward.
    Bytes loss_cast, loss_logp, loss_in, loss_saved;
    std::int64_t loss_chunks = 1;  // a per-chunk loss's backward runs chunk by chunk (Op::chunks)
    bool logits_saved = false;
    bool cast_saved = false;  // the loss saves its fp32 copy (Megatron's vocab-parallel CE): in act_peak already
    if (td && job.train && graph) {
        const Block& hb = g.blocks.back();
        static thread_local std::vector<char> split;  // (its storage reused: parallel_memory does not nest)
        tp_split_flags(hb, split);
        const auto role_dt = [&](TensorId x) { return resolve_role(hb.tensors[static_cast<std::size_t>(x)].role, ctx); };
        const auto bytes_of = [&](TensorId x) {
            return activation_bytes(hb.tensors[static_cast<std::size_t>(x)], role_dt(x), split[static_cast<std::size_t>(x)] != 0, ctx);
        };
        const auto storage = [&](TensorId x) {
            const TensorId a = hb.tensors[static_cast<std::size_t>(x)].alias_of;
            return a >= 0 && role_dt(a) == role_dt(x) ? a : x;
        };
        std::size_t head_op = hb.ops.size();
        for (std::size_t i = 0; i < hb.ops.size(); ++i)
            if (is_output_head(hb.ops[i]) && !hb.ops[i].outputs.empty()) head_op = i;
        if (head_op < hb.ops.size()) {
            const TensorId logits = storage(hb.ops[head_op].outputs.front());
            TensorId cast_out = -1;
            std::vector<TensorId> seen;
            for (std::size_t i = head_op + 1; i < hb.ops.size(); ++i) {
                const Op& op = hb.ops[i];
                if (op.kind == OpKind::Softmax && op.name.ends_with(".log_softmax")) loss_logp = bytes_of(op.outputs.front());
                if (op.name.ends_with(".logits_float") && !op.outputs.empty() && storage(op.outputs.front()) == op.outputs.front()) {
                    loss_cast = bytes_of(op.outputs.front());
                    cast_out = op.outputs.front();
                }
                if (op.kind == OpKind::Loss && !op.inputs.empty()) {
                    loss_in = bytes_of(op.inputs.front());
                    loss_chunks = std::max<std::int64_t>(1, op.chunks);
                }
                for (const SavedRef& sr : op.saved) {
                    const TensorId st = storage(sr.tensor);
                    if (role_dt(st) == DType::I64 || std::find(seen.begin(), seen.end(), st) != seen.end()) continue;
                    seen.push_back(st);
                    logits_saved = logits_saved || st == logits;
                    cast_saved = cast_saved || (cast_out >= 0 && st == cast_out);
                    loss_saved += bytes_of(st);
                }
            }
        }
    }
    const Bytes held_logits = job.framework.logits == LogitsLifetime::Kept ? logits_low : Bytes(0);

    auto& stage_tensors = res.stage_tensors;  // per stage, for the offload rows below and the load phase
    stage_tensors.reserve(static_cast<std::size_t>(p));
    res.stages.reserve(static_cast<std::size_t>(p));
    // A model chunk's saved activations depend only on its block instances
    // and whether its input requires grad: the chunks of the ranks in between
    // are alike, so each distinct chunk is computed once (pp x vpp calls were
    // half of a 405B plan's analytic search), its block walks from `memo`.
    std::map<std::pair<std::vector<std::int64_t>, bool>, ActivationResult> chunk_activations;
    std::pair<std::vector<std::int64_t>, bool> chunk_key;  // reused: a lookup allocates nothing
    auto chunk_saved = [&](const std::vector<std::int64_t>& inst, bool input_rg) -> const ActivationResult& {
        chunk_key.first.assign(inst.begin(), inst.end());
        chunk_key.second = input_rg;
        auto it = chunk_activations.find(chunk_key);
        if (it == chunk_activations.end()) it = chunk_activations.emplace(chunk_key, saved_activations(g, ctx, &inst, input_rg, memo)).first;
        return it->second;
    };
    // The per-rank scratch (declared above).
    auto& [rank_inst, chunk_inst, chunk_nl, chunk_act, chunk_gather, chunk_grad, chunk_tail_grad, chunk_no_gather, gather_of, grad_of, kept_grad_of, seq_sizes, seq_kind,
           schedule_runs] = scratch.rank;
    // Each block's instances in `list`, counted by runs: a list repeats one
    // block many times in a row, and one increment per instance was a chain
    // of stores to one counter (a twentieth of a one-GPU 70B estimate).
    auto count_blocks = [&g](const std::vector<Instance>& list, std::vector<std::int64_t>& out) {
        out.assign(g.blocks.size(), 0);
        for (std::size_t k = 0; k < list.size();) {
            const std::int32_t b = list[k].block;
            std::size_t j = k + 1;
            while (j < list.size() && list[j].block == b) ++j;
            out[static_cast<std::size_t>(b)] += static_cast<std::int64_t>(j - k);
            k = j;
        }
    };
    for (std::int64_t r = 0; r < p; ++r) {
        StageMemory sm;
        sm.stage = r;
        const std::vector<Instance>& mine = on_rank[static_cast<std::size_t>(r)];
        // Each block's instances on this rank (all its model chunks), counted once.
        count_blocks(mine, rank_inst);
        // Computed once per kind of rank (RankKinds).
        const bool is_last = r == lay.last_rank();
        const RankKinds::Kind* seen = rank_kinds.find(rank_inst, is_last);
        if (seen) {
            std::shared_ptr<const std::vector<RankTensor>> same = stage_tensors[seen->stage];
            stage_tensors.push_back(std::move(same));
        } else {
            stage_tensors.push_back(std::make_shared<const std::vector<RankTensor>>(rank_tensors(g, job, rank_inst, r)));
        }
        const std::vector<RankTensor>& tensors = *stage_tensors.back();
        // ---- model states (rank_states) ------------------------------------------------
        // Rounding: the allocator blocks of these persistent tensors exceed their
        // bytes (memory/blocks.hpp); kept apart so that the states stay exact.
        // P: paged optimizer states (outside the allocator). Optimizer in
        // backward: the largest tensor's gradient and update in flight at the
        // embedding (first block), the layers, and the output layer.
        RankStates rs;
        if (seen) {
            rs = seen->states;
        } else {
            rs = rank_states(g, job, tensors, flags);
            rank_kinds.add(rank_inst, is_last, stage_tensors.size() - 1, rs);
        }
        // (Plain references: clang before 16 cannot capture structured bindings in the lambdas below.)
        const Bytes &W = rs.W, &G = rs.G, &M = rs.M, &O = rs.O, &P = rs.P, &F8 = rs.F8, &round_states = rs.round_states;
        Bytes &round_grads = rs.round_grads, &inbwd_first = rs.inbwd_first, &inbwd_tmp = rs.inbwd_tmp, &inbwd_head = rs.inbwd_head;
        const std::int64_t opt_elems = rs.opt_elems, largest_opt = rs.largest_opt, params = rs.params;
        sm.params = params;
        sm.weights = W;
        sm.gradients = G;
        sm.optimizer_states = M + O;
        sm.paged_optimizer_states = P;
        if (inbwd) round_grads = Bytes(0);  // no gradient persists
        sm.master_weights = M;
        sm.fp8_weights = F8;

        // ---- contents and activations per chunk --------------------------------------
        // chunk_nl: the part of chunk_act outside the transformer layers
        // (embeddings, output layer and loss): Megatron's CUDA graphs leave it eager.
        for (auto* v : {&chunk_nl, &chunk_act, &chunk_gather, &chunk_grad, &chunk_tail_grad}) v->assign(static_cast<std::size_t>(vpp), Bytes(0));
        bool embeddings = false, head = false, has_layers = false;
        std::int64_t first_layer = -1, layers = 0;
        // Gathered parameters / unsharded gradients at the layers (`_max`), the
        // first block (embeddings) and the output layer.
        Bytes grad_pair, recompute, gather_max, block_grad_max, autocast_unsaved, dequant, hdq;
        Bytes gather_last_fwd;  // the last layer's forward with the output layer's unit prefetched (a forward moment only)
        Bytes ckpt_forward;  // a checkpointed layer's forward intermediates (BlockActivations::forward_transient)
        Bytes recompute_trailing;  // --recompute-every: freed before the first rebuild
        Bytes recompute_largest;   // the rebuild's largest transient (not alive with the gradient pair)
        Bytes recompute_layer;     // one layer rebuilt (the first layer's backward, with the embedding's prefetch)
        bool any_recompute = false;
        Bytes gather_first, gather_first_fwd, gather_near_first, gather_head, gather_head_fwd, grad_first, grad_head, head_saved;
        Bytes held_quant;  // the head chunk's 4-bit inputs a held graph keeps (BlockActivations::quant_held)
        // no_sync over two micro-batches: the second, the only one that adds to
        // gradients made before, is also the one that syncs, and each unit's
        // post-backward reduce-scatters its accumulated gradient into the
        // rank's slice and frees it (as StepBuilder::backward_chunk's last
        // micro-batch). By the embedding's backward, the last, the other
        // blocks hold their slices, not the unsharded gradients the schedule
        // walk counts: what that frees.
        Bytes synced_before_embedding;
        // "0-3, 16-19": the layers of each model chunk (its storage reused by
        // the thread's calls, with no temporary strings: the text of every
        // rank was a tenth of the heap allocations of a planner's search).
        static thread_local std::string ranges;
        ranges.clear();
        {
            std::int64_t run_start = -1, run_end = -1;
            auto append_int = [&](std::int64_t x) {
                char buf[24];
                const auto end = std::to_chars(buf, buf + sizeof buf, x).ptr;
                ranges.append(buf, end);
            };
            auto close_run = [&] {
                if (run_start < 0) return;
                if (!ranges.empty()) ranges += ", ";
                append_int(run_start);
                if (run_end > run_start) {
                    ranges += '-';
                    append_int(run_end);
                }
                run_start = -1;
            };
            for (const Instance& in : mine) {
                const std::int64_t layer = in.layer;
                if (g.blocks[static_cast<std::size_t>(in.block)].checkpointable) {
                    if (first_layer < 0) first_layer = layer;
                    ++layers;
                    has_layers = true;
                    if (run_start >= 0 && run_end == layer - 1) run_end = layer;
                    else {
                        close_run();
                        run_start = run_end = layer;
                    }
                } else if (layer == 0) {
                    embeddings = true;
                } else {
                    head = head || static_cast<std::size_t>(in.block) + 1 == g.blocks.size();
                }
            }
            close_run();
        }
        sm.layers = layers;
        if (!graph) {
            sm.contents = "all parameters";
        } else {
            // The exact length: a short text stays in the string itself.
            sm.contents.reserve((embeddings ? 13 : 0) + (layers > 0 ? 7 + ranges.size() : 9) + (head ? 15 : 0));
            if (embeddings) sm.contents += "embeddings + ";
            if (layers > 0) (sm.contents += "layers ") += ranges;
            else sm.contents += "no layers";
            if (head) sm.contents += " + output layer";
        }
        if (job.train && graph) {
            for (std::int64_t ch = 0; ch < vpp; ++ch) {
                const std::int64_t v = ch * p + r;
                const std::vector<Instance>& chunk = on_stage[static_cast<std::size_t>(v)];
                if (chunk.empty()) continue;
                count_blocks(chunk, chunk_inst);
                const bool starts_with_embeddings = chunk.front().block == 0 && !g.blocks.front().checkpointable;
                const ActivationResult& a = chunk_saved(chunk_inst, v > 0 && !starts_with_embeddings);
                Bytes sum, unsaved, nl, quant_held;
                bool head_chunk = false;
                for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
                    if (chunk_inst[bi] == 0) continue;
                    const BlockActivations& ba = a.blocks[bi];
                    sum += ba.total;
                    if (!g.blocks[bi].checkpointable) nl += ba.total;
                    unsaved += ba.unsaved_casts;
                    quant_held += ba.quant_held;
                    head_chunk = head_chunk || (td && bi + 1 == g.blocks.size());
                    if (td && bi + 1 == g.blocks.size()) head_saved = ba.total;
                    // The loss head's backward is the logits term below.
                    if (!(td && bi + 1 == g.blocks.size())) grad_pair = max(grad_pair, ba.grad_pair_net);
                    recompute = max(recompute, ba.recompute_transient);
                    recompute_largest = max(recompute_largest, ba.recompute_largest);
                    recompute_layer = max(recompute_layer, ba.recompute_layer);
                    ckpt_forward = max(ckpt_forward, ba.forward_transient);
                }
                if (a.recompute_transient > Bytes(0)) {
                    recompute_trailing = any_recompute ? std::min(recompute_trailing, a.recompute_trailing) : a.recompute_trailing;
                    any_recompute = true;
                }
                chunk_act[static_cast<std::size_t>(ch)] = sum;
                if (head_chunk && job.framework.logits == LogitsLifetime::Kept) held_quant = quant_held;
                chunk_nl[static_cast<std::size_t>(ch)] = nl;
                // One chunk's forward at a time holds autocast's cache.
                autocast_unsaved = max(autocast_unsaved, unsaved);
            }
            // ZeRO-3 / FSDP gather a layer's 16-bit parameters before its forward and
            // backward; FSDP's prefetch (BACKWARD_PRE, forward prefetch) brings the
            // next unit in early, DeepSpeed ZeRO-3 up to its prefetch bucket (5e7
            // elements) within stage3_max_live_parameters (1e9). SHARD_GRAD_OP
            // keeps every gathered layer from its forward to its backward. A
            // layer's gradients exist unsharded until its reduce-scatter.
            for (auto* v : {&gather_of, &grad_of, &kept_grad_of}) v->assign(g.blocks.size(), Bytes(0));
            for (const auto& rt : tensors)
                if (rt.block >= 0) {
                    const auto bi = static_cast<std::size_t>(rt.block);
                    const std::int64_t inst = rank_inst[bi];
                    const std::int64_t per_instance = rt.copies / std::max<std::int64_t>(1, inst);
                    gather_of[bi] += half_unit * checked_mul(rt.elems, per_instance);
                    if (rt.trainable) {
                        grad_of[bi] += dtype_bytes(job.tdt, checked_mul(rt.elems, per_instance));
                        if (!inbwd)
                            kept_grad_of[bi] += dtype_bytes(job.tdt, checked_mul(rt.sharded_elems(shard_grads && !keep_unsharded), per_instance));
                    }
                    if (rt.flat_grad > Bytes(0)) {  // FSDP1 + LoRA: frozen weights in a flat parameter that requires grad
                        grad_of[bi] += rt.flat_grad * per_instance;
                        kept_grad_of[bi] += (shard_grads && !keep_unsharded ? rt.flat_grad.ceil_div(rt.shard) : rt.flat_grad) * per_instance;
                    }
                }
            // Sharded gradients are one allocation per layer instance (its slice after the reduce-scatter).
            if (shard_grads && !inbwd)
                for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
                    const std::int64_t inst = rank_inst[bi];
                    const Bytes one = grad_of[bi].ceil_div(std::max<std::int64_t>(1, lay.shard));
                    round_grads += (allocator_block(one) - one) * inst;
                }
            // Optimizer in backward under FSDP2: a layer's reduce-scattered slice,
            // then its tensors stepped one by one (fully_shard's foreach_reduce
            // runs each sharded parameter's post-accumulate-grad hooks:
            // pytorch/pytorch 8fc2039decebd, torch/distributed/fsdp/_fully_shard/
            // _fsdp_collectives.py foreach_reduce).
            if (inbwd && shard_grads)
                for (const auto& rt : tensors)
                    if (rt.trainable && rt.block >= 0) {
                        const Bytes slice = grad_of[static_cast<std::size_t>(rt.block)].ceil_div(std::max<std::int64_t>(1, lay.shard));
                        Bytes& slot = rs.inbwd_slot(g, rt.block);
                        slot = max(slot, slice + step_temporaries(job, TrainTensor{state_tensor(g, rt, shard_opt, t).shape, 1}));
                    }
            // Gradients each model chunk holds once it has run a backward.
            for (const Instance& in : mine) chunk_grad[static_cast<std::size_t>(chunk_v(in.v))] += kept_grad_of[static_cast<std::size_t>(in.block)];
            if (keep_unsharded && m == 2 && !always)
                for (const Instance& in : mine)
                    if (in.block != 0) {
                        const auto bi = static_cast<std::size_t>(in.block);
                        const Bytes slice = grad_of[bi].ceil_div(std::max<std::int64_t>(1, lay.shard));
                        synced_before_embedding += kept_grad_of[bi] - std::min(kept_grad_of[bi], slice);
                    }
            // Gradients a chunk's backward has yet to make when it reaches the
            // chunk's first layer (that layer's and the embedding's before it).
            for (std::int64_t ch = 0; ch < vpp; ++ch)
                for (const Instance& in : on_stage[static_cast<std::size_t>(ch * p + r)]) {
                    chunk_tail_grad[static_cast<std::size_t>(ch)] += kept_grad_of[static_cast<std::size_t>(in.block)];
                    if (g.blocks[static_cast<std::size_t>(in.block)].checkpointable) break;
                }
            // Per kind of block: the first (embeddings), the last (output layer,
            // loss) and the layers in between, each at its own moment of the step.
            auto kind_of = [&](std::size_t bi) { return bi == 0 ? 0 : (td && bi + 1 == g.blocks.size() ? 2 : 1); };
            if (!grads_per_op)
                for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
                    Bytes& slot = kind_of(bi) == 0 ? grad_first : (kind_of(bi) == 2 ? grad_head : block_grad_max);
                    slot = max(slot, grad_of[bi]);
                }
            auto prefetch = [&](Bytes cur, Bytes next) {
                Bytes pre = c.fsdp != Fsdp::None ? next : std::min(next, half_unit * c.zero3_prefetch_elements);
                if (c.zero == 3) {
                    const Bytes cap = half_unit * c.zero3_max_live_elements;
                    pre = cur >= cap ? Bytes(0) : std::min(pre, cap - cur);
                }
                return pre;
            };
            if (zero3)
                for (std::int64_t ch = 0; ch < vpp; ++ch) {
                    // The chunk's block instances in execution order.
                    seq_sizes.clear();
                    seq_kind.clear();
                    for (const Instance& in : on_stage[static_cast<std::size_t>(ch * p + r)]) {
                        seq_sizes.push_back(gather_of[static_cast<std::size_t>(in.block)]);
                        seq_kind.push_back(kind_of(static_cast<std::size_t>(in.block)));
                    }
                    Bytes kept;
                    // FSDP's root unit (fsdp_holds_root): the embeddings' and the
                    // output layer's parameters gathered once, held through every
                    // moment below; neither is gathered nor prefetched at its use
                    // (nor freed and gathered again: not a cached block at the peak).
                    Bytes root;
                    if (root_held)
                        for (std::size_t k = 0; k < seq_sizes.size(); ++k)
                            if (seq_kind[k] != 1) {
                                root += seq_sizes[k];
                                seq_sizes[k] = Bytes(0);
                            }
                    for (const Bytes& unit : seq_sizes) sm.largest_gathered = max(sm.largest_gathered, unit);
                    for (std::size_t k = 0; k < seq_sizes.size(); ++k) {
                        const Bytes next = k + 1 < seq_sizes.size() ? seq_sizes[k + 1] : Bytes(0);
                        const Bytes prev = k > 0 ? seq_sizes[k - 1] : Bytes(0);
                        if (c.fsdp == Fsdp::GradOp) {
                            // Forward: the earlier layers stay gathered (never more than
                            // all of them, counted with the micro-batch in flight below).
                            kept += seq_sizes[k];
                            // Backward reshards each unit after its own backward, so the
                            // embedding's backward, the last, holds its own unit still
                            // (the schedule walk's end-of-backward moments have let go
                            // of every kept one, this chunk's included).
                            if (seq_kind[k] == 0) gather_first = max(gather_first, seq_sizes[k]);
                        } else {
                            // A layer next to the embedding or the output layer counts
                            // at that block's moment (start/end of the pass).
                            const bool next_layer = k + 1 < seq_sizes.size() && seq_kind[k + 1] == 1;
                            const bool prev_layer = k > 0 && seq_kind[k - 1] == 1;
                            const Bytes own = seq_sizes[k];
                            if (seq_kind[k] == 1) {
                                gather_max = max(gather_max, own + max(next_layer ? prefetch(own, next) : Bytes(0), prev_layer ? prefetch(own, prev) : Bytes(0)));
                                // The first layer's backward prefetches the embedding.
                                if (k > 0 && seq_kind[k - 1] == 0) gather_near_first = max(gather_near_first, own + prefetch(own, prev));
                                // The last layer's forward prefetches the output layer: a
                                // forward layer moment (the head's own moments gather the
                                // head and, in backward, prefetch the last layer, whose
                                // backward prefetches the layer before it: an untied output
                                // layer's unit counted at the layers' backward moments put
                                // pythia-160m LoRA under FSDP 4-7% over the simulation).
                                if (k + 1 < seq_sizes.size() && seq_kind[k + 1] == 2) gather_last_fwd = max(gather_last_fwd, own + prefetch(own, next));
                            } else if (seq_kind[k] == 0) {
                                // Forward: the embedding with the first layer prefetched;
                                // backward: the embedding alone (nothing left to prefetch).
                                gather_first_fwd = max(gather_first_fwd, own + prefetch(own, next));
                                gather_first = max(gather_first, own);
                            } else {
                                gather_head = max(gather_head, own + prefetch(own, prev));
                                // Forward end: the last layer released, nothing left to prefetch.
                                gather_head_fwd = max(gather_head_fwd, own);
                            }
                        }
                    }
                    if (c.fsdp == Fsdp::GradOp) chunk_gather[static_cast<std::size_t>(ch)] = kept;
                    if (root > Bytes(0))
                        for (Bytes* gb : {&gather_max, &gather_last_fwd, &gather_near_first, &gather_first, &gather_first_fwd, &gather_head, &gather_head_fwd})
                            *gb += root;
                }
            // 4-bit weights dequantized one layer at a time.
            if (job.dequant > Bytes(0) && has_layers) dequant = job.dequant.ceil_div(t);
            if (job.head_dequant > Bytes(0) && head) hdq = job.head_dequant.ceil_div(t);
        }

        // Tied output layer whose embedding lives on this rank (pp = 1): its
        // gradient is held from the head's backward to the embedding's. The
        // embedding's own gradient arrives last.
        Bytes tied_grad, emb_grad;
        if (job.train && !job.lora && graph && head && embeddings) {
            for (const Op& op : g.blocks.back().ops)
                if (op.kind == OpKind::Linear && op.params.empty() && op.in_features > 0)
                    tied_grad = dtype_bytes(job.tdt, checked_mul((op.out_features + t - 1) / t, op.in_features));
        }
        if (job.train && graph && embeddings)
            for (const auto& rt : tensors)
                if (rt.trainable && rt.block == 0) emb_grad = max(emb_grad, dtype_bytes(job.tdt, rt.elems));
        // The output layer's own weight (untied, or the last stage's tied copy):
        // its gradient arrives in the output layer's backward.
        Bytes head_wgrad;
        if (job.train && graph && head)
            for (const auto& rt : tensors)
                if (rt.trainable && (rt.tied_copy || (rt.block >= 0 && rt.param >= 0 &&
                                                      g.blocks[static_cast<std::size_t>(rt.block)].params[static_cast<std::size_t>(rt.param)].output_head)))
                    head_wgrad = max(head_wgrad, dtype_bytes(job.tdt, rt.elems));

        // ---- schedule: activations in flight -----------------------------------------
        const std::int64_t m_sim = pipeline_steady_micro_batches(p, vpp, m, r);
        // Walk the schedule (walk_schedule, run by run): activations (and
        // SHARD_GRAD_OP's parameters) of the forwards not yet backwarded, and
        // the gradients of the chunks that have run a backward (kept between
        // micro-batches), at their largest sum (act_peak: activations,
        // act_nl_peak: their part outside the transformer layers, kept_gather:
        // SHARD_GRAD_OP's kept parameters). After each backward: what stays
        // (end_base; the embedding chunk's first backward of the step apart,
        // its gradient being new then).
        // FSDP1 SHARD_GRAD_OP under no_sync frees no unit's parameters in its
        // post-backward while gradients do not sync (pytorch/pytorch
        // torch/distributed/fsdp/_runtime_utils.py@3ade90a6aaa9
        // _post_backward_reshard -> _should_free_in_backward: without
        // _sync_gradients only RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES, FULL_SHARD
        // and HYBRID_SHARD, free then), so every unit gathered by the first
        // micro-batch stays unsharded through the accumulated ones until the
        // last (syncing) backward frees each in its hook: held as the states
        // are, the optimizer step apart (fully_shard, FSDP2, reshards after
        // backward whatever the sync).
        const bool hold_unsharded = c.fsdp == Fsdp::GradOp && c.fsdp_version == 1 && keep_unsharded;
        Bytes unsharded_held;
        if (hold_unsharded)
            for (const Bytes& cg : chunk_gather) unsharded_held += cg;
        ScheduleWalk walk;
        if (job.train && graph) {
            ScheduleLoads loads;
            loads.act = chunk_act;
            loads.nl = chunk_nl;
            loads.gather = chunk_gather;
            if (hold_unsharded) {  // (held throughout instead: unsharded_held)
                chunk_no_gather.assign(chunk_gather.size(), Bytes(0));
                loads.gather = chunk_no_gather;
            }
            loads.grad = chunk_grad;
            loads.tail_grad = chunk_tail_grad;
            loads.all_grads = G;
            loads.always_grads = always;
            loads.embedding_rank = r == 0;
            pipeline_schedule_runs(p, vpp, m_sim, r, schedule_runs);
            walk = walk_schedule(loads, schedule_runs);
        }
        const auto& [act_peak, act_nl_peak, kept_gather, g_at_peak, inflight_peak, end_base, end_first_layer, end_emb_new, end_emb_acc, end_emb_new_seen,
                     end_emb_acc_seen, bwd_act, bwd_nl, bwd_gather, bwd_g, bwd_seen] = walk;
        sm.activations = act_peak;
        sm.activations_at_peak = act_peak;
        sm.in_flight = std::max<std::int64_t>(1, inflight_peak);

        // ---- buffers -----------------------------------------------------------------
        Bytes buffers;
        if (job.train && lay.dp > 1 && !job.lora) {
            std::int64_t elems = 0;
            for (const auto& rt : tensors)
                if (rt.trainable) elems = checked_add(elems, checked_mul(rt.elems, rt.copies));
            if (c.zero == 0 && c.fsdp == Fsdp::None && !c.distributed_optimizer)
                // torch DDP copies gradients into flat buckets (gradient_as_bucket_view=False).
                buffers += dtype_bytes(job.tdt, elems);
            else if (c.zero >= 1)
                // DeepSpeed contiguous_gradients: one reduce bucket of reduce_bucket_size elements.
                buffers += half_unit * std::min(c.zero_bucket_elements, elems);
        }
        sm.comm_buffers = buffers;
        // The gathered parameters held with the activations in flight.
        const Bytes held_gather = hold_unsharded ? unsharded_held : kept_gather;
        sm.gathered_params = held_gather;

        // ---- phases ------------------------------------------------------------------
        if (job.train) {
            const bool kept = always || g_at_peak > Bytes(0);
            // Gradient bytes with their share of the allocator's rounding.
            auto with_round = [&](Bytes gb) {
                return G > Bytes(0) ? gb + Bytes(static_cast<std::int64_t>(static_cast<double>(round_grads.count()) * static_cast<double>(gb.count()) /
                                                                           static_cast<double>(G.count())))
                                    : gb;
            };
            const Bytes states = W + M + O + F8 + buffers + round_states;
            const Bytes g_kept_exact = always ? G : g_at_peak;
            const Bytes g_kept = with_round(g_kept_exact);
            // Loss head on this rank (vocab-parallel over tp).
            const Bytes ll = head ? logits_low : Bytes(0);
            const Bytes held_l = head ? held_logits : Bytes(0);
            // From the end of backward to the optimizer step: the states and the
            // logits a loop holds to the next forward (as the simulator keeps them).
            const Bytes end_held = states + held_l;
            // The moments of a micro-batch's step where memory peaks, each as
            // (activations alive, temporaries); `base` is what is held throughout.
            const Bytes base = states + g_kept + held_gather;
            struct Moment {
                const char* phase;
                Bytes act, tmp, gather;  // activations alive, temporaries, gathered parameters
                Bytes layers;            // the transformer layers' part of act + tmp (Megatron's CUDA graph pool)
                Bytes grads{};           // gradients (with their rounding) beyond base's g_kept (a backward's start, bwd_g)
                bool bwd_start = false;  // at a backward's start: its gradients are bwd_g, not g_kept's
                [[nodiscard]] Bytes sum() const { return act + tmp + gather + grads; }
            };
            static thread_local std::vector<Moment> moments;  // (one allocation per thread, not per rank)
            moments.clear();
            const Bytes layer_act_peak = act_peak - std::min(act_peak, act_nl_peak);
            // Forward start: the embedding's gathered parameters and the first layer's prefetch.
            // A loop that holds the logits holds the previous micro-batch's
            // through this forward (with what its graph keeps).
            if (embeddings) moments.push_back({"forward", Bytes(0), held_output + held_l + held_quant, gather_first_fwd, Bytes(0)});
            // Forward end: the logits and their fp32 copy live through the loss;
            // full recompute: autocast's weight-cast cache until forward returns.
            {
                // A quantized output layer (--quantize-head) dequantizes its weight
                // before the logits exist; the fp32 copy comes after it is freed.
                // (A layer's forward gathers it and the next layer, the last one the output layer.)
                const Bytes gather_fwd = max(gather_max, gather_last_fwd);
                const Bytes at_head = (logits_saved ? Bytes(0) : ll) + max(head && !cast_saved ? loss_cast : Bytes(0), job.dequant_in_forward ? hdq : Bytes(0)),
                            at_layer = job.dequant_in_forward ? dequant : Bytes(0);
                // The last checkpointed layer's forward holds its intermediates
                // (freed as it goes, not saved) over what is in flight, before
                // the layers after it (uncheckpointed: --recompute-every, Megatron's
                // block method) and the output layer have saved anything.
                if (ckpt_forward > Bytes(0)) {
                    const Bytes later = (head ? head_saved : Bytes(0)) + recompute_trailing;
                    const Bytes before_later = act_peak - std::min(act_peak, later);
                    moments.push_back({"forward", before_later, held_output + held_l + held_quant + at_layer + ckpt_forward + autocast_unsaved, gather_fwd,
                                       layer_act_peak - std::min(layer_act_peak, recompute_trailing) + at_layer + ckpt_forward});
                }
                // The previous micro-batch's held logits keep its graph, and
                // with it the 4-bit inputs bitsandbytes < 0.43.2 keeps (held_quant).
                // A layer's forward comes before the output layer has saved
                // anything: with one chunk in flight at the peak (one GPU, the
                // 1F1B last stage), that chunk's, the one holding the output
                // layer, saves less the output layer's (as the checkpointed
                // forward above). ZeRO-3 / FSDP gather two layers there but the
                // embedding's unit at the head: counted with the head's saves,
                // llama-3.2-1b LoRA under FSDP was 7% over the simulation.
                // (With more in flight an earlier micro-batch's output layer
                // may hold its saves through this forward: all are counted.)
                const Bytes act_at_layer = head && inflight_peak == 1 ? act_peak - std::min(act_peak, head_saved) : act_peak;
                if (act_peak + at_head + gather_head_fwd >= act_at_layer + at_layer + gather_fwd)
                    moments.push_back({"forward", act_peak, held_output + held_l + held_quant + at_head + autocast_unsaved, gather_head_fwd, layer_act_peak});
                else
                    moments.push_back({"forward", act_at_layer, held_output + held_l + held_quant + at_layer + autocast_unsaved, gather_fwd, layer_act_peak + at_layer});
            }
            if (head) {
                // Backward of log_softmax: its fp32 output-gradient and input-gradient.
                // (fused kernels: the gradient of the loss input only)
                // A per-chunk loss: one chunk's gradients over everything saved
                // (model/rewrite.hpp loss_chunk_transient, as the simulator).
                const Bytes whole_grad = loss_logp > Bytes(0) ? loss_logp + (loss_cast > Bytes(0) ? loss_cast : ll) : loss_in;
                const Bytes loss_grad = loss_chunks > 1 ? loss_chunk_transient(loss_logp, loss_cast, ll, loss_chunks) : whole_grad;
                // (held logits the loss saved are in act_peak already)
                moments.push_back({"backward", act_peak, held_output + (logits_saved ? Bytes(0) : held_l) + loss_grad + grad_head, gather_head, layer_act_peak});
                // Backward of the output layer: log_softmax's saved output is gone; the
                // logits' gradient and, when tied, the embedding-sized gradient.
                // Its own weight's gradient: a new one (amp: a 16-bit gradient cast to
                // fp32), or with accumulation one computed, added and freed.
                Bytes own;
                if (grads_per_op && !grad_buffer && head_wgrad > Bytes(0))
                    own = kept ? head_wgrad : head_wgrad + (job.amp && job.tdt == DType::F32 ? Bytes(head_wgrad.count() / 2) : Bytes(0));
                if (inbwd) own = inbwd_head;  // stepped and freed in its hook
                // A per-chunk loss projects per chunk: the weight's gradient
                // contributions summed in autograd's input buffer, the sum and
                // one contribution at once (as the simulator; 16-bit under autocast).
                const Bytes head_w = job.lora ? Bytes(0) : tied_grad > Bytes(0) ? tied_grad : head_wgrad;
                if (loss_chunks > 1 && head_w > Bytes(0))
                    moments.push_back({"backward", act_peak - std::min(act_peak, loss_saved),
                                       held_output + held_l + ll + chunked_head_grad_transient(head_w, job.amp && job.tdt == DType::F32) + grad_head,
                                       gather_head, layer_act_peak});
                moments.push_back({"backward", act_peak - std::min(act_peak, loss_saved), held_output + held_l + ll + tied_grad + own + grad_head + hdq, gather_head,
                                   layer_act_peak});
            }
            // The layers, one at a time: the largest gradient pair (with a
            // checkpointed layer rebuilt), the layer's gathered parameters and
            // unsharded gradients; the output layer's saved tensors are gone and a
            // tied output layer's gradient waits for the embedding's.
            {
                // The output layer's new weight gradient (untied, or the last
                // stage's tied copy) is held through the layers' backward.
                const Bytes head_grad_held = head && grads_per_op && !grad_buffer && !kept && !inbwd ? head_wgrad : Bytes(0);
                const Bytes common = held_output + held_l + tied_grad + head_grad_held + block_grad_max + inbwd_tmp;
                // The rebuilt layer's saves, with its largest forward transient or
                // (later) its largest gradient pair, not both.
                const Bytes rebuilt = recompute > Bytes(0) ? recompute - std::min(recompute, recompute_largest) + max(max(grad_pair, dequant), recompute_largest)
                                                           : max(grad_pair, dequant);
                // Over the activations in flight `act` (`nl` of them outside the
                // layers), with the temporaries `tmp`, gathered parameters and
                // gradients beyond base's.
                const auto layer_moments = [&](Bytes act, Bytes nl, Bytes tmp, Bytes gather, Bytes grads, bool at_bwd_start) {
                    // With --recompute-every, the uncheckpointed layers after the last
                    // checkpointed one run their backward (no rebuild) and free their
                    // saves before the first rebuild.
                    const Bytes layers_act = act - std::min(act, head_saved);
                    const Bytes trail = std::min(layers_act, recompute_trailing);
                    // The embeddings' saves are not the layers'.
                    const Bytes emb_act = nl - std::min(nl, head_saved);
                    const auto layer_part = [&](Bytes a) { return a - std::min(a, emb_act); };
                    if (trail > Bytes(0))
                        moments.push_back({"backward", layers_act, tmp + max(grad_pair, dequant), gather, layer_part(layers_act) + max(grad_pair, dequant), grads,
                                           at_bwd_start});
                    moments.push_back({"backward", layers_act - trail, tmp + rebuilt, gather, layer_part(layers_act - trail) + rebuilt, grads, at_bwd_start});
                };
                // At the forward peak (what is in flight and kept there).
                layer_moments(act_peak, act_nl_peak, common, gather_max, Bytes(0), false);
                // At the start of the backward where what is in flight and the
                // gradients made so far peak (walk.bwd_*): a pipeline's
                // cool-down backward runs with fewer micro-batches in flight than
                // the forward peak, but with the gradients the first backward made
                // (1F1B with m = pp on stage 0: every forward before the first
                // backward, whose gradients the second holds with pp - 1
                // micro-batches). Its gathered parameters are the ones kept then;
                // an output layer's gradient held through the layers is among the
                // gradients made, once.
                if (bwd_seen)
                    layer_moments(bwd_act, bwd_nl, common - (bwd_g > Bytes(0) ? head_grad_held : Bytes(0)), gather_max + bwd_gather - kept_gather,
                                  with_round(always ? G : bwd_g) - g_kept, true);
            }
            Moment worst = moments.front();
            for (const auto& mo : moments)
                if (mo.sum() > worst.sum()) worst = mo;
            const Bytes fb = base + worst.sum();
            // Backward end: every gradient exists; the embedding's arrives (amp:
            // a 16-bit gradient cast to fp32; accumulation: computed, added, freed)
            // next to its output's gradient and, when tied, the output layer's
            // contribution and the second one added out of place.
            const Bytes end_round = round_grads;  // every gradient exists by then
            // Optimizer in backward: no gradient is left, one tensor's step in
            // flight (the first block's here unless it is the embedding, below).
            const Bytes inbwd_end = embeddings ? inbwd_tmp : max(inbwd_tmp, inbwd_first);
            // (The first layer's backward dequantizes its 4-bit weights as every
            // layer's does: its gradient pair or the dequantized weight, as in
            // the layers' moments.)
            Bytes bwd_end = end_held + unsharded_held + end_base + end_round + max(grad_pair, dequant) + max(gather_max, gather_near_first) + block_grad_max + inbwd_end;
            // Full recompute: the first layer is rebuilt with nearly every
            // gradient made (its saves with its largest forward transient or,
            // later, its largest gradient pair, not both: as `rebuilt` above).
            // (A tied output layer's gradient waits for the embedding's through
            // the first layer's rebuild too: tied_grad there, as in the layers'.)
            if (has_layers && recompute > Bytes(0)) {
                // Megatron's uniform chunks rebuild N layers at once, the layers
                // gathered then; the embedding's unit is prefetched by the first
                // layer's backward, with that layer's rebuild alone left (a ZeRO-3
                // prefetch of Pythia's embedding with the whole chunk put
                // pythia-160m LoRA 5.5% over the simulation).
                // (A plain name for the walk's binding: clang before 16 cannot capture structured bindings.)
                const Bytes first_layer_end = end_first_layer;
                const auto rebuilt_end = [&](Bytes rc, Bytes gather) {
                    return end_held + unsharded_held + tied_grad + first_layer_end + end_round + rc - std::min(rc, recompute_largest) +
                           max(max(grad_pair, dequant), recompute_largest) + gather + block_grad_max + inbwd_end;
                };
                const Bytes one = recompute_layer > Bytes(0) ? std::min(recompute_layer, recompute) : recompute;
                bwd_end = max(bwd_end, rebuilt_end(recompute, one < recompute ? gather_max : max(gather_max, gather_near_first)));
                bwd_end = max(bwd_end, rebuilt_end(one, max(gather_max, gather_near_first)));
            }
            if (embeddings) {
                const Bytes eg = !grads_per_op ? emb_grad.ceil_div(std::max<std::int64_t>(1, lay.shard)) : emb_grad;
                const Bytes extra = (!grads_per_op ? grad_first : Bytes(0)) + tied_grad * (!grads_per_op ? 1 : 2) +
                                    scale_bytes(hidden_tok, c.sp ? 1.0 / static_cast<double>(t) : 1.0);
                // The embedding's unit, or every unit held under FSDP1 no_sync
                // (the step's first micro-batch: not the syncing one; a later
                // one accumulating: not the last only with 3 or more, the last
                // having freed every other unit by then).
                const Bytes gather_new = hold_unsharded ? unsharded_held : gather_first;
                const Bytes gather_acc = hold_unsharded && m >= 3 ? unsharded_held : gather_first;
                if (end_emb_new_seen)
                    bwd_end = max(bwd_end, end_held + end_emb_new + end_round + extra + gather_new +
                                               (inbwd ? inbwd_first : grad_buffer || !grads_per_op ? Bytes(0) : (job.amp && job.tdt == DType::F32 ? Bytes(eg.count() / 2) : Bytes(0))));
                if (end_emb_acc_seen)
                    bwd_end = max(bwd_end, end_held + end_emb_acc - std::min(end_emb_acc, synced_before_embedding) + end_round + extra + gather_acc +
                                               (grad_buffer ? Bytes(0) : eg));
            }
            // Optimizer step over this rank's tensors (torch/optim/adam.py):
            // foreach allocates one state-sized list at once (_foreach_sqrt);
            // the for-loop path two temporaries of one tensor; fused kernels
            // none; Adafactor two fp32 temporaries of one tensor
            // (transformers Adafactor.step: update = grad**2 + eps, then the
            // scaled update); fp16 weights with fp32 masters copy the gradients
            // to fp32 first (DeepSpeed / apex FP16_Optimizer).
            Bytes t_opt;
            if (!offload_opt && !inbwd) {
                const Optimizer o = job.req.optimizer;
                const bool adam_like = o == Optimizer::Adam || o == Optimizer::AdamW || o == Optimizer::Lion;
                if (adam_like && job.opt_impl == OptimizerImpl::Foreach) t_opt = dtype_bytes(job.state_dt, opt_elems);
                else if (adam_like && job.opt_impl == OptimizerImpl::ForLoop) t_opt = dtype_bytes(job.state_dt, largest_opt) * 2;
                else if (o == Optimizer::Adafactor) t_opt = dtype_bytes(DType::F32, largest_opt) * 2;
                if (job.master > Bytes(0) && job.tdt != DType::F32) t_opt += dtype_bytes(DType::F32, opt_elems);
            }
            const Bytes G_step = inbwd ? Bytes(0) : G;  // optimizer in backward: optimizer.step() has nothing left to do
            const Bytes opt = end_held + G_step + round_grads + t_opt;
            sm.forward_backward_peak = max(fb, bwd_end);
            sm.optimizer_peak = opt;
            sm.gradients_kept = kept;
            sm.gradients_at_peak = g_kept_exact;
            sm.rounding = round_states + (g_kept - g_kept_exact);
            if (opt > sm.forward_backward_peak) {
                sm.allocated = opt;
                sm.peak_phase = "optimizer";
                sm.transient = t_opt;
                sm.gradients_at_peak = G_step;
                sm.rounding = round_states + round_grads;
            } else {
                sm.allocated = sm.forward_backward_peak;
                sm.peak_phase = "backward";
                if (bwd_end > fb) {
                    // no_sync: the unsharded gradients kept between micro-batches
                    // (what the schedule walk counted; with gradients that always
                    // exist, as Megatron's fp32 main-gradient buffer, it counted G).
                    Bytes g_end = G_step;
                    if (keep_unsharded && !always) {
                        g_end = Bytes(0);
                        for (const Bytes& cg : chunk_grad) g_end += cg;
                    }
                    sm.transient = sm.allocated - states - g_end - round_grads - unsharded_held;
                    sm.rounding = round_states + round_grads;
                    sm.gradients_kept = !inbwd;
                    sm.gradients_at_peak = g_end;
                    sm.activations_at_peak = Bytes(0);
                    sm.gathered_params = unsharded_held;
                } else {
                    sm.peak_phase = worst.phase;
                    sm.activations_at_peak = worst.act;
                    sm.gathered_params = held_gather + worst.gather;
                    sm.transient = worst.tmp;
                    if (worst.bwd_start) {
                        const Bytes g_exact = always ? G : bwd_g;
                        sm.gradients_kept = sm.gradients_kept || g_exact > Bytes(0);
                        sm.gradients_at_peak = g_exact;
                        sm.rounding = round_states + (with_round(g_exact) - g_exact);
                    }
                }
            }
            // CUDA graphs (memory/framework.hpp): the graphs' private pool keeps
            // the segments of its own peak for the whole run; the general pool
            // cannot use them, nor can the graphs use the general pool's free
            // blocks. Eager training shares one cache, so its reserved follows
            // max_t(general + pool); with graphs it is max_t general + max_t pool.
            // At every moment allocated = general + pool: the pool's part is the
            // layers' activations and temporaries (megatron), or everything the
            // forward and backward make, parameter gradients included
            // (compile), the general pool's part the rest.
            if (job.framework.cuda_graphs != CudaGraphs::None) {
                const bool compile_pool = job.framework.cuda_graphs == CudaGraphs::Compile;
                const Bytes g_pool = grad_buffer ? Bytes(0) : g_kept;
                const auto pool_of = [&](const Moment& mo) { return compile_pool ? mo.act + mo.tmp + g_pool : mo.layers; };
                Bytes pool_max, general_max;
                const auto add = [&](Bytes total, Bytes pool) {
                    pool = std::min(pool, total);
                    pool_max = max(pool_max, pool);
                    general_max = max(general_max, total - pool);
                };
                for (const auto& mo : moments) add(base + mo.sum(), pool_of(mo));
                // Backward end: the first layer's gradient pair (and rebuild) in the
                // pool; compile: everything but the states and gathered parameters.
                const Bytes end_general = states + max(gather_max, gather_near_first);
                const Bytes end_pool = compile_pool ? bwd_end - std::min(bwd_end, end_general)
                                             : grad_pair + (has_layers && recompute > Bytes(0) ? recompute : Bytes(0));
                add(bwd_end, end_pool);
                // Optimizer step (eager): compile's gradients and held logits are pool tensors.
                const Bytes opt_pool = compile_pool ? held_l + (grad_buffer ? Bytes(0) : G_step + round_grads) : Bytes(0);
                add(opt, opt_pool);
                Bytes peak_pool;
                if (opt > sm.forward_backward_peak) peak_pool = opt_pool;
                else if (bwd_end > fb) peak_pool = end_pool;
                else peak_pool = pool_of(worst);
                peak_pool = std::min(peak_pool, sm.allocated);
                // The pool's segments: its peak in 2 MiB pages (kRoundLarge).
                sm.graph_pool = pool_max.round_up(MiB(2).count());
                sm.graph_pool_idle = sm.graph_pool - peak_pool;
                sm.graph_general_extra = general_max - std::min(general_max, sm.allocated - peak_pool);
            }
        } else {
            // Generation (HF generate()): the prompt through this rank's blocks
            // with the KV cache growing layer by layer, then decode steps that
            // re-make each layer's cache one token longer (torch.cat); the last
            // step is the largest. Block working sets by liveness
            // (no_grad_working_set), the rank's share of the key/value heads:
            // ceil(kv_heads / tp) of kv_heads (replicated when tp > kv_heads),
            // an MLA latent whole.
            const InferencePieces ip = inference_pieces(g, job);
            const std::int64_t prompt = job.seq, gen = job.req.gen_len;
            Bytes tmp;
            if (graph) {
                std::int64_t per_layer_tok = 0;
                if (td && td->kv_elements_per_token > 0) {
                    per_layer_tok = td->kv_elements_per_token / std::max<std::int64_t>(1, td->kv_layers());
                    if (!td->latent_kv && td->kv_heads > 0 && t > 1) per_layer_tok = per_layer_tok / td->kv_heads * ((td->kv_heads + t - 1) / t);
                }
                // A linear-attention layer's state (held from the prefill on, not grown).
                const Bytes state = td ? td->hf_linear_state_bytes(job.req.batch, t, ip.kv_dtype) : Bytes(0);
                std::int64_t linear_layers = 0;
                auto half = [&](std::int64_t len) { return dtype_bytes(ip.kv_dtype, checked_mul(checked_mul(job.req.batch, len), per_layer_tok / 2)); };
                auto dequant_of = [&](const Block& b) {
                    std::vector<Bytes> dq(b.ops.size());
                    if (dequantizes(job.quant))
                        for (std::size_t o = 0; o < b.ops.size(); ++o)
                            if (b.ops[o].kind == OpKind::Linear)
                                for (auto pi : b.ops[o].params) {
                                    const Param& prm = b.params[static_cast<std::size_t>(pi)];
                                    if (quantized_weight(prm, job.quant, job.req.quantize_head))
                                        dq[o] = dtype_bytes(job.lowered, prm.shape[0] * prm.shape[1]).ceil_div(t);
                                }
                    return dq;
                };
                Bytes kv, peak, ws_decode;
                for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
                    const std::int64_t n = rank_inst[bi];
                    if (n == 0) continue;
                    const Block& b = g.blocks[bi];
                    const std::vector<Bytes> dq = dequant_of(b);
                    ActivationContext pc = job.actx;
                    pc.seq = td && bi + 1 == g.blocks.size() ? 1 : prompt;  // generate's logits_to_keep=1
                    const Bytes ws = no_grad_working_set(b, pc, &dq);
                    ActivationContext dc = job.actx;
                    dc.seq = 1;
                    ws_decode = max(ws_decode, no_grad_working_set(b, dc, &dq));
                    for (std::int64_t k = 0; k < n; ++k) {
                        peak = max(peak, kv + ws);
                        if (b.checkpointable && b.linear_attention) {
                            kv += state;
                            ++linear_layers;
                        } else if (b.checkpointable && per_layer_tok > 0) {
                            kv += half(prompt) * 2;
                        }
                    }
                }
                sm.kv_cache = kv;
                if (gen > 0 && per_layer_tok > 0) {
                    const std::int64_t len = checked_add(prompt, gen);
                    sm.kv_cache = half(len) * (2 * (layers - linear_layers)) + state * linear_layers;
                    // The last step's final torch.cat: every cache one token longer,
                    // the last one's old copy still alive.
                    peak = max(peak, sm.kv_cache + max(half(len - 1), ws_decode));
                }
                tmp = peak - std::min(peak, sm.kv_cache);
            }
            sm.transient = tmp;
            sm.rounding = round_states;
            sm.allocated = W + round_states + sm.kv_cache + tmp;
            sm.forward_backward_peak = sm.allocated;
            sm.peak_phase = job.req.gen_len > 0 ? "decode" : "prefill";
        }
        res.stages.push_back(std::move(sm));
    }
    for (std::size_t i = 1; i < res.stages.size(); ++i)
        if (res.stages[i].allocated > res.stages[static_cast<std::size_t>(res.most_loaded)].allocated) res.most_loaded = static_cast<std::int64_t>(i);

    // NCCL keeps its buffers outside the caching allocator, per communicator.
    std::int64_t comms = 0;
    for (auto n : {lay.dp, t, p, c.cp, c.ep})
        if (n > 1) ++comms;
    res.nccl_outside = c.nccl_per_communicator * comms;

    // Offload: CPU (or NVMe) per node.
    const std::int64_t ranks = lay.gpus_per_node;
    const StageMemory& ml = res.stages[static_cast<std::size_t>(res.most_loaded)];
    const std::vector<RankTensor>& ml_tensors = *stage_tensors[static_cast<std::size_t>(ml.stage)];
    if (job.train && c.offload_optimizer != Offload::None) {
        // fp32 master weights and states, plus the fp32 gradients DeepSpeed keeps on the CPU for the update.
        Bytes states;
        for (const auto& rt : ml_tensors) {
            if (!rt.trainable) continue;
            const std::int64_t e = rt.sharded_elems(true);
            states += (optimizer_bytes(job.req.optimizer, TrainTensor{{e}, rt.copies}, job.state_dt) + dtype_bytes(DType::F32, e) * rt.copies * 2);
        }
        if (c.offload_optimizer == Offload::Cpu) res.cpu_per_node += states * ranks;
        else {
            res.nvme_per_node += states * ranks;
            res.cpu_per_node += half_unit * checked_mul(4, c.zero_bucket_elements) * ranks;  // pinned swap buffers
        }
    }
    if (c.offload_params != Offload::None) {
        Bytes params;
        for (const auto& rt : ml_tensors) params += dtype_bytes(job.wdt, rt.sharded_elems(true)) * rt.copies;
        if (c.offload_params == Offload::Cpu) res.cpu_per_node += params * ranks;
        else res.nvme_per_node += params * ranks;
    }

    // Communication volume per optimizer step and GPU (ring all-reduce moves
    // 2 (n-1)/n of the buffer; seed 002: TP 8bsh, DP 16h^2 per layer, PP 2bsh).
    auto ring = [](Bytes b, std::int64_t n) { return n > 1 ? Bytes(b.count() / n * (n - 1) * 2) : Bytes(0); };
    if (g.transformer && job.train) {
        const Bytes act_tok = dtype_bytes(job.lowered, checked_mul(checked_mul(job.req.batch, s_local), g.transformer->hidden));
        res.comm.tp_per_step = ring(act_tok, t) * checked_mul(4, ml.layers) * m;  // 2 all-reduces forward, 2 backward
        res.comm.pp_per_step = p > 1 ? act_tok * 2 * m * vpp : Bytes(0);
        res.comm.cp_per_step = c.cp > 1 ? ring(act_tok, c.cp) * ml.layers * m : Bytes(0);
        res.comm.ep_per_step = c.ep > 1 ? act_tok * checked_mul(4, std::max<std::int64_t>(1, g.transformer->experts_per_token)) * ml.layers * m
                                        : Bytes(0);
    }
    if (job.train) {
        Bytes grads_full, weights_half;
        for (const auto& rt : ml_tensors)
            if (rt.trainable) {
                grads_full += dtype_bytes(job.tdt, rt.elems) * rt.copies;
                weights_half += half_unit * rt.elems * rt.copies;
            }
        res.comm.dp_per_step = ring(grads_full, lay.dp) + (zero3 && lay.dp > 1 ? weights_half : Bytes(0));
    }

    res.notes.push_back("layout: dp " + std::to_string(lay.dp) + " x tp " + std::to_string(t) + " x pp " + std::to_string(p) + " x cp " +
                        std::to_string(c.cp) + (c.ep > 1 ? " (ep " + std::to_string(c.ep) + ")" : "") + " on " + std::to_string(c.gpus) +
                        " GPUs, " + std::to_string(lay.gpus_per_node) + " per node" +
                        (lay.nodes_assumed ? " (not whole boards of this GPU: equal nodes assumed; say --nodes or --gpus-per-node)" : ""));
    if (p > 1) {
        std::string split;
        for (auto v : lay.stage_layers) split += (split.empty() ? "" : ",") + std::to_string(v);
        res.notes.push_back("pipeline: " + std::string(vpp > 1 ? "interleaved (vpp " + std::to_string(vpp) + ")" : "1F1B") +
                            ", layers per virtual stage " + split + "; each rank keeps the micro-batches its schedule has in flight "
                            "(Megatron schedules.py warm-up counts)");
    }
    if (c.capacity_factor != 1.0)
        res.notes.push_back("routed-expert activations scaled by the capacity factor " + std::to_string(c.capacity_factor));
    return res;
}

bool fsdp_holds_root(const ModelGraph& g, const Job& job) {
    const ParallelConfig& c = job.layout.cfg;
    if (!job.train || (c.fsdp != Fsdp::Full && c.fsdp != Fsdp::Hybrid) || c.zero == 3 || std::max<std::int64_t>(1, c.pp) > 1) return false;
    if (!g.transformer || g.params_only != 0 || g.blocks.size() < 3) return false;
    return has_tied_output_head(g) || c.fsdp_version == 1 || job.framework.framework == Framework::Torchtune ||
           job.framework.framework == Framework::LitGPT;
}

Bytes model_states_floor(const ModelGraph& g_in, const Job& job) {
    if (!job.train) return Bytes(0);
    const ModelGraph& g = job_graph(g_in, job);
    const Layout& lay = job.layout;
    const std::int64_t p = std::max<std::int64_t>(1, lay.cfg.pp);
    const StateFlags flags = state_flags(job);
    // Each rank's block instances, as parallel_memory counts them (rank v % pp
    // of every virtual stage v an instance runs in).
    std::vector<std::vector<std::int64_t>> counts(static_cast<std::size_t>(p), std::vector<std::int64_t>(g.blocks.size(), 0));
    if (g.params_only == 0) {
        const auto stages = assign_virtual_stages(g, lay);
        for (std::size_t bi = 0; bi < stages.size() && bi < g.blocks.size(); ++bi)
            for (auto v : stages[bi]) ++counts[static_cast<std::size_t>(v % p)][bi];
    }
    static thread_local RankKinds kinds;  // (its storage kept: the planner calls this once per layout)
    kinds.clear();
    Bytes floor;
    for (std::int64_t r = 0; r < p; ++r) {
        const auto& inst = counts[static_cast<std::size_t>(r)];
        const bool is_last = r == lay.last_rank();
        if (kinds.find(inst, is_last)) continue;  // the same states as a rank already counted
        const RankStates st = rank_states(g, job, rank_tensors(g, job, inst, r), flags);
        kinds.add(inst, is_last, static_cast<std::size_t>(r), st);
        floor = max(floor, st.W + st.M + st.O + st.F8 + st.round_states);
    }
    return floor;
}

}  // namespace gpumem
