// Megatron-LM's theoretical memory report, re-implemented from its source
// (see include/gpumem/plan/compat_megatron.hpp for the file and commits), so
// that gpumem's estimate can be put next to the numbers people already trust.
// Arithmetic follows the Python evaluation order: integer products stay
// integers (int64, checked), and a value becomes a double exactly where Python
// mixes an int with a float or uses true division.
#include "gpumem/plan/compat_megatron.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "compat_internal.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/core/limits.hpp"

namespace gpumem {

namespace {

using detail::d;
using detail::fmtc;
using detail::require_positive;

constexpr double kMegabyte = 1024.0 * 1024.0;  // NUM_BYTES_IN_MEGABYTE

void validate(const MegatronArgs& a) {
    require_positive(a.num_layers, "num_layers", "num_layers");
    require_positive(a.hidden_size, "hidden_size", "hidden_size");
    require_positive(a.ffn_hidden_size, "ffn_hidden_size", "ffn_hidden_size");
    require_positive(a.num_attention_heads, "num_attention_heads", "num_attention_heads");
    require_positive(a.kv_channels, "kv_channels", "kv_channels");
    require_positive(a.padded_vocab_size, "padded_vocab_size", "padded_vocab_size");
    require_positive(a.seq_length, "seq_length", "seq_length");
    require_positive(a.micro_batch_size, "micro_batch_size", "micro_batch_size");
    require_positive(a.tensor_model_parallel_size, "tensor_model_parallel_size", "tensor_model_parallel_size");
    require_positive(a.pipeline_model_parallel_size, "pipeline_model_parallel_size", "pipeline_model_parallel_size");
    require_positive(a.context_parallel_size, "context_parallel_size", "context_parallel_size");
    require_positive(a.data_parallel_size, "data_parallel_size", "data_parallel_size");
    require_positive(a.world_size, "world_size", "world_size");
    require_positive(a.expert_model_parallel_size, "expert_model_parallel_size", "expert_model_parallel_size");
    require_positive(a.expert_tensor_parallel_size, "expert_tensor_parallel_size", "expert_tensor_parallel_size");
    if (a.virtual_pipeline_model_parallel_size)
        require_positive(*a.virtual_pipeline_model_parallel_size, "virtual_pipeline_model_parallel_size",
                         "virtual_pipeline_model_parallel_size");
    if (a.group_query_attention) require_positive(a.num_query_groups, "num_query_groups", "num_query_groups");
    if (a.normalization != "LayerNorm" && a.normalization != "RMSNorm")
        fail(ErrorCode::InvalidArgument, "normalization", "normalization must be \"LayerNorm\" or \"RMSNorm\" (got \"" + a.normalization + "\")");
    if (!a.recompute_granularity.empty() && a.recompute_granularity != "selective" && a.recompute_granularity != "full")
        fail(ErrorCode::InvalidArgument, "recompute_granularity",
             "recompute_granularity must be null, \"selective\" or \"full\" (got \"" + a.recompute_granularity + "\")");
    if (a.num_experts) {
        require_positive(*a.num_experts, "num_experts", "num_experts");
        require_positive(a.moe_ffn_hidden_size, "moe_ffn_hidden_size", "moe_ffn_hidden_size");
        require_positive(a.moe_router_topk, "moe_router_topk", "moe_router_topk");
        if (a.moe_layer_pattern.empty()) {
            require_positive(a.moe_layer_freq, "moe_layer_freq", "moe_layer_freq");
        } else {
            if (static_cast<std::int64_t>(a.moe_layer_pattern.size()) != a.num_layers)
                fail(ErrorCode::InvalidArgument, "moe_layer_freq",
                     "Invalid length of moe_layer_pattern: " + std::to_string(a.moe_layer_pattern.size()) + ", expected " +
                         std::to_string(a.num_layers));
            for (auto v : a.moe_layer_pattern)
                if (v != 0 && v != 1) fail(ErrorCode::InvalidArgument, "moe_layer_freq", "moe_layer_freq pattern entries must be 0 or 1");
        }
        if (a.moe_latent_size) require_positive(*a.moe_latent_size, "moe_latent_size", "moe_latent_size");
    }
    if (a.moe_shared_expert_intermediate_size && *a.moe_shared_expert_intermediate_size < 0)
        fail(ErrorCode::InvalidArgument, "moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size must be >= 0");
    if (a.mtp_num_layers && *a.mtp_num_layers < 0)
        fail(ErrorCode::InvalidArgument, "mtp_num_layers", "mtp_num_layers must be >= 0");
    if (a.multi_latent_attention) {
        if (a.group_query_attention)
            fail(ErrorCode::InvalidArgument, "group_query_attention", "multi_latent_attention and group_query_attention exclude each other");
        if (a.q_lora_rank) require_positive(*a.q_lora_rank, "q_lora_rank", "q_lora_rank");
        require_positive(a.kv_lora_rank, "kv_lora_rank", "kv_lora_rank");
        require_positive(a.qk_head_dim, "qk_head_dim", "qk_head_dim");
        if (a.qk_pos_emb_head_dim < 0) fail(ErrorCode::InvalidArgument, "qk_pos_emb_head_dim", "qk_pos_emb_head_dim must be >= 0");
        require_positive(a.v_head_dim, "v_head_dim", "v_head_dim");
    }
    if (a.num_microbatches) require_positive(*a.num_microbatches, "num_microbatches", "num_microbatches");
}

// compute_weight_and_optimizer_memory.
double weight_and_optimizer(const MegatronArgs& a, MegatronMemoryReport& r) {
    const std::int64_t h = a.hidden_size, L = a.num_layers, heads = a.num_attention_heads;
    const std::int64_t query_projection_size = checked_mul(a.kv_channels, heads);
    const double query_projection_to_hidden_size_ratio = d(query_projection_size) / d(h);
    const std::int64_t num_query_groups = a.group_query_attention ? a.num_query_groups : heads;
    const bool moe = a.num_experts.has_value();
    const std::int64_t num_experts = moe ? *a.num_experts : 1;
    const bool swiglu = a.swiglu;
    // x * gated_linear_multiplier: 3/2 (a float) with swiglu, the int 1 otherwise.
    const auto gated = [&](std::int64_t x) { return swiglu ? d(x) * 1.5 : d(x); };
    const std::int64_t shared_ffn = a.moe_shared_expert_intermediate_size.value_or(0);

    std::vector<std::int64_t> pattern;
    std::int64_t moe_ffn = 0;
    if (moe) {
        if (!a.moe_layer_pattern.empty()) {
            pattern = a.moe_layer_pattern;
        } else {
            for (std::int64_t i = 0; i < L; ++i) pattern.push_back(i % a.moe_layer_freq == 0 ? 1 : 0);
        }
        moe_ffn = a.moe_ffn_hidden_size;
    } else {
        pattern.assign(static_cast<std::size_t>(L), 0);
    }
    std::int64_t num_moe_layers = 0;
    for (auto v : pattern) num_moe_layers += v;
    const std::int64_t num_dense_layers = L - num_moe_layers;
    std::int64_t mtp_moe = 0, mtp_dense = 0;
    if (a.mtp_num_layers) {
        const std::int64_t last_is_moe = pattern.back();
        mtp_moe = last_is_moe * *a.mtp_num_layers;
        mtp_dense = (1 - last_is_moe) * *a.mtp_num_layers;
    }
    const std::int64_t norm_size = a.normalization == "RMSNorm" ? 1 : 2;

    double attention_params = 0;
    if (a.multi_latent_attention) {
        const std::int64_t qk = checked_add(a.qk_head_dim, a.qk_pos_emb_head_dim);
        std::int64_t q_term = 0;
        if (!a.q_lora_rank)
            q_term = checked_mul(checked_mul(h, heads), qk);
        else
            q_term = checked_mul(*a.q_lora_rank, checked_add(checked_add(h, checked_mul(heads, qk)), norm_size));
        const std::int64_t self_attn = checked_add(
            checked_add(checked_add(q_term, checked_mul(a.kv_lora_rank,
                                                        checked_add(checked_add(h, checked_mul(heads, checked_add(a.qk_head_dim, a.v_head_dim))),
                                                                    norm_size))),
                        checked_mul(h, a.qk_pos_emb_head_dim)),
            checked_mul(checked_mul(heads, a.v_head_dim), h));
        attention_params = d(self_attn);
    } else {
        attention_params = d(checked_mul(checked_mul(2, h), h)) *
                           ((1.0 + (d(num_query_groups) / d(heads))) * query_projection_to_hidden_size_ratio);
    }

    const std::int64_t embedding_size = checked_mul(h, a.padded_vocab_size);
    const std::int64_t final_layernorm = checked_mul(norm_size, h);
    const std::int64_t embedding_layers = a.untie_embeddings_and_output_weights ? checked_mul(2, embedding_size) : embedding_size;

    const double dense_mlp_params = gated(checked_mul(checked_mul(2, h), a.ffn_hidden_size));
    const double shared_expert_params = gated(checked_mul(checked_mul(2, h), shared_ffn));
    const std::int64_t routed_hidden = a.moe_latent_size ? *a.moe_latent_size : h;
    const double routed_expert_params = gated(checked_mul(checked_mul(checked_mul(2, routed_hidden), moe_ffn), num_experts));
    const double active_routed_expert_params =
        moe ? gated(checked_mul(checked_mul(checked_mul(2, routed_hidden), moe_ffn), a.moe_router_topk)) : 0.0;
    const double latent_projection_params = moe && a.moe_latent_size ? d(checked_mul(checked_mul(2, h), *a.moe_latent_size)) : 0.0;
    const double layernorm_params = d(checked_mul(checked_mul(2, h), norm_size));
    const double router_params =
        moe ? d(checked_add(checked_mul(h, num_experts), a.add_bias_linear ? num_experts : 0)) : 0.0;
    const double shared_expert_gate_params = shared_ffn > 0 && a.moe_shared_expert_gate ? d(h) : 0.0;

    const double layer_dense = attention_params + dense_mlp_params + layernorm_params;
    const double layer_moe = attention_params + shared_expert_params + routed_expert_params + latent_projection_params +
                             layernorm_params + router_params + shared_expert_gate_params;
    const double active_layer_moe = attention_params + shared_expert_params + active_routed_expert_params +
                                    latent_projection_params + layernorm_params + router_params + shared_expert_gate_params;
    const double block = layer_dense * d(num_dense_layers) + layer_moe * d(num_moe_layers) + d(final_layernorm);
    const double active_block = layer_dense * d(num_dense_layers) + active_layer_moe * d(num_moe_layers) + d(final_layernorm);
    const double mtp_block = layer_dense * d(mtp_dense) + layer_moe * d(mtp_moe);
    const double total = block + mtp_block + d(embedding_layers);
    const double active_total = active_block + mtp_block + d(embedding_layers);

    r.params_transformer_block = block;
    r.active_params_transformer_block = active_block;
    if (a.mtp_num_layers) r.params_mtp_block = mtp_block;
    r.params_embedding_layers = d(embedding_layers);
    r.params_total = total;
    r.active_params_total = active_total;
    r.printout += fmtc("Number of parameters in transformer block in billions: % .2f\n", block / 1e9);
    r.printout += fmtc("Number of active parameters in transformer block in billions: % .2f\n", active_block / 1e9);
    if (a.mtp_num_layers) r.printout += fmtc("Number of parameters in mtp block in billions: % .2f\n", mtp_block / 1e9);
    r.printout += fmtc("Number of parameters in embedding layers in billions: %.2f\n", d(embedding_layers) / 1e9);
    r.printout += fmtc("Total number of parameters in billions: %.2f\n", total / 1e9);
    r.printout += fmtc("Total number of active parameters in billions: %.2f\n", active_total / 1e9);

    const std::int64_t etp = a.expert_tensor_parallel_size, ep = a.expert_model_parallel_size, pp = a.pipeline_model_parallel_size,
                       tp = a.tensor_model_parallel_size;
    const std::int64_t expert_tmp = checked_mul(checked_mul(etp, ep), pp);
    const std::int64_t expert_dp = a.world_size / expert_tmp;  // world_size // (etp * ep * pp)

    const double tp_sharded_block =
        (attention_params + dense_mlp_params) * d(num_dense_layers) + (attention_params + shared_expert_params) * d(num_moe_layers);
    const double moe_replicated = layernorm_params + latent_projection_params + router_params + shared_expert_gate_params;
    const double replicated_block = layernorm_params * d(num_dense_layers) + moe_replicated * d(num_moe_layers) + d(final_layernorm);
    const double expert_block = routed_expert_params * d(num_moe_layers);
    const double tp_sharded_mtp = (attention_params + dense_mlp_params) * d(mtp_dense) + (attention_params + shared_expert_params) * d(mtp_moe);
    const double replicated_mtp = layernorm_params * d(mtp_dense) + moe_replicated * d(mtp_moe);
    const double expert_mtp = routed_expert_params * d(mtp_moe);

    double tp_most = ((tp_sharded_block / d(pp)) + tp_sharded_mtp + d(embedding_size)) / d(tp);
    const double replicated_most = (replicated_block / d(pp)) + replicated_mtp;
    const double expert_most = ((expert_block / d(pp)) + expert_mtp) / d(checked_mul(etp, ep));
    double most = tp_most + replicated_most + expert_most;
    if (a.untie_embeddings_and_output_weights && pp == 1) {
        tp_most += d(embedding_size) / d(tp);
        most += d(embedding_size) / d(tp);
    }
    r.params_most_loaded_shard = most;
    r.printout += fmtc("Number of parameters in most loaded shard in billions: %.4f\n", most / 1e9);
    if (pp > 1) {
        const double other = tp_sharded_block / d(checked_mul(pp, tp)) + replicated_block / d(pp) +
                             expert_block / d(checked_mul(checked_mul(pp, etp), ep));
        r.params_other_shards = other;
        r.printout += fmtc("Number of parameters in other shards in billions: %.4f\n", other / 1e9);
    }

    const auto bytes_per_parameter = [&](std::int64_t dp, const char* field) {
        if (!a.use_distributed_optimizer) return 18.0;
        if (dp <= 0)
            fail(ErrorCode::InvalidArgument, field,
                 std::string(field) + " is 0: world_size must be at least expert_tensor_parallel_size * expert_model_parallel_size * "
                                      "pipeline_model_parallel_size");
        return 6.0 + (12.0 / d(dp));
    };
    r.bytes_per_parameter = bytes_per_parameter(a.data_parallel_size, "data_parallel_size");
    r.expert_data_parallel_size = expert_dp;
    r.expert_bytes_per_parameter = bytes_per_parameter(expert_dp, "expert_data_parallel_size");
    return (tp_most + replicated_most) * r.bytes_per_parameter + expert_most * r.expert_bytes_per_parameter;
}

// The pipeline-schedule part shared by both activation formulas.
double pipeline_factor(const MegatronArgs& a, double act, MegatronMemoryReport& r) {
    const std::int64_t pp = a.pipeline_model_parallel_size;
    if (a.virtual_pipeline_model_parallel_size) {
        const double penalty = 1.0 + (d(pp - 1) / d(checked_mul(pp, *a.virtual_pipeline_model_parallel_size)));
        const auto in_flight = static_cast<std::int64_t>(std::ceil(penalty * d(pp)));
        r.interleaved_penalty = penalty;
        r.in_flight_microbatches = in_flight;
        r.printout += fmtc("Memory penalty from interleaved schedule: %.2f\n", penalty);
        r.printout += fmtc("Number of in-flight microbatches: %lld\n", static_cast<long long>(in_flight));
        act *= penalty;
    }
    if (!a.virtual_pipeline_model_parallel_size && pp > 1) {
        std::int64_t in_flight = pp;
        if (a.num_microbatches) {
            const double frac = d(*a.num_microbatches) / d(pp);
            act *= frac < 1.0 ? frac : 1.0;  // min(1, num_microbatches / pp)
            in_flight = std::min(*a.num_microbatches, pp);
        }
        r.in_flight_microbatches = in_flight;
        r.printout += fmtc("Number of in-flight microbatches: %lld\n", static_cast<long long>(in_flight));
    }
    return act;
}

// compute_activation_memory (sequence parallel + selective recompute; Table 2 of
// arXiv:2205.05198, first pipeline stage).
double activation_with_sp(const MegatronArgs& a, MegatronMemoryReport& r) {
    const std::int64_t s = a.seq_length, b = a.micro_batch_size, h = a.hidden_size, pp = a.pipeline_model_parallel_size;
    const std::int64_t sbh = checked_mul(checked_mul(s, b), h);
    double act = d(sbh) * (18.0 + (4.0 * (d(a.ffn_hidden_size) / d(h))));
    r.activation_per_layer_mb = act / kMegabyte / d(a.tensor_model_parallel_size);
    r.printout += fmtc("Activation memory footprint per transformer layer: %.1f MB\n", r.activation_per_layer_mb);
    act *= d(a.num_layers);
    act += d(checked_mul(checked_mul(checked_mul(8, s), b), pp));
    act += d(checked_mul(sbh, pp));
    act = pipeline_factor(a, act, r);
    if (pp == 1) act += d(checked_mul(sbh, 4)) * (1.0 + (d(a.padded_vocab_size) / d(h)));
    return act / d(a.tensor_model_parallel_size);
}

// compute_activation_memory_without_sp.
double activation_without_sp(const MegatronArgs& a, MegatronMemoryReport& r) {
    const std::int64_t s = a.seq_length, b = a.micro_batch_size, h = a.hidden_size, pp = a.pipeline_model_parallel_size;
    const std::int64_t sbh = checked_mul(checked_mul(s, b), h);
    const double per_layer = d(sbh) * (10.0 + (24.0 / d(a.tensor_model_parallel_size)));
    r.activation_per_layer_mb = per_layer / kMegabyte;
    r.printout += fmtc("Activation memory footprint per transformer layer (precise, without SP): %.1f MB\n", r.activation_per_layer_mb);
    double total = per_layer * d(a.num_layers);
    total += d(checked_mul(checked_mul(checked_mul(8, s), b), pp));
    total += d(checked_mul(sbh, pp));
    total = pipeline_factor(a, total, r);
    if (pp == 1) {
        double logits = d(checked_mul(checked_mul(s, b), a.padded_vocab_size));
        logits /= d(a.tensor_model_parallel_size);
        const double final_ln_output = d(sbh);
        total += (logits + final_ln_output) * 2.0;
    }
    total *= 1.05;
    return total;
}

// "num_layers=2, hidden_size=8, ...": the arguments a part of the report grows with.
std::string sizes_of(const MegatronArgs& a, bool activations) {
    std::string t = "num_layers=" + std::to_string(a.num_layers) + ", hidden_size=" + std::to_string(a.hidden_size);
    if (activations) {
        t += ", seq_length=" + std::to_string(a.seq_length) + ", micro_batch_size=" + std::to_string(a.micro_batch_size) +
             ", padded_vocab_size=" + std::to_string(a.padded_vocab_size);
    } else {
        t += ", ffn_hidden_size=" + std::to_string(a.ffn_hidden_size) + ", padded_vocab_size=" + std::to_string(a.padded_vocab_size);
        if (a.num_experts) t += ", num_experts=" + std::to_string(*a.num_experts) + ", moe_ffn_hidden_size=" + std::to_string(a.moe_ffn_hidden_size);
    }
    return t;
}

// A part of the report must be a byte count a 64-bit integer holds (the JSON
// answer writes it as one); beyond that the arguments are absurd.
void check_representable(double bytes, const MegatronArgs& a, bool activations, const char* part) {
    if (std::isfinite(bytes) && bytes >= 0 && bytes < 9.2e18) return;
    fail(ErrorCode::Overflow, activations ? "seq_length" : "hidden_size",
         std::string("Megatron arguments: the ") + part + " memory is too large to represent (over 2^63 bytes) with " + sizes_of(a, activations) +
             "; reduce " + (activations ? "seq_length, micro_batch_size or hidden_size" : "hidden_size, ffn_hidden_size, num_layers or padded_vocab_size"));
}

MegatronMemoryReport megatron_report_checked(const MegatronArgs& a);

MegatronMemoryReport megatron_report(const MegatronArgs& a) {
    try {
        return megatron_report_checked(a);
    } catch (const OverflowError& e) {
        // Checked integer arithmetic of the formulas: name the arguments.
        fail(ErrorCode::Overflow, "hidden_size",
             std::string("Megatron arguments: the sizes overflow 64-bit integers (") + e.what() + ") with " + sizes_of(a, true) +
                 (a.num_experts ? ", num_experts=" + std::to_string(*a.num_experts) : std::string()) +
                 "; reduce these arguments");
    }
}

MegatronMemoryReport megatron_report_checked(const MegatronArgs& a) {
    if (a.hybrid_model)
        fail(ErrorCode::Unsupported, "hybrid_layer_pattern",
             "Theoretical memory footprints not yet supported for hybrid Mamba-Transformer models.");
    validate(a);
    MegatronMemoryReport r;
    r.args = a;
    r.weight_and_optimizer_bytes = weight_and_optimizer(a, r);
    check_representable(r.weight_and_optimizer_bytes, a, false, "weight and optimizer");
    r.weight_and_optimizer_mb = r.weight_and_optimizer_bytes / kMegabyte;
    if (a.sequence_parallel && a.recompute_granularity == "selective") {
        r.activation_formula = "compute_activation_memory";
        r.printout += "compute_activation_memory with SP\n";
        r.activation_bytes = activation_with_sp(a, r);
    } else {
        r.activation_formula = "compute_activation_memory_without_sp";
        r.printout += "compute_activation_memory_without_sp\n";
        r.activation_bytes = activation_without_sp(a, r);
    }
    check_representable(r.activation_bytes, a, true, "activation");
    check_representable(r.weight_and_optimizer_bytes + r.activation_bytes, a, true, "total");
    r.activation_mb = r.activation_bytes / kMegabyte;
    r.total_mb = r.weight_and_optimizer_mb + r.activation_mb;
    r.total_bytes = r.weight_and_optimizer_bytes + r.activation_bytes;
    r.printout += fmtc("Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, total=%.2f MB\n\n",
                       r.weight_and_optimizer_mb, r.activation_mb, r.total_mb);
    return r;
}

// ---- JSON arguments

using json = nlohmann::json;

class ArgReader {
public:
    explicit ArgReader(const json& j) {
        if (!j.is_object()) fail(ErrorCode::ParseError, "", "Megatron arguments must be a JSON object of argument names");
        for (auto it = j.begin(); it != j.end(); ++it) {
            std::string k = it.key();
            while (!k.empty() && k.front() == '-') k.erase(k.begin());
            std::replace(k.begin(), k.end(), '-', '_');
            if (!values_.emplace(k, &it.value()).second)
                fail(ErrorCode::InvalidArgument, k, "argument " + k + " is given twice (as \"" + it.key() + "\" and another spelling)");
        }
    }
    // nullptr when absent or null (Python None).
    [[nodiscard]] const json* get(const std::string& k) const {
        auto it = values_.find(k);
        return it == values_.end() || it->second->is_null() ? nullptr : it->second;
    }
    [[nodiscard]] std::optional<std::int64_t> opt_int(const std::string& k) const {
        const json* v = get(k);
        if (!v) return std::nullopt;
        const std::int64_t most = limit_of(k);
        const auto too_large = [&]() {
            fail(ErrorCode::InvalidArgument, k,
                 "Megatron argument " + k + " must be at most " + std::to_string(most) + " (got " + v->dump() + "); " + limit_why(k) +
                     " (docs/limits.md)");
        };
        std::int64_t n = 0;
        if (v->is_number_unsigned()) {
            if (v->get<std::uint64_t>() > static_cast<std::uint64_t>(most)) too_large();
            n = static_cast<std::int64_t>(v->get<std::uint64_t>());
        } else if (v->is_number_integer()) {
            n = v->get<std::int64_t>();
        } else if (v->is_string()) {
            // "--num-layers 32" style dumps may keep numbers as strings.
            const std::string s = v->get<std::string>();
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
            if (ec == std::errc::result_out_of_range) too_large();
            if (s.empty() || ec != std::errc() || end != s.data() + s.size())
                fail(ErrorCode::InvalidArgument, k, "Megatron argument " + k + " must be an integer (got " + v->dump() + ")");
        } else {
            fail(ErrorCode::InvalidArgument, k, "Megatron argument " + k + " must be an integer (got " + v->dump() + ")");
        }
        if (n > most) too_large();
        return n;
    }
    // The largest value each integer argument may take (core/limits.hpp):
    // sizes of tensors' dimensions below 2^31, parallel sizes up to the GPU
    // limit, layers up to the layer limit.
    static std::int64_t limit_of(const std::string& k) {
        if (k == "num_layers" || k == "mtp_num_layers" || k == "num_layers_per_virtual_pipeline_stage" || k == "moe_layer_freq") return kMaxLayers;
        if (k == "world_size" || k == "gtp_weight_remat_size" || k == "num_virtual_stages_per_pipeline_rank" ||
            (k.size() > 14 && k.compare(k.size() - 14, 14, "_parallel_size") == 0))
            return kMaxGpus;
        if (k == "micro_batch_size") return kMaxBatch;
        if (k == "seq_length") return kMaxSeqTokens;
        if (k == "num_microbatches") return kMaxGradAccum;
        if (k == "global_batch_size") return std::int64_t(1) << 40;
        return std::int64_t(1) << 31;
    }
    static std::string limit_why(const std::string& k) {
        if (k == "micro_batch_size" || k == "num_microbatches") return "2^20: real values are at most a few thousand";
        if (k == "global_batch_size") return "2^40 sequences: far above any real global batch";
        if (k == "seq_length") return "2^24 tokens: the longest contexts in use are ~10^7";
        const std::int64_t most = limit_of(k);
        if (most == kMaxLayers) return "the deepest models in use have ~200 layers";
        if (most == kMaxGpus) return "2^20 GPUs: the largest clusters have ~10^5";
        return "tensor dimensions, vocabularies and counts are below 2^31";
    }
    [[nodiscard]] std::int64_t req_int(const std::string& k) const {
        auto v = opt_int(k);
        if (!v) fail(ErrorCode::InvalidArgument, k, "Megatron argument " + k + " is required");
        return *v;
    }
    [[nodiscard]] std::int64_t int_or(const std::string& k, std::int64_t def) const { return opt_int(k).value_or(def); }
    [[nodiscard]] bool flag(const std::string& k, bool def = false) const {
        const json* v = get(k);
        if (!v) return def;
        if (!v->is_boolean()) fail(ErrorCode::InvalidArgument, k, "Megatron argument " + k + " must be true or false (got " + v->dump() + ")");
        return v->get<bool>();
    }
    [[nodiscard]] std::optional<std::string> opt_string(const std::string& k) const {
        const json* v = get(k);
        if (!v) return std::nullopt;
        if (!v->is_string()) fail(ErrorCode::InvalidArgument, k, "Megatron argument " + k + " must be a string (got " + v->dump() + ")");
        return v->get<std::string>();
    }

private:
    std::map<std::string, const json*> values_;
};

std::int64_t positive(std::int64_t v, const char* k) {
    require_positive(v, k, k);
    return v;
}

MegatronArgs args_from_json(const json& j) {
    const ArgReader r(j);
    MegatronArgs a;
    a.hybrid_model = r.get("hybrid_layer_pattern") != nullptr || r.get("hybrid_override_pattern") != nullptr;
    a.num_layers = positive(r.req_int("num_layers"), "num_layers");
    a.hidden_size = positive(r.req_int("hidden_size"), "hidden_size");
    a.num_attention_heads = positive(r.req_int("num_attention_heads"), "num_attention_heads");
    a.seq_length = positive(r.req_int("seq_length"), "seq_length");
    a.micro_batch_size = positive(r.req_int("micro_batch_size"), "micro_batch_size");
    a.swiglu = r.flag("swiglu");
    if (auto f = r.opt_int("ffn_hidden_size")) {
        a.ffn_hidden_size = positive(*f, "ffn_hidden_size");
    } else if (a.swiglu) {
        // int((4 * hidden_size * 2 / 3) / 64) * 64
        a.ffn_hidden_size = static_cast<std::int64_t>((d(checked_mul(checked_mul(4, a.hidden_size), 2)) / 3.0) / 64.0) * 64;
    } else {
        a.ffn_hidden_size = checked_mul(4, a.hidden_size);
    }
    if (auto kv = r.opt_int("kv_channels")) {
        a.kv_channels = positive(*kv, "kv_channels");
    } else {
        if (a.hidden_size % a.num_attention_heads != 0)
            fail(ErrorCode::InvalidArgument, "kv_channels",
                 "kv_channels is not given and hidden_size is not divisible by num_attention_heads: give kv_channels");
        a.kv_channels = a.hidden_size / a.num_attention_heads;
    }
    a.group_query_attention = r.flag("group_query_attention");
    a.num_query_groups = positive(r.int_or("num_query_groups", a.num_attention_heads), "num_query_groups");

    a.tensor_model_parallel_size = positive(r.int_or("tensor_model_parallel_size", 1), "tensor_model_parallel_size");
    a.pipeline_model_parallel_size = positive(r.int_or("pipeline_model_parallel_size", 1), "pipeline_model_parallel_size");
    a.context_parallel_size = positive(r.int_or("context_parallel_size", 1), "context_parallel_size");
    const std::int64_t gtp = positive(r.int_or("gtp_weight_remat_size", 1), "gtp_weight_remat_size");
    const std::int64_t model_size =
        checked_mul(checked_mul(checked_mul(a.tensor_model_parallel_size, a.pipeline_model_parallel_size), a.context_parallel_size), gtp);
    const auto ws = r.opt_int("world_size");
    const auto dp = r.opt_int("data_parallel_size");
    if (ws) {
        a.world_size = positive(*ws, "world_size");
        a.data_parallel_size = a.world_size / model_size;
        if (a.data_parallel_size < 1)
            fail(ErrorCode::InvalidArgument, "world_size",
                 "world_size " + std::to_string(a.world_size) + " is smaller than tensor * pipeline * context parallel size " +
                     std::to_string(model_size));
        if (dp && *dp != a.data_parallel_size)
            fail(ErrorCode::InvalidArgument, "data_parallel_size",
                 "data_parallel_size " + std::to_string(*dp) + " disagrees with world_size // (tp * pp * cp) = " +
                     std::to_string(a.data_parallel_size));
    } else {
        a.data_parallel_size = positive(dp.value_or(1), "data_parallel_size");
        a.world_size = checked_mul(a.data_parallel_size, model_size);
    }

    if (auto pv = r.opt_int("padded_vocab_size")) {
        a.padded_vocab_size = positive(*pv, "padded_vocab_size");
    } else if (auto v = r.opt_int("vocab_size")) {
        const std::int64_t div = positive(r.int_or("make_vocab_size_divisible_by", 128), "make_vocab_size_divisible_by");
        a.padded_vocab_size = megatron_padded_vocab_size(positive(*v, "vocab_size"), div, a.tensor_model_parallel_size);
    } else {
        fail(ErrorCode::InvalidArgument, "padded_vocab_size",
             "Megatron argument padded_vocab_size (or vocab_size, padded to make_vocab_size_divisible_by * tp) is required");
    }

    // Virtual pipeline size as Megatron's validate_args derives it.
    const auto per_vstage = r.opt_int("num_layers_per_virtual_pipeline_stage");
    const auto vstages = r.opt_int("num_virtual_stages_per_pipeline_rank");
    const auto vpp = r.opt_int("virtual_pipeline_model_parallel_size");
    if (per_vstage && vstages)
        fail(ErrorCode::InvalidArgument, "num_virtual_stages_per_pipeline_rank",
             "give only one of num_layers_per_virtual_pipeline_stage and num_virtual_stages_per_pipeline_rank");
    if (per_vstage) {
        positive(*per_vstage, "num_layers_per_virtual_pipeline_stage");
        std::int64_t layers = a.num_layers;
        if (r.flag("account_for_embedding_in_pipeline_split")) ++layers;
        if (r.flag("account_for_loss_in_pipeline_split")) ++layers;
        if (layers % a.pipeline_model_parallel_size != 0)
            fail(ErrorCode::InvalidArgument, "num_layers", "number of layers of the model must be divisible by pipeline model parallel size");
        const std::int64_t per_stage = layers / a.pipeline_model_parallel_size;
        if (per_stage % *per_vstage != 0)
            fail(ErrorCode::InvalidArgument, "num_layers_per_virtual_pipeline_stage",
                 "number of layers per pipeline stage must be divisible by number of layers per virtual pipeline stage");
        a.virtual_pipeline_model_parallel_size = per_stage / *per_vstage;
    } else if (vstages) {
        a.virtual_pipeline_model_parallel_size = positive(*vstages, "num_virtual_stages_per_pipeline_rank");
    } else if (vpp) {
        // A dump of already-processed args carries the derived size itself.
        a.virtual_pipeline_model_parallel_size = positive(*vpp, "virtual_pipeline_model_parallel_size");
    }
    if (a.virtual_pipeline_model_parallel_size == 1) a.virtual_pipeline_model_parallel_size.reset();

    // tp == 1 disables sequence parallelism.
    a.sequence_parallel = r.flag("sequence_parallel") && a.tensor_model_parallel_size > 1;
    if (auto g = r.opt_string("recompute_granularity")) a.recompute_granularity = *g;
    if (r.flag("recompute_activations")) a.recompute_granularity = "selective";
    a.use_distributed_optimizer = r.flag("use_distributed_optimizer");
    a.untie_embeddings_and_output_weights = r.flag("untie_embeddings_and_output_weights");
    a.normalization = r.opt_string("normalization").value_or("LayerNorm");
    a.add_bias_linear = r.flag("add_bias_linear", true);
    if (r.flag("disable_bias_linear")) a.add_bias_linear = false;

    a.num_experts = r.opt_int("num_experts");
    a.moe_ffn_hidden_size = r.int_or("moe_ffn_hidden_size", a.ffn_hidden_size);
    a.moe_router_topk = r.int_or("moe_router_topk", 2);
    a.moe_shared_expert_intermediate_size = r.opt_int("moe_shared_expert_intermediate_size");
    a.moe_shared_expert_gate = r.flag("moe_shared_expert_gate");
    if (const json* f = r.get("moe_layer_freq")) {
        json v = *f;
        if (v.is_string()) {
            const std::string s = v.get<std::string>();
            if (s.find('[') == std::string::npos) {
                v = r.opt_int("moe_layer_freq").value_or(0);
            } else {
                check_json_depth(s, "moe_layer_freq");
                v = json::parse(s, nullptr, false);
                if (v.is_discarded())
                    fail(ErrorCode::InvalidArgument, "moe_layer_freq",
                         "moe_layer_freq pattern \"" + s + "\" is a Python expression: give it as a JSON list of 0/1, e.g. [1,0,1,0]");
            }
        }
        if (v.is_number_integer()) {
            if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxLayers) : v.get<std::int64_t>() > kMaxLayers)
                fail(ErrorCode::InvalidArgument, "moe_layer_freq",
                     "moe_layer_freq must be at most " + std::to_string(kMaxLayers) + " (got " + v.dump() + "); the deepest models in use have ~200 layers");
            a.moe_layer_freq = v.get<std::int64_t>();
        } else if (v.is_array()) {
            if (v.size() > static_cast<std::size_t>(kMaxLayers))
                fail(ErrorCode::InvalidArgument, "moe_layer_freq",
                     "moe_layer_freq lists " + std::to_string(v.size()) + " layers; at most " + std::to_string(kMaxLayers) + " (the deepest models in use have ~200 layers)");
            for (const auto& e : v) {
                if (!e.is_number_integer()) fail(ErrorCode::InvalidArgument, "moe_layer_freq", "moe_layer_freq list entries must be 0 or 1");
                a.moe_layer_pattern.push_back(e.get<std::int64_t>());
            }
        } else {
            fail(ErrorCode::InvalidArgument, "moe_layer_freq", "moe_layer_freq must be an integer or a list of 0/1 (got " + f->dump() + ")");
        }
    }
    a.moe_latent_size = r.opt_int("moe_latent_size");
    a.expert_model_parallel_size = positive(r.int_or("expert_model_parallel_size", 1), "expert_model_parallel_size");
    a.expert_tensor_parallel_size =
        positive(r.int_or("expert_tensor_parallel_size", a.tensor_model_parallel_size), "expert_tensor_parallel_size");
    a.mtp_num_layers = r.opt_int("mtp_num_layers");

