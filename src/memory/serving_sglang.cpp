// SGLang's start-up memory (gpumem/memory/serving.hpp; docs/research/sglang.md).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/paged_kv.hpp"
#include "gpumem/memory/parallel.hpp"
#include "serving_internal.hpp"

namespace gpumem {

std::int64_t sglang_kv_tokens(Bytes pre, Bytes after, double mem_fraction_static, Bytes cell, std::int64_t page_size,
                              std::optional<std::int64_t> max_total_tokens) {
    const double rest = static_cast<double>(after.count()) - static_cast<double>(pre.count()) * (1.0 - mem_fraction_static);
    if (rest <= 0 || cell <= Bytes(0)) return 0;
    std::int64_t tokens = static_cast<std::int64_t>(std::floor(rest / static_cast<double>(cell.count())));
    if (max_total_tokens) tokens = std::min(tokens, *max_total_tokens);
    const std::int64_t page = std::max<std::int64_t>(1, page_size);
    return tokens / page * page;
}

double sglang_default_mem_fraction(const std::string& version, std::int64_t gpu_mem_mib, std::int64_t tp, std::int64_t pp,
                                   std::int64_t chunked_prefill_size, std::int64_t cuda_graph_max_bs) {
    if (version == "0.4.6") {
        // v0.4.6.post1 server_args.py L221-238: a ladder by tp on GPUs up to
        // 80 GB, else 13 GiB reserved.
        if (gpu_mem_mib > 81920) return static_cast<double>(gpu_mem_mib - 13 * 1024) / static_cast<double>(gpu_mem_mib);
        return tp >= 16 ? 0.79 : tp >= 8 ? 0.81 : tp >= 4 ? 0.85 : tp >= 2 ? 0.87 : 0.88;
    }
    // v0.5.6 server_args.py L701-867: reserved MiB = 512 + 1.5 x max(chunked
    // prefill, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 GiB, at least 10 GiB
    // on GPUs above 60 GiB; fraction rounded to 3 decimals.
    double reserved = 512.0 + 1.5 * static_cast<double>(std::max<std::int64_t>(chunked_prefill_size, 2048)) + 2.0 * static_cast<double>(cuda_graph_max_bs) +
                      static_cast<double>(tp * pp) / 8.0 * 1024.0;
    if (gpu_mem_mib > 60 * 1024) reserved = std::max(reserved, 10240.0);
    return std::round((static_cast<double>(gpu_mem_mib) - reserved) / static_cast<double>(gpu_mem_mib) * 1000.0) / 1000.0;
}


namespace serving_detail {

using engine_args::check;

// SGLang (docs/research/sglang.md; v0.5.6 = 7ae368efde14): the KV pool is what
// is left of mem_fraction_static x the free memory before the weights load;
// the rest of that free memory is slack for the request table, CUDA graphs
// and activations.
ServingResult sglang_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "SGLang");
    ServingResult out;
    const Served sv = served_basics(g, job, o.engine.value_or(Engine::VLLM), out);
    const std::string version = o.engine_version.value_or("0.5.6");
    check(version == "0.5.6" || version == "0.4.6", "engine-version",
          "SGLang " + version + " is not modelled: gpumem serving knows SGLang 0.5.6 (the default) and 0.4.6 (their default fractions and sizes)");
    out.engine_version = version;
    const std::int64_t tp = sv.tp, pp = sv.pp;
    const Bytes capacity = sv.capacity;
    const std::int64_t smi = nvidia_smi_mib(sv.gpu, capacity);
    check(!o.gpu_memory_utilization, "gpu-memory-utilization", "--gpu-memory-utilization is vLLM's; SGLang's is --mem-fraction-static");
    // Defaults by GPU memory (server_args.py, v0.5.6 L725-807; v0.4.6 L241-272).
    const std::int64_t smi_gib = smi / 1024;
    const std::int64_t chunk_default = version == "0.4.6" ? (smi < 25000 ? 2048 : 8192)
                                                          : smi_gib < 35 ? 2048 : smi_gib < 60 ? 4096 : smi_gib < 160 ? 8192 : 16384;
    const std::int64_t graph_bs = version == "0.4.6" ? (smi < 25000 ? (tp < 4 ? 8 : 80) : smi > 81920 ? 256 : 160)
                                  : smi_gib < 20   ? 8
                                  : smi_gib < 35   ? (tp < 4 ? 24 : 80)
                                  : smi_gib < 60   ? (tp < 4 ? 32 : 160)
                                  : smi_gib < 160  ? (tp < 4 ? 256 : 512)
                                                   : 512;
    out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(chunk_default);
    out.block_size = o.block_size.value_or(1);
    out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
    check(out.max_model_len >= 1, "max-model-len", "--context-length must be a positive integer");
    check(out.block_size >= 1, "block-size", "--page-size must be a positive integer");
    const double mfs = o.mem_fraction_static.value_or(sglang_default_mem_fraction(version, smi, tp, pp, out.max_num_batched_tokens, graph_bs));
    check(mfs > 0.0 && mfs < 1.0, "mem-fraction-static", "--mem-fraction-static must be in (0, 1)");
    out.mem_fraction_static = mfs;

    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out);
    const Bytes nccl = tp_buffers(sv.gpu, tp, pp, nccl_comm);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    // Free memory before the weights load: what the context and the
    // communicators leave (SGLang takes the minimum over ranks).
    const Bytes pre = capacity > context + nccl ? capacity - context - nccl : Bytes(0);
    std::int64_t tokens = -1;
    std::vector<Bytes> cells;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        // One token's K and V on this rank over the stage's layers
        // (model_runner.py L1384-1437).
        const Bytes cell = kv_token_bytes_per_layer(d, tp, sv.kv_dt) * par.stages[s].layers;
        cells.push_back(cell);
        const Bytes after = pre > par.stages[s].weights ? pre - par.stages[s].weights : Bytes(0);
        const std::int64_t t = sglang_kv_tokens(pre, after, mfs, cell, out.block_size, o.max_total_tokens);
        tokens = tokens < 0 ? t : std::min(tokens, t);
    }
    tokens = std::max<std::int64_t>(0, tokens);
    // The request table (ReqToTokenPool: int32 [reqs, context + 4]), sized
    // after the KV pool from the slack (L1676-1685).
    const std::int64_t reqs = o.max_num_seqs.value_or(std::clamp<std::int64_t>(static_cast<std::int64_t>(
                                                                                    static_cast<double>(tokens) / static_cast<double>(out.max_model_len) * 512.0),
                                                                                2048, 4096));
    out.max_num_seqs = std::min(o.max_num_seqs.value_or(tokens / 2), reqs);
    const Bytes request_table = Bytes(checked_mul(checked_mul(reqs, out.max_model_len + 4), 4));
    const Bytes forward_peak = mlp_working_set(d, tp, sv.model_dt, out.max_num_batched_tokens);
    std::vector<ServingPerGpu> ranks;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        ServingPerGpu r;
        r.weights = par.stages[s].weights;
        r.non_torch = nccl;
        r.cuda_context = context;
        r.capacity = capacity;
        r.requested = Bytes(static_cast<std::int64_t>(static_cast<double>(pre.count()) * mfs));
        r.kv_cache = tokens > 0 ? Bytes(checked_mul(tokens + out.block_size, cells[s].count())) : Bytes(0);
        r.request_table = request_table;
        r.activation_peak = forward_peak;
        r.cuda_graph = o.enforce_eager ? Bytes(0) : mlp_working_set(d, tp, sv.model_dt, graph_bs);
        r.total_device = r.cuda_context + r.non_torch + r.weights + r.kv_cache + r.request_table + r.activation_peak + r.cuda_graph;
        ranks.push_back(r);
    }
    out.kv_cache_tokens = tokens;
    out.fit_max_model_len = g.max_positions > 0 ? std::min(tokens, g.max_positions) : tokens;
    out.kv_cache_blocks = tokens / out.block_size;
    out.max_concurrency = static_cast<double>(tokens) / static_cast<double>(out.max_model_len);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = static_cast<double>(tokens) / static_cast<double>(out.request_len);
    if (tokens <= 0) out.error = "Not enough memory. Please try to increase --mem-fraction-static.";
    std::size_t worst = 0;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].fits = out.error.empty() && ranks[s].total_device <= capacity;
        if (ranks[s].total_device > ranks[worst].total_device) worst = s;
    }
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    const std::string frac = fixed(mfs, 3);
    out.assumptions.push_back("SGLang " + version + ": KV pool = mem_fraction_static x free memory before the weights load - weights, in tokens of " +
                              std::to_string(cells.empty() ? 0 : cells.front().count()) + " bytes, rounded down to the page (" +
                              std::to_string(out.block_size) + "); the request table, CUDA graphs and activations use the rest (docs/research/sglang.md)");
    out.assumptions.push_back(std::string("mem_fraction_static ") + frac +
                              (o.mem_fraction_static ? "" : " (SGLang " + version + "'s default for " + std::to_string(smi) + " MiB, tp x pp " + std::to_string(tp * pp) + ")") +
                              ", chunked_prefill_size " + std::to_string(out.max_num_batched_tokens) + ", cuda_graph_max_bs " + std::to_string(graph_bs));
    out.assumptions.push_back("activations (an estimate): one chunk of " + std::to_string(out.max_num_batched_tokens) +
                              " tokens through one layer's MLP; CUDA graphs (an estimate): the largest captured batch's MLP working set");
    if (tp > 1) out.assumptions.push_back("tensor-parallel buffers outside PyTorch: as vLLM's (1.79 GiB per rank on H100-class GPUs, PR #10511), not measured for SGLang");
    out.host = ServingHost{};
    out.assumptions.push_back("host RAM: none kept by the engine (the hierarchical KV cache, --enable-hierarchical-cache, is off by default and not modelled); the processes' own memory is not counted");
    return out;
}

}  // namespace serving_detail

}  // namespace gpumem
