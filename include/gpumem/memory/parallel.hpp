// gpumem/memory/parallel.hpp — distributed layouts and what each GPU holds.
//
// A layout splits the job over gpus = dp x tp x pp x cp (expert parallelism ep
// inside the data-parallel group):
//   tp  tensor parallel (Megatron): attention/MLP/embedding/head weights split
//       by tp; activations follow Korthikanti et al. 2022 (Table 2): without
//       sequence parallelism the 10/34 of a layer's linear activations around
//       the norms and residuals stay replicated, with --sp everything is /tp;
//   pp  pipeline parallel: layers split in stages; under 1F1B stage i keeps
//       min(pp - i, micro-batches) micro-batches of activations in flight, the
//       interleaved schedule multiplies the first stage by 1 + (pp-1)/(pp*vpp);
//       the first stage holds the embeddings, the last the output layer;
//   cp  context parallel: each rank holds seq/cp tokens;
//   ep  expert parallel: routed experts split by ep (their data-parallel group
//       is dp/ep); tokens per expert scale with the capacity factor;
//   dp  data parallel with DDP, DeepSpeed ZeRO-1/2/3, PyTorch FSDP
//       (full/grad-op/hybrid) or Megatron's distributed optimizer, with
//       optimizer/parameter offload to CPU or NVMe.
// Communication buffers (DDP buckets, ZeRO buckets and gathered parameters,
// FSDP unsharded layers, pipeline send/receive tensors) and NCCL memory
// outside the allocator are counted per GPU; offloaded bytes per node.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/shape.hpp"
#include "gpumem/core/dtype.hpp"
#include "gpumem/core/result.hpp"

namespace gpumem {

enum class PipelineSchedule { OneFOneB, Interleaved };
enum class Fsdp { None, Full, GradOp, Hybrid };
enum class Offload { None, Cpu, Nvme };

const char* to_string(PipelineSchedule);
const char* to_string(Fsdp);
const char* to_string(Offload);
Result<PipelineSchedule> parse_pp_schedule(std::string_view s);
Result<Fsdp> parse_fsdp(std::string_view s);
Result<Offload> parse_offload(std::string_view s, std::string_view flag);

struct ParallelConfig {
    std::int64_t gpus = 1;
    std::int64_t nodes = 0;          // 0: derived from gpus and GPUs per node
    std::int64_t gpus_per_node = 0;  // 0: the GPU catalog's board size (8 for HGX/DGX, 72 for NVL72)
    std::int64_t tp = 1;
    std::int64_t pp = 1;
    std::int64_t cp = 1;
    std::int64_t ep = 1;
    bool sp = false;
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    std::int64_t vpp = 1;
    // Uneven pipeline splits (Megatron-LM): transformer layers per virtual
    // pipeline stage in model order (pp x vpp entries; virtual stage k runs on
    // rank k % pp as its chunk k / pp), or the first/last rank's layer count
    // with the rest split evenly (--decoder-first/last-pipeline-num-layers),
    // or the embedding / loss counted as one layer of the split
    // (--account-for-embedding/loss-in-pipeline-split).
    std::vector<std::int64_t> pp_layers;
    std::optional<std::int64_t> pp_first_layers;
    std::optional<std::int64_t> pp_last_layers;
    bool pp_embedding_layer = false;
    bool pp_loss_layer = false;
    int zero = 0;
    Fsdp fsdp = Fsdp::None;
    bool distributed_optimizer = false;  // Megatron
    Offload offload_optimizer = Offload::None;
    Offload offload_params = Offload::None;
    // FSDP API: 1 (FullyShardedDataParallel, flat parameters per wrapped unit)
    // or 2 (fully_shard, per-parameter sharding). Differs for LoRA: FSDP1's flat
    // parameter of a unit mixing frozen and trainable weights gets a gradient
    // for all of it.
    int fsdp_version = 2;
    // FSDP gradient accumulation without the reduce-scatter between
    // micro-batches (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)):
    // full unsharded gradients are kept until the last micro-batch.
    bool no_sync = false;
    // The FSDP mesh spans the context-parallel ranks too (dp_shard x cp), so
    // --fsdp full shards over dp x cp: torchtitan's layout (set from the
    // framework profile, not a request field).
    bool fsdp_over_cp = false;
    double capacity_factor = 1.0;        // MoE token capacity factor
    // DeepSpeed defaults (deepspeed/runtime/zero/config.py): reduce/allgather
    // buckets of 5e8 elements, ZeRO-3 prefetch bucket 5e7 and max live 1e9
    // parameters, parameters below 1e5 elements stay gathered.
    std::int64_t zero_bucket_elements = 500'000'000;
    std::int64_t zero3_prefetch_elements = 50'000'000;
    std::int64_t zero3_max_live_elements = 1'000'000'000;
    std::int64_t zero3_persistence_threshold = 100'000;
    Bytes ddp_bucket = MiB(25);          // torch DDP bucket_cap_mb
    Bytes nccl_per_communicator = MiB(256);

