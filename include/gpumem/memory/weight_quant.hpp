// gpumem/memory/weight_quant.hpp — the bytes of quantized weights as a
// serving engine holds them on the GPU.
//
// A checkpoint's quantization_config (FP8 per tensor, per channel or in
// 128x128 blocks; compressed-tensors W8A8 / W4A16 / NVFP4; GPTQ; AWQ;
// bitsandbytes; ModelOpt) quantizes the linear layers (and MoE experts) and
// adds scales, zero points and kernel workspaces whose shapes depend on the
// kernel the GPU gets (CUTLASS, Marlin on GPUs without FP8, Machete on
// Hopper, DeepGEMM's scale layout on Blackwell). Read from vLLM's
// quantization methods (main 31a719bc, 2026-03-31, between v0.18 and v0.19)
// with files and lines in docs/research/quant.md, and checked there against
// public "Model loading took" logs (FP8 online and per-channel exact, block
// FP8 within 0.03%, AWQ within 0.1% at v0.19). Embeddings, norms, routers,
// biases and (unless lm_head is set) the output head stay in the model dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// Bytes of one quantized linear of in_features K and out_features N (the whole
// layer; a tensor-parallel rank holds its share) on this GPU, the model dtype
// being `dt_bytes` wide.
std::int64_t quantized_linear_bytes(const WeightQuant& q, std::int64_t K, std::int64_t N, std::int64_t dt_bytes, const GpuSpec& gpu);

// Per pipeline stage (layers split as `stage_layers`), what the quantization
// changes in one tensor-parallel rank's weights: quantized bytes minus the
// model-dtype bytes of the same tensors (negative: smaller).
std::vector<Bytes> quantized_weight_delta(const ModelGraph& g, const WeightQuant& q, std::int64_t tp, const std::vector<std::int64_t>& stage_layers,
                                          std::int64_t dt_bytes, const GpuSpec& gpu);

// vLLM's --quantization fp8 (online, per tensor, every linear but the head).
WeightQuant online_fp8();

// One line for the assumptions: the scheme and the kernel layout it assumes on this GPU.
std::string describe_weight_quant(const WeightQuant& q, const GpuSpec& gpu);

}  // namespace gpumem
