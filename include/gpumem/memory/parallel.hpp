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

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
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
    std::int64_t nodes = 1;
    std::int64_t tp = 1;
    std::int64_t pp = 1;
    std::int64_t cp = 1;
    std::int64_t ep = 1;
    bool sp = false;
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    std::int64_t vpp = 1;
    int zero = 0;
    Fsdp fsdp = Fsdp::None;
    bool distributed_optimizer = false;  // Megatron
    Offload offload_optimizer = Offload::None;
    Offload offload_params = Offload::None;
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
        return gpus == 1 && tp == 1 && pp == 1 && cp == 1 && ep == 1 && zero == 0 && fsdp == Fsdp::None &&
               offload_optimizer == Offload::None && offload_params == Offload::None;
    }
};

struct Layout {
    ParallelConfig cfg;
    std::int64_t dp = 1;
    std::int64_t gpus_per_node = 1;
    std::int64_t micro_batches = 1;   // per optimizer step (grad-accum)
    std::int64_t shard = 1;           // ranks a sharded state is split over (dp, or within a node for hybrid)
    std::int64_t expert_shard = 1;    // the same for expert parameters (dp / ep)
};

// The memory one GPU holds (the most loaded rank: pipeline stage and shard).
struct StageMemory {
    std::int64_t stage = 0;
    std::string contents;          // "embeddings + layers 0-7", ...
    std::int64_t layers = 0;
    std::int64_t params = 0;       // parameters on this rank after tp/pp/ep (before dp sharding)
    Bytes weights;
    Bytes gradients;
    Bytes optimizer_states;        // incl. fp32 master weights; 0 when offloaded
    Bytes activations;             // all micro-batches in flight
    std::int64_t in_flight = 1;    // micro-batches whose activations are kept
    Bytes gathered_params;         // ZeRO-3 / FSDP unsharded parameters in flight
    Bytes comm_buffers;            // DDP / ZeRO buckets, FSDP reduce-scatter, pipeline send/recv
    Bytes transient;               // scaled from the single-GPU transient peak
    Bytes allocated;               // sum of the above
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
    std::int64_t most_loaded = 0;  // index into stages
    Bytes nccl_outside;            // NCCL buffers outside the caching allocator
    Bytes cpu_per_node;            // offloaded states and pinned buffers
    Bytes nvme_per_node;
    CommVolume comm;
    // For the step simulation of one rank: the stage of every block instance
    // (per block, per repeat) and the factor a block's activations scale by
    // under tp/sp/cp (relative to one GPU at seq/cp).
    std::vector<std::vector<std::int32_t>> instance_stage;
    std::vector<double> activation_scale;
    std::vector<std::string> notes;
};

struct ModelGraph;
struct Job;

// Validates a layout against the model: every constraint that fails is named
// with the nearest valid values.
Result<Layout> resolve_layout(const ParallelConfig& cfg, const ModelGraph& g, std::int64_t seq, std::int64_t micro_batches);

// Per-GPU memory of every pipeline stage under the layout (analytic).
// `single_gpu_transient`: the single-GPU estimate's transient peak.
ParallelResult parallel_memory(const ModelGraph& g, const Job& job, const Layout& layout, Bytes single_gpu_transient);

}  // namespace gpumem
