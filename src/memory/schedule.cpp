// Pipeline schedules: the order in which one pipeline rank runs the forwards
// and backwards of its micro-batches (and model chunks), as Megatron-LM runs
// them (NVIDIA/Megatron-LM commit d98e8a64ddf3,
// megatron/core/pipeline_parallel/schedules.py):
//   1F1B (forward_backward_pipelining_without_interleaving, L2277-2279):
//     num_warmup_microbatches = min(pp - rank - 1, m); then a forward and a
//     backward alternate (the forward first, L2421-2427); the remaining
//     backwards drain.
//   interleaved (get_pp_rank_microbatches L949-979, get_schedule_table
//   L989-1016, get_model_chunk_id L1244): warm-up = (pp - rank - 1) * 2 +
//   (vpp - 1) * N model-chunk forwards, capped at m * vpp, with
//   N = microbatch_group_size_per_vp_stage = pp by default
//   (model_parallel_config.py L567-568); forward k runs chunk
//   (k mod (N vpp)) / N of micro-batch (k / (N vpp)) N + k mod N; backward k
//   runs the chunks in reverse order (vpp - 1 - that chunk).
// A rank keeps the activations of every forward whose backward has not run:
// the warm-up count + 1 at the peak (rank 0: pp micro-batches under 1F1B,
// pp (1 + (pp-1)/(pp vpp)) under the interleaved schedule, the penalty of
// megatron/training/theoretical_memory_usage.py L341-355).
#include <algorithm>

#include "gpumem/memory/parallel.hpp"

namespace gpumem {

std::int64_t pipeline_warmup(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank) {
    if (pp <= 1) return 0;
    if (vpp <= 1) return std::min(pp - rank - 1, m);
    const std::int64_t total = checked_mul(m, vpp);
    return std::min(checked_add(checked_mul(pp - rank - 1, 2), checked_mul(vpp - 1, pp)), total);
}

namespace {

// The k-th forward (backward) chunk of a rank: micro-batch (k / (pp vpp)) pp
// + k % pp, model chunk (k % (pp vpp)) / pp (backward: the chunks in
// reverse); counted as k advances, without divisions. The chunk changes when
// k % pp wraps, so a run of left() operations shares it.
struct ScheduleCursor {
    std::int64_t pp, vpp;
    bool forward;
    std::int64_t in_pp = 0, chunk = 0, base = 0;  // k % pp, (k % (pp vpp)) / pp, (k / (pp vpp)) pp
    [[nodiscard]] std::int64_t left() const { return pp - in_pp; }
    [[nodiscard]] std::int64_t now() const { return forward ? chunk : vpp - 1 - chunk; }
    void advance(std::int64_t n) {  // n <= left()
        in_pp += n;
        if (in_pp == pp) {
            in_pp = 0;
            if (++chunk == vpp) {
                chunk = 0;
                base += pp;
            }
        }
    }
    PipelineOp take() {
        PipelineOp op;
        op.forward = forward;
        op.micro_batch = base + in_pp;
        op.chunk = now();
        advance(1);
        return op;
    }
};

}  // namespace

std::vector<PipelineOp> pipeline_schedule(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank) {
    vpp = std::max<std::int64_t>(1, vpp);
    const std::int64_t total = checked_mul(m, vpp);
    const std::int64_t warm = pipeline_warmup(pp, vpp, m, rank);
    ScheduleCursor fwd{pp, vpp, true}, bwd{pp, vpp, false};
    std::vector<PipelineOp> ops;
    ops.reserve(static_cast<std::size_t>(2 * total));
    for (std::int64_t k = 0; k < warm; ++k) ops.push_back(fwd.take());
    for (std::int64_t k = 0; k < total - warm; ++k) {
        ops.push_back(fwd.take());
        ops.push_back(bwd.take());
    }
    for (std::int64_t k = total - warm; k < total; ++k) ops.push_back(bwd.take());
    return ops;
}

std::vector<PipelineRun> pipeline_schedule_runs(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank) {
    std::vector<PipelineRun> runs;
    pipeline_schedule_runs(pp, vpp, m, rank, runs);
    return runs;
}

void pipeline_schedule_runs(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank, std::vector<PipelineRun>& runs) {
    runs.clear();
    vpp = std::max<std::int64_t>(1, vpp);
    pp = std::max<std::int64_t>(1, pp);
    const std::int64_t total = checked_mul(m, vpp);
    const std::int64_t warm = pipeline_warmup(pp, vpp, m, rank);
    // pipeline_schedule's cursors, advanced a run at a time.
    ScheduleCursor fwd{pp, vpp, true}, bwd{pp, vpp, false};
    auto push = [&](std::int64_t f, std::int64_t b, std::int64_t n) {
        if (!runs.empty() && runs.back().fwd == f && runs.back().bwd == b) runs.back().count += n;
        else runs.push_back({f, b, n});
    };
    for (std::int64_t left = warm; left > 0;) {
        const std::int64_t n = std::min(left, fwd.left());
        push(fwd.now(), -1, n);
        fwd.advance(n);
        left -= n;
    }
    for (std::int64_t left = total - warm; left > 0;) {
        const std::int64_t n = std::min({left, fwd.left(), bwd.left()});
        push(fwd.now(), bwd.now(), n);
        fwd.advance(n);
        bwd.advance(n);
        left -= n;
    }
    for (std::int64_t left = warm; left > 0;) {
        const std::int64_t n = std::min(left, bwd.left());
        push(-1, bwd.now(), n);
        bwd.advance(n);
        left -= n;
    }
}

namespace {

// One rank's walk: activations and gathered parameters in flight, gradients
// present (each chunk's made by its first backward).
struct Walker {
    const ScheduleLoads& in;
    ScheduleWalk out;
    Bytes cur, cur_nl, cur_gather, g_present;
    std::int64_t n_in = 0;
    std::vector<char>& done;
    bool first = true;

