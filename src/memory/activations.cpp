#include "gpumem/memory/activations.hpp"

#include <cmath>
#include <numeric>

#include "gpumem/memory/parallel.hpp"

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
        case ActRole::Float8: return DType::F8_E4M3;
        case ActRole::Float32UnlessHalf: return ctx.lowered == DType::F16 ? DType::F16 : DType::F32;
    }
    return ctx.stream;
}

Bytes op_sac_saved(const Block& b, const ActivationContext& ctx) {
    const std::vector<char> split = tp_split_flags(b);
    auto bytes_of = [&](TensorId t) {
        const TensorInfo& ti = b.tensors[static_cast<std::size_t>(t)];
        return activation_bytes(ti, resolve_role(ti.role, ctx), split[static_cast<std::size_t>(t)] != 0, ctx);
    };
    Bytes out;
    const std::vector<char> kept = sac_kept_ops(b);
    for (std::size_t o = 0; o < b.ops.size(); ++o)
        if (kept[o]) out += bytes_of(b.ops[o].outputs.front());
    if (ctx.attention == Attention::Flash)
        for (const AttentionSite& a : b.attention) {
            if (a.out < 0) continue;
            out += bytes_of(a.out);
            out += dtype_bytes(DType::F32, (checked_mul(checked_mul(ctx.batch, a.heads), ctx.seq) + ctx.tp - 1) / std::max<std::int64_t>(1, ctx.tp));
        }
    return out;
}

std::vector<char> sac_kept_ops(const Block& b) {
    std::vector<char> kept(b.ops.size(), 0);
    std::int64_t mm = 0;
    for (std::size_t o = 0; o < b.ops.size(); ++o)
        if (b.ops[o].kind == OpKind::Linear && !b.ops[o].outputs.empty() && (++mm % 2) == 1) kept[o] = 1;
    return kept;
}

bool lora_applies(const Op& op, const std::vector<std::string>& targets) {
    if (op.kind != OpKind::Linear || targets.empty()) return false;
    const auto dot = op.name.rfind('.');
    const std::string leaf = dot == std::string::npos ? op.name : op.name.substr(dot + 1);
    for (const auto& t : targets) {
        if (t == leaf || t == op.name) return true;
        // PEFT's all-linear excludes the output layer (get_output_embeddings).
        if (t == "all-linear" && leaf != "lm_head" && !is_output_head(op)) return true;
    }
    return false;
}

bool quantized_weight(const Param& p, Quant q, bool quantize_head) {
    // Only nn.Linear weights: bitsandbytes' replace_with_bnb_linear and
    // Lightning's BitsandbytesPrecision swap nn.Linear modules. HF skips the
    // output embedding (get_keys_to_not_convert); LitGPT converts it too
    // (Lightning-AI/pytorch-lightning 7f0c3436, src/lightning/fabric/plugins/
    // precision/bitsandbytes.py L425-445 _convert_layers replaces every
    // nn.Linear not in ignore_modules; litgpt 26857050, litgpt/finetune/lora.py
    // L149 passes none, and litgpt/lora.py L489-495 builds lm_head as a
    // LoRALinear around an nn.Linear).
    if (q == Quant::None || !p.linear_weight || p.shape.size() != 2) return false;
    return quantize_head || (!p.output_head && p.module != "lm_head");
}

bool quantized_op(const Block& b, const Op& op, Quant q, bool quantize_head) {
    if (op.kind != OpKind::Linear) return false;
    for (auto pi : op.params)
        if (quantized_weight(b.params[static_cast<std::size_t>(pi)], q, quantize_head)) return true;
    return false;
}

// A frozen nn.Linear saves nothing of its input (mm saves it only for the
// weight's gradient), but bitsandbytes' autograd functions decide on
// ctx.needs_input_grad[:2], i.e. also when only the input requires grad (the
// residual stream under LoRA, where adapters upstream train):
//  - MatMul8bitLt (LLM.int8): `if any(ctx.needs_input_grad[:2]): ctx.tensors =
//    (CAt, subA, A)` (bitsandbytes 95f9af30, bitsandbytes/autograd/_functions.py
//    L186-187): A is kept; CAt only exists when the weight needs a gradient
//    (L135-140) and subA holds the outlier columns (not modelled).
//  - MatMul4Bit (nf4/fp4): `ctx.tensors = (None, B)` (L357-358 at 95f9af30),
//    only the packed weight, since bitsandbytes 0.43.2 (commit 9e753741,
//    "fix QLoRA mem bug: delete useless buffered activation", #1270); before
//    it `ctx.tensors = (A, B)` (L516 at 9e753741~1 = 39b42e74) kept A, the
//    input Linear4bit.forward cast to the compute dtype (nn/modules.py L626-628).
bool quantized_saves_input(const ActivationContext& ctx) {
    if (ctx.quant == Quant::Int8) return true;
    return (ctx.quant == Quant::NF4 || ctx.quant == Quant::FP4) && ctx.bnb_4bit_saves_input;
}

// PEFT lora.Linear.forward (huggingface/peft 5d602fdb, src/peft/tuners/lora/
// layer.py L1059-1063): `x = self._cast_input_dtype(x, lora_A.weight.dtype)`
// (a copy when the dtypes differ: a 16-bit x and fp32 adapters under
// autocast_adapter_dtype), then `lora_B(lora_A(dropout(x)))`. The bitsandbytes
// layers cast only outside autocast (lora/bnb.py L543-546 Linear4bit, L260-263
// Linear8bitLt: `requires_conversion = not torch.is_autocast_enabled()`); GPTQ
// casts always (lora/gptq.py L93). `dropout` is nn.Identity for p = 0 (PEFT's
// default, lora/config.py L634) and nn.Dropout otherwise (layer.py L255-258):
// CUDA native_dropout returns a new tensor and saves a bool mask. lora_A is a
// trainable nn.Linear: it saves its input, under autocast its own 16-bit cast.
// Every adapter does this on its own: with p > 0 (or a cast) each keeps a copy.
std::int64_t shared_adapter_input(const Block& b, std::size_t o, const ActivationContext& ctx) {
    if (!ctx.fused_qkv_lora || o >= b.ops.size()) return -1;
    const auto qkv = [&](const Op& op) {
        if (op.kind != OpKind::Linear || op.inputs.empty() || !lora_applies(op, ctx.lora_targets)) return false;
        return op.name.ends_with("q_proj") || op.name.ends_with("k_proj") || op.name.ends_with("v_proj");
    };
    const Op& op = b.ops[o];
    if (!qkv(op)) return -1;
    for (std::size_t i = 0; i < o; ++i)
        if (qkv(b.ops[i]) && b.ops[i].inputs.front() == op.inputs.front()) return static_cast<std::int64_t>(i);
    return -1;
}

