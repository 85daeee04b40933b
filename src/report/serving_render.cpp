#include "gpumem/report/serving_render.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

nlohmann::json per_gpu_json(const ServingPerGpu& p) {
    nlohmann::json j = {{"weights", p.weights.count()},       {"activation_peak", p.activation_peak.count()}, {"non_torch", p.non_torch.count()},
            {"kv_cache", p.kv_cache.count()},     {"request_table", p.request_table.count()}, {"cuda_graph", p.cuda_graph.count()},           {"cuda_context", p.cuda_context.count()},
            {"total_device", p.total_device.count()}, {"requested", p.requested.count()},         {"capacity", p.capacity.count()},
            {"fits", p.fits}};
    if (!p.device.empty()) j["device"] = p.device;
    return j;
}

nlohmann::json host_json(const std::optional<ServingHost>& h) {
    if (!h) return nullptr;
    return {{"model_mapped", h->model_mapped.count()}, {"model", h->model.count()}, {"kv_cache", h->kv_cache.count()},
            {"compute", h->compute.count()},           {"output", h->output.count()}, {"total", h->total.count()}};
}

nlohmann::json llamacpp_json(const std::optional<LlamaCppDetail>& d) {
    if (!d) return nullptr;
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [t, n] : d->tensor_types) types[t] = n;
    return {{"n_layer", d->n_layer},       {"n_gpu_layers", d->n_gpu_layers}, {"n_ctx", d->n_ctx},         {"n_ctx_seq", d->n_ctx_seq},
            {"n_ubatch", d->n_ubatch},     {"n_parallel", d->n_parallel},     {"kv_unified", d->kv_unified}, {"flash_attn", d->flash_attn},
            {"mmap", d->mmap},             {"type_k", d->type_k},             {"type_v", d->type_v},         {"file_type", d->file_type},
            {"tensor_types", types},       {"fit_gpu_layers", d->fit_gpu_layers}, {"fit_ctx_size", d->fit_ctx_size}};
}

std::string mib(Bytes b) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%8.2f MiB", static_cast<double>(b.count()) / 1048576.0);
    return buf;
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

namespace {

// Ranges from the measured error of this engine's logged figures (memory/uncertainty.hpp).
nlohmann::json uncertainty_json(const ServingUncertainty& u) {
    return {{"kv_band", {{"path", u.kv_path}, {"rows", u.kv_rows}, {"ratio_low", u.kv_ratio_low}, {"ratio_high", u.kv_ratio_high}}},
            {"kv_bytes_band", {{"path", u.kv_bytes_path}, {"ratio_low", u.kv_bytes_ratio_low}, {"ratio_high", u.kv_bytes_ratio_high}}},
            {"weights_band", {{"path", u.weights_path}, {"rows", u.weights_rows}, {"ratio_low", u.weights_ratio_low}, {"ratio_high", u.weights_ratio_high}}},
            {"kv_cache", {{"low", u.kv_cache_low.count()}, {"high", u.kv_cache_high.count()}}},
            {"kv_cache_tokens", {{"low", u.kv_tokens_low}, {"high", u.kv_tokens_high}}},
            {"max_concurrency", {{"low", u.concurrency_low}, {"high", u.concurrency_high}}},
            {"weights", {{"low", u.weights_low.count()}, {"high", u.weights_high.count()}}}};
}

// The ranges' line for people.
std::string serving_range_line(const ServingResult& r) {
    const ServingUncertainty& u = r.uncertainty;
    const bool llama = r.engine == "llama.cpp";
    std::string out = "range: ";
    if (llama)
        out += "KV buffer " + format_bytes(u.kv_cache_low) + " - " + format_bytes(u.kv_cache_high);
    else
        out += "KV cache " + with_commas(u.kv_tokens_low) + " - " + with_commas(u.kv_tokens_high) + " tokens, " + fixed(u.concurrency_low, 2) + " - " +
               fixed(u.concurrency_high, 2) + "x";
    out += "; weights " + format_bytes(u.weights_low) + " - " + format_bytes(u.weights_high) + " per rank (measured/predicted " +
           fixed(u.kv_ratio_low, 3) + "-" + fixed(u.kv_ratio_high, 3) + " over " + std::to_string(u.kv_rows) + " " + r.engine + " logs, band " + u.kv_path +
           "; scripts/error_bands.py)\n";
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
            {"host_ram", r.host ? nlohmann::json(r.host->total.count()) : nlohmann::json(nullptr)},
            {"host", host_json(r.host)},
            {"llamacpp", llamacpp_json(r.llamacpp)},
            {"fit_max_model_len", r.fit_max_model_len},
            {"error", r.error},
            {"assumptions", r.assumptions},
            {"uncertainty", uncertainty_json(r.uncertainty)}};
}

