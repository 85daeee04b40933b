// src/sim/step_internal.hpp — the builder of a step's event trace, shared by
// the files that write its parts: step_train.cpp (forward and backward, block
// by block), step_optimizer.cpp (optimizer step, zero_grad), step_inference.cpp
// (prefill and decode) and step_pipeline.cpp (a rank's setup and its pipeline
// schedule). Private to src/sim.
#pragma once

#include <cstdint>
#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpumem/core/budget.hpp"
#include "gpumem/memory/activations.hpp"
#include "gpumem/sim/step.hpp"

namespace gpumem::sim::detail {

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
    // The allocator stream of new allocations: 0, or kGraphPoolStream while a
    // CUDA graph's region runs (its allocations come from the graph's pool).
    int stream = 0;

    std::int64_t alloc(Bytes size, std::int32_t label) {
        check_budget();  // every loop of the step builder allocates: a request can be cancelled
        if (size <= Bytes(0)) return 0;
        const auto id = static_cast<std::int64_t>(sizes_.size());
        sizes_.push_back(size);
        refs_.push_back(1);
        push({TraceEvent::Kind::Alloc, phase, stream, id, size, label, step});
        live_ += size;
        if (track_) mark_live(id);
        return id;
    }
    // A reference on a tensor already freed (selective recompute re-saving an
    // input the forward let go) holds nothing: it must not free it twice
    // (a second Free event, and live bytes counted down twice).
    void ref(std::int64_t id) {
        if (id > 0 && refs_[static_cast<std::size_t>(id)] > 0) ++refs_[static_cast<std::size_t>(id)];
    }
    void unref(std::int64_t id) {
        if (id <= 0) return;
        auto& r = refs_[static_cast<std::size_t>(id)];
        if (r <= 0) return;
        if (--r == 0) {
            const Bytes s = sizes_[static_cast<std::size_t>(id)];
            push({TraceEvent::Kind::Free, phase, 0, id, s, -1, step});
            live_ -= s;
            if (track_) mark_dead(id);
        }
    }
    void transient(Bytes size, std::int32_t label) { unref(alloc(size, label)); }
    void mark() { push({TraceEvent::Kind::PhaseMark, phase, 0, 0, Bytes(0), -1, step}); }
    // torch.cuda.empty_cache(): cached blocks of the general pool go back to the driver.
    void empty_cache() { push({TraceEvent::Kind::EmptyCache, phase, 0, 0, Bytes(0), -1, step}); }
    [[nodiscard]] Bytes live() const { return live_; }
    [[nodiscard]] std::int64_t next_id() const { return static_cast<std::int64_t>(sizes_.size()); }
    // Steady-state detection: the references the program holds on each live
    // tensor (named as StateProbe names them), which decide when it is freed.
    void track_live() {
        track_ = true;
        for (std::size_t i = 1; i < refs_.size(); ++i)
            if (refs_[i] > 0) mark_live(static_cast<std::int64_t>(i));
    }
    // (name, references) of each live tensor, ascending by name: the tensors
    // made since `base_id` (names id - next_id, negative) in id order, then
    // the older ones (names id). The live ids are a bitmap read in id order
    // (an ordered set's inserts and erases, every event while detection
    // runs, were a twentieth of a one-GPU grad-accum 256 simulation).
    void append_refs(std::vector<std::int64_t>& out, std::int64_t base_id) const {
        const std::int64_t next = next_id();
        out.push_back(live_count_);
        auto emit = [&](std::int64_t from, std::int64_t to, std::int64_t shift) {
            for (std::int64_t w = from >> 6; w < static_cast<std::int64_t>(live_bits_.size()) && (w << 6) < to; ++w) {
                std::uint64_t bits = live_bits_[static_cast<std::size_t>(w)];
                while (bits != 0) {
                    const std::int64_t id = (w << 6) + std::countr_zero(bits);
                    bits &= bits - 1;
                    if (id < from || id >= to) continue;
                    out.push_back(id - shift);
                    out.push_back(refs_[static_cast<std::size_t>(id)]);
                }
            }
        };
        emit(base_id, next, next);
        emit(0, base_id, 0);
    }
    // One entry of the trace's labels per distinct text: a label is built per
    // micro-batch and layer (a 405B interleaved pipeline rank named 34,890
    // tensors with 83 texts; building and keeping every copy was about a
    // tenth of its trace building). Readers map an index to its text only
    // (replay's bytes by label, top tensors), so sharing one changes no answer.
    std::int32_t label(std::string s) {
        const auto [it, added] = label_index_.try_emplace(std::move(s), 0);
        if (added) it->second = t_.add_label(it->first);
        return it->second;
    }

private:
    void push(const TraceEvent& e) {
        if (t_.events.size() >= static_cast<std::size_t>(kMaxTraceEvents)) throw TraceTooLarge(kMaxTraceEvents);
        t_.events.push_back(e);
    }
    Trace& t_;
    std::vector<Bytes> sizes_;
    std::vector<std::int32_t> refs_;
    Bytes live_;
    bool track_ = false;
    std::vector<std::uint64_t> live_bits_;  // bit id: tensor id is live (while tracking)
    std::int64_t live_count_ = 0;
    void mark_live(std::int64_t id) {
        const auto w = static_cast<std::size_t>(id >> 6);
        if (w >= live_bits_.size()) live_bits_.resize(std::max(w + 1, 2 * live_bits_.size()), 0);
        const std::uint64_t bit = std::uint64_t{1} << (id & 63);
        if ((live_bits_[w] & bit) == 0) ++live_count_;
        live_bits_[w] |= bit;
    }
    void mark_dead(std::int64_t id) {
        const auto w = static_cast<std::size_t>(id >> 6);
        if (w >= live_bits_.size()) return;
        const std::uint64_t bit = std::uint64_t{1} << (id & 63);
        if ((live_bits_[w] & bit) != 0) --live_count_;
        live_bits_[w] &= ~bit;
    }
    std::unordered_map<std::string, std::int32_t> label_index_;
};

