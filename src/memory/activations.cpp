#include "gpumem/memory/activations.hpp"

#include <algorithm>

namespace gpumem {

DType resolve_role(ActRole role, const ActivationContext& ctx) {
    switch (role) {
        case ActRole::Stream: return ctx.stream;
        case ActRole::Lowered: return ctx.lowered;
        case ActRole::Float32: return DType::F32;
        case ActRole::Index64: return DType::I64;
        case ActRole::Mask8: return DType::Bool;
        case ActRole::Upcast: return ctx.autocast ? DType::F32 : ctx.lowered;
    }
    return ctx.stream;
}

bool lora_applies(const Op& op, const std::vector<std::string>& targets) {
    if (op.kind != OpKind::Linear || targets.empty()) return false;
    const auto dot = op.name.rfind('.');
    const std::string leaf = dot == std::string::npos ? op.name : op.name.substr(dot + 1);
    for (const auto& t : targets) {
        if (t == leaf || t == op.name) return true;
        if (t == "all-linear" && leaf != "lm_head") return true;
    }
    return false;
}

namespace {

struct InstanceResult {
    Bytes saved;
    Bytes weight_casts;
    Bytes lora;
    Bytes largest;
    Bytes routed;     // saved tensors of routed experts
    Bytes grad_pair;  // max over ops of |grad wrt output| + |grad wrt input|
    Bytes loss_input;
    Bytes working_set;
    Bytes input_bytes;
    Bytes output_bytes;
    bool saves_input = false;
    bool saves_output = false;
    bool output_rg = false;
    std::vector<std::pair<std::string, Bytes>> shared;  // saved tensors counted once per model
};

bool is_lora_target(const Op& op, const ActivationContext& ctx) { return lora_applies(op, ctx.lora_targets); }

// Ops reading a weight held by another block (tied lm_head / shared
// embeddings) have no params of their own but still train that weight.
bool op_has_weight(const Op& op) {
    return !op.params.empty() || (op.kind == OpKind::Linear && op.in_features > 0) || op.kind == OpKind::Embedding;
}

InstanceResult run_instance(const Block& blk, const ActivationContext& ctx, bool input_rg) {
    const std::size_t n = blk.tensors.size();
    std::vector<DType> dt(n);
    std::vector<TensorId> storage(n);
    std::vector<Bytes> bytes(n);
    std::vector<char> rg(n, 0), marked(n, 0);
    InstanceResult r;
    for (std::size_t i = 0; i < n; ++i) {
        const TensorInfo& t = blk.tensors[i];
        dt[i] = resolve_role(t.role, ctx);
        bytes[i] = dtype_bytes(dt[i], t.extent.elements(ctx.batch, ctx.seq));
        storage[i] = static_cast<TensorId>(i);
        if (t.alias_of >= 0 && dt[static_cast<std::size_t>(t.alias_of)] == dt[i])
            storage[i] = storage[static_cast<std::size_t>(t.alias_of)];
        if (storage[i] == static_cast<TensorId>(i) && i > 0) {
            r.largest = max(r.largest, bytes[i]);
            r.working_set += bytes[i];
        }
    }
    if (n > 0) rg[0] = input_rg ? 1 : 0;
    const bool autocast = ctx.autocast;
    const bool fused_core = ctx.attention == Attention::Flash || ctx.recompute == Recompute::Selective;

    auto mark = [&](TensorId t, Bytes* bucket) {
        const auto s = static_cast<std::size_t>(storage[static_cast<std::size_t>(t)]);
        if (marked[s]) return;
        marked[s] = 1;
        const std::string& nm = blk.tensors[s].name;
        if (nm.find("experts") != std::string::npos && nm.find("shared_experts") == std::string::npos) r.routed += bytes[s];
        if (!blk.tensors[s].shared_key.empty()) {
            r.shared.emplace_back(blk.tensors[s].shared_key, bytes[s]);
            return;
        }
        r.saved += bytes[s];
        if (bucket) *bucket += bytes[s];
    };
    auto save_cast = [&](TensorId t, Bytes* bucket) {
        // Autocast casts an fp32 input of a lowered op to 16 bits; the op
        // saves its own cast (no cache for non-leaf tensors).
        if (autocast && dt[static_cast<std::size_t>(t)] != ctx.lowered) {
            const Bytes b = dtype_bytes(ctx.lowered, blk.tensors[static_cast<std::size_t>(t)].extent.elements(ctx.batch, ctx.seq));
            r.saved += b;
            if (bucket) *bucket += b;
        } else {
            mark(t, bucket);
        }
    };

    for (const Op& op : blk.ops) {
        if (!op.inputs.empty() && !op.outputs.empty() && op.kind != OpKind::Input && op.kind != OpKind::View &&
            op.kind != OpKind::Cast)
            r.grad_pair = max(r.grad_pair, bytes[static_cast<std::size_t>(op.outputs.front())] +
                                               bytes[static_cast<std::size_t>(op.inputs.front())]);
        if (op.kind == OpKind::Loss && !op.inputs.empty()) r.loss_input = bytes[static_cast<std::size_t>(op.inputs.front())];
        bool in_rg = false;
        for (auto t : op.inputs) in_rg = in_rg || rg[static_cast<std::size_t>(t)];
        const bool lora = is_lora_target(op, ctx);
        const bool has_w = op_has_weight(op);
        const bool param_tr = (ctx.train_base && has_w) || lora;
        const bool any_grad = in_rg || param_tr;
        for (auto t : op.outputs) rg[static_cast<std::size_t>(t)] = any_grad ? 1 : 0;
        if (!any_grad) continue;
        const bool base_tr = ctx.train_base && has_w;
        if (!(fused_core && (op.flags & kAttnCore))) {
            for (const SavedRef& s : op.saved) {
                if (s.only_for_param_grad && !base_tr) continue;
                if (s.autocast_cast) save_cast(s.tensor, nullptr);
                else mark(s.tensor, nullptr);
            }
        }
        // Cached 16-bit copies of trainable fp32 weights (autocast's weight cache).
        if (autocast && base_tr && ctx.stream == DType::F32 &&
            (op.kind == OpKind::Linear || op.kind == OpKind::Conv2d || op.kind == OpKind::Matmul)) {
            std::int64_t w = 0;
            for (auto p : op.params) {
                const Param& prm = blk.params[static_cast<std::size_t>(p)];
                if (prm.linear_weight || prm.shape.size() >= 2) w = checked_add(w, prm.numel());
                else w = checked_add(w, prm.numel());  // biases are cast too
            }
            if (op.params.empty() && op.kind == OpKind::Linear) w = checked_mul(op.in_features, op.out_features);
            const Bytes b = dtype_bytes(ctx.lowered, w);
            r.weight_casts += b;
            r.saved += b;
        }
        if (lora) {
            // lora_A(x) saves x; lora_B saves A's [rows, r] output.
            const TensorId x = op.inputs.front();
            save_cast(x, &r.lora);
            const Extent rows = blk.tensors[static_cast<std::size_t>(x)].extent;
            const std::int64_t elems = rows.elements(ctx.batch, ctx.seq) / std::max<std::int64_t>(1, op.in_features);
            const Bytes b = dtype_bytes(ctx.lowered, checked_mul(elems, ctx.lora_rank));
            r.saved += b;
            r.lora += b;
        }
    }
    if (fused_core) {
        for (const AttentionSite& a : blk.attention) {
            if (a.q < 0 || !rg[static_cast<std::size_t>(a.q)]) continue;
            if (ctx.attention == Attention::Flash) {
                // SDPA is an autocast-lowered op: it saves 16-bit q, k, v.
                save_cast(a.q, nullptr);
                save_cast(a.k, nullptr);
                save_cast(a.v, nullptr);
                mark(a.out, nullptr);
                r.saved += dtype_bytes(DType::F32, checked_mul(checked_mul(ctx.batch, a.heads), ctx.seq));
            } else {
                // Selective recompute: the checkpointed core keeps its inputs.
                mark(a.q, nullptr);
                mark(a.k, nullptr);
                mark(a.v, nullptr);
            }
        }
    }
    if (n > 0) {
        r.saves_input = marked[static_cast<std::size_t>(storage[0])] != 0;
        r.input_bytes = bytes[0];
        const auto out = static_cast<std::size_t>(blk.output);
        r.saves_output = marked[static_cast<std::size_t>(storage[out])] != 0 && storage[out] != storage[0];
        r.output_bytes = bytes[out];
        r.output_rg = rg[out] != 0;
    }
    return r;
}

}  // namespace

ActivationResult saved_activations(const ModelGraph& g, const ActivationContext& ctx) {
    ActivationResult res;
    std::vector<std::string> shared_seen;
    bool rg = false;
    bool prev_saves_output = false;
    for (const Block& blk : g.blocks) {
        BlockActivations ba;
        ba.block = blk.name;
        ba.repeat = blk.repeat;
        InstanceResult first = run_instance(blk, ctx, rg);
        InstanceResult rest = first;
        if (blk.repeat > 1 && first.output_rg != rg) rest = run_instance(blk, ctx, first.output_rg);
        const std::int64_t more = blk.repeat - 1;

        if (ctx.recompute == Recompute::Full && blk.checkpointable) {
            // Only each layer's input survives the forward; backward rebuilds
            // one layer at a time (its activations + working set).
            const Bytes in = first.input_bytes;
            ba.per_instance = in;
            res.saved += in * blk.repeat;
            res.recompute_transient = max(res.recompute_transient, rest.saved + rest.largest);
            res.autocast_cache_unsaved += first.weight_casts + rest.weight_casts * more;
            prev_saves_output = false;
        } else {
            Bytes total = first.saved + rest.saved * more;
            // A tensor handed from one instance to the next is one storage.
            if (prev_saves_output && first.saves_input) total -= first.input_bytes;
            if (rest.saves_input && rest.saves_output) total -= rest.input_bytes * more;
            ba.per_instance = rest.saved;
            ba.routed_per_instance = rest.routed;
            res.saved += total;
            res.autocast_weight_casts += first.weight_casts + rest.weight_casts * more;
            res.lora_adapters += first.lora + rest.lora * more;
            prev_saves_output = rest.saves_output;
        }
        for (const auto* inst : {&first, &rest})
            for (const auto& [key, b] : inst->shared)
                if (std::find(shared_seen.begin(), shared_seen.end(), key) == shared_seen.end()) {
                    shared_seen.push_back(key);
                    res.saved += b;
                }
        res.backward_grad_pair = max(res.backward_grad_pair, max(first.grad_pair, rest.grad_pair));
        if (rest.loss_input > Bytes(0)) res.loss_input = rest.loss_input;
        ba.largest_tensor = max(first.largest, rest.largest);
        ba.working_set = rest.working_set;
        res.largest_tensor = max(res.largest_tensor, ba.largest_tensor);
        for (const Op& op : blk.ops)
            if (op.kind == OpKind::Linear && op.name.size() >= 7 && op.name.compare(op.name.size() - 7, 7, "lm_head") == 0)
                res.logits = dtype_bytes(resolve_role(blk.tensors[static_cast<std::size_t>(op.outputs.front())].role, ctx),
                                         blk.tensors[static_cast<std::size_t>(op.outputs.front())].extent.elements(ctx.batch, ctx.seq));
        rg = rest.output_rg;
        res.blocks.push_back(std::move(ba));
    }
    return res;
}

}  // namespace gpumem
