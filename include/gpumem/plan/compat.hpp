// gpumem/plan/compat.hpp — compatibility reports: the numbers of tools people
// already trust, reproduced bit for bit, so that gpumem's own estimate can be
// put next to them.
//
// 1. DeepSpeed's ZeRO model-state estimators (microsoft/DeepSpeed v0.16.5,
//    commit 38327e07f6cd):
//      deepspeed/runtime/zero/stage_1_and_2.py
//        estimate_zero2_model_states_mem_needs{,_all_live,_all_cold}
//      deepspeed/runtime/zero/stage3.py
//        estimate_zero3_model_states_mem_needs{,_all_live,_all_cold}, model_to_params
//    Rows, their order, the int() truncations and the printout are DeepSpeed's.
//
// 2. Megatron-LM's theoretical memory report (NVIDIA/Megatron-LM commit
//    d98e8a64ddf3; file last changed in 1bcb3b9e0b02):
//      megatron/training/theoretical_memory_usage.py
//        compute_weight_and_optimizer_memory, compute_activation_memory,
//        compute_activation_memory_without_sp, report_theoretical_memory
//    computed in IEEE doubles in Python's evaluation order, so the bytes are
//    the very floats Megatron computes (exact while every integer
//    intermediate stays below 2^53, i.e. for any real model).
//
// docs/compat.md says what each report covers and where gpumem differs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gpumem/core/result.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// ---------------------------------------------------------------- DeepSpeed

// The arguments of estimate_zero{2,3}_model_states_mem_needs_all_cold.
struct DeepSpeedColdInput {
    int stage = 3;                          // 2 or 3
    std::int64_t total_params = 0;          // > 0
    std::int64_t largest_layer_params = 0;  // stage 3 only (ignored for stage 2)
    std::int64_t gpus_per_node = 1;         // num_gpus_per_node >= 1
    std::int64_t nodes = 1;                 // num_nodes >= 1
    double additional_buffer_factor = 1.5;  // > 0
};

// One printed row. The printout shows devices as "cpu " / "none"
// (OffloadDeviceEnum.cpu formatted with width 4) and zero_init as 1 / 0.
struct DeepSpeedRow {
    std::optional<bool> offload_param;  // stage 3 only: true = "cpu", false = "none"
    bool offload_optimizer = false;     // true = "cpu", false = "none"
    std::optional<bool> zero_init;      // stage 3 only
    std::int64_t cpu_bytes = 0;         // int(cpu_mem) as DeepSpeed returns it
    std::int64_t gpu_bytes = 0;         // int(gpu_mem)
};

struct DeepSpeedEstimate {
    DeepSpeedColdInput input;
    std::string function;  // "estimate_zero3_model_states_mem_needs_all_cold" / "..._all_live"
    std::string model;     // model name for _all_live ("" for _all_cold)
    std::vector<DeepSpeedRow> rows;  // DeepSpeed's print order
};

// estimate_zero{2,3}_model_states_mem_needs_all_cold: all rows.
Result<DeepSpeedEstimate> deepspeed_estimate_cold(const DeepSpeedColdInput& in);

// DeepSpeed's model_to_params (stage 3) on a gpumem graph: the largest
// module's own parameters, max over modules of sum(p.numel() for p in
// m.parameters(recurse=False)). A module is a Param name minus its last
// component within a block ("self_attn.q_proj.weight" and ".bias" are one
// module); a Param with count > 1 (MoE experts) is `count` modules of one
// tensor each; tied weights are graph params of their owner only. 0 for a
// params-only graph.
std::int64_t deepspeed_largest_layer_params(const ModelGraph& g);

// estimate_zero{2,3}_model_states_mem_needs_all_live: total params =
// g.total_params(), largest layer as above.
Result<DeepSpeedEstimate> deepspeed_estimate_live(const ModelGraph& g, int stage, std::int64_t gpus_per_node,
                                                  std::int64_t nodes, double additional_buffer_factor = 1.5);

// The text DeepSpeed prints (header, "  per CPU  |  per GPU |   Options",
// one line per row), each line ending in '\n'.
std::string deepspeed_printout(const DeepSpeedEstimate& e);

// CLI entry point: `gpumem compat deepspeed --stage 2|3 (MODEL | --params P
// [--largest-layer-params L]) --gpus-per-node G --nodes N [--buffer-factor F]`.
// Exactly one of `model` (any load_model spec) and `params` (parse_param_count
// text, "2.7B" or "2783959040") must be set. `largest_layer_params` (same
// syntax) goes with `params` and is required for stage 3 with `params`.
struct DeepSpeedOptions {
    int stage = 3;
    std::string model;
    std::string params;
    std::string largest_layer_params;
    std::int64_t gpus_per_node = 1;
    std::int64_t nodes = 1;
    double buffer_factor = 1.5;
};
Result<DeepSpeedEstimate> deepspeed_estimate(const DeepSpeedOptions& o);

// ---------------------------------------------------------------- Megatron