namespace {

// The throughput roofline per concurrency level ("" when there is none).
std::string throughput_text(const ServingResult& r, Format f) {
    if (r.throughput.empty()) return "";
    Table th;
    th.header = {"concurrency", "time to first token", "decode tokens/s", "per request", "bound"};
    th.right_align = {true, true, true, true, false};
    for (const auto& x : r.throughput)
        th.rows.push_back({std::to_string(x.concurrency), fixed(x.ttft_seconds * 1000, 0) + " ms", fixed(x.decode_tokens_per_second, 0),
                           fixed(x.tokens_per_second_per_request, 1), x.memory_bound ? "bandwidth" : "compute"});
    return "\nthroughput (roofline) for requests of " + with_commas(r.request_len) + " tokens, " + with_commas(r.output_len) + " generated:\n" + render_table(th, f);
}

// llama.cpp: its own log lines, per device and on the host.
std::string render_llamacpp(const ServingResult& r, Format f) {
    const LlamaCppDetail& d = *r.llamacpp;
    Table t;
    t.header = {"buffer", "bytes", "size", "detail"};
    t.right_align = {false, true, true, false};
    const auto add = [&](const std::string& k, Bytes b, const std::string& detail) { t.rows.push_back({k, std::to_string(b.count()), format_bytes(b), detail}); };
    for (const auto& p : r.per_rank) {
        add(p.device + " model", p.weights, "\"" + p.device + " model buffer size\"");
        add(p.device + " KV", p.kv_cache, "\"" + p.device + " KV buffer size\"");
        add(p.device + " compute", p.activation_peak, "\"" + p.device + " compute buffer size\" (estimate)");
        add(p.device + " context", p.cuda_context, "CUDA context (not in llama.cpp's lines)");
        add(p.device + " total", p.total_device, std::string(p.fits ? "fits " : "DOES NOT FIT ") + format_bytes(p.capacity));
    }
    const ServingHost& h = *r.host;
    add("host CPU_Mapped", h.model_mapped, "mmap'd span of the CPU tensors");
    if (h.model > Bytes(0)) add("host CPU model", h.model, "--no-mmap: CPU weights in RAM");
    add("host KV", h.kv_cache, "KV layers on the CPU");
    add("host compute", h.compute, "\"CUDA_Host compute buffer size\" / CPU (estimate)");
    add("host output", h.output, "logits output buffer");
    add("host total", h.total, "host RAM");
    if (f == Format::Csv || f == Format::Markdown) return render_table(t, f);
    std::string out = r.model_name + " (" + d.file_type + ") served by llama.cpp " + r.engine_version + " on " +
                      std::to_string(r.per_rank.size()) + " x " + r.gpu + "\n";
    out += r.error.empty() ? "LOADS: " : "DOES NOT LOAD: ";
    out += "offloaded " + std::to_string(d.n_gpu_layers) + "/" + std::to_string(d.n_layer + 1) + " layers; n_ctx " + with_commas(d.n_ctx) +
           " cells (" + std::to_string(d.n_parallel) + " slot" + (d.n_parallel > 1 ? "s" : "") + ", " + with_commas(d.n_ctx_seq) + " tokens each" +
           (d.kv_unified && d.n_parallel > 1 ? ", shared" : "") + "); K " + d.type_k + ", V " + d.type_v + "; flash attention " + (d.flash_attn ? "on" : "off") + "\n";
    out += "fits: -ngl up to " + (d.fit_gpu_layers < 0 ? std::string("none") : std::to_string(d.fit_gpu_layers)) + " with these settings; -c up to " +
           with_commas(d.fit_ctx_size) + " with -ngl " + std::to_string(d.n_gpu_layers) + "\n";
    out += serving_range_line(r);
    if (!r.error.empty()) out += "llama.cpp would stop with: " + r.error + "\n";
    std::string types;
    for (const auto& [ty, n] : d.tensor_types) types += (types.empty() ? "" : ", ") + ty + " " + std::to_string(n);
    out += "tensor types: " + types + "\n\nas llama.cpp logs it:\n";
    for (const auto& p : r.per_rank) out += "  load_tensors: " + p.device + " model buffer size = " + mib(p.weights) + "\n";
    if (h.model_mapped > Bytes(0)) out += "  load_tensors: CPU_Mapped model buffer size = " + mib(h.model_mapped) + "\n";
    for (const auto& p : r.per_rank) out += "  llama_kv_cache: " + p.device + " KV buffer size = " + mib(p.kv_cache) + "\n";
    if (h.kv_cache > Bytes(0)) out += "  llama_kv_cache: CPU KV buffer size = " + mib(h.kv_cache) + "\n";
    for (const auto& p : r.per_rank) out += "  sched_reserve: " + p.device + " compute buffer size = " + mib(p.activation_peak) + " (estimate)\n";
    out += "  sched_reserve: " + std::string(r.per_rank.empty() || r.per_rank.front().weights <= Bytes(0) ? "CPU" : "CUDA_Host") +
           " compute buffer size = " + mib(h.compute) + " (estimate)\n";
    out += "\n" + render_table(t, f);
    out += throughput_text(r, f);
    out += "\nassumptions:\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    return out;
}

}  // namespace

