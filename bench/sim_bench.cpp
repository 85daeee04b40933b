// Issue 16: the cost of one step simulation (simulate_estimate: trace
// generation, steady-state detection and caching-allocator replay, what
// `gpumem estimate` runs) against the three lengths it could grow with:
// repeated identical layers (a llama-3-8b shape with 32, 80 and 160 layers),
// gradient accumulation (1 vs 256 micro-batches, single GPU and pp 4) and
// decode length (128 vs 8192 generated tokens). Flat means the same time for
// each argument of one benchmark. The counter `events` is the simulated trace's
// length with the steady-state cuts counted (what the summary reports).
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"

using namespace gpumem;

namespace {

ModelGraph llama_with_layers(std::int64_t layers) {
    const nlohmann::json cfg = {{"model_type", "llama"},      {"hidden_size", 4096},         {"num_hidden_layers", layers},
                                {"num_attention_heads", 32},  {"num_key_value_heads", 8},    {"intermediate_size", 14336},
                                {"vocab_size", 128256},       {"max_position_embeddings", 8192}};
    return load_hf_config_json(cfg, "llama-" + std::to_string(layers) + "l").value();
}

void run(benchmark::State& state, const ModelGraph& g, const EstimateRequest& req) {
    std::int64_t events = 0;
    for (auto _ : state) {
        auto r = simulate_estimate(g, req);
        if (!r) {
            state.SkipWithError(r.error().message.c_str());
            return;
        }
        events = r.value().simulation ? r.value().simulation->events : 0;
        benchmark::DoNotOptimize(r);
    }
    state.counters["events"] = static_cast<double>(events);
}

EstimateRequest train_request() {
    EstimateRequest req;
    req.seq = 2048;
    req.batch = 1;
    req.gpu_memory = GiB(4096);  // no OOM: one replay
    return req;
}

}  // namespace

// Layers: 32, 80, 160 identical decoder layers, one training step pair.
static void BM_SimLayers(benchmark::State& state) {
    const ModelGraph g = llama_with_layers(state.range(0));
    run(state, g, train_request());
}
BENCHMARK(BM_SimLayers)->Arg(32)->Arg(80)->Arg(160)->Unit(benchmark::kMillisecond);

// Gradient accumulation on one GPU: 1 vs 256 micro-batches.
static void BM_SimGradAccum(benchmark::State& state) {
    const ModelGraph g = load_model("llama-3-8b").value();
    EstimateRequest req = train_request();
    req.grad_accum = state.range(0);
    run(state, g, req);
}
BENCHMARK(BM_SimGradAccum)->Arg(1)->Arg(256)->Unit(benchmark::kMillisecond);

// Gradient accumulation under a 1F1B pipeline (pp 4, 4 GPUs): 4 vs 256.
static void BM_SimGradAccumPp4(benchmark::State& state) {
    const ModelGraph g = load_model("llama-3-8b").value();
    EstimateRequest req = train_request();
    req.grad_accum = state.range(0);
    req.parallel.gpus = 4;
    req.parallel.pp = 4;
    run(state, g, req);
}
BENCHMARK(BM_SimGradAccumPp4)->Arg(4)->Arg(256)->Unit(benchmark::kMillisecond);

// Decode length: 128 vs 8192 generated tokens after a 512-token prompt.
static void BM_SimDecode(benchmark::State& state) {
    const ModelGraph g = load_model("llama-3-8b").value();
    EstimateRequest req;
    req.mode = Mode::Infer;
    req.seq = 512;
    req.gen_len = state.range(0);
    req.gpu_memory = GiB(4096);
    run(state, g, req);
}
BENCHMARK(BM_SimDecode)->Arg(128)->Arg(8192)->Unit(benchmark::kMillisecond);
