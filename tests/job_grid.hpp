// Generated grids of jobs for the invariant (metamorphic) tests.
//
// A deterministic generator (splitmix64, fixed seeds) draws jobs over model
// families (dense, tied embeddings, GQA/MQA, MoE, encoder-decoder, encoder),
// modes, precisions, optimizers and their implementations, recompute,
// attention, micro-batch, sequence, gradient accumulation and every layout kind
// (dp, tp with/without sp, pp 1F1B/interleaved/uneven, cp, ep, ZeRO 0-3, FSDP,
// Megatron's distributed optimizer, offload; paged optimizers, the optimizer
// in backward, FSDP1 and no_sync) and keeps those whose layout is valid. A failing job is printed as the gpumem command that reproduces it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gpumem/core/input.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/alloc_conf.hpp"
#include "gpumem/sim/step.hpp"

namespace gpumem::test {

// Other grids than CI's, for hunting (not for CI): GPUMEM_GRID_SEED=N moves
// every generator's seed by N (every test that draws jobs draws others), and
// GPUMEM_GRID_SCALE=K draws K times as many jobs per grid (1 to 100), e.g.
//   GPUMEM_GRID_SEED=100 GPUMEM_GRID_SCALE=4 build/tests/gpumem_tests --gtest_filter='Grid*'
// Both unset: the fixed grids the tests were written against.

// An environment variable's whole number in [lo, hi] (core/input.hpp's
// parser: a bad value stops the tests with the variable's name), or fallback.
inline std::int64_t env_number(const char* name, std::int64_t lo, std::int64_t hi, std::int64_t fallback) {
    const char* v = std::getenv(name);
    return v && *v ? parse_int_in_range(v, name, lo, hi) : fallback;
}
inline std::uint64_t grid_seed_shift() {
    static const auto shift = static_cast<std::uint64_t>(env_number("GPUMEM_GRID_SEED", 0, std::int64_t{1} << 40, 0));
    return shift;
}
inline int grid_count(int n) {
    static const auto scale = static_cast<int>(env_number("GPUMEM_GRID_SCALE", 1, 100, 1));
    return n * scale;
}

class Rng {
public:
    explicit Rng(std::uint64_t seed) : s_(seed + grid_seed_shift()) {}
    std::uint64_t next() {
        std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }
    template <class T>
    const T& pick(const std::vector<T>& v) { return v[static_cast<std::size_t>(below(static_cast<std::int64_t>(v.size())))]; }
    bool chance(int percent) { return below(100) < percent; }

private:
    std::uint64_t s_;
};

inline const ModelGraph& grid_model(const std::string& name) {
    static std::map<std::string, ModelGraph> cache;
    auto it = cache.find(name);
    if (it == cache.end()) {
        auto g = load_model(name);
        if (!g) throw std::runtime_error("grid model " + name + ": " + g.error().message);
        it = cache.emplace(name, std::move(g).value()).first;
    }
    return it->second;
}

// Models of the grid: small enough to simulate in milliseconds, covering the
// families the invariants must hold for.
inline const std::vector<std::string>& grid_models() {
    static const std::vector<std::string> m = {
        "gpt2",          // learned positions, tied head, LayerNorm, GELU
        "smollm2-135m",  // llama, tied head, GQA
        "qwen2-0.5b",    // GQA, tied head, qkv bias
        "llama-3.2-1b",  // tied head, GQA
        "gemma-2b",      // MQA, tied head
        "pythia-160m",   // gpt_neox, untied
        "opt-125m",
        "tinyllama-1.1b",
        "mixtral-8x7b",  // MoE
        "phi-2",
    };
    return m;
}

enum class GridKind { Single, DataParallel, Sharded, Tensor, Pipeline, Context, Expert, Inference };

struct GridJob {
    EstimateRequest req;
    GridKind kind = GridKind::Single;
};

// True when the request resolves (valid layout and options for the model).
inline bool grid_valid(const EstimateRequest& r) { return resolve_job(grid_model(r.model), r).ok(); }

// The step trace of a grid job's first rank, built with steady-state
// detection for the replay settings of its allocator configuration (what
// simulate_estimate builds for it).
inline sim::StepTrace grid_step_trace(const EstimateRequest& r) {
    const ModelGraph& g = grid_model(r.model);
    const Job job = resolve_job(g, r).value();
    sim::ReplayOptions ro;
    ro.config = sim::AllocatorConfig::parse(r.alloc_conf).value();
    sim::StepTraceOptions so;
    so.cublas_workspace = job.gpu.cublas_workspace;
    so.steady_state = &ro;
    return sim::build_step_trace(g, job, so);
}

// One random job of a kind; `valid` tells whether it resolved.
inline GridJob draw_job(Rng& rng, GridKind kind) {
    GridJob j;
    j.kind = kind;
    EstimateRequest& r = j.req;
    const bool moe_kind = kind == GridKind::Expert;
    r.model = moe_kind ? "mixtral-8x7b" : rng.pick(grid_models());
    r.analytic = false;
    r.batch = 1 + rng.below(3);
    r.seq = rng.pick(std::vector<std::int64_t>{64, 128, 256, 512, 1024, 2048, 8192});
    r.grad_accum = rng.pick(std::vector<std::int64_t>{1, 1, 2, 3, 4, 8});
    r.recompute = rng.pick(std::vector<Recompute>{Recompute::None, Recompute::None, Recompute::Selective, Recompute::Full});
    r.attention = rng.pick(std::vector<Attention>{Attention::Flash, Attention::Flash, Attention::Eager});
    if (*r.seq > 1024) r.attention = Attention::Flash;  // eager scores at long sequences: covered by shorter ones
    r.gpu_memory = Bytes(std::int64_t{1} << 50);  // replay without a capacity: the invariants concern what the job needs
    if (kind == GridKind::Inference) {
        r.mode = Mode::Infer;
        r.gen_len = rng.pick(std::vector<std::int64_t>{0, 1, 16, 100});
        r.precision = rng.pick(std::vector<Precision>{Precision::BF16, Precision::FP16, Precision::FP32});
        if (rng.chance(25)) r.quant = rng.pick(std::vector<Quant>{Quant::Int8, Quant::NF4, Quant::Int4});
        const std::int64_t tp = rng.pick(std::vector<std::int64_t>{1, 2, 4, 8});
        r.parallel.tp = tp;
        r.parallel.gpus = tp;
        if (rng.chance(30)) {
            r.parallel.pp = rng.pick(std::vector<std::int64_t>{2, 4});
            r.parallel.gpus = tp * r.parallel.pp;
        }
        return j;
    }
    const int m = static_cast<int>(rng.below(10));
    r.mode = m < 7 ? Mode::Train : (m < 9 ? Mode::Lora : Mode::QLora);
    if (r.mode == Mode::Train) {
        r.precision = rng.pick(std::vector<Precision>{Precision::AmpBF16, Precision::AmpBF16, Precision::BF16, Precision::FP16, Precision::FP32,
                                                      Precision::AmpFP16});
        r.optimizer = rng.pick(std::vector<Optimizer>{Optimizer::AdamW, Optimizer::AdamW, Optimizer::Adam, Optimizer::SGD, Optimizer::SGDMomentum,
                                                      Optimizer::AdamW8bit, Optimizer::Adafactor, Optimizer::Lion});
        const int impl = static_cast<int>(rng.below(5));  // unset twice out of five: the framework's default
        if (impl == 2) r.optimizer_impl = OptimizerImpl::Foreach;
        if (impl == 3) r.optimizer_impl = OptimizerImpl::Fused;
        if (impl == 4) r.optimizer_impl = OptimizerImpl::ForLoop;
        if (rng.chance(15)) r.zero_grad = ZeroGrad::Zero;
    } else {
        r.precision = rng.pick(std::vector<Precision>{Precision::AmpBF16, Precision::BF16});
        r.lora_rank = rng.pick(std::vector<std::int64_t>{8, 16, 64});
        if (rng.chance(30)) r.lora_targets = {"all-linear"};
    }
    ParallelConfig& p = r.parallel;
    const auto pow2 = [&](std::vector<std::int64_t> v) { return rng.pick(v); };
    switch (kind) {
        case GridKind::Single:
            break;
        case GridKind::DataParallel:
            p.gpus = pow2({2, 4, 8, 16});
            break;
        case GridKind::Sharded:
            p.gpus = pow2({2, 4, 8, 16, 32});
            switch (rng.below(6)) {
                case 0: p.zero = 1; break;
                case 1: p.zero = 2; break;
                case 2: p.zero = 3; break;
                case 3: p.fsdp = Fsdp::Full; break;
                case 4: p.fsdp = rng.pick(std::vector<Fsdp>{Fsdp::GradOp, Fsdp::Hybrid}); break;
                default: p.distributed_optimizer = true; break;
            }
            if (p.zero > 0 && rng.chance(20)) p.offload_optimizer = Offload::Cpu;
            if (p.zero == 3 && rng.chance(20)) p.offload_params = Offload::Cpu;
            break;
        case GridKind::Tensor:
            p.tp = pow2({2, 4, 8});
            p.sp = rng.chance(50);
            p.gpus = p.tp * pow2({1, 1, 2, 4});
            if (p.gpus > p.tp && rng.chance(50)) p.distributed_optimizer = true;
            break;
        case GridKind::Pipeline:
            p.pp = pow2({2, 4});
            p.tp = pow2({1, 1, 2});
            p.sp = p.tp > 1 && rng.chance(50);
            p.gpus = p.pp * p.tp * pow2({1, 2});
            r.grad_accum = rng.pick(std::vector<std::int64_t>{1, 2, 4, 8, 12});
            if (rng.chance(30)) {
                p.schedule = PipelineSchedule::Interleaved;
                p.vpp = 2;
            }
            if (rng.chance(30)) p.distributed_optimizer = true;
            else if (rng.chance(30)) p.zero = 1;
            break;
        case GridKind::Context:
            p.cp = 2;
            p.tp = pow2({1, 2});
            p.gpus = p.cp * p.tp * pow2({1, 2});
            break;
        case GridKind::Expert:
            p.ep = pow2({2, 4, 8});
            p.gpus = p.ep * pow2({1, 2});
            if (rng.chance(40)) {
                p.pp = 2;
                p.gpus *= 2;
            }
            if (rng.chance(50)) p.distributed_optimizer = true;
            break;
        case GridKind::Inference:
            break;
    }
    if (p.gpus > 8 && rng.chance(50)) p.gpus_per_node = 8;
    // Paged optimizers, the optimizer in backward, FSDP1 and no_sync (issue 12)
    // from a side generator seeded by the job drawn so far, so that the main
    // sequence, and with it every job the grids drew before, stays as it was.
    std::uint64_t seed = 0x51ed270b7e3a9c41ULL;
    for (char ch : r.model) seed = seed * 131 + static_cast<unsigned char>(ch);
    for (std::int64_t v : {r.batch, *r.seq, r.grad_accum, p.gpus, p.tp, p.pp, p.cp, p.ep, static_cast<std::int64_t>(p.zero),
                           static_cast<std::int64_t>(p.fsdp), static_cast<std::int64_t>(r.mode), static_cast<std::int64_t>(r.optimizer),
                           static_cast<std::int64_t>(r.recompute.value_or(Recompute::None)), static_cast<std::int64_t>(kind)})
        seed = seed * 1000003 + static_cast<std::uint64_t>(v);
    Rng side(seed);
    if (r.optimizer == Optimizer::AdamW8bit && side.chance(50)) r.optimizer = Optimizer::PagedAdamW8bit;
    else if (r.optimizer == Optimizer::AdamW && side.chance(15)) r.optimizer = Optimizer::PagedAdamW;
    else if (r.mode != Mode::Train && side.chance(20)) r.optimizer = side.chance(50) ? Optimizer::PagedAdamW8bit : Optimizer::PagedAdamW;
    const bool one_replica = p.gpus == p.tp * p.cp * p.pp;
    if (r.grad_accum == 1 && p.pp == 1 && p.zero == 0 && !p.distributed_optimizer && p.offload_optimizer == Offload::None &&
        (p.fsdp != Fsdp::None || one_replica) && r.zero_grad == ZeroGrad::SetToNone && side.chance(25))
        r.optimizer_in_backward = true;
    if (p.fsdp != Fsdp::None && !r.optimizer_in_backward && side.chance(35)) p.fsdp_version = 1;
    if (p.fsdp != Fsdp::None && r.grad_accum > 1 && r.zero_grad == ZeroGrad::SetToNone && side.chance(35)) p.no_sync = true;
    // Framework behaviours (issue 12, memory/framework.hpp): loss kernels,
    // logits held by the loop, fused kernels, op-level and every-N
    // checkpointing, offloaded inputs, FSDP2's precision policy; from their
    // own side generator, so that the jobs above stay as they were. Every
    // layout kind draws every loss kernel and held logits.
    Rng fw(seed ^ 0x9e3779b97f4a7c15ULL);
    if (fw.chance(40)) {
        r.cross_entropy = fw.pick(std::vector<CrossEntropy>{CrossEntropy::Full, CrossEntropy::Chunked, CrossEntropy::Fused, CrossEntropy::FusedLinear});
        if (fw.chance(30)) r.logits = LogitsLifetime::Kept;
        if (fw.chance(40)) r.kernels = fw.pick(std::vector<Kernels>{Kernels::Fused, Kernels::TE});
        if (fw.chance(25)) r.recompute = Recompute::Ops;
        const bool ckpt = r.recompute == Recompute::Full || r.recompute == Recompute::Ops;
        if (ckpt && fw.chance(30)) r.recompute_every = fw.pick(std::vector<std::int64_t>{2, 3});
        if (ckpt && fw.chance(30)) r.activation_offload = true;
        if (r.mode == Mode::Train && r.precision == Precision::AmpBF16 && fw.chance(25)) r.framework = Framework::Torchtitan;
    }
    // Megatron's recompute_method / recompute_num_layers (uniform chunks rebuilt
    // at once, or the first N layers), from a generator of their own.
    Rng mg(seed ^ 0x5bd1e9955bd1e995ULL);
    if (r.recompute == Recompute::Full && !r.recompute_every && mg.chance(30)) {
        r.recompute_method = mg.pick(std::vector<RecomputeMethod>{RecomputeMethod::Uniform, RecomputeMethod::Block});
        r.recompute_num_layers = mg.pick(std::vector<std::int64_t>{2, 3});
    }
    // Every framework profile (its loop, loss, kernels and LoRA modules), where
    // it runs the drawn precision (grid_valid drops the others).
    if (fw.chance(25))
        r.framework = fw.pick(std::vector<Framework>{Framework::HF, Framework::Torchtune, Framework::LitGPT, Framework::NanoGPT, Framework::Megatron,
                                                     Framework::Torchtitan, Framework::DeepSpeed, Framework::Axolotl, Framework::Unsloth,
                                                     Framework::LlamaFactory});
    // FP8 / FP4 recipes and CUDA graphs in training (memory/fp8.hpp,
    // docs/frameworks.md), from a third side generator.
    Rng f8(seed ^ 0x51afd7ed558ccd1dULL);
    if (r.mode != Mode::Infer && f8.chance(15))
        r.fp8_recipe = f8.pick(std::vector<Fp8Recipe>{Fp8Recipe::Delayed, Fp8Recipe::Current, Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise, Fp8Recipe::MXFP8,
                                                      Fp8Recipe::NVFP4});
    if (r.mode != Mode::Infer && f8.chance(10)) r.cuda_graphs = CudaGraphs::Compile;
    return j;
}

// `count` valid jobs of a kind, drawn from `seed`.
inline std::vector<GridJob> job_grid(GridKind kind, int count_in, std::uint64_t seed) {
    const int count = grid_count(count_in);
    Rng rng(seed);
    std::vector<GridJob> out;
    int tries = 0;
    while (static_cast<int>(out.size()) < count && tries < count * 50) {
        ++tries;
        GridJob j = draw_job(rng, kind);
        if (grid_valid(j.req)) out.push_back(std::move(j));
    }
    return out;
}

inline const char* kind_name(GridKind k) {
    switch (k) {
        case GridKind::Single: return "single";
        case GridKind::DataParallel: return "dp";
        case GridKind::Sharded: return "sharded";
        case GridKind::Tensor: return "tp";
        case GridKind::Pipeline: return "pp";
        case GridKind::Context: return "cp";
        case GridKind::Expert: return "ep";
        case GridKind::Inference: return "infer";
    }
    return "?";
}

}  // namespace gpumem::test
