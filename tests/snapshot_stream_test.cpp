// Streaming snapshot reading (analyze_snapshot, read_snapshot_streaming):
// the same summary and replay as the whole-document path (parse_snapshot_bytes
// + summarize + to_trace_detailed + replay) on the fixtures and on generated
// snapshots large enough to cross many pickle batches, and the counts the
// generator knows it wrote.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <set>
#include <sstream>

#include "../bench/snapshot_gen.hpp"
#include "../src/sim/snapshot_internal.hpp"
#include "gpumem/report/snapshot_render.hpp"
#include "gpumem/sim/pickle.hpp"
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

// The streamed analysis of `path` against the whole-document path's reading
// of it (`whole`): the same error, or the same report. True when both read
// it (false: both refused it).
bool streamed_matches(const std::string& path, const Result<Snapshot>& whole, const std::string& cmd) {
    auto streamed = analyze_snapshot(path, SnapshotOptions{});
    if (!whole.ok()) {
        EXPECT_FALSE(streamed.ok()) << cmd;
        if (!streamed.ok()) {
            EXPECT_EQ(streamed.error().message, whole.error().message) << cmd;
        }
        return false;
    }
    EXPECT_TRUE(streamed.ok()) << cmd << "\n" << (streamed.ok() ? "" : streamed.error().message);
    if (streamed.ok()) {
        EXPECT_EQ(rendered(streamed.value()), rendered(whole_document(path, SnapshotOptions{}))) << cmd;
    }
    return true;
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

// More entries than three of the chunks a streamed read keeps them in
// (65,536 each, handed back as the conversion reads them): the same report
// as the whole-document path.
TEST(SnapshotStream, EntriesOverSeveralKeptChunksMatchTheWholeDocumentPath) {
    TempDir dir;
    const std::string path = dir.file("chunks.pickle");
    const auto want = bench::SnapshotGen(200'000, 7).write(path, false);
    ASSERT_EQ(want.entries, 200'000);
    expect_same_as_whole_document(path);
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

// JSON trace entries are read alone by the fast lexer (FastJson::entry) and
// handed back to the SAX path when it meets anything it does not take. A
// generated grid of entries, every field with values of every kind (and
// frames of many shapes, repeated keys, odd spacing, nesting, an entry too
// long for the fast path), must read exactly as the whole-document path
// (nlohmann's DOM) reads it: the same report, or the same error.
TEST(SnapshotStream, JsonEntriesReadAloneMatchTheDocumentPath) {
    TempDir dir;
    const std::vector<std::string> values = {
        "null", "0", "7", "-3", "9223372036854775807", "9223372036854775808", "18446744073709551616", "-9223372036854775809",
        "2.5", "-0.0", "1e3", "1E-2", "1e400", "true", "false", "\"alloc\"", "\"free_completed\"", "\"oom\"", "\"x\"",
        "\"a\\nb\"", "\"\xc3\xa9\"", "[]", "[1, [2, {\"a\": null}]]", "{}", "{\"a\": {\"b\": [true]}}",
        "[[[[[[[[[[1]]]]]]]]]]", "01", "1.", "tru", "\"unterminated",
        // around the lexer's eight-digits-at-a-time integers (at most 18 digits)
        "12345678", "123456789", "1234567890123456", "999999999999999999", "-999999999999999999", "1000000000000000000",
        "-1000000000000000000", "12345678.5", "1234567812345678e3", "12345678E-1", "1234567a", "-", "-01", "00000000"};
    const std::vector<std::string> frames = {
        "[]",
        "[{\"filename\": \"a.py\", \"line\": 3, \"name\": \"f\"}]",
        "[{\"filename\": \"alloc.cpp\", \"line\": 9, \"name\": \"malloc\"}, {\"filename\": \"m.py\", \"line\": 4, \"name\": \"g\"}]",
        "[{\"filename\": \"alloc.cpp\", \"line\": 9, \"name\": \"malloc\"}]",
        "[1, \"s\", null, {\"line\": 5}, {\"name\": \"only_name\"}, {\"filename\": \"z.py\"}]",
        "[{\"filename\": \"a.py\", \"filename\": \"b.py\", \"line\": 1, \"line\": 2, \"name\": \"n\"}]",
        "[{\"filename\": 5, \"line\": \"7\", \"name\": [1]}, {\"filename\": \"q.py\", \"line\": 1.5, \"name\": \"h\"}]",
        "[{\"filename\": \"" + std::string(300, 'd') + ".py\", \"line\": 1, \"name\": \"long\"}]",
        // (cut to 256 characters and "...", the long name is no longer a .py file's: the second is taken)
        "[{\"filename\": \"" + std::string(300, 'd') + ".py\", \"line\": 1, \"name\": \"long\"}, {\"filename\": \"r.py\"}]",
        "[{\"filename\": \"c\\u00e9.py\", \"line\": 1, \"name\": \"esc\"}]",
        "[{\"filename\":\"t.py\",\"line\":-1,\"name\":\"\"},{\"filename\":\"\",\"line\":0,\"name\":\"\"}]",
        "{\"filename\": \"a.py\"}",
        "null",
        "7"};
    const std::vector<std::string> fields = {"action", "addr", "size", "stream", "time_us", "device_free", "frames", "extra", ""};
    // An entry with `field` set to `value` (replacing the base's own value).
    auto entry = [](const std::string& field, const std::string& value) {
        std::vector<std::pair<std::string, std::string>> kv = {
            {"action", "\"alloc\""}, {"addr", "4096"}, {"size", "512"}, {"stream", "0"}, {"time_us", "11"},
            {"frames", "[{\"filename\": \"m.py\", \"line\": 2, \"name\": \"fwd\"}]"}};
        bool set = false;
        for (auto& [k, v] : kv)
            if (k == field) v = value, set = true;
        if (!set) kv.emplace_back(field, value);
        std::string o = "{";
        for (std::size_t i = 0; i < kv.size(); ++i) o += (i ? ", \"" : "\"") + kv[i].first + "\": " + kv[i].second;
        return o + "}";
    };
    std::vector<std::string> cases;
    for (const auto& f : fields)
        for (const auto& v : values) cases.push_back(entry(f, v));
    for (const auto& fr : frames) cases.push_back(entry("frames", fr));
    // Strings of every length around the lexer's 16-byte steps, clean or with
    // an escape, a control or a non-ASCII byte at every place.
    for (int n = 0; n <= 40; ++n) {
        cases.push_back(entry("frames", "[{\"filename\": \"" + std::string(static_cast<std::size_t>(n), 'f') + ".py\", \"line\": 1}]"));
        for (const std::string odd : {"\\n", "\\\"", "\t", "\xc3\xa9", "\x7f"})
            cases.push_back(entry("frames", "[{\"filename\": \"" + std::string(static_cast<std::size_t>(n), 'f') + odd + "x.py\", \"line\": 1}]"));
    }
    cases.push_back(R"({"action": "alloc", "size": 5, "addr": 4096, "size": 7, "action": "free_completed", "addr": 8192})");
    cases.push_back(" {\n\t\"action\" :\"alloc\" ,\"addr\":4096,\"size\":512\r\n} ");
    cases.push_back(R"({})");
    cases.push_back(R"({"": 1, "action": "alloc", "addr": 4096, "size": 3})");
    cases.push_back(R"({"action": "alloc", "addr": 4096, "size": 3, "oops"})");
    cases.push_back(R"({"action": "alloc", "addr": 4096, "size": 3,})");
    cases.push_back("[1, 2]");
    cases.push_back("12");
    cases.push_back("\"entry\"");
    {  // longer than the fast path takes (256 KiB)
        std::string big = "[";
        for (int i = 0; i < 100'000; ++i) big += i ? ",[]" : "[]";
        cases.push_back(entry("extra", big + "]"));
    }
    const std::string path = dir.file("entries.json");
    int fast_ok = 0, errors = 0;
    for (const auto& c : cases) {
        // The case between two plain entries (an alloc before, its free after).
        const std::string text = R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 65536, "size": 1024},
            )" + c + R"(, {"action": "free_completed", "addr": 65536, "size": 1024}]]})";
        std::ofstream(path, std::ios::trunc) << text;
        const std::string cmd = "gpumem snapshot FILE  # FILE holds: " + text.substr(0, 600);
        if (streamed_matches(path, parse_snapshot_bytes(slurp(path), path), cmd)) ++fast_ok;
        else ++errors;
    }
    // The grid holds both kinds.
    EXPECT_GT(fast_ok, 100);
    EXPECT_GT(errors, 50);
}

