#include "gpumem/sim/step.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <string>

#include "gpumem/memory/activations.hpp"

namespace gpumem::sim {

namespace {

// Emits events and reference-counts tensors: a tensor is freed when its last
// holder (a pending forward read, a save for backward, the training loop)
// lets go, as PyTorch frees a storage when its last reference dies.
class Emitter {
public:
    explicit Emitter(Trace& t) : t_(t) {
        sizes_.push_back(Bytes(0));
        refs_.push_back(0);
    }

    Phase phase = Phase::Setup;
    std::int32_t step = 0;

    std::int64_t alloc(Bytes size, std::int32_t label) {
        if (size <= Bytes(0)) return 0;
        const auto id = static_cast<std::int64_t>(sizes_.size());
        sizes_.push_back(size);
        refs_.push_back(1);
        t_.events.push_back({TraceEvent::Kind::Alloc, phase, 0, id, size, label, step});
        live_ += size;
        return id;
    }
    void ref(std::int64_t id) {
        if (id > 0) ++refs_[static_cast<std::size_t>(id)];
    }
    void unref(std::int64_t id) {
        if (id <= 0) return;
        auto& r = refs_[static_cast<std::size_t>(id)];
        if (r <= 0) return;
        if (--r == 0) {
            const Bytes s = sizes_[static_cast<std::size_t>(id)];
            t_.events.push_back({TraceEvent::Kind::Free, phase, 0, id, s, -1, step});
            live_ -= s;
        }
    }
    void transient(Bytes size, std::int32_t label) { unref(alloc(size, label)); }
    void mark() { t_.events.push_back({TraceEvent::Kind::PhaseMark, phase, 0, 0, Bytes(0), -1, step}); }
    [[nodiscard]] Bytes live() const { return live_; }
    std::int32_t label(std::string s) { return t_.add_label(std::move(s)); }

private:
    Trace& t_;
    std::vector<Bytes> sizes_;
    std::vector<std::int32_t> refs_;
    Bytes live_;
};

bool is_matmul(OpKind k) { return k == OpKind::Linear || k == OpKind::Matmul || k == OpKind::Conv2d; }

// Facts of one block resolved for the job and a sequence length.
struct BlockPlan {
    const Block* blk = nullptr;
    std::int64_t seq = 1;
    std::vector<DType> dt;
    std::vector<Bytes> bytes;
    std::vector<TensorId> storage;
    std::vector<std::int32_t> uses;   // forward reads per storage
    std::vector<char> skip;           // op folded into a fused attention op (flash)
    std::vector<int> site_of_op;      // op producing an attention site's output -> site index
    std::vector<std::int32_t> label;  // per tensor
    std::vector<char> has_weight;     // per op
    std::vector<Bytes> weight_cast;   // per op: autocast 16-bit copy of its weights
    std::vector<Bytes> dequant;       // per op: 4-bit weight dequantized for the matmul
    std::vector<Bytes> tied_grad;     // per op reading a weight owned elsewhere: its gradient on this rank
    std::vector<std::vector<Bytes>> param_grads;  // per op: one entry per trainable param tensor
    std::vector<char> lora;
    std::vector<Bytes> lora_a, lora_b;
    std::vector<std::vector<Bytes>> lora_grads;
    bool checkpointed = false;
};

// Elements of one tensor of a parameter on one rank (tensor-parallel layers
// split by tp, routed experts by ep).
std::int64_t rank_elements(const Param& prm, const Layout* lay) {
    std::int64_t per = 1;
    for (auto d : prm.shape) per = checked_mul(per, d);
    if (!lay) return per;
    const bool tp_split = prm.component == Component::Attention || prm.component == Component::Mlp ||
                          prm.component == Component::Experts || prm.component == Component::Embeddings ||
                          prm.component == Component::Head;
    if (tp_split) per = (per + lay->cfg.tp - 1) / lay->cfg.tp;
    return per;
}

BlockPlan plan_block(const Block& b, const Job& job, std::int64_t seq, bool inference, Emitter& em, double act_scale = 1.0,
                     const Layout* lay = nullptr) {
    BlockPlan p;
    p.blk = &b;
    p.seq = seq;
    ActivationContext c = job.actx;
    c.seq = seq;
    const std::size_t n = b.tensors.size();
    p.dt.resize(n);
    p.bytes.resize(n);
    p.storage.resize(n);
    p.uses.assign(n, 0);
    p.label.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const TensorInfo& t = b.tensors[i];
        p.dt[i] = resolve_role(t.role, c);
        p.bytes[i] = dtype_bytes(p.dt[i], t.extent.elements(c.batch, c.seq));
        if (act_scale != 1.0)
            p.bytes[i] = Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(p.bytes[i].count()) * act_scale)));
        p.storage[i] = static_cast<TensorId>(i);
        if (t.alias_of >= 0 && p.dt[static_cast<std::size_t>(t.alias_of)] == p.dt[i])
            p.storage[i] = p.storage[static_cast<std::size_t>(t.alias_of)];
        p.label[i] = em.label(b.name + "." + t.name);
    }
    const std::size_t nops = b.ops.size();
    p.skip.assign(nops, 0);
    p.site_of_op.assign(nops, -1);
    if (inference)
        for (std::size_t o = 0; o < nops; ++o) {
            const Op& op = b.ops[o];
            // Generation computes no loss: drop the labels and the loss op.
            if (op.kind == OpKind::Loss) p.skip[o] = 1;
            if (op.kind == OpKind::Input && b.tensors[static_cast<std::size_t>(op.outputs.front())].name.find("labels") != std::string::npos)
                p.skip[o] = 1;
        }
    if (c.attention == Attention::Flash) {
        for (std::size_t o = 0; o < nops; ++o)
            if (b.ops[o].flags & kAttnCore) p.skip[o] = 1;
        for (std::size_t s = 0; s < b.attention.size(); ++s)
            for (std::size_t o = 0; o < nops; ++o)
                for (auto out : b.ops[o].outputs)
                    if (out == b.attention[s].out) p.site_of_op[o] = static_cast<int>(s);
        // Ops whose outputs only feed skipped ops (q/k/v copies for torch.matmul) go too.
        for (std::size_t o = nops; o-- > 0;) {
            const Op& op = b.ops[o];
            if (p.skip[o] || op.outputs.empty() || op.kind == OpKind::Input) continue;
            bool consumed = false, only_skipped = true;
            for (auto out : op.outputs) {
                const TensorId st = p.storage[static_cast<std::size_t>(out)];
                if (st == p.storage[static_cast<std::size_t>(b.output)]) only_skipped = false;
                for (const auto& s : b.attention)
                    for (auto t : {s.q, s.k, s.v})
                        if (st == p.storage[static_cast<std::size_t>(t)]) only_skipped = false;
                for (std::size_t o2 = o + 1; o2 < nops; ++o2)
                    for (auto in : b.ops[o2].inputs)
                        if (p.storage[static_cast<std::size_t>(in)] == st) {
                            consumed = true;
                            if (!p.skip[o2]) only_skipped = false;
                        }
            }
            if (consumed && only_skipped) p.skip[o] = 1;
        }
    }
    for (std::size_t o = 0; o < nops; ++o) {
        if (p.skip[o]) continue;
        for (auto in : b.ops[o].inputs) ++p.uses[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(in)])];
    }
    for (std::size_t o = 0; o < nops; ++o)
        if (p.site_of_op[o] >= 0) {
            const auto& s = b.attention[static_cast<std::size_t>(p.site_of_op[o])];
            for (auto t : {s.q, s.k, s.v}) ++p.uses[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)])];
        }

    p.has_weight.assign(nops, 0);
    p.weight_cast.assign(nops, Bytes(0));
    p.dequant.assign(nops, Bytes(0));
    p.tied_grad.assign(nops, Bytes(0));
    p.param_grads.assign(nops, {});
    p.lora.assign(nops, 0);
    p.lora_a.assign(nops, Bytes(0));
    p.lora_b.assign(nops, Bytes(0));
    p.lora_grads.assign(nops, {});
    for (std::size_t o = 0; o < nops; ++o) {
        const Op& op = b.ops[o];
        p.has_weight[o] = !op.params.empty() || (op.kind == OpKind::Linear && op.in_features > 0) || op.kind == OpKind::Embedding;
        std::int64_t elems = 0;
        for (auto pi : op.params) {
            const Param& prm = b.params[static_cast<std::size_t>(pi)];
            elems = checked_add(elems, prm.numel());
            if (job.train && !job.lora) {
                const std::int64_t per = rank_elements(prm, lay);
                const std::int64_t copies = (lay && prm.component == Component::Experts) ? (prm.count + lay->cfg.ep - 1) / lay->cfg.ep : prm.count;
                for (std::int64_t k = 0; k < copies; ++k) p.param_grads[o].push_back(dtype_bytes(job.tdt, per));
            }
        }
        if (op.params.empty() && op.kind == OpKind::Linear) {
            elems = checked_mul(op.in_features, op.out_features);
            // A tied head is split like the embedding it shares (vocab-parallel).
            p.tied_grad[o] = dtype_bytes(job.tdt, lay ? (elems + lay->cfg.tp - 1) / lay->cfg.tp : elems);
        }
        // bitsandbytes 4-bit layers dequantize their weight to the compute dtype
        // for every matmul (forward and backward), one layer at a time.
        if ((job.quant == Quant::NF4 || job.quant == Quant::Int4) && op.kind == OpKind::Linear)
            for (auto pi : op.params) {
                const Param& prm = b.params[static_cast<std::size_t>(pi)];
                if (prm.linear_weight && prm.module != "lm_head" && prm.shape.size() == 2)
                    p.dequant[o] = dtype_bytes(c.lowered, prm.shape[0] * prm.shape[1]);
            }
        if (!inference && c.autocast && !job.lora && job.wdt == DType::F32 && is_matmul(op.kind) && p.has_weight[o])
            p.weight_cast[o] = dtype_bytes(c.lowered, lay ? (elems + lay->cfg.tp - 1) / lay->cfg.tp : elems);
        if (job.lora && !inference && lora_applies(op, c.lora_targets)) {
            p.lora[o] = 1;
            const std::int64_t rows = b.tensors[static_cast<std::size_t>(op.inputs.front())].extent.elements(c.batch, c.seq) /
                                      std::max<std::int64_t>(1, op.in_features);
            p.lora_a[o] = dtype_bytes(c.lowered, checked_mul(rows, c.lora_rank));
            p.lora_b[o] = dtype_bytes(c.lowered, checked_mul(rows, op.out_features));
            const std::int64_t copies = op.params.empty() ? 1 : b.params[static_cast<std::size_t>(op.params.front())].count;
            for (std::int64_t k = 0; k < copies; ++k) {
                p.lora_grads[o].push_back(dtype_bytes(job.tdt, checked_mul(c.lora_rank, op.in_features)));
                p.lora_grads[o].push_back(dtype_bytes(job.tdt, checked_mul(c.lora_rank, op.out_features)));
            }
        }
    }
    p.checkpointed = !inference && c.recompute == Recompute::Full && b.checkpointable;
    return p;
}

