// gpumem/memory/estimate.hpp — per-GPU memory of one training or inference job.
//
// The analytic path: model states from the parameter list and the
// optimizer's real state layout, activations from the graph's saved-tensor
// rules, KV cache from the transformer dims, transients from the largest
// tensors of each phase, allocator and CUDA-context overheads from the GPU.
// Everything is returned as data (an EstimateResult); renderers print it.
//
// Peak model (steady-state step, torch.cuda.max_memory_allocated):
//   forward end   = W + O + G_acc + A + T_loss
//   backward      = W + O + G_acc + A + T_bwd       (activation grads in flight)
//   optimizer     = W + O + G + T_opt               (foreach temporaries)
// W weights (+ quantization metadata), O optimizer states incl. fp32 master
// weights, G gradients (G_acc: kept between micro-batches when grad-accum > 1),
// A saved activations, T transients. peak_reserved adds the caching
// allocator's rounding and cached-free slack; total_device adds the CUDA
// context (nvidia-smi). Issue 3's simulator replaces these three by replay.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// One row of the per-GPU breakdown. Rows sum exactly to the total.
struct BreakdownRow {
    std::string key;      // stable machine name ("weights", "gradients", ...)
    std::string label;    // for people
    Bytes bytes;
    std::string detail;   // how it was computed
};

struct ParamSummary {
    std::int64_t total = 0;
    std::int64_t trainable = 0;
    std::vector<std::pair<std::string, std::int64_t>> by_component;  // fixed component order, zeros omitted
    std::vector<std::pair<std::string, std::int64_t>> by_dtype;
};

ParamSummary summarize_params(const ModelGraph& g);

struct PerGpu {
    Bytes weights;
    Bytes gradients;
    Bytes optimizer_states;   // incl. fp32 master weights where kept (the caching allocator's part)
    Bytes paged_optimizer_states;  // bitsandbytes paged states: CUDA managed memory, in total_device only
    Bytes load_peak;          // allocated bytes while the model loads (memory/features.hpp); 0 when not modelled
    Bytes master_weights;     // part of optimizer_states
    Bytes activations;        // saved for backward at the end of one micro-batch's forward
    Bytes kv_cache;
    Bytes transient;          // temporaries at the peak phase
    Bytes cublas_workspace;
    Bytes peak_allocated;
    Bytes allocator_overhead; // reserved - allocated at the peak
    Bytes peak_reserved;
    Bytes cuda_context;
    Bytes total_device;
    Bytes capacity;
    bool fits = false;
    std::string peak_phase;   // "forward", "backward", "optimizer", "prefill", "decode"
};

// What the step simulation (sim/simulate.hpp) adds to an estimate. Plain data
// so that renderers and front ends need not depend on the simulator.
struct SimulationSummary {
    struct Sample {
        std::int64_t event = 0;
        std::string phase;
        std::int32_t step = 0;
        Bytes allocated;
        Bytes reserved;
    };
    struct Tensor {
        Bytes size;
        std::string label;
        std::string phase;
    };
    struct PhasePeak {
        std::string phase;
        std::int32_t step = 0;
        Bytes peak_allocated;
        Bytes peak_reserved;
    };
    std::string allocator;      // "pytorch" or "none"
    std::string alloc_conf;
    std::int64_t events = 0;
    Bytes first_step_peak_allocated;
    Bytes first_step_peak_reserved;
    Bytes steady_peak_allocated;    // the last simulated step
    Bytes steady_peak_reserved;
    std::string peak_phase;
    std::int32_t peak_step = 0;
    Bytes fragmentation_at_peak;    // reserved - allocated when allocated peaked
    Bytes largest_free_block_at_peak;
    Bytes graph_pool;               // CUDA graphs (--cuda-graphs): the private pool's reserved bytes at their most
    std::vector<Tensor> top_at_peak;
    std::vector<PhasePeak> phases;
    std::vector<Sample> timeline;
    // Live tensor bytes at the end of the first step's phases.
    Bytes after_forward;
    Bytes after_backward;
    Bytes after_optimizer;
    Bytes after_zero_grad;
    bool oom = false;
    std::string oom_detail;
    std::vector<std::string> notes;
    // The step trace was cut without an exact steady state (sim/step.hpp's
    // StepTrace::approximate): within 1% of a full replay on the test grids.
    bool approximate = false;
    // sim/simulate.hpp SimulateOptions::stop_above: the stage that needed
    // more, after which no other was simulated (the peaks are the largest of
    // those simulated: the job needs at least that), or -1: every stage whose
    // analytic peak is within 15% of the largest was simulated.
    std::int64_t stopped_at_stage = -1;
};

