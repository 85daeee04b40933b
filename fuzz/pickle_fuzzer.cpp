// libFuzzer entry point for the snapshot reader: pickle parser, snapshot
// schema, summary, trace conversion and replay. Every input must give a value
// or an Error, never a crash, a sanitizer report, a leak or a hang.
// Built by -DGPUMEM_FUZZ=ON (fuzz/CMakeLists.txt); run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/sim/pickle.hpp"
#include "gpumem/sim/snapshot.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);

    // The bare pickle reader, with tight limits to reach the limit paths.
    gpumem::sim::pickle::Limits tight;
    tight.max_depth = 16;
    tight.max_memo = 64;
    tight.max_nodes = 4096;
    tight.max_container = 256;
    tight.max_string = 1024;
    (void)gpumem::sim::pickle::parse(bytes, "fuzz", tight);

    // The whole snapshot path, with a small device so that replay hits OOM.
    gpumem::sim::SnapshotOptions opt;
    opt.replay.capacity = gpumem::MiB(64);
    opt.replay.max_timeline_points = 64;
    auto rep = gpumem::sim::analyze_snapshot_bytes(bytes, "fuzz.pickle", opt);
    if (rep.ok()) {
        auto snap = gpumem::sim::parse_snapshot_bytes(bytes, "fuzz.pickle");
        if (snap.ok()) {
            for (int dev = -1; dev < 3; ++dev) (void)gpumem::sim::to_trace(snap.value(), dev);
        }
    }
    return 0;
}