    [[nodiscard]] bool trivial() const {
        return gpus == 1 && tp == 1 && pp == 1 && cp == 1 && ep == 1 && zero == 0 && fsdp == Fsdp::None && !distributed_optimizer &&
               offload_optimizer == Offload::None && offload_params == Offload::None;
    }
};

struct Layout {
    ParallelConfig cfg;
    std::int64_t dp = 1;
    std::int64_t gpus_per_node = 1;
    std::int64_t nodes = 1;
    bool nodes_assumed = false;       // --gpus not whole boards of the GPU: nodes of gcd(gpus, board) assumed
    std::int64_t micro_batches = 1;   // per optimizer step (grad-accum)
    std::int64_t shard = 1;           // ranks a sharded state is split over (dp, or within a node for hybrid)
    std::int64_t expert_shard = 1;    // the same for expert parameters (dp / ep)
    std::int64_t vpp = 1;             // model chunks per pipeline rank (interleaved schedule), else 1
    // Transformer layers of every virtual pipeline stage in model order
    // (pp x vpp entries; virtual stage v runs on rank v % pp as its chunk v / pp).
    std::vector<std::int64_t> stage_layers;
    [[nodiscard]] std::int64_t virtual_stages() const { return cfg.pp * vpp; }
    // The rank running the last virtual stage (the output layer; a tied
    // embedding's copy when it is not rank 0).
    [[nodiscard]] std::int64_t last_rank() const { return (std::max<std::int64_t>(1, virtual_stages()) - 1) % std::max<std::int64_t>(1, cfg.pp); }
};

// ---- pipeline schedule ------------------------------------------------------
// One forward or backward of one micro-batch through one model chunk, in the
// order a pipeline rank runs them (Megatron-LM's schedules.py:
// forward_backward_pipelining_without_interleaving / _with_interleaving).
struct PipelineOp {
    bool forward = true;
    std::int64_t micro_batch = 0;
    std::int64_t chunk = 0;
};
// Warm-up forwards of a rank: 1F1B min(pp - rank - 1, m); interleaved
// min((pp - rank - 1) * 2 + (vpp - 1) * pp, m * vpp) model chunks.
std::int64_t pipeline_warmup(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank);
std::vector<PipelineOp> pipeline_schedule(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank);
// The same schedule as runs: `count` repetitions of one unit, a forward of
// model chunk `fwd` (when >= 0) then a backward of chunk `bwd` (when >= 0).
// Chunks change every pp forwards (backwards), so a rank's schedule is
// O(m vpp / pp) runs where it is O(m vpp) ops.
struct PipelineRun {
    std::int64_t fwd = -1, bwd = -1, count = 0;
};
std::vector<PipelineRun> pipeline_schedule_runs(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank);
// The same into `runs` (cleared; its storage reused rank after rank).
void pipeline_schedule_runs(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank, std::vector<PipelineRun>& runs);

// ---- one rank's schedule walked -----------------------------------------------
// What a forward of model chunk ch adds until its backward (act; nl: the part
// outside the transformer layers; gather: SHARD_GRAD_OP's kept parameters)
// and the gradients the chunk's first backward creates (grad; tail_grad: those
// of the chunk's first layer, backwarded last). parallel_memory walks each
// rank's schedule over these to find the peak of activations in flight and
// what is held after each backward.
struct ScheduleLoads {
    std::span<const Bytes> act, nl, gather, grad, tail_grad;
    Bytes all_grads;         // every gradient of the rank (held throughout when always_grads)
    bool always_grads = false;
    bool embedding_rank = false;  // rank 0: chunk 0's backwards end at the embedding
};
struct ScheduleWalk {
    // At the forward where activations + gathered parameters + kept gradients
    // peak (the first such forward; among equals, the one with more in flight).
    Bytes act_peak, act_nl_peak, kept_gather, g_at_peak;
    std::int64_t inflight_peak = 0;
    // The largest held after a backward; without the chunk's first layer's
    // new gradients; after the embedding's backward (new or accumulated gradient).
    Bytes end_base, end_first_layer, end_emb_new, end_emb_acc;
    bool end_emb_new_seen = false, end_emb_acc_seen = false;
    // At the start of the backward where activations + gathered parameters +
    // the gradients already made peak (the first such): its own chunk's
    // activations still in flight. A pipeline's cool-down backwards run with
    // fewer micro-batches in flight than the forward peak but with gradients
    // the forward peak did not have yet (1F1B with m = pp: stage 0 runs every
    // forward before its first backward, so its forward peak holds no gradient,
    // while its second backward holds all of them and pp - 1 micro-batches).
    Bytes bwd_act, bwd_nl, bwd_gather, bwd_g;
    bool bwd_seen = false;
    friend bool operator==(const ScheduleWalk&, const ScheduleWalk&) = default;
};
// Op by op (the definition).
ScheduleWalk walk_schedule(const ScheduleLoads& in, const std::vector<PipelineOp>& ops);
// Run by run, the same answer: within a run after its first unit nothing
// changes but the amounts in flight, each by the same step per unit, so every
// value measured is linear in the unit's index and its largest (first
// largest) is at the run's second or last unit; the units in between are
// skipped. O(runs) instead of O(ops).
ScheduleWalk walk_schedule(const ScheduleLoads& in, const std::vector<PipelineRun>& runs);
// Micro-batches after which a rank's schedule only repeats itself: every
// later micro-batch allocates and frees exactly what an earlier one did, so
// the memory of m and of min(m, this) micro-batches is the same. Both the
// analytic model and the step simulation run this many.
std::int64_t pipeline_steady_micro_batches(std::int64_t pp, std::int64_t vpp, std::int64_t m, std::int64_t rank);

// ---- what one rank holds ----------------------------------------------------
// One parameter tensor shape on a rank: elements after tensor/expert
// parallelism, how many such tensors the rank holds, and the ranks its sharded
// states are split over. The analytic model and the step simulation both read
// this list, so their model states cannot differ.
struct RankTensor {
    Shape shape;                  // one tensor on this rank (first dimension split over tp)
    std::int64_t elems = 0;       // its elements, before dp sharding
    std::int64_t copies = 1;      // identical tensors on the rank
    std::int64_t shard = 1;       // dp ranks its sharded states are split over
    Bytes stored;                 // weight bytes of one tensor on the rank (quantized, dp-sharded when parameters are)
    bool trainable = true;
    bool adapter = false;         // LoRA adapter (A or B)
    bool tied_copy = false;       // the last pipeline stage's copy of a tied embedding
    // FSDP1 with LoRA: a frozen weight flattened with its layer's adapters into
    // one FlatParameter that requires grad: it gets a gradient of these bytes
    // (the flat parameter's dtype, before dp sharding) though it is frozen.
    Bytes flat_grad;
    std::int32_t block = -1;      // graph block (the output layer's for a tied copy)
    std::int32_t param = -1;      // index into the block's params (-1: adapter or tied copy)
    [[nodiscard]] std::int64_t sharded_elems(bool sharded) const { return sharded ? (elems + shard - 1) / shard : elems; }
};

// The memory one GPU holds (the most loaded rank: pipeline stage and shard).
struct StageMemory {
    std::int64_t stage = 0;
    std::string contents;          // "embeddings + layers 0-7", ...
    std::int64_t layers = 0;
    std::int64_t params = 0;       // parameters on this rank after tp/pp/ep (before dp sharding)
    Bytes weights;
    Bytes gradients;               // all of this rank's gradients (sharded where they are)
    bool gradients_kept = false;   // they exist during forward/backward too (grad accumulation, zero_grad(set_to_none=False), Megatron's buffer)
    Bytes gradients_at_peak;       // the gradients alive at the peak
    Bytes optimizer_states;        // incl. fp32 master weights; 0 when offloaded
    Bytes paged_optimizer_states;  // bitsandbytes paged states in CUDA managed memory (outside the allocator, not in `allocated`)
    Bytes master_weights;          // part of optimizer_states
    Bytes fp8_weights;             // Transformer Engine's cached FP8 weight copies and scaling state (memory/fp8.hpp)
    Bytes activations;             // saved activations of the micro-batches in flight (at their most)
    Bytes activations_at_peak;     // the part alive at the memory peak (0 in the optimizer step)
    Bytes kv_cache;                // inference: this rank's layers and key/value heads
    std::int64_t in_flight = 1;    // micro-batches (interleaved: model chunks) whose activations are kept
    Bytes gathered_params;         // ZeRO-3 / FSDP unsharded parameters in flight
    Bytes largest_gathered;        // ZeRO-3 / FSDP: the largest unit's gathered parameters on this rank (one block, freed after each use)
    Bytes comm_buffers;            // DDP / ZeRO buckets, FSDP reduce-scatter, pipeline send/recv
    Bytes transient;               // temporaries of the peak phase
    Bytes rounding;                // allocator blocks beyond the bytes of the persistent tensors (memory/blocks.hpp)
    Bytes allocated;               // the peak: the larger of the two phases below
    Bytes forward_backward_peak;   // states + activations in flight + forward/backward temporaries
    Bytes optimizer_peak;          // states + all gradients + optimizer-step temporaries
    std::string peak_phase;        // "forward", "backward", "optimizer" (training), "prefill", "decode"
    // CUDA graphs in training (--cuda-graphs): the graphs' private pool (its
    // peak, in 2 MiB pages), the part of it no tensor uses at the allocated
    // peak, and what the general pool reserves beyond its allocation at that
    // peak because its own peak comes at another moment (memory/framework.hpp).
    Bytes graph_pool;
    Bytes graph_pool_idle;
    Bytes graph_general_extra;
    // Filled by the step simulation for the ranks it ran (simulate_estimate).
    bool simulated = false;
    Bytes simulated_peak_allocated;
    Bytes simulated_peak_reserved;
};

struct CommVolume {
    Bytes tp_per_step;   // all-reduce / reduce-scatter + all-gather of activations
    Bytes dp_per_step;   // gradient all-reduce or reduce-scatter + parameter all-gather
    Bytes pp_per_step;   // activations and gradients between stages
    Bytes cp_per_step;   // key/value exchange
    Bytes ep_per_step;   // all-to-all token dispatch and combine
};

struct ParallelResult {
    Layout layout;
    std::vector<StageMemory> stages;
    std::int64_t most_loaded = 0;  // index into stages: the maximum of `allocated`
    Bytes nccl_outside;            // NCCL buffers outside the caching allocator
    Bytes cpu_per_node;            // offloaded states and pinned buffers
    Bytes nvme_per_node;
    CommVolume comm;
    // For the step simulation of one rank: the virtual pipeline stage of every
    // block instance (per block, per repeat).
    std::vector<std::vector<std::int32_t>> instance_stage;
    // Each pipeline rank's parameter tensors (rank_tensors), by stage: the
    // load phase of the rank reported reads them instead of building them again.
    // Ranks that hold the same tensors share one list (the ranks between a
    // pipeline's first and last).
    std::vector<std::shared_ptr<const std::vector<RankTensor>>> stage_tensors;
    std::vector<std::string> notes;
};

struct ModelGraph;
struct Job;

// Validates a layout against the model: every constraint that fails is named
// with the nearest valid values. `default_gpus_per_node` is the GPU's board
// size (GpuSpec::gpus_per_node), used when neither --nodes nor
// --gpus-per-node is given.
Result<Layout> resolve_layout(const ParallelConfig& cfg, const ModelGraph& g, std::int64_t seq, std::int64_t micro_batches,
                              std::int64_t default_gpus_per_node = 8);

// The virtual pipeline stage of every block instance under a layout: layers by
// Layout::stage_layers, blocks before the first layer on stage 0, blocks after
// the last on the last virtual stage.
std::vector<std::vector<std::int32_t>> assign_virtual_stages(const ModelGraph& g, const Layout& layout);

// The divisors of n in ascending order (layout sizes that split n evenly).
std::vector<std::int64_t> divisors(std::int64_t n);

// Elements of one tensor of a parameter on a rank: tensor-parallel layers
// split their first dimension over tp.
struct Param;
std::int64_t rank_param_elems(const Param& prm, std::int64_t tp);
// The shape of one tensor of a parameter on a rank (its first dimension split
// over tp where the parameter is split): RankTensor::shape.
Shape rank_param_shape(const Param& prm, std::int64_t tp);

// The parameter tensors of pipeline rank `rank` (all of them for one GPU).
std::vector<RankTensor> rank_tensors(const ModelGraph& g, const Job& job, const std::vector<std::vector<std::int32_t>>& instance_stage,
                                     std::int64_t rank);
// The same from the rank's instance count of each block (blocks[bi] runs
// `instances[bi]` times on the rank), for callers that have counted them.
std::vector<RankTensor> rank_tensors(const ModelGraph& g, const Job& job, std::span<const std::int64_t> instances, std::int64_t rank);

// Inference on one GPU (HF generate(): whole batch prefilled at once): the KV
// cache of all layers, and the prefill temporaries of one layer: 4 hidden-size
// tensors, the larger of the eager attention scores (lowered + fp32 softmax
// + cast back) and the MLP's 3 intermediate tensors, and the last position's
// logits (lowered + fp32). Ranks take their share (parallel_memory).
struct InferencePieces {
    std::int64_t total_len = 0;  // prompt + generated tokens
    DType kv_dtype = DType::BF16;
    Bytes kv_cache;
    Bytes hidden, attention, mlp, logits;
    Bytes logits_fp32;  // part of logits: the last position's fp32 upcast, its largest tensor
    Bytes working_set;  // models without transformer dims: the largest block's working set
};
InferencePieces inference_pieces(const ModelGraph& g, const Job& job);

// Per-GPU memory of every pipeline stage under the job's layout (analytic;
// a one-GPU job is the layout of one stage).
ParallelResult parallel_memory(const ModelGraph& g, const Job& job);
struct ActivationResult;  // memory/activations.hpp
// The same, given what the caller already computed for the job:
// `whole` = saved_activations(job_graph(g, job), job.actx) (analytic_estimate
// has it), so that it is not computed twice; null computes it. `memo`
// (optional): the block walks already made for job.actx (ActivationMemo).
class ActivationMemo;
ParallelResult parallel_memory(const ModelGraph& g, const Job& job, const ActivationResult* whole, ActivationMemo* memo = nullptr);

// A floor under every analytic estimate of a training job: the model states
// the most loaded rank holds through the whole step (weights, fp32 master
// weights, the optimizer states in the allocator, Transformer Engine's FP8
// weight copies, and the allocator rounding of these blocks: parallel_memory's
// `states` less the communication buffers). Every moment of the step holds
// them, so no rank's peak, and no estimate's device total, is below this;
// none of it depends on the micro-batch. The planner drops a layout whose
// floor exceeds the GPU without estimating it (plan/planner.hpp). 0 for
// inference.
Bytes model_states_floor(const ModelGraph& g, const Job& job);

// Whether FSDP (full or hybrid sharding, one pipeline stage) holds its root
// unit, the parameters outside the wrapped layers (embeddings, final norm,
// output layer: one all-gather of `g`'s first and last blocks), gathered
// from the forward's start to the end of the backward instead of gathering
// the embedding and the output layer at each use. PyTorch does not reshard
// the root after its forward (FSDP1: pytorch/pytorch
// torch/distributed/fsdp/_runtime_utils.py@3ade90a6aaa9 _post_forward_reshard,
// `not state._is_root`; fully_shard: torch/distributed/fsdp/_fully_shard/
// _fsdp_state.py@1fd469d0c96e FSDPState._lazy_init, the root's
// post_forward_mesh_info = None); its post-backward, after the embedding's
// backward, reshards it. What the root holds is the framework's wrapping:
// - FSDP1's wrapper with layer auto-wrapping (`--fsdp-version 1`; LitGPT's
//   Fabric FSDPStrategy, docs/frameworks.md LitGPT rule 13): the embeddings,
//   final norm and output layer;
// - torchtune's shard_model (torchtune/training/_distributed.py@bd2a0fc7c314
//   L709-714): the same, the root with reshard_after_forward=False (configs
//   that set custom_sharded_layers, e.g. recipes/configs/llama3_1/8B_full.yaml
//   L84, shard the embedding and output on their own: not modelled);
// - a tied embedding everywhere: accelerate's fully_shard path groups the final
//   norm with the tied embedding, reshard_after_forward=False
//   (src/accelerate/utils/fsdp_utils.py@16cb6eb80dd9 L847-864), as torchtitan
//   does (torchtitan/distributed/fsdp.py@b5bcd76c66d0 apply_fsdp_to_decoder,
//   the tied unit resharded only under the "always" policy);
// - an untied output layer under fully_shard (accelerate, torchtitan): the
//   embedding is a unit of its own, resharded after forward, and the final
//   norm and output layer one kept from their forward to their backward,
//   which follows it: gathered at each use, as the other blocks (false).
bool fsdp_holds_root(const ModelGraph& g, const Job& job);

}  // namespace gpumem