bool qkv_lora_zero_pad(const Block& b, std::size_t o, const ActivationContext& ctx) {
    if (!ctx.fused_qkv_lora || o >= b.ops.size()) return false;
    const auto part = [](const Op& op) {
        return op.kind == OpKind::Linear && !op.inputs.empty() &&
               (op.name.ends_with("q_proj") || op.name.ends_with("k_proj") || op.name.ends_with("v_proj"));
    };
    const Op& op = b.ops[o];
    if (!part(op) || !lora_applies(op, ctx.lora_targets)) return false;
    for (const Op& other : b.ops)
        if (part(other) && other.inputs.front() == op.inputs.front() && !lora_applies(other, ctx.lora_targets)) return true;
    return false;
}

bool qkv_view_keeps_fused(const Block& b, const AttentionSite& a, const ActivationContext& ctx) {
    if (!ctx.fused_qkv_views || a.v < 0) return false;
    for (const Op& op : b.ops)
        for (auto t : op.outputs)
            if (t == a.v) return op.kind == OpKind::Linear && op.name.ends_with("v_proj");
    return false;
}

AdapterInput adapter_input(const Block& b, const Op& op, TensorId x, DType x_dtype, bool split, const ActivationContext& ctx) {
    AdapterInput a;
    const TensorInfo& t = b.tensors[static_cast<std::size_t>(x)];
    const bool bnb = (ctx.quant == Quant::Int8 || ctx.quant == Quant::NF4 || ctx.quant == Quant::FP4) &&
                     quantized_op(b, op, ctx.quant, ctx.quantize_head);
    const bool convert = x_dtype != ctx.adapter && !(ctx.autocast && bnb);
    const DType d = convert ? ctx.adapter : x_dtype;
    const bool dropout = ctx.lora_dropout > 0.0;
    if (convert) a.convert = activation_bytes(t, d, split, ctx);
    if (dropout) {
        a.mask = activation_bytes(t, DType::Bool, split, ctx);
        a.dropped = activation_bytes(t, d, split, ctx);
    }
    if (ctx.autocast && d != ctx.lowered) {
        a.cast = true;
        a.copy = activation_bytes(t, ctx.lowered, split, ctx);
    } else if (convert || dropout) {
        a.copy = activation_bytes(t, d, split, ctx);
    } else {
        a.saves_x = true;
    }
    return a;
}

ForwardStructure forward_structure(const Block& b, const std::vector<TensorId>& storage, Attention attention, bool inference) {
    ForwardStructure f;
    forward_structure(b, storage, attention, inference, f);
    return f;
}

void forward_structure(const Block& b, const std::vector<TensorId>& storage, Attention attention, bool inference, ForwardStructure& f) {
    const std::size_t nops = b.ops.size(), n = b.tensors.size();
    f.skip.assign(nops, 0);
    f.site_of_op.assign(nops, -1);
    f.uses.assign(n, 0);
    auto st = [&](TensorId t) { return storage[static_cast<std::size_t>(t)]; };
    if (inference)
        for (std::size_t o = 0; o < nops; ++o) {
            const Op& op = b.ops[o];
            // Generation computes no loss: drop the labels and the loss op.
            if (op.kind == OpKind::Loss) f.skip[o] = 1;
            if (op.kind == OpKind::Input && b.tensors[static_cast<std::size_t>(op.outputs.front())].name.find("labels") != std::string::npos)
                f.skip[o] = 1;
        }
    if (attention == Attention::Flash) {
        for (std::size_t o = 0; o < nops; ++o)
            if (b.ops[o].flags & kAttnCore) f.skip[o] = 1;
        for (std::size_t s = 0; s < b.attention.size(); ++s)
            for (std::size_t o = 0; o < nops; ++o)
                for (auto out : b.ops[o].outputs)
                    if (out == b.attention[s].out) f.site_of_op[o] = static_cast<int>(s);
        // Ops whose outputs only feed skipped ops (q/k/v copies for torch.matmul)
        // go too. Walked last to first, with what the ops after each one read
        // (any of them, and any not skipped) known per storage: one pass.
        static thread_local std::vector<char> read_any, read_kept;
        read_any.assign(n, 0);
        read_kept.assign(n, 0);  // also: the block's output and the sites' q, k, v
        read_kept[static_cast<std::size_t>(st(b.output))] = 1;
        for (const auto& s : b.attention)
            for (auto t : {s.q, s.k, s.v}) read_kept[static_cast<std::size_t>(st(t))] = 1;
        for (std::size_t o = nops; o-- > 0;) {
            const Op& op = b.ops[o];
            if (!f.skip[o] && !op.outputs.empty() && op.kind != OpKind::Input) {
                bool consumed = false, only_skipped = true;
                for (auto out : op.outputs) {
                    const auto so = static_cast<std::size_t>(st(out));
                    consumed = consumed || read_any[so];
                    only_skipped = only_skipped && !read_kept[so];
                }
                if (consumed && only_skipped) f.skip[o] = 1;
            }
            for (auto in : op.inputs) {
                const auto si = static_cast<std::size_t>(st(in));
                read_any[si] = 1;
                if (!f.skip[o]) read_kept[si] = 1;
            }
        }
    }
    for (std::size_t o = 0; o < nops; ++o) {
        if (f.skip[o]) continue;
        for (auto in : b.ops[o].inputs) ++f.uses[static_cast<std::size_t>(st(in))];
    }
    for (std::size_t o = 0; o < nops; ++o)
        if (f.site_of_op[o] >= 0) {
            const auto& s = b.attention[static_cast<std::size_t>(f.site_of_op[o])];
            for (auto t : {s.q, s.k, s.v}) ++f.uses[static_cast<std::size_t>(st(t))];
        }
}

