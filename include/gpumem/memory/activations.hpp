// gpumem/memory/activations.hpp — bytes autograd keeps for backward.
//
// Walks the model graph once per block and sums the storages of the tensors
// that ops save (graph/builder.hpp lists the per-op rules), deduplicated by
// storage as torch.autograd.graph.saved_tensors_hooks would see them:
//   - views and same-dtype casts share their source's storage;
//   - under autocast, each lowered op saves its own 16-bit cast of an fp32
//     input; the 16-bit casts of weights are cached per forward and counted
//     separately (autocast_weight_casts);
//   - an op saves its input for the weight gradient only when its
//     parameters are trainable, and saves nothing when neither an input nor a
//     parameter requires grad (frozen LoRA base, frozen embeddings);
//   - selective recompute and fused attention replace the attention core by
//     q, k, v (+ output and fp32 logsumexp [b, heads, s] for flash/SDPA),
//     Korthikanti et al. 2022 §4 / FlashAttention-2 backward;
//   - full recompute (HF gradient checkpointing) keeps only the input of
//     each checkpointed layer; one layer's activations are rebuilt at a time.
// Verified against the CPU oracle (tests/fixtures/oracle/activations.json).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct ActivationContext {
    std::int64_t batch = 1;
    std::int64_t seq = 1;
    DType stream = DType::F32;   // parameter / residual-stream dtype
    DType lowered = DType::F32;  // dtype of autocast-lowered op outputs
    bool autocast = false;       // torch.autocast active (amp-fp16 / amp-bf16)
    // torch.autocast's cached 16-bit weight copies are saved by matmuls for
    // backward (false: the framework's own 16-bit copies, not kept; FSDP2,
    // Megatron, DeepSpeed: memory/framework.hpp).
    bool weight_cache = true;
    // Autocast over frozen fp32 base weights (LitGPT bf16-mixed LoRA): each
    // frozen linear casts its weight per call (autocast caches only leaves that
    // require grad) and the matmul keeps the 16-bit copy for the input's
    // gradient when the input requires grad.
    bool frozen_weight_casts = false;
    // Checkpointing (Full / Ops) wraps every N-th checkpointable layer
    // instance of a run (0, N, 2N, ...: torchtitan's ac_freq); the inputs of
    // checkpointed layers go to CPU memory and come back for the recompute
    // (--activation-offload: torchtune, Unsloth).
    std::int64_t recompute_every = 1;
    // Megatron's recompute_method / recompute_num_layers (request.hpp
    // RecomputeMethod): uniform chunks of N layers, or the first N layers.
    RecomputeMethod recompute_method = RecomputeMethod::Uniform;
    std::int64_t recompute_num_layers = 1;
    bool activation_offload = false;
    Recompute recompute = Recompute::None;
    Attention attention = Attention::Eager;
    bool train_base = true;      // false: base weights frozen (LoRA/QLoRA)
    std::vector<std::string> lora_targets;  // module leaf names with adapters
    std::int64_t lora_rank = 0;
    double lora_dropout = 0.0;              // PEFT lora_dropout (0: nn.Identity)
    // LitGPT's LoRAQKVLinear: the q, k and v adapters are one module over the
    // fused QKV projection, with one dropout of its input (shared_adapter_input).
    bool fused_qkv_lora = false;
    // LitGPT's own attention: q, k and v are views of one fused QKV output
    // (qkv.split(...).view(...).transpose(1, 2)); with as many key/value heads
    // as query heads nothing copies v, so the attention keeps the whole output
    // through its saved v (qkv_view_keeps_fused).
    bool fused_qkv_views = false;
    DType adapter = DType::F32;             // dtype of the adapters' weights
    // Weight quantization of the frozen base (bitsandbytes / GPTQ): which
    // linears hold quantized weights, and whether their matmuls keep the input
    // for backward (LLM.int8 always; 4-bit only bitsandbytes < 0.43.2).
    Quant quant = Quant::None;
    bool quantize_head = false;
    bool bnb_4bit_saves_input = false;
    // Encoder-decoder models: this rank's share of the decoder's tokens
    // (SeqAxis::Decoder / Cross tensors); 0: the same as seq.
    std::int64_t decoder_seq = 0;
    // One rank of a layout: seq is this rank's share (seq / cp) of the
    // sequence; tensors are split over tp by tp_split_flags (all of them with
    // sequence parallelism); attention scores span cp x the local keys; routed
    // experts process capacity_factor x their share of tokens; a rank holds
    // E / ep experts' weights.
    std::int64_t tp = 1;
    bool sp = false;
    std::int64_t cp = 1;
    std::int64_t ep = 1;
    double capacity_factor = 1.0;
};

