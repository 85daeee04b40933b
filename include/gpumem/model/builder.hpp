// gpumem/model/builder.hpp — building blocks of the model graph, one helper
// per PyTorch op, each recording what autograd saves for that op's backward.
//
// The saved-tensor rules follow tools/autograd/derivatives.yaml (PyTorch
// 1.13-2.x) and are checked against the CPU oracle (oracle/, fixtures in
// tests/fixtures/oracle/):
//   addmm/mm/matmul (Linear)   saves its input (and the weight, a parameter)
//   bmm (batched matmul)       saves both operands
//   softmax / _log_softmax     saves its output
//   native_dropout (p > 0)     saves a bool mask (1 byte/element); p == 0 saves nothing
//   native_layer_norm          saves input, fp32 mean and rstd (one per row)
//   relu/tanh/sigmoid          save their output;  gelu/silu save their input
//   mul (tensor * tensor)      saves both operands; mul by a Python scalar saves nothing
//   pow(x, k)                  saves x;  rsqrt saves its output
//   embedding                  saves the indices
//   convolution                saves input;  max_pool2d saves input and int64 indices
//   native_batch_norm (train)  saves input and fp32 per-channel mean/invstd
//   add, views, reshapes of contiguous tensors save nothing
// Parameters saved by ops are never counted as activations.
#pragma once

#include <string>

#include "gpumem/model/graph.hpp"

namespace gpumem {

class BlockBuilder {
public:
    BlockBuilder(std::string name, std::int64_t repeat, DType param_dtype);

    // The block input (tensor 0): the previous block's output.
    TensorId input(const std::string& name, Extent e, ActRole role);
    // A fresh model input inside the block (token ids, labels).
    TensorId data(const std::string& name, Extent e, ActRole role);

    // Parameters. Returns the index into Block::params.
    std::int32_t param(const std::string& name, std::vector<std::int64_t> shape, Component c,
                       const std::string& module = "", bool linear_weight = false, std::int64_t count = 1);
    // A parameter read by the op added last (a bias, a norm weight, a gate's logits).
    std::int32_t param_of_last_op(const std::string& name, std::vector<std::int64_t> shape, Component c, const std::string& module = "");

    // Ops. `tokens_extent` style: every helper takes the extent of its output
    // (elements per b,s) so that callers control shapes.
    // `vocab_parallel` false: a position / token-type table, whole on every
    // tensor-parallel rank (Param::tp_replicated).
    TensorId embedding(TensorId ids, std::int64_t vocab, std::int64_t dim, const std::string& name, Component c,
                       bool add_param = true, bool vocab_parallel = true);
    // nn.Linear on the last dim: out has extent `rows * out_features` where the
    // input extent is `rows * in_features`.
    TensorId linear(TensorId x, std::int64_t in, std::int64_t out, bool bias, const std::string& name, Component c,
                    bool add_param = true);
    TensorId matmul(TensorId a, TensorId b, Extent out, std::int64_t flops_per_out, const std::string& name,
                    bool save_a = true, bool save_b = true, std::uint8_t flags = 0);
    TensorId softmax(TensorId x, const std::string& name, ActRole out_role, std::uint8_t flags = 0);
    TensorId dropout(TensorId x, double p, const std::string& name, std::uint8_t flags = 0);
    TensorId layernorm(TensorId x, std::int64_t dim, bool bias, const std::string& name, Component c = Component::Norms,
                       bool add_param = true);
    // HF-style RMSNorm written with elementwise ops in fp32; `gemma` adds (1 + w).
    TensorId rmsnorm(TensorId x, std::int64_t dim, const std::string& name, Component c = Component::Norms,
                     bool add_param = true);
    enum class Act { ReLU, GELU, GELUTanh /* F.gelu(approximate='tanh') */, GELUNew /* gpt2 manual */, SiLU, Tanh, Sigmoid };
    TensorId activation(TensorId x, Act a, const std::string& name);
    TensorId add(TensorId a, TensorId b, const std::string& name);
    TensorId mul(TensorId a, TensorId b, const std::string& name);
    // Elementwise op producing a new tensor with explicit saved inputs.
    TensorId elementwise(const std::vector<TensorId>& in, Extent out, ActRole role, const std::vector<TensorId>& saved,
                         const std::string& name, std::uint8_t flags = 0);
    // `.to(role)`: a copy unless the dtypes match at estimate time.
    TensorId cast(TensorId x, ActRole role, const std::string& name);
    // View / reshape of a contiguous tensor: same storage, nothing saved.
    TensorId view(TensorId x, Extent e, const std::string& name);
    // A copy (e.g. .contiguous() of a permuted tensor, torch.cat).
    TensorId copy(TensorId x, Extent e, const std::string& name, ActRole role);

    TensorId conv2d(TensorId x, std::int64_t in_ch, std::int64_t out_ch, std::int64_t k, bool bias, Extent out,
                    std::int64_t out_hw, const std::string& name);
    TensorId batchnorm2d(TensorId x, std::int64_t ch, const std::string& name);
    TensorId maxpool2d(TensorId x, Extent out, std::int64_t k, const std::string& name);
    TensorId avgpool2d(TensorId x, Extent out, const std::string& name, bool adaptive);

    // Causal-LM / classification losses. Logits are upcast to fp32 where the
    // HF code does (`logits.float()`), cross-entropy saves log_softmax output.
    TensorId cross_entropy(TensorId logits, Extent logits_extent, Extent rows, bool upcast_fp32, const std::string& name);
    TensorId mse_loss(TensorId x, const std::string& name);
    TensorId sum_loss(TensorId x, const std::string& name);

    // Records an attention core (ops flagged kAttnCore between q/k/v and out).
    void mark_attention(TensorId q, TensorId k, TensorId v, TensorId out, std::int64_t heads, bool causal = false);

    // Low-level: append an op.
    Op& op(OpKind kind, const std::string& name, std::vector<TensorId> in, std::vector<TensorId> out,
           std::vector<SavedRef> saved = {});
    TensorId tensor(const std::string& name, Extent e, ActRole role, TensorId alias_of = -1);

    [[nodiscard]] const TensorInfo& info(TensorId t) const { return block_.tensors.at(static_cast<std::size_t>(t)); }
    [[nodiscard]] Block& block() { return block_; }
    Block finish(TensorId output);

private:
    Block block_;
    DType param_dtype_;
};

// Divides an extent by a positive integer (e.g. rows = x / in_features).
Extent extent_div(Extent e, std::int64_t k);
Extent extent_mul(Extent e, std::int64_t k);

}  // namespace gpumem
