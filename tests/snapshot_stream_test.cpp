// Streaming snapshot reading (analyze_snapshot, read_snapshot_streaming):
// the same summary and replay as the whole-document path (parse_snapshot_bytes
// + summarize + to_trace_detailed + replay) on the fixtures and on generated
// snapshots large enough to cross many pickle batches, and the counts the
// generator knows it wrote.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../bench/snapshot_gen.hpp"
#include "gpumem/report/snapshot_render.hpp"
#include "gpumem/sim/snapshot.hpp"
#include "test_util.hpp"

namespace {

using namespace gpumem;
using namespace gpumem::sim;
namespace fs = std::filesystem;

const std::string kDir = std::string(GPUMEM_SOURCE_DIR) + "/tests/fixtures/snapshots/";

using gpumem::test::slurp;

// The whole-document path, step by step as analyze_snapshot did it before
// reading streamed.
SnapshotReport whole_document(const std::string& path, const SnapshotOptions& opt) {
    auto snap = parse_snapshot_bytes(slurp(path), path);
    EXPECT_TRUE(snap.ok()) << (snap.ok() ? "" : snap.error().message);
    const Snapshot& s = snap.value();
    SnapshotReport rep;
    rep.summary = summarize(s, opt.top_n);
    const int device = opt.device >= 0 ? opt.device : default_device(s);
    auto conv = to_trace_detailed(s, device);
    rep.summary.conversion = conv.info;
    for (auto& n : conv.notes) rep.summary.notes.push_back(n);
    const ReplayOptions ro = snapshot_replay_options(s, opt, rep.summary.notes);
    rep.summary.replay_config = ro.config.to_string();
    rep.replay = replay(conv.trace, ro);
    return rep;
}

std::string rendered(const SnapshotReport& r) {
    return render_snapshot(r.summary, r.replay ? &*r.replay : nullptr, Format::Json);
}

void expect_same_as_whole_document(const std::string& path, const SnapshotOptions& opt = {}) {
    auto streamed = analyze_snapshot(path, opt);
    ASSERT_TRUE(streamed.ok()) << streamed.error().message;
    EXPECT_EQ(rendered(streamed.value()), rendered(whole_document(path, opt))) << path;
    // The bytes API streams too.
    auto bytes = analyze_snapshot_bytes(slurp(path), path, opt);
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    EXPECT_EQ(rendered(bytes.value()), rendered(streamed.value())) << path;
}

class TempDir {
public:
    TempDir() : path_(fs::temp_directory_path() / ("gpumem-stream-test-" + std::to_string(::getpid()))) {
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    fs::path path_;
};

TEST(SnapshotStream, FixturesMatchTheWholeDocumentPath) {
    for (const char* name : {"train_step.pickle", "train_step.json", "oom.pickle", "legacy_history.pickle"})
        expect_same_as_whole_document(kDir + name);
    SnapshotOptions none;
    none.replay.mode = AllocatorMode::None;
    expect_same_as_whole_document(kDir + "train_step.pickle", none);
}

TEST(SnapshotStream, GeneratedSnapshotsMatchTheWholeDocumentPathAndTheGenerator) {
    TempDir dir;
    const std::int64_t events = 25'000;  // 25 pickle batches of 1000 entries
    for (const bool json : {false, true}) {
        const std::string path = dir.file(json ? "g.json" : "g.pickle");
        const auto want = bench::SnapshotGen(events).write(path, json);
        ASSERT_EQ(want.entries, events);
        expect_same_as_whole_document(path);

        SnapshotOptions opt;
        opt.replay.mode = AllocatorMode::None;  // live requested bytes: the generator knows them
        auto rep = analyze_snapshot(path, opt);
        ASSERT_TRUE(rep.ok()) << rep.error().message;
        const auto& s = rep.value().summary;
        ASSERT_EQ(s.traces.size(), 1u);
        EXPECT_EQ(s.traces[0].entries, want.entries);
        EXPECT_EQ(s.traces[0].alloc, want.alloc);
        EXPECT_EQ(s.traces[0].free_requested, want.free_requested);
        EXPECT_EQ(s.traces[0].free_completed, want.free_completed);
        EXPECT_EQ(s.traces[0].segment_alloc, want.segment_alloc);
        EXPECT_EQ(s.traces[0].oom, want.oom);
        EXPECT_EQ(static_cast<std::int64_t>(s.ooms.size()), want.oom);
        EXPECT_EQ(s.active_blocks, want.active_blocks);
        ASSERT_TRUE(s.conversion.has_value());
        const auto& c = *s.conversion;
        EXPECT_EQ(c.seeded, want.seeded_frees + want.active_blocks);
        EXPECT_EQ(c.seeded_bytes.count(), want.seed_bytes);
        EXPECT_EQ(c.allocs, want.alloc + c.seeded);
        EXPECT_EQ(c.frees, want.free_completed);
        EXPECT_EQ(c.unmatched_frees, 0);
        EXPECT_EQ(c.implicit_frees, 0);
        EXPECT_EQ(c.free_action, "free_completed");
        const auto& r = *rep.value().replay;
        EXPECT_EQ(r.events, c.allocs + c.frees);
        EXPECT_EQ(r.peak_allocated.count(), want.peak_live);
        EXPECT_EQ(r.final_allocated.count(), want.final_live);
        // Frames come through the shared lists (pickle: freed batches' memo).
        ASSERT_FALSE(r.top_at_peak.empty());
        for (const auto& t : r.top_at_peak) EXPECT_NE(t.label.find(".py:"), std::string::npos) << t.label;
    }
}

TEST(SnapshotStream, RepeatedDeviceTracesKeyReadsTheLastOneAsBefore) {
    TempDir dir;
    const std::string path = dir.file("twice.json");
    std::ofstream(path) << R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 5}]],
        "device_traces": [[{"action": "alloc", "addr": 2, "size": 7}, {"action": "alloc", "addr": 3, "size": 9}]]})";
    auto rep = analyze_snapshot(path, SnapshotOptions{});
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    ASSERT_EQ(rep.value().summary.traces.size(), 1u);
    EXPECT_EQ(rep.value().summary.traces[0].entries, 2);
    expect_same_as_whole_document(path);
}

TEST(SnapshotStream, BadEntriesNameTheFieldWhenStreamed) {
    TempDir dir;
    const std::string path = dir.file("bad.json");
    std::ofstream(path) << R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 5},
        {"action": "alloc", "addr": 1, "size": -5}]]})";
    auto rep = analyze_snapshot(path, SnapshotOptions{});
    ASSERT_FALSE(rep.ok());
    EXPECT_NE(rep.error().message.find("device_traces[0][1].size"), std::string::npos) << rep.error().message;
}

}  // namespace
