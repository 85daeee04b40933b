// Decode throughput and time to first token per concurrency level
// (gpumem/plan/serving_time.hpp).
#include "gpumem/plan/serving_time.hpp"

#include <algorithm>
#include <cmath>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/plan/compute.hpp"

namespace gpumem {

Result<ServingResult> with_serving_throughput(ServingResult r, std::optional<std::int64_t> output_len_given) {
    return capture([&]() -> ServingResult {
        const EstimateRequest& job = r.job;
        const std::int64_t cap = std::min<std::int64_t>(r.max_num_seqs, static_cast<std::int64_t>(std::floor(r.concurrency_at_request_len)));
        if (!r.error.empty() || cap < 1) return r;
        if (r.llamacpp) {
            r.assumptions.push_back("throughput: not modelled for llama.cpp yet (quantized kernels and partial offload have no calibrated roofline)");
            return r;
        }
        const ModelGraph g = take(load_model(job.model));
        std::vector<std::int64_t> levels;
        for (std::int64_t c = 1; c < cap; c *= 2) levels.push_back(c);
        levels.push_back(cap);
        for (const std::int64_t c : levels) {
            EstimateRequest inf = job;
            inf.mode = Mode::Infer;
            inf.batch = c;
            inf.seq = r.request_len - r.output_len;
            inf.gen_len = r.output_len;
            inf.analytic = true;
            inf.parallel.tp = r.tp;
            inf.parallel.pp = r.pp;
            inf.parallel.gpus = r.tp * r.pp;
            const Job resolved = take(resolve_job(g, inf));
            const ComputeResult t = take(compute_time(g, resolved, EstimateResult{}, ComputeOptions{}));
            ServingThroughput row;
            row.concurrency = c;
            row.ttft_seconds = t.prefill_seconds;
            row.decode_tokens_per_second = t.decode_tokens_per_second_total;
            row.tokens_per_second_per_request = t.decode_tokens_per_second;
            row.memory_bound = t.decode_memory_bound;
            r.throughput.push_back(row);
        }
        r.assumptions.push_back("throughput (a roofline, gpumem's inference time model): c requests of " + std::to_string(r.request_len) + " tokens (" +
                                std::to_string(r.output_len) + " generated" + (output_len_given ? "" : ", gpumem's default --output-len") +
                                ") prefilled together (time to first token), then decoded together reading this rank's weights and their KV "
                                "cache at the mean context; the engine's scheduler and chunked-prefill interleaving are not modelled");
        return r;
    });
}

}  // namespace gpumem