namespace {

// gpumem fit --engine: what fits that engine on this GPU.
std::string render_serving_fit(const ServingResult& r, Format f) {
    Table t;
    t.header = {"what fits", "value", "detail"};
    t.right_align = {false, true, false};
    if (r.llamacpp) {
        const LlamaCppDetail& d = *r.llamacpp;
        t.rows.push_back({"n_gpu_layers", std::to_string(d.fit_gpu_layers), "the most -ngl with -c " + with_commas(d.n_ctx) + " (of " + std::to_string(d.n_layer + 1) + " layers)"});
        t.rows.push_back({"ctx_size", std::to_string(d.fit_ctx_size), "the longest -c (256-token steps) with -ngl " + std::to_string(d.n_gpu_layers)});
    } else {
        t.rows.push_back({"max_model_len", std::to_string(r.fit_max_model_len), "the longest request the KV cache admits (up to the model's maximum)"});
    }
    t.rows.push_back({"concurrency", fixed(r.concurrency_at_request_len, 2), "requests of " + with_commas(r.request_len) + " tokens at once"});
    t.rows.push_back({"kv_cache_tokens", std::to_string(r.kv_cache_tokens), "the KV cache's tokens with these settings"});
    if (f == Format::Csv || f == Format::Markdown) return render_table(t, f);
    std::string out = "what fits " + r.model_name + " served by " + r.engine + " " + r.engine_version + " on " + r.gpu +
                      (r.error.empty() ? "" : " (as given it does not start: " + r.error + ")") + "\n\n" + render_table(t, f);
    out += "\nassumptions:\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    return out;
}

}  // namespace

std::string render_serving(const ServingResult& r, Format f) {
    if (f == Format::Json) return serving_to_json(r).dump(2) + "\n";
    if (r.fit_view) return render_serving_fit(r, f);
    if (r.llamacpp && r.host) return render_llamacpp(r, f);
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
    if (r.engine == "trtllm")
        out += "Allocated " + fixed(static_cast<double>(p.kv_cache.count()) / 1073741824.0, 2) + " GiB for max tokens in paged KV cache (" + with_commas(r.kv_cache_tokens) +
               "); " + with_commas(r.kv_cache_blocks) + " blocks of " + std::to_string(r.block_size) + " tokens; requests of " + with_commas(r.max_model_len) +
               " tokens at once: " + fixed(r.max_concurrency, 2) + "x\n";
    else if (r.engine == "tgi")
        out += "Setting max batch total tokens to " + with_commas(r.kv_cache_tokens) + "; max_total_tokens " + with_commas(r.max_model_len) +
               "; requests of that length at once: " + fixed(r.max_concurrency, 2) + "x\n";
    else if (sglang)
        out += "KV Cache is allocated. #tokens: " + with_commas(r.kv_cache_tokens) + "; max_running_requests " + std::to_string(r.max_num_seqs) + "; requests of " +
               with_commas(r.max_model_len) + " tokens (context_len) at once: " + fixed(r.max_concurrency, 2) + "x\n";
    else
        out += "GPU KV cache size: " + with_commas(r.kv_cache_tokens) + " tokens; maximum concurrency for " + with_commas(r.max_model_len) +
               " tokens per request: " + fixed(r.max_concurrency, 2) + "x (" + with_commas(r.kv_cache_blocks) + " blocks of " + std::to_string(r.block_size) + ")\n";
    out += serving_range_line(r);
    if (r.request_len != r.max_model_len)
        out += "requests of " + with_commas(r.request_len) + " tokens at once: " + fixed(r.concurrency_at_request_len, 2) + "x\n";
    if (!r.error.empty()) out += r.engine + " would stop with: " + r.error + "\n";
    if (r.host && r.host->total > Bytes(0)) {
        std::string parts;
        if (r.host->model > Bytes(0)) parts = format_bytes(r.host->model) + " offloaded weights";
        if (r.host->kv_cache > Bytes(0)) parts += (parts.empty() ? "" : ", ") + format_bytes(r.host->kv_cache) + " KV swap space";
        out += "host RAM (pinned, all ranks): " + format_bytes(r.host->total) + " (" + parts + ")\n";
    }
    out += "\n" + render_table(t, f);
    out += throughput_text(r, f);
    out += "\nassumptions:\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    return out;
}

}  // namespace gpumem