// Tensor parallelism tensor by tensor (Megatron; Korthikanti et al. 2022,
// Table 2 counts the same way): a block's input is whole on every rank; a
// Linear reading a whole tensor is column-parallel (its output split over tp:
// q/k/v, MLP up/gate, vocab-parallel logits), one reading a split tensor is
// row-parallel (its output all-reduced whole: attention output projection,
// MLP down); every other op's output is split when an input is. Whole tensors
// (norm inputs/outputs, residuals, their dropout masks) are the 10 of 34 sbh
// a GPT layer keeps unsplit; sequence parallelism splits them too.
std::vector<char> tp_split_flags(const Block& b);
void tp_split_flags(const Block& b, std::vector<char>& out);  // the same into `out` (its storage reused)

// Elements of an op's weights on one rank (tp splits the first dimension, ep
// the routed experts): what autocast's cached 16-bit copy holds.
std::int64_t weight_elements(const Block& b, const Op& op, std::int64_t tp, std::int64_t ep);

// How a block's forward runs: the ops fused attention (SDPA/flash) replaces
// (the attention core, and the q/k/v copies only it reads; the op producing
// a site's output stands for the fused kernel), generation's dropped loss
// and labels, and how many times each storage is read. Shared by the step
// simulation and the analytic working set, so both free tensors alike.
struct ForwardStructure {
    std::vector<char> skip;          // per op
    std::vector<int> site_of_op;     // per op: attention site it stands for, or -1
    std::vector<std::int32_t> uses;  // per storage: forward reads
};
ForwardStructure forward_structure(const Block& b, const std::vector<TensorId>& storage, Attention attention, bool inference);
// The same into `out`, reusing its storage.
void forward_structure(const Block& b, const std::vector<TensorId>& storage, Attention attention, bool inference, ForwardStructure& out);

// Peak of live bytes while one block instance runs forward without autograd
// (inference): its input, each op's new outputs, inputs freed after their
// last read, plus `dequant[op]` in flight for 4-bit matmuls.
Bytes no_grad_working_set(const Block& b, const ActivationContext& ctx, const std::vector<Bytes>* dequant = nullptr);


// Bytes of one activation tensor on one rank of the context's layout.
Bytes activation_bytes(const TensorInfo& t, DType dt, bool split, const ActivationContext& ctx);

struct BlockActivations {
    std::string block;
    std::int64_t repeat = 1;
    Bytes per_instance;          // saved bytes of one execution of the block
    Bytes total;                 // saved bytes of all its executions (storages handed between them once)
    Bytes routed_per_instance;   // part of per_instance: tensors of routed experts (MoE)
    Bytes largest_tensor;        // largest tensor produced in the block (transient sizing)
    Bytes working_set;           // everything one instance produces (recompute transient)
    Bytes grad_pair;             // largest |grad wrt output| + |grad wrt input| of one op
    Bytes grad_pair_net;         // the same less the saved tensors the block's later ops freed before it
    Bytes recompute_transient;   // full recompute: one instance rebuilt in backward
    Bytes recompute_largest;     // part of recompute_transient: the rebuild's largest transient tensor
    // One instance rebuilt (Megatron's uniform chunks rebuild N at once in
    // recompute_transient; its last layer's backward, with one left, is this).
    Bytes recompute_layer;
    Bytes weight_casts;          // part of `total`: autocast's 16-bit weight copies
    Bytes lora;                  // part of `total`: LoRA adapter tensors
    // Part of `total`: inputs bitsandbytes' 4-bit matmul (< 0.43.2) keeps as
    // context attributes (ctx.tensors, bitsandbytes/autograd/_functions.py
    // MatMul4Bit.forward): backward does not free them, the graph does, so a
    // loop holding the logits (and with them the graph) holds them through the
    // next micro-batch's forward. Checkpointed instances keep none (their
    // rebuilt graph dies in backward).
    Bytes quant_held;
    Bytes unsaved_casts;         // full recompute: weight copies cached until forward returns (not in `total`)
    // Checkpointed instances: the tensors one instance's forward holds at once
    // beyond what `total` counts (its intermediates, which checkpointing frees
    // as it goes instead of saving; with offloading, its input too).
    Bytes forward_transient;
};