// One execution of a block.
struct Instance {
    const BlockPlan* plan = nullptr;
    std::vector<std::int64_t> gid;                 // per local storage
    std::vector<char> rg;                          // per local tensor: requires grad
    std::vector<std::vector<std::int64_t>> saves;  // per op: references held for its backward
    std::vector<std::int64_t> extra;               // selective recompute: kept q, k, v
    std::int64_t input = 0;                        // the block input (caller's)
    std::int64_t checkpoint = 0;                   // full recompute: reference on the input
    bool input_rg = false;
};

class StepBuilder {
public:
    StepBuilder(const ModelGraph& g, const Job& job, const StepTraceOptions& opt, StepTrace& out)
        : g_(g), job_(job), opt_(opt), out_(out), em_(out.trace) {}

    void run();

private:
    Instance forward(const BlockPlan& p, std::int64_t input, bool input_rg, bool grad_mode, bool keep_saves);
    std::int64_t backward(Instance& in, std::int64_t out_grad);
    void param_grad(Bytes bytes, std::int32_t label);
    void workspace(bool autograd_thread);
    void setup();
    void optimizer_step(int step);
    void inference();

    const ModelGraph& g_;
    const Job& job_;
    const StepTraceOptions& opt_;
    StepTrace& out_;
    Emitter em_;
    std::vector<BlockPlan> plans_;
    std::vector<std::int64_t> grads_;        // parameter gradients by walk order
    std::size_t grad_key_ = 0;
    bool grads_exist_ = false;               // gradients kept from an earlier micro-batch / step
    // Python variables of the training loop: the batch lives until the next
    // batch is loaded, `loss` (and a custom loop's `out`) until the next
    // forward rebinds them.
    std::vector<std::int64_t> batch_refs_, prev_batch_refs_;
    std::vector<std::int64_t> forward_refs_;  // locals of the model's forward (logits)
    std::vector<std::pair<Bytes, std::int64_t>> tied_grads_;  // gradient of a weight shared with a later op
    std::vector<std::int64_t> result_refs_, prev_result_refs_;
    void release_previous_batch() {
        for (auto id : prev_batch_refs_) em_.unref(id);
        prev_batch_refs_.clear();
    }
    std::vector<std::int64_t> dropped_casts_;  // autocast weight copies freed when forward ends
    std::vector<std::int64_t> states_;
    bool ws_main_ = false, ws_autograd_ = false;
    std::int32_t param_grad_label_ = -1;
    // Distributed: one rank of one pipeline stage.
    bool dist_ = false;
    std::vector<std::pair<std::size_t, std::int64_t>> units_;  // (plan, instances) on this stage, in order
    struct RankParam {
        std::int64_t elems = 0;   // one tensor on this rank after tp / ep
        std::int64_t shard = 1;   // ranks its sharded states are split over
    };
    std::vector<RankParam> rank_params_;
    std::vector<Bytes> block_gather_;     // per plan: 16-bit parameters of one instance (tp-sharded)
    std::vector<Bytes> block_grad_;       // per plan: gradients of one instance before reduce-scatter
    bool gather_ = false, shard_grads_ = false, shard_opt_ = false;
    bool first_stage_ = true, last_stage_ = true;
    std::int64_t bucket_ = 0;
    void rank_setup();
    std::vector<Instance> forward_mb();
    void backward_mb(std::vector<Instance>& stack);
    std::map<std::string, std::pair<std::int64_t, bool>> shared_;  // key -> (tensor, requires grad)
    std::map<std::string, std::int64_t> shared_grad_;
};

