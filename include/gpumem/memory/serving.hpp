// gpumem/memory/serving.hpp — GPU memory of a model served by an engine.
//
// A serving engine decides its memory at start-up, on the GPU: vLLM (V1)
// takes a budget of gpu_memory_utilization x the device's total memory,
// loads the weights, runs one profiling forward of max_num_batched_tokens
// tokens (attention skipped) and its sampler on max_num_seqs rows, and gives
// whatever of the budget is left to the paged KV cache (memory/paged_kv.hpp),
// which fixes how many tokens and requests it can hold. This predicts that
// before anyone starts it. Pinned to vLLM 0.19 (V1), the version of the
// public logs it is checked against (tests/fixtures/groundtruth/
// vllm_startup_logs.json): the budget is requested - (weights + profile peak
// + non-torch memory) (vllm/v1/worker/gpu_worker.py determine_available_memory;
// vllm/utils/mem_utils.py memory_profiling), and CUDA graphs are captured
// after the KV cache, on top of the budget (from v0.21 vLLM estimates and
// subtracts them first). docs/research/vllm.md has the notes and citations.
// Measured parts (weights, KV arithmetic) are exact; the profile peak and the
// graphs are estimates, named as such in the assumptions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct ServingPerGpu {
    std::string device;     // llama.cpp's device name ("CUDA0"); "" for the other engines' ranks
    Bytes weights;          // this rank's weights ("Model loading took")
    Bytes activation_peak;  // the profile run's transient peak (forward + sampler)
    Bytes non_torch;        // memory outside PyTorch's allocator the budget counts (NCCL with tp/pp > 1)
    Bytes kv_cache;         // the KV pool ("Available KV cache memory")
    Bytes request_table;    // SGLang's request-to-token table (int32 [requests, context + 4]); 0 for vLLM
    Bytes cuda_graph;       // CUDA graphs captured after the KV cache (outside the budget in 0.19)
    Bytes cuda_context;     // the context, before vLLM's first memory snapshot (outside the budget)
    Bytes total_device;     // nvidia-smi: context + budget + graphs
    Bytes capacity;         // the device's total as CUDA reports it
    Bytes requested;        // gpu_memory_utilization x capacity (the budget)
    bool fits = false;      // vLLM starts and holds one request of max_model_len
};

// Host memory the engine allocates (llama.cpp's host buffers).
struct ServingHost {
    Bytes model_mapped;  // CPU_Mapped: the mmap'd span of the weights left on the CPU
    Bytes model;         // CPU weights read into RAM (--no-mmap)
    Bytes kv_cache;      // KV layers kept on the CPU (-nkvo, or layers not offloaded)
    Bytes compute;       // the host side of the compute graph (CUDA_Host / CPU compute buffer)
    Bytes output;        // the logits output buffer
    Bytes total;
};

// llama.cpp's settings as it resolves them, and what fits.
struct LlamaCppDetail {
    std::int64_t n_layer = 0, n_gpu_layers = 0, n_ctx = 0, n_ctx_seq = 0, n_ubatch = 0, n_parallel = 1;
    bool kv_unified = true, flash_attn = true, mmap = true;
    std::string type_k, type_v, file_type;
    std::vector<std::pair<std::string, std::int64_t>> tensor_types;  // "q4_K" -> tensors, as llama_model_loader logs them
    std::int64_t fit_gpu_layers = -1;  // the most -ngl that fits every GPU with these settings (-1: not even 0)
    std::int64_t fit_ctx_size = 0;     // the largest -c (256-token steps) that fits with this -ngl (0: none)
    std::int64_t params = 0;           // elements of the model's tensors (for the prefill roofline)
};

// Decode and prefill speed at one concurrency level (plan/serving_time.hpp).
struct ServingThroughput {
    std::int64_t concurrency = 0;          // requests running at once
    double ttft_seconds = 0;               // their prompts prefilled together (time to first token)
    double decode_tokens_per_second = 0;   // all running requests together
    double tokens_per_second_per_request = 0;
    bool memory_bound = true;              // decode limited by bandwidth (true) or compute
};