// Facts of one block resolved for the job and a sequence length.
struct BlockPlan {
    const Block* blk = nullptr;
    std::int64_t seq = 1;
    std::vector<DType> dt;
    std::vector<Bytes> bytes;
    std::vector<char> split;          // per tensor: split over tp (tp_split_flags)
    std::vector<char> sac_kept;       // per op: op-level selective checkpointing keeps its output (sac_kept_ops)
    std::vector<TensorId> storage;
    std::vector<std::int32_t> uses;   // forward reads per storage
    std::vector<char> skip;           // op folded into a fused attention op (flash)
    std::vector<int> site_of_op;      // op producing an attention site's output -> site index
    std::vector<std::int32_t> label;  // per tensor
    std::vector<char> has_weight;     // per op
    std::vector<Bytes> weight_cast;   // per op: autocast 16-bit copy of its weights
    std::vector<char> weight_cast_uncached;  // per op: a frozen weight's per-call cast (not in autocast's cache)
    std::vector<std::int32_t> weight_cast_label;  // per op with a weight_cast: its label
    std::vector<Bytes> dequant;       // per op: 4-bit weight dequantized for the matmul
    std::vector<Bytes> tied_grad;     // per op reading a weight owned elsewhere: its gradient on this rank
    std::vector<std::vector<Bytes>> param_grads;  // per op: one entry per trainable param tensor
    std::vector<std::vector<std::int32_t>> param_index;  // per op: the block's param index of each param_grads entry
    std::vector<char> lora;
    std::vector<std::int64_t> lora_share;  // per op: the fused-QKV adapter whose input it shares (-1: none)
    std::vector<AdapterInput> lora_in;  // per op: the adapter's cast / dropped copy of x and dropout mask
    std::vector<char> quant_saves;      // per op: a frozen quantized linear keeping its input (bitsandbytes)
    std::vector<Bytes> lora_a, lora_b;
    std::vector<std::vector<Bytes>> lora_grads;
    // per op: Transformer Engine's cached FP8 weight workspace and delayed-scaling
    // state of its weights on this rank (memory/fp8.hpp), made by its first forward
    std::vector<std::vector<Bytes>> fp8_copies, fp8_state;
    // A per-chunk loss (Op::chunks) in this block: its chunk count, the output
    // head's op, and one chunk's gradients in flight (model/rewrite.hpp
    // loss_chunk_transient); loss_chunks 1 otherwise.
    std::int64_t loss_chunks = 1;
    std::size_t head_op = 0;
    Bytes loss_chunk_grad;
    bool checkpointed = false;
};

// Resolves a block for the job, `seq` tokens and this rank (step_train.cpp).
BlockPlan plan_block(const Block& b, const Job& job, std::int64_t seq, bool inference, Emitter& em, const Layout& lay);

// One execution of a block.
// One block instance of a rank's step: (model chunk, plan, instance in the chunk).
using InstanceKey = std::tuple<std::int64_t, std::size_t, std::int64_t>;

