// gpumem/plan/serving_time.hpp — decode throughput and time to first token of
// a served model, per concurrency level.
//
// Once an engine has started (memory/serving.hpp), how fast it serves depends
// on how many requests run at once: each decode step reads this rank's
// weights (the routed experts the batch touches) and every running request's
// KV cache, and computes 2 x active parameters per token; the prompts are
// prefilled first. This applies gpumem's inference time model (plan/compute.hpp:
// bandwidth at 80% and the calibrated compute-only efficiencies, docs/compute.md)
// to c requests of `request_len` tokens (`output_len` of them generated) for c
// = 1, 2, 4, ... up to what the KV cache and max_num_seqs allow. It is a
// roofline: the engine's scheduler, chunked prefill interleaving and
// communication beyond the tensor-parallel all-reduces are not modelled.
#pragma once

#include <cstdint>
#include <optional>

#include "gpumem/core/result.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/memory/serving.hpp"

namespace gpumem {

// r with its throughput list (and the assumption) filled for the job it serves (r.job).
Result<ServingResult> with_serving_throughput(ServingResult r, std::optional<std::int64_t> output_len_given);

}  // namespace gpumem