    a.multi_latent_attention = r.flag("multi_latent_attention");
    a.q_lora_rank = r.opt_int("q_lora_rank");
    a.kv_lora_rank = r.int_or("kv_lora_rank", 32);
    a.qk_head_dim = r.int_or("qk_head_dim", 128);
    a.qk_pos_emb_head_dim = r.int_or("qk_pos_emb_head_dim", 64);
    a.v_head_dim = r.int_or("v_head_dim", 128);

    if (auto n = r.opt_int("num_microbatches")) {
        a.num_microbatches = positive(*n, "num_microbatches");
    } else if (auto gbs = r.opt_int("global_batch_size")) {
        // get_num_microbatches() of the constant calculator.
        const std::int64_t per = checked_mul(a.micro_batch_size, a.data_parallel_size);
        if (positive(*gbs, "global_batch_size") % per != 0)
            fail(ErrorCode::InvalidArgument, "global_batch_size",
                 "global_batch_size " + std::to_string(*gbs) + " is not divisible by micro_batch_size * data_parallel_size = " +
                     std::to_string(per));
        a.num_microbatches = *gbs / per;
    }
    validate(a);
    return a;
}

}  // namespace

Result<MegatronMemoryReport> megatron_theoretical_memory(const MegatronArgs& a) {
    return capture([&] { return megatron_report(a); });
}

