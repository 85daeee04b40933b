// gpumem/model/safetensors.hpp — reads safetensors headers, never the weights.
//
// Format (huggingface/safetensors README): 8-byte little-endian header length
// N, then N bytes of JSON {"name": {"dtype": "BF16", "shape": [..],
// "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data. The
// header is validated: N must fit in the file, offsets must match
// shape x dtype size, lie inside the data section and not overlap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/core/dtype.hpp"

namespace gpumem {

struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::F32;
    std::vector<std::int64_t> shape;
    std::int64_t numel = 0;
    std::int64_t begin = 0;
    std::int64_t end = 0;
};

struct SafetensorsHeader {
    std::vector<SafetensorsEntry> tensors;  // sorted by name
    std::int64_t file_size = 0;
};

Result<SafetensorsHeader> read_safetensors_header(const std::string& path);
// Parses an in-memory header (the bytes after the 8-byte length) for a file of
// data size `data_size`; used by tests and the fuzzer.
Result<SafetensorsHeader> parse_safetensors_header(const std::string& json_text, std::int64_t data_size,
                                                   const std::string& origin);

}  // namespace gpumem
