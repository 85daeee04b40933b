// gpumem/memory/llamacpp.hpp — what llama.cpp allocates when it loads a GGUF
// model and creates a context.
//
// llama.cpp prints its memory as buffers: per device a model buffer (the
// tensors of the layers offloaded with -ngl), a KV buffer (cells x the
// device's layers x (K row + V row) in the -ctk/-ctv types) and a compute
// buffer (the worst-case graph for -ub tokens, sized by ggml-alloc), plus on
// the host the mmap'd span of the tensors left on the CPU (CPU_Mapped), the
// host side of the compute graph (CUDA_Host) and the output buffer. This
// predicts those lines before anyone starts it, from the GGUF header (every
// tensor's type and offset) or, with no file at hand, from a model's
// parameters and llama-quantize's per-tensor type mix for a file type
// (src/llama-quant.cpp). Rules read at llama.cpp a95a11e5b834 (2026-04-30) and
// c392e5094dea (2025-02-20) with file and line in docs/research/llamacpp.md;
// checked against 22 public load logs (tests/fixtures/groundtruth/
// llamacpp_logs.json): model and KV buffers to 0.02 MiB; compute buffers are
// empirical fits, named as estimates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/memory/serving.hpp"
#include "gpumem/model/gguf.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// A GGUF model as llama.cpp's loader sees it.
struct LlamaTensor {
    std::string name;              // "blk.3.attn_v.weight"
    int layer = -1;                // -1: input layer (token_embd), n_layer: output layer, else the block
    const GgmlType* type = nullptr;
    std::vector<std::int64_t> ne;  // ggml order
    std::uint64_t offset = 0;      // in the data section
    std::int64_t bytes = 0;
};
struct LlamaModel {
    std::string name;
    std::string arch;              // general.architecture ("llama", "qwen3", "gptneox", ...)
    std::string file_type;         // "Q4_K_M" (the --quant asked for, or the file's general.file_type)
    std::int64_t n_layer = 0, n_embd = 0, n_head = 0, n_ff = 0, n_vocab = 0, n_ctx_train = 0;
    std::vector<std::int64_t> n_embd_k_gqa, n_embd_v_gqa;  // per layer (K and V row lengths)
    bool fused_qkv = false;        // one attn_qkv tensor per layer
    bool tied = false;             // no output.weight: the GPU gets a copy of token_embd
    bool rope_freqs = false;       // rope_freqs.weight, duplicated into each buffer that has layers
    std::int64_t n_swa = 0;        // sliding window (tokens) of the layers marked in swa_layers
    std::vector<bool> swa_layers;  // per layer: sliding-window attention (llama_kv_cache_iswa)
    std::int64_t data_size = 0;    // the file's data section
    std::vector<LlamaTensor> tensors;  // in file order
    std::vector<std::string> notes;
};

// The tensor table llama-quantize writes for `file_type` (F32, F16, BF16,
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K,
// IQ4_NL, IQ4_XS) from a model's parameters, without an importance matrix
// (llama-quant.cpp@a95a11e5b834 llama_tensor_get_type L439-632); files
// quantized before llama.cpp #19770 (2026-03) gave fused attn_qkv its own rule
// (old_qkv_rule). Tensors in the converter's order (token_embd, blocks,
// output_norm, output), offsets padded to 32 bytes.
// `imatrix`: whether an importance matrix was used (default: where
// llama-quantize requires one, IQ1/IQ2/IQ3_XXS/IQ3_XS/Q2_K_S).
Result<LlamaModel> llama_model_from_graph(const ModelGraph& g, std::string_view file_type, bool old_qkv_rule,
                                          std::optional<bool> imatrix = std::nullopt);
// The model a GGUF header describes (its tensors' own types and offsets).
Result<LlamaModel> llama_model_from_gguf(const GgufFile& f, std::string_view name);
// "q4_K: 193, q6_K: 33, f32: 66" as llama_model_loader logs it: count per type, by ggml type id.
std::vector<std::pair<std::string, std::int64_t>> tensor_type_counts(const LlamaModel& m);

// `llama-server ...` / `llama-cli ...` (common/arg.cpp flag names) onto the options.
void apply_llamacpp_command(const std::vector<std::string>& argv, std::size_t first, ServingOptions& o, EstimateRequest& job);

// llama.cpp's buffers for a job (memory/serving.hpp calls this for --engine llama.cpp).
ServingResult llamacpp_memory(const EstimateRequest& job, const ServingOptions& o);

}  // namespace gpumem
