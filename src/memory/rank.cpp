// The parameter tensors one GPU holds under a layout.
//
//   tensor parallelism  attention, MLP, expert, word-embedding and output-layer
//                       weights are split over tp (Megatron's column/row
//                       parallel linears, vocab-parallel embedding and head);
//                       norms, routers and learned position / token-type
//                       embeddings are replicated;
//   expert parallelism  a rank holds E / ep of the routed experts;
//   pipeline            a rank holds the blocks of its virtual stages; with a
//                       tied output layer (untie_embeddings_and_output_weights
//                       = False) and pp > 1 the last stage keeps its own copy of
//                       the word embeddings, trained and all-reduced with the
//                       first stage's (Megatron-LM d98e8a64ddf3,
//                       megatron/core/models/common/language_module/language_module.py
//                       setup_embeddings_and_output_layer; DeepSpeed's
//                       TiedLayerSpec does the same);
//   data parallelism    ZeRO-3 / FSDP keep a 1/shard slice of every parameter
//                       (flat buffers padded to a multiple of the group), the
//                       states of ZeRO-1/2, FSDP and Megatron's distributed
//                       optimizer are sharded the same way.
// LoRA adapters (A [r, in], B [out, r] per target linear) go with their layer.
#include <algorithm>
#include <limits>
#include <utility>

#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/features.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"

namespace gpumem {

namespace {
bool tp_split(const Param& p) {
    const Component c = p.component;
    return !p.tp_replicated &&
           (c == Component::Attention || c == Component::Mlp || c == Component::Experts || c == Component::Embeddings || c == Component::Head);
}
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return b <= 1 ? a : (a + b - 1) / b; }
}  // namespace

Shape rank_param_shape(const Param& prm, std::int64_t tp) {
    Shape shape = prm.shape;
    if (tp_split(prm) && !shape.empty()) shape[0] = ceil_div(shape[0], tp);
    return shape;
}

std::int64_t rank_param_elems(const Param& prm, std::int64_t tp) {
    const bool split = tp_split(prm);
    std::int64_t n = 1;
    for (std::size_t i = 0; i < prm.shape.size(); ++i) n = checked_mul(n, i == 0 && split ? ceil_div(prm.shape[0], tp) : prm.shape[i]);
    return n;
}

std::vector<RankTensor> rank_tensors(const ModelGraph& g, const Job& job, const std::vector<std::vector<std::int32_t>>& instance_stage,
                                     std::int64_t rank) {
    const std::int64_t pp = std::max<std::int64_t>(1, job.layout.cfg.pp);
    const auto pp32 = static_cast<std::int32_t>(std::min<std::int64_t>(pp, std::numeric_limits<std::int32_t>::max()));
    std::vector<std::int64_t> counts(g.blocks.size(), 0);
    for (std::size_t bi = 0; bi < counts.size() && bi < instance_stage.size(); ++bi)
        for (auto v : instance_stage[bi]) counts[bi] += (v % pp32) == rank ? 1 : 0;  // 32-bit: pp <= 2^20 (field limit)
    return rank_tensors(g, job, counts, rank);
}

