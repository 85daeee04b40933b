// gpumem/core/dtype.hpp — element types and their storage sizes.
//
// Sizes follow PyTorch's element sizes (torch.finfo/iinfo) and safetensors'
// dtype names; 4-bit formats (bitsandbytes nf4/fp4, GPTQ/AWQ int4) pack two
// values per byte, so byte counts are computed from bits, rounding up.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpumem/core/bytes.hpp"

namespace gpumem {

enum class DType : std::uint8_t { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, Bool, NF4, Int4 };

int dtype_bits(DType t);
std::string_view dtype_name(DType t);  // "float32", "bfloat16", ...
// Accepts torch names (float32, bfloat16, torch.float16, fp16, bf16, int8 ...)
// and safetensors names (F32, BF16, I64, BOOL, F8_E4M3 ...).
std::optional<DType> parse_dtype(std::string_view s);

// Bytes of `elements` values of type t (4-bit types round up to whole bytes).
Bytes dtype_bytes(DType t, std::int64_t elements);

}  // namespace gpumem
