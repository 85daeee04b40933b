// gpumem/model/gguf.hpp — reads GGUF headers (llama.cpp's model files), never
// the tensor data.
//
// Why: a GGUF file states every tensor's ggml type and shape and the model's
// hyper-parameters (layers, heads, KV heads, context length, vocab size), which
// is what a llama.cpp memory prediction needs; the quantization mix of a file
// cannot be guessed reliably from its name (docs/research/llamacpp.md §2).
//
// Format (docs/research/llamacpp.md §1; llama.cpp commit a95a11e5b834,
// ggml/include/gguf.h and ggml/src/gguf.cpp): magic "GGUF", uint32 version
// (2 or 3), int64 n_tensors, int64 n_kv, n_kv key/value pairs, n_tensors
// tensor infos (name, n_dims, ne[], ggml type, offset), padding to the
// alignment, then the data section. All integers are little-endian. The
// header is validated the way gguf.cpp validates it (counts, types, shapes,
// offsets equal to the running padded sum) and every tensor's data must lie
// inside the file (llama.cpp's loader check; the padding after the last tensor
// may be missing).
//
// Type sizes (elements per block / bytes per block) come from ggml/src/ggml.c
// type_traits[] and the static_asserts of ggml/src/ggml-common.h at the same
// commit, as tabulated in docs/research/llamacpp.md §1 "ggml type sizes".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/result.hpp"

namespace gpumem {

// One ggml tensor type: ggml.c type_traits[id].blck_size / .type_size.
struct GgmlType {
    int id = 0;              // ggml_type enum value (F32 0, F16 1, Q4_0 2, ..., BF16 30, MXFP4 39, NVFP4 40, Q1_0 41)
    const char* name = "";   // llama.cpp's spelling (ggml_type_name): "f32", "q4_K", "iq4_xs", ...
    std::int64_t block = 1;  // elements per block
    std::int64_t bytes = 4;  // bytes per block
};

// nullptr when the id is not a ggml type this reader knows (removed ids such
// as 4, 5 and 31-33 included).
const GgmlType* ggml_type_by_id(int id);
// Case-insensitive ("Q4_K", "q4_k", "q4_K" all work); nullptr when unknown.
const GgmlType* ggml_type_by_name(std::string_view name);
// Bytes of one row of ne0 elements: ne0 / block * bytes. Throws InputError
// (ErrorCode::InvalidArgument, field "model") when ne0 is negative, not a
// multiple of the block, or on overflow; call it under capture().
std::int64_t ggml_row_bytes(const GgmlType& t, std::int64_t ne0);
// Bytes of a tensor of shape ne (ne[0] is the row length, as in ggml; missing
// dimensions are 1, at most 4): row bytes x ne[1] x ne[2] x ne[3]. Throws like
// ggml_row_bytes (also for a negative dimension or more than 4 dimensions).
std::int64_t ggml_nbytes(const GgmlType& t, const std::vector<std::int64_t>& ne);

struct GgufTensor {
    std::string name;
    std::vector<std::int64_t> ne;  // 1..4 dims, ggml order (ne[0] = row length)
    int type = 0;                  // ggml_type id
    std::uint64_t offset = 0;      // relative to the data section
    std::int64_t bytes = 0;        // ggml_nbytes
};

struct GgufFile {
    std::uint32_t version = 0;
    std::string architecture;       // general.architecture ("" if absent)
    std::uint64_t alignment = 32;   // general.alignment or 32 (gguf.h GGUF_DEFAULT_ALIGNMENT)
    std::uint64_t data_offset = 0;  // file offset of the data section (header end rounded up to alignment)
    std::int64_t data_size = 0;     // sum over tensors of bytes padded to alignment
    std::int64_t file_size = 0;     // the file's size (for parse from bytes: the size passed in)
    std::int64_t file_type = -1;    // general.file_type (llama_ftype) or -1
    std::map<std::string, std::int64_t> ints;      // integer and bool scalars (bool: 0/1)
    std::map<std::string, double> floats;          // float32/float64 scalars
    std::map<std::string, std::string> strings;    // string scalars (only the first 1 MiB of each is kept)
    std::map<std::string, std::vector<std::int64_t>> int_arrays;  // integer/bool arrays of at most 4096 elements
    std::map<std::string, std::int64_t> array_lengths;            // element count of every array
    std::vector<GgufTensor> tensors;                              // in file order

    // ints.at(architecture + "." + key) when present ("block_count" ->
    // "llama.block_count").
    [[nodiscard]] std::optional<std::int64_t> arch_int(std::string_view key) const;
    // nullptr when absent.
    [[nodiscard]] const GgufTensor* tensor(std::string_view name) const;
};

// Reads the header of a .gguf file. Only regular files are read (a FIFO,
// device or directory is an error naming the path); the header is read
// incrementally and array payloads that are not kept are skipped with seeks.
// Errors: ErrorCode::InvalidArgument with field "model" for a malformed file,
// NotFound for a missing one, Io when it cannot be read.
Result<GgufFile> read_gguf(const std::string& path);
// The same from bytes in memory (tests, fuzzer). `file_size` is the size of
// the whole file the bytes begin (>= bytes.size()): the header must lie in
// `bytes`, the data section may lie beyond them.
Result<GgufFile> parse_gguf(std::string_view bytes, std::int64_t file_size);

}  // namespace gpumem
