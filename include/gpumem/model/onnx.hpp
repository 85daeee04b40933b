// gpumem/model/onnx.hpp — reads an ONNX model (graph, inputs, initializer
// metadata, node attributes) into gpumem's model graph.
//
// Why: an ONNX export is the one framework-neutral description of a network's
// forward pass. Its graph says which ops run on which shapes, which is what
// autograd's saved tensors (training) and the live tensors of a no-grad forward
// (inference) depend on; its initializers say which parameters and buffers
// exist. Tensor data is never read: external data files are never opened.
//
// What it models (docs/onnx.md, research in docs/research/onnx.md):
//   * parsing with libonnx's generated protobuf classes only (onnx_proto);
//     libonnx 1.12's own shape inference crashes on hostile files, so shapes
//     come from gpumem's rules for the ops torch.onnx.export (1.13, opset
//     13-17) writes for MLPs, CNNs, transformers and UNets;
//   * symbolic dims: dim 0 of every graph input is the batch, a second
//     symbolic dim the sequence. The graph is evaluated at concrete probes
//     (batch 1-2, several sequence lengths, shape arithmetic constant-folded)
//     and each tensor's size is fitted to b·(c0 + c1·s + c2·s²), or to a
//     batch-independent size (TensorInfo::per_batch = false);
//   * each node becomes a model-graph op whose saved tensors follow what
//     PyTorch 1.13 autograd keeps (tools/autograd/derivatives.yaml v1.13.1,
//     table in docs/research/onnx.md §5), with strides tracked so that views
//     share storage and a reshape of a non-viewable tensor is a copy;
//   * initializers are trainable parameters, except buffers: BatchNorm's
//     running mean/var (inputs 3 and 4), non-float tensors, tensors used only
//     as shapes, indices or masks, and known buffer names;
//   * a graph whose output is not a loss gets OnnxOptions::loss applied.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpumem/core/result.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

struct OnnxOptions {
    // Loss appended when the graph's output is not a loss: "sum" (out.sum()),
    // "mean" (out.mean()), "cross-entropy" (over the last dim, int64 labels,
    // mean reduction), "none". Empty: "sum" with a note, as layer lists do.
    std::string loss;
    // Files larger than this are refused before reading (protobuf's own
    // limit on one message is 2 GiB).
    std::int64_t max_file_bytes = std::int64_t{2} << 30;
};

// Reads a .onnx file (a regular file, at most max_file_bytes).
Result<ModelGraph> load_onnx_file(const std::string& path, const OnnxOptions& opts = {});
// Reads serialized ModelProto bytes; `origin` names them in messages.
Result<ModelGraph> load_onnx_bytes(std::string_view bytes, const std::string& origin, const OnnxOptions& opts = {});

}  // namespace gpumem
