// TGI's start-up memory (gpumem/memory/serving.hpp; docs/research/tgi.md).
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

// ---- TGI (docs/research/tgi.md; text-generation-inference db931fcf42da,
// the last release v3.3.7 = dfb3fbe78e0d, and the tags named there) --------

// The launcher's default --max-batch-prefill-tokens (launcher/src/main.rs
// L2114-2154 @db931fcf; L28-90, L281-358): the card's fp16 TFLOP/s x shards /
// the model's FLOPs per token when the card is in its table, else 4096; at
// most the model's positions and what its rough VRAM estimate allows.
std::int64_t tgi_default_prefill(const TransformerDims& d, std::int64_t max_positions, const GpuSpec& gpu, std::int64_t shards, double mf,
                                 std::int64_t smi_mib) {
    // Cards by nvidia-smi name (L1712-1786): catalog names onto the strings it knows.
    static const std::map<std::string, double> kTflops = {{"H100-80GB", 900}, {"H200-141GB", 989}, {"A100-80GB", 312}, {"A100-40GB", 312},
                                                          {"L4-24GB", 121},   {"L40S-48GB", 363},  {"A10G-24GB", 125}};
    const double H = static_cast<double>(d.hidden), hd = static_cast<double>(d.head_dim), nh = static_cast<double>(d.heads),
                 nkv = static_cast<double>(d.kv_heads), I = static_cast<double>(d.intermediate), L = static_cast<double>(d.layers);
    const double experts = d.experts > 0 ? static_cast<double>(d.experts_per_token) : 1.0;
    const double flop = L * (2 * nh * hd * H + 4 * nkv * hd * H + 4 * nh * hd * H + 6 * H * I * experts);
    std::int64_t p = 4096;
    if (const auto it = kTflops.find(gpu.name); it != kTflops.end()) {
        const double c = std::floor(it->second * 1e12 * static_cast<double>(shards) / flop);
        if (c > 100) p = static_cast<std::int64_t>(c);
    }
    if (max_positions > 0) p = std::min(p, max_positions);
    // The VRAM estimate (L62-90, L310-352, its own approximations kept).
    const double n_exp = d.experts > 0 ? static_cast<double>(d.experts) : 1.0;
    const double avail = static_cast<double>(smi_mib) * 1048576.0 * static_cast<double>(shards) * mf * 0.95;
    const double model = 2.0 * (L * (3 * I * n_exp * H + (nh + 2 * nkv) * hd + nh * hd * H) + 2.0 * static_cast<double>(d.vocab) * H);
    const double token = nkv * 2 * hd * 2 * L + (I + I / 2) * n_exp * 2 * 3;
    if (avail > model) p = std::min(p, static_cast<std::int64_t>((avail - model) / token));
    return std::max<std::int64_t>(1, p);
}

