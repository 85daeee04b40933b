// gpumem/plan/doctor.hpp — the OOM doctor: reads PyTorch's "CUDA out of
// memory" message, says why the allocation failed and what would fix it.
//
// The message is produced by DeviceCachingAllocator::malloc in
// c10/cuda/CUDACachingAllocator.cpp after the allocator has already freed
// every wholly unused cached segment and retried. Two wordings exist:
//
//   "1.x" (PyTorch <= 2.0):
//     CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total
//     capacity; 10.34 GiB already allocated; 435.50 MiB free; [X allowed; ]
//     14.21 GiB reserved in total by PyTorch) [If reserved memory is >>
//     allocated memory try setting max_split_size_mb ...]
//   "2.x" (PyTorch >= 2.1, pytorch/pytorch#99699; 2.1 spells "capacty"):
//     CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total
//     capacity of 79.15 GiB of which 1.06 GiB is free. [Process N has X
//     memory in use. ]* [Including non-PyTorch memory, this process has X
//     memory in use. ] [X allowed; ]Of the allocated memory 76.50 GiB is
//     allocated by PyTorch, [with X allocated in private pools (e.g., CUDA
//     Graphs), ]and 1.02 GiB is reserved by PyTorch but unallocated. ...
//
// Sizes are c10's format_size: "N bytes" up to 1 KiB, then KiB/MiB/GiB with
// two decimals (binary units). The parser also accepts "B", "KB"/"MB"/"GB"
// (read as binary, as the MPS allocator prints them) and "TiB"; line breaks,
// quote markers and the exception prefix ("torch.OutOfMemoryError:",
// "torch.cuda.OutOfMemoryError:", "RuntimeError:") are ignored.
//
// diagnose() turns the numbers into a verdict and ranked remedies; with the
// run's settings (an EstimateRequest) it prices each model-side remedy with
// estimate() calls. Deterministic: same input, same output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/request.hpp"

namespace gpumem {

// Another process listed by NVML in a 2.x message ("Process N has X memory in use").
struct OomProcess {
    std::int64_t pid = 0;
    Bytes in_use;
};

// The numbers of one OOM message, as PyTorch printed them (each rounded to
// two decimals of its unit, so sums are exact only to ~0.01 GiB).
struct OomReport {
    std::string wording;          // "1.x" or "2.x"
    std::string device_kind;      // "CUDA" (or "XPU", "MUSA", ... if another backend printed it)
    std::optional<int> gpu_index; // absent when the message printed "GPU " with no number
    Bytes requested;              // "Tried to allocate"
    Bytes total_capacity;         // cudaMemGetInfo total
    Bytes free;                   // cudaMemGetInfo free at the failure
    Bytes allocated;              // allocated by PyTorch (incl. CUDA Graph private pools in 2.x)
    Bytes reserved;               // reserved by PyTorch (1.x: printed; 2.x: allocated + unallocated)
    Bytes reserved_unallocated;   // reserved - allocated: cached blocks (2.x: printed; 1.x: derived)
    std::optional<Bytes> allowed;            // set_per_process_memory_fraction cap ("X allowed")
    std::optional<Bytes> private_pools;      // "with X allocated in private pools (e.g., CUDA Graphs)"
    std::optional<Bytes> this_process;       // "Including non-PyTorch memory, this process has X"
    bool this_process_inferred = false;      // taken from a "Process N" line (PID namespaces hide "this process")
    std::optional<std::int64_t> this_process_pid;  // when inferred
    std::vector<OomProcess> other_processes; // every other "Process N has X" line, in message order
    std::vector<std::string> notes;          // parser remarks (implausible NVML values dropped, ...)