std::vector<RankTensor> rank_tensors(const ModelGraph& g, const Job& job, std::span<const std::int64_t> instance_counts, std::int64_t rank) {
    const Layout& lay = job.layout;
    const ParallelConfig& c = lay.cfg;
    const std::int64_t pp = std::max<std::int64_t>(1, c.pp), tp = std::max<std::int64_t>(1, c.tp);
    const bool params_sharded = c.zero == 3 || c.fsdp != Fsdp::None;
    const bool offload_params = c.offload_params != Offload::None;
    std::vector<RankTensor> out;
    if (g.params_only > 0) {
        RankTensor t;
        t.elems = g.params_only;
        t.shape = {g.params_only};
        t.shard = lay.shard;
        t.trainable = job.train && !job.lora;
        t.stored = offload_params ? Bytes(0) : dtype_bytes(job.wdt, t.sharded_elems(params_sharded));
        out.push_back(std::move(t));
        return out;
    }
    std::size_t param_tensors = 0;  // one entry each (LoRA adapters may add some)
    for (const Block& b : g.blocks) param_tensors += b.params.size();
    out.reserve(param_tensors + 1);
    auto instances = [&](std::size_t bi) { return bi < instance_counts.size() ? instance_counts[bi] : std::int64_t{0}; };
    const std::int64_t first_rank = 0, last_rank = lay.last_rank();
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Block& b = g.blocks[bi];
        const std::int64_t n = instances(bi);
        if (n == 0) continue;
        // FSDP1 + LoRA: the layer's flat parameter requires grad (features.hpp).
        bool flat_grads = fsdp1_flat_grads(job);
        if (flat_grads) {
            flat_grads = false;
            for (const Op& op : b.ops) flat_grads = flat_grads || lora_applies(op, job.req.lora_targets);
        }
        for (std::size_t pi = 0; pi < b.params.size(); ++pi) {
            const Param& prm = b.params[pi];
            const bool split = tp_split(prm);
            const bool expert = prm.component == Component::Experts;
            RankTensor t;
            t.block = static_cast<std::int32_t>(bi);
            t.param = static_cast<std::int32_t>(pi);
            t.shape = rank_param_shape(prm, tp);
            t.elems = rank_param_elems(prm, tp);
            t.copies = checked_mul(expert ? ceil_div(prm.count, c.ep) : prm.count, n);
            t.shard = expert ? lay.expert_shard : lay.shard;
            t.trainable = job.train && !job.lora && prm.trainable;
            Bytes w = quantized_tensor_bytes(job, prm);
            if (split) w = w.ceil_div(tp);
            if (flat_grads && !t.trainable) t.flat_grad = w;
            if (params_sharded) w = w.ceil_div(t.shard);
            t.stored = offload_params ? Bytes(0) : w;
            out.push_back(std::move(t));
        }
        // LoRA adapters of the block's target linears (PEFT wraps each routed
        // expert's linear separately).
        if (job.lora)
            for (const Op& op : b.ops)
                if (lora_applies(op, job.req.lora_targets)) {
                    std::int64_t copies = op.params.empty() ? 1 : b.params[static_cast<std::size_t>(op.params.front())].count;
                    if (!op.params.empty() && b.params[static_cast<std::size_t>(op.params.front())].component == Component::Experts)
                        copies = ceil_div(copies, c.ep);
                    for (const auto& shape : {std::vector<std::int64_t>{job.req.lora_rank, op.in_features},
                                              std::vector<std::int64_t>{op.out_features, job.req.lora_rank}}) {
                        RankTensor t;
                        t.block = static_cast<std::int32_t>(bi);
                        t.shape = shape;
                        t.elems = checked_mul(shape[0], shape[1]);
                        t.copies = checked_mul(copies, n);
                        t.shard = lay.shard;
                        t.trainable = true;
                        t.adapter = true;
                        t.stored = dtype_bytes(job.tdt, t.sharded_elems(params_sharded));
                        if (offload_params) t.stored = Bytes(0);
                        out.push_back(std::move(t));
                    }
                }
    }
    // Tied output layer on a last stage that does not hold the embedding.
    if (pp > 1 && rank == last_rank && last_rank != first_rank && !g.blocks.empty()) {
        const Block& head = g.blocks.back();
        for (const Op& op : head.ops)
            if (op.kind == OpKind::Linear && op.params.empty() && op.in_features > 0) {
                RankTensor t;
                t.block = static_cast<std::int32_t>(g.blocks.size() - 1);
                t.shape = {ceil_div(op.out_features, tp), op.in_features};
                t.elems = checked_mul(t.shape[0], t.shape[1]);
                t.shard = lay.shard;
                t.trainable = job.train && !job.lora;
                t.tied_copy = true;
                t.stored = offload_params ? Bytes(0) : dtype_bytes(job.wdt, t.sharded_elems(params_sharded));
                out.push_back(std::move(t));
            }
    }
    return out;
}

TrainTensor state_tensor(const ModelGraph&, const RankTensor& rt, bool sharded, std::int64_t) {
    if ((sharded && rt.shard > 1) || rt.shape.empty()) return TrainTensor{{rt.sharded_elems(sharded)}, rt.copies};
    return TrainTensor{rt.shape, rt.copies};
}

}  // namespace gpumem
