// What gpumem's serving engines share (src/memory/serving_*.cpp): the card,
// layout and dtypes every engine reads the same way, the weights each rank
// loads, the buffers outside PyTorch, and one layer's working set as the
// engines' activation estimate. Internal to the memory layer.
#pragma once
#include <cstdint>
#include <string>

#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/serving.hpp"

namespace gpumem::serving_detail {

// A number with `digits` decimals, and GiB with two, as the engines log them.
std::string fixed(double v, int digits);
std::string gib(Bytes b);

// What every engine reads the same way: the card, the layout, the weights'
// and the cache's dtypes (the result's names are filled here too).
struct Served {
    GpuSpec gpu;
    Bytes capacity;
    std::int64_t tp = 1, pp = 1;
    Precision prec = Precision::BF16;
    DType model_dt = DType::BF16, kv_dt = DType::BF16;
};
Served served_basics(const ModelGraph& g, const EstimateRequest& job, Engine engine, ServingResult& out);

// Weights of each pipeline stage's ranks: gpumem's inference layout (each
// rank's share of the tensor-parallel weights, the stage's layers); `ep_dp`:
// the routed experts spread over that many data-parallel replicas too.
ParallelResult served_layout(const ModelGraph& g, const EstimateRequest& job, Precision prec, std::int64_t tp, std::int64_t pp, std::int64_t max_len,
                             Bytes* nccl_per_communicator, std::int64_t ep_dp = 1);
// NCCL and the engine's all-reduce buffers outside PyTorch.
Bytes tp_buffers(const GpuSpec& gpu, std::int64_t tp, std::int64_t pp, Bytes nccl_per_communicator);
// nvidia-smi's memory.total (MiB), which SGLang's default fraction reads.
std::int64_t nvidia_smi_mib(const GpuSpec& gpu, Bytes capacity);
// The RoPE cache and the checkpoint's (or online) quantization applied to
// each stage's weights.
void adjust_served_weights(const ModelGraph& g, const ServingOptions& o, const Served& sv, ParallelResult& par, ServingResult& out, bool rope = true);
// An error for layouts an engine's model here does not cover (linear
// attention, chunked local attention).
void refuse_unmodelled_layouts(const TransformerDims& d, const std::string& engine);
// One layer's MLP working set for `tokens` tokens.
Bytes mlp_working_set(const TransformerDims& d, std::int64_t tp, DType dt, std::int64_t tokens);

// Each engine's answer for a loaded model.
ServingResult vllm_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o);
ServingResult sglang_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o);
ServingResult tgi_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o);
ServingResult trtllm_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o);

}  // namespace gpumem::serving_detail
