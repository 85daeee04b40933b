// Speed targets of issue 16 for the planner (plan/planner.hpp): a whole
// `gpumem plan` -- the analytic search and the step simulation confirming the
// winners -- for llama-3-70b on 64 GPUs in <= 0.2 s and llama-3.1-405b on
// 16,384 GPUs in <= 1 s; the analytic scorer the search uses at >= 5M layouts
// per second on one core. The requests are what the CLI builds for
// `gpumem plan <model> --gpus N` (api/call.cpp: confirm = min(top, 3)).
#include <benchmark/benchmark.h>

#include "gpumem/plan/planner.hpp"

using namespace gpumem;

namespace {

PlanRequest cli_plan(const char* model, std::int64_t gpus) {
    PlanRequest pr;
    pr.base.model = model;
    pr.base.parallel.gpus = gpus;
    pr.top = 10;
    pr.confirm = 3;
    return pr;
}

void run_plan(benchmark::State& state, const PlanRequest& pr) {
    std::int64_t evaluated = 0;
    for (auto _ : state) {
        auto r = plan(pr);
        if (!r) state.SkipWithError(r.error().message.c_str());
        else evaluated += r.value().evaluated;
        benchmark::DoNotOptimize(r);
    }
    state.SetItemsProcessed(evaluated);
}

}  // namespace

// `gpumem plan llama-3-70b --gpus 64` in process (all cores).
static void BM_PlanCli70B64Gpus(benchmark::State& state) { run_plan(state, cli_plan("llama-3-70b", 64)); }
BENCHMARK(BM_PlanCli70B64Gpus)->Unit(benchmark::kMillisecond)->UseRealTime();

// `gpumem plan llama-3.1-405b --gpus 16384` in process (all cores).
static void BM_Plan405B16kGpus(benchmark::State& state) { run_plan(state, cli_plan("llama-3.1-405b", 16384)); }
BENCHMARK(BM_Plan405B16kGpus)->Unit(benchmark::kMillisecond)->UseRealTime();

// The analytic search alone for llama-3.1-405b on 16,384 GPUs on one thread:
// items/s = layouts (configurations) decided per second.
static void BM_ScorerLayouts(benchmark::State& state) {
    PlanRequest pr = cli_plan("llama-3.1-405b", 16384);
    pr.confirm = 0;
    pr.threads = 1;
    run_plan(state, pr);
}
BENCHMARK(BM_ScorerLayouts)->Unit(benchmark::kMillisecond)->UseRealTime();