void StepBuilder::workspace(bool autograd_thread) {
    if (!opt_.cublas_workspaces) return;
    bool& done = autograd_thread ? ws_autograd_ : ws_main_;
    if (done) return;
    done = true;
    // Never freed: the handle's workspace lives as long as the process.
    em_.alloc(opt_.cublas_workspace, em_.label(autograd_thread ? "cuBLAS workspace (autograd thread)" : "cuBLAS workspace (main thread)"));
}

Instance StepBuilder::forward(const BlockPlan& p, std::int64_t input, bool input_rg, bool grad_mode, bool keep_saves) {
    const Block& b = *p.blk;
    const ActivationContext& c = job_.actx;
    const bool selective = c.recompute == Recompute::Selective && c.attention != Attention::Flash;
    Instance in;
    in.plan = &p;
    in.input = input;
    in.input_rg = input_rg;
    // ZeRO-3 / FSDP: all-gather the layer's parameters before its forward.
    std::int64_t gathered = 0;
    if (gather_) {
        const auto pi = static_cast<std::size_t>(&p - plans_.data());
        gathered = em_.alloc(block_gather_[pi], em_.label(b.name + " (gathered parameters)"));
    }
    const std::size_t n = b.tensors.size();
    in.gid.assign(n, 0);
    in.rg.assign(n, 0);
    in.saves.assign(b.ops.size(), {});
    std::vector<std::int32_t> uses = p.uses;
    const auto st0 = static_cast<std::size_t>(p.storage[0]);
    const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(b.output)]);
    in.gid[st0] = input;
    in.rg[0] = input_rg ? 1 : 0;
    const std::string& provides = b.tensors[0].shared_key;
    if (!provides.empty() && grad_mode) {
        // This block's input is read by later blocks (T5's encoder output).
        em_.ref(input);
        shared_[provides] = {input, input_rg};
    }
    if (uses[st0] > 0) em_.ref(input);
    if (out_st == st0) em_.ref(input);  // handed on unchanged

    auto keep = [&](std::size_t o, std::int64_t id) {
        em_.ref(id);
        in.saves[o].push_back(id);
    };
    auto read_done = [&](TensorId t) {
        const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
        if (uses[st] > 0 && --uses[st] == 0) em_.unref(in.gid[st]);
    };

    for (std::size_t o = 0; o < b.ops.size(); ++o) {
        const Op& op = b.ops[o];
        if (p.skip[o]) {
            if (p.site_of_op[o] < 0) continue;
            // Fused SDPA/flash attention: output + fp32 logsumexp [b, heads, s];
            // backward needs 16-bit q, k, v, the output and the logsumexp.
            const AttentionSite& s = b.attention[static_cast<std::size_t>(p.site_of_op[o])];
            const auto ost = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.out)]);
            in.gid[ost] = em_.alloc(p.bytes[ost], p.label[ost]);
            if (ost == out_st) em_.ref(in.gid[ost]);
            const bool rg = grad_mode && in.rg[static_cast<std::size_t>(s.q)];
            in.rg[static_cast<std::size_t>(s.out)] = rg ? 1 : 0;
            workspace(false);
            if (rg && keep_saves) {
                for (auto t : {s.q, s.k, s.v}) {
                    const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
                    if (c.autocast && p.dt[st] != c.lowered)
                        in.saves[o].push_back(em_.alloc(dtype_bytes(c.lowered, b.tensors[st].extent.elements(c.batch, p.seq)), p.label[st]));
                    else
                        keep(o, in.gid[st]);
                }
                keep(o, in.gid[ost]);
                in.saves[o].push_back(em_.alloc(dtype_bytes(DType::F32, checked_mul(checked_mul(c.batch, s.heads), p.seq)),
                                                em_.label(b.name + ".attention.logsumexp")));
            }
            for (auto t : {s.q, s.k, s.v}) read_done(t);
            if (uses[ost] == 0) em_.unref(in.gid[ost]);
            continue;
        }
        bool any_in_rg = false;
        for (auto t : op.inputs) any_in_rg = any_in_rg || in.rg[static_cast<std::size_t>(t)];
        const bool base_tr = grad_mode && job_.train && !job_.lora && p.has_weight[o];
        const bool lora = grad_mode && p.lora[o];
        const bool any_grad = grad_mode && (any_in_rg || base_tr || lora);
        std::vector<std::size_t> unread;
        const std::int64_t dq = em_.alloc(p.dequant[o], p.label[static_cast<std::size_t>(op.outputs.empty() ? 0 : op.outputs.front())]);
        for (auto t : op.outputs) {
            const auto ti = static_cast<std::size_t>(t);
            in.rg[ti] = (any_grad && op.kind != OpKind::Input) ? 1 : 0;
            const auto st = static_cast<std::size_t>(p.storage[ti]);
            if (st != ti) continue;  // a view or same-dtype cast: no new storage
            if (op.kind == OpKind::Input && !b.tensors[ti].shared_key.empty()) {
                auto it = shared_.find(b.tensors[ti].shared_key);
                if (it != shared_.end()) {
                    // Not a new input: the tensor an earlier block provided.
                    in.gid[st] = it->second.first;
                    in.rg[ti] = it->second.second ? 1 : 0;
                    em_.ref(in.gid[st]);
                    if (uses[st] == 0) unread.push_back(st);
                    continue;
                }
            }
            in.gid[st] = em_.alloc(p.bytes[st], p.label[st]);
            if (st == out_st) em_.ref(in.gid[st]);
            if (uses[st] == 0) unread.push_back(st);
            if (op.kind == OpKind::Input && grad_mode) {
                // The training loop's `batch` variable holds the inputs until the
                // next batch replaces it.
                em_.ref(in.gid[st]);
                batch_refs_.push_back(in.gid[st]);
                release_previous_batch();
            }
        }
        em_.unref(dq);
        if (grad_mode && op.kind == OpKind::Linear && op.name.size() >= 7 && op.name.compare(op.name.size() - 7, 7, "lm_head") == 0 &&
            !op.outputs.empty()) {
            // `logits` is a local of the model's forward: alive through the loss,
            // dropped when forward returns (the Trainer keeps only the loss).
            const auto id = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.outputs.front())])];
            em_.ref(id);
            forward_refs_.push_back(id);
        }
        if (is_matmul(op.kind)) workspace(false);
        // Autocast caches a 16-bit copy of each fp32 weight for the forward; the
        // matmul keeps it for backward when its input needs a gradient.
        if (grad_mode && p.weight_cast[o] > Bytes(0)) {
            const auto w = em_.alloc(p.weight_cast[o], em_.label(b.name + "." + op.name + " (autocast weight copy)"));
            if (keep_saves && any_in_rg) in.saves[o].push_back(w);
            else dropped_casts_.push_back(w);
        }
        const bool record = any_grad && keep_saves && !(selective && (op.flags & kAttnCore));
        if (record)
            for (const SavedRef& s : op.saved) {
                if (s.only_for_param_grad && !base_tr) continue;
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.tensor)]);
                if (s.autocast_cast && c.autocast && p.dt[st] != c.lowered)
                    in.saves[o].push_back(em_.alloc(dtype_bytes(c.lowered, b.tensors[st].extent.elements(c.batch, p.seq)), p.label[st]));
                else
                    keep(o, in.gid[st]);
            }
        if (lora) {
            // lora_A(x) keeps x; lora_B keeps A's [rows, r] output; B's output is added in.
            if (keep_saves) keep(o, in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.inputs.front())])]);
            const auto a = em_.alloc(p.lora_a[o], em_.label(b.name + "." + op.name + ".lora_A"));
            if (keep_saves) in.saves[o].push_back(a);
            else em_.unref(a);
            em_.transient(p.lora_b[o], em_.label(b.name + "." + op.name + ".lora_B"));
        }
        if (op.kind == OpKind::Loss && grad_mode) {
            // `loss = loss_fn(out)`: a 4-byte fp32 scalar the loop keeps until the
            // next iteration rebinds it; a custom loop's `out = model(x)` likewise
            // (HF's Trainer drops the outputs and keeps the loss).
            result_refs_.push_back(em_.alloc(Bytes(4), em_.label("loss")));
            if (!g_.transformer && !op.inputs.empty()) {
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(op.inputs.front())]);
                em_.ref(in.gid[st]);
                result_refs_.push_back(in.gid[st]);
            }
        }
        for (auto st : unread) em_.unref(in.gid[st]);
        for (auto t : op.inputs) read_done(t);
    }
    if (gathered != 0) {
        if (job_.layout.cfg.fsdp == Fsdp::GradOp && grad_mode) in.extra.push_back(gathered);  // kept until backward
        else em_.unref(gathered);  // resharded after forward
    }
    if (selective && keep_saves)
        for (const auto& s : b.attention)
            if (in.rg[static_cast<std::size_t>(s.q)])
                for (auto t : {s.q, s.k, s.v}) {
                    const auto id = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)])];
                    em_.ref(id);
                    in.extra.push_back(id);
                }
    return in;
}