struct Instance {
    const BlockPlan* plan = nullptr;
    std::vector<std::int64_t> gid;                 // per local storage
    std::vector<char> rg;                          // per local tensor: requires grad
    std::vector<std::vector<std::int64_t>> saves;  // per op: references held for its backward
    std::vector<std::int64_t> lora_input;          // per op: its adapter's saved input (dropped / cast copy), for shared fused-QKV adapters
    std::vector<std::int64_t> extra;               // selective recompute: kept q, k, v; SHARD_GRAD_OP: gathered parameters
    std::int64_t input = 0;                        // the block input (caller's)
    std::int64_t checkpoint = 0;                   // full recompute: reference on the input
    bool checkpointed = false;                     // this instance is checkpointed (--recompute-every)
    // Megatron uniform chunks (--recompute-num-layers N): the chunk's size and
    // this instance's place in it (0: the chunk's first, which keeps the input);
    // the whole chunk is rebuilt when backward reaches its last instance.
    std::int64_t group = 0, group_pos = 0;
    Bytes offloaded;                               // --activation-offload: its input, back from CPU for the recompute
    bool input_rg = false;
    // FSDP1 SHARD_GRAD_OP under no_sync: the key of the unit's parameters
    // held across micro-batches (StepBuilder::unsharded_).
    std::optional<InstanceKey> held_key;
};

// Instances whose backward (or inference forward) is done, kept for the next
// forward: their per-tensor and per-op vectors keep their storage (an
// instance's small vectors were 2,300 of an 8B simulation's 7,343 heap
// allocations; the first step's, made while all its layers are in flight,
// remain). take() hands back a fresh instance (every field at its default)
// holding a spare's vectors, emptied or stale: forward() sizes and fills
// each of them before reading it.
class InstancePool {
public:
    Instance take() {
        Instance in;
        if (spare_.empty()) return in;
        Instance& s = spare_.back();
        in.gid = std::move(s.gid);
        in.rg = std::move(s.rg);
        in.saves = std::move(s.saves);
        in.lora_input = std::move(s.lora_input);
        in.extra = std::move(s.extra);
        in.extra.clear();
        spare_.pop_back();
        return in;
    }
    void give(Instance&& in) { spare_.push_back(std::move(in)); }
    void give(std::vector<Instance>& v) {
        for (auto& in : v) spare_.push_back(std::move(in));
        v.clear();
    }

private:
    std::vector<Instance> spare_;
};

// One rank of the job (the only one on a single GPU): its blocks, chunk by
// chunk, in its pipeline schedule's order.
class StepBuilder {
public:
    StepBuilder(const ModelGraph& g, const Job& job, const StepTraceOptions& opt, StepTrace& out)
        : g_(g), job_(job), opt_(opt), out_(out), em_(out.trace) {}

    void run();
    // Thrown by run() when steady-state detection finds no period in its window.
    struct NoSteadyState {};
    // Whether run() simulated a schedule whole where detection could have
    // cut it (StepTraceOptions::detect_always).
    [[nodiscard]] bool skipped_detection() const { return skipped_detection_; }

private:
    Instance forward(const BlockPlan& p, std::int64_t input, bool input_rg, bool grad_mode, bool keep_saves, Bytes next_gather);
    std::int64_t backward(Instance& in, std::int64_t out_grad, Bytes next_gather);
    // A parameter gradient made (or accumulated); with the optimizer in
    // backward the tensors of `step` (their optimizer-state shapes) are updated
    // in its hook and the gradient freed (features.hpp).
    void param_grad(Bytes bytes, std::int32_t label, const std::vector<std::vector<std::int64_t>>& step = {});
    void step_in_backward(const std::vector<std::int64_t>& state_shape);
    [[nodiscard]] std::vector<std::int64_t> param_state_shape(std::size_t block, std::int32_t param) const;
    std::int64_t gather(std::size_t plan, Bytes next);
    void workspace(bool autograd_thread);
    void rank_setup();
    void optimizer_step(int step);
    void inference();
    std::vector<Instance> forward_chunk(std::int64_t chunk);
    // The allocator stream of a block's forward and backward: the CUDA graph
    // pool's while the block runs as (or inside) a graph (--cuda-graphs), else 0.
    [[nodiscard]] int graph_stream(const BlockPlan& p) const;
    void backward_chunk(std::int64_t chunk, std::vector<Instance>& stack);

