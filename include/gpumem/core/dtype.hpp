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

// Inline: an estimate asks for sizes dozens of times, a planner's search
// millions (a call was 53 instructions, most of them the call itself).
constexpr int dtype_bits(DType t) {
    switch (t) {
        case DType::F64: case DType::I64: return 64;
        case DType::F32: case DType::I32: return 32;
        case DType::F16: case DType::BF16: case DType::I16: return 16;
        case DType::F8_E4M3: case DType::F8_E5M2: case DType::I8: case DType::U8: case DType::Bool: return 8;
        case DType::NF4: case DType::Int4: return 4;
    }
    return 8;
}
std::string_view dtype_name(DType t);  // "float32", "bfloat16", ...
// Accepts torch names (float32, bfloat16, torch.float16, fp16, bf16, int8 ...)
// and safetensors names (F32, BF16, I64, BOOL, F8_E4M3 ...).
std::optional<DType> parse_dtype(std::string_view s);

// Bytes of `elements` values of type t (4-bit types round up to whole bytes).
inline Bytes dtype_bytes(DType t, std::int64_t elements) {
    const std::int64_t bits = checked_mul(elements, dtype_bits(t));
    return Bytes(bits / 8 + (bits % 8 ? 1 : 0));
}

}  // namespace gpumem