// A low / expected / high range for one figure (memory/uncertainty.hpp).
struct Range {
    Bytes low;
    Bytes expected;
    Bytes high;
};

// How sure the estimate is: ranges whose width comes from the measured error
// of the path this job takes (the accuracy fixtures' measured / predicted
// ratios, data generated by scripts/error_bands.py) or, with --calibration,
// from the calibration's residual (memory/calibration.hpp).
struct Uncertainty {
    std::string path;          // the error band's key, e.g. "train/single/hf"
    std::string basis;         // where the width comes from, for people
    std::int64_t rows = 0;     // fixture rows behind the band (0 with a calibration)
    double ratio_low = 1.0;    // measured / predicted at the band's low end (uncalibrated bands)
    double ratio_high = 1.0;
    bool calibrated = false;
    Range allocated;           // peak_allocated
    Range reserved;            // peak_reserved
    Range total;               // total_device (nvidia-smi): the headline
    // "fits", "fits, but within the error band", "does not fit, but within the
    // error band", "does not fit": where the capacity lies against `total`.
    std::string verdict;
};

struct EstimateResult {
    // The resolved job (request with defaults filled in, sequence, GPU,
    // trainable tensors, layout): held, not copied field by field.
    std::shared_ptr<const Job> job;
    std::string model_name;
    std::string model_source;
    std::string family;
    ParamSummary params;
    PerGpu per_gpu;
    std::vector<BreakdownRow> breakdown;  // sums to per_gpu.total_device
    ActivationResult activation_detail;
    std::vector<std::string> assumptions;
    std::vector<std::string> warnings;
    std::optional<SimulationSummary> simulation;  // absent on the analytic path
    std::optional<ParallelResult> parallel;       // distributed layouts: every pipeline stage
    Uncertainty uncertainty;                      // set by finish_estimate()

    [[nodiscard]] const EstimateRequest& request() const { return job->req; }
    [[nodiscard]] const GpuSpec& gpu() const { return job->gpu; }
    [[nodiscard]] std::int64_t seq() const { return job->seq; }
    [[nodiscard]] std::int64_t trainable_params() const { return job->trainable_params; }  // after LoRA/freezing
};

// The estimate before finish_estimate(): what the step simulator refines.
Result<EstimateResult> analytic_estimate(const ModelGraph& g, const EstimateRequest& req);
// Applies the request's calibration (if any) and sets the uncertainty ranges:
// the last step of estimate() and of the simulator's estimate.
void finish_estimate(EstimateResult& r);

// The job an estimate was made for (EstimateResult::job), or `req` resolved
// against the model when there is no estimate or it carries none: what the
// time model and the planner read, never resolved twice.
Result<std::shared_ptr<const Job>> estimate_job(const ModelGraph& g, const EstimateResult* est, const EstimateRequest& req);

// Validates the request against the model (batch > 0, seq within limits,
// LoRA targets present, ...) and computes the estimate.
Result<EstimateResult> estimate(const ModelGraph& g, const EstimateRequest& req);
// Loads the model named by the request (or --params) and estimates.
Result<EstimateResult> estimate(const EstimateRequest& req);

}  // namespace gpumem