void StepBuilder::param_grad(Bytes bytes, std::int32_t label) {
    // Callers pass their block's activation-gradient label; parameter
    // gradients get their own so that reports can tell them apart.
    (void)label;
    if (param_grad_label_ < 0) param_grad_label_ = em_.label("parameter gradients");
    label = param_grad_label_;
    const std::size_t key = grad_key_++;
    if (grads_.size() <= key) grads_.resize(key + 1, 0);
    if (grads_[key] == 0) {
        if (job_.amp && job_.tdt == DType::F32) {
            // The matmul yields a 16-bit gradient; autocast's cast backward makes it fp32.
            const auto half = em_.alloc(Bytes(bytes.count() / 2), label);
            grads_[key] = em_.alloc(bytes, label);
            em_.unref(half);
        } else {
            grads_[key] = em_.alloc(bytes, label);
        }
    } else {
        // Accumulation: the new gradient is computed, added in place and freed.
        em_.transient(bytes, label);
    }
}

std::int64_t StepBuilder::backward(Instance& in, std::int64_t out_grad) {
    const BlockPlan& p = *in.plan;
    const Block& b = *p.blk;
    const ActivationContext& c = job_.actx;
    const bool selective = c.recompute == Recompute::Selective && c.attention != Attention::Flash;
    const std::size_t n = b.tensors.size();
    std::vector<std::int64_t> grad(n, 0);
    const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(b.output)]);
    const auto st0 = static_cast<std::size_t>(p.storage[0]);
    grad[out_st] = out_grad;
    bool recomputed_core = false;
    const std::int32_t glabel = em_.label(b.name + " (activation gradients)");
    const auto pi = static_cast<std::size_t>(in.plan - plans_.data());
    std::int64_t gathered = 0, full_grads = 0;
    if (gather_ && job_.layout.cfg.fsdp != Fsdp::GradOp) gathered = em_.alloc(block_gather_[pi], em_.label(b.name + " (gathered parameters)"));
    if (shard_grads_ && job_.train && !job_.lora) full_grads = em_.alloc(block_grad_[pi], glabel);

    auto grad_for = [&](TensorId t) {
        const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
        if (!in.rg[static_cast<std::size_t>(t)] && st != st0) return;
        if (st == st0 && !in.input_rg) return;
        const std::string& key = b.tensors[st].shared_key;
        if (st != st0 && !key.empty()) {
            // Gradients of a shared tensor accumulate across the blocks that read it.
            if (shared_grad_[key] == 0) shared_grad_[key] = em_.alloc(p.bytes[st], glabel);
            return;
        }
        if (grad[st] == 0) grad[st] = em_.alloc(p.bytes[static_cast<std::size_t>(t)], glabel);
    };

    for (std::size_t o = b.ops.size(); o-- > 0;) {
        const Op& op = b.ops[o];
        if (p.skip[o] && p.site_of_op[o] < 0) continue;
        if (p.skip[o]) {
            const AttentionSite& s = b.attention[static_cast<std::size_t>(p.site_of_op[o])];
            const auto ost = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.out)]);
            if (grad[ost] != 0) {
                // Flash backward: fp32 dq accumulator, then dq, dk, dv.
                em_.transient(dtype_bytes(DType::F32, b.tensors[static_cast<std::size_t>(s.q)].extent.elements(c.batch, p.seq)), glabel);
                for (auto t : {s.q, s.k, s.v}) grad_for(t);
                em_.unref(grad[ost]);
                grad[ost] = 0;
            }
            for (auto id : in.saves[o]) em_.unref(id);
            in.saves[o].clear();
            continue;
        }
        if (selective && (op.flags & kAttnCore) && !recomputed_core) {
            // Selective recompute: rebuild the attention core's saved tensors.
            recomputed_core = true;
            for (std::size_t o2 = 0; o2 < b.ops.size(); ++o2) {
                if (!(b.ops[o2].flags & kAttnCore)) continue;
                for (const SavedRef& s : b.ops[o2].saved) {
                    const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(s.tensor)]);
                    const bool produced_in_core = std::any_of(b.ops.begin(), b.ops.end(), [&](const Op& x) {
                        return (x.flags & kAttnCore) &&
                               std::find(x.outputs.begin(), x.outputs.end(), static_cast<TensorId>(st)) != x.outputs.end();
                    });
                    if (produced_in_core) in.saves[o2].push_back(em_.alloc(p.bytes[st], p.label[st]));
                    else {
                        em_.ref(in.gid[st]);
                        in.saves[o2].push_back(in.gid[st]);
                    }
                }
            }
        }
        bool has_out_grad = false;
        for (auto t : op.outputs) has_out_grad = has_out_grad || grad[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)])] != 0;
        const bool root = op.kind == OpKind::Loss;
        if (has_out_grad || root) {
            const bool base_tr = job_.train && !job_.lora && p.has_weight[o];
            const std::int64_t dq = em_.alloc(p.dequant[o], glabel);
            for (auto t : op.inputs) {
                const auto ti = static_cast<std::size_t>(t);
                if (p.dt[ti] == DType::I64 || p.dt[ti] == DType::Bool) continue;
                grad_for(t);
            }
            em_.unref(dq);
            if (is_matmul(op.kind)) workspace(true);
            if (base_tr && op.params.empty() && op.kind == OpKind::Linear) {
                // A tied weight (lm_head sharing the embedding): its gradient waits
                // for the owner's contribution.
                tied_grads_.emplace_back(p.tied_grad[o], em_.alloc(p.tied_grad[o], glabel));
            }
            if (base_tr && !shard_grads_)
                for (const Bytes& pg : p.param_grads[o]) {
                    auto tied = std::find_if(tied_grads_.begin(), tied_grads_.end(), [&](const auto& t) { return t.first == pg; });
                    if (tied != tied_grads_.end()) {
                        // AccumulateGrad adds the second contribution out of place.
                        const auto contrib = em_.alloc(pg, glabel);
                        param_grad(pg, glabel);
                        em_.unref(contrib);
                        em_.unref(tied->second);
                        tied_grads_.erase(tied);
                    } else {
                        param_grad(pg, glabel);
                    }
                }
            if (p.lora[o]) {
                em_.transient(p.lora_a[o], glabel);
                for (const Bytes& lg : p.lora_grads[o]) param_grad(lg, glabel);
            }
            // Gradients of this op's outputs are complete and consumed.
            for (auto t : op.outputs) {
                const auto st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(t)]);
                bool also_input = false;
                for (auto i2 : op.inputs) also_input = also_input || static_cast<std::size_t>(p.storage[static_cast<std::size_t>(i2)]) == st;
                if (also_input || grad[st] == 0) continue;
                em_.unref(grad[st]);
                grad[st] = 0;
            }
        }
        for (auto id : in.saves[o]) em_.unref(id);
        in.saves[o].clear();
    }
    for (auto id : in.extra) em_.unref(id);
    in.extra.clear();
    if (full_grads != 0) {
        // Reduce-scatter: each rank keeps its shard of the layer's gradients.
        param_grad(block_grad_[pi].ceil_div(job_.layout.shard), glabel);
        em_.unref(full_grads);
    }
    em_.unref(gathered);
    std::int64_t input_grad = grad[st0];
    const std::string& provides = b.tensors[0].shared_key;
    if (!provides.empty()) {
        // The provider hands the accumulated gradient of its readers upstream.
        auto it = shared_grad_.find(provides);
        if (it != shared_grad_.end() && it->second != 0) {
            em_.unref(input_grad);
            input_grad = it->second;
            it->second = 0;
        }
        auto sh = shared_.find(provides);
        if (sh != shared_.end()) {
            em_.unref(sh->second.first);
            shared_.erase(sh);
        }
    }
    for (std::size_t i = 0; i < n; ++i)
        if (i != st0 && grad[i] != 0) em_.unref(grad[i]);
    return input_grad;
}