// The fast lexer reads an entry's "frames" list once per distinct text and
// takes what the Reader made of it from a memo when the same bytes come
// again (FastJson::frames, FramesMemo). Entries repeating frames lists of
// many shapes (brackets and quotes inside strings, nested lists, odd
// spacing, lists that differ by one byte, a list after a repeated "frames"
// key, "frames" deeper in the entry, an escape, which sends the whole file
// through the SAX path) must read exactly as the whole-document path reads
// them.
TEST(SnapshotStream, RepeatedJsonFramesListsMatchTheDocumentPath) {
    TempDir dir;
    const std::vector<std::string> frames = {
        R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}, {"filename": "m.py", "line": 4, "name": "g"}])",
        R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}, {"filename": "m.py", "line": 5, "name": "g"}])",
        R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"},  {"filename": "m.py", "line": 4, "name": "g"}])",
        R"([{"filename": "a]b.py", "line": 1, "name": "f[0]"}, {"filename": "[.py", "line": 2, "name": "]]"}])",
        R"([{"filename": "q.cpp", "line": 1, "name": "x"}, [["nested"], {"k": [1, 2]}], {"filename": "n.py", "line": 3, "name": "h"}])",
        R"([])",
        R"([ ])",
        R"([{"filename": "solo.cpp", "line": 7, "name": "only_cpp"}])",
        R"([{"filename":"t.py","line":-1,"name":""},{"filename":"","line":0,"name":""}])",
        "[{\"filename\": \"" + std::string(20000, 'L') + ".py\", \"line\": 1, \"name\": \"over_the_memo_size\"}]",
        R"([{"filename": "e.py", "line": 1e2, "name": "float_line"}])",
        R"([{"filename": "u.py", "line": 18446744073709551615, "name": "big_line"}])"};
    auto entry = [](int i, const std::string& fr, const std::string& extra = "") {
        const std::string addr = std::to_string(4096 * (1 + i % 7));
        const char* action = i % 2 ? "free_completed" : "alloc";
        return std::string("{\"action\": \"") + action + "\", \"addr\": " + addr + ", \"size\": " +
               std::to_string(512 * (1 + i % 5)) + extra + ", \"frames\": " + fr + "}";
    };
    std::set<std::string> named;  // top frames read
    auto check = [&](const std::string& name, const std::string& trace) -> std::string {
        const std::string path = dir.file(name);
        const std::string text = R"({"segments": [], "device_traces": [[)" + trace + "]]}";
        std::ofstream(path, std::ios::trunc) << text;
        auto streamed = analyze_snapshot(path, SnapshotOptions{});
        EXPECT_TRUE(streamed.ok()) << streamed.error().message;
        if (!streamed.ok()) return std::string();
        const std::string got = rendered(streamed.value());
        EXPECT_EQ(got, rendered(whole_document(path, SnapshotOptions{}))) << "gpumem snapshot FILE  # FILE: " << name;
        // Entry by entry: the same top frame (by its text) as the document path's.
        struct Frames : TraceEntrySink {
            std::vector<std::int32_t> top;
            void entry(int, std::int64_t, const SnapshotTraceEntry& e) override { top.push_back(e.frame); }
            void restart() override { top.clear(); }
        } sink;
        auto doc = parse_snapshot_bytes(slurp(path), path);
        auto str = parse_snapshot_streaming(slurp(path), path, sink);
        EXPECT_TRUE(doc.ok() && str.ok());
        if (!doc.ok() || !str.ok()) return got;
        const auto& want = doc.value().device_traces.at(0);
        EXPECT_EQ(sink.top.size(), want.size());
        auto label = [](const Snapshot& s, std::int32_t f) { return f < 0 ? std::string("-") : frame_label(s.frames.at(static_cast<std::size_t>(f))); };
        for (std::size_t i = 0; i < std::min(sink.top.size(), want.size()); ++i) {
            EXPECT_EQ(label(str.value(), sink.top[i]), label(doc.value(), want[i].frame)) << name << " entry " << i;
            named.insert(label(str.value(), sink.top[i]));
        }
        return got;
    };
    std::string trace;
    int n = 0;
    for (int round = 0; round < 3; ++round)
        for (std::size_t k = 0; k < frames.size(); ++k) {
            trace += (n ? ", " : "") + entry(n, frames[(k * 5 + static_cast<std::size_t>(round)) % frames.size()]);
            ++n;
        }
    // "frames" twice (the last counts), "frames" inside another field, and an
    // entry whose frames list lies past the fast path's 256 KiB.
    trace += ", " + entry(n++, frames[0], ", \"frames\": " + frames[3]);
    trace += ", " + entry(n++, frames[3], ", \"frames\": " + frames[0]);
    trace += ", " + entry(n++, frames[1], ", \"extra\": {\"frames\": " + frames[0] + "}");
    trace += ", " + entry(n++, frames[0], ", \"extra\": \"" + std::string(300'000, 'x') + "\"");
    trace += ", " + entry(n++, frames[0]);
    const std::string clean = check("repeated.json", trace);
    EXPECT_FALSE(clean.empty());
    // The lists' distinct top frames, each read (none taken for another).
    EXPECT_EQ(named, (std::set<std::string>{"-", "m.py:4 g", "m.py:5 g", "a]b.py:1 f[0]", "n.py:3 h", "solo.cpp:7 only_cpp",
                                            "t.py:-1", std::string(256, 'L') + "...:1 over_the_memo_size", "e.py:0 float_line",
                                            "u.py:0 big_line"}));
    // More distinct lists than the memo files (FramesMemo::kMaxTexts, 65,536),
    // then lists filed early and lists that found it full, again.
    {
        std::string many;
        // Distinct texts, few distinct top frames (the Reader interns at most 65,536).
        constexpr int kTops = 97, kLists = 70'000;
        auto list = [&](int k) {
            return R"([{"filename": "alloc.cpp", "line": )" + std::to_string(k) +
                   R"(, "name": "malloc"}, {"filename": "d.py", "line": )" + std::to_string(k % kTops) + R"(, "name": "f"}])";
        };
        int m = 0;
        for (int k = 0; k < kLists; ++k) many += (m ? ", " : "") + entry(m, list(k)), ++m;
        for (int k : {0, 1, 65'535, 65'536, kLists - 1, 0}) many += ", " + entry(m, list(k)), ++m;
        named.clear();
        check("many.json", many);
        EXPECT_EQ(named.size(), static_cast<std::size_t>(kTops));
    }
    // The same entries with an escaped list among them, read by the SAX path.
    check("escaped.json", trace + ", " + entry(n, R"([{"filename": "x\"].py", "line": 1, "name": "esc"}])") + ", " +
                              entry(n + 1, R"([{"filename": "x\"].py", "line": 1, "name": "esc"}])"));
}