    // `done`: storage reused by the thread's walks (a planner's search walks
    // every pipeline rank of every layout it scores; a fresh vector per walk
    // was a tenth of its heap allocations). Walks do not nest.
    Walker(const ScheduleLoads& loads, std::vector<char>& done_storage) : in(loads), done(done_storage) { done.assign(loads.act.size(), 0); }

    void forward(std::size_t ch) {
        cur += in.act[ch];
        cur_nl += in.nl[ch];
        cur_gather += in.gather[ch];
        ++n_in;
        const Bytes total = cur + cur_gather + g_present, best = out.act_peak + out.kept_gather + out.g_at_peak;
        if (first || total > best || (total == best && n_in > out.inflight_peak)) {
            first = false;
            out.act_peak = cur;
            out.act_nl_peak = cur_nl;
            out.kept_gather = cur_gather;
            out.g_at_peak = g_present;
            out.inflight_peak = n_in;
        }
    }
    void backward(std::size_t ch) {
        const bool was_done = done[ch] != 0;
        // Its start: this chunk's activations in flight, the gradients made
        // so far (a chunk backwarded before has all of its own).
        const Bytes g_before = in.always_grads ? in.all_grads : g_present;
        if (!out.bwd_seen || cur + cur_gather + g_before > out.bwd_act + out.bwd_gather + out.bwd_g) {
            out.bwd_seen = true;
            out.bwd_act = cur;
            out.bwd_nl = cur_nl;
            out.bwd_gather = cur_gather;
            out.bwd_g = g_before;
        }
        const Bytes after = cur - in.act[ch] + cur_gather - in.gather[ch] + (in.always_grads ? in.all_grads : g_present + (was_done ? Bytes(0) : in.grad[ch]));
        out.end_base = max(out.end_base, after);
        // The chunk's first layer, backwarded last: every other gradient of
        // the chunk exists (new ones on its first backward).
        out.end_first_layer = max(out.end_first_layer, after - (was_done || in.always_grads ? Bytes(0) : in.tail_grad[ch]));
        if (ch == 0 && in.embedding_rank) {
            if (was_done || in.always_grads) {
                out.end_emb_acc = max(out.end_emb_acc, after);
                out.end_emb_acc_seen = true;
            } else {
                out.end_emb_new = max(out.end_emb_new, after);
                out.end_emb_new_seen = true;
            }
        }
        cur -= in.act[ch];
        cur_nl -= in.nl[ch];
        cur_gather -= in.gather[ch];
        --n_in;
        if (!was_done) g_present += in.grad[ch];
        done[ch] = 1;
    }
};

}  // namespace

ScheduleWalk walk_schedule(const ScheduleLoads& in, const std::vector<PipelineOp>& ops) {
    static thread_local std::vector<char> done;
    Walker w(in, done);
    for (const PipelineOp& op : ops) {
        const auto ch = static_cast<std::size_t>(op.chunk);
        if (op.forward) w.forward(ch);
        else w.backward(ch);
    }
    return w.out;
}

ScheduleWalk walk_schedule(const ScheduleLoads& in, const std::vector<PipelineRun>& runs) {
    static thread_local std::vector<char> done;
    Walker w(in, done);
    for (const PipelineRun& run : runs) {
        const auto f = static_cast<std::size_t>(run.fwd), b = static_cast<std::size_t>(run.bwd);
        auto unit = [&] {
            if (run.fwd >= 0) w.forward(f);
            if (run.bwd >= 0) w.backward(b);
        };
        if (run.count <= 3) {
            for (std::int64_t k = 0; k < run.count; ++k) unit();
            continue;
        }
        // The first unit may create the backward chunk's gradients; from the
        // second on each unit moves the amounts by the same step, so the
        // values units 3 .. count-1 measure lie between the second's and the
        // last's (forward peaks: ordered by (total, in flight), both linear).
        unit();
        unit();
        const std::int64_t skip = run.count - 3;
        // What `skip` units add to one amount in flight (a forward adds its chunk's, a backward takes its chunk's away).
        auto skipped = [&](std::span<const Bytes> amount) {
            return ((run.fwd >= 0 ? amount[f] : Bytes(0)) - (run.bwd >= 0 ? amount[b] : Bytes(0))) * skip;
        };
        w.cur += skipped(in.act);
        w.cur_nl += skipped(in.nl);
        w.cur_gather += skipped(in.gather);
        w.n_in = checked_add(w.n_in, checked_mul((run.fwd >= 0 ? 1 : 0) - (run.bwd >= 0 ? 1 : 0), skip));
        unit();
    }
    return w.out;
}

std::int64_t pipeline_steady_micro_batches(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank) {
    // After the warm-up, the first backward creates the gradients and the
    // second accumulates into them; from the third on each steady-state step
    // repeats the previous one (same sizes allocated and freed in the same
    // order), and the cool-down frees what the warm-up allocated.
    if (pp <= 1) return std::min<std::int64_t>(m, 3);
    if (vpp <= 1) return std::min(m, pipeline_warmup(pp, 1, m, rank) + 3);
    // Interleaved: whole groups of pp micro-batches, two beyond the warm-up.
    const std::int64_t warm_chunks = checked_add(checked_mul(pp - rank - 1, 2), checked_mul(vpp - 1, pp));
    const std::int64_t groups = (warm_chunks + checked_mul(pp, vpp)) / checked_mul(pp, vpp) + 2;
    return std::min(m, checked_mul(groups, pp));
}

}  // namespace gpumem
