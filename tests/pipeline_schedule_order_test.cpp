// pipeline_schedule (memory/parallel.hpp) against Megatron-LM's formulas
// written out directly (megatron/core/pipeline_parallel/schedules.py,
// d98e8a64ddf3: get_model_chunk_id L1244 and the micro-batch of a virtual
// micro-batch id, get_schedule_table L989-1016): warm-up forwards, then one
// forward and one backward alternating, then the remaining backwards;
// forward k runs model chunk (k mod (pp vpp)) / pp of micro-batch
// (k / (pp vpp)) pp + k mod pp, backward k the chunks in reverse order.
#include <gtest/gtest.h>

#include <vector>

#include "gpumem/memory/parallel.hpp"

using namespace gpumem;

namespace {

PipelineOp megatron_op(std::int64_t k, bool forward, std::int64_t pp, std::int64_t vpp) {
    PipelineOp op;
    op.forward = forward;
    if (vpp == 1) {
        op.micro_batch = k;
        op.chunk = 0;
        return op;
    }
    const std::int64_t group = pp * vpp;
    const std::int64_t c = (k % group) / pp;
    op.chunk = forward ? c : vpp - 1 - c;
    op.micro_batch = (k / group) * pp + k % pp;
    return op;
}

}  // namespace

TEST(PipelineScheduleOrder, MatchesMegatronsFormulas) {
    for (std::int64_t pp = 1; pp <= 9; ++pp)
        for (std::int64_t vpp = 1; vpp <= 5; ++vpp)
            for (std::int64_t m = 1; m <= 40; m += (m < 12 ? 1 : 7))
                for (std::int64_t rank = 0; rank < pp; ++rank) {
                    const std::int64_t total = m * vpp;
                    const std::int64_t warm = pipeline_warmup(pp, vpp, m, rank);
                    std::vector<PipelineOp> want;
                    for (std::int64_t k = 0; k < warm; ++k) want.push_back(megatron_op(k, true, pp, vpp));
                    for (std::int64_t k = 0; k < total - warm; ++k) {
                        want.push_back(megatron_op(warm + k, true, pp, vpp));
                        want.push_back(megatron_op(k, false, pp, vpp));
                    }
                    for (std::int64_t k = total - warm; k < total; ++k) want.push_back(megatron_op(k, false, pp, vpp));
                    const std::vector<PipelineOp> got = pipeline_schedule(pp, vpp, m, rank);
                    ASSERT_EQ(got.size(), want.size()) << pp << " " << vpp << " " << m << " " << rank;
                    for (std::size_t i = 0; i < got.size(); ++i) {
                        ASSERT_EQ(got[i].forward, want[i].forward) << i;
                        ASSERT_EQ(got[i].micro_batch, want[i].micro_batch) << pp << " " << vpp << " " << m << " " << rank << " op " << i;
                        ASSERT_EQ(got[i].chunk, want[i].chunk) << pp << " " << vpp << " " << m << " " << rank << " op " << i;
                    }
                }
}

// pipeline_schedule_runs expands to pipeline_schedule's order of forwards and
// backwards and their chunks.
TEST(PipelineScheduleOrder, RunsExpandToTheSchedule) {
    for (std::int64_t pp = 1; pp <= 9; ++pp)
        for (std::int64_t vpp = 1; vpp <= 5; ++vpp)
            for (std::int64_t m = 1; m <= 60; m += (m < 12 ? 1 : 7))
                for (std::int64_t rank = 0; rank < pp; ++rank) {
                    std::vector<std::pair<bool, std::int64_t>> expanded;
                    for (const PipelineRun& run : pipeline_schedule_runs(pp, vpp, m, rank)) {
                        ASSERT_GT(run.count, 0);
                        for (std::int64_t k = 0; k < run.count; ++k) {
                            if (run.fwd >= 0) expanded.emplace_back(true, run.fwd);
                            if (run.bwd >= 0) expanded.emplace_back(false, run.bwd);
                        }
                    }
                    const std::vector<PipelineOp> ops = pipeline_schedule(pp, vpp, m, rank);
                    ASSERT_EQ(expanded.size(), ops.size()) << pp << " " << vpp << " " << m << " " << rank;
                    for (std::size_t i = 0; i < ops.size(); ++i) {
                        ASSERT_EQ(expanded[i].first, ops[i].forward) << pp << " " << vpp << " " << m << " " << rank << " op " << i;
                        ASSERT_EQ(expanded[i].second, ops[i].chunk) << pp << " " << vpp << " " << m << " " << rank << " op " << i;
                    }
                }
}