std::int64_t megatron_padded_vocab_size(std::int64_t vocab_size, std::int64_t make_vocab_size_divisible_by,
                                        std::int64_t tensor_model_parallel_size) {
    const std::int64_t multiple = checked_mul(make_vocab_size_divisible_by, tensor_model_parallel_size);
    if (multiple <= 0) return vocab_size;
    return checked_mul((vocab_size + multiple - 1) / multiple, multiple);
}

Result<MegatronArgs> megatron_args_from_json(const nlohmann::json& j) {
    return capture([&] { return args_from_json(j); });
}

Result<MegatronMemoryReport> megatron_report_from_file(const std::string& path) {
    // A regular file of at most kMaxConfigBytes, nested no deeper than
    // kMaxJsonDepth: a folder, FIFO or device is refused before it is opened.
    auto j = capture([&]() -> json {
        const std::string text = read_input_file(path, kMaxConfigBytes, "Megatron args JSON");
        check_json_depth(text, path);
        return json::parse(text, nullptr, false);
    });
    if (!j) return j.error();
    if (j->is_discarded()) return Error{ErrorCode::ParseError, path + ": not valid JSON; give the arguments as a JSON object (docs/compat.md)", path};
    auto a = megatron_args_from_json(*j);
    if (!a) {
        Error e = a.error();
        e.message = path + ": " + e.message;
        return e;
    }
    auto r = megatron_theoretical_memory(*a);
    if (!r) {
        Error e = r.error();
        e.message = path + ": " + e.message;
        return e;
    }
    return r;
}

}  // namespace gpumem
