#include "gpumem/report/serving_render.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

nlohmann::json per_gpu_json(const ServingPerGpu& p) {
    return {{"weights", p.weights.count()},       {"activation_peak", p.activation_peak.count()}, {"non_torch", p.non_torch.count()},
            {"kv_cache", p.kv_cache.count()},     {"request_table", p.request_table.count()}, {"cuda_graph", p.cuda_graph.count()},           {"cuda_context", p.cuda_context.count()},
            {"total_device", p.total_device.count()}, {"requested", p.requested.count()},         {"capacity", p.capacity.count()},
            {"fits", p.fits}};
}

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

std::string with_commas(std::int64_t n) {
    std::string s = std::to_string(n), out;
    int k = 0;
    for (auto it = s.rbegin(); it != s.rend(); ++it) {
        if (k && k % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
        out.insert(out.begin(), *it);
        ++k;
    }
    return out;
}

}  // namespace

nlohmann::json serving_to_json(const ServingResult& r) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& p : r.per_rank) ranks.push_back(per_gpu_json(p));
    nlohmann::json throughput = nlohmann::json::array();
    for (const auto& t : r.throughput)
        throughput.push_back({{"concurrency", t.concurrency},
                              {"ttft_seconds", t.ttft_seconds},
                              {"decode_tokens_per_second", t.decode_tokens_per_second},
                              {"tokens_per_second_per_request", t.tokens_per_second_per_request},
                              {"memory_bound", t.memory_bound}});
    return {{"model", r.model_name},
            {"engine", r.engine},
            {"engine_version", r.engine_version},
            {"gpu", r.gpu},
            {"tp", r.tp},
            {"pp", r.pp},
            {"max_model_len", r.max_model_len},
            {"max_num_seqs", r.max_num_seqs},
            {"max_num_batched_tokens", r.max_num_batched_tokens},
            {"block_size", r.block_size},
            {"gpu_memory_utilization", r.gpu_memory_utilization},
            {"mem_fraction_static", r.mem_fraction_static},
            {"per_gpu", per_gpu_json(r.per_gpu)},
            {"per_rank", ranks},
            {"kv_cache_blocks", r.kv_cache_blocks},
            {"kv_cache_tokens", r.kv_cache_tokens},
            {"max_concurrency", r.max_concurrency},
            {"request_len", r.request_len},
            {"output_len", r.output_len},
            {"concurrency_at_request_len", r.concurrency_at_request_len},
            {"throughput", throughput},
            {"error", r.error},
            {"assumptions", r.assumptions}};
}

std::string render_serving(const ServingResult& r, Format f) {
    if (f == Format::Json) return serving_to_json(r).dump(2) + "\n";
    const ServingPerGpu& p = r.per_gpu;
    Table t;
    t.header = {"part", "bytes", "size", "detail"};
    t.right_align = {false, true, true, false};
    const auto add = [&](const std::string& k, Bytes b, const std::string& d) { t.rows.push_back({k, std::to_string(b.count()), format_bytes(b), d}); };
    const bool sglang = r.engine == "sglang";
    add("weights", p.weights, sglang ? "this rank's share (\"Load weight end ... mem usage\")" : "this rank's share (\"Model loading took\")");
    add("activation_peak", p.activation_peak, sglang ? "one prefill chunk (estimate)" : "the profile run's peak (estimate)");
    add("non_torch", p.non_torch, p.non_torch > Bytes(0) ? "NCCL and all-reduce buffers" : "-");
    add("kv_cache", p.kv_cache, sglang ? "\"KV Cache is allocated\" (K + V)" : "\"Available KV cache memory\"");
    if (sglang) add("request_table", p.request_table, "request-to-token table, from the slack");
    add("cuda_graph", p.cuda_graph, "captured after the KV cache (estimate)");
    add("cuda_context", p.cuda_context, "before the engine's budget");
    add("total_device", p.total_device, "nvidia-smi");
    add("requested", p.requested, sglang ? "mem_fraction_static x free memory before loading" : "gpu_memory_utilization x total");
    add("capacity", p.capacity, "the device's total as CUDA reports it");
    if (f == Format::Csv || f == Format::Markdown) return render_table(t, f);
    std::string out = r.model_name + " served by " + r.engine + " " + r.engine_version + " on " + r.gpu + (r.tp * r.pp > 1 ? " (tp " + std::to_string(r.tp) + ", pp " + std::to_string(r.pp) + ")" : "") + "\n";
    out += r.error.empty() ? "STARTS: " : "DOES NOT START: ";
    if (sglang)
        out += "KV Cache is allocated. #tokens: " + with_commas(r.kv_cache_tokens) + "; max_running_requests " + std::to_string(r.max_num_seqs) + "; requests of " +
               with_commas(r.max_model_len) + " tokens (context_len) at once: " + fixed(r.max_concurrency, 2) + "x\n";
    else
        out += "GPU KV cache size: " + with_commas(r.kv_cache_tokens) + " tokens; maximum concurrency for " + with_commas(r.max_model_len) +
               " tokens per request: " + fixed(r.max_concurrency, 2) + "x (" + with_commas(r.kv_cache_blocks) + " blocks of " + std::to_string(r.block_size) + ")\n";
    if (r.request_len != r.max_model_len)
        out += "requests of " + with_commas(r.request_len) + " tokens at once: " + fixed(r.concurrency_at_request_len, 2) + "x\n";
    if (!r.error.empty()) out += std::string(sglang ? "SGLang" : "vLLM") + " would stop with: " + r.error + "\n";
    out += "\n" + render_table(t, f);
    if (!r.throughput.empty()) {
        Table th;
        th.header = {"concurrency", "time to first token", "decode tokens/s", "per request", "bound"};
        th.right_align = {true, true, true, true, false};
        for (const auto& x : r.throughput)
            th.rows.push_back({std::to_string(x.concurrency), fixed(x.ttft_seconds * 1000, 0) + " ms", fixed(x.decode_tokens_per_second, 0),
                               fixed(x.tokens_per_second_per_request, 1), x.memory_bound ? "bandwidth" : "compute"});
        out += "\nthroughput (roofline) for requests of " + with_commas(r.request_len) + " tokens, " + with_commas(r.output_len) + " generated:\n" + render_table(th, f);
    }
    out += "\nassumptions:\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    return out;
}

}  // namespace gpumem
