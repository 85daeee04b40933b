// gpumem/memory/paged_kv.hpp — a serving engine's paged KV cache (vLLM V1).
//
// vLLM sizes its KV cache at start-up from a per-GPU byte budget: every
// attention layer of a rank gets blocks of `block_size` tokens whose page is
// 2 x block_size x kv_heads x head_dim x dtype bytes, with kv_heads =
// max(1, kv_heads // tp) (heads replicated when tp exceeds them). A rank's
// blocks are budget // page // its layers, and every rank keeps the minimum
// over ranks. From the blocks come the two figures its log prints:
// "Maximum concurrency for L tokens per request: x" with x = blocks /
// cdiv(L, block_size), and "GPU KV cache size: N tokens" with N = int(x * L).
// Sources (vllm-project/vllm, release v0.27.1 = 6e448d0ea9bf):
// vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes;
// vllm/v1/core/kv_cache_utils.py get_num_blocks, get_kv_cache_configs (the
// minimum over workers), get_max_concurrency_for_kv_cache_config and
// get_kv_cache_capacity, _check_enough_kv_cache_memory (the error when one
// request of max_model_len does not fit); ModelConfig.get_num_kv_heads;
// vllm/distributed/utils.py get_pp_indices (the remainder of layers goes to
// the second-to-last stage and backwards). docs/research/vllm.md has the notes.
// This is the exact arithmetic from a budget; the budget itself (weights,
// profile-run peak, non-torch memory, CUDA graphs) is estimated elsewhere.
#pragma once

#include <cstdint>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/dtype.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct PagedKvRequest {
    std::int64_t tp = 1, pp = 1;
    std::int64_t block_size = 16;   // vLLM's CUDA default
    std::int64_t max_model_len = 0; // tokens per request
    DType kv_dtype = DType::BF16;   // kv_cache_dtype "auto" = the model's dtype
    // The KV budget of each pipeline stage's ranks (one value: the same for all).
    std::vector<Bytes> available;
};

struct PagedKvStage {
    std::int64_t layers = 0;        // attention layers of this stage
    std::int64_t kv_heads = 0;      // per tensor-parallel rank
    Bytes page;                     // one block of one layer
    std::int64_t blocks = 0;        // what this stage's budget holds
};

struct PagedKvResult {
    std::vector<PagedKvStage> stages;
    std::int64_t num_blocks = 0;     // every rank's (the minimum over stages), null block included
    std::int64_t blocks_per_request = 0;  // cdiv(max_model_len, block_size)
    double max_concurrency = 0;      // num_blocks / blocks_per_request
    std::int64_t kv_cache_tokens = 0;  // int(max_concurrency * max_model_len)
    Bytes needed_per_request;        // the most-loaded stage's bytes for one request of max_model_len
    bool fits_one_request = false;   // false: vLLM refuses to start ("To serve at least one request ...")
};

// One token's K and V in one layer on one tensor-parallel rank: 2 x
// max(1, kv_heads // tp) x head_dim elements (vLLM's and SGLang's
// get_num_kv_heads replicate heads when tp exceeds them), or an MLA model's
// one latent (kv_lora_rank + rope dim), not split by tensor parallelism.
Bytes kv_token_bytes_per_layer(const TransformerDims& d, std::int64_t tp, DType dt);

// Layers of each pipeline stage as vLLM splits them (get_pp_indices).
std::vector<std::int64_t> vllm_pp_layers(std::int64_t layers, std::int64_t pp);

// The paged KV cache of a transformer under a budget. Errors: a model
// without attention dimensions, latent (MLA) caches, bad sizes.
Result<PagedKvResult> paged_kv_cache(const TransformerDims& d, const PagedKvRequest& r);

}  // namespace gpumem