// The fields of Megatron's `args` that theoretical_memory_usage.py reads,
// after Megatron's own argument post-processing (megatron_args_from_json
// applies it: ffn/kv defaults, vocab padding, data-parallel size, ...).
struct MegatronArgs {
    std::int64_t num_layers = 0;
    std::int64_t hidden_size = 0;
    std::int64_t ffn_hidden_size = 0;
    std::int64_t num_attention_heads = 0;
    bool group_query_attention = false;
    std::int64_t num_query_groups = 0;  // read only when group_query_attention
    std::int64_t kv_channels = 0;
    std::int64_t padded_vocab_size = 0;
    std::int64_t seq_length = 0;
    std::int64_t micro_batch_size = 0;
    std::int64_t tensor_model_parallel_size = 1;
    std::int64_t pipeline_model_parallel_size = 1;
    std::optional<std::int64_t> virtual_pipeline_model_parallel_size;
    std::int64_t context_parallel_size = 1;
    std::int64_t data_parallel_size = 1;
    std::int64_t world_size = 1;  // used for the expert data-parallel size
    bool sequence_parallel = false;
    bool use_distributed_optimizer = false;
    bool swiglu = false;
    bool untie_embeddings_and_output_weights = false;
    std::string normalization = "LayerNorm";  // "LayerNorm" | "RMSNorm"
    std::string recompute_granularity;        // "" (None) | "selective" | "full"
    bool add_bias_linear = true;
    // MoE
    std::optional<std::int64_t> num_experts;
    std::int64_t moe_ffn_hidden_size = 0;
    std::int64_t moe_router_topk = 2;
    std::optional<std::int64_t> moe_shared_expert_intermediate_size;
    bool moe_shared_expert_gate = false;
    std::int64_t moe_layer_freq = 1;              // used when moe_layer_pattern is empty
    std::vector<std::int64_t> moe_layer_pattern;  // explicit list form of --moe-layer-freq
    std::optional<std::int64_t> moe_latent_size;
    std::int64_t expert_model_parallel_size = 1;
    std::int64_t expert_tensor_parallel_size = 1;
    std::optional<std::int64_t> mtp_num_layers;
    // Multi-latent attention
    bool multi_latent_attention = false;
    std::optional<std::int64_t> q_lora_rank;
    std::int64_t kv_lora_rank = 32;
    std::int64_t qk_head_dim = 128;
    std::int64_t qk_pos_emb_head_dim = 64;
    std::int64_t v_head_dim = 128;
    // report_theoretical_memory(num_microbatches=...): training passes
    // get_num_microbatches(); tools/report_theoretical_memory.py passes None.
    std::optional<std::int64_t> num_microbatches;
    bool hybrid_model = false;  // hybrid_layer_pattern set: Megatron does not report
};

struct MegatronMemoryReport {
    MegatronArgs args;  // the arguments the report was computed from
    // Exactly Megatron's floats, in bytes.
    double weight_and_optimizer_bytes = 0;
    double activation_bytes = 0;
    double total_bytes = 0;  // weight_and_optimizer_bytes + activation_bytes
    // What report_theoretical_memory returns and prints (MB = 1024*1024 bytes).
    double weight_and_optimizer_mb = 0;
    double activation_mb = 0;
    double total_mb = 0;
    // "compute_activation_memory" (sequence parallel + selective recompute)
    // or "compute_activation_memory_without_sp".
    std::string activation_formula;
    // The verbose=True details.
    double params_transformer_block = 0;
    double active_params_transformer_block = 0;
    std::optional<double> params_mtp_block;
    double params_embedding_layers = 0;
    double params_total = 0;
    double active_params_total = 0;
    double params_most_loaded_shard = 0;
    std::optional<double> params_other_shards;
    double bytes_per_parameter = 0;           // dense / TP-sharded parameters
    double expert_bytes_per_parameter = 0;    // routed-expert parameters
    std::int64_t expert_data_parallel_size = 0;
    double activation_per_layer_mb = 0;       // as printed per transformer layer
    std::optional<double> interleaved_penalty;
    std::optional<std::int64_t> in_flight_microbatches;
    // The lines report_theoretical_memory(args, num_microbatches, verbose=True)
    // prints on rank 0, in order, each ending in '\n'.
    std::string printout;
};

Result<MegatronMemoryReport> megatron_theoretical_memory(const MegatronArgs& a);

// Megatron's vocab_size_with_padding: ceil(vocab / (divisible_by * tp)) * (divisible_by * tp).
std::int64_t megatron_padded_vocab_size(std::int64_t vocab_size, std::int64_t make_vocab_size_divisible_by,
                                        std::int64_t tensor_model_parallel_size);

// A JSON object of Megatron argument names ("num_layers" or "--num-layers"
// spellings) -> MegatronArgs with Megatron's defaults and derivations.
// Required: num_layers, hidden_size, num_attention_heads, seq_length,
// micro_batch_size and padded_vocab_size or vocab_size. Unknown names are
// ignored (a full args dump works); wrong types and impossible values are
// errors naming the field.
Result<MegatronArgs> megatron_args_from_json(const nlohmann::json& j);

// CLI entry point: `gpumem compat megatron CONFIG.json`.
Result<MegatronMemoryReport> megatron_report_from_file(const std::string& path);

}  // namespace gpumem
