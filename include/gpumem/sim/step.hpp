// gpumem/sim/step.hpp — the event trace of training steps and inference, op by op.
//
// From the model graph and a resolved job, build_step_trace() writes the
// allocations and frees PyTorch makes, in order:
//
//   setup      weights (quantized, master copies, adapters)
//   step k:    [micro-batch 1..GA]
//                input batch
//                forward   op by op: outputs allocated, tensors saved for
//                          backward kept (16-bit autocast casts, weight-cast
//                          cache), everything else freed after its last use;
//                          full recompute keeps only each layer's input;
//                          flash/SDPA replaces the attention core by one op
//                          saving q, k, v, out and an fp32 logsumexp
//                loss      fp32 logits copy, log_softmax, labels
//                backward  ops in reverse: gradients of inputs allocated,
//                          gradients of outputs and saved tensors released as
//                          each op's backward finishes; parameter gradients on
//                          first use, accumulated under gradient accumulation;
//                          checkpointed layers (and selective recompute's
//                          attention core) re-run their forward first
//              optimizer   states created on the first step; temporaries of the
//                          foreach / fused / for-loop implementations
//              zero_grad   set_to_none frees every gradient
//   inference: prefill through the graph without autograd, KV cache per
//              layer, decode steps growing the cache with torch.cat.
//
// The first step and the steady-state step differ (optimizer states exist
// only from the first optimizer step on), so two steps are simulated.
// cuBLAS workspaces are allocated at the first matmul of each thread (main
// thread in forward, autograd's thread in backward) and never freed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/model/graph.hpp"
#include "gpumem/sim/trace.hpp"

namespace gpumem::sim {

// One GPU looks for the steady state of gradient accumulation from this many
// micro-batches on; below it a whole schedule costs less (sim/step_pipeline.cpp).
inline constexpr std::int64_t kDetectMinMicroBatches = 16;

struct StepTraceOptions {
    int steps = 2;                  // training steps to simulate (first + steady state)
    bool cublas_workspaces = true;  // allocate workspaces through the allocator
    Bytes cublas_workspace;         // size of one workspace (from the GPU)
    int max_decode_steps = 64;      // inference: decode steps simulated in full
    // Simulate every micro-batch instead of stopping at the schedule's steady
    // state; tests use it to check that the micro-batches left out change nothing.
    bool all_micro_batches = false;
    // Steady-state extrapolation of gradient accumulation and pipeline
    // schedules, exact for a replay with these settings: at each boundary
    // between the schedule's forward/backward chunks the trace so far is
    // replayed (StateProbe) and the allocator and live-tensor state compared
    // with earlier boundaries; once it repeats after d chunks and the schedule
    // repeats too, the following whole periods would replay exactly what the
    // last d chunks did, so they are left out (Trace::cuts records them and
    // replay() reports what the full trace gives). Where the state has not
    // repeated within a bounded number of chunks, the schedule is cut at 64
    // micro-batches instead (approximate, said in the notes). Null: no
    // detection, the 64-micro-batch cut.
    const ReplayOptions* steady_state = nullptr;
    // Look for the steady state even where the schedule is short enough to
    // simulate whole for less (sim/step_pipeline.cpp: a pipeline whose
    // operations fit in the detection window, one GPU below
    // kDetectMinMicroBatches).
    bool detect_always = false;
    // Distributed layouts: simulate one GPU of pipeline stage `stage` (the
    // analytic model's stage assignment and activation scaling).
    const ParallelResult* parallel = nullptr;
    std::int64_t stage = 0;
};

// Live requested bytes at the end of each phase of a training step (what
// torch.cuda.memory_allocated() would show without rounding).
struct StepCheckpoints {
    Bytes after_setup;
    Bytes after_forward;   // end of the last micro-batch's forward (loss computed)
    Bytes after_backward;
    Bytes after_optimizer;
    Bytes after_zero_grad;
};

struct StepTrace {
    Trace trace;
    std::vector<StepCheckpoints> steps;  // one per training step
    std::vector<std::string> notes;
    // Part of the schedule was cut without an exact steady state (interleaved
    // pipelines past 64 micro-batches, a 1F1B pipeline whose state did not
    // repeat within the detection window, decode past 64 steps); a note says how.
    bool approximate = false;
};

// The most events one step trace holds (about 55 bytes and a few microseconds
// of replay each: some 350 MB and seconds). A job whose trace would be longer
// (a model of 10^5 layers) throws TraceTooLarge while it is built; the
// estimate then falls back to the analytic model and says so.
inline constexpr std::int64_t kMaxTraceEvents = 6'000'000;
class TraceTooLarge : public std::runtime_error {
public:
    explicit TraceTooLarge(std::int64_t limit)
        : std::runtime_error("the step trace would exceed " + std::to_string(limit) + " allocator events") {}
};

StepTrace build_step_trace(const ModelGraph& g, const Job& job, const StepTraceOptions& opt);

// Hands a finished trace's event storage back for reuse: the next
// build_step_trace on this thread writes its events into it (cleared, its
// capacity kept) instead of a new vector. The pages of a fresh vector are
// faulted in again for every trace: simulating the 32 ranks of a 405B
// interleaved pipeline touched about 500 MB that way, a fifth of its CPU time
// (kernel time; perf, `gpumem estimate llama-3.1-405b ... --tp 2 --pp 32
// --vpp 2`). One spare per thread, the largest handed back, kept only up to
// kMaxSpareTraceEvents (32 MB); the answers do not depend on it.
// release_trace_storage frees this thread's spare, and replay()'s
// (release_replay_storage): simulate_estimate does at its end unless asked to
// keep them (SimulateOptions::keep_trace_storage), so a long-lived thread of
// the service keeps nothing between requests.
inline constexpr std::int64_t kMaxSpareTraceEvents = 1'000'000;
void recycle_trace_storage(StepTrace&& t);
// The same for a trace's events alone, once replayed (the trace keeps its
// labels, checkpoints and notes): `events` is left empty.
void recycle_trace_events(std::vector<TraceEvent>& events);
void release_trace_storage();
// Calls release_trace_storage when it goes out of scope, on every path out
// (unless `on` is false: a caller that keeps the spares for its next job).
struct ReleaseTraceStorageAtExit {
    bool on = true;
    ~ReleaseTraceStorageAtExit() {
        if (on) release_trace_storage();
    }
};

}  // namespace gpumem::sim
