// gpumem/memory/fp8.hpp — what FP8 / FP4 training recipes keep in memory.
//
// "FP8 training" is not one memory rule: the libraries keep different
// tensors. Read from the sources (docs/frameworks.md, "FP8 and FP4 recipes"):
//
//   Transformer Engine (--fp8-recipe delayed, current, mxfp8, nvfp4; Megatron):
//     - each linear saves only the column-wise quantized copy of its input for
//       the weight gradient, the row-wise copy is dropped after the forward GEMM
//       (NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py
//       @d0067d0da6cb L428-436, L600-621; layernorm_linear.py L477-487):
//       FP8 1 byte per element; MXFP8 1 byte + an E8M0 scale per 32 elements;
//       NVFP4 half a byte + an E4M3 scale per 16 elements. Linears TE runs as
//       one module (QKV, FC1 in LayerNormLinear) share one copy. Megatron saves
//       the attention output itself for the output projection with every
//       recipe but delayed scaling (NVIDIA/Megatron-LM
//       megatron/core/transformer/attention.py@d98e8a64ddf3 L428-444);
//     - the quantized weight is a workspace cached in the module across
//       micro-batches and steps when the caller passes is_first_microbatch
//       (linear.py L1958-1961, L2068-2071; module/base.py L792-887), as
//       Megatron does (megatron/core/extensions/transformer_engine.py
//       @d98e8a64ddf3 L1160-1161, L1338-1345): a row-wise copy and a
//       column-wise one. FP8 per-tensor scaling keeps the column-wise copy as a
//       physical transpose on Hopper and Ada, and one buffer for both on
//       Blackwell (csrc/quantizer.cpp L361-384, L678-695; utils.py L658-663);
//       MXFP8 and NVFP4 always keep both, each with its block scales padded to
//       [128, 4] tiles (tensor/mxfp8_tensor.py L78-95, L164-176;
//       tensor/nvfp4_tensor.py L296-307, L336-340, L368-399);
//     - delayed scaling keeps, per GEMM, fp32 scales and an amax history of
//       amax_history_len rows for 3 forward and 2 backward tensors
//       (module/base.py L1137-1139; quantization.py L1433-1442): 1024 rows by
//       TE's default (common/recipe/__init__.py L255), 1 under Megatron
//       (transformer_config.py@d98e8a64ddf3 L621);
//     - FSDP2 modules do not cache or save the quantized weight (linear.py
//       L640-645, L1958): nothing persists when parameters are sharded.
//   torchao Float8Linear (--fp8-recipe tensorwise, rowwise; torchtitan): the
//     matmul saves its high-precision input and weight and re-quantizes both
//     in backward (pytorch/ao torchao/float8/float8_linear.py@36027d82d1ad
//     L45, L93-200): memory is the 16-bit run's. FSDP float8 all-gather is off
//     by default (torchao/float8/config.py L225) and torchtitan's converter
//     has no option for it (torchtitan/components/quantization/float8.py
//     @b5bcd76c66d0 L56-70, L113-115).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/shape.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct Job;

// Transformer Engine's recipes (delayed, current, mxfp8, nvfp4); tensorwise
// and rowwise are torchao's.
bool te_recipe(Fp8Recipe r);

// A TE recipe's quantized data: num/den bytes per element and one 1-byte
// block scale per `scale_block` elements (0: a per-tensor fp32 scale only).
struct QuantFormat {
    std::int64_t num = 1, den = 1, scale_block = 0;
};
QuantFormat te_format(Fp8Recipe r);

// Whether TE keeps a physical transpose for column-wise FP8 data on a GPU of
// this compute capability (not on sm100-119 and sm130+: utils.py L658-663).
bool te_needs_transpose(int compute_capability);

// The allocations of one weight [rows, cols] quantized row- and column-wise
// (TE's cached workspace), and the delayed-scaling state of its GEMM.
std::vector<Bytes> te_weight_workspace(Fp8Recipe r, std::int64_t rows, std::int64_t cols, int compute_capability);
std::vector<Bytes> te_scaling_state(Fp8Recipe r, std::int64_t amax_history_len);

// The amax history length the job's framework sets (Megatron 1, TE 1024).
std::int64_t te_amax_history(const Job& job);

// Whether the job keeps TE's weight workspaces: a TE recipe in training on
// unsharded, unquantized parameters.
bool te_weight_cache(const Job& job);

// What TE keeps for one tensor of parameter `prm` whose shape on the rank is
// `shape`: nothing unless it is the weight of a linear TE runs (not the
// output layer, nor a router).
struct Fp8WeightAllocs {
    std::vector<Bytes> copies;  // the quantized workspace
    std::vector<Bytes> state;   // delayed scaling's scales and amax history
    [[nodiscard]] Bytes total() const;
};
Fp8WeightAllocs fp8_weight_allocs(const Job& job, const Param& prm, const Shape& shape);

// The assumptions line of a recipe (printed with every estimate using it).
std::string fp8_assumption(Fp8Recipe r, Framework f);

}  // namespace gpumem
