// Decode throughput and time to first token per concurrency level
// (gpumem/plan/serving_time.hpp).
#include "gpumem/plan/serving_time.hpp"

#include <algorithm>
#include <cmath>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
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
            // llama.cpp: a bandwidth roofline when every layer is on the GPUs
            // (layers split across GPUs run one after another): each decode
            // step reads the model buffers and the running requests' KV at the
            // mean context; prefill at half the GPU's dense fp16 rate.
            const LlamaCppDetail& d = *r.llamacpp;
            if (d.n_gpu_layers < d.n_layer + 1) {
                r.assumptions.push_back("throughput: not modelled with layers on the CPU (host memory bandwidth unknown)");
                return r;
            }
            const GpuSpec gpu = take(find_gpu(r.gpu));
            Bytes weights, kv;
            for (const auto& p : r.per_rank) {
                weights += p.weights;
                kv += p.kv_cache;
            }
            const double kv_per_token = d.n_ctx > 0 ? static_cast<double>(kv.count()) / static_cast<double>(d.n_ctx) : 0.0;
            const double bw = 0.8 * gpu.bandwidth_gbs * 1e9, flops = 0.5 * gpu.tflops_fp16 * 1e12;
            const double prompt = static_cast<double>(r.request_len - r.output_len);
            const double mean_ctx = prompt + static_cast<double>(r.output_len) / 2.0;
            for (std::int64_t c = 1;; c *= 2) {
                const std::int64_t n = std::min(c, cap);
                const double step = (static_cast<double>(weights.count()) + static_cast<double>(n) * mean_ctx * kv_per_token) / bw;
                ServingThroughput row;
                row.concurrency = n;
                row.ttft_seconds = flops > 0 ? 2.0 * static_cast<double>(d.params) * prompt * static_cast<double>(n) / flops : 0.0;
                row.decode_tokens_per_second = static_cast<double>(n) / step;
                row.tokens_per_second_per_request = 1.0 / step;
                row.memory_bound = true;
                r.throughput.push_back(row);
                if (n == cap) break;
            }
            r.assumptions.push_back("throughput (a roofline): each decode step reads the model buffers and the running requests' KV at 80% of the GPU's "
                                    "bandwidth; prompts prefilled at half its dense fp16 rate (quantized kernels not calibrated)");
            return r;
        }
        const ModelGraph g = take(load_model(job.model, model_options(job)));
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