namespace {

// Peak live bytes of one forward of `b` without autograd's saves: its input
// (the caller holds it until the block returns), each op's new outputs, each
// tensor freed after its last read; storages marked in `left_out` are not
// counted (held elsewhere), and `dequant[op]` is in flight during its op.
Bytes forward_live_peak(const Block& b, const std::vector<TensorId>& storage, const std::vector<Bytes>& bytes, const ForwardStructure& f,
                        const std::vector<char>& left_out, const std::vector<Bytes>* dequant) {
    const std::size_t n = b.tensors.size();
    std::vector<std::int32_t> uses = f.uses;
    const auto out_st = static_cast<std::size_t>(storage[static_cast<std::size_t>(b.output)]);
    const auto in_st = static_cast<std::size_t>(storage[0]);
    Bytes live = left_out[in_st] ? Bytes(0) : bytes[in_st], peak = live;
    std::vector<char> alive(n, 0);
    alive[in_st] = 1;
    // The caller holds the block's input until the block returns.
    auto release = [&](std::size_t s) {
        if (alive[s] && s != out_st && s != in_st) {
            live -= bytes[s];
            alive[s] = 0;
        }
    };
    auto read_done = [&](TensorId t) {
        const auto s = static_cast<std::size_t>(storage[static_cast<std::size_t>(t)]);
        if (uses[s] > 0 && --uses[s] == 0) release(s);
    };
    for (std::size_t o = 0; o < b.ops.size(); ++o) {
        const Op& op = b.ops[o];
        if (f.skip[o] && f.site_of_op[o] < 0) continue;
        std::vector<std::size_t> fresh;
        if (f.skip[o]) {
            const AttentionSite& site = b.attention[static_cast<std::size_t>(f.site_of_op[o])];
            fresh.push_back(static_cast<std::size_t>(storage[static_cast<std::size_t>(site.out)]));
        } else {
            for (auto t : op.outputs)
                if (storage[static_cast<std::size_t>(t)] == t && !alive[static_cast<std::size_t>(t)]) fresh.push_back(static_cast<std::size_t>(t));
        }
        for (auto s : fresh) {
            if (left_out[s]) continue;
            live += bytes[s];
            alive[s] = 1;
        }
        const Bytes dq = dequant && o < dequant->size() ? (*dequant)[o] : Bytes(0);
        peak = max(peak, live + dq);
        for (auto s : fresh)
            if (uses[s] == 0) release(s);
        if (f.skip[o]) {
            const AttentionSite& site = b.attention[static_cast<std::size_t>(f.site_of_op[o])];
            for (auto t : {site.q, site.k, site.v}) read_done(t);
        } else {
            for (auto t : op.inputs) read_done(t);
        }
    }
    return peak;
}

// A checkpointed instance's forward in training (the simulator's
// StepBuilder::forward with its saves dropped): what it holds at once beyond
// the saves. Left out: the outputs op-level selective checkpointing keeps
// (sac_kept_ops and the attention outputs: among the saves, op_sac_saved) and,
// unless activations are offloaded, the block's input and output (kept
// checkpoints, among the saves too; offloaded, they stay on the GPU while the
// layer runs).
Bytes checkpointed_forward_peak(const Block& b, const ActivationContext& ctx, const std::vector<TensorId>& storage, const std::vector<Bytes>& bytes,
                                const ForwardStructure& f) {
    std::vector<char> left_out(b.tensors.size(), 0);
    if (ctx.recompute == Recompute::Ops) {
        const std::vector<char> kept = sac_kept_ops(b);
        for (std::size_t o = 0; o < b.ops.size(); ++o)
            if (kept[o]) left_out[static_cast<std::size_t>(storage[static_cast<std::size_t>(b.ops[o].outputs.front())])] = 1;
        if (ctx.attention == Attention::Flash)
            for (const AttentionSite& a : b.attention)
                if (a.out >= 0) left_out[static_cast<std::size_t>(storage[static_cast<std::size_t>(a.out)])] = 1;
    }
    if (!ctx.activation_offload) left_out[static_cast<std::size_t>(storage[0])] = left_out[static_cast<std::size_t>(storage[static_cast<std::size_t>(b.output)])] = 1;
    return forward_live_peak(b, storage, bytes, f, left_out, nullptr);
}

}  // namespace

Bytes no_grad_working_set(const Block& b, const ActivationContext& ctx, const std::vector<Bytes>* dequant) {
    const std::size_t n = b.tensors.size();
    if (n == 0) return Bytes(0);
    std::vector<DType> dt(n);
    std::vector<TensorId> storage(n);
    std::vector<Bytes> bytes(n);
    const std::vector<char> split = tp_split_flags(b);
    for (std::size_t i = 0; i < n; ++i) {
        dt[i] = resolve_role(b.tensors[i].role, ctx);
        bytes[i] = activation_bytes(b.tensors[i], dt[i], split[i] != 0, ctx);
        storage[i] = static_cast<TensorId>(i);
        if (b.tensors[i].alias_of >= 0 && dt[static_cast<std::size_t>(b.tensors[i].alias_of)] == dt[i])
            storage[i] = storage[static_cast<std::size_t>(b.tensors[i].alias_of)];
    }
    return forward_live_peak(b, storage, bytes, forward_structure(b, storage, ctx.attention, true), std::vector<char>(n, 0), dequant);
}

std::int64_t weight_elements(const Block& b, const Op& op, std::int64_t tp, std::int64_t ep) {
    tp = std::max<std::int64_t>(1, tp);
    std::int64_t w = 0;
    for (auto pi : op.params) {
        const Param& prm = b.params[static_cast<std::size_t>(pi)];
        const std::int64_t copies = prm.component == Component::Experts ? (prm.count + ep - 1) / std::max<std::int64_t>(1, ep) : prm.count;
        w = checked_add(w, checked_mul(rank_param_elems(prm, tp), copies));
    }
    // A tied output layer reads the embedding's weight, split like it (vocab-parallel).
    if (op.params.empty() && op.kind == OpKind::Linear && op.in_features > 0)
        w = checked_mul((op.out_features + tp - 1) / tp, op.in_features);
    return w;
}

std::vector<char> tp_split_flags(const Block& b) {
    std::vector<char> split;
    tp_split_flags(b, split);
    return split;
}

void tp_split_flags(const Block& b, std::vector<char>& split) {
    split.assign(b.tensors.size(), 0);
    for (const Op& op : b.ops) {
        bool any_in = false;
        for (auto t : op.inputs) any_in = any_in || split[static_cast<std::size_t>(t)];
        bool out = any_in;
        if (op.kind == OpKind::Linear) {
            // The op's data input (its first) decides column vs row parallel.
            const bool in_split = !op.inputs.empty() && split[static_cast<std::size_t>(op.inputs.front())];
            out = !in_split;
        } else if (op.kind == OpKind::Input || op.kind == OpKind::Embedding || op.kind == OpKind::Loss) {
            out = false;
        }
        for (auto t : op.outputs) split[static_cast<std::size_t>(t)] = out ? 1 : 0;
    }
    for (std::size_t i = 0; i < b.tensors.size(); ++i)
        if (b.tensors[i].alias_of >= 0) split[i] = split[static_cast<std::size_t>(b.tensors[i].alias_of)];
}