// How sure a serving answer is (memory/uncertainty.hpp): low / high of the
// KV cache (bytes and tokens) and the concurrency, and of the weights per
// rank, from the measured error of this engine's logged figures
// (scripts/serving_accuracy.py's engine logs, bands by scripts/error_bands.py).
struct ServingUncertainty {
    std::string kv_path, kv_bytes_path, weights_path;  // the bands' keys, e.g. "serve/vllm/kv_tokens"
    std::int64_t kv_rows = 0, weights_rows = 0;
    double kv_ratio_low = 1, kv_ratio_high = 1;  // measured / predicted: KV tokens and concurrency
    double kv_bytes_ratio_low = 1, kv_bytes_ratio_high = 1;  // the KV cache's bytes
    double weights_ratio_low = 1, weights_ratio_high = 1;
    Bytes kv_cache_low, kv_cache_high;
    std::int64_t kv_tokens_low = 0, kv_tokens_high = 0;
    double concurrency_low = 0, concurrency_high = 0;
    Bytes weights_low, weights_high;
};

struct ServingResult {
    EstimateRequest job;        // the request as the engine's command line set it (model, layout, dtypes)
    std::string model_name;
    std::string engine;         // "vllm"
    std::string engine_version; // whose defaults and budget rule apply
    std::string gpu;
    std::int64_t tp = 1, pp = 1;
    std::int64_t max_model_len = 0, max_num_seqs = 0, max_num_batched_tokens = 0, block_size = 0;
    double gpu_memory_utilization = 0;  // vLLM's budget fraction (0 for SGLang)
    double mem_fraction_static = 0;     // SGLang's static fraction (0 for vLLM)
    ServingPerGpu per_gpu;      // the rank with the fewest KV blocks (every rank keeps that many)
    std::vector<ServingPerGpu> per_rank;  // one per pipeline stage (tensor-parallel ranks are alike)
    std::int64_t kv_cache_blocks = 0;     // "num_gpu_blocks"
    std::int64_t kv_cache_tokens = 0;     // "GPU KV cache size: N tokens"
    double max_concurrency = 0;           // "Maximum concurrency for L tokens per request: x"
    std::int64_t request_len = 0;         // tokens per request asked about (--request-len, else max_model_len)
    std::int64_t output_len = 0;          // of which generated (--output-len)
    double concurrency_at_request_len = 0;  // requests of request_len the KV cache holds at once
    std::vector<ServingThroughput> throughput;  // per concurrency level (filled by plan/serving_time.hpp)
    // What fits (gpumem fit --engine): the longest request the KV cache admits
    // (vLLM's and SGLang's max_model_len / context length up to the model's
    // maximum; llama.cpp: llamacpp->fit_ctx_size), and whether this is that view.
    std::int64_t fit_max_model_len = 0;
    bool fit_view = false;
    std::optional<ServingHost> host;      // host RAM (llama.cpp)
    std::optional<LlamaCppDetail> llamacpp;
    std::string error;                    // the error vLLM would stop with ("" when it starts)
    std::vector<std::string> assumptions;
    ServingUncertainty uncertainty;
};

// SGLang's KV pool from the memory it measures (model_runner.py
// profile_max_num_token, v0.5.6 7ae368efde14 L1367-1448, and
// init_memory_pool L1719-1742): free memory before the weights load `pre`
// (min over ranks), after them `after`; rest = after - pre x (1 -
// mem_fraction_static); tokens = floor(rest / cell), capped by
// --max-total-tokens, rounded down to the page size. 0 when nothing is left.
std::int64_t sglang_kv_tokens(Bytes pre, Bytes after, double mem_fraction_static, Bytes cell, std::int64_t page_size,
                              std::optional<std::int64_t> max_total_tokens = std::nullopt);
// SGLang's default --mem-fraction-static (server_args.py
// _handle_gpu_memory_settings: v0.5.6 L701-867; v0.4.6.post1 L221-238) for a
// GPU of `gpu_mem_mib` (nvidia-smi memory.total), tp x pp, chunked-prefill
// size and CUDA-graph batch.
double sglang_default_mem_fraction(const std::string& version, std::int64_t gpu_mem_mib, std::int64_t tp, std::int64_t pp,
                                   std::int64_t chunked_prefill_size, std::int64_t cuda_graph_max_bs);

// The engine's own command line (`vllm serve MODEL --flag value ...`) onto the
// options and the job (model, tp, pp, dtype, kv-cache dtype); flags it does
// not model are errors naming them.
void apply_engine_command(const std::vector<std::string>& argv, ServingOptions& o, EstimateRequest& job);

Result<ServingResult> serving_memory(const EstimateRequest& job, const ServingOptions& o);

}  // namespace gpumem