struct ActivationResult {
    Bytes saved;                 // total saved for backward, deduplicated, parameters excluded
    Bytes autocast_weight_casts; // part of `saved`: cached 16-bit copies of weights
    Bytes lora_adapters;         // part of `saved`: the adapters' rank-r outputs
    Bytes quant_held;            // part of `saved`: BlockActivations::quant_held summed
    Bytes recompute_transient;   // full recompute: one layer's activations rebuilt in backward
    // --recompute-every: the saves of the uncheckpointed instances after the
    // last checkpointed one of the whole run of layers (they may span blocks
    // whose layers differ), freed before the first rebuild in backward.
    Bytes recompute_trailing;
    // Full recompute: autocast's weight-cast cache still holds every 16-bit
    // weight copy until the forward leaves the autocast region (not saved).
    Bytes autocast_cache_unsaved;
    Bytes largest_tensor;
    // During an op's backward the gradients w.r.t. its output and its input
    // coexist: the largest such pair over all ops.
    Bytes backward_grad_pair;
    Bytes loss_input;            // the tensor the loss reads (the model's output)
    Bytes logits;                // lm_head output [b, s, V] (0 without a head)
    std::vector<BlockActivations> blocks;
};

// True when a LoRA adapter wraps this op (a Linear whose leaf module name is
// in `targets`; "all-linear" means every Linear except lm_head, as PEFT).
bool lora_applies(const Op& op, const std::vector<std::string>& targets);
// With ctx.fused_qkv_lora: the earlier q/k/v projection of block `b` whose
// adapter input (its dropout's output and mask, or cast) op `o`'s adapter
// shares, both reading the same input (litgpt/lora.py@26857050fe3f
// L381-414: one `self.lora_dropout(x)` for every enabled q, k, v); -1 if none.
std::int64_t shared_adapter_input(const Block& b, std::size_t o, const ActivationContext& ctx);
// With ctx.fused_qkv_lora: op `o` is a q/k/v adapter of a fused projection
// with only part of q, k, v adapted, so LoRAQKVLinear.zero_pad scatters B's
// output into zeros with index_copy_, whose backward keeps its source, the
// [rows, out] B output (litgpt/lora.py@26857050fe3f L321-326; derivatives.yaml
// index_copy: `source: grad.index_select(dim, index).expand_as(source)`).
bool qkv_lora_zero_pad(const Block& b, std::size_t o, const ActivationContext& ctx);
// With ctx.fused_qkv_views: attention site `a` reads a v made by its own
// projection (no repeat_kv copy: as many key/value heads as query heads), which
// LitGPT slices from the fused QKV output; the saved v keeps the q and k parts
// too, 2 x v's bytes more (litgpt/model.py@26857050fe3f L479, L538-539).
bool qkv_view_keeps_fused(const Block& b, const AttentionSite& a, const ActivationContext& ctx);

// Sequence lengths a tensor's extent is evaluated at on one rank: its query
// (token) length and its key length (c2 = query x key; cp: every rank's keys).
std::int64_t query_len(const TensorInfo& t, const ActivationContext& ctx);
std::int64_t key_len(const TensorInfo& t, const ActivationContext& ctx);
// Elements of one activation on one rank before tensor-parallel splitting.
std::int64_t activation_elements(const TensorInfo& t, const ActivationContext& ctx);

// Weight quantization: a parameter held quantized (nn.Linear weights; the
// output head only with quantize_head), and an op whose matmul reads one.
bool quantized_weight(const Param& p, Quant q, bool quantize_head);
bool quantized_op(const Block& b, const Op& op, Quant q, bool quantize_head);
// bitsandbytes 4-bit layers (nf4/fp4) and GPTQ int4 dequantize the whole
// weight to the compute dtype for each matmul.
inline bool dequantizes(Quant q) { return q == Quant::NF4 || q == Quant::FP4 || q == Quant::Int4; }
// The frozen quantized layer keeps its input for backward when that input
// requires grad: bitsandbytes MatMul8bitLt always, MatMul4Bit before 0.43.2.
bool quantized_saves_input(const ActivationContext& ctx);

