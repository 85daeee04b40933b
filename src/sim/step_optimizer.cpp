// The optimizer step and zero_grad of a training step: optimizer states created
// on the first step, the temporaries of the foreach / for-loop / Adafactor
// updates, and set_to_none freeing every gradient (see gpumem/sim/step.hpp).
#include <string>

#include "gpumem/memory/features.hpp"
#include "step_internal.hpp"

namespace gpumem::sim::detail {

void StepBuilder::optimizer_step(int step) {
    em_.phase = Phase::Optimizer;
    const Optimizer o = job_.req.optimizer;
    const OptimizerImpl impl = job_.opt_impl;
    const DType sd = job_.state_dt;
    const std::int32_t slabel = em_.label(std::string("optimizer state (") + to_string(o) + ")");
    const std::int32_t tlabel = em_.label(std::string("optimizer temporary (") + to_string(impl) + ")");
    const std::int64_t tp = std::max<std::int64_t>(1, job_.layout.cfg.tp);
    // This rank's slice of every trainable tensor (its dp shard when states are
    // sharded); states are created lazily on the first step (torch.optim
    // _init_group); offloaded states live and update on the CPU.
    std::vector<std::int64_t> per;
    // Optimizer in backward: every tensor was stepped in its hook; step() has
    // nothing to do and zero_grad nothing to free.
    if (job_.layout.cfg.offload_optimizer == Offload::None && !inbwd_)
        for (const auto& rt : tensors_) {
            if (!rt.trainable) continue;
            const TrainTensor tt = state_tensor(g_, rt, shard_opt_, tp);
            for (std::int64_t k = 0; k < rt.copies; ++k) {
                per.push_back(rt.sharded_elems(shard_opt_));
                // Paged optimizers keep the large states in managed memory (features.hpp).
                if (step == 0)
                    states_.push_back(em_.alloc(optimizer_bytes(o, TrainTensor{tt.shape, 1}, sd) - paged_state_bytes(o, TrainTensor{tt.shape, 1}), slabel));
            }
        }
    // fp16 with fp32 master weights: gradients are copied to fp32 for the update.
    std::vector<std::int64_t> master_grads;
    if (job_.master > Bytes(0) && job_.tdt != DType::F32)
        for (auto e : per) master_grads.push_back(em_.alloc(dtype_bytes(DType::F32, e), tlabel));
    const bool adam_like = o == Optimizer::Adam || o == Optimizer::AdamW || o == Optimizer::Lion;
    if (adam_like && impl == OptimizerImpl::Foreach) {
        // _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), one list.
        std::vector<std::int64_t> tmp;
        for (auto e : per) tmp.push_back(em_.alloc(dtype_bytes(sd, e), tlabel));
        for (auto id : tmp) em_.unref(id);
    } else if (adam_like && impl == OptimizerImpl::ForLoop) {
        // _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps):
        // the sqrt and the quotient coexist, and the previous parameter's `denom`
        // stays bound until the new one is assigned (measured by oracle/step_oracle.py).
        std::int64_t denom = 0;
        for (auto e : per) {
            const auto a = em_.alloc(dtype_bytes(sd, e), tlabel);
            const auto b = em_.alloc(dtype_bytes(sd, e), tlabel);
            em_.unref(a);
            em_.unref(denom);
            denom = b;
        }
        em_.unref(denom);
    } else if (o == Optimizer::Adafactor) {
        // transformers Adafactor: update = grad**2 + eps, then the scaled update.
        for (auto e : per) {
            const auto a = em_.alloc(dtype_bytes(DType::F32, e), tlabel);
            const auto b = em_.alloc(dtype_bytes(DType::F32, e), tlabel);
            em_.unref(a);
            em_.unref(b);
        }
    }
    for (auto id : master_grads) em_.unref(id);
    em_.mark();
    out_.steps.back().after_optimizer = em_.live();

    em_.phase = Phase::ZeroGrad;
    if (job_.req.zero_grad == ZeroGrad::SetToNone) {
        for (auto& [key, id] : grads_) {
            em_.unref(id);
            id = 0;
        }
    }
    em_.mark();
    out_.steps.back().after_zero_grad = em_.live();
}

}  // namespace gpumem::sim::detail