ServingResult tgi_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "TGI");
    ServingResult out;
    const Served sv = served_basics(g, job, Engine::TGI, out);
    const std::string version = o.engine_version.value_or("3.3");
    check(version == "3.3" || version == "3.1" || version == "3.0" || version == "2.2", "engine-version",
          "TGI " + version + " is not modelled: gpumem serving knows TGI 3.3 (the default; 3.3.0-3.3.7), 3.1 (3.1.0-3.2.3), 3.0 (3.0.x) and 2.2 (1.4.1-2.2.x)");
    out.engine_version = version;
    check(!o.gpu_memory_utilization && !o.mem_fraction_static, "engine", "--gpu-memory-utilization and --mem-fraction-static are vLLM's and SGLang's; TGI's is --cuda-memory-fraction");
    check(sv.pp == 1, "pp", "TGI shards tensor-parallel only (--num-shard): no pipeline parallelism");
    const std::int64_t shards = sv.tp;
    check(d.kv_heads % shards == 0 || d.kv_heads == 1, "tp",
          "TGI splits the " + std::to_string(d.kv_heads) + " KV heads over the shards without replicating them (flash_causal_lm.py L1284-1296): --num-shard must divide them");
    const bool v3 = version != "2.2";
    const double W = version == "3.3" ? 0.90 : version == "3.1" ? 0.93 : 0.95;  // TGI_WIGGLE_ROOM (server/.../globals.py)
    const double mf = o.cuda_memory_fraction.value_or(1.0);
    check(mf > 0.0 && mf <= 1.0, "cuda-memory-fraction", "--cuda-memory-fraction must be in (0, 1]");
    const Bytes T = sv.capacity;  // torch's total_memory
    const std::int64_t smi = nvidia_smi_mib(sv.gpu, T);
    // Attention backend and block size (globals.py L37-46; launcher resolve_attention L131-199):
    // flashinfer (1 token) on compute capability >= 8.0 with head sizes 64/128/256, else paged (16) or flashdecoding (256).
    const bool modern = sv.gpu.compute_capability >= 80;
    const bool hd_ok = d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256;
    out.block_size = o.block_size.value_or(!v3 ? 16 : !modern ? 16 : hd_ok ? 1 : 256);
    const bool flashinfer = v3 && modern && hd_ok;
    // Lengths: v3 sizes the warmup by the prefill budget; 2.x defaulted input 4095, total 4096, prefill 4145.
    const std::int64_t mpe = g.max_positions > 0 ? g.max_positions : 4096;
    const std::int64_t P = o.max_num_batched_tokens.value_or(v3 ? tgi_default_prefill(d, g.max_positions, sv.gpu, shards, mf, smi)
                                                                : std::min<std::int64_t>(mpe, 4096) - 1 + 50);
    out.max_num_batched_tokens = P;
    check(P >= 1, "max-num-batched-tokens", "--max-batch-prefill-tokens must be positive");
    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, shards, 1, mpe, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out, false);
    const Bytes nccl = shards > 1 ? nccl_comm : Bytes(0);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    const Bytes workspace = flashinfer ? MiB(128) : Bytes(0);  // layers/attention/flashinfer.py L38-43
    const Bytes weights = par.stages.front().weights;
    // One token's K and V on a shard (no replication), one block.
    const Bytes token_kv = kv_token_bytes_per_layer(d, shards, sv.kv_dt) * d.layers;
    const Bytes bb = token_kv * out.block_size;
    // The warmup: one request of P tokens (v3; 2.x: requests of max_input
    // tokens until P) with its blocks, then a prefill whose activations stay
    // cached when free memory is measured (L1507-1563). The activation peak is
    // an estimate: one layer's MLP over P tokens, and before v3 the logits of
    // every prompt token: 8 bytes a logit (fp16 logits, their fp32
    // log-softmax and an fp16 copy; a fit to the 2.x logs, docs/research/tgi.md).
    const std::int64_t max_input = v3 ? P : std::min<std::int64_t>(mpe, 4096) - 1;
    const std::int64_t reqs = (P + max_input - 1) / max_input;
    const std::int64_t B_w = checked_mul(reqs, (std::min(P, max_input) + out.block_size - 1) / out.block_size);
    Bytes act = mlp_working_set(d, shards, sv.model_dt, P);
    if (!v3) act += Bytes(checked_mul(checked_mul(P, (d.vocab + shards - 1) / shards), 8));
    const Bytes used = context + nccl + weights + workspace + act + Bytes(checked_mul(B_w, bb.count()));
    const double F1 = static_cast<double>(T.count()) - static_cast<double>(used.count());
    const double budget = v3 ? F1 - (1.0 - mf * W) * static_cast<double>(T.count()) : W * (F1 - (1.0 - mf) * static_cast<double>(T.count()));
    const std::int64_t blocks = F1 <= 0 ? 0 : static_cast<std::int64_t>(std::floor(std::max(0.0, budget) / static_cast<double>(bb.count()))) + B_w;
    out.kv_cache_blocks = blocks;
    out.kv_cache_tokens = checked_mul(blocks, out.block_size);
    // max_total_tokens: as given, else min(tokens, the model's positions) with
    // prefill chunking (v3 L1566-1579); 2.x: min(positions, 4096).
    out.max_model_len = o.max_total_tokens ? *o.max_total_tokens : o.max_model_len ? *o.max_model_len : v3 ? std::min(out.kv_cache_tokens, mpe) : std::min<std::int64_t>(mpe, 4096);
    out.max_num_seqs = o.max_num_seqs.value_or(0);
    ServingPerGpu r;
    r.weights = weights;
    r.non_torch = nccl + workspace;
    r.activation_peak = act;
    r.kv_cache = Bytes(checked_mul(blocks, bb.count()));
    r.cuda_context = context;
    r.cuda_graph = mlp_working_set(d, shards, sv.model_dt, 32);  // sizes up to 32, captured after the KV cache (estimate)
    r.capacity = T;
    r.requested = Bytes(static_cast<std::int64_t>(mf * W * static_cast<double>(T.count())));
    r.total_device = r.cuda_context + r.non_torch + r.weights + r.kv_cache + r.cuda_graph;
    if (F1 <= 0)
        out.error = "Not enough memory to handle " + std::to_string(P) + " prefill tokens. You need to decrease `--max-batch-prefill-tokens`";
    else if (out.kv_cache_tokens < out.max_model_len)
        out.error = "Not enough memory to handle `max_total_tokens=" + std::to_string(out.max_model_len) + "`";
    r.fits = out.error.empty() && r.total_device <= T;
    out.per_rank = {r};
    out.per_gpu = r;
    out.max_concurrency = out.max_model_len > 0 ? static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.max_model_len) : 0;
    out.fit_max_model_len = std::min(out.kv_cache_tokens, mpe);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.request_len);
    if (out.max_num_seqs == 0) out.max_num_seqs = std::max<std::int64_t>(1, static_cast<std::int64_t>(out.concurrency_at_request_len));
    const std::string frac = fixed(W, 2);
    out.assumptions.push_back("TGI " + version + ": KV blocks = floor(" + (v3 ? std::string("(F1 - (1 - cuda_memory_fraction x ") + frac + ") x total)" : std::string(frac) + " x (F1 - (1 - cuda_memory_fraction) x total)") +
                              " / block) + the warmup's blocks, F1 = free memory after the warmup prefill (flash_causal_lm.py L1507-1563; docs/research/tgi.md)");
    out.assumptions.push_back("max_batch_prefill_tokens " + std::to_string(P) + (o.max_num_batched_tokens ? "" : " (the launcher's default for this card and model)") +
                              ", block size " + std::to_string(out.block_size) + (flashinfer ? " (flashinfer)" : "") + ", max_total_tokens " + std::to_string(out.max_model_len));
    out.assumptions.push_back(std::string("warmup activation peak (an estimate): one layer's MLP over the prefill") +
                              (v3 ? "" : " and 8 bytes per prompt-token logit (fp16 logits, fp32 log-softmax, an fp16 copy; fitted to public 2.x logs)") +
                              "; CUDA graphs (sizes up to 32) are captured after the KV cache, outside the budget (estimate)");
    out.host = ServingHost{};
    out.assumptions.push_back("host RAM: none kept by the engine (no CPU KV cache); the processes' own memory is not counted");
    return out;
}

}  // namespace serving_detail

}  // namespace gpumem
