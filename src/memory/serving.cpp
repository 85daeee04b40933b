// GPU memory of a model served by an engine (gpumem/memory/serving.hpp):
// the engine's own command line read, the model loaded, then each engine's
// start-up arithmetic (src/memory/serving_{vllm,sglang,tgi,trtllm}.cpp,
// llama.cpp in llamacpp.cpp).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/llamacpp.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/memory/uncertainty.hpp"
#include "gpumem/model/load.hpp"
#include "serving_internal.hpp"

namespace gpumem {

using engine_args::check;
using namespace serving_detail;

namespace {

ServingResult serving_answer(const EstimateRequest& job_in, const ServingOptions& o_in);

}  // namespace

Result<ServingResult> serving_memory(const EstimateRequest& job_in, const ServingOptions& o_in) {
    return capture([&]() -> ServingResult {
        ServingResult r = serving_answer(job_in, o_in);
        set_serving_uncertainty(r);
        return r;
    });
}

namespace {

ServingResult serving_answer(const EstimateRequest& job_in, const ServingOptions& o_in) {
    {
        EstimateRequest job = job_in;
        ServingOptions o = o_in;
        apply_engine_command(o.command, o, job);
        if (o.engine == Engine::LlamaCpp) {
            check(!job.model.empty(), "model", "serving: name a model (a .gguf file, or a preset / config.json with --quant), or give llama-server's command line after --");
            return llamacpp_memory(job, o);
        }
        check(!o.n_gpu_layers && !o.ctx_size && !o.ubatch_size && !o.flash_attn && !o.cache_type_k && !o.cache_type_v && !o.tensor_split &&
                  !o.split_mode && !o.no_mmap && !o.no_kv_offload && !o.kv_unified,
              "engine", "--n-gpu-layers, --ctx-size, --ubatch-size, --flash-attn, --cache-type-k/v, --tensor-split, --split-mode, --no-mmap, "
                        "--no-kv-offload and --kv-unified are llama.cpp's (--engine llama.cpp)");
        check(!job.model.empty(), "model", "serving: name a model (preset, config.json or model folder), or give the engine's command line after --");
        check(!o.cpu_offload_gb || o.engine.value_or(Engine::VLLM) == Engine::VLLM, "cpu-offload-gb",
              "--cpu-offload-gb is modelled for vLLM only (--engine vllm)");
        check((!o.data_parallel_size && !o.enable_expert_parallel) || o.engine.value_or(Engine::VLLM) == Engine::VLLM, "data-parallel-size",
              "--data-parallel-size and --enable-expert-parallel are modelled for vLLM only (--engine vllm)");
        const ModelGraph g = take(load_model(job.model, model_options(job)));
        check(g.transformer.has_value(), "model", "serving needs a transformer model (its layers, heads and vocabulary)");
        if (o.engine == Engine::SGLang) return sglang_memory(g, job, o);
        if (o.engine == Engine::TGI) return tgi_memory(g, job, o);
        if (o.engine == Engine::TRTLLM) return trtllm_memory(g, job, o);
        return vllm_memory(g, job, o);
    }
}

}  // namespace

}  // namespace gpumem