void StepBuilder::setup() {
    em_.phase = Phase::Setup;
    for (const auto& b : g_.blocks)
        for (const auto& prm : b.params) {
            Param one = prm;
            one.count = 1;
            const Bytes w = quantized_bytes(job_.quant, one, job_.wdt);
            const std::int32_t label = em_.label(b.name + "." + prm.name + " (weight)");
            for (std::int64_t k = 0; k < checked_mul(prm.count, b.repeat); ++k) em_.alloc(w, label);
        }
    const std::int32_t alabel = em_.label("LoRA adapters");
    const std::int32_t mlabel = em_.label("fp32 master weights");
    for (const auto& t : job_.trainable) {
        std::int64_t per = 1;
        for (auto d : t.shape) per = checked_mul(per, d);
        for (std::int64_t k = 0; k < t.count; ++k) {
            if (job_.lora) em_.alloc(dtype_bytes(job_.tdt, per), alabel);
            if (job_.master > Bytes(0)) em_.alloc(dtype_bytes(DType::F32, per), mlabel);
        }
    }
    em_.mark();
}

void StepBuilder::rank_setup() {
    // Weights of this rank: its stage's layers, tp/ep slices, dp shards when the
    // parameters are sharded (ZeRO-3 / FSDP), nothing when offloaded.
    em_.phase = Phase::Setup;
    const Layout& lay = job_.layout;
    const bool offload_params = lay.cfg.offload_params != Offload::None;
    const bool offload_opt = lay.cfg.offload_optimizer != Offload::None;
    block_gather_.assign(plans_.size(), Bytes(0));
    block_grad_.assign(plans_.size(), Bytes(0));
    for (const auto& [pi, n] : units_) {
        const Block& b = *plans_[pi].blk;
        std::int64_t block_elems = 0;
        for (const auto& prm : b.params) {
            const std::int64_t e = rank_elements(prm, &lay);
            const std::int64_t copies = prm.component == Component::Experts ? (prm.count + lay.cfg.ep - 1) / lay.cfg.ep : prm.count;
            const std::int64_t shard = prm.component == Component::Experts ? lay.expert_shard : lay.shard;
            block_elems = checked_add(block_elems, checked_mul(e, copies));
            const std::int64_t stored = gather_ ? (e + shard - 1) / shard : e;
            Param one = prm;
            one.count = 1;
            const Bytes w = job_.quant != Quant::None ? quantized_bytes(job_.quant, one, job_.wdt).ceil_div(prm.numel() / prm.count / std::max<std::int64_t>(1, stored))
                                                       : dtype_bytes(job_.wdt, stored);
            const std::int32_t label = em_.label(b.name + "." + prm.name + " (weight)");
            for (std::int64_t k = 0; k < checked_mul(copies, n); ++k) {
                if (!offload_params) em_.alloc(w, label);
                rank_params_.push_back({e, shard});
                if (job_.master > Bytes(0) && !offload_opt)
                    em_.alloc(dtype_bytes(DType::F32, shard_opt_ ? (e + shard - 1) / shard : e), em_.label("fp32 master weights"));
            }
        }
        block_gather_[pi] = dtype_bytes(job_.half, block_elems);
        block_grad_[pi] = dtype_bytes(job_.tdt, block_elems);
    }
    em_.mark();
}

