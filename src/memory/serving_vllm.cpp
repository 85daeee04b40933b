// vLLM's start-up memory: V1 (0.19, the default) and the V0 engine
// (gpumem/memory/serving.hpp; docs/research/vllm.md, vllm_v0.md, vllm_hybrid.md).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/paged_kv.hpp"
#include "gpumem/memory/parallel.hpp"
#include "serving_internal.hpp"

namespace gpumem::serving_detail {

using engine_args::check;

ServingResult vllm_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    ServingResult out;
    const Served sv = served_basics(g, job, o.engine.value_or(Engine::VLLM), out);
    // V1 (0.19, the default) or the V0 engine (docs/research/vllm_v0.md):
    // 0.6.5 .. 0.10 with VLLM_USE_V1=0 budget u x total - (weights +
    // activation peak + non-torch growth); 0.6.4 also counts the context.
    const std::string ver = o.engine_version.value_or("0.19");
    const bool v0 = ver == "V0" || ver == "v0" || ver == "0.6.4" || ver == "0.6.5" || ver == "0.6.6" || ver.rfind("0.7", 0) == 0 ||
                    ver.rfind("0.8", 0) == 0 || ver.rfind("0.9", 0) == 0 || ver.rfind("0.10", 0) == 0;
    check(v0 || ver == "0.19" || ver == "v1" || ver == "V1", "engine-version",
          "vLLM " + ver + " is not modelled: gpumem serving knows vLLM 0.19 (V1, the default) and the V0 engine of 0.6.4 to 0.10 "
          "(--engine-version 0.6.4, 0.6.5, 0.6.6, 0.7, 0.8, 0.9, 0.10 or V0); before 0.6.4 the budget was measured differently");
    const bool v064 = ver == "0.6.4";
    check(!v0 || d.linear_layers.empty(), "engine-version",
          "vLLM's V0 engine does not serve linear-attention models (Qwen3-Next); use --engine-version 0.19 (V1)");
    out.engine_version = v0 ? ver + " (V0)" : "0.19 (V1)";
    check(!o.mem_fraction_static, "mem-fraction-static", "--mem-fraction-static is SGLang's; vLLM's is --gpu-memory-utilization");
    check(!o.cuda_memory_fraction, "cuda-memory-fraction", "--cuda-memory-fraction is TGI's; vLLM's is --gpu-memory-utilization");
    check(!o.free_gpu_memory_fraction, "free-gpu-memory-fraction", "--free-gpu-memory-fraction is TensorRT-LLM's; vLLM's is --gpu-memory-utilization");
    check(!o.max_total_tokens, "max-total-tokens", "--max-total-tokens is SGLang's; with vLLM use --kv-cache-memory or --gpu-memory-utilization");
    const std::int64_t tp = sv.tp, pp = sv.pp;
    const GpuSpec& gpu = sv.gpu;
    const Bytes capacity = sv.capacity;
    const double u = o.gpu_memory_utilization.value_or(0.9);
    check(u > 0.0 && u <= 1.0, "gpu-memory-utilization", "--gpu-memory-utilization must be in (0, 1] (vLLM's own range)");
    out.gpu_memory_utilization = u;
    // vLLM's batch defaults for `vllm serve` (EngineArgs.get_batch_defaults):
    // 8192 tokens / 1024 sequences on GPUs of at least 70 GiB other than
    // the A100, else 2048 / 256.
    const bool big = !v0 && capacity >= GiB(70) && gpu.name.find("A100") == std::string::npos;
    out.block_size = o.block_size.value_or(16);
    out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
    // V0 (config.py SchedulerConfig, arg_utils.py): 256 sequences; chunked
    // prefill only past 32768 tokens (2048 per step, 512 before 0.6.5),
    // else the whole max(max_model_len, 2048) in one step.
    const std::int64_t v0_tokens = out.max_model_len > 32768 ? (v064 ? 512 : 2048) : std::max<std::int64_t>(out.max_model_len, 2048);
    out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(v0 ? v0_tokens : big ? 8192 : 2048);
    out.max_num_seqs = o.max_num_seqs.value_or(big ? 1024 : 256);
    check(out.max_model_len >= 1, "max-model-len", "--max-model-len must be a positive integer");
    check(out.max_num_seqs >= 1, "max-num-seqs", "--max-num-seqs must be a positive integer");
    check(out.max_num_batched_tokens >= 1, "max-num-batched-tokens", "--max-num-batched-tokens must be a positive integer");
    const DType model_dt = sv.model_dt;
    out.assumptions.push_back("vLLM " + out.engine_version + ": budget = gpu_memory_utilization x total - (weights + profile-run peak + non-torch memory" +
                              (v064 ? " + the CUDA context" : "") + "), the rest is the paged KV cache; CUDA graphs are captured afterwards, outside the budget (" +
                              (v0 ? "docs/research/vllm_v0.md" : "docs/research/vllm.md") + ")");
    out.assumptions.push_back("max_num_batched_tokens " + std::to_string(out.max_num_batched_tokens) + ", max_num_seqs " + std::to_string(out.max_num_seqs) +
                              (o.max_num_seqs || o.max_num_batched_tokens ? "" : v0 ? " (V0's defaults)" : big ? " (vLLM's serve defaults on >= 70 GiB GPUs but A100)" : " (vLLM's serve defaults)") +
                              ", block_size " + std::to_string(out.block_size) + (o.block_size ? "" : " (vLLM's CUDA default)"));

