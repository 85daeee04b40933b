// gpumem/memory/paged_kv.hpp — a serving engine's paged KV cache (vLLM V1).
//
// vLLM sizes its KV cache at start-up from a per-GPU byte budget: every
// attention layer of a rank gets blocks of `block_size` tokens whose page is
// 2 x block_size x kv_heads x head_dim x dtype bytes, with kv_heads =
// max(1, kv_heads // tp) (heads replicated when tp exceeds them). A rank's
// blocks are budget // page // its layers, and every rank keeps the minimum
// over ranks. From the blocks come the two figures its log prints:
// "Maximum concurrency for L tokens per request: x" with x = blocks /
// cdiv(L, block_size), and "GPU KV cache size: N tokens" with N = blocks //
// groups x block_size (v0.19; v0.27 prints int(x * L)).
// Models with sliding-window layers (Gemma 2, gpt-oss, Mistral v0.1) get
// vLLM's hybrid layout (v0.19, kv_cache_utils.py _get_kv_cache_groups_uniform_page_size
// L959-1078): layers bucketed by type, group_size = the smaller bucket (the
// larger when it is under 1.5x the smaller), each type in cdiv(n, group_size)
// groups sharing one pool of blocks = budget // page // group_size; a request
// of L tokens needs cdiv(L, bs) blocks in a full group and cdiv(min(W - 1 +
// max_num_batched_tokens, L), bs) + 1 in a sliding one (kv_cache_interface.py
// L251-270); MLA caches one latent of kv_lora_rank + rope dims per token and
// layer, unsplit by tensor parallelism; chunked local layers (Llama 4's RoPE
// layers) keep cdiv(min(chunk + max_num_batched_tokens, L), bs) blocks per
// request (ChunkedLocalAttentionSpec); linear-attention layers (Qwen3-Next's
// gated DeltaNet) hold one state page per request, the attention block size
// raised until its page holds that state (models/config.py
// HybridAttentionMambaModelConfig). docs/research/vllm_hybrid.md.
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
    std::int64_t max_num_batched_tokens = 0;  // sliding layers keep W - 1 + this many tokens per request (0: max_model_len)
    // Linear-attention state (Qwen3-Next): the convolution state's dtype
    // (mamba_cache_dtype "auto": the model's) and the recurrent state's
    // (mamba_ssm_cache_dtype, by default the same); prefix caching switches
    // the state to "align" mode, two pages per request.
    DType state_dtype = DType::BF16;
    DType ssm_dtype = DType::BF16;
    bool prefix_caching = false;
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
    std::int64_t groups = 1;         // KV-cache groups (1 unless layers of several attention types)
    std::int64_t group_size = 0;     // layers per group (padding included)
    std::int64_t blocks_per_request = 0;  // over all groups: cdiv(max_model_len, block_size) for a full group
    double max_concurrency = 0;      // num_blocks / blocks_per_request
    std::int64_t kv_cache_tokens = 0;  // num_blocks // groups x block_size
    std::int64_t block_size = 0;     // tokens per block: the request's, or raised to hold a linear-attention state
    Bytes state_page;                // one linear-attention layer's state for one request (before padding)
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