// The walk run by run (units between a run's second and last skipped) finds
// what the walk op by op finds, on generated loads: sizes drawn from a few
// values so that ties between forwards occur, zero loads, every chunk alike
// or not, gradients held throughout or made by the first backward, rank 0
// (the embedding's backwards) or not.
TEST(PipelineScheduleOrder, WalkByRunsEqualsWalkByOps) {
    std::uint64_t state = 0x9e3779b97f4a7c15ULL;
    auto next = [&](std::uint64_t n) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state % n;
    };
    int walks = 0, skipped = 0;
    for (std::int64_t pp = 1; pp <= 8; ++pp)
        for (std::int64_t vpp = 1; vpp <= 4; ++vpp)
            for (std::int64_t m : {1, 2, 3, 5, 8, 13, 24, 40})
                for (std::int64_t rank = 0; rank < pp; ++rank)
                    for (int draw = 0; draw < 3; ++draw) {
                        const auto n = static_cast<std::size_t>(vpp);
                        const bool alike = next(3) == 0;
                        std::vector<Bytes> act(n), nl(n), gather(n), grad(n), tail(n);
                        for (std::size_t c = 0; c < n; ++c) {
                            const std::size_t src = alike ? 0 : c;
                            if (src < c) {
                                act[c] = act[src], nl[c] = nl[src], gather[c] = gather[src], grad[c] = grad[src], tail[c] = tail[src];
                                continue;
                            }
                            act[c] = Bytes(static_cast<std::int64_t>(next(4)) * 1000);
                            nl[c] = Bytes(std::min<std::int64_t>(act[c].count(), static_cast<std::int64_t>(next(3)) * 400));
                            gather[c] = Bytes(static_cast<std::int64_t>(next(3)) * 500);
                            grad[c] = Bytes(static_cast<std::int64_t>(next(4)) * 700);
                            tail[c] = Bytes(std::min<std::int64_t>(grad[c].count(), static_cast<std::int64_t>(next(3)) * 300));
                        }
                        ScheduleLoads in;
                        in.act = act;
                        in.nl = nl;
                        in.gather = gather;
                        in.grad = grad;
                        in.tail_grad = tail;
                        for (const Bytes& g : grad) in.all_grads += g;
                        in.always_grads = next(2) == 0;
                        in.embedding_rank = rank == 0 || next(4) == 0;
                        const auto runs = pipeline_schedule_runs(pp, vpp, m, rank);
                        const ScheduleWalk want = walk_schedule(in, pipeline_schedule(pp, vpp, m, rank));
                        const ScheduleWalk got = walk_schedule(in, runs);
                        ++walks;
                        for (const auto& r : runs) skipped += r.count > 3 ? 1 : 0;
                        ASSERT_EQ(got, want) << "pp " << pp << " vpp " << vpp << " m " << m << " rank " << rank << " draw " << draw << ": peak "
                                             << got.act_peak.count() << " vs " << want.act_peak.count() << ", in flight " << got.inflight_peak << " vs "
                                             << want.inflight_peak << ", end " << got.end_base.count() << " vs " << want.end_base.count();
                    }
    EXPECT_GT(walks, 2000);
    EXPECT_GT(skipped, 1000);  // the grid reaches runs long enough to skip units
}

// The backward start the walk reports (ScheduleWalk::bwd_*), by hand: 1F1B on
// stage 0 of 4 with 4 micro-batches runs F0 F1 F2 F3 B0 B1 B2 B3. A chunk of
// 10,000 bytes of activations and 15,000 of gradients: B0 starts with 40,000
// in flight and no gradient (40,000), B1 with 30,000 and every gradient
// (45,000), B2 35,000, B3 25,000: B1's start. The forward peak stays F3's
// (40,000 in flight, no gradient).
TEST(PipelineScheduleWalk, BackwardStartWithTheGradientsMade) {
    const std::vector<Bytes> act{Bytes(10'000)}, none{Bytes(0)}, grad{Bytes(15'000)};
    ScheduleLoads in;
    in.act = act;
    in.nl = none;
    in.gather = none;
    in.grad = grad;
    in.tail_grad = none;
    in.all_grads = Bytes(15'000);
    in.embedding_rank = true;
    for (const bool by_runs : {false, true}) {
        const ScheduleWalk w = by_runs ? walk_schedule(in, pipeline_schedule_runs(4, 1, 4, 0)) : walk_schedule(in, pipeline_schedule(4, 1, 4, 0));
        EXPECT_TRUE(w.bwd_seen);
        EXPECT_EQ(w.bwd_act.count(), 30'000);
        EXPECT_EQ(w.bwd_g.count(), 15'000);
        EXPECT_EQ(w.act_peak.count(), 40'000);
        EXPECT_EQ(w.g_at_peak.count(), 0);
        // Gradients that exist throughout (Megatron's buffer): B0's start.
        ScheduleLoads always = in;
        always.always_grads = true;
        const ScheduleWalk a = by_runs ? walk_schedule(always, pipeline_schedule_runs(4, 1, 4, 0)) : walk_schedule(always, pipeline_schedule(4, 1, 4, 0));
        EXPECT_EQ(a.bwd_act.count(), 40'000);
        EXPECT_EQ(a.bwd_g.count(), 15'000);
    }
}