    Bytes nccl_comm;
    const std::int64_t dp = o.data_parallel_size.value_or(1);
    check(dp >= 1, "data-parallel-size", "--data-parallel-size must be a positive integer");
    check(!o.enable_expert_parallel || d.experts > 0, "enable-expert-parallel", "--enable-expert-parallel needs a mixture-of-experts model");
    if (o.enable_expert_parallel)
        check(d.experts % (tp * dp) == 0, "enable-expert-parallel",
              "--enable-expert-parallel: the " + std::to_string(d.experts) + " experts do not split evenly over tp x dp = " + std::to_string(tp * dp) + " ranks");
    ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm, o.enable_expert_parallel ? dp : 1);
    if (dp > 1)
        out.assumptions.push_back("--data-parallel-size " + std::to_string(dp) + ": " + std::to_string(dp) + " engine replicas of tp " + std::to_string(tp) +
                                  (o.enable_expert_parallel ? ", the experts spread over all " + std::to_string(tp * dp) + " ranks" : ", each holding all the weights") +
                                  "; the KV cache figures are one replica's");
    adjust_served_weights(g, o, sv, par, out);
    // --cpu-offload-gb (model_executor/models/utils.py maybe_offload_to_cpu):
    // the decoder layers' parameters, one after another, move to pinned
    // host memory until X GiB per GPU are there (the last one may pass X).
    Bytes offloaded;
    if (o.cpu_offload_gb && *o.cpu_offload_gb > 0) {
        const Bytes x = Bytes(static_cast<std::int64_t>(std::ceil(*o.cpu_offload_gb * 1073741824.0)));
        for (auto& st : par.stages) {
            const Bytes off = std::min(x, st.weights);
            st.weights = st.weights - off;
            offloaded = std::max(offloaded, off);
        }
        out.assumptions.push_back("--cpu-offload-gb " + gib(x) + ": that much of each GPU's weights in pinned host memory (vLLM offloads whole tensors, so "
                                  "up to one more tensor), streamed to the GPU every step");
    }
    const Bytes nccl = tp_buffers(gpu, tp, pp, nccl_comm);
    const bool nvswitch_gen = gpu.arch == "hopper" || gpu.arch == "blackwell";
    if (tp > 1)
        out.assumptions.push_back(nvswitch_gen ? "tensor-parallel buffers outside PyTorch: 1.79 GiB per rank (measured on H100 at tp 2, vLLM PR #10511)"
                                               : "tensor-parallel buffers outside PyTorch: one NCCL communicator (not measured on this GPU)");

    // The profile run (gpu_model_runner.py profile_run / _dummy_run /
    // _dummy_sampler_run): max_num_batched_tokens tokens through the model
    // with attention skipped, then the sampler on min(max_num_seqs, tokens)
    // rows. Estimate: one layer's MLP working set (the residual and normed
    // hidden states, the gate/up projection and its activation) and the
    // sampler's logits in the model dtype, their fp32 copy and fp32
    // probabilities, held at once.
    const std::int64_t T = out.max_num_batched_tokens, R = std::min(out.max_num_seqs, T);
    Bytes forward_peak = mlp_working_set(d, tp, model_dt, T);
    Bytes sampler_peak = dtype_bytes(model_dt, checked_mul(R, d.vocab)) + dtype_bytes(DType::F32, checked_mul(2 * R, d.vocab));
    if (v0) {
        // V0's profile run (worker/model_runner.py profile_run): the MLP peak
        // holds 4 streams and 3 MLP-wide tensors per token (+1 stream for
        // tp's out-of-place all-reduce); the sampler's top-k/top-p sort holds
        // 39 bytes per logit with the final hidden states; the larger of the
        // two on the driver (a fit to 17 public logs, 2% mean error,
        // docs/research/vllm_v0.md section 5).
        const std::int64_t I = (d.intermediate + tp - 1) / tp;
        forward_peak = dtype_bytes(model_dt, checked_mul(T, 4 * d.hidden + 3 * I + (tp > 1 ? d.hidden : 0)));
        const Bytes sampler = Bytes(checked_mul(checked_mul(R, d.vocab), 39)) + dtype_bytes(model_dt, checked_mul(T, d.hidden));
        sampler_peak = sampler > forward_peak ? sampler - forward_peak : Bytes(0);  // the driver holds max(forward, sampler)
    }
    out.assumptions.push_back("profile-run peak (an estimate): " + std::to_string(T) + " tokens through one layer's MLP (" + gib(forward_peak) +
                              " GiB) and the sampler on " + std::to_string(R) + " rows of the " + std::to_string(d.vocab) + "-token vocabulary (" +
                              (v0 ? "V0: the larger of the two, 39 bytes a logit" : gib(sampler_peak) + " GiB: logits, their fp32 copy and fp32 probabilities") + ")");
    const Bytes requested = Bytes(static_cast<std::int64_t>(std::ceil(static_cast<double>(capacity.count()) * u)));

    PagedKvRequest kr;
    kr.tp = tp;
    kr.pp = pp;
    kr.block_size = out.block_size;
    kr.max_model_len = out.max_model_len;
    kr.kv_dtype = sv.kv_dt;
    kr.max_num_batched_tokens = out.max_num_batched_tokens;
    kr.state_dtype = kr.ssm_dtype = model_dt;  // mamba_cache_dtype / mamba_ssm_cache_dtype "auto"
    kr.prefix_caching = o.enable_prefix_caching;
    std::vector<ServingPerGpu> ranks;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        ServingPerGpu r;
        r.weights = par.stages[s].weights;
        const bool last = s + 1 == par.stages.size();
        r.activation_peak = forward_peak + (last ? sampler_peak : Bytes(0));
        r.non_torch = nccl;
        r.capacity = capacity;
        r.requested = requested;
        r.cuda_context = job.cuda_context.value_or(gpu.cuda_context);
        const Bytes non_kv = r.weights + r.activation_peak + r.non_torch + (v064 ? r.cuda_context : Bytes(0));
        r.kv_cache = o.kv_cache_memory ? *o.kv_cache_memory : requested > non_kv ? requested - non_kv : Bytes(0);
        kr.available.push_back(r.kv_cache);
        // CUDA graphs (an estimate): the pool holds the largest captured
        // batch's working set (capture sizes up to min(2 x max_num_seqs, 512,
        // max_num_batched_tokens)).
        const std::int64_t cg = std::min<std::int64_t>({2 * out.max_num_seqs, 512, T});
        r.cuda_graph = o.enforce_eager ? Bytes(0) : mlp_working_set(d, tp, model_dt, cg);
        r.total_device = r.cuda_context + (o.kv_cache_memory ? non_kv + r.kv_cache : requested) + r.cuda_graph;
        ranks.push_back(r);
    }
    if (o.kv_cache_memory) out.assumptions.push_back("--kv-cache-memory " + gib(*o.kv_cache_memory) + " GiB: the KV budget as given (gpu_memory_utilization ignored)");
    if (v0 || offloaded > Bytes(0)) {
        // V0's CPU swap space: --swap-space 4 GiB of pinned host memory per worker (cache_engine.py).
        ServingHost h;
        if (v0) h.kv_cache = GiB(4) * (tp * pp);
        h.model = offloaded * (tp * pp);
        h.total = h.kv_cache + h.model;
        out.host = h;
        if (v0) out.assumptions.push_back("host RAM: V0's swap space, 4 GiB pinned per worker (--swap-space default)");
    } else {
        out.assumptions.push_back("host RAM: vLLM V1 keeps no KV cache on the CPU (preempted requests are recomputed); the processes' own memory is not counted");
        ServingHost h;
        out.host = h;
    }
    if (o.enforce_eager) out.assumptions.push_back("--enforce-eager: no CUDA graphs");
    else out.assumptions.push_back("CUDA graphs (an estimate): the largest captured batch's MLP working set");
    TransformerDims dk = d;
    if (v0) dk.sliding_window = dk.attention_chunk = 0;  // V0 pages every layer in full (no hybrid grouping)
    const PagedKvResult kv = take(paged_kv_cache(dk, kr));
    if (kv.block_size != out.block_size) {
        out.assumptions.push_back("linear-attention layers: one state of " + std::to_string(kv.state_page.count()) + " B per layer and request (" +
                                  (o.enable_prefix_caching ? "two with prefix caching" : "prefix caching off, vLLM's default for such models") +
                                  "); attention blocks raised to " + std::to_string(kv.block_size) + " tokens so that one page holds it (vLLM's log: "
                                  "\"Setting attention block size to " + std::to_string(kv.block_size) + " tokens\")");
        out.block_size = kv.block_size;
    }
    out.kv_cache_blocks = kv.num_blocks;
    out.kv_cache_tokens = kv.kv_cache_tokens;
    out.fit_max_model_len = g.max_positions > 0 ? std::min(kv.kv_cache_tokens, g.max_positions) : kv.kv_cache_tokens;
    out.max_concurrency = v0 ? static_cast<double>(kv.kv_cache_tokens) / static_cast<double>(out.max_model_len) : kv.max_concurrency;  // V0: blocks x 16 / L
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    // Requests of another length: the count vLLM logs for max_model_len
    // (blocks / the blocks one request holds in every group), at request_len.
    if (out.request_len == out.max_model_len || v0) {
        out.concurrency_at_request_len = v0 ? static_cast<double>(kv.num_blocks) / static_cast<double>((out.request_len + out.block_size - 1) / out.block_size)
                                            : kv.max_concurrency;
    } else {
        PagedKvRequest at = kr;
        at.max_model_len = out.request_len;
        out.concurrency_at_request_len = take(paged_kv_cache(dk, at)).max_concurrency;
    }
    // The most constrained rank (fewest blocks) is the answer.
    std::size_t worst = 0;
    for (std::size_t s = 0; s < kv.stages.size(); ++s)
        if (kv.stages[s].blocks < kv.stages[worst].blocks) worst = s;
    // Start-up checks, in vLLM's order, with its messages.
    const Bytes free_at_start = capacity > ranks[worst].cuda_context ? capacity - ranks[worst].cuda_context : Bytes(0);
    if (!o.kv_cache_memory && free_at_start < requested)
        out.error = "Free memory on device (" + gib(free_at_start) + "/" + gib(capacity) + " GiB) on startup is less than desired GPU memory utilization (" +
                    std::to_string(u).substr(0, 4) + ", " + gib(requested) + " GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.";
    else if (ranks[worst].kv_cache <= Bytes(0))
        out.error = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.";
    else if (v0 && kv.kv_cache_tokens < out.max_model_len)
        out.error = "The model's max seq len (" + std::to_string(out.max_model_len) + ") is larger than the maximum number of tokens that can be stored in KV cache (" +
                    std::to_string(kv.kv_cache_tokens) + "). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.";
    else if (!v0 && !kv.fits_one_request)
        out.error = "To serve at least one request with the model's max seq len (" + std::to_string(out.max_model_len) + "), (" + gib(kv.needed_per_request) +
                    " GiB KV cache is needed, which is larger than the available KV cache memory (" + gib(ranks[worst].kv_cache) +
                    " GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.";
    for (auto& r : ranks) r.fits = out.error.empty() && r.total_device <= capacity;
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    return out;
}

}  // namespace gpumem::serving_detail
