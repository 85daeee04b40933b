// What the serving engines share (src/memory/serving_internal.hpp).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/weight_quant.hpp"
#include "serving_internal.hpp"

namespace gpumem::serving_detail {

using engine_args::check;

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

std::string gib(Bytes b) { return fixed(static_cast<double>(b.count()) / 1073741824.0, 2); }

// Weights of each pipeline stage's ranks: gpumem's inference layout (each
// rank's share of the tensor-parallel weights, the stage's layers).
ParallelResult served_layout(const ModelGraph& g, const EstimateRequest& job, Precision prec, std::int64_t tp, std::int64_t pp, std::int64_t max_len,
                             Bytes* nccl_per_communicator, std::int64_t ep_dp) {
    EstimateRequest inf = job;
    inf.mode = Mode::Infer;
    inf.precision = prec;
    inf.batch = 1;
    inf.seq = std::min<std::int64_t>(16, max_len);
    inf.gen_len = 0;
    inf.analytic = true;
    inf.parallel.tp = tp;
    inf.parallel.pp = pp;
    // Expert parallelism over tp x dp ranks (vLLM's EP group): each rank holds
    // 1 / (tp x dp) of the experts' bytes, as gpumem's ep over dp with the
    // experts split by tp gives.
    inf.parallel.gpus = tp * pp * ep_dp;
    inf.parallel.ep = ep_dp;
    const Job resolved = take(resolve_job(g, inf));
    *nccl_per_communicator = resolved.layout.cfg.nccl_per_communicator;
    return parallel_memory(g, resolved);
}

// Memory outside PyTorch that tensor parallelism adds (NCCL and the engine's
// all-reduce buffers): measured 1.79 GiB per rank on H100 at tp 2 (vLLM PR
// #10511: non_torch_memory 3.58 GiB against 1.79 GiB at tp 1); other GPUs and
// pipeline-only layouts: one NCCL communicator (docs/assumptions.md).
Bytes tp_buffers(const GpuSpec& gpu, std::int64_t tp, std::int64_t pp, Bytes nccl_per_communicator) {
    const bool nvswitch_gen = gpu.arch == "hopper" || gpu.arch == "blackwell";
    return tp > 1 && nvswitch_gen ? MiB(1833) : tp * pp > 1 ? nccl_per_communicator : Bytes(0);
}

// nvidia-smi's memory.total (MiB), which SGLang's default fraction reads
// (get_nvgpu_memory_capacity), where public logs show it; else CUDA's total.
std::int64_t nvidia_smi_mib(const GpuSpec& gpu, Bytes capacity) {
    static const std::map<std::string, std::int64_t> kSmi = {{"H100-80GB", 81559}, {"A100-80GB", 81920}, {"A100-40GB", 40960},
                                                             {"H200-141GB", 143771}, {"RTX-4090", 24564}, {"L4-24GB", 23034}};
    const auto it = kSmi.find(gpu.name);
    return it != kSmi.end() ? it->second : capacity.count() / (1024 * 1024);
}

Served served_basics(const ModelGraph& g, const EstimateRequest& job, Engine engine, ServingResult& out) {
    Served s;
    out.model_name = g.name;
    out.engine = to_string(engine);
    out.job = job;
    s.tp = std::max<std::int64_t>(1, job.parallel.tp);
    s.pp = std::max<std::int64_t>(1, job.parallel.pp);
    out.tp = s.tp;
    out.pp = s.pp;
    s.gpu = take(find_gpu(job.gpu));
    out.gpu = s.gpu.name;
    s.capacity = job.gpu_memory.value_or(s.gpu.memory);
    s.prec = job.precision.value_or(Precision::BF16);
    check(s.prec == Precision::BF16 || s.prec == Precision::FP16 || s.prec == Precision::FP32, "precision",
          "serving runs the weights in bf16, fp16 or fp32 (--precision bf16|fp16|fp32)");
    s.model_dt = s.prec == Precision::FP32 ? DType::F32 : s.prec == Precision::FP16 ? DType::F16 : DType::BF16;
    s.kv_dt = job.kv_dtype.value_or(s.model_dt);
    return s;
}

// What the engine loads beyond the parameters: the RoPE cache (vLLM, SGLang)
// and the checkpoint's quantization_config (or --quant fp8, vLLM's and
// SGLang's online FP8) applied to each stage's weights (memory/weight_quant.hpp).
void adjust_served_weights(const ModelGraph& g, const ServingOptions& o, const Served& sv, ParallelResult& par, ServingResult& out, bool rope) {
    std::optional<WeightQuant> q = g.weight_quant;
    if (o.quant) {
        check(*o.quant == "fp8", "quant", "--quant " + *o.quant + ": vLLM, SGLang and TGI quantize online only to fp8 here (--quant fp8); "
                                          "quantized checkpoints are read from their config.json's quantization_config");
        check(!q, "quant", "--quant fp8: the checkpoint is already quantized (" + (q ? q->method : std::string()) + ")");
        q = online_fp8();
    }
    // vLLM's RoPE cos/sin caches, one per rank and RoPE config, [max_positions,
    // rotary_dim] in the model dtype (rotary_embedding/base.py), are part of
    // what "Model loading took" counts (docs/research/quant.md section 1).
    if (rope && g.max_positions > 0 && g.transformer->rotary_dim > 0) {
        const Bytes cache = dtype_bytes(g.transformer->rope_fp32 ? DType::F32 : sv.model_dt,
                                        checked_mul(checked_mul(g.transformer->rope_configs, g.max_positions), g.transformer->rotary_dim));
        for (auto& st : par.stages) st.weights = st.weights + cache;
    }
    if (!q) return;
    std::vector<std::int64_t> layers;
    for (const auto& st : par.stages) layers.push_back(st.layers);
    const auto delta = quantized_weight_delta(g, *q, sv.tp, layers, dtype_bytes(sv.model_dt, 1).count(), sv.gpu);
    for (std::size_t s = 0; s < par.stages.size() && s < delta.size(); ++s) par.stages[s].weights = par.stages[s].weights + delta[s];
    out.assumptions.push_back(describe_weight_quant(*q, sv.gpu));
}

// Engines whose linear-attention state (Qwen3-Next) or chunked-attention KV
// layout (Llama 4) gpumem does not model answer with an error rather than a
// KV pool that pages every layer in full.
void refuse_unmodelled_layouts(const TransformerDims& d, const std::string& engine) {
    check(d.linear_layers.empty(), "engine",
          engine + "'s state for linear-attention layers (Qwen3-Next) is not modelled; gpumem serving answers for this model with --engine vllm");
    check(d.attention_chunk == 0, "engine",
          engine + "'s KV cache for chunked local attention (Llama 4) is not modelled; gpumem serving answers for this model with --engine vllm");
}

// One layer's MLP working set for `tokens` tokens (an estimate of the
// engines' activation and CUDA-graph peaks): the residual and normed hidden
// states, the gate/up projection and its activation (SwiGLU/GeGLU families;
// non-gated MLPs are smaller).
Bytes mlp_working_set(const TransformerDims& d, std::int64_t tp, DType dt, std::int64_t tokens) {
    const std::int64_t I = (d.intermediate + tp - 1) / tp;
    return dtype_bytes(dt, checked_mul(tokens, 2 * d.hidden + 3 * I));
}


}  // namespace gpumem::serving_detail