// Pickled trace entries of the common shape are read without building them
// (pickle.hpp, "Streamed trace entries of the common shape"); any other
// entry is built and read as before, and a direct entry used as anything
// but an entry sends the whole file through the plain streaming parse
// (DirectFallback). Entries of many shapes, written as pickle.dump writes
// them (memoized keys, actions and frame lists, batches of MARK ... APPENDS),
// must read exactly as the whole-document path reads them: the same report,
// or the same error.
class PickleOut {
public:
    PickleOut() { out_ = std::string("\x80\x04", 2); }
    std::string& raw() { return out_; }
    void memoize() { out_ += '\x94', ++memo_; }
    // EMPTY_DICT / EMPTY_LIST, memoized, then MARK.
    void open(char container) { out_ += container, memoize(), out_ += '('; }
    std::vector<int> entries;  // memo indexes of the trace entries' dicts, in order
    // A string, memoized the first time and a memo reference after.
    void str(const std::string& s) {
        if (const auto it = strings_.find(s); it != strings_.end()) return get(it->second);
        out_ += '\x8c', out_ += static_cast<char>(s.size()), out_ += s;
        strings_[s] = memo_;
        memoize();
    }
    void get(int m) {
        if (m < 256) {
            out_ += 'h', out_ += static_cast<char>(m);
        } else {
            out_ += 'j';
            for (int i = 0; i < 4; ++i) out_ += static_cast<char>((m >> (8 * i)) & 0xff);
        }
    }
    // An integer as pickle.dump writes it: BININT1, BININT2, BININT, LONG1.
    void integer(std::int64_t v) {
        if (v >= 0 && v < 256) {
            out_ += 'K', out_ += static_cast<char>(v);
        } else if (v >= 0 && v < 65536) {
            out_ += 'M', out_ += static_cast<char>(v & 0xff), out_ += static_cast<char>(v >> 8);
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
            out_ += 'J';
            for (int i = 0; i < 4; ++i) out_ += static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
        } else {
            // LONG1 with the fewest bytes that keep the sign (Lib/pickle.py encode_long).
            std::string b;
            std::int64_t x = v;
            do {
                b += static_cast<char>(static_cast<std::uint64_t>(x) & 0xff);
                x >>= 8;
            } while (!((x == 0 && !(b.back() & 0x80)) || (x == -1 && (b.back() & 0x80))));
            out_ += '\x8a', out_ += static_cast<char>(b.size()), out_ += b;
        }
    }
    // A frames list, memoized; its memo index.
    int frames(const std::string& file, int line) {
        const int m = memo_;
        open(']');
        for (const auto& [f, l] : {std::pair<std::string, int>{"alloc.cpp", 9}, {file, line}}) {
            open('}');
            str("filename"), str(f), str("line"), integer(l), str("name"), str("fn");
            out_ += 'u';
        }
        out_ += 'e';
        return m;
    }
    int memo() const { return memo_; }

private:
    std::string out_;
    int memo_ = 0;
    std::map<std::string, int> strings_;
};

