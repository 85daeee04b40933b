#include "gpumem/report/compat_render.hpp"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

using json = nlohmann::json;

const char* device(bool cpu) { return cpu ? "cpu" : "none"; }

std::string gib2(std::int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / 1073741824.0); }

json opt_int(const std::optional<std::int64_t>& v) { return v ? json(*v) : json(nullptr); }
json opt_double(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

std::int64_t nearest(double v) { return static_cast<std::int64_t>(std::llround(v)); }

}  // namespace

json deepspeed_rows_to_json(const DeepSpeedEstimate& e) {
    const auto& in = e.input;
    json j;
    j["tool"] = e.function;
    j["stage"] = in.stage;
    if (!e.model.empty()) j["model"] = e.model;
    j["params"] = in.total_params;
    if (in.stage == 3) j["largest_layer_params"] = in.largest_layer_params;
    j["gpus_per_node"] = in.gpus_per_node;
    j["nodes"] = in.nodes;
    j["additional_buffer_factor"] = in.additional_buffer_factor;
    json rows = json::array();
    for (const auto& r : e.rows) {
        json row = json::object();
        if (r.offload_param) row["offload_param"] = device(*r.offload_param);
        row["offload_optimizer"] = device(r.offload_optimizer);
        if (r.zero_init) row["zero_init"] = *r.zero_init ? 1 : 0;
        row["cpu_bytes"] = r.cpu_bytes;
        row["gpu_bytes"] = r.gpu_bytes;
        rows.push_back(std::move(row));
    }
    j["rows"] = std::move(rows);
    return j;
}

std::string render_deepspeed(const DeepSpeedEstimate& e, Format f) {
    if (f == Format::Json) return deepspeed_rows_to_json(e).dump(2) + "\n";
    if (f == Format::Text) return deepspeed_printout(e);
    const bool z3 = e.input.stage == 3;
    Table t;
    if (z3) {
        t.header = {"per CPU (GiB)", "per GPU (GiB)", "offload_param", "offload_optimizer", "zero_init", "cpu_bytes", "gpu_bytes"};
        t.right_align = {true, true, false, false, true, true, true};
    } else {
        t.header = {"per CPU (GiB)", "per GPU (GiB)", "offload_optimizer", "cpu_bytes", "gpu_bytes"};
        t.right_align = {true, true, false, true, true};
    }
    for (const auto& r : e.rows) {
        std::vector<std::string> row = {gib2(r.cpu_bytes), gib2(r.gpu_bytes)};
        if (z3) row.emplace_back(device(r.offload_param.value_or(false)));
        row.emplace_back(device(r.offload_optimizer));
        if (z3) row.emplace_back(r.zero_init.value_or(false) ? "1" : "0");
        row.push_back(std::to_string(r.cpu_bytes));
        row.push_back(std::to_string(r.gpu_bytes));
        t.rows.push_back(std::move(row));
    }
    if (f == Format::Csv) return render_table(t, f);
    const auto& in = e.input;
    std::string out = fmt::format("### DeepSpeed `{}`\n\n", e.function);
    out += fmt::format("{}{} node{}, {} GPU{} per node; {} total params", e.model.empty() ? "" : e.model + ": ", in.nodes,
                       in.nodes > 1 ? "s" : "", in.gpus_per_node, in.gpus_per_node > 1 ? "s" : "", in.total_params);
    if (z3) out += fmt::format(", {} largest layer params", in.largest_layer_params);
    out += fmt::format("; additional_buffer_factor {}\n\n", in.additional_buffer_factor);
    return out + render_table(t, f);
}

