// gpumem/sim/simulate.hpp — estimates whose peaks come from simulation.
//
// simulate_estimate() computes the analytic estimate (model states,
// saved activations, KV cache), then builds the event trace of two training
// steps (or prefill + decode) from the model graph (sim/step.hpp) and replays
// it through the caching-allocator model (sim/allocator.hpp). The replay sets
// peak_allocated (torch.cuda.max_memory_allocated), peak_reserved
// (max_memory_reserved) and total_device (nvidia-smi: + CUDA context), and the
// breakdown becomes what is live at the simulated peak, by kind, with the
// allocator's rounding and cached-but-free memory in their own rows.
#pragma once

#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

// Internal settings of the simulation (tests).
struct SimulateOptions {
    // Replay every micro-batch instead of extrapolating from the steady state
    // (sim/step.hpp StepTraceOptions::steady_state), and every decode step
    // instead of the first 64 and the last: what the fast path must equal.
    bool full_replay = false;
    // Threads that simulate a pipeline's ranks side by side (0: the cores;
    // core/parallel.hpp). The answer does not depend on it.
    int threads = 0;
    // Keep this thread's spare trace storage when the estimate ends
    // (sim/step.hpp recycle_trace_storage): a caller that simulates job after
    // job on one thread (the planner's confirmations) writes the next trace
    // into pages already touched, and calls sim::release_trace_storage() when
    // it is done. The answers do not depend on it.
    bool keep_trace_storage = false;
    // Stop simulating pipeline ranks once one needs more than this (its
    // reserved peak plus the CUDA context and NCCL buffers; 0: never): the
    // job's total is at least that whatever the other ranks need, which is
    // all a caller asking "does it fit within this?" needs (the planner's
    // confirmations). The ranks run heaviest first by their analytic peaks;
    // the answer is then the largest of the ranks up to the first that needs
    // more (the same whatever the threads), with a note. A job that fits is
    // simulated whole.
    Bytes stop_above;
    // Record the simulated step's memory timeline (SimulationSummary::timeline,
    // what `gpumem timeline` and --timeline draw): a caller that reads only
    // the peaks (the planner's confirmations) leaves it out. No other answer
    // depends on it.
    bool timeline = true;
};

Result<EstimateResult> simulate_estimate(const ModelGraph& g, const EstimateRequest& req);
Result<EstimateResult> simulate_estimate(const ModelGraph& g, const EstimateRequest& req, const SimulateOptions& sopt);
// Loads the model named by the request (or --params: analytic only).
Result<EstimateResult> simulate_estimate(const EstimateRequest& req);

}  // namespace gpumem
