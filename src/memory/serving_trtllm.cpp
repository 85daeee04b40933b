// TensorRT-LLM's start-up memory, PyTorch backend (gpumem/memory/serving.hpp; docs/research/trtllm.md).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/paged_kv.hpp"
#include "gpumem/memory/parallel.hpp"
#include "serving_internal.hpp"

namespace gpumem {

namespace serving_detail {

using engine_args::check;

// ---- TensorRT-LLM, PyTorch backend (docs/research/trtllm.md; 1.x,
// tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator) -----------------

// The transient activation of one max_num_tokens prefill, as NVIDIA's
// aiconfigurator tabulates it (ai-dynamo/aiconfigurator @095f58a51c4c
// backends/base_backend.py _get_memory_usage): 2 x tokens x heads x head_dim
// x c bytes, c = 11, 6.5, 5 for tp 1, 2, >= 4 (MoE: 22, 13, 10); at least 70 MiB.
Bytes trtllm_activation(const TransformerDims& d, std::int64_t tokens, std::int64_t tp) {
    const bool moe = d.experts > 0;
    const double c = tp >= 4 ? (moe ? 10.0 : 5.0) : tp == 2 ? (moe ? 13.0 : 6.5) : (moe ? 22.0 : 11.0);
    const double b = 2.0 * static_cast<double>(tokens) * static_cast<double>(d.heads * d.head_dim) * c;
    return max(Bytes(static_cast<std::int64_t>(b)), MiB(70));
}

ServingResult trtllm_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "TensorRT-LLM");
    ServingResult out;
    const Served sv = served_basics(g, job, Engine::TRTLLM, out);
    const std::string version = o.engine_version.value_or("1.2");
    check(version == "1.2" || version == "1.1" || version == "1.3", "engine-version",
          "TensorRT-LLM " + version + " is not modelled: gpumem serving follows the PyTorch backend of TensorRT-LLM 1.1-1.3 (--engine-version 1.2, the default); "
          "TensorRT engines' memory is fixed by their build");
    out.engine_version = version + " (PyTorch backend)";
    check(!o.gpu_memory_utilization && !o.mem_fraction_static && !o.cuda_memory_fraction, "engine",
          "TensorRT-LLM's KV share is --free-gpu-memory-fraction (kv_cache_free_gpu_memory_fraction), of the memory free after profiling");
    const std::int64_t tp = sv.tp, pp = sv.pp;
    const double f = o.free_gpu_memory_fraction.value_or(0.9);
    check(f > 0.0 && f <= 1.0, "free-gpu-memory-fraction", "--free-gpu-memory-fraction must be in (0, 1]");
    out.block_size = o.block_size.value_or(d.latent_kv && sv.gpu.compute_capability == 90 ? 64 : 32);  // FlashMLA forces 64
    out.max_num_seqs = o.max_num_seqs.value_or(2048);
    out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(8192);
    out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
    check(out.max_model_len >= 1 && out.max_num_seqs >= 1 && out.max_num_batched_tokens >= 1 && out.block_size >= 1, "max-model-len",
          "max_seq_len, max_batch_size, max_num_tokens and tokens_per_block must be positive");
    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out, false);
    const Bytes nccl = tp_buffers(sv.gpu, tp, pp, nccl_comm);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    const Bytes act = trtllm_activation(d, std::min(out.max_num_batched_tokens, out.max_model_len), tp);
    // Runtime buffers, workspaces and the decode CUDA graphs captured before
    // profiling (34 sizes up to 128): 1.25 GiB, fitted to the two public logs
    // with full settings (docs/research/trtllm.md section 6) - an estimate.
    const Bytes runtime = o.enforce_eager ? GiB(1) : GiB(1) + MiB(256);
    std::vector<ServingPerGpu> ranks;
    std::int64_t tokens = -1;
    std::vector<Bytes> bpts;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        ServingPerGpu r;
        r.weights = par.stages[s].weights;
        r.cuda_context = context;
        r.non_torch = nccl;
        r.activation_peak = act;
        r.cuda_graph = runtime;
        r.capacity = sv.capacity;
        const Bytes used = r.cuda_context + r.non_torch + r.weights + r.activation_peak + r.cuda_graph;
        const double base = static_cast<double>(sv.capacity.count()) - static_cast<double>(used.count());
        r.requested = Bytes(static_cast<std::int64_t>(std::max(0.0, base) * f));
        const Bytes bpt = kv_token_bytes_per_layer(d, tp, sv.kv_dt) * par.stages[s].layers;
        bpts.push_back(bpt);
        std::int64_t t = base <= 0 ? 0 : r.requested.count() / bpt.count();
        if (o.max_total_tokens) t = std::min(t, *o.max_total_tokens);
        tokens = tokens < 0 ? t : std::min(tokens, t);  // the minimum over ranks
        ranks.push_back(r);
    }
    const std::int64_t blocks = std::max<std::int64_t>(0, tokens) / out.block_size;  // int(max_tokens // tokens_per_block)
    out.kv_cache_blocks = blocks;
    out.kv_cache_tokens = blocks * out.block_size;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].kv_cache = bpts[s] * out.kv_cache_tokens;
        ranks[s].total_device = ranks[s].cuda_context + ranks[s].non_torch + ranks[s].weights + ranks[s].cuda_graph + ranks[s].kv_cache;
    }
    // max_seq_len beyond the pool is cut to it ("Adjusted max_seq_len to N").
    if (out.kv_cache_tokens <= 0) out.error = "Impossible to fit in memory: no KV-cache blocks are left after the weights and the profiling run";
    std::size_t worst = 0;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].fits = out.error.empty() && ranks[s].total_device <= sv.capacity;
        if (ranks[s].total_device > ranks[worst].total_device) worst = s;
    }
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    out.max_concurrency = static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.max_model_len);
    out.fit_max_model_len = std::min(out.kv_cache_tokens, out.max_model_len);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = std::min(static_cast<double>(out.max_num_seqs), static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.request_len));
    const std::string frac = fixed(f, 2);
    out.assumptions.push_back("TensorRT-LLM " + out.engine_version + ": KV = kv_cache_free_gpu_memory_fraction (" + frac +
                              ") x (total - the memory held at the profiling run's peak), in blocks of " + std::to_string(out.block_size) +
                              " tokens (_util.py KvCacheCreator; docs/research/trtllm.md)");
    out.assumptions.push_back("profiling run (an estimate): one prefill of " + std::to_string(std::min(out.max_num_batched_tokens, out.max_model_len)) +
                              " tokens by NVIDIA aiconfigurator's activation table (" + gib(act) + " GiB); runtime buffers, workspaces and decode CUDA graphs " +
                              gib(runtime) + " GiB (fitted to two public logs)");
    out.host = ServingHost{};
    out.assumptions.push_back("host RAM: none kept by the engine (KvCacheConfig host_cache_size is unset by default: no host KV offload); the processes' own memory is not counted");
    return out;
}


}  // namespace serving_detail

}  // namespace gpumem