    const ModelGraph& g_;
    const Job& job_;
    const StepTraceOptions& opt_;
    StepTrace& out_;
    Emitter em_;
    std::vector<BlockPlan> plans_;
    std::map<std::pair<std::int64_t, std::size_t>, std::int64_t> grads_;  // parameter gradients by (chunk, walk order)
    std::size_t grad_key_ = 0;
    std::int64_t chunk_ = 0;                 // the model chunk running
    std::vector<std::vector<std::int64_t>> chunk_batch_, chunk_result_;  // per chunk: the loop's batch / loss variables
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
    InstancePool instances_;
    std::vector<std::int32_t> uses_;  // forward's countdown of each storage's reads (forward does not nest)
    bool ws_main_ = false, ws_autograd_ = false;
    bool skipped_detection_ = false;
    std::int32_t param_grad_label_ = -1;
    // Labels of a block's tensors made at every forward or backward of it,
    // made once per block plan (Emitter::label).
    enum class PlanLabel : std::uint8_t { Gathered, Logsumexp, ActivationGradients };
    std::array<std::vector<std::int32_t>, 3> plan_labels_;
    std::int32_t plan_label(PlanLabel kind, const BlockPlan& p);
    // The pipeline's receive buffers, one per micro-batch and chunk: their labels made once.
    std::int32_t recv_label_ = -1, recv_grad_label_ = -1;
    std::int32_t recv_label() { return recv_label_ >= 0 ? recv_label_ : (recv_label_ = em_.label("pipeline receive buffer")); }
    std::int32_t recv_grad_label() { return recv_grad_label_ >= 0 ? recv_grad_label_ : (recv_grad_label_ = em_.label("pipeline receive buffer (gradient)")); }
    // The rank: pipeline position, its chunks' blocks, its tensors.
    const ParallelResult* par_ = nullptr;
    std::int64_t rank_ = 0, pp_ = 1, vpp_ = 1;
    std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> chunks_;  // per chunk: (plan, instances) in order
    std::vector<RankTensor> tensors_;
    std::vector<Bytes> block_gather_;     // per plan: 16-bit parameters of one instance (tp-sharded)
    // FSDP's root unit (memory/parallel.hpp fsdp_holds_root): the first and
    // last blocks' parameters, gathered once at each forward's start and held
    // to the end of that micro-batch's backward (their block_gather_ is 0).
    Bytes root_gather_;
    std::int64_t root_held_ = 0;
    std::vector<Bytes> block_grad_;       // per plan: trainable gradients of one instance before reduce-scatter
    bool gather_ = false, shard_grads_ = false, shard_opt_ = false, grad_buffer_ = false, tied_owned_ = false;
    bool inbwd_ = false;                  // optimizer in backward
    bool no_sync_ = false;                // FSDP no_sync: unsharded gradients until the last micro-batch
    bool final_mb_ = true;                // the backward running is the step's last micro-batch's
    // FSDP1 SHARD_GRAD_OP under no_sync frees no unit's gathered parameters
    // until the syncing backward (memory/parallel.cpp hold_unsharded): each
    // unit's, by (chunk, plan, instance in the chunk), with a reference of
    // their own from the first micro-batch's forward to the last's backward.
    bool hold_unsharded_ = false;
    std::map<InstanceKey, std::int64_t> unsharded_;
    // An instance's backward is done: its kept tensors go (and, on the
    // syncing backward, the parameters held across micro-batches).
    void release_extra(Instance& in);
    std::vector<Bytes> block_flat_;       // per plan: FSDP1 + LoRA frozen flat-parameter gradients of one instance
    std::size_t slice_key_ = 0;           // no_sync: reduce-scattered slices by backward order
    std::int32_t state_label_ = -1, temp_label_ = -1;
    std::int64_t bucket_ = 0;
    std::int64_t prefetched_ = 0;         // ZeRO-3 / FSDP: the next layer's parameters gathered early
    bool recomputing_ = false;            // a checkpointed layer's forward re-run in backward
    // Block instances whose FP8 weight workspaces exist: (chunk, plan, instance
    // in the chunk); instance_in_chunk_ is the instance forward() runs (also
    // the key of unsharded_).
    std::set<InstanceKey> fp8_made_;
    std::int64_t instance_in_chunk_ = 0;
    std::map<std::string, std::pair<std::int64_t, bool>> shared_;  // key -> (tensor, requires grad)
    std::map<std::string, std::int64_t> shared_grad_;
    [[nodiscard]] bool first_vstage(std::int64_t chunk) const { return chunk * pp_ + rank_ == 0; }
    [[nodiscard]] bool last_vstage(std::int64_t chunk) const { return chunk * pp_ + rank_ == pp_ * vpp_ - 1; }
};

}  // namespace gpumem::sim::detail