std::vector<Instance> StepBuilder::forward_mb() {
    em_.phase = Phase::Forward;
    prev_batch_refs_ = std::move(batch_refs_);
    batch_refs_.clear();
    prev_result_refs_ = std::move(result_refs_);
    result_refs_.clear();
    std::vector<Instance> stack;
    std::int64_t x = 0;
    bool rg = false;
    if (!first_stage_ && g_.transformer) {
        // Activations received from the previous stage.
        const Bytes in = Bytes(static_cast<std::int64_t>(static_cast<double>(dtype_bytes(job_.actx.stream, checked_mul(checked_mul(job_.req.batch, plans_.front().seq), g_.transformer->hidden)).count()) *
                                                         (job_.layout.cfg.sp ? 1.0 / static_cast<double>(job_.layout.cfg.tp) : 1.0)));
        x = em_.alloc(in, em_.label("pipeline receive buffer"));
        rg = true;
    }
    for (const auto& [pi, n] : units_) {
        const BlockPlan& p = plans_[pi];
        for (std::int64_t r = 0; r < n; ++r) {
            if (p.blk->name == "head") em_.phase = Phase::Loss;
            Instance in = forward(p, x, rg, true, !p.checkpointed);
            const auto out_st = static_cast<std::size_t>(p.storage[static_cast<std::size_t>(p.blk->output)]);
            if (p.checkpointed) in.checkpoint = x;  // keep our reference on the layer input
            else em_.unref(x);
            x = in.gid[out_st];
            rg = in.rg[static_cast<std::size_t>(p.blk->output)] != 0;
            stack.push_back(std::move(in));
        }
    }
    em_.unref(x);  // the loss scalar / the output sent to the next stage (deallocated after the send)
    for (auto id : dropped_casts_) em_.unref(id);
    dropped_casts_.clear();
    for (auto id : forward_refs_) em_.unref(id);
    forward_refs_.clear();
    release_previous_batch();
    for (auto id : prev_result_refs_) em_.unref(id);
    prev_result_refs_.clear();
    em_.mark();
    out_.steps.back().after_forward = em_.live();
    return stack;
}