// An encoder-decoder model's decoder side runs --decoder-seq tokens
// (SeqAxis, model/graph.hpp): its tokens and self-attention scores follow the
// decoder length, cross-attention scores are decoder queries x encoder keys.
std::int64_t query_len(const TensorInfo& t, const ActivationContext& ctx) {
    if (t.axis == SeqAxis::Main || ctx.decoder_seq <= 0) return ctx.seq;
    return ctx.decoder_seq;
}
std::int64_t key_len(const TensorInfo& t, const ActivationContext& ctx) {
    return t.axis == SeqAxis::Cross ? ctx.seq : query_len(t, ctx);
}

std::int64_t activation_elements(const TensorInfo& t, const ActivationContext& ctx) {
    const Extent& e = t.extent;
    const std::int64_t q = query_len(t, ctx);
    std::int64_t per = e.c0;
    if (e.c1 != 0) per = checked_add(per, checked_mul(e.c1, q));
    // Context parallelism: this rank's queries attend to every rank's keys.
    if (e.c2 != 0) per = checked_add(per, checked_mul(e.c2, checked_mul(q, checked_mul(key_len(t, ctx), std::max<std::int64_t>(1, ctx.cp)))));
    per = std::max<std::int64_t>(per, 0);  // a shifted tensor (c0 < 0) at s = 0
    return t.per_batch ? checked_mul(ctx.batch, per) : per;
}

Bytes activation_bytes(const TensorInfo& t, DType dt, bool split, const ActivationContext& ctx) {
    std::int64_t n = activation_elements(t, ctx);
    if (ctx.capacity_factor != 1.0 && t.name.find("experts") != std::string::npos && t.name.find("shared_experts") == std::string::npos)
        n = static_cast<std::int64_t>(std::llround(static_cast<double>(n) * ctx.capacity_factor));
    if (ctx.tp > 1 && (split || ctx.sp)) n = (n + ctx.tp - 1) / ctx.tp;
    return dtype_bytes(dt, n);
}