constexpr int kPickleEntries = 60;

TEST(SnapshotStream, PickleEntriesReadDirectlyMatchTheDocumentPath) {
    TempDir dir;
    // `odd(w, i)` writes entry i's fields (between the dict's MARK and
    // SETITEMS) when it returns true; `after(w, i)` writes opcodes after it.
    struct Case {
        std::string name;
        std::function<bool(PickleOut&, int)> odd;
        std::function<void(PickleOut&, int)> after;
        bool fallback = false;  // the direct entries are used otherwise
        // The streaming reader refuses it where the whole document reads it
        // (pickle.hpp: a GET of a claimed entry is an error): compared with
        // the streaming parse without direct entries only.
        bool stream_refuses = false;
        // The odd entry has the common shape (its values are read directly;
        // what they mean is the Reader's to judge).
        bool odd_direct = false;
    };
    // `frames`: a memo reference, or -1 for a new list written in place.
    auto plain = [](PickleOut& w, int i, int& frames) {
        w.str("action"), w.str(i % 2 ? "free_completed" : "alloc");
        w.str("addr"), w.integer(std::int64_t{139'000'000'000'000} + 512 * (i / 2 % 5));
        w.str("size"), w.integer(i % 3 == 0 ? 70'000 : (i % 3 == 1 ? 300 : 5'000'000'000));
        w.str("stream"), w.integer(0);
        w.str("time_us"), w.integer(1'700'000'000'000'000 + i);
        w.str("frames");
        if (frames < 0) frames = w.frames("m" + std::to_string(i % 7) + ".py", i);
        else w.get(frames);
    };
    const std::vector<Case> cases = {
        {"plain", {}, {}},
        {"null_size", [](PickleOut& w, int i) { return i == 21 && (w.str("action"), w.str("alloc"), w.str("size"), w.raw() += 'N', true); }, {}},
        {"negative_addr", [](PickleOut& w, int i) { return i == 22 && (w.str("action"), w.str("alloc"), w.str("addr"), w.integer(-512), true); }, {}},
        {"float_time", [](PickleOut& w, int i) {
             return i == 23 && (w.str("action"), w.str("alloc"), w.str("time_us"), w.raw() += std::string("G\x40\x09\x21\xfb\x54\x44\x2d\x18", 9), true);
         }, {}},
        {"unknown_key", [](PickleOut& w, int i) { return i == 24 && (w.str("action"), w.str("alloc"), w.str("extra"), w.integer(1), true); }, {}},
        {"repeated_key", [](PickleOut& w, int i) {
             return i == 25 && (w.str("action"), w.str("alloc"), w.str("size"), w.integer(5), w.str("size"), w.integer(7), true);
         }, {}},
        {"no_action", [](PickleOut& w, int i) { return i == 26 && (w.str("size"), w.integer(5), true); }, {}},
        {"action_not_a_string", [](PickleOut& w, int i) { return i == 27 && (w.str("action"), w.integer(3), true); }, {}},
        {"frames_not_a_list", [](PickleOut& w, int i) { return i == 28 && (w.str("action"), w.str("alloc"), w.str("frames"), w.str("alloc"), true); },
         {}, false, false, true},
        {"wide_integer", [](PickleOut& w, int i) {
             return i == 29 && (w.str("action"), w.str("alloc"), w.str("size"), w.raw() += std::string("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00", 11), true);
         }, {}},
        {"negative_stream", [](PickleOut& w, int i) { return i == 30 && (w.str("action"), w.str("alloc"), w.str("stream"), w.integer(-7), true); },
         {}, false, false, true},
        // LONG1 of fewer than 8 bytes, negative (sign-extended): a stream of -7, a time of -2^40.
        {"short_negative_long1", [](PickleOut& w, int i) {
             return i == 31 && (w.str("action"), w.str("alloc"), w.str("stream"), w.raw() += std::string("\x8a\x01\xf9", 3),
                                w.str("time_us"), w.integer(-(std::int64_t{1} << 40)), true);
         }, {}, false, false, true},
        {"size_past_2^63", [](PickleOut& w, int i) {
             return i == 31 && (w.str("action"), w.str("alloc"), w.str("size"), w.raw() += std::string("\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f", 10),
                                w.str("device_free"), w.raw() += std::string("\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f", 10), true);
         }, {}},  // (built: its "device_free" key is a new string, written in place)
        // A memo reference to an entry of an earlier batch (read and freed): an error.
        {"consumed_reference", [](PickleOut& w, int i) {
             return i == 41 && (w.str("action"), w.str("alloc"), w.str("frames"), w.get(w.entries.at(10)), true);
         }, {}, false, true},
        // An entry dict referenced again in its batch (read twice, as before).
        {"entry_twice", {}, [](PickleOut& w, int i) { if (i == 33) w.get(w.memo() - 1); }},
        // A direct entry's dict given another key afterwards (SETITEM).
        {"setitem_after", {}, [](PickleOut& w, int i) { if (i == 34) w.str("late"), w.integer(1), w.raw() += 's'; }, true},
        // A direct entry's dict dropped (POP) but memoized: it outlives its batch.
        {"popped", {}, [](PickleOut& w, int i) {
             if (i == 35) w.open('}'), w.str("action"), w.str("alloc"), w.raw() += "u0";
         }, true},
        // A direct entry's dict inside another container (a tuple in the batch).
        {"in_a_tuple", {}, [](PickleOut& w, int i) { if (i == 37) w.get(w.memo() - 1), w.raw() += '\x85'; }, true},
    };
    int direct_total = 0;
    for (const auto& c : cases) {
        PickleOut w;
        w.open('}');
        w.str("segments"), w.raw() += ']', w.memoize();
        w.str("device_traces"), w.open(']'), w.open(']');
        int frames = -1;
        // The items appended to the trace, and which of them the parser
        // must read directly: after the first batch (the list is claimed by
        // it), every entry of the common shape whose values are memo
        // references or integers (an alloc writing a new frames list is not).
        int items = 0, want_direct = 0;
        for (int i = 0; i < kPickleEntries; ++i) {
            // A new frames list for every third alloc; the free shares the alloc's.
            if (i % 2 == 0 && (i / 2) % 3 == 0) frames = -1;
            w.entries.push_back(w.memo());
            w.open('}');
            bool direct = i >= 4;
            if (c.odd && c.odd(w, i)) {
                direct = direct && c.odd_direct;
            } else {
                direct = direct && frames >= 0;
                plain(w, i, frames);
            }
            w.raw() += 'u';
            ++items, want_direct += direct;
            const std::size_t before = w.raw().size();
            if (c.after) c.after(w, i);
            if (c.name == "entry_twice" && w.raw().size() > before) ++items, want_direct += direct;  // the same dict again
            if (i % 4 == 3) w.raw() += "e(";
        }
        w.raw() += "eeu.";
        const std::string path = dir.file(c.name + ".pickle");
        std::ofstream(path, std::ios::binary | std::ios::trunc) << w.raw();
        const std::string cmd = "gpumem snapshot FILE  # FILE: case " + c.name;
        auto streamed = analyze_snapshot(path, SnapshotOptions{});
        auto whole = parse_snapshot_bytes(slurp(path), path);
        // The parse alone, with and without direct entries: the same result.
        struct Count final : pickle::ListSink {
            int direct = 0, built = 0;
            void items(const pickle::Document& d, std::size_t, std::span<const pickle::Document::Id> it) override {
                for (auto id : it) (d.direct(id) ? direct : built)++;
            }
        } count, plain_count;
        pickle::StreamSpec spec, plain_spec;
        spec.key = plain_spec.key = "device_traces";
        spec.sink = &count;
        plain_spec.sink = &plain_count;
        plain_spec.direct = false;
        const std::string data = slurp(path);
        bool fell_back = false;
        std::optional<Result<pickle::Document>> parsed;
        try {
            parsed.emplace(pickle::parse(data, path, {}, spec));
        } catch (const pickle::DirectFallback&) {
            fell_back = true;
        }
        const auto plain_parsed = pickle::parse(data, path, {}, plain_spec);
        EXPECT_EQ(fell_back, c.fallback) << cmd;
        if (!fell_back) {
            EXPECT_EQ(parsed->ok(), plain_parsed.ok()) << cmd;
            if (!parsed->ok() && !plain_parsed.ok()) {
                EXPECT_EQ(parsed->error().message, plain_parsed.error().message) << cmd;
            }
            EXPECT_EQ(count.direct + count.built, plain_count.built) << cmd;
            if (parsed->ok()) {
                EXPECT_EQ(count.direct, want_direct) << cmd;
                EXPECT_EQ(count.built, items - want_direct) << cmd;
                direct_total += count.direct;
            }
        }
        if (c.stream_refuses) {
            ASSERT_FALSE(streamed.ok()) << cmd;
            EXPECT_FALSE(plain_parsed.ok()) << cmd;
            if (!plain_parsed.ok()) {
                EXPECT_NE(streamed.error().message.find(plain_parsed.error().message), std::string::npos) << cmd;
            }
            continue;
        }
        if (!whole.ok()) {
            ASSERT_FALSE(streamed.ok()) << cmd;
            EXPECT_EQ(streamed.error().message, whole.error().message) << cmd;
        } else {
            ASSERT_TRUE(streamed.ok()) << cmd << "\n" << streamed.error().message;
            EXPECT_EQ(rendered(streamed.value()), rendered(whole_document(path, SnapshotOptions{}))) << cmd;
            // Entry by entry, every field (the report sums them).
            struct Keep final : TraceEntrySink {
                std::vector<SnapshotTraceEntry> e;
                void entry(int, std::int64_t, const SnapshotTraceEntry& x) override { e.push_back(x); }
                void restart() override { e.clear(); }
            } keep;
            auto str = parse_snapshot_streaming(slurp(path), path, keep);
            ASSERT_TRUE(str.ok()) << cmd;
            const auto& want = whole.value().device_traces.at(0);
            ASSERT_EQ(keep.e.size(), want.size()) << cmd;
            auto label = [](const Snapshot& sn, std::int32_t f) {
                return f < 0 ? std::string("-") : frame_label(sn.frames.at(static_cast<std::size_t>(f)));
            };
            for (std::size_t k = 0; k < want.size(); ++k) {
                const auto &a = keep.e[k], &b = want[k];
                EXPECT_TRUE(a.action == b.action && a.addr == b.addr && a.size == b.size && a.stream == b.stream &&
                            a.time_us == b.time_us && a.device_free == b.device_free &&
                            label(str.value(), a.frame) == label(whole.value(), b.frame))
                    << cmd << " entry " << k << ": stream " << a.stream << " vs " << b.stream << ", time " << a.time_us << " vs "
                    << b.time_us << ", size " << a.size.count() << " vs " << b.size.count();
            }
        }
    }
    EXPECT_GT(direct_total, 400);
}