void StepBuilder::backward_mb(std::vector<Instance>& stack) {
    em_.phase = Phase::Backward;
    grad_key_ = 0;
    std::int64_t g = 0;
    if (!last_stage_ && !stack.empty()) {
        // The gradient of this stage's output, received from the next stage.
        const Instance& top = stack.back();
        const auto out_st = static_cast<std::size_t>(top.plan->storage[static_cast<std::size_t>(top.plan->blk->output)]);
        g = em_.alloc(top.plan->bytes[out_st], em_.label("pipeline receive buffer (gradient)"));
    }
    if (bucket_ == 0 && job_.layout.dp > 1 && job_.train && !job_.lora) {
        // Persistent communication buckets: torch DDP copies gradients into flat
        // buckets (gradient_as_bucket_view=False); DeepSpeed ZeRO keeps one
        // reduce bucket (contiguous_gradients) of reduce_bucket_size elements.
        const ParallelConfig& c = job_.layout.cfg;
        std::int64_t elems = 0;
        for (const auto& rp : rank_params_) elems = checked_add(elems, rp.elems);
        Bytes b;
        if (c.zero == 0 && c.fsdp == Fsdp::None && !c.distributed_optimizer) b = dtype_bytes(job_.tdt, elems);
        else if (c.zero >= 1) b = dtype_bytes(job_.half, std::min(c.zero_bucket_elements, elems));
        bucket_ = em_.alloc(b, em_.label("gradient buckets"));
    }
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
        Instance& in = *it;
        if (in.plan->checkpointed) {
            // Re-run the layer's forward from the kept input, then its backward.
            Instance re = forward(*in.plan, in.checkpoint, in.input_rg, true, true);
            const auto out_st = static_cast<std::size_t>(in.plan->storage[static_cast<std::size_t>(in.plan->blk->output)]);
            em_.unref(re.gid[out_st]);  // the recomputed output itself is not needed
            em_.unref(in.checkpoint);
            g = backward(re, g);
            // Weight copies autocast made during the recompute and nobody saved.
            for (auto id : dropped_casts_) em_.unref(id);
            dropped_casts_.clear();
        } else {
            g = backward(in, g);
        }
    }
    em_.unref(g);  // the input gradient (sent to the previous stage)
    em_.mark();
    out_.steps.back().after_backward = em_.live();
}

void StepBuilder::optimizer_step(int step) {
    em_.phase = Phase::Optimizer;
    const Optimizer o = job_.req.optimizer;
    const OptimizerImpl impl = job_.req.optimizer_impl;
    const DType sd = job_.state_dt;
    const std::int32_t slabel = em_.label(std::string("optimizer state (") + to_string(o) + ")");
    const std::int32_t tlabel = em_.label(std::string("optimizer temporary (") + to_string(impl) + ")");
    std::vector<std::int64_t> per;
    if (dist_ && !job_.lora) {
        // This rank's slice of every tensor (its dp shard when states are sharded);
        // offloaded states live and update on the CPU.
        if (job_.layout.cfg.offload_optimizer == Offload::None)
            for (const auto& rp : rank_params_) per.push_back(shard_opt_ ? (rp.elems + rp.shard - 1) / rp.shard : rp.elems);
        if (step == 0)
            for (auto e : per) states_.push_back(em_.alloc(optimizer_bytes(o, TrainTensor{{e}, 1}, sd), slabel));
    } else {
        for (const auto& t : job_.trainable) {
            std::int64_t e = 1;
            for (auto d : t.shape) e = checked_mul(e, d);
            for (std::int64_t k = 0; k < t.count; ++k) per.push_back(e);
        }
        // States are created lazily on the first step (torch.optim _init_group).
        if (step == 0)
            for (std::size_t ti = 0; ti < job_.trainable.size(); ++ti)
                for (std::int64_t k = 0; k < job_.trainable[ti].count; ++k)
                    states_.push_back(em_.alloc(optimizer_bytes(o, TrainTensor{job_.trainable[ti].shape, 1}, sd), slabel));
    }
    // fp16 with fp32 master weights: gradients are copied to fp32 for the update.
    std::vector<std::int64_t> master_grads;
    if (job_.master > Bytes(0))
        for (auto e : per) master_grads.push_back(em_.alloc(dtype_bytes(DType::F32, e), tlabel));
    const bool adam_like = o == Optimizer::Adam || o == Optimizer::AdamW || o == Optimizer::Lion;
    if (adam_like && impl == OptimizerImpl::Foreach) {
        // _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), one list.
        std::vector<std::int64_t> tmp;
        for (auto e : per) tmp.push_back(em_.alloc(dtype_bytes(sd, e), tlabel));
        for (auto id : tmp) em_.unref(id);
    } else if (adam_like && impl == OptimizerImpl::ForLoop) {
        // _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps):
        // the sqrt and the quotient coexist, and the previous parameter's `denom`
        // stays bound until the new one is assigned (measured by oracle/step_oracle.py).
        std::int64_t denom = 0;
        for (auto e : per) {
            const auto a = em_.alloc(dtype_bytes(sd, e), tlabel);
            const auto b = em_.alloc(dtype_bytes(sd, e), tlabel);
            em_.unref(a);
            em_.unref(denom);
            denom = b;
        }
        em_.unref(denom);
    } else if (o == Optimizer::Adafactor) {
        // transformers Adafactor: update = grad**2 + eps, then the scaled update.
        for (auto e : per) {
            const auto a = em_.alloc(dtype_bytes(DType::F32, e), tlabel);
            const auto b = em_.alloc(dtype_bytes(DType::F32, e), tlabel);
            em_.unref(a);
            em_.unref(b);
        }
    }
    for (auto id : master_grads) em_.unref(id);
    em_.mark();
    out_.steps.back().after_optimizer = em_.live();

    em_.phase = Phase::ZeroGrad;
    if (job_.req.zero_grad == ZeroGrad::SetToNone) {
        for (auto& id : grads_) {
            em_.unref(id);
            id = 0;
        }
    }
    em_.mark();
    out_.steps.back().after_zero_grad = em_.live();
}

