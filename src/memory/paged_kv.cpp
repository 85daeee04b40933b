// A serving engine's paged KV cache (gpumem/memory/paged_kv.hpp).
#include "gpumem/memory/paged_kv.hpp"

#include <algorithm>
#include <string>

namespace gpumem {

namespace {
void check(bool ok, const char* field, const std::string& msg) {
    if (!ok) fail(ErrorCode::InvalidArgument, field, msg);
}
}  // namespace

std::vector<std::int64_t> vllm_pp_layers(std::int64_t layers, std::int64_t pp) {
    pp = std::max<std::int64_t>(1, pp);
    std::vector<std::int64_t> out(static_cast<std::size_t>(pp), layers / pp);
    // The remainder goes to the second-to-last stage, then backwards.
    for (std::int64_t i = 0; i < layers % pp; ++i) ++out[static_cast<std::size_t>(pp - 2 - i)];
    return out;
}

Bytes kv_token_bytes_per_layer(const TransformerDims& d, std::int64_t tp, DType dt) {
    if (d.latent_kv) return dtype_bytes(dt, d.kv_elements_per_token / std::max<std::int64_t>(1, d.layers));
    return dtype_bytes(dt, checked_mul(2 * std::max<std::int64_t>(1, d.kv_heads / std::max<std::int64_t>(1, tp)), d.head_dim));
}

Result<PagedKvResult> paged_kv_cache(const TransformerDims& d, const PagedKvRequest& r) {
    return capture([&]() -> PagedKvResult {
        if (d.layers <= 0 || d.kv_heads <= 0 || d.head_dim <= 0)
            fail(ErrorCode::InvalidArgument, "model", "the model has no attention layers with key/value heads to cache");
        if (d.latent_kv) fail(ErrorCode::InvalidArgument, "model", "MLA latent KV caches (DeepSeek) are not modelled for serving yet");
        check(r.tp >= 1, "tp", "--tp must be a positive integer");
        check(r.pp >= 1 && r.pp <= d.layers, "pp", "--pp must be between 1 and the model's " + std::to_string(d.layers) + " layers");
        check(r.block_size >= 1, "block-size", "--block-size must be a positive integer");
        check(r.max_model_len >= 1, "max-model-len", "--max-model-len must be a positive integer");
        check(r.available.size() == 1 || static_cast<std::int64_t>(r.available.size()) == r.pp, "available",
              "one KV budget, or one per pipeline stage");
        PagedKvResult out;
        out.blocks_per_request = (r.max_model_len + r.block_size - 1) / r.block_size;
        const std::int64_t kv_heads = std::max<std::int64_t>(1, d.kv_heads / r.tp);
        const Bytes page = kv_token_bytes_per_layer(d, r.tp, r.kv_dtype) * r.block_size;
        const auto layers = vllm_pp_layers(d.layers, r.pp);
        bool first = true;
        for (std::size_t s = 0; s < layers.size(); ++s) {
            PagedKvStage st;
            st.layers = layers[s];
            st.kv_heads = kv_heads;
            st.page = page;
            const Bytes avail = r.available.size() == 1 ? r.available[0] : r.available[s];
            st.blocks = avail > Bytes(0) ? avail.count() / page.count() / std::max<std::int64_t>(1, st.layers) : 0;
            out.num_blocks = first ? st.blocks : std::min(out.num_blocks, st.blocks);
            first = false;
            const Bytes need = page * checked_mul(st.layers, out.blocks_per_request);
            out.needed_per_request = std::max(out.needed_per_request, need);
            out.stages.push_back(st);
        }
        out.fits_one_request = true;
        for (std::size_t s = 0; s < layers.size(); ++s) {
            const Bytes avail = r.available.size() == 1 ? r.available[0] : r.available[s];
            if (page * checked_mul(out.stages[s].layers, out.blocks_per_request) > avail) out.fits_one_request = false;
        }
        out.max_concurrency = static_cast<double>(out.num_blocks) / static_cast<double>(out.blocks_per_request);
        out.kv_cache_tokens = static_cast<std::int64_t>(out.max_concurrency * static_cast<double>(r.max_model_len));
        return out;
    });
}

}  // namespace gpumem
