// FP8 / FP4 recipes' tensors (gpumem/memory/fp8.hpp). Sizes follow the
// tensors Transformer Engine allocates (NVIDIA/TransformerEngine @d0067d0da6cb).
#include "gpumem/memory/fp8.hpp"

#include "gpumem/memory/job.hpp"

namespace gpumem {

bool te_recipe(Fp8Recipe r) { return r == Fp8Recipe::Delayed || r == Fp8Recipe::Current || r == Fp8Recipe::MXFP8 || r == Fp8Recipe::NVFP4; }

QuantFormat te_format(Fp8Recipe r) {
    switch (r) {
        // MXFP8BlockScaling: an E8M0 scale per 32 values (common/recipe/__init__.py L336-344).
        case Fp8Recipe::MXFP8: return {1, 1, 32};
        // NVFP4BlockScaling: E2M1 data, an E4M3 scale per 16 values (L488-497).
        case Fp8Recipe::NVFP4: return {1, 2, 16};
        default: return {1, 1, 0};
    }
}

// is_non_tn_fp8_gemm_supported: (10, 0) <= cc < (12, 0) or cc >= (13, 0).
bool te_needs_transpose(int cc) { return !((cc >= 100 && cc < 120) || cc >= 130); }

std::vector<Bytes> te_weight_workspace(Fp8Recipe r, std::int64_t rows, std::int64_t cols, int cc) {
    const std::int64_t n = checked_mul(rows, cols);
    switch (r) {
        case Fp8Recipe::Delayed:
        case Fp8Recipe::Current:
            // Float8Quantizer / Float8CurrentScalingQuantizer::create_tensor with
            // both usages: uint8 data, a uint8 transpose where the GPU needs one,
            // an fp32 scale-inverse [1].
            if (te_needs_transpose(cc)) return {Bytes(n), Bytes(n), Bytes(4)};
            return {Bytes(n), Bytes(4)};
        case Fp8Recipe::MXFP8:
            // MXFP8Quantizer.inner_tensor_specs: row-wise data and scales
            // [roundup(M, 128), roundup(K // 32, 4)], column-wise data and scales
            // [roundup(M // 32, 4), roundup(K, 128)].
            return {Bytes(n), Bytes(checked_mul(checked_round_up(rows, 128), checked_round_up(cols / 32, 4))), Bytes(n),
                    Bytes(checked_mul(checked_round_up(rows / 32, 4), checked_round_up(cols, 128)))};
        case Fp8Recipe::NVFP4:
            // NVFP4Quantizer.inner_tensor_specs: row-wise [M, K // 2] and scales
            // [roundup(M, 128), roundup(ceil(K / 16), 4)], column-wise (transposed)
            // [K, M // 2] and scales [roundup(K, 128), roundup(ceil(M / 16), 4)],
            // an fp32 amax per usage.
            return {Bytes(checked_mul(rows, cols / 2)), Bytes(checked_mul(checked_round_up(rows, 128), checked_round_up(checked_ceil_div(cols, 16), 4))),
                    Bytes(checked_mul(cols, rows / 2)), Bytes(checked_mul(checked_round_up(cols, 128), checked_round_up(checked_ceil_div(rows, 16), 4))), Bytes(4), Bytes(4)};
        default: return {};
    }
}

std::vector<Bytes> te_scaling_state(Fp8Recipe r, std::int64_t len) {
    if (r != Fp8Recipe::Delayed) return {};
    // DelayedScalingRecipeState per mode: scale [n] and amax_history [len, n]
    // fp32, n = 3 forward (input, weight, output) and 2 backward tensors per GEMM.
    return {Bytes(3 * 4), Bytes(checked_mul(len, 3 * 4)), Bytes(2 * 4), Bytes(checked_mul(len, 2 * 4))};
}

std::int64_t te_amax_history(const Job& job) { return job.framework.framework == Framework::Megatron ? 1 : 1024; }

bool te_weight_cache(const Job& job) {
    const ParallelConfig& c = job.layout.cfg;
    // The graph rewrite is on for TE recipes on transformer models in training.
    return job.train && job.framework.rewrite.fp8_linear_inputs && job.quant == Quant::None && c.zero != 3 && c.fsdp == Fsdp::None;
}

Bytes Fp8WeightAllocs::total() const {
    Bytes s;
    for (const Bytes& b : copies) s += b;
    for (const Bytes& b : state) s += b;
    return s;
}

Fp8WeightAllocs fp8_weight_allocs(const Job& job, const Param& prm, const Shape& shape) {
    Fp8WeightAllocs a;
    if (!te_weight_cache(job) || !prm.linear_weight || prm.output_head || prm.component == Component::Router || shape.size() < 2) return a;
    std::int64_t rows = 1;
    for (std::size_t i = 0; i + 1 < shape.size(); ++i) rows = checked_mul(rows, shape[i]);
    a.copies = te_weight_workspace(job.req.fp8_recipe, rows, shape.back(), job.gpu.compute_capability);
    a.state = te_scaling_state(job.req.fp8_recipe, te_amax_history(job));
    return a;
}

std::string fp8_assumption(Fp8Recipe r, Framework f) {
    const std::string te = "NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py@d0067d0da6cb";
    switch (r) {
        case Fp8Recipe::None: return {};
        case Fp8Recipe::Tensorwise:
        case Fp8Recipe::Rowwise:
            return std::string("--fp8-recipe ") + to_string(r) +
                   " (torchao Float8Linear): each linear saves its 16-bit input and weight and re-quantizes them in backward, so memory is the "
                   "16-bit run's [pytorch/ao torchao/float8/float8_linear.py@36027d82d1ad L45, L93-200]; FSDP float8 all-gather off (torchao "
                   "config.py L225; torchtitan has no option for it); the FP8 casts each matmul makes and frees are not modelled";
        default: break;
    }
    const QuantFormat q = te_format(r);
    std::string saved = q.den == 2 ? "half a byte per element and an E4M3 scale per 16" : q.scale_block > 0 ? "1 byte per element and an E8M0 scale per 32" : "1 byte per element";
    std::string s = std::string("--fp8-recipe ") + to_string(r) + " (Transformer Engine " +
                    (r == Fp8Recipe::Delayed ? "DelayedScaling" : r == Fp8Recipe::Current ? "Float8CurrentScaling" : r == Fp8Recipe::MXFP8 ? "MXFP8BlockScaling" : "NVFP4BlockScaling") +
                    "): each linear saves the column-wise quantized copy of its input (" + saved + ") for the weight gradient, linears TE fuses (QKV, "
                    "FC1) one copy [" + te + " L428-436, L600-621]";
    if (f == Framework::Megatron && r != Fp8Recipe::Delayed)
        s += "; Megatron's attention output projection saves the attention output itself [NVIDIA/Megatron-LM megatron/core/transformer/attention.py@d98e8a64ddf3 L428-444]";
    s += "; every linear weight is kept quantized row- and column-wise";
    s += r == Fp8Recipe::MXFP8 || r == Fp8Recipe::NVFP4 ? " with block scales" : " (a transpose on Hopper and Ada, one buffer on Blackwell)";
    s += std::string(" across micro-batches and steps (the is_first_microbatch workspace cache") +
         (f == Framework::Megatron ? ", which Megatron uses" : "; TE modules called without it keep the same copies from forward to their backward") + ") [" + te +
         " L1958-1961, L2068-2071; csrc/quantizer.cpp L361-384]; not with FSDP/ZeRO-3 sharded parameters [linear.py L640-645]";
    if (r == Fp8Recipe::Delayed)
        s += std::string("; amax history of ") + (f == Framework::Megatron ? "1 row (Megatron --fp8-amax-history-len)" : "1024 rows (TE's default)") +
             " x 5 fp32 per GEMM [transformer_engine/pytorch/quantization.py@d0067d0da6cb L1433-1442]";
    s += "; the transient FP8 casts of inputs and output gradients are not modelled";
    return s;
}

}  // namespace gpumem