json megatron_args_to_json(const MegatronArgs& a) {
    json j;
    j["num_layers"] = a.num_layers;
    j["hidden_size"] = a.hidden_size;
    j["ffn_hidden_size"] = a.ffn_hidden_size;
    j["num_attention_heads"] = a.num_attention_heads;
    j["group_query_attention"] = a.group_query_attention;
    j["num_query_groups"] = a.group_query_attention ? json(a.num_query_groups) : json(a.num_attention_heads);
    j["kv_channels"] = a.kv_channels;
    j["padded_vocab_size"] = a.padded_vocab_size;
    j["seq_length"] = a.seq_length;
    j["micro_batch_size"] = a.micro_batch_size;
    j["tensor_model_parallel_size"] = a.tensor_model_parallel_size;
    j["pipeline_model_parallel_size"] = a.pipeline_model_parallel_size;
    j["virtual_pipeline_model_parallel_size"] = opt_int(a.virtual_pipeline_model_parallel_size);
    j["context_parallel_size"] = a.context_parallel_size;
    j["data_parallel_size"] = a.data_parallel_size;
    j["world_size"] = a.world_size;
    j["sequence_parallel"] = a.sequence_parallel;
    j["use_distributed_optimizer"] = a.use_distributed_optimizer;
    j["swiglu"] = a.swiglu;
    j["untie_embeddings_and_output_weights"] = a.untie_embeddings_and_output_weights;
    j["normalization"] = a.normalization;
    j["recompute_granularity"] = a.recompute_granularity.empty() ? json(nullptr) : json(a.recompute_granularity);
    j["add_bias_linear"] = a.add_bias_linear;
    j["num_experts"] = opt_int(a.num_experts);
    if (a.num_experts) {
        j["moe_ffn_hidden_size"] = a.moe_ffn_hidden_size;
        j["moe_router_topk"] = a.moe_router_topk;
        j["moe_shared_expert_intermediate_size"] = opt_int(a.moe_shared_expert_intermediate_size);
        j["moe_shared_expert_gate"] = a.moe_shared_expert_gate;
        j["moe_layer_freq"] = a.moe_layer_pattern.empty() ? json(a.moe_layer_freq) : json(a.moe_layer_pattern);
        j["moe_latent_size"] = opt_int(a.moe_latent_size);
        j["expert_model_parallel_size"] = a.expert_model_parallel_size;
        j["expert_tensor_parallel_size"] = a.expert_tensor_parallel_size;
    }
    j["mtp_num_layers"] = opt_int(a.mtp_num_layers);
    j["multi_latent_attention"] = a.multi_latent_attention;
    if (a.multi_latent_attention) {
        j["q_lora_rank"] = opt_int(a.q_lora_rank);
        j["kv_lora_rank"] = a.kv_lora_rank;
        j["qk_head_dim"] = a.qk_head_dim;
        j["qk_pos_emb_head_dim"] = a.qk_pos_emb_head_dim;
        j["v_head_dim"] = a.v_head_dim;
    }
    j["num_microbatches"] = opt_int(a.num_microbatches);
    return j;
}

json megatron_to_json(const MegatronMemoryReport& r) {
    json j;
    j["tool"] = "megatron/training/theoretical_memory_usage.py report_theoretical_memory";
    j["weight_and_optimizer_bytes"] = nearest(r.weight_and_optimizer_bytes);
    j["activation_bytes"] = nearest(r.activation_bytes);
    j["total_bytes"] = nearest(r.total_bytes);
    j["weight_and_optimizer_mb"] = r.weight_and_optimizer_mb;
    j["activation_mb"] = r.activation_mb;
    j["total_mb"] = r.total_mb;
    j["activation_formula"] = r.activation_formula;
    j["params"] = {{"transformer_block", r.params_transformer_block},
                   {"active_transformer_block", r.active_params_transformer_block},
                   {"mtp_block", opt_double(r.params_mtp_block)},
                   {"embedding_layers", r.params_embedding_layers},
                   {"total", r.params_total},
                   {"active_total", r.active_params_total},
                   {"most_loaded_shard", r.params_most_loaded_shard},
                   {"other_shards", opt_double(r.params_other_shards)}};
    j["bytes_per_parameter"] = r.bytes_per_parameter;
    j["expert_bytes_per_parameter"] = r.expert_bytes_per_parameter;
    j["expert_data_parallel_size"] = r.expert_data_parallel_size;
    j["activation_per_layer_mb"] = r.activation_per_layer_mb;
    j["interleaved_penalty"] = opt_double(r.interleaved_penalty);
    j["in_flight_microbatches"] = opt_int(r.in_flight_microbatches);
    j["args"] = megatron_args_to_json(r.args);
    return j;
}

std::string render_megatron(const MegatronMemoryReport& r, Format f) {
    if (f == Format::Json) return megatron_to_json(r).dump(2) + "\n";
    if (f == Format::Text) return r.printout;
    Table t;
    t.header = {"quantity", "MB", "bytes", "source"};
    t.right_align = {false, true, true, false};
    t.rows.push_back({"weight and optimizer", fmt::format("{:.2f}", r.weight_and_optimizer_mb),
                      std::to_string(nearest(r.weight_and_optimizer_bytes)), "compute_weight_and_optimizer_memory"});
    t.rows.push_back({"activation", fmt::format("{:.2f}", r.activation_mb), std::to_string(nearest(r.activation_bytes)),
                      r.activation_formula});
    t.rows.push_back({"total", fmt::format("{:.2f}", r.total_mb), std::to_string(nearest(r.total_bytes)), "report_theoretical_memory"});
    if (f == Format::Csv) return render_table(t, f);
    return "### Megatron-LM theoretical memory (most loaded GPU: first pipeline stage)\n\n" + render_table(t, f);
}

}  // namespace gpumem
