// ActivationMemo (memory/activations.hpp) only skips repeated block walks:
// the whole model and every pipeline chunk of every layout, with the memo
// shared as an estimate shares it, must come out as without it. Grid: models x layouts (one GPU, tp,
// pp with and without interleaving, embedding/loss slots) x recompute x mode.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"

namespace gpumem {
namespace {

void expect_same(const ActivationResult& a, const ActivationResult& b, const std::string& what) {
    EXPECT_EQ(a.saved, b.saved) << what;
    EXPECT_EQ(a.autocast_weight_casts, b.autocast_weight_casts) << what;
    EXPECT_EQ(a.lora_adapters, b.lora_adapters) << what;
    EXPECT_EQ(a.quant_held, b.quant_held) << what;
    EXPECT_EQ(a.recompute_transient, b.recompute_transient) << what;
    EXPECT_EQ(a.recompute_trailing, b.recompute_trailing) << what;
    EXPECT_EQ(a.autocast_cache_unsaved, b.autocast_cache_unsaved) << what;
    EXPECT_EQ(a.largest_tensor, b.largest_tensor) << what;
    EXPECT_EQ(a.backward_grad_pair, b.backward_grad_pair) << what;
    EXPECT_EQ(a.loss_input, b.loss_input) << what;
    EXPECT_EQ(a.logits, b.logits) << what;
    ASSERT_EQ(a.blocks.size(), b.blocks.size()) << what;
    for (std::size_t i = 0; i < a.blocks.size(); ++i) {
        EXPECT_EQ(a.blocks[i].total, b.blocks[i].total) << what << " block " << i;
        EXPECT_EQ(a.blocks[i].per_instance, b.blocks[i].per_instance) << what << " block " << i;
        EXPECT_EQ(a.blocks[i].recompute_transient, b.blocks[i].recompute_transient) << what << " block " << i;
        EXPECT_EQ(a.blocks[i].grad_pair_net, b.blocks[i].grad_pair_net) << what << " block " << i;
    }
}

TEST(ActivationMemo, StagesAsWithoutTheMemo) {
    int checked = 0;
    for (const char* model : {"gpt2", "llama-3.2-1b", "qwen2-0.5b", "mixtral-8x7b"}) {
        const ModelGraph g = load_model(model).value();
        struct L {
            int gpus, tp, pp, vpp;
            bool emb, loss;
        };
        for (const L& l : {L{1, 1, 1, 1, false, false}, L{2, 2, 1, 1, false, false}, L{2, 1, 2, 1, false, false}, L{4, 1, 4, 1, true, true},
                           L{4, 1, 2, 2, false, false}, L{8, 2, 4, 1, false, false}})
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
                for (Mode mode : {Mode::Train, Mode::Lora}) {
                    EstimateRequest req;
                    req.model = model;
                    req.mode = mode;
                    req.batch = 2;
                    req.seq = 512;
                    req.recompute = rc;
                    req.grad_accum = 8;
                    req.parallel.gpus = l.gpus;
                    req.parallel.tp = l.tp;
                    req.parallel.pp = l.pp;
                    req.parallel.sp = l.tp > 1;
                    req.parallel.pp_embedding_layer = l.emb;
                    req.parallel.pp_loss_layer = l.loss;
                    if (l.vpp > 1) {
                        req.parallel.vpp = l.vpp;
                        req.parallel.schedule = PipelineSchedule::Interleaved;
                    }
                    auto job = resolve_job(g, req);
                    if (!job) continue;  // a layout the model does not split into
                    const Job& j = job.value();
                    const ModelGraph& jg = job_graph(g, j);
                    const std::string what = request_to_command(req);
                    // One memo over the whole model and every pipeline chunk,
                    // each input state, as an estimate shares it.
                    ActivationMemo memo;
                    expect_same(saved_activations(jg, j.actx, nullptr, false, &memo), saved_activations(jg, j.actx), what);
                    const auto stages = assign_virtual_stages(jg, j.layout);
                    const std::int64_t chunks = std::max<std::int64_t>(1, j.layout.cfg.pp) * std::max<std::int64_t>(1, j.layout.vpp);
                    for (std::int64_t v = 0; v < chunks; ++v) {
                        std::vector<std::int64_t> inst(jg.blocks.size(), 0);
                        for (std::size_t bi = 0; bi < jg.blocks.size() && bi < stages.size(); ++bi)
                            for (auto st : stages[bi]) inst[bi] += st == v ? 1 : 0;
                        for (bool rg : {false, true})
                            expect_same(saved_activations(jg, j.actx, &inst, rg, &memo), saved_activations(jg, j.actx, &inst, rg),
                                        what + " chunk " + std::to_string(v) + (rg ? " (input requires grad)" : ""));
                    }
                    ++checked;
                }
    }
    EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace gpumem
