// CLI start-up (issue 16): one `gpumem` call against the process floor, in
// one run. Each iteration starts /bin/true, `gpumem --version`,
// `gpumem estimate llama-3-8b --analytic` and `gpumem estimate llama-3-8b`
// (with the step simulation) one after another (posix_spawn + waitpid,
// output to /dev/null), so that all four see the same machine load; the
// counters are the medians of each and their ratios to /bin/true. Targets:
// the analytic call within 2x of the floor, the simulated one within 4x.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace {

// Wall time of one process, start to exit.
double run_once(const std::vector<std::string>& argv) {
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    const auto t0 = std::chrono::steady_clock::now();
    pid_t pid = 0;
    int status = 0;
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ) == 0) waitpid(pid, &status, 0);
    const auto t1 = std::chrono::steady_clock::now();
    posix_spawn_file_actions_destroy(&fa);
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

void BM_CliStartup(benchmark::State& state) {
    const std::string cli = GPUMEM_CLI_PATH;
    const std::array<std::vector<std::string>, 4> cmds = {{
        {"/bin/true"},
        {cli, "--version"},
        {cli, "estimate", "llama-3-8b", "--analytic"},
        {cli, "estimate", "llama-3-8b"},
    }};
    std::array<std::vector<double>, 4> t;
    for (auto _ : state)
        for (std::size_t i = 0; i < cmds.size(); ++i) t[i].push_back(run_once(cmds[i]));
    const double floor = median(t[0]);
    state.counters["true_us"] = floor;
    state.counters["version_us"] = median(t[1]);
    state.counters["analytic_us"] = median(t[2]);
    state.counters["simulated_us"] = median(t[3]);
    state.counters["version_x"] = median(t[1]) / floor;
    state.counters["analytic_x"] = median(t[2]) / floor;
    state.counters["simulated_x"] = median(t[3]) / floor;
}
BENCHMARK(BM_CliStartup)->Unit(benchmark::kMillisecond)->Iterations(200);

}  // namespace
