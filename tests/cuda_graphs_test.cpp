// CUDA graphs in training (--cuda-graphs, memory/framework.hpp): the graphs'
// private pool of the caching allocator, in the allocator model, the analytic
// estimate and the step simulation. Expected values are computed here from the
// rules the code cites (docs/frameworks.md, "CUDA graphs in training").
#include <gtest/gtest.h>

#include <cmath>

#include "gpumem/memory/blocks.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/allocator.hpp"
#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// A small Llama: h=512, 8 heads (kv 4), I=1376, V=8000.
ModelGraph llama_like(int layers = 4) {
    return test::llama_graph({.hidden = 512, .heads = 8, .kv_heads = 4, .layers = layers, .intermediate = 1376, .vocab = 8000, .max_positions = 8192});
}

EstimateResult run(const ModelGraph& g, const EstimateRequest& r, bool simulate) {
    auto e = simulate ? simulate_estimate(g, r) : estimate(g, r);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
    return std::move(e).value();
}

Bytes row(const EstimateResult& e, const std::string& key) { return test::breakdown_row(e, key); }
Bytes rows_sum(const EstimateResult& e) { return test::breakdown_sum(e); }

// The analytic estimate of `r` and its per-stage view (one stage here).
struct Analytic {
    EstimateResult e;
    ParallelResult par;
    [[nodiscard]] const Job& job() const { return *e.job; }
    [[nodiscard]] const StageMemory& stage() const { return par.stages[0]; }
};
Analytic analytic(const ModelGraph& g, const EstimateRequest& r) {
    EstimateResult e = run(g, r, false);
    ParallelResult par = parallel_memory(g, *e.job);
    return {std::move(e), std::move(par)};
}

double rel(Bytes a, Bytes b) { return std::fabs(static_cast<double>(a.count() - b.count())) / static_cast<double>(b.count()); }

}  // namespace

// The allocator's private pool (CUDACachingAllocator.cpp: a capture's
// allocations go to its PrivatePool, which has its own block sets;
// release_cached_blocks frees a pool's blocks only once releasePool made it
// freeable): freed graph blocks serve no eager request, an eager request takes
// a new segment, and empty_cache() releases the eager segment only.
TEST(CudaGraphs, PrivatePoolServesOnlyTheGraphAndSurvivesEmptyCache) {
    sim::CachingAllocator a(sim::AllocatorConfig{}, GiB(80));
    const auto g = a.malloc(MiB(100), sim::kGraphPoolStream);
    ASSERT_TRUE(g.ok);
    EXPECT_EQ(a.stats().reserved_private, MiB(100));
    EXPECT_EQ(a.stats().allocated_private, MiB(100));
    a.free(g.handle);
    EXPECT_EQ(a.stats().allocated_private, Bytes(0));
    EXPECT_EQ(a.largest_free_block(), Bytes(0)) << "a graph pool's free block is not free for eager requests";
    const auto e = a.malloc(MiB(100), 0);
    ASSERT_TRUE(e.ok);
    EXPECT_EQ(a.stats().reserved, MiB(200)) << "the eager request cannot reuse the pool's block";
    a.free(e.handle);
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved, MiB(100)) << "empty_cache() keeps the live graph's pool";
    EXPECT_EQ(a.stats().reserved_private, MiB(100));
    // The graph's next allocation of the same size reuses its block.
    const auto g2 = a.malloc(MiB(100), sim::kGraphPoolStream);
    ASSERT_TRUE(g2.ok);
    EXPECT_EQ(a.stats().reserved, MiB(100));
}