// What a LoRA adapter keeps for backward besides its rank-r output (PEFT
// lora.Linear: lora_B(lora_A(dropout(x))) after x = x.to(lora_A.weight.dtype)):
// lora_A saves x itself (saves_x), or a new storage of `copy` bytes: its own
// autocast cast (cast) or else the converted / dropped tensor; dropout saves its
// bool `mask`. `convert` (the cast of x to the adapters' dtype) and `dropped`
// (dropout's output) are what the forward allocates on the way.
struct AdapterInput {
    bool saves_x = false;
    bool cast = false;
    Bytes copy, mask, convert, dropped;
};
AdapterInput adapter_input(const Block& b, const Op& op, TensorId x, DType x_dtype, bool split, const ActivationContext& ctx);

// `instances` (optional): how many executions of each block to count (a
// pipeline stage's share; 0 skips a block); `input_requires_grad`: the first
// counted block's input needs a gradient (activations received from the
// previous pipeline stage).
// `memo` (optional): what one block instance saves depends only on the block,
// the context and whether its input requires grad; a memo keeps those results
// across calls that share one context object (the whole model and each
// pipeline chunk of one estimate), so each block is walked once per input
// state. A memo is bound to the first context it sees; given another, it is
// not used.
class ActivationMemo {
public:
    ActivationMemo();
    ~ActivationMemo();
    ActivationMemo(const ActivationMemo&) = delete;
    ActivationMemo& operator=(const ActivationMemo&) = delete;
    struct Impl;
    std::unique_ptr<Impl> impl;
};
ActivationResult saved_activations(const ModelGraph& g, const ActivationContext& ctx, const std::vector<std::int64_t>* instances = nullptr,
                                   bool input_requires_grad = false, ActivationMemo* memo = nullptr);

// Op-level selective checkpointing (torchtitan's per-op SAC policy,
// torchtitan/distributed/activation_checkpoint.py@b5bcd76c66d0 L185-287):
// what one checkpointed instance keeps besides its input — the outputs of
// every other matmul (the 1st, 3rd, ... nn.Linear of the block) and the fused
// attention kernels' outputs with their fp32 logsumexp.
Bytes op_sac_saved(const Block& b, const ActivationContext& ctx);
// Per op: whether op-level selective checkpointing keeps its output (every
// other nn.Linear, the 1st, 3rd, ...; the attention outputs apart). The one
// rule op_sac_saved, the analytic forward walk and the simulator share.
std::vector<char> sac_kept_ops(const Block& b);

// Whether the k-th checkpointable instance of a run is checkpointed (keeps
// its input and is rebuilt in backward): every N-th (recompute_every), the
// first N (Megatron block), or the first of each chunk of N (Megatron
// uniform, whose other layers are rebuilt with it: recompute_group).
inline bool checkpointed_instance(std::int64_t k, const ActivationContext& ctx) {
    if (ctx.recompute_method == RecomputeMethod::Block) return k < ctx.recompute_num_layers;
    if (ctx.recompute_num_layers > 1) return k % ctx.recompute_num_layers == 0;
    return ctx.recompute_every <= 1 || k % ctx.recompute_every == 0;
}
// Layers a checkpoint covers and backward rebuilds at once (Megatron uniform).
inline std::int64_t recompute_group(const ActivationContext& ctx) {
    return ctx.recompute_method == RecomputeMethod::Uniform ? std::max<std::int64_t>(1, ctx.recompute_num_layers) : 1;
}
// Of `repeat` checkpointable instances of a run whose first is the `first`-th
// checkpointable instance of the chunk (models whose layers differ come in
// several runs; the count runs on across them, as torchtitan's ac_freq
// counter and Megatron's layer numbers do): how many are checkpointed (keep
// their input; with uniform chunks, the chunks that start here), and how many
// uncheckpointed ones come after the last checkpointed (backwarded first).
inline std::int64_t checkpointed_count(std::int64_t repeat, const ActivationContext& ctx, std::int64_t first = 0) {
    std::int64_t n = 0;
    for (std::int64_t k = first; k < first + repeat; ++k) n += checkpointed_instance(k, ctx) ? 1 : 0;
    return n;
}
inline std::int64_t trailing_uncheckpointed(std::int64_t repeat, const ActivationContext& ctx, std::int64_t first = 0) {
    if (recompute_group(ctx) > 1) return 0;
    std::int64_t t = 0;
    for (std::int64_t k = first + repeat - 1; k >= first && !checkpointed_instance(k, ctx); --k) ++t;
    return t;
}

// The dtype a role resolves to under a context.
DType resolve_role(ActRole role, const ActivationContext& ctx);

}  // namespace gpumem