    // Memory the caching allocator cannot use: CUDA context, non-PyTorch
    // allocations (NCCL, cuBLAS workspaces outside the allocator, ...) and
    // other processes: total - free - reserved, clamped at 0.
    [[nodiscard]] Bytes outside_pytorch() const;
    // Memory held by other processes (2.x with NVML only; 0 otherwise).
    [[nodiscard]] Bytes other_processes_total() const;
    // This process's memory outside the allocator (context + non-PyTorch
    // libraries): this_process - reserved, when this_process is known.
    [[nodiscard]] std::optional<Bytes> this_process_non_pytorch() const;
};

// Extracts the numbers. Error (ParseError, field "message") when the text is
// not an OOM message or lacks one of: requested size, total capacity, free,
// allocated and reserved (1.x) / reserved-but-unallocated (2.x).
Result<OomReport> parse_oom_message(std::string_view text);

enum class OomVerdict {
    Fragmented,      // the request would fit in the cached (reserved, unallocated) memory if it were contiguous
    Full,            // live tensors plus the request exceed what PyTorch can get on the device
    OutsidePytorch,  // memory outside the allocator (other processes, non-PyTorch libraries) is what is missing
};
const char* to_string(OomVerdict v);  // "fragmented", "full", "outside-pytorch"

// What one remedy variant is predicted to use (only with a run).
struct RemedyPrediction {
    EstimateRequest request;      // the variant's settings (defaults filled in by estimate())
    Bytes peak_allocated;
    Bytes peak_reserved;
    Bytes total_device;
    Bytes saving;                 // baseline.peak_reserved - peak_reserved (may be <= 0)
    bool fits_message_gpu = false;  // total_device <= message capacity - other processes' memory
};

struct Remedy {
    int rank = 0;                 // 1 = try first
    std::string key;              // stable id: "expandable_segments", "max_split_size", "micro_batch", ...
    std::string title;            // for people
    std::string action;           // what to change: env var, flag, code
    std::optional<Bytes> saving;  // estimated bytes saved at the peak; nullopt = cannot quantify
    std::string basis;            // how the saving was estimated, or why it cannot be
    bool addresses_verdict = false;
    bool is_fix = true;           // false for non-fixes (torch.cuda.empty_cache())
    bool applicable = true;       // false when the run already uses it or estimate() rejected it
    std::optional<RemedyPrediction> prediction;  // with a run
};

struct DoctorNumbers {            // in bytes; renderers print GiB
    Bytes requested;
    Bytes total_capacity;
    Bytes free;
    Bytes allocated;
    Bytes reserved;
    Bytes cached;                 // reserved - allocated
    Bytes outside_pytorch;        // total - free - reserved
    Bytes usable;                 // total - outside_pytorch = free + reserved
    Bytes shortfall;              // allocated + requested - usable (<= 0: it would fit if unfragmented)
    Bytes other_processes;        // sum of other processes (2.x)
};

struct DoctorBaseline {           // the run as described, estimated by gpumem
    EstimateRequest request;
    std::string model_name;
    Bytes peak_allocated;
    Bytes peak_reserved;
    Bytes total_device;
    bool fits_message_gpu = false;
};

// Model-side remedies applied together (with a run, when no single one is
// predicted to fit): taken in rank order, one per setting (batch, recompute,
// precision, optimizer, mode), until the prediction fits the message's GPU.
struct CombinedRemedy {
    std::vector<std::string> keys;     // remedy keys applied, in order
    std::vector<std::string> actions;  // their actions
    RemedyPrediction prediction;       // of all of them together; fits_message_gpu may still be false
};

struct DoctorResult {
    OomReport oom;
    OomVerdict verdict = OomVerdict::Full;
    std::string headline;         // one line: verdict and the decisive numbers
    std::string explanation;      // one paragraph
    DoctorNumbers numbers;
    std::vector<std::string> findings;   // secondary observations, deterministic order
    std::vector<Remedy> remedies;        // ranked, rank 1 first
    std::optional<DoctorBaseline> baseline;  // with a run
    std::optional<CombinedRemedy> combined;  // with a run, when no single remedy fits
    std::vector<std::string> notes;      // caveats (wording/version, no --model, ...)
};

// Parses the message and diagnoses it. `run`: the job's settings as the CLI
// fills them from --model/--batch/... (nullopt: no model given); each
// model-side remedy is then priced with estimate(). An invalid run (unknown
// model, ...) is an Error; a remedy variant estimate() rejects is kept with
// applicable = false.
Result<DoctorResult> diagnose(std::string_view message, const std::optional<EstimateRequest>& run);

// The max_split_size_mb value suggested for a failing request: the largest
// power of two MiB not above the request, at least 32 (PyTorch requires > 20).
std::int64_t suggested_max_split_size_mb(Bytes requested);

}  // namespace gpumem