// The conversion's first pass runs beside a streamed read, over each kept
// chunk (65,536 entries) as it fills (snapshot_replay.cpp KeptEntries): the
// same report as the whole-document path, which reads the entries after
// parsing them. Traces of several chunks: a trace that frees with
// free_completed (the pass's work is used), one that frees with
// free_requested only (the pass took the wrong free: the conversion reads
// the entries again), two devices (the pass follows the device kept), and a
// pickle read twice (an entry given a key afterwards sends the file through
// the plain parse, which keeps its entries again from the start).
TEST(SnapshotStream, ConversionFirstPassBesideTheReadingMatchesTheWholeDocumentPath) {
    TempDir dir;
    constexpr int kEntries = 150'000;  // per device: two whole chunks and part of a third
    struct Case {
        std::string name;
        const char* free;
        int devices;
        int setitem_at;  // an entry given a key afterwards (-1: none)
    };
    const std::vector<Case> cases = {
        {"completed", "free_completed", 1, -1},
        {"requested", "free_requested", 1, -1},
        {"two_devices", "free_completed", 2, -1},
        {"read_twice", "free_completed", 1, 140'000},
    };
    for (const auto& c : cases) {
        PickleOut w;
        w.open('}');
        w.str("segments"), w.raw() += ']', w.memoize();
        w.str("device_traces"), w.open(']');
        int frames = -1;
        std::vector<std::int64_t> frees(static_cast<std::size_t>(c.devices), 0), seeds(static_cast<std::size_t>(c.devices), 0);
        for (int d = 0; d < c.devices; ++d) {
            w.open(']');
            for (int i = 0; i < kEntries; ++i) {
                // 300 frees of addresses never allocated (seeds), then groups
                // of six: alloc a, b, c; free b, a, c (addresses reused every
                // 20,000 groups, sizes varied so that blocks split and merge);
                // the last 100 entries are seeds too (in the last chunk,
                // handed to the pass when the reading ends).
                const int g = (i - 300) / 6, k = (i - 300) % 6;
                std::int64_t addr = 0;
                const char* action = c.free;
                if (i < 300 || i >= kEntries - 100) {
                    addr = std::int64_t{200'000'000'000'000} + 4096 * i + d;
                    ++seeds[static_cast<std::size_t>(d)];
                } else {
                    static constexpr int kSlot[6] = {0, 1, 2, 1, 0, 2};
                    addr = std::int64_t{139'000'000'000'000} + 3 * 4096 * (g % 20'000) + 4096 * kSlot[k];
                    if (k < 3) action = "alloc";
                }
                frees[static_cast<std::size_t>(d)] += action == c.free;
                w.open('}');
                w.str("action"), w.str(action);
                w.str("addr"), w.integer(addr);
                w.str("size"), w.integer(512 * (1 + (g * 7 + k) % 9) + (i < 300 ? 1 << 20 : 0));
                w.str("stream"), w.integer(0);
                w.str("time_us"), w.integer(1'700'000'000'000'000 + i);
                w.str("frames");
                if (frames < 0) frames = w.frames("train.py", 3);
                else w.get(frames);
                w.raw() += 'u';
                if (i == c.setitem_at) w.str("late"), w.integer(1), w.raw() += 's';
                if (i % 1000 == 999) w.raw() += "e(";
            }
            w.raw() += 'e';
        }
        w.raw() += "eu.";
        const std::string path = dir.file(c.name + ".pickle");
        std::ofstream(path, std::ios::binary | std::ios::trunc) << w.raw();
        SCOPED_TRACE("gpumem snapshot FILE  # FILE: case " + c.name);
        expect_same_as_whole_document(path);
        for (int d = 0; d < c.devices; ++d) {
            SnapshotOptions opt;
            opt.device = d;
            expect_same_as_whole_document(path, opt);
        }
        auto rep = analyze_snapshot(path, SnapshotOptions{});
        ASSERT_TRUE(rep.ok()) << rep.error().message;
        ASSERT_TRUE(rep.value().summary.conversion.has_value());
        // Device 0's seeds, each freed by the trace's own free action.
        EXPECT_EQ(rep.value().summary.conversion->seeded, seeds[0]);
        EXPECT_EQ(rep.value().summary.conversion->free_action, c.free);
        EXPECT_EQ(rep.value().summary.conversion->frees, frees[0]);
    }
}

// A large JSON snapshot is read by two threads: a read-ahead lexes the trace
// entries from a point near the middle, and the reader takes its records
// when it arrives there (src/sim/snapshot_internal.hpp). The read-ahead is
// switched on here for small files and started at points across the file:
// every file must read exactly as the whole-document path reads it (the
// same report, or the same error), whether the read-ahead's start is a
// trace entry, an object elsewhere (a frames list's, a skipped list's, a
// segment's block), or its run ends at an entry it cannot read alone.
namespace {
class ReadAheadFor {
public:
    explicit ReadAheadFor(double at) : saved_(sim::detail::json_read_ahead()) {
        sim::detail::JsonReadAhead r;
        r.min_bytes = 0;
        r.at = at;
        sim::detail::set_json_read_ahead(r);
    }
    ~ReadAheadFor() { sim::detail::set_json_read_ahead(saved_); }
    ReadAheadFor(const ReadAheadFor&) = delete;
    ReadAheadFor& operator=(const ReadAheadFor&) = delete;

private:
    sim::detail::JsonReadAhead saved_;
};
}  // namespace

TEST(SnapshotStream, JsonReadAheadMatchesTheDocumentPath) {
    TempDir dir;
    const std::vector<double> starts = {0.02, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 0.98};
    // A generated trace (frames lists repeated, segments before the trace).
    {
        const std::string path = dir.file("gen.json");
        bench::SnapshotGen(20'000, 3).write(path, true);
        for (const double at : starts) {
            const std::size_t before = sim::detail::json_read_ahead_entries();
            ReadAheadFor ra(at);
            SCOPED_TRACE("read-ahead at " + std::to_string(at) + " of " + path);
            expect_same_as_whole_document(path);
            // From a third of the file on the start is in the trace: the reader took records.
            if (at >= 0.3) {
                EXPECT_GT(sim::detail::json_read_ahead_entries(), before);
            }
        }
    }
    // Crafted traces: 400 plain entries, the odd one at `odd_at`, two device
    // lists, objects that look like entries elsewhere.
    auto plain = [](int i, const std::string& frames) {
        const std::string addr = std::to_string(65536 * (1 + i % 13));
        return std::string("{\"action\": \"") + (i % 2 ? "free_completed" : "alloc") + "\", \"addr\": " + addr +
               ", \"size\": " + std::to_string(512 * (1 + i % 5)) + ", \"stream\": " + std::to_string(i % 3 ? 0 : 7) +
               ", \"time_us\": " + std::to_string(1000 + i) + ", \"frames\": " + frames + "}";
    };
    const std::vector<std::string> frames = {
        R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}, {"filename": "m.py", "line": 4, "name": "g"}])",
        R"([{"filename": "n.py", "line": 5, "name": "h"}])",
        R"([{"action": "alloc", "addr": 1, "size": 2}, {"action": "alloc", "addr": 3, "size": 4}])",  // entry-like objects
        R"([])"};
    const std::vector<std::string> odd = {
        R"({"action": "alloc", "addr": 65536, "size": 512, "extra": 1})",
        R"({"action": "alloc", "addr": 65536, "size": 1.5})",
        R"({"action": "alloc", "addr": 65536, "size": 512, "frames": [{"filename": "e\u00e9.py", "line": 1}]})",
        R"({"action": "alloc", "addr": 65536, "size": 512, "device_free": 1048576})",
        R"({"action": "oom", "size": 512, "device_free": 0, "stream": -4})",
        R"({"action": "alloc", "addr": 65536, "size": -5})",
        R"({"action": "alloc", "addr": 65536, "size": 512, "size": 7})",
        R"({"addr": 65536, "size": 512})",
        R"([1, 2])"};
    auto trace = [&](int n, int odd_at, const std::string& odd_entry) {
        std::string t;
        for (int i = 0; i < n; ++i) {
            if (i) t += i % 17 ? ", " : ",\n  ";
            t += i == odd_at ? odd_entry : plain(i, frames[static_cast<std::size_t>(i) % frames.size()]);
        }
        return t;
    };
    std::vector<std::pair<std::string, std::string>> texts;  // name, text
    for (std::size_t k = 0; k < odd.size(); ++k)
        for (const int odd_at : {5, 150, 250, 390})
            texts.emplace_back("odd" + std::to_string(k) + "_" + std::to_string(odd_at),
                               R"({"segments": [], "device_traces": [[)" + trace(400, odd_at, odd[k]) + "]]}");
    {  // sizes that add up past 2^63 at entry 300: the error is raised while the reader hands records over
        const std::string huge = R"({"action": "alloc", "addr": 65536, "size": 9223372036854775000})";
        std::string t = trace(400, 200, huge);
        const std::string at300 = plain(300, frames[0]);
        t.replace(t.find(at300), at300.size(), huge);
        texts.emplace_back("sizes_overflow", R"({"segments": [], "device_traces": [[)" + t + "]]}");
    }
    texts.emplace_back("two_devices", R"({"segments": [], "device_traces": [[)" + trace(200, -1, "") + "], [" + trace(200, -1, "") + "]]}");
    texts.emplace_back("skipped_key", R"({"segments": [], "device_traces": [[)" + trace(300, -1, "") + R"(]], "device_traces": [[)" +
                                          trace(100, -1, "") + "]]}");
    texts.emplace_back("size_first_blocks",
                       R"({"segments": [{"address": 1048576, "total_size": 2097152, "stream": 0, "blocks": [)" +
                           [] {
                               std::string b;
                               for (int i = 0; i < 300; ++i) b += std::string(i ? ", " : "") + "{\"size\": 4096, \"state\": \"inactive\"}";
                               return b;
                           }() +
                           R"(]}], "device_traces": [[)" + trace(100, -1, "") + "]]}");
    int compared = 0, errors = 0;
    const std::size_t before = sim::detail::json_read_ahead_entries();
    for (const auto& [name, text] : texts) {
        const std::string path = dir.file(name + ".json");
        std::ofstream(path, std::ios::trunc) << text;
        auto whole = parse_snapshot_bytes(text, path);
        for (const double at : starts) {
            ReadAheadFor ra(at);
            const std::string cmd = "read-ahead at " + std::to_string(at) + ": gpumem snapshot " + name + ".json";
            if (streamed_matches(path, whole, cmd)) ++compared;
            else ++errors;
        }
    }
    EXPECT_GT(compared, 150);
    EXPECT_GT(errors, 100);
    EXPECT_GT(sim::detail::json_read_ahead_entries(), before + 10'000);
}
