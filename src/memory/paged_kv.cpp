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
    if (d.latent_kv) return dtype_bytes(dt, d.kv_elements_per_token / std::max<std::int64_t>(1, d.kv_layers()));
    return dtype_bytes(dt, checked_mul(2 * std::max<std::int64_t>(1, d.kv_heads / std::max<std::int64_t>(1, tp)), d.head_dim));
}

Result<PagedKvResult> paged_kv_cache(const TransformerDims& d, const PagedKvRequest& r) {
    return capture([&]() -> PagedKvResult {
        if (d.layers <= 0 || (!d.latent_kv && (d.kv_heads <= 0 || d.head_dim <= 0)))
            fail(ErrorCode::InvalidArgument, "model", "the model has no attention layers with key/value heads to cache");
        check(r.tp >= 1, "tp", "--tp must be a positive integer");
        check(r.pp >= 1 && r.pp <= d.layers, "pp", "--pp must be between 1 and the model's " + std::to_string(d.layers) + " layers");
        check(r.block_size >= 1, "block-size", "--block-size must be a positive integer");
        check(r.max_model_len >= 1, "max-model-len", "--max-model-len must be a positive integer");
        check(r.available.size() == 1 || static_cast<std::int64_t>(r.available.size()) == r.pp, "available",
              "one KV budget, or one per pipeline stage");
        PagedKvResult out;
        const std::int64_t L = r.max_model_len;
        std::int64_t bs = r.block_size;
        const std::int64_t kv_heads = d.latent_kv ? 1 : std::max<std::int64_t>(1, d.kv_heads / r.tp);
        const Bytes tok = kv_token_bytes_per_layer(d, r.tp, r.kv_dtype);
        // Layers by type (full, sliding window, linear attention), then vLLM's
        // groups (layers[i::k] of a type).
        std::vector<std::int64_t> full, sliding, chunked, linear;
        for (std::int64_t l = 0; l < d.layers; ++l) {
            const auto i = static_cast<std::size_t>(l);
            const bool sw = d.sliding_window > 0 && i < d.sliding_layers.size() && d.sliding_layers[i];
            const bool ch = d.attention_chunk > 0 && i < d.chunked_layers.size() && d.chunked_layers[i];
            const bool lin = i < d.linear_layers.size() && d.linear_layers[i];
            (lin ? linear : ch ? chunked : sw ? sliding : full).push_back(l);
        }
        check(!full.empty() || !sliding.empty() || !chunked.empty(), "model", "the model has no attention layers with a KV cache to page");
        if (!linear.empty()) {
            // Hybrid attention + linear attention (HybridAttentionMambaModelConfig,
            // models/config.py L103-264 @d28d86e8a): one state page per layer and
            // request; the attention block grows to the first multiple of 16
            // (MLA: 64) tokens whose page holds it, and the state page is padded
            // to that attention page.
            // vLLM's conv state keeps kernel - 1 columns (mamba_utils.py
            // gated_delta_net_state_shape, L177-190 @d28d86e8a).
            out.state_page = d.linear_state_bytes(r.tp, d.linear_conv_kernel - 1, r.state_dtype, r.ssm_dtype);
            const std::int64_t align = d.latent_kv ? 64 : 16;
            const std::int64_t attn_bs = align * checked_ceil_div(out.state_page.count(), checked_mul(align, tok.count()));
            bs = std::max(bs, attn_bs);
        }
        const Bytes page = tok * bs;
        out.block_size = bs;
        std::int64_t gs = 0, lo = 0, hi = 0;
        for (const auto* t : {&full, &sliding, &chunked, &linear}) {
            if (t->empty()) continue;
            const auto n = static_cast<std::int64_t>(t->size());
            lo = lo == 0 ? n : std::min(lo, n);
            hi = std::max(hi, n);
        }
        gs = 2 * hi < 3 * lo ? hi : lo;  // max < 1.5 x min: one group per type
        struct Group {
            std::vector<std::int64_t> layers;
            std::int64_t per_request = 0;  // blocks one request of L tokens holds
        };
        std::vector<Group> groups;
        const std::int64_t mnbt = r.max_num_batched_tokens > 0 ? r.max_num_batched_tokens : L;
        enum class Kind { Full, Sliding, Chunked, Linear };
        const auto add_type = [&](const std::vector<std::int64_t>& ls, Kind kind) {
            if (ls.empty()) return;
            const auto n = static_cast<std::int64_t>(ls.size());
            const std::int64_t k = (n + gs - 1) / gs;
            for (std::int64_t i = 0; i < k; ++i) {
                Group g;
                for (std::int64_t j = i; j < n; j += k) g.layers.push_back(ls[static_cast<std::size_t>(j)]);
                // Sliding: cdiv(min(W - 1 + max_num_batched_tokens, L), bs) + 1
                // (kv_cache_interface.py L251-270); linear attention: one state
                // page, two with prefix caching's "align" mode (L293-300).
                // Chunked local: cdiv(min(C + max_num_batched_tokens, L), bs)
                // (ChunkedLocalAttentionSpec, L232-244).
                g.per_request = kind == Kind::Sliding   ? (std::min(d.sliding_window - 1 + mnbt, L) + bs - 1) / bs + 1
                                : kind == Kind::Chunked ? (std::min(d.attention_chunk + mnbt, L) + bs - 1) / bs
                                : kind == Kind::Linear  ? (r.prefix_caching ? 2 : 1)
                                                        : (L + bs - 1) / bs;
                groups.push_back(std::move(g));
            }
        };
        add_type(full, Kind::Full);
        add_type(sliding, Kind::Sliding);
        add_type(chunked, Kind::Chunked);
        add_type(linear, Kind::Linear);
        out.groups = static_cast<std::int64_t>(groups.size());
        out.group_size = gs;
        for (const Group& g : groups) out.blocks_per_request += g.per_request;
        // Each pipeline stage holds its layers of every group; its tensors are
        // as many as its largest group (_project_kv_cache_groups_to_worker).
        const auto layers = vllm_pp_layers(d.layers, r.pp);
        std::int64_t first_layer = 0;
        out.fits_one_request = true;
        for (std::size_t s = 0; s < layers.size(); ++s) {
            PagedKvStage st;
            st.layers = layers[s];
            st.kv_heads = kv_heads;
            st.page = page;
            std::int64_t stage_gs = 0, need_pages = 0;
            for (const Group& g : groups) {
                const auto in = static_cast<std::int64_t>(std::count_if(g.layers.begin(), g.layers.end(),
                                                                        [&](std::int64_t l) { return l >= first_layer && l < first_layer + st.layers; }));
                stage_gs = std::max(stage_gs, in);
                if (in > 0) need_pages += g.per_request;
            }
            if (r.pp == 1) stage_gs = gs;  // padding layers count on a single stage
            first_layer += st.layers;
            const Bytes avail = r.available.size() == 1 ? r.available[0] : r.available[s];
            st.blocks = avail > Bytes(0) ? avail.count() / page.count() / std::max<std::int64_t>(1, stage_gs) : 0;
            out.num_blocks = s == 0 ? st.blocks : std::min(out.num_blocks, st.blocks);
            const Bytes need = page * checked_mul(stage_gs, need_pages);
            out.needed_per_request = std::max(out.needed_per_request, need);
            if (need > avail) out.fits_one_request = false;
            out.stages.push_back(st);
        }
        out.max_concurrency = static_cast<double>(out.num_blocks) / static_cast<double>(out.blocks_per_request);
        // With linear attention the state "block" is max_model_len tokens, so the
        // smallest block size is min(bs, L) (kv_cache_utils.py L1297-1306).
        out.kv_cache_tokens = checked_mul(out.num_blocks / out.groups, linear.empty() ? bs : std::min(bs, L));
        return out;
    });
}

}  // namespace gpumem
