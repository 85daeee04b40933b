// Snapshot reading + replay at scale (issue 16 target: 10M trace entries in
// <= 2 s and <= 1 GiB resident, pickle and JSON alike, linear in the file).
// The snapshots are generated (bench/snapshot_gen.hpp) into a temporary
// folder the first time a benchmark needs them and removed at exit.
// Counters: entries (trace entries read), max_rss (the process's peak
// resident size so far, getrusage), file_bytes.
#include <benchmark/benchmark.h>

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "gpumem/sim/snapshot.hpp"
#include "snapshot_gen.hpp"

namespace {

namespace fs = std::filesystem;

class SnapshotFiles {
public:
    ~SnapshotFiles() {
        std::error_code ec;
        if (!dir_.empty()) fs::remove_all(dir_, ec);
    }
    const std::string& get(std::int64_t events, bool json) {
        const auto key = std::make_pair(events, json);
        auto it = files_.find(key);
        if (it != files_.end()) return it->second;
        if (dir_.empty()) {
            dir_ = fs::temp_directory_path() / ("gpumem-snapbench-" + std::to_string(::getpid()));
            fs::create_directories(dir_);
        }
        const std::string path = (dir_ / ("snap-" + std::to_string(events) + (json ? ".json" : ".pickle"))).string();
        gpumem::bench::SnapshotGen(events).write(path, json);
        return files_.emplace(key, path).first->second;
    }

private:
    fs::path dir_;
    std::map<std::pair<std::int64_t, bool>, std::string> files_;
};

SnapshotFiles& files() {
    static SnapshotFiles f;
    return f;
}

double max_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) * 1024.0;  // KiB on Linux
}

void run(benchmark::State& state, std::int64_t events, bool json) {
    const std::string& path = files().get(events, json);
    gpumem::sim::SnapshotOptions opt;
    std::int64_t entries = 0;
    for (auto _ : state) {
        auto rep = gpumem::sim::analyze_snapshot(path, opt);
        if (!rep) {
            state.SkipWithError(rep.error().message.c_str());
            return;
        }
        entries = rep.value().summary.traces.empty() ? 0 : rep.value().summary.traces[0].entries;
        benchmark::DoNotOptimize(rep.value().replay->peak_allocated);
    }
    std::error_code ec;
    state.counters["entries"] = static_cast<double>(entries);
    state.counters["file_bytes"] = static_cast<double>(fs::file_size(path, ec));
    state.counters["max_rss"] = max_rss_bytes();
}

void BM_Snapshot1MPickle(benchmark::State& s) { run(s, 1'000'000, false); }
void BM_Snapshot1MJson(benchmark::State& s) { run(s, 1'000'000, true); }
void BM_Snapshot10MPickle(benchmark::State& s) { run(s, 10'000'000, false); }
void BM_Snapshot10MJson(benchmark::State& s) { run(s, 10'000'000, true); }

}  // namespace

BENCHMARK(BM_Snapshot1MPickle)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Snapshot1MJson)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_Snapshot10MPickle)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_Snapshot10MJson)->Unit(benchmark::kMillisecond)->Iterations(1);