// Off is today's estimate: no pool row, no pool bytes; on, the allocated peak
// is unchanged (a capture allocates what the eager step allocates; replays
// allocate nothing) and every breakdown still sums to its total.
TEST(CudaGraphs, OffIsTodayAndAllocatedIsUnchanged) {
    const ModelGraph g = llama_like();
    for (const bool simulate : {false, true}) {
        EstimateRequest off;
        off.batch = 2;
        off.seq = 256;
        off.analytic = !simulate;
        const EstimateResult e0 = run(g, off, simulate);
        EXPECT_EQ(row(e0, "cuda_graph_pool"), Bytes(-1));
        EXPECT_EQ(rows_sum(e0), e0.per_gpu.total_device);
        EstimateRequest on = off;
        on.cuda_graphs = CudaGraphs::Compile;
        on.compile = true;
        EstimateRequest compiled = off;
        compiled.compile = true;  // the same kernels without graphs
        const EstimateResult ec = run(g, compiled, simulate), eg = run(g, on, simulate);
        EXPECT_NEAR(static_cast<double>(eg.per_gpu.peak_allocated.count()), static_cast<double>(ec.per_gpu.peak_allocated.count()),
                    0.01 * static_cast<double>(ec.per_gpu.peak_allocated.count()))
            << (simulate ? "simulated" : "analytic");
        EXPECT_GE(row(eg, "cuda_graph_pool"), Bytes(0));
        EXPECT_EQ(rows_sum(eg), eg.per_gpu.total_device);
    }
    // --cuda-graphs compile is torch.compile: it implies --compile.
    EstimateRequest r;
    r.batch = 1;
    r.seq = 128;
    r.cuda_graphs = CudaGraphs::Compile;
    auto job = resolve_job(g, r);
    ASSERT_TRUE(job.ok());
    EXPECT_TRUE(job.value().req.compile.value_or(false));
    EXPECT_EQ(job.value().framework.cuda_graphs, CudaGraphs::Compile);
}

TEST(CudaGraphs, InvalidCombinationsNameTheFlag) {
    const ModelGraph g = llama_like();
    EstimateRequest r;
    r.cuda_graphs = CudaGraphs::Megatron;  // hf framework
    auto e = estimate(g, r);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find("--framework megatron"), std::string::npos) << e.error().message;
    r.cuda_graphs = CudaGraphs::Compile;
    r.compile = false;
    e = estimate(g, r);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find("--compile"), std::string::npos) << e.error().message;
}

// torch.compile(mode="reduce-overhead"), fp32 AdamW (foreach), peak in the
// optimizer step. Rules: the forward/backward (activations, temporaries and
// the parameter gradients the backward graph returns) live in the graph pool;
// weights and states in the general pool, with the foreach step's one
// state-sized temporary list (4 bytes x parameters). So
//   general peak = states + t_opt               (at the optimizer step)
//   pool peak    = max(fb - states, G + rounding of G)
//   reserved     = allocated + cache + (pool peak in 2 MiB pages - G - its rounding)
// where fb is the eager forward/backward peak, and at the optimizer step the
// pool holds only the gradients.
TEST(CudaGraphs, CompilePoolFromTheRules) {
    const ModelGraph g = llama_like();
    EstimateRequest r;
    r.batch = 1;
    r.seq = 256;
    r.precision = Precision::FP32;
    r.analytic = true;
    r.cuda_graphs = CudaGraphs::Compile;
    const Analytic a = analytic(g, r);
    const EstimateResult& e = a.e;
    const Job& job = a.job();
    const StageMemory& sm = a.stage();
    const ParallelResult& par = a.par;
    ASSERT_EQ(sm.peak_phase, "optimizer");
    std::int64_t P = 0;
    Bytes G, round_g;
    for (const auto& rt : rank_tensors(g, job, par.instance_stage, 0)) {
        if (!rt.trainable) continue;
        P += rt.elems * rt.copies;
        G += Bytes(4 * rt.elems) * rt.copies;
        round_g += (allocator_block(Bytes(4 * rt.elems)) - Bytes(4 * rt.elems)) * rt.copies;
    }
    EXPECT_EQ(sm.gradients_at_peak, G);
    const Bytes t_opt(4 * P);  // torch.optim.AdamW foreach: one fp32 list the size of a state
    EXPECT_EQ(sm.transient, t_opt);
    const Bytes states = sm.allocated - G - round_g - t_opt;
    const Bytes pool_peak = max(sm.forward_backward_peak - states, G + round_g);
    const Bytes pool = pool_peak.round_up(MiB(2).count());
    EXPECT_EQ(sm.graph_pool, pool);
    EXPECT_EQ(row(e, "cuda_graph_pool"), pool - (G + round_g));
    EXPECT_EQ(sm.graph_general_extra, Bytes(0));
    EXPECT_EQ(row(e, "allocator_overhead"), Bytes(0)) << "no activation is cached in the general pool";
    EXPECT_EQ(e.per_gpu.peak_reserved, e.per_gpu.peak_allocated + row(e, "allocator_overhead") + row(e, "cuda_graph_pool"));
    EXPECT_EQ(rows_sum(e), e.per_gpu.total_device);
}