void StepBuilder::inference() {
    const std::int64_t prompt = job_.seq;
    const TransformerDims* td = g_.transformer ? &*g_.transformer : nullptr;
    // Prefill: the prompt through every layer without autograd; the head on the
    // last position only (generate's logits_to_keep=1).
    std::vector<BlockPlan> head_plans;
    for (std::size_t i = 0; i < g_.blocks.size(); ++i) {
        const bool head = i + 1 == g_.blocks.size() && td;
        plans_.push_back(plan_block(g_.blocks[i], job_, head ? 1 : prompt, true, em_));
    }
    const std::int64_t layers = td ? std::max<std::int64_t>(1, td->layers) : 1;
    const std::int64_t per_layer_token = td ? td->kv_elements_per_token / layers : 0;
    const DType kvdt = job_.req.kv_dtype.value_or(job_.lowered);
    const std::int32_t kvlabel = em_.label("KV cache");
    std::vector<std::int64_t> cache;  // k and v per layer
    auto run_forward = [&](const std::vector<BlockPlan>& plans, std::int64_t len, bool grow) {
        std::int64_t x = 0;
        std::size_t layer = 0;
        for (const auto& p : plans)
            for (std::int64_t r = 0; r < p.blk->repeat; ++r) {
                Instance in = forward(p, x, false, false, false);
                em_.unref(x);
                x = in.gid[static_cast<std::size_t>(p.storage[static_cast<std::size_t>(p.blk->output)])];
                if (p.blk->checkpointable && per_layer_token > 0) {
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
        for (const auto& b : g_.blocks) decode_plans.push_back(plan_block(b, job_, 1, true, em_));
        // Every decode step re-allocates each layer's cache one token longer.
        // Long generations simulate the first steps and the last one in full.
        const std::int64_t full = std::min<std::int64_t>(gen, opt_.max_decode_steps);
        for (std::int64_t t = 1; t <= gen; ++t) {
            if (t > full && t != gen) continue;
            run_forward(decode_plans, prompt + t, true);
        }
        if (gen > full) out_.notes.push_back("decode: simulated steps 1-" + std::to_string(full) + " and step " + std::to_string(gen));
        em_.mark();
    }
}

void StepBuilder::run() {
    out_.steps.clear();
    if (!job_.train) {
        setup();
        inference();
        return;
    }
    const ParallelResult* par = opt_.parallel;
    dist_ = par != nullptr;
    const Layout& lay = job_.layout;
    const std::int64_t seq = dist_ ? std::max<std::int64_t>(1, job_.seq / lay.cfg.cp) : job_.seq;
    plans_.reserve(g_.blocks.size());
    for (std::size_t i = 0; i < g_.blocks.size(); ++i)
        plans_.push_back(plan_block(g_.blocks[i], job_, seq, false, em_, dist_ ? par->activation_scale[i] : 1.0, dist_ ? &lay : nullptr));
    std::int64_t pp = 1;
    if (dist_) {
        pp = lay.cfg.pp;
        gather_ = lay.cfg.zero == 3 || lay.cfg.fsdp != Fsdp::None;
        shard_grads_ = lay.dp > 1 && (lay.cfg.zero >= 2 || lay.cfg.fsdp != Fsdp::None);
        shard_opt_ = lay.cfg.zero >= 1 || lay.cfg.fsdp != Fsdp::None || lay.cfg.distributed_optimizer;
        first_stage_ = opt_.stage == 0;
        last_stage_ = opt_.stage == pp - 1;
        for (std::size_t i = 0; i < g_.blocks.size(); ++i) {
            std::int64_t n = 0;
            for (auto s : par->instance_stage[i]) n += s == opt_.stage ? 1 : 0;
            if (n > 0) units_.emplace_back(i, n);
        }
        rank_setup();
    } else {
        for (std::size_t i = 0; i < g_.blocks.size(); ++i) units_.emplace_back(i, g_.blocks[i].repeat);
        setup();
    }
    const Bytes after_setup = em_.live();
    const std::int64_t m = job_.req.grad_accum;
    // 1F1B: stage s runs min(pp - s - 1, m) warm-up forwards, then alternates one
    // forward and one backward, then drains the remaining backwards.
    const std::int64_t warm = pp > 1 ? std::min(pp - opt_.stage - 1, m) : 0;
    for (int s = 0; s < opt_.steps; ++s) {
        em_.step = s;
        out_.steps.push_back({});
        out_.steps.back().after_setup = after_setup;
        std::deque<std::vector<Instance>> inflight;
        for (std::int64_t i = 0; i < warm; ++i) inflight.push_back(forward_mb());
        for (std::int64_t i = warm; i < m; ++i) {
            inflight.push_back(forward_mb());
            backward_mb(inflight.front());
            inflight.pop_front();
        }
        while (!inflight.empty()) {
            backward_mb(inflight.front());
            inflight.pop_front();
        }
        optimizer_step(s);
    }
}

}  // namespace

StepTrace build_step_trace(const ModelGraph& g, const Job& job, const StepTraceOptions& opt) {
    StepTrace out;
    StepBuilder(g, job, opt, out).run();
    return out;
}

}  // namespace gpumem::sim