namespace {

struct InstanceResult {
    Bytes saved;
    Bytes weight_casts;
    Bytes frozen_casts;  // part of weight_casts: frozen weights' per-call casts (not in autocast's cache)
    Bytes lora;
    Bytes largest;
    Bytes routed;     // saved tensors of routed experts
    Bytes grad_pair;  // max over ops of |grad wrt output| + |grad wrt input|
    Bytes grad_pair_net;  // the same less what the block's later ops' backwards freed before it
    Bytes forward_transient;  // checkpointable under recompute: its checkpointed forward's peak beyond the saves
    Bytes loss_input;
    Bytes quant_held;  // part of saved: 4-bit layers' inputs kept as context attributes
    Bytes working_set;
    Bytes input_bytes;
    Bytes output_bytes;
    std::optional<Bytes> head_output;  // the output layer's logits (the last output-head op's output), if the block has one
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

// run_instance's per-tensor and per-op arrays, kept per thread: an estimate
// walks a few blocks, and their dozen arrays were a sixth of its heap calls.
// run_instance does not nest, so one set per thread suffices.
struct InstanceScratch {
    std::vector<DType> dt;
    std::vector<TensorId> storage;
    std::vector<Bytes> bytes, pair, saved_by, rebuilt, alive;
    std::vector<char> rg, marked, allocated, split, core_out, counted;
    struct AdapterMoment {
        std::size_t op, x;  // the adapted op, its input's storage
        Bytes moment;       // the adapter's temporaries (without x)
    };
    std::vector<AdapterMoment> adapter_moments;
    ForwardStructure fs;
};

// Per op: the bytes of activation gradients alive while its backward runs
// (after it made its inputs' gradients, before it freed its outputs'), by the
// rules of the simulator's backward (sim/step_train.cpp StepBuilder::backward):
// the block's output gradient arrives from outside (a block with the loss
// starts from it); an op runs when one of its outputs has a gradient (the loss
// always); it makes a gradient for each input that requires one and has none
// (later contributions accumulate into it), a view of its output's for cat and
// stack (kGradViews); an in-place op a new one for its input; then its
// outputs' gradients are consumed. Flash attention runs the core as one kernel
// at its output's op (the q, k, v gradients at once). Gradients of tensors
// shared between blocks (shared_key) live outside the block and are not counted.
void grad_alive_at(const Block& blk, const ForwardStructure& f, const std::vector<DType>& dt, const std::vector<TensorId>& storage,
                   const std::vector<Bytes>& bytes, const std::vector<char>& rg, bool input_rg, std::vector<Bytes>& alive) {
    static thread_local std::vector<std::int32_t> buf;  // per storage: its gradient's buffer, or -1
    static thread_local std::vector<Bytes> size;         // per buffer
    static thread_local std::vector<std::int32_t> refs;  // per buffer
    const std::size_t n = blk.tensors.size(), nops = blk.ops.size();
    alive.assign(nops, Bytes(0));
    if (n == 0) return;
    buf.assign(n, -1);
    size.clear();
    refs.clear();
    Bytes live;
    const auto st = [&](TensorId t) { return static_cast<std::size_t>(storage[static_cast<std::size_t>(t)]); };
    const auto make = [&](std::size_t s, Bytes b) {
        size.push_back(b);
        refs.push_back(1);
        live += b;
        buf[s] = static_cast<std::int32_t>(size.size() - 1);
    };
    const auto unref = [&](std::int32_t id) {
        if (id >= 0 && --refs[static_cast<std::size_t>(id)] == 0) live -= size[static_cast<std::size_t>(id)];
    };
    const std::size_t st0 = st(0);
    const auto grad_for = [&](TensorId t) {
        const std::size_t s = st(t);
        if (!rg[static_cast<std::size_t>(t)] && s != st0) return;
        if (s == st0 && !input_rg) return;
        if (s != st0 && !blk.tensors[s].shared_key.empty()) return;
        if (buf[s] < 0) make(s, bytes[static_cast<std::size_t>(t)]);
    };
    bool has_loss = false;
    for (const Op& op : blk.ops) has_loss = has_loss || op.kind == OpKind::Loss;
    if (!has_loss && rg[static_cast<std::size_t>(blk.output)]) make(st(blk.output), bytes[st(blk.output)]);
    const auto skip_type = [](DType d) { return d == DType::I64 || d == DType::Bool || d == DType::F8_E4M3; };
    for (std::size_t o = nops; o-- > 0;) {
        const Op& op = blk.ops[o];
        if (f.skip[o]) {
            if (f.site_of_op[o] < 0) continue;
            const AttentionSite& a = blk.attention[static_cast<std::size_t>(f.site_of_op[o])];
            const std::size_t os = st(a.out);
            if (buf[os] >= 0) {
                for (auto t : {a.q, a.k, a.v}) grad_for(t);
                alive[o] = live;
                unref(buf[os]);
                buf[os] = -1;
            }
            continue;
        }
        bool has_out_grad = false;
        for (auto t : op.outputs) has_out_grad = has_out_grad || buf[st(t)] >= 0;
        if (!has_out_grad && op.kind != OpKind::Loss) continue;
        const std::int32_t out_id = op.outputs.empty() ? -1 : buf[st(op.outputs.front())];
        std::int32_t inplace = -1;
        if (op.kind == OpKind::Activation || op.kind == OpKind::Mul || op.kind == OpKind::Elementwise)
            for (auto t : op.outputs)
                for (auto i2 : op.inputs)
                    if (st(i2) == st(t) && buf[st(t)] >= 0 && inplace < 0) {
                        inplace = buf[st(t)];
                        buf[st(t)] = -1;
                    }
        for (auto t : op.inputs) {
            if (skip_type(dt[static_cast<std::size_t>(t)])) continue;
            const std::size_t s = st(t);
            if ((op.flags & kGradViews) && out_id >= 0 && buf[s] < 0 && rg[static_cast<std::size_t>(t)] && s != st0 && blk.tensors[s].shared_key.empty()) {
                ++refs[static_cast<std::size_t>(out_id)];
                buf[s] = out_id;
                continue;
            }
            grad_for(t);
        }
        alive[o] = live;
        unref(inplace);
        for (auto t : op.outputs) {
            const std::size_t s = st(t);
            bool also_input = false;
            for (auto i2 : op.inputs) also_input = also_input || st(i2) == s;
            if (also_input || buf[s] < 0) continue;
            unref(buf[s]);
            buf[s] = -1;
        }
    }
}

InstanceResult run_instance(const Block& blk, const ActivationContext& ctx, bool input_rg) {
    static thread_local InstanceScratch scratch;
    const std::size_t n = blk.tensors.size();
    std::vector<DType>& dt = scratch.dt;
    std::vector<TensorId>& storage = scratch.storage;
    std::vector<Bytes>& bytes = scratch.bytes;
    std::vector<char>&rg = scratch.rg, &marked = scratch.marked;
    dt.assign(n, DType{});
    storage.assign(n, TensorId{});
    bytes.assign(n, Bytes(0));
    rg.assign(n, 0);
    marked.assign(n, 0);
    InstanceResult r;
    scratch.adapter_moments.clear();
    // The tensors the block allocates, the candidates for the largest tensor
    // and the working set: those an op makes. Fused attention (SDPA/flash)
    // never materialises the core's (scores, probabilities, dropout mask).
    // A kernel rewrite (model/rewrite.hpp) leaves the tensors of the ops it
    // removed in the list (a fused linear cross-entropy's fp32 logits and
    // log_softmax, never made): they were the largest tensor the analytic
    // reserved peak keeps cached, qwen2-0.5b LoRA at batch 2, seq 8192 with
    // --cross-entropy fused-linear reserving b x s x V x 4 = 9.27 GiB of
    // logits it never makes (29.24 GiB against the simulator's 20.62 GiB).
    std::vector<char>& allocated = scratch.allocated;
    allocated.assign(n, 0);
    for (const Op& op : blk.ops) {
        const bool fused_away = ctx.attention == Attention::Flash && (op.flags & kAttnCore);
        for (auto t : op.outputs) {
            char& a = allocated[static_cast<std::size_t>(t)];
            a = fused_away ? 2 : a == 0 ? 1 : a;  // 2: a fused core's, whatever else makes it
        }
    }
    std::vector<char>& split = scratch.split;
    tp_split_flags(blk, split);
    for (std::size_t i = 0; i < n; ++i) {
        const TensorInfo& t = blk.tensors[i];
        dt[i] = resolve_role(t.role, ctx);
        bytes[i] = activation_bytes(t, dt[i], split[i] != 0, ctx);
        storage[i] = static_cast<TensorId>(i);
        if (t.alias_of >= 0 && dt[static_cast<std::size_t>(t.alias_of)] == dt[i])
            storage[i] = storage[static_cast<std::size_t>(t.alias_of)];
        if (storage[i] == static_cast<TensorId>(i) && i > 0 && allocated[i] == 1) {
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
            const Bytes b = activation_bytes(blk.tensors[static_cast<std::size_t>(t)], ctx.lowered, split[static_cast<std::size_t>(t)] != 0, ctx);
            r.saved += b;
            if (bucket) *bucket += b;
        } else {
            mark(t, bucket);
        }
    };

    // Per op: its gradient pair and the bytes it saves first (freed when its
    // backward runs), to net each pair against what backward freed before it.
    std::vector<Bytes>&pair = scratch.pair, &saved_by = scratch.saved_by;
    pair.assign(blk.ops.size(), Bytes(0));
    saved_by.assign(blk.ops.size(), Bytes(0));
    for (std::size_t oi = 0; oi < blk.ops.size(); ++oi) {
        const Op& op = blk.ops[oi];
        const Bytes saved_before = r.saved;
        struct Attribute {
            Bytes& slot;
            const Bytes& now;
            Bytes before;
            ~Attribute() { slot += now - before; }
        } attribute{saved_by[oi], r.saved, saved_before};
        // (fused attention runs the core as one kernel: no per-op gradient pairs)
        const bool fused_op = ctx.attention == Attention::Flash && (op.flags & kAttnCore);
        if (!fused_op && !op.inputs.empty() && !op.outputs.empty() && op.kind != OpKind::Input && op.kind != OpKind::View &&
            op.kind != OpKind::Cast) {
            // The output's gradient and a new gradient for each input that
            // requires one (a product's backward makes both factors' at once).
            pair[oi] = bytes[static_cast<std::size_t>(op.outputs.front())] + bytes[static_cast<std::size_t>(op.inputs.front())];
            for (std::size_t k = 1; k < op.inputs.size(); ++k) {
                const auto ti = static_cast<std::size_t>(op.inputs[k]);
                bool seen = storage[ti] == storage[static_cast<std::size_t>(op.inputs.front())];
                for (std::size_t k2 = 1; k2 < k; ++k2) seen = seen || storage[static_cast<std::size_t>(op.inputs[k2])] == storage[ti];
                if (rg[ti] && !seen && dt[ti] != DType::I64 && dt[ti] != DType::Bool && dt[ti] != DType::F8_E4M3) pair[oi] += bytes[ti];
            }
            r.grad_pair = max(r.grad_pair, pair[oi]);
        }
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
        if (autocast && ctx.weight_cache && base_tr && ctx.stream == DType::F32 &&
            (op.kind == OpKind::Linear || op.kind == OpKind::Conv2d || op.kind == OpKind::Matmul)) {
            const Bytes b = dtype_bytes(ctx.lowered, weight_elements(blk, op, ctx.tp, ctx.ep));
            r.weight_casts += b;
            r.saved += b;
        } else if (autocast && ctx.frozen_weight_casts && has_w && !base_tr && in_rg && ctx.stream == DType::F32 &&
                   !quantized_op(blk, op, ctx.quant, ctx.quantize_head) && (op.kind == OpKind::Linear || op.kind == OpKind::Matmul)) {
            // A frozen fp32 weight's per-call 16-bit cast, kept for the input's gradient.
            const Bytes b = dtype_bytes(ctx.lowered, weight_elements(blk, op, ctx.tp, ctx.ep));
            r.weight_casts += b;
            r.frozen_casts += b;
            r.saved += b;
        }
        // A frozen quantized linear whose input requires grad: bitsandbytes keeps
        // the input (quantized_saves_input); 4-bit layers keep their cast of it
        // to the compute dtype.
        if (in_rg && !base_tr && quantized_saves_input(ctx) && quantized_op(blk, op, ctx.quant, ctx.quantize_head)) {
            const TensorId x = op.inputs.front();
            const auto xi = static_cast<std::size_t>(x);
            const Bytes before = r.saved;
            if (ctx.quant == Quant::Int8 || dt[xi] == ctx.lowered) mark(x, nullptr);
            else r.saved += activation_bytes(blk.tensors[xi], ctx.lowered, split[xi] != 0, ctx);
            // 4-bit (ctx.tensors, not save_for_backward): not freed by backward.
            if (ctx.quant != Quant::Int8) r.quant_held += r.saved - before;
        }
        if (lora) {
            // lora_A saves x (or the adapter's own cast / dropped copy of it, with
            // dropout's mask: adapter_input); lora_B saves A's [rows, r] output.
            const TensorId x = op.inputs.front();
            const auto xi = static_cast<std::size_t>(x);
            // A fused-QKV adapter shares the first one's dropped input and mask.
            const bool shared = shared_adapter_input(blk, oi, ctx) >= 0;
            const AdapterInput ai = shared ? AdapterInput{} : adapter_input(blk, op, x, dt[xi], split[xi] != 0, ctx);
            if (ai.saves_x) mark(x, nullptr);  // an activation like any other (split with the layout)
            r.saved += ai.copy + ai.mask;
            const std::int64_t elems = activation_elements(blk.tensors[xi], ctx) / std::max<std::int64_t>(1, op.in_features);
            const Bytes b = dtype_bytes(ctx.lowered, checked_mul(elems, ctx.lora_rank));
            r.saved += b;
            r.lora += b;
            if (qkv_lora_zero_pad(blk, oi, ctx)) {
                const Bytes zp = dtype_bytes(ctx.lowered, checked_mul(elems, op.out_features));
                r.saved += zp;
                r.lora += zp;
            }
            // The adapter's moment (as the simulator runs PEFT's lora.Linear):
            // the base output, the dtype conversion of x and the larger of
            // dropout's output and lora_B's [rows, out] output at once.
            const Bytes out = op.outputs.empty() ? Bytes(0) : bytes[static_cast<std::size_t>(op.outputs.front())];
            const Bytes moment = out + ai.convert + max(ai.dropped, dtype_bytes(ctx.lowered, checked_mul(elems, op.out_features)));
            r.largest = max(r.largest, moment);
            scratch.adapter_moments.push_back({oi, static_cast<std::size_t>(storage[xi]), moment});
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
                if (qkv_view_keeps_fused(blk, a, ctx)) r.saved += bytes[static_cast<std::size_t>(storage[static_cast<std::size_t>(a.v)])] * 2;
                mark(a.out, nullptr);
                // The fp32 logsumexp [b, heads, s]; heads are split over tp.
                r.saved += dtype_bytes(DType::F32, (checked_mul(checked_mul(ctx.batch, a.heads), query_len(blk.tensors[static_cast<std::size_t>(a.q)], ctx)) + ctx.tp - 1) /
                                                       std::max<std::int64_t>(1, ctx.tp));
            } else {
                // Selective recompute: the checkpointed core keeps its inputs.
                mark(a.q, nullptr);
                mark(a.k, nullptr);
                mark(a.v, nullptr);
            }
        }
    }
    // Saves made for fused attention go with the op producing the site's output.
    if (r.saved > std::accumulate(saved_by.begin(), saved_by.end(), Bytes(0)) && !blk.ops.empty()) {
        const Bytes rest_saved = r.saved - std::accumulate(saved_by.begin(), saved_by.end(), Bytes(0));
        std::size_t at = blk.ops.size() - 1;
        for (std::size_t oi = 0; oi < blk.ops.size() && !blk.attention.empty(); ++oi)
            for (auto o : blk.ops[oi].outputs)
                if (o == blk.attention.front().out) at = oi;
        saved_by[at] += rest_saved;
    }
    // x itself is alive at its adapter's moment too (the caller holds it until
    // the layer returns); where nothing saves it (a frozen base saves no
    // input; LoRA's cast copy is what lora_A saves) it adds to the moment.
    // The block's saves then exist up to this op's (those of later ops not
    // yet), so it counts over the saves as moment + x - the later ops' saves:
    // the last adapter of a layer (down_proj, whose input is the [b, s,
    // intermediate] product) adds x whole. The rebuild of a layer (full
    // recompute) peaked there in the simulator above the analytic view:
    // qwen2-0.5b LoRA all-linear, batch 3, seq 2048, amp-bf16, full recompute,
    // fused linear cross-entropy, -4.1%.
    {
        Bytes later;
        std::size_t next = blk.ops.size();
        for (auto it = scratch.adapter_moments.rbegin(); it != scratch.adapter_moments.rend(); ++it) {
            for (; next > it->op + 1; --next) later += saved_by[next - 1];
            if (!marked[it->x] && it->moment + bytes[it->x] > later) r.largest = max(r.largest, it->moment + bytes[it->x] - later);
        }
    }
    // Selective recompute of an eager core: backward reaching the core rebuilds
    // every tensor the core's ops save that the core produced (the
    // probabilities, dropout mask and dropped copy), each freed after its
    // op's backward, as the simulator does (sim/step_train.cpp); they are not
    // among the block's saves, so they add to the core ops' gradient pairs.
    std::vector<Bytes>& rebuilt = scratch.rebuilt;
    rebuilt.assign(blk.ops.size(), Bytes(0));
    if (ctx.recompute == Recompute::Selective && ctx.attention != Attention::Flash) {
        std::vector<char>&core_out = scratch.core_out, &counted = scratch.counted;
        core_out.assign(n, 0);
        counted.assign(n, 0);
        for (const Op& op : blk.ops)
            if (op.flags & kAttnCore)
                for (auto t : op.outputs) core_out[static_cast<std::size_t>(storage[static_cast<std::size_t>(t)])] = 1;
        for (std::size_t oi = 0; oi < blk.ops.size(); ++oi) {
            if (!(blk.ops[oi].flags & kAttnCore) || pair[oi] == Bytes(0)) continue;
            for (const SavedRef& s : blk.ops[oi].saved) {
                const auto st = static_cast<std::size_t>(storage[static_cast<std::size_t>(s.tensor)]);
                if (!core_out[st] || counted[st]) continue;
                counted[st] = 1;
                rebuilt[oi] += bytes[st];
            }
        }
    }
    // Besides an op's own pair, gradients its backward does not touch are
    // alive (grad_alive_at): the residual stream's, which a residual add hands
    // its input and which waits through the whole branch's backward. Pairs
    // alone missed it: pythia-160m b3 s8192 fp32, full recompute, activation
    // offload, tp 2, 4.7% under the simulator (b x s x h during the MLP's backward).
    ForwardStructure& fs = scratch.fs;
    forward_structure(blk, storage, ctx.attention, false, fs);
    std::vector<Bytes>& alive = scratch.alive;
    grad_alive_at(blk, fs, dt, storage, bytes, rg, input_rg, alive);
    if ((ctx.recompute == Recompute::Full || ctx.recompute == Recompute::Ops) && blk.checkpointable)
        r.forward_transient = checkpointed_forward_peak(blk, ctx, storage, bytes, fs);
    {
        Bytes freed, rebuilt_alive = std::accumulate(rebuilt.begin(), rebuilt.end(), Bytes(0));
        for (std::size_t oi = blk.ops.size(); oi-- > 0;) {
            const Bytes p = (pair[oi] > Bytes(0) ? max(pair[oi], alive[oi]) : pair[oi]) + ((blk.ops[oi].flags & kAttnCore) ? rebuilt_alive : Bytes(0));
            if (p > freed) r.grad_pair_net = max(r.grad_pair_net, p - freed);
            r.grad_pair = max(r.grad_pair, p);
            freed += saved_by[oi];
            rebuilt_alive -= rebuilt[oi];
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
    for (const Op& op : blk.ops)
        if (is_output_head(op)) r.head_output = bytes[static_cast<std::size_t>(op.outputs.front())];
    return r;
}

}  // namespace

struct ActivationMemo::Impl {
    const ActivationContext* ctx = nullptr;
    struct Entry {
        const Block* block;
        bool input_rg;
        InstanceResult result;
    };
    std::vector<Entry> entries;
};
ActivationMemo::ActivationMemo() : impl(std::make_unique<Impl>()) {}
ActivationMemo::~ActivationMemo() = default;

ActivationResult saved_activations(const ModelGraph& g, const ActivationContext& ctx, const std::vector<std::int64_t>* instances,
                                   bool input_requires_grad, ActivationMemo* memo_in) {
    ActivationMemo::Impl* memo = memo_in ? memo_in->impl.get() : nullptr;
    if (memo && !memo->ctx) memo->ctx = &ctx;
    if (memo && memo->ctx != &ctx) memo = nullptr;
    auto instance = [&](const Block& blk, bool rg_in) -> InstanceResult {
        if (!memo) return run_instance(blk, ctx, rg_in);
        for (const auto& e : memo->entries)
            if (e.block == &blk && e.input_rg == rg_in) return e.result;
        memo->entries.push_back({&blk, rg_in, run_instance(blk, ctx, rg_in)});
        return memo->entries.back().result;
    };
    ActivationResult res;
    res.blocks.reserve(g.blocks.size());
    std::vector<std::string> shared_seen;
    bool rg = input_requires_grad;
    bool prev_saves_output = false;
    Bytes prev_output;  // output of the previous block counted
    std::int64_t ck_first = 0;  // checkpointable instances before this block
    // Megatron uniform chunks over layers that differ: each checkpointable
    // instance's saves and largest transient, and its block.
    struct Inst {
        std::size_t block;
        Bytes saved, largest, fetched;
        Bytes input_saved;  // its input, when its ops save it (the kept or fetched input itself)
    };
    std::vector<Inst> insts;
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Block& blk = g.blocks[bi];
        const std::int64_t repeat = instances ? (bi < instances->size() ? (*instances)[bi] : 0) : blk.repeat;
        BlockActivations ba;
        ba.block = blk.name;
        ba.repeat = repeat;
        if (repeat <= 0) {
            res.blocks.push_back(std::move(ba));
            continue;
        }
        InstanceResult first = instance(blk, rg);
        InstanceResult rest = first;
        if (repeat > 1 && first.output_rg != rg) rest = instance(blk, first.output_rg);
        const std::int64_t more = repeat - 1;

        const bool ckpt = (ctx.recompute == Recompute::Full || ctx.recompute == Recompute::Ops) && blk.checkpointable;
        const std::int64_t group = ckpt ? recompute_group(ctx) : 1;   // Megatron uniform chunks
        const std::int64_t n_ck = ckpt ? checkpointed_count(repeat, ctx, ck_first) : 0;  // instances 0, N, 2N, ... / the first N / the chunks
        const std::int64_t ck_at = ck_first;
        if (ckpt) ck_first += repeat;

        const Bytes sac = ckpt && ctx.recompute == Recompute::Ops ? op_sac_saved(blk, ctx) : Bytes(0);
        // Offloaded inputs: one comes back from CPU memory for each recompute.
        const Bytes fetched = ckpt && ctx.activation_offload ? rest.input_bytes : Bytes(0);
        // A checkpointed instance's forward frees its intermediates as it goes.
        if (ckpt && n_ck > 0) ba.forward_transient = rest.forward_transient;
        if (ckpt && group > 1)
            for (std::int64_t k = 0; k < repeat; ++k) insts.push_back({res.blocks.size(), rest.saved, rest.largest, fetched, rest.saves_input ? rest.input_bytes : Bytes(0)});
        if (ckpt && group == 1 && n_ck < repeat) {
            // Every N-th (or the first N) instances checkpointed, the others keep their saves.
            ba.per_instance = rest.saved;
            ba.total = (ctx.activation_offload ? Bytes(0) : rest.input_bytes) * n_ck + sac * n_ck + rest.saved * (repeat - n_ck);
            res.saved += ba.total;
            // Only a block with a checkpointed instance is rebuilt.
            // (Its kept or fetched input is the one its first op saves: one storage.)
            ba.recompute_transient = n_ck > 0 ? rest.saved + rest.largest + fetched - (rest.saves_input ? rest.input_bytes : Bytes(0)) : Bytes(0);
            ba.recompute_layer = ba.recompute_transient;
            ba.recompute_largest = n_ck > 0 ? rest.largest : Bytes(0);
            res.recompute_transient = max(res.recompute_transient, ba.recompute_transient);
            // No checkpointed instance here: the trailing run goes on through this block.
            res.recompute_trailing = n_ck == 0 ? res.recompute_trailing + ba.total : rest.saved * trailing_uncheckpointed(repeat, ctx, ck_at);
            ba.weight_casts = rest.weight_casts * (repeat - n_ck);
            res.autocast_weight_casts += ba.weight_casts;
            ba.unsaved_casts = (rest.weight_casts - rest.frozen_casts) * n_ck;
            res.autocast_cache_unsaved += ba.unsaved_casts;
            ba.lora = rest.lora * (repeat - n_ck);
            res.lora_adapters += ba.lora;
            prev_saves_output = false;
        } else if (ckpt) {
            // Only each layer's input survives the forward; backward rebuilds
            // one layer at a time (its activations + working set).
            // An instance's input is what the previous one handed on: the
            // previous block's output for the first (this block's own input
            // when nothing ran before it), this block's output for the rest.
            // Op-level selective checkpointing also keeps its chosen outputs;
            // offloaded inputs leave the GPU once the next layer has read them.
            // Megatron uniform chunks of N layers keep one input per chunk and
            // rebuild a whole chunk at once (its N layers' activations).
            const Bytes in_first = prev_output > Bytes(0) ? prev_output : first.input_bytes;
            const std::int64_t chunk = std::min(group, repeat);
            ba.per_instance = (more > 0 ? first.output_bytes : in_first) + sac;
            // Uniform chunks run on across blocks: an instance inside a chunk
            // begun in an earlier block keeps nothing of its own.
            const bool starts = checkpointed_instance(ck_at, ctx);
            ba.total = ctx.activation_offload ? sac * repeat
                                              : (starts ? in_first : Bytes(0)) + first.output_bytes * (n_ck - (starts ? 1 : 0)) + sac * repeat;
            res.saved += ba.total;
            // A rebuilt instance's input, kept or fetched back from CPU memory,
            // is the tensor its first op saves (one storage, the simulator's
            // StepBuilder::backward_chunk: the forward re-run from it), not a
            // second copy beside its saves.
            ba.recompute_transient = rest.saved * chunk + rest.largest + fetched - (rest.saves_input ? rest.input_bytes : Bytes(0));
            ba.recompute_layer = rest.saved + rest.largest + fetched - (rest.saves_input ? rest.input_bytes : Bytes(0));
            ba.recompute_largest = rest.largest;
            res.recompute_transient = max(res.recompute_transient, ba.recompute_transient);
            res.recompute_trailing = Bytes(0);
            ba.unsaved_casts = first.weight_casts - first.frozen_casts + (rest.weight_casts - rest.frozen_casts) * more;
            res.autocast_cache_unsaved += ba.unsaved_casts;
            prev_saves_output = false;
        } else {
            Bytes total = first.saved + rest.saved * more;
            // A tensor handed from one instance to the next is one storage.
            if (prev_saves_output && first.saves_input) total -= first.input_bytes;
            if (rest.saves_input && rest.saves_output) total -= rest.input_bytes * more;
            ba.per_instance = rest.saved;
            ba.total = total;
            ba.routed_per_instance = rest.routed;
            res.saved += total;
            ba.weight_casts = first.weight_casts + rest.weight_casts * more;
            ba.lora = first.lora + rest.lora * more;
            ba.quant_held = first.quant_held + rest.quant_held * more;
            res.quant_held += ba.quant_held;
            res.autocast_weight_casts += ba.weight_casts;
            res.lora_adapters += ba.lora;
            prev_saves_output = rest.saves_output;
        }
        for (const auto* inst : {&first, &rest})
            for (const auto& [key, b] : inst->shared)
                if (std::find(shared_seen.begin(), shared_seen.end(), key) == shared_seen.end()) {
                    shared_seen.push_back(key);
                    res.saved += b;
                    ba.total += b;
                }
        ba.grad_pair = max(first.grad_pair, rest.grad_pair);
        ba.grad_pair_net = max(first.grad_pair_net, rest.grad_pair_net);
        res.backward_grad_pair = max(res.backward_grad_pair, ba.grad_pair);
        if (rest.loss_input > Bytes(0)) res.loss_input = rest.loss_input;
        ba.largest_tensor = max(first.largest, rest.largest);
        ba.working_set = rest.working_set;
        res.largest_tensor = max(res.largest_tensor, ba.largest_tensor);
        if (rest.head_output) res.logits = *rest.head_output;  // (sized by the block walk, split as the tensor is)
        rg = rest.output_rg;
        prev_output = rest.output_bytes;
        res.blocks.push_back(std::move(ba));
    }
    // A uniform chunk may span blocks: its rebuild holds the saves of its
    // layers, whichever block each comes from (the chunk is charged to the
    // block it starts in).
    const std::int64_t group = recompute_group(ctx);
    if (group > 1 && !insts.empty()) {
        for (auto& b : res.blocks) b.recompute_transient = Bytes(0);
        res.recompute_transient = Bytes(0);
        for (std::size_t c = 0; c < insts.size(); c += static_cast<std::size_t>(group)) {
            Bytes sum, largest, fetched;
            for (std::size_t i = c; i < std::min(insts.size(), c + static_cast<std::size_t>(group)); ++i) {
                sum += insts[i].saved;
                largest = max(largest, insts[i].largest);
                fetched = max(fetched, insts[i].fetched);
            }
            BlockActivations& b = res.blocks[insts[c].block];
            // (The chunk's kept or fetched input is the one its first layer saves.)
            b.recompute_transient = max(b.recompute_transient, sum + largest + fetched - insts[c].input_saved);
            for (std::size_t i = c; i < std::min(insts.size(), c + static_cast<std::size_t>(group)); ++i) {
                BlockActivations& bi = res.blocks[insts[i].block];
                bi.recompute_layer = max(bi.recompute_layer, insts[i].saved + insts[i].largest + insts[i].fetched - insts[i].input_saved);
            }
            b.recompute_largest = max(b.recompute_largest, largest);
            res.recompute_transient = max(res.recompute_transient, b.recompute_transient);
        }
    }
    return res;
}

}  // namespace gpumem
