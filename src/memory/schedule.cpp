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

std::vector<PipelineOp> pipeline_schedule(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank) {
    vpp = std::max<std::int64_t>(1, vpp);
    const std::int64_t total = checked_mul(m, vpp);
    const std::int64_t warm = pipeline_warmup(pp, vpp, m, rank);
    // The k-th forward (backward) chunk of the rank: micro-batch
    // (k / (pp vpp)) pp + k % pp, model chunk (k % (pp vpp)) / pp (backward:
    // the chunks in reverse); counted as k advances, without divisions.
    struct Cursor {
        std::int64_t pp, vpp;
        bool forward;
        std::int64_t in_pp = 0, chunk = 0, base = 0;  // k % pp, (k % (pp vpp)) / pp, (k / (pp vpp)) pp
        PipelineOp take() {
            PipelineOp op;
            op.forward = forward;
            op.micro_batch = base + in_pp;
            op.chunk = forward ? chunk : vpp - 1 - chunk;
            if (++in_pp == pp) {
                in_pp = 0;
                if (++chunk == vpp) {
                    chunk = 0;
                    base += pp;
                }
            }
            return op;
        }
    };
    Cursor fwd{pp, vpp, true}, bwd{pp, vpp, false};
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
