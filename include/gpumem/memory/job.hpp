// gpumem/memory/job.hpp — a request resolved against a model.
//
// Every consumer of a request (the analytic estimate, the step simulator,
// the planner) needs the same resolved facts: defaults filled in, dtypes of
// weights, gradients and optimizer states for the precision mode, the list of
// trainable tensors (full model or LoRA adapters), the activation context and
// the model-state byte totals. resolve_job() computes them once, validating
// the request with the messages every front end prints.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/shape.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/framework.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// One trainable tensor shape (count identical tensors).
struct TrainTensor {
    Shape shape;  // (core/shape.hpp: inline, no allocation)
    std::int64_t count = 1;
    [[nodiscard]] std::int64_t numel() const {
        std::int64_t n = count;
        for (auto d : shape) n = checked_mul(n, d);
        return n;
    }
};

// Optimizer state bytes for one tensor. Layouts:
//  SGD: none; SGD momentum: momentum_buffer; Adam/AdamW: exp_avg + exp_avg_sq
//  (torch/optim/adam.py _init_group); Lion: exp_avg (lucidrains/lion-pytorch);
//  AdamW 8-bit: bitsandbytes Optimizer2State: uint8 state1/state2 + fp32
//  absmax per 256-element block, tensors with < 4096 elements keep fp32
//  states (min_8bit_size); Adafactor (transformers.optimization.Adafactor,
//  beta1=None): fp32 exp_avg_sq_row [.., rows] + exp_avg_sq_col [.., cols] for
//  >= 2-D tensors, a full fp32 exp_avg_sq for 1-D, plus a scalar RMS.
//  Paged AdamW (bitsandbytes PagedAdamW / PagedAdamW32bit): fp32 state1 +
//  state2; paged 8-bit AdamW: the AdamW 8-bit layout.
Bytes optimizer_bytes(Optimizer o, const TrainTensor& t, DType state);

// The part of optimizer_bytes() a paged optimizer keeps in CUDA managed memory
// (outside PyTorch's caching allocator): state1/state2 of tensors with at
// least 1e5 elements. Zero for every other optimizer.
Bytes paged_state_bytes(Optimizer o, const TrainTensor& t);

// Weight bytes of one parameter under weight quantization (bitsandbytes
// Linear8bitLt / Linear4bit nf4 and fp4 with or without double quantization,
// GPTQ-style int4). Only nn.Linear weights are quantized; lm_head stays in the
// compute dtype (bnb's default skip list) unless quantize_head.
Bytes quantized_bytes(Quant q, const Param& p, DType fallback, bool double_quant, bool quantize_head);
// The same for `count` tensors of p's shape instead of p.count (1: one tensor).
Bytes quantized_bytes(Quant q, const Param& p, std::int64_t count, DType fallback, bool double_quant, bool quantize_head);

struct Job {
    EstimateRequest req;  // defaults filled in
    bool train = true;
    bool lora = false;
    bool amp = false;
    Precision prec = Precision::AmpBF16;
    DType half = DType::BF16;      // the 16-bit type of the precision mode
    DType lowered = DType::BF16;   // dtype of matmul outputs
    DType wdt = DType::F32;        // base weights
    DType tdt = DType::F32;        // trainable tensors and their gradients
    DType state_dt = DType::F32;   // optimizer states
    Quant quant = Quant::None;
    OptimizerImpl opt_impl = OptimizerImpl::Foreach;  // req.optimizer_impl or the framework's default
    std::int64_t seq = 1;
    GpuSpec gpu;
    Bytes capacity;
    ActivationContext actx;
    std::vector<TrainTensor> trainable;
    std::int64_t trainable_params = 0;
    std::int64_t largest_linear = 0;  // elements of the largest quantizable weight
    Bytes weights;                    // incl. adapters and quantization metadata
    Bytes adapter_weights;
    Bytes grads;
    Bytes master;                     // fp32 master weights (fp16 training)
    Bytes opt_states;                 // excl. master
    Bytes dequant;                    // 4-bit: one dequantized weight in flight (LLM.int8: in backward only)
    Bytes head_dequant;               // the same for a quantized output layer (--quantize-head), at the head
    bool dequant_in_forward = false;  // 4-bit: forward and backward; LLM.int8: backward only
    Layout layout;                    // resolved distributed layout (trivial on one GPU)
    FrameworkChoice framework;        // the training framework's behaviour (memory/framework.hpp)
    // The graph as the framework's kernels run it (model/rewrite.hpp); null
    // when it is the input graph. Read through job_graph().
    std::shared_ptr<const ModelGraph> graph;
    // What resolving said; analytic_estimate moves them into its result
    // (EstimateResult::assumptions / warnings), so the result's job holds none.
    std::vector<std::string> assumptions;
    std::vector<std::string> warnings;
};

Result<Job> resolve_job(const ModelGraph& g, const EstimateRequest& req);

// quantized_bytes() under a resolved job's quantization settings.
inline Bytes quantized_bytes(const Job& job, const Param& p) {
    return quantized_bytes(job.quant, p, job.wdt, job.req.double_quant, job.req.quantize_head);
}
// One tensor of p (p.count taken as 1).
inline Bytes quantized_tensor_bytes(const Job& job, const Param& p) {
    return quantized_bytes(job.quant, p, 1, job.wdt, job.req.double_quant, job.req.quantize_head);
}

// The graph a job runs: its framework's rewrite of `g`, or `g` itself.
inline const ModelGraph& job_graph(const ModelGraph& g, const Job& job) { return job.graph ? *job.graph : g; }

// The tensor whose optimizer states one rank keeps for a RankTensor: a flat
// 1-D partition when states are sharded (ZeRO / FSDP / distributed optimizer
// flatten parameters), else the parameter's own shape with its first
// dimension split over tp (Adafactor factors it by shape).
TrainTensor state_tensor(const ModelGraph& g, const RankTensor& rt, bool sharded, std::int64_t tp);

}  // namespace gpumem
