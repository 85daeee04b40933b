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