// Megatron-Core per-layer graphs: the pool holds the transformer layers'
// saved activations and one layer's backward temporaries; the embedding, the
// output layer and loss, the fp32 main-gradient buffer, the states and the
// optimizer step stay in the general pool. Rules: pool >= the layers' saved
// activations (activation_detail, checkpointable blocks); with the peak in the
// optimizer step nothing lives in the pool, so the whole pool is idle there.
TEST(CudaGraphs, MegatronPoolHoldsTheLayers) {
    const ModelGraph g = llama_like();
    EstimateRequest r;
    r.framework = Framework::Megatron;
    r.batch = 1;
    r.seq = 512;
    r.analytic = true;
    r.cuda_graphs = CudaGraphs::Megatron;
    const Analytic a = analytic(g, r);
    const EstimateResult& e = a.e;
    const Job& job = a.job();
    const StageMemory& sm = a.stage();
    Bytes layers;
    const ActivationResult act = saved_activations(job_graph(g, job), job.actx);
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi)
        if (g.blocks[bi].checkpointable) layers += act.blocks[bi].total;
    EXPECT_GT(layers, Bytes(0));
    EXPECT_GE(sm.graph_pool, layers.round_up(MiB(2).count()));
    ASSERT_EQ(sm.peak_phase, "optimizer") << "this job peaks in the optimizer step, where the pool holds nothing";
    EXPECT_EQ(sm.graph_pool_idle, sm.graph_pool);
    EXPECT_EQ(row(e, "cuda_graph_pool"), sm.graph_pool_idle);
    EXPECT_EQ(rows_sum(e), e.per_gpu.total_device);
}

// Analytic and simulated views agree on a mid-sized model (h=2048, 8 layers,
// V=32000), with the peak in the backward and in the optimizer step, for both
// kinds of graphs: allocated within 5% (the bound tests/invariants_test.cpp
// holds the eager views to), reserved within 10% (the simulated pool also
// fragments: gradients made between the activations freed in backward), and
// Megatron's pool, which holds activations only, within 20% (activations of 1
// to 10 MiB share 20 MiB segments, which the analytic pool does not round to).
TEST(CudaGraphs, AnalyticAndSimulatedAgree) {
    const ModelGraph g =
        test::llama_graph({.hidden = 2048, .heads = 16, .kv_heads = 8, .layers = 8, .intermediate = 5504, .vocab = 32000, .max_positions = 8192});
    struct Case {
        CudaGraphs cg;
        std::int64_t batch, seq;
        Precision prec;
    };
    for (const Case& k : {Case{CudaGraphs::Megatron, 1, 2048, Precision::BF16}, Case{CudaGraphs::Megatron, 4, 4096, Precision::BF16},
                          Case{CudaGraphs::Compile, 1, 1024, Precision::FP32}, Case{CudaGraphs::Compile, 4, 4096, Precision::AmpBF16}}) {
        EstimateRequest r;
        if (k.cg == CudaGraphs::Megatron) r.framework = Framework::Megatron;
        r.batch = k.batch;
        r.seq = k.seq;
        r.precision = k.prec;
        r.cuda_graphs = k.cg;
        r.analytic = true;
        const EstimateResult an = run(g, r, false);
        r.analytic = false;
        const EstimateResult si = run(g, r, true);
        const std::string what = std::string(to_string(k.cg)) + " b=" + std::to_string(k.batch) + " s=" + std::to_string(k.seq);
        ASSERT_TRUE(si.simulation.has_value());
        const Bytes pool_an = parallel_memory(g, *an.job).stages[0].graph_pool;
        EXPECT_GT(si.simulation->graph_pool, Bytes(0)) << what;
        if (k.cg == CudaGraphs::Megatron) {
            EXPECT_LT(rel(si.simulation->graph_pool, pool_an), 0.20)
                << what << ": pool " << format_bytes(si.simulation->graph_pool) << " simulated, " << format_bytes(pool_an) << " analytic";
        }
        EXPECT_LT(rel(si.per_gpu.peak_allocated, an.per_gpu.peak_allocated), 0.05) << what;
        EXPECT_LT(rel(si.per_gpu.peak_reserved, an.per_gpu.peak_reserved), 0.10)
            << what << ": " << format_bytes(si.per_gpu.peak_reserved) << " simulated, " << format_bytes(an.per_gpu.peak_reserved) << " analytic";
        EXPECT_EQ(rows_sum(si), si.per_gpu.total_device) << what;
        EXPECT_EQ(rows_sum(an), an.per_gpu.total_device) << what;
    }
}
