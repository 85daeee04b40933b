// gpumem/core/limits.hpp — the documented limits on input sizes.
//
// Every input whose size drives work or memory (GPUs, parallel sizes, batch,
// tokens, gradient-accumulation steps, layers, list lengths, threads) has an
// upper limit, checked when the input is read and named in the error. The
// limits sit far above real use — they exist so that an absurd value (1e9
// layers, 2^40 GPUs, 200,000 threads) is refused in one line instead of
// overflowing 64-bit byte counts, exhausting memory or creating threads until
// the system refuses. docs/limits.md lists each with its reason; the request
// fields carry theirs in the field table (memory/fields.hpp).
#pragma once

#include <cstdint>

namespace gpumem {

// GPUs in a job, and each parallel size (tp, pp, cp, ep, dp): 2^20. The
// largest training clusters have ~10^5 GPUs.
inline constexpr std::int64_t kMaxGpus = std::int64_t(1) << 20;
// Sequences per micro-batch (and engine requests per step): 2^20.
inline constexpr std::int64_t kMaxBatch = std::int64_t(1) << 20;
// Tokens per sequence (seq, gen-len, max-model-len, ...): 2^24 = 16,777,216.
// The longest contexts in use are ~10^7 tokens.
inline constexpr std::int64_t kMaxSeqTokens = std::int64_t(1) << 24;
// Micro-batches per optimizer step: 2^20. Real runs use at most a few thousand.
inline constexpr std::int64_t kMaxGradAccum = std::int64_t(1) << 20;
// Transformer layers of a model (configs, Megatron arguments, layer lists):
// 100,000. The deepest models in use have ~200.
inline constexpr std::int64_t kMaxLayers = 100'000;
// Any size in bytes given as input: 2^50 (1 PiB). GPUs have < 300 GB.
inline constexpr std::int64_t kMaxInputBytes = std::int64_t(1) << 50;
// A parameter count given as a number (--params): 10^15. The largest
// models have ~2 x 10^12.
inline constexpr std::int64_t kMaxParamCount = 1'000'000'000'000'000;
// Threads one request may ask for: 1024 (machines have at most a few hundred
// cores; thread creation fails long before 200,000).
inline constexpr std::int64_t kMaxThreads = 1024;

}  // namespace gpumem
