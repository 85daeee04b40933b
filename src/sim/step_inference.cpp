// Inference: the prompt's prefill through the graph without autograd, the KV
// cache per layer, and decode steps growing it with torch.cat
// (see gpumem/sim/step.hpp).
#include <algorithm>

#include "step_internal.hpp"

namespace gpumem::sim::detail {

void StepBuilder::inference() {
    const std::int64_t prompt = job_.seq;
    const TransformerDims* td = g_.transformer ? &*g_.transformer : nullptr;
    const std::int64_t tp = std::max<std::int64_t>(1, job_.layout.cfg.tp);
    // Prefill: the prompt through this rank's layers without autograd; the head
    // on the last position only (generate's logits_to_keep=1).
    for (std::size_t i = 0; i < g_.blocks.size(); ++i) {
        const bool head = i + 1 == g_.blocks.size() && td;
        plans_.push_back(plan_block(g_.blocks[i], job_, head ? 1 : prompt, true, em_, job_.layout));
    }
    rank_setup();
    std::int64_t per_layer_token = td ? td->kv_elements_per_token / std::max<std::int64_t>(1, td->kv_layers()) : 0;
    if (td && !td->latent_kv && td->kv_heads > 0 && tp > 1) per_layer_token = per_layer_token / td->kv_heads * ((td->kv_heads + tp - 1) / tp);
    const DType kvdt = job_.req.kv_dtype.value_or(job_.lowered);
    const Bytes state = td ? td->hf_linear_state_bytes(job_.req.batch, tp, kvdt) : Bytes(0);
    const std::int32_t kvlabel = em_.label("KV cache");
    const auto& units = chunks_.front();
    std::vector<std::int64_t> cache;  // k and v per layer
    auto run_forward = [&](const std::vector<BlockPlan>& plans, std::int64_t len, bool grow) {
        std::int64_t x = 0;
        if (!first_vstage(0) && td && !units.empty()) {
            const std::int64_t rows = checked_mul(job_.req.batch, plans[units.front().first].seq);
            x = em_.alloc(dtype_bytes(job_.actx.stream, checked_mul(rows, td->hidden)), recv_label());
        }
        std::size_t layer = 0;
        for (const auto& [pi, n] : units) {
            const BlockPlan& p = plans[pi];
            for (std::int64_t r = 0; r < n; ++r) {
                Instance in = forward(p, x, false, false, false, Bytes(0));
                em_.unref(x);
                x = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(p.blk->output)])];
                if (p.blk->checkpointable && p.blk->linear_attention) {
                    // Linear attention: its state is made by the prefill and
                    // updated in place while decoding.
                    const std::size_t idx = layer * 2;
                    if (cache.size() <= idx + 1) cache.resize(idx + 2, 0);
                    if (!grow) cache[idx] = em_.alloc(state, kvlabel);
                    ++layer;
                } else if (p.blk->checkpointable && per_layer_token > 0) {
                    const Bytes half = dtype_bytes(kvdt, checked_mul(checked_mul(job_.req.batch, len), per_layer_token / 2));
                    for (int kv = 0; kv < 2; ++kv) {
                        const std::size_t idx = layer * 2 + static_cast<std::size_t>(kv);
                        if (cache.size() <= idx) cache.resize(idx + 1, 0);
                        // DynamicCache.update: torch.cat([cache, new]) makes a new tensor.
                        const auto nid = em_.alloc(half, kvlabel);
                        if (grow) em_.unref(cache[idx]);
                        cache[idx] = nid;
                    }
                    ++layer;
                }
                instances_.give(std::move(in));
            }
        }
        em_.unref(x);
    };
    em_.phase = Phase::Prefill;
    run_forward(plans_, prompt, false);
    em_.mark();
    const std::int64_t gen = job_.req.gen_len;
    if (gen > 0 && td) {
        em_.phase = Phase::Decode;
        std::vector<BlockPlan> decode_plans;
        for (const auto& b : g_.blocks) decode_plans.push_back(plan_block(b, job_, 1, true, em_, job_.layout));
        // Every decode step re-allocates each layer's cache one token longer.
        // Long generations simulate the first steps and the last two in full.
        // (The steps between are skipped without a loop over them: --gen-len
        // 10^12 costs what --gen-len 65 does.) The last step runs with the
        // caches step gen-1 left, so its live tensors are the full run's (and
        // no skipped step holds more: each tensor of a step is at least as
        // large as the step before's). Where the skipped steps' allocations
        // placed the blocks is not modelled, so the allocator's rounding and
        // segments at the end are approximate (tests/sim_fast_path_test.cpp
        // measures the difference to the full replay).
        const std::int64_t full = std::min<std::int64_t>(gen, std::max(0, opt_.max_decode_steps));
        for (std::int64_t t = 1; t <= full; ++t) run_forward(decode_plans, prompt + t, true);
        if (gen > full + 1) run_forward(decode_plans, prompt + gen - 1, true);
        if (gen > full) run_forward(decode_plans, prompt + gen, true);
        out_.approximate = out_.approximate || gen > full;
        if (gen > full)
            out_.notes.push_back("decode: simulated steps 1-" + std::to_string(full) +
                                 (gen > full + 1 ? ", " + std::to_string(gen - 1) + " and " : " and step ") + std::to_string(gen) +
                                 " (approximate: the live tensors are exact, the allocator's layout after the skipped steps is not)");
        em_.mark();
    }
}

}  // namespace gpumem::sim::detail
