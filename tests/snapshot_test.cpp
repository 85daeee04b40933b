// Tests of the PyTorch memory-snapshot reader: the plain-data pickle parser,
// the snapshot summary, trace conversion and replay of the fixtures written by
// scripts/make_test_snapshots.py, and hostile inputs (truncation, code-running
// opcodes, deep nesting, huge lengths, wrong field types, random mutations).
//
// Expected numbers are worked by hand from the fixture's story (see
// train_step() in the script) and the caching allocator rules (512 B
// rounding; small pool <= 1 MiB in 2 MiB segments; large requests < 10 MiB in
// 20 MiB segments, larger ones rounded up to 2 MiB; large-pool split only when
// the remainder exceeds 1 MiB).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/report/snapshot_render.hpp"
#include "gpumem/sim/pickle.hpp"
#include "gpumem/sim/snapshot.hpp"
#include "test_util.hpp"

using namespace gpumem;
using namespace gpumem::sim;

namespace {

const std::string kDir = std::string(GPUMEM_SOURCE_DIR) + "/tests/fixtures/snapshots/";

using gpumem::test::slurp;

template <std::size_t N>
std::string bytes(const char (&s)[N]) {
    return std::string(s, N - 1);
}

constexpr std::int64_t kMiB = 1024 * 1024;

// ---------------------------------------------------------------------------
// The pickle reader on pickles written by CPython (bytes pasted from
// pickle.dumps of the value in each comment).

// {'a': [1, -2, 300, 70000, -70000, 2**40, -2**63, 3.5, None, True, False, 'hé',
//        (1, 2), (), (1, 2, 3, 4)], 'b': {}}
void check_sample(const pickle::Document& d) {
    using pickle::Kind;
    const auto root = d.root();
    ASSERT_EQ(d.kind(root), Kind::Dict);
    EXPECT_EQ(d.size(root), 2u);
    const auto a = d.find(root, "a");
    ASSERT_TRUE(a.has_value());
    ASSERT_EQ(d.kind(*a), Kind::List);
    const auto it = d.items(*a);
    ASSERT_EQ(it.size(), 15u);
    const std::int64_t ints[] = {1, -2, 300, 70000, -70000, std::int64_t(1) << 40, INT64_MIN};
    for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(d.kind(it[static_cast<std::size_t>(i)]), Kind::Int) << i;
        EXPECT_EQ(d.as_int(it[static_cast<std::size_t>(i)]), ints[i]) << i;
    }
    EXPECT_EQ(d.kind(it[7]), Kind::Float);
    EXPECT_DOUBLE_EQ(d.as_float(it[7]), 3.5);
    EXPECT_EQ(d.kind(it[8]), Kind::None);
    EXPECT_EQ(d.kind(it[9]), Kind::Bool);
    EXPECT_TRUE(d.as_bool(it[9]));
    EXPECT_FALSE(d.as_bool(it[10]));
    EXPECT_EQ(d.as_string(it[11]), "h\xc3\xa9");
    EXPECT_EQ(d.kind(it[12]), Kind::Tuple);
    EXPECT_EQ(d.size(it[12]), 2u);
    EXPECT_EQ(d.size(it[13]), 0u);
    EXPECT_EQ(d.size(it[14]), 4u);
    const auto b = d.find(root, "b");
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(d.kind(*b), Kind::Dict);
    EXPECT_FALSE(d.find(root, "c").has_value());
}

TEST(Pickle, Protocol2FromCPython) {
    const auto data = bytes(
        "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe\xff\xff\xff\x4d\x2c\x01\x4a\x70\x11\x01\x00\x4a\x90\xee\xfe\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x47\x40\x0c\x00\x00\x00\x00\x00\x00\x4e\x88\x89\x58\x03\x00\x00\x00\x68\xc3\xa9\x71\x03\x4b\x01\x4b\x02\x86\x71\x04\x29\x28\x4b\x01\x4b\x02\x4b\x03\x4b\x04\x74\x71\x05\x65\x58\x01\x00\x00\x00\x62\x71\x06\x7d\x71\x07\x75\x2e");
    auto d = pickle::parse(data, "p2");
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->protocol(), 2);
    check_sample(d.value());
}

TEST(Pickle, Protocol4And5FromCPython) {
    // The same value with b'\x00\x01' inserted before (1, 2) in protocols 4/5 would differ; here
    // the list is the protocol-2 one plus bytes: check the list length separately.
    const auto p4 = bytes(
        "\x80\x04\x95\x62\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x4b\x01\x4a\xfe\xff\xff\xff\x4d\x2c\x01\x4a\x70\x11\x01\x00\x4a\x90\xee\xfe\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x47\x40\x0c\x00\x00\x00\x00\x00\x00\x4e\x88\x89\x8c\x03\x68\xc3\xa9\x94\x43\x02\x00\x01\x94\x4b\x01\x4b\x02\x86\x94\x29\x28\x4b\x01\x4b\x02\x4b\x03\x4b\x04\x74\x94\x65\x8c\x01\x62\x94\x7d\x94\x75\x2e");
    for (char proto : {'\x04', '\x05'}) {
        std::string data = p4;
        data[1] = proto;
        auto d = pickle::parse(data, "p45");
        ASSERT_TRUE(d.ok()) << d.error().message;
        EXPECT_EQ(d->protocol(), proto);
        const auto a = *d->find(d->root(), "a");
        const auto it = d->items(a);
        ASSERT_EQ(it.size(), 16u);  // ... 'hé', b'\x00\x01', (1, 2), (), (1, 2, 3, 4)
        EXPECT_EQ(d->kind(it[12]), pickle::Kind::Bytes);
        EXPECT_EQ(d->as_string(it[12]), std::string("\x00\x01", 2));
        EXPECT_EQ(d->as_int(it[6]), INT64_MIN);
        EXPECT_EQ(d->size(it[15]), 4u);
    }
}

TEST(Pickle, Protocol0TextOpcodes) {
    // pickle.dumps([1, -5, 2.5, []], protocol=0) == b'(lp0\nI1\naI-5\naF2.5\na(lp1\na.'
    auto d = pickle::parse("(lp0\nI1\naI-5\naF2.5\na(lp1\na.", "p0");
    ASSERT_TRUE(d.ok()) << d.error().message;
    const auto it = d->items(d->root());
    ASSERT_EQ(it.size(), 4u);
    EXPECT_EQ(d->as_int(it[0]), 1);
    EXPECT_EQ(d->as_int(it[1]), -5);
    EXPECT_DOUBLE_EQ(d->as_float(it[2]), 2.5);
    EXPECT_EQ(d->kind(it[3]), pickle::Kind::List);
    // I01 / I00 are booleans; L...L longs.
    auto b = pickle::parse("(I01\nI00\nL12345678901L\nt.", "p0b");
    ASSERT_TRUE(b.ok()) << b.error().message;
    const auto bt = b->items(b->root());
    EXPECT_EQ(b->kind(bt[0]), pickle::Kind::Bool);
    EXPECT_TRUE(b->as_bool(bt[0]));
    EXPECT_FALSE(b->as_bool(bt[1]));
    EXPECT_EQ(b->as_int(bt[2]), 12345678901);
}

TEST(Pickle, WideIntegers) {
    // 2**63 - 1 and -2**63 fit; 2**63 and 2**64 are kept as BigInt.
    auto max = pickle::parse(bytes("\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x2e"), "i");
    ASSERT_TRUE(max.ok());
    EXPECT_EQ(max->as_int(max->root()), INT64_MAX);
    auto min = pickle::parse(bytes("\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x2e"), "i");
    ASSERT_TRUE(min.ok());
    EXPECT_EQ(min->as_int(min->root()), INT64_MIN);
    // -1 written with 9 bytes still fits.
    auto m1 = pickle::parse(bytes("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff\x2e"), "i");
    ASSERT_TRUE(m1.ok());
    EXPECT_EQ(m1->kind(m1->root()), pickle::Kind::Int);
    EXPECT_EQ(m1->as_int(m1->root()), -1);
    auto big = pickle::parse(bytes("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x2e"), "i");
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(big->kind(big->root()), pickle::Kind::BigInt);
    auto huge = pickle::parse(bytes("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x2e"), "i");
    ASSERT_TRUE(huge.ok());
    EXPECT_EQ(huge->kind(huge->root()), pickle::Kind::BigInt);
}

TEST(Pickle, MemoSharesObjects) {
    // l = []; pickle.dumps([l, l], protocol=2): the second is a BINGET of the first.
    auto d = pickle::parse(bytes("\x80\x02\x5d\x71\x00\x28\x5d\x71\x01\x68\x01\x65\x2e"), "memo");
    ASSERT_TRUE(d.ok()) << d.error().message;
    const auto it = d->items(d->root());
    ASSERT_EQ(it.size(), 2u);
    EXPECT_EQ(it[0], it[1]);
    auto missing = pickle::parse(bytes("\x80\x02\x68\x07\x2e"), "memo.pickle");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find("memo key 7"), std::string::npos) << missing.error().message;
}

// ---------------------------------------------------------------------------
// Refused and malformed pickles.

TEST(Pickle, RefusesCodeOpcodes) {
    // pickle.dumps(object(), protocol=2): GLOBAL '__builtin__ object' at byte 2, then NEWOBJ.
    auto g = pickle::parse(bytes("\x80\x02\x63\x5f\x5f\x62\x75\x69\x6c\x74\x69\x6e\x5f\x5f\x0a\x6f\x62\x6a\x65\x63\x74\x0a\x71\x00\x29\x81\x71\x01\x2e"),
                           "snapshot.pickle");
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, ErrorCode::Unsupported);
    EXPECT_EQ(g.error().message,
              "snapshot.pickle: unsupported pickle opcode GLOBAL at byte 2: gpumem reads only plain data (dicts, lists, numbers, strings)");
    // pickle.dumps(object(), protocol=4): STACK_GLOBAL at byte 35.
    auto sg = pickle::parse(bytes("\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00\x8c\x08\x62\x75\x69\x6c\x74\x69\x6e\x73\x94\x8c\x06\x6f\x62\x6a\x65\x63\x74\x94\x93\x94\x29\x81\x94\x2e"),
                            "s.pickle");
    ASSERT_FALSE(sg.ok());
    EXPECT_NE(sg.error().message.find("unsupported pickle opcode STACK_GLOBAL at byte 31"), std::string::npos) << sg.error().message;
    // REDUCE on plain data: None() — refused before anything is called.
    auto r = pickle::parse(bytes("\x80\x02\x4e\x29\x52\x2e"), "r.pickle");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("unsupported pickle opcode REDUCE at byte 4"), std::string::npos) << r.error().message;
    for (const char* op : {"b", "\x81", "i", "o", "P", "Q", "\x82", "\x92", "\x97"}) {
        const std::string data = std::string("\x80\x04N") + op + ".";
        auto e = pickle::parse(data, "x");
        ASSERT_FALSE(e.ok()) << static_cast<int>(static_cast<unsigned char>(op[0]));
        EXPECT_EQ(e.error().code, ErrorCode::Unsupported);
    }
    auto unknown = pickle::parse(bytes("\x80\x04\xff."), "u");
    ASSERT_FALSE(unknown.ok());
    EXPECT_NE(unknown.error().message.find("unknown pickle opcode 0xff at byte 2"), std::string::npos) << unknown.error().message;
}

TEST(Pickle, EveryPrefixOfAFixtureIsAnError) {
    for (const char* name : {"train_step.pickle", "legacy_history.pickle", "oom.pickle"}) {
        const std::string data = slurp(kDir + name);
        ASSERT_GT(data.size(), 100u) << name;
        for (std::size_t n = 0; n < data.size(); ++n) {
            auto r = parse_snapshot_bytes(std::string_view(data).substr(0, n), "snap.pickle");
            ASSERT_FALSE(r.ok()) << name << " prefix " << n;
            if (n > 0) {
                EXPECT_NE(r.error().message.find("truncated at byte " + std::to_string(n)), std::string::npos)
                    << name << " prefix " << n << ": " << r.error().message;
            }
        }
        EXPECT_TRUE(parse_snapshot_bytes(data, name).ok()) << name;
    }
}

TEST(Pickle, DeepNestingIsAnError) {
    // 10,000 nested lists, as CPython would write [[[...]]] (EMPTY_LIST ... APPEND ...).
    std::string data = "\x80\x04";
    data += std::string(10000, ']');
    data += std::string(9999, 'a');
    data += ".";
    auto r = pickle::parse(data, "deep.pickle");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("nesting deeper than 256"), std::string::npos) << r.error().message;
    // The same with MARK ... LIST (protocol 0/1 style).
    std::string marks = std::string(10000, '(') + std::string(10000, 'l') + ".";
    auto m = pickle::parse(marks, "deep.pickle");
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("nesting deeper than 256"), std::string::npos) << m.error().message;
    // And JSON.
    const std::string js = std::string(10000, '[') + std::string(10000, ']');
    auto j = parse_snapshot_bytes(js, "deep.json");
    ASSERT_FALSE(j.ok());
    EXPECT_NE(j.error().message.find("deeper than 64"), std::string::npos) << j.error().message;  // kMaxJsonDepth
    // 200 levels is fine for the parser (and then not a snapshot).
    std::string ok = "\x80\x04" + std::string(200, ']') + std::string(199, 'a') + ".";
    EXPECT_TRUE(pickle::parse(ok, "ok").ok());
}

TEST(Pickle, HugeDeclaredLengthsAreErrors) {
    const std::vector<std::string> cases = {
        bytes("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f" "abc."),   // BINUNICODE8 2^63-1
        bytes("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff" "abc."),   // BINUNICODE8 2^64-1
        bytes("\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x80" "abc."),   // BINBYTES8
        bytes("\x80\x04\x58\xff\xff\xff\xff" "abc."),                   // BINUNICODE 4 GiB
        bytes("\x80\x04\x42\xff\xff\xff\xff" "abc."),                   // BINBYTES
        bytes("\x80\x04\x8b\xff\xff\xff\x7f" "abc."),                   // LONG4 2 GiB
        bytes("\x80\x04\x8b\xff\xff\xff\xff" "abc."),                   // LONG4 negative length
        bytes("\x80\x04\x54\xff\xff\xff\xff" "abc."),                   // BINSTRING negative length
        bytes("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff" "N."),     // FRAME 2^64-1
        bytes("\x80\x04\x8c\xff" "abc."),                               // SHORT_BINUNICODE 255
        bytes("\x80\x04\x6a\xff\xff\xff\xff."),                         // LONG_BINGET of nothing
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
        auto r = parse_snapshot_bytes(cases[i], "huge.pickle");
        ASSERT_FALSE(r.ok()) << i;
        EXPECT_EQ(r.error().message.rfind("huge.pickle: ", 0), 0u) << r.error().message;
    }
}

TEST(Pickle, StackAndMarkMisuseAreErrors) {
    for (const std::string& data : {std::string("\x80\x04."), std::string("\x80\x04" "a."), std::string("\x80\x04]e."),
                                    std::string("\x80\x04}(Nu."), std::string("\x80\x04N(s."), std::string("\x80\x04Na."),
                                    std::string("\x80\x04}]]s."), std::string("\x80\x04(\x85."), std::string("\x80\x06N."),
                                    std::string("\x80\x04\x94."), std::string("\x80\x04(d1.")}) {
        auto r = pickle::parse(data, "bad.pickle");
        EXPECT_FALSE(r.ok()) << "accepted: " << ::testing::PrintToString(data);
    }
}

// ---------------------------------------------------------------------------
// Fixture summaries.

void expect_train_step(const SnapshotSummary& s) {
    // Segments: A 2 MiB small, B 12 MiB large, C 20 MiB large (D was released).
    EXPECT_EQ(s.segments, 3);
    EXPECT_EQ(s.small_segments, 1);
    EXPECT_EQ(s.large_segments, 2);
    EXPECT_EQ(s.reserved.count(), 34 * kMiB);
    EXPECT_EQ(s.small_reserved.count(), 2 * kMiB);
    EXPECT_EQ(s.large_reserved.count(), 32 * kMiB);
    // Active: y 1024 + w 11010048 + g 6291456.
    EXPECT_EQ(s.active_blocks, 3);
    EXPECT_EQ(s.allocated.count(), 1024 + 11010048 + 6 * kMiB);
    EXPECT_EQ(s.allocated.count(), 17302528);
    EXPECT_EQ(s.requested.count(), 1000 + 11010048 + (6 * kMiB - 100));
    // Free: x 512, A's tail 2 MiB - 1536, B's 1.5 MiB tail, C's two 7 MiB blocks.
    EXPECT_EQ(s.inactive.count(), 512 + (2 * kMiB - 1536) + 1572864 + 7 * kMiB + 7 * kMiB);
    EXPECT_EQ(s.inactive_blocks, 5);
    EXPECT_EQ(s.active_pending_free.count(), 0);
    EXPECT_EQ(s.fragmentation.count(), 34 * kMiB - 17302528);
    EXPECT_EQ(s.fragmentation.count(), s.inactive.count());
    EXPECT_EQ(s.largest_free_block.count(), 7 * kMiB);
    ASSERT_EQ(s.segment_sizes.size(), 5u);
    EXPECT_EQ(s.segment_sizes[0].count, 1);  // <= 2 MiB
    EXPECT_EQ(s.segment_sizes[1].count, 2);  // 12 and 20 MiB
    EXPECT_EQ(s.segment_sizes[1].bytes.count(), 32 * kMiB);
    ASSERT_EQ(s.top_allocations.size(), 3u);
    EXPECT_EQ(s.top_allocations[0].size.count(), 11010048);
    EXPECT_EQ(s.top_allocations[0].frame, "model.py:12 __init__");  // first .py frame, not the C++ one
    EXPECT_EQ(s.top_allocations[1].size.count(), 6 * kMiB);
    EXPECT_EQ(s.top_allocations[1].requested.count(), 6 * kMiB - 100);
    EXPECT_EQ(s.top_allocations[1].frame, "train.py:43 train_step");
    EXPECT_EQ(s.top_allocations[2].size.count(), 1024);
    EXPECT_EQ(s.top_allocations[2].address, 0x7F3A00000000 + 512);
    // Trace of device 0: 7 allocs, 4 free pairs, 4 segment_alloc, 1 segment_free, 1 snapshot.
    ASSERT_EQ(s.traces.size(), 1u);
    EXPECT_EQ(s.traces[0].device, 0);
    EXPECT_EQ(s.traces[0].entries, 7 + 4 + 4 + 4 + 1 + 1);
    EXPECT_EQ(s.traces[0].alloc, 7);
    EXPECT_EQ(s.traces[0].free_requested, 4);
    EXPECT_EQ(s.traces[0].free_completed, 4);
    EXPECT_EQ(s.traces[0].segment_alloc, 4);
    EXPECT_EQ(s.traces[0].segment_free, 1);
    EXPECT_EQ(s.traces[0].snapshot, 1);
    EXPECT_TRUE(s.ooms.empty());
    EXPECT_EQ(s.layout, SnapshotLayout::DeviceTraces);
    EXPECT_EQ(s.allocator_settings.at("expandable_segments"), "False");
    EXPECT_EQ(s.allocator_settings.at("max_split_size"), "-1");
    EXPECT_EQ(s.allocator_settings.at("PYTORCH_CUDA_ALLOC_CONF"), "");
    EXPECT_EQ(s.allocator_settings.at("roundup_power2_divisions"), "{}");
}

TEST(Snapshot, TrainStepPickleSummary) {
    auto snap = read_snapshot(kDir + "train_step.pickle");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    EXPECT_EQ(snap->format, "pickle");
    EXPECT_EQ(snap->pickle_protocol, 4);
    ASSERT_EQ(snap->device_traces.size(), 2u);
    EXPECT_TRUE(snap->device_traces[1].empty());
    expect_train_step(summarize(snap.value()));
}

TEST(Snapshot, TrainStepJsonMatchesPickle) {
    auto snap = read_snapshot(kDir + "train_step.json");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    EXPECT_EQ(snap->format, "json");
    expect_train_step(summarize(snap.value()));
}

TEST(Snapshot, TrainStepTrace) {
    auto snap = read_snapshot(kDir + "train_step.pickle");
    ASSERT_TRUE(snap.ok());
    EXPECT_EQ(default_device(snap.value()), 0);
    const auto conv = to_trace_detailed(snap.value(), 0);
    EXPECT_EQ(conv.info.source, "device_traces");
    EXPECT_EQ(conv.info.free_action, "free_completed");
    EXPECT_EQ(conv.info.allocs, 7);
    EXPECT_EQ(conv.info.frees, 4);
    EXPECT_EQ(conv.info.events, 11);
    EXPECT_EQ(conv.info.seeded, 0);
    EXPECT_EQ(conv.info.implicit_frees, 0);
    EXPECT_EQ(conv.info.unmatched_frees, 0);
    EXPECT_EQ(conv.info.ignored, 4 + 4 + 1 + 1);  // free_requested, segment_alloc, segment_free, snapshot
    bool noted = false;
    for (const auto& n : conv.notes) noted = noted || n.rfind("1 segment_free/segment_unmap entries", 0) == 0;
    EXPECT_TRUE(noted);
    const Trace& t = conv.trace;
    ASSERT_EQ(t.events.size(), 11u);
    EXPECT_EQ(t.events[0].kind, TraceEvent::Kind::Alloc);
    EXPECT_EQ(t.events[0].size.count(), 4);
    EXPECT_EQ(t.events[1].size.count(), 11010048);
    EXPECT_EQ(t.events[4].size.count(), 6 * kMiB - 100);
    // free a2 (the 4th alloc), then a1 (the 3rd).
    EXPECT_EQ(t.events[5].kind, TraceEvent::Kind::Free);
    EXPECT_EQ(t.events[5].id, t.events[3].id);
    EXPECT_EQ(t.events[6].id, t.events[2].id);
    ASSERT_GE(t.events[1].label, 0);
    EXPECT_EQ(t.labels[static_cast<std::size_t>(t.events[1].label)], "model.py:12 __init__");
    EXPECT_EQ(to_trace(snap.value(), 0).events.size(), 11u);
    // Device 1 has an empty trace and no segments: no events.
    EXPECT_TRUE(to_trace(snap.value(), 1).events.empty());
}

TEST(Snapshot, TrainStepReplay) {
    auto snap = read_snapshot(kDir + "train_step.pickle");
    ASSERT_TRUE(snap.ok());
    const auto r = replay(to_trace(snap.value(), 0), ReplayOptions{});
    // Peak at t: x 512 + w 11010048 + g 6 MiB + y 1024 + t 30 MiB (a1, a2 freed).
    EXPECT_EQ(r.peak_allocated.count(), 512 + 11010048 + 6 * kMiB + 1024 + 30 * kMiB - 512);
    EXPECT_EQ(r.peak_allocated.count(), 48759808);
    // Segments: 2 (A) + 12 (B) + 20 (C) + 30 (D) MiB; empty_cache() is not replayed.
    EXPECT_EQ(r.peak_reserved.count(), 64 * kMiB);
    EXPECT_EQ(r.final_allocated.count(), 17302528);  // == the snapshot's allocated
    EXPECT_EQ(r.final_reserved.count(), 64 * kMiB);
    EXPECT_FALSE(r.oom.has_value());
}

TEST(Snapshot, LegacyHistoryLayout) {
    auto snap = read_snapshot(kDir + "legacy_history.pickle");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    EXPECT_EQ(snap->layout, SnapshotLayout::BlockHistory);
    EXPECT_FALSE(snap->has_device_traces);
    const auto s = summarize(snap.value());
    EXPECT_EQ(s.reserved.count(), 22 * kMiB);
    EXPECT_EQ(s.allocated.count(), 8000000 + 512);
    EXPECT_EQ(s.requested.count(), 8000000 + 100);  // history[0].real_size
    EXPECT_EQ(s.inactive.count(), (20 * kMiB - 8000000) + (2 * kMiB - 512));
    EXPECT_EQ(s.fragmentation.count(), 22 * kMiB - 8000512);
    EXPECT_EQ(s.largest_free_block.count(), 20 * kMiB - 8000000);
    EXPECT_EQ(s.small_segments, 1);
    EXPECT_EQ(s.large_segments, 1);
    // Block addresses are derived from the segment address.
    EXPECT_EQ(snap->segments[0].blocks[1].address, 0x7F5000000000 + 8000000);
    ASSERT_EQ(s.top_allocations.size(), 2u);
    EXPECT_EQ(s.top_allocations[0].frame, "model.py:30 forward");

    const auto conv = to_trace_detailed(snap.value(), 0);
    EXPECT_EQ(conv.info.source, "block_history");
    EXPECT_EQ(conv.info.allocs, 2);
    EXPECT_EQ(conv.info.frees, 0);
    ASSERT_EQ(conv.trace.events.size(), 2u);
    EXPECT_EQ(conv.trace.events[0].size.count(), 8000000);
    EXPECT_EQ(conv.trace.events[1].size.count(), 100);
    bool noted = false;
    for (const auto& n : conv.notes) noted = noted || n.find("1 earlier allocation") != std::string::npos;
    EXPECT_TRUE(noted);

    // 8000000 B (< 10 MiB) -> 20 MiB segment; 100 B -> 512 B in a 2 MiB segment.
    const auto r = replay(conv.trace, ReplayOptions{});
    EXPECT_EQ(r.peak_allocated.count(), 8000512);
    EXPECT_EQ(r.peak_reserved.count(), 22 * kMiB);
}

TEST(Snapshot, OomTrace) {
    auto snap = read_snapshot(kDir + "oom.pickle");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    const auto s = summarize(snap.value());
    EXPECT_EQ(s.reserved.count(), 20 * kMiB);
    EXPECT_EQ(s.allocated.count(), 16 * kMiB);
    EXPECT_EQ(s.largest_free_block.count(), 4 * kMiB);
    ASSERT_EQ(s.ooms.size(), 1u);
    EXPECT_EQ(s.ooms[0].entry, 3);
    EXPECT_EQ(s.ooms[0].requested.count(), 1024 * kMiB);
    EXPECT_EQ(s.ooms[0].device_free.count(), 50 * kMiB);
    EXPECT_EQ(s.ooms[0].frame, "train.py:46 train_step");
    const auto conv = to_trace_detailed(snap.value(), 0);
    EXPECT_EQ(conv.info.allocs, 2);
    EXPECT_EQ(conv.info.ooms, 1);
    EXPECT_EQ(conv.info.free_action, "");  // no frees of either kind
    ASSERT_FALSE(conv.notes.empty());
    EXPECT_NE(conv.notes[0].find("out of memory: tried to allocate 1.00 GiB"), std::string::npos) << conv.notes[0];
    // Two 8 MiB requests: a 20 MiB segment split 8 + 8 + 4.
    const auto r = replay(conv.trace, ReplayOptions{});
    EXPECT_EQ(r.peak_allocated.count(), 16 * kMiB);
    EXPECT_EQ(r.peak_reserved.count(), 20 * kMiB);
}

TEST(Snapshot, TruncatedTraceIsSeeded) {
    // The trace buffer lost the start: a free of an address never allocated in
    // the trace, and a block active at the dump that the trace never mentions.
    const std::string js = R"({"segments": [{"address": 0, "total_size": 20971520, "segment_type": "large", "blocks": [
        {"address": 0, "size": 1048576, "state": "active_allocated", "requested_size": 1000000},
        {"address": 1048576, "size": 19922944, "state": "inactive"}]}],
      "device_traces": [[
        {"action": "free_completed", "addr": 4096000, "size": 2097152, "stream": 0},
        {"action": "alloc", "addr": 8192000, "size": 512, "stream": 7},
        {"action": "alloc", "addr": 8192000, "size": 1024, "stream": 7},
        {"action": "free_completed", "addr": 9999999, "size": 5, "stream": 0},
        {"action": "free_completed", "addr": 9999999, "size": 5, "stream": 0}]]})";
    auto snap = parse_snapshot_bytes(js, "t.json");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    const auto conv = to_trace_detailed(snap.value(), 0);
    EXPECT_EQ(conv.info.seeded, 3);  // 4096000, 9999999 (first free), the dump's block at 0
    EXPECT_EQ(conv.info.seeded_bytes.count(), 2097152 + 5 + 1000000);
    EXPECT_EQ(conv.info.implicit_frees, 1);
    EXPECT_EQ(conv.info.unmatched_frees, 1);
    ASSERT_GE(conv.trace.events.size(), 5u);
    EXPECT_EQ(conv.trace.events[3].kind, TraceEvent::Kind::Free);  // the seeded 4096000
    EXPECT_EQ(conv.trace.events[4].stream, 1);  // stream 7 -> 1
}

TEST(Snapshot, AnalyzeAndRender) {
    auto rep = analyze_snapshot(kDir + "train_step.pickle", ReplayOptions{});
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    ASSERT_TRUE(rep->replay.has_value());
    const auto j = snapshot_to_json(rep->summary, &*rep->replay);
    EXPECT_TRUE(j["peak_allocated"].is_number_integer());
    EXPECT_EQ(j["peak_allocated"].get<std::int64_t>(), 48759808);
    EXPECT_EQ(j["peak_reserved"].get<std::int64_t>(), 64 * kMiB);
    EXPECT_EQ(j["peak_source"], "replay");
    EXPECT_EQ(j["snapshot"]["reserved"].get<std::int64_t>(), 34 * kMiB);
    EXPECT_EQ(j["trace_conversion"]["events"].get<std::int64_t>(), 11);
    const auto j0 = snapshot_to_json(rep->summary, nullptr);
    EXPECT_EQ(j0["peak_allocated"].get<std::int64_t>(), 17302528);
    EXPECT_EQ(j0["peak_reserved"].get<std::int64_t>(), 34 * kMiB);
    EXPECT_EQ(j0["peak_source"], "snapshot_state");
    for (Format f : {Format::Text, Format::Markdown, Format::Csv, Format::Json}) {
        const std::string out = render_snapshot(rep->summary, &*rep->replay, f);
        EXPECT_NE(out.find("17302528"), std::string::npos) << static_cast<int>(f);
        if (f != Format::Csv) {
            EXPECT_NE(out.find("model.py:12 __init__"), std::string::npos) << static_cast<int>(f);
        }
    }
    EXPECT_EQ(nlohmann::json::parse(render_snapshot(rep->summary, nullptr, Format::Json))["peak_reserved"], 34 * kMiB);
    // Asking for a device the file does not have is an error naming it.
    SnapshotOptions o;
    o.device = 5;
    auto bad = analyze_snapshot(kDir + "train_step.pickle", o);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().field, "device");
}

TEST(Snapshot, AllocatorConfigFromTheSnapshot) {
    const auto make = [](const std::string& conf) {
        return R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 3145728, "stream": 0}]],
                   "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ")" + conf + R"(", "expandable_segments": true}})";
    };
    const auto has_note = [](const SnapshotSummary& s, const std::string& what) {
        for (const auto& n : s.notes)
            if (n.find(what) != std::string::npos) return true;
        return false;
    };
    SnapshotOptions opt;
    auto a = analyze_snapshot_bytes(make("expandable_segments:True"), "a.json", opt);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_TRUE(has_note(a->summary, "replayed with the snapshot's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    EXPECT_NE(a->summary.replay_config.find("expandable_segments"), std::string::npos) << a->summary.replay_config;
    EXPECT_EQ(a->summary.allocator_settings.at("expandable_segments"), "True");
    opt.config_from_snapshot = false;  // what --alloc-conf does
    auto b = analyze_snapshot_bytes(make("expandable_segments:True"), "b.json", opt);
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(has_note(b->summary, "replayed with"));
    EXPECT_EQ(b->summary.replay_config.find("expandable_segments:True"), std::string::npos) << b->summary.replay_config;
    opt.config_from_snapshot = true;
    auto c = analyze_snapshot_bytes(make("bogus_option:7"), "c.json", opt);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(has_note(c->summary, "could not be used"));
    ASSERT_TRUE(c->replay.has_value());
    EXPECT_EQ(c->replay->peak_allocated.count(), 3 * kMiB);
}

// ---------------------------------------------------------------------------
// Wrong types and structure.

TEST(Snapshot, WrongFieldTypesNameTheField) {
    struct Case {
        std::string data;
        std::string field;
    };
    const std::vector<Case> cases = {
        // pickle.dumps({'segments': 5}, protocol=4)
        {bytes("\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x4b\x05\x73\x2e"), "segments"},
        // {'segments': [{'address': 'x', 'total_size': 1, 'blocks': []}]}
        {bytes("\x80\x04\x95\x3e\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x7d\x94\x28\x8c\x07\x61\x64\x64\x72\x65\x73\x73\x94\x8c\x01\x78\x94\x8c\x0a\x74\x6f\x74\x61\x6c\x5f\x73\x69\x7a\x65\x94\x4b\x01\x8c\x06\x62\x6c\x6f\x63\x6b\x73\x94\x5d\x94\x75\x61\x73\x2e"),
         "segments[0].address"},
        // {'segments': [{'address': 0, 'total_size': 2097152, 'blocks': [{'size': 'big', 'state': 'inactive'}]}]}
        {bytes("\x80\x04\x95\x64\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x7d\x94\x28\x8c\x07\x61\x64\x64\x72\x65\x73\x73\x94\x4b\x00\x8c\x0a\x74\x6f\x74\x61\x6c\x5f\x73\x69\x7a\x65\x94\x4a\x00\x00\x20\x00\x8c\x06\x62\x6c\x6f\x63\x6b\x73\x94\x5d\x94\x7d\x94\x28\x8c\x04\x73\x69\x7a\x65\x94\x8c\x03\x62\x69\x67\x94\x8c\x05\x73\x74\x61\x74\x65\x94\x8c\x08\x69\x6e\x61\x63\x74\x69\x76\x65\x94\x75\x61\x75\x61\x73\x2e"),
         "segments[0].blocks[0].size"},
        {R"({"segments": {"a": 1}})", "segments"},
        {R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": -5}]]})", "device_traces[0][0].size"},
        {R"({"segments": [], "device_traces": [[{"addr": 1, "size": 5}]]})", "device_traces[0][0].action"},
        {R"({"segments": [], "device_traces": 3})", "device_traces"},
        {R"({"segments": [{"address": 0, "total_size": 1.5, "blocks": []}]})", "segments[0].total_size"},
        {R"({"segments": [{"address": 0, "total_size": 1}]})", "segments[0].blocks"},
        {R"({"segments": [{"address": 0, "total_size": 1, "blocks": [{"size": 1}]}]})", "segments[0].blocks[0].state"},
        {R"({"segments": [{"address": 0, "total_size": 1, "is_expandable": 1, "blocks": []}]})", "segments[0].is_expandable"},
        {R"({"segments": [], "allocator_settings": []})", "allocator_settings"},
        {R"({"segments": [{"address": 0, "total_size": 18446744073709551615, "blocks": []}]})", "segments[0].total_size"},
        {R"({"segments": [{"address": 0, "total_size": 9223372036854775807, "blocks": []},
                          {"address": 0, "total_size": 9223372036854775807, "blocks": []}]})", "segments[1]"},
    };
    for (const auto& c : cases) {
        auto r = parse_snapshot_bytes(c.data, "bad.snap");
        ASSERT_FALSE(r.ok()) << c.field;
        EXPECT_EQ(r.error().field, c.field) << r.error().message;
        EXPECT_NE(r.error().message.find("bad.snap: field " + c.field), std::string::npos) << r.error().message;
    }
    // Not a snapshot at all.
    for (const std::string& data : {std::string(""), std::string("hello"), std::string("{\"other\": 1}"), std::string("[1, 2]"),
                                    std::string("{\"segments\": [}")}) {
        auto r = parse_snapshot_bytes(data, "x.snap");
        EXPECT_FALSE(r.ok()) << data;
    }
    auto missing = read_snapshot(kDir + "no_such_file.pickle");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code, ErrorCode::NotFound);
}

TEST(Snapshot, HostileStringsAreCleaned) {
    const std::string js = "{\"segments\": [{\"address\": 0, \"total_size\": 512, \"blocks\": [{\"size\": 512, "
                           "\"state\": \"active_allocated\", \"frames\": [{\"filename\": \"/a/\\u001b[31mevil.py\", "
                           "\"line\": 1, \"name\": \"f\\nx\"}]}]}]}";
    auto snap = parse_snapshot_bytes(js, "s.json");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    const auto s = summarize(snap.value());
    ASSERT_EQ(s.top_allocations.size(), 1u);
    EXPECT_EQ(s.top_allocations[0].frame, "?[31mevil.py:1 f?x");
    // Invalid UTF-8 from a pickle becomes U+FFFD, so JSON output never throws.
    std::string p = bytes("\x80\x04}(\x8c\x08segments](}(\x8c\x07" "address" "K\x00" "\x8c\x0atotal_size" "M\x00\x02"
                          "\x8c\x06" "blocks" "](}(\x8c\x04size" "M\x00\x02" "\x8c\x05state" "\x8c\x10" "active_allocated"
                          "\x8c\x06" "frames" "](}(\x8c\x08" "filename" "\x8c\x05\xff\xfe.py" "\x8c\x04line" "K\x01" "ueueueu.");
    auto ps = parse_snapshot_bytes(p, "u.pickle");
    ASSERT_TRUE(ps.ok()) << ps.error().message;
    const auto sum = summarize(ps.value());
    ASSERT_EQ(sum.top_allocations.size(), 1u);
    EXPECT_EQ(sum.top_allocations[0].frame, "\xef\xbf\xbd\xef\xbf\xbd.py:1");
    EXPECT_NO_THROW((void)snapshot_to_json(sum, nullptr).dump());
}

// Which frame labels an entry: the first whose file is a .py file (after
// cleaning: a name cut at 256 characters ends in "..."), else the first that
// names anything; the same frame written again is the same frame, and two
// texts that clean to the same frame are one frame. Read whole and streamed.
TEST(Snapshot, TopFrameRulesHoldForRepeatedFrames) {
    const std::string longpy = std::string(300, 'd') + ".py";
    const std::vector<std::pair<std::string, std::string>> cases = {
        // frames, expected label ("" = none)
        {R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}, {"filename": "m.py", "line": 4, "name": "g"}])", "m.py:4 g"},
        {R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}])", "alloc.cpp:9 malloc"},
        {R"([{"filename": ")" + longpy + R"(", "line": 1, "name": "x"}, {"filename": "r.py", "line": 2, "name": "y"}])", "r.py:2 y"},
        {R"([{"filename": "", "name": ""}, {"name": "only"}, {"filename": "s.py", "line": 3}])", "s.py:3"},
        {R"([{"filename": "alloc.cpp", "line": 9, "name": "malloc"}, {"filename": "m.py", "line": 4, "name": "g"}])", "m.py:4 g"},
        {R"([{"filename": "a\u0001.py", "line": 5, "name": "c"}])", "a?.py:5 c"},
        {R"([{"filename": "a\u0002.py", "line": 5, "name": "c"}])", "a?.py:5 c"},
        {R"([{"filename": "m.py", "line": 4, "name": "g"}])", "m.py:4 g"},
        {R"([])", ""},
        {R"([1, {"line": 7}])", ""},
    };
    std::string js = R"({"segments": [], "device_traces": [[)";
    for (std::size_t i = 0; i < cases.size(); ++i)
        js += (i ? ", " : "") + std::string(R"({"action": "alloc", "addr": )") + std::to_string(4096 * (i + 1)) +
              R"(, "size": 512, "frames": )" + cases[i].first + "}";
    js += "]]}";
    auto snap = parse_snapshot_bytes(js, "frames.json");
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    const Snapshot& s = snap.value();
    ASSERT_EQ(s.device_traces.size(), 1u);
    ASSERT_EQ(s.device_traces[0].size(), cases.size());
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto f = s.device_traces[0][i].frame;
        EXPECT_EQ(f < 0 ? std::string() : frame_label(s.frames[static_cast<std::size_t>(f)]), cases[i].second) << cases[i].first;
    }
    // One frame each for "m.py:4 g" (three entries) and "a?.py:5 c" (two texts).
    EXPECT_EQ(s.device_traces[0][0].frame, s.device_traces[0][4].frame);
    EXPECT_EQ(s.device_traces[0][0].frame, s.device_traces[0][7].frame);
    EXPECT_EQ(s.device_traces[0][5].frame, s.device_traces[0][6].frame);
    EXPECT_EQ(s.frames.size(), 5u);  // m.py, alloc.cpp, r.py, s.py, a?.py
    // Streamed: the same frames.
    struct Keep final : TraceEntrySink {
        std::vector<std::int32_t> frames;
        void entry(int, std::int64_t, const SnapshotTraceEntry& e) override { frames.push_back(e.frame); }
        void restart() override { frames.clear(); }
    } keep;
    auto streamed = parse_snapshot_streaming(js, "frames.json", keep);
    ASSERT_TRUE(streamed.ok()) << streamed.error().message;
    ASSERT_EQ(keep.frames.size(), cases.size());
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto f = keep.frames[i];
        EXPECT_EQ(f < 0 ? std::string() : frame_label(streamed.value().frames[static_cast<std::size_t>(f)]), cases[i].second)
            << cases[i].first;
    }
}

TEST(Snapshot, SharedReferenceBombIsBounded) {
    // One list of 2000 references to one segment whose blocks list holds 2000
    // references to one block: 4 million block visits from ~8 KB of input.
    std::string p = bytes("\x80\x04}(\x8c\x08segments](");
    p += bytes("}\x94(\x8c\x07" "address" "K\x00\x8c\x0a" "total_size" "K\x00\x8c\x06" "blocks" "](");
    p += bytes("}\x94(\x8c\x04size" "K\x00\x8c\x05state\x8c\x08inactive" "u");
    for (int i = 0; i < 1999; ++i) p += bytes("h\x01");  // BINGET 1: the block
    p += "eu";
    for (int i = 0; i < 1999; ++i) p += bytes("h\x00");  // BINGET 0: the segment
    p += "eu.";
    ASSERT_LT(p.size(), 9000u);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = parse_snapshot_bytes(p, "bomb.pickle");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("too many shared references"), std::string::npos) << r.error().message;
    EXPECT_LT(secs, 1.0);
}

// ---------------------------------------------------------------------------
// Random mutations of a valid file: every one must give a value or an error.

TEST(Snapshot, MutationFuzz) {
    const std::string base = slurp(kDir + "train_step.pickle");
    ASSERT_FALSE(base.empty());
    std::mt19937_64 rng(20240607);
    const auto t0 = std::chrono::steady_clock::now();
    int ok = 0, errors = 0;
    static const char kInteresting[] = {'\x00', '\x01', '\x7f', '\x80', '\xff', '(', ')', '.', ']', '}', 'a', 'e', 's', 'u',
                                        'h', 'q', '\x94', '\x95', '\x8a', '\x8b', '\x8c', '\x8d', 'X', 'J', 'K', 'M'};
    for (int iter = 0; iter < 20000; ++iter) {
        std::string d = base;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits && !d.empty(); ++e) {
            const std::size_t pos = rng() % d.size();
            switch (rng() % 6) {
                case 0: d[pos] = static_cast<char>(rng() & 0xff); break;
                case 1: d[pos] = kInteresting[rng() % sizeof kInteresting]; break;
                case 2: d.erase(pos, 1 + rng() % 8); break;
                case 3: d.insert(pos, 1, kInteresting[rng() % sizeof kInteresting]); break;
                case 4: {  // duplicate a chunk
                    const std::size_t len = std::min<std::size_t>(1 + rng() % 64, d.size() - pos);
                    d.insert(rng() % d.size(), d.substr(pos, len));
                    break;
                }
                case 5: d.resize(pos); break;
            }
        }
        auto r = parse_snapshot_bytes(d, "fuzz.pickle");
        if (r.ok()) {
            ++ok;
            const auto s = summarize(r.value());
            const int dev = default_device(r.value());
            const auto conv = to_trace_detailed(r.value(), dev);
            EXPECT_GE(s.reserved.count(), 0);
            EXPECT_EQ(conv.info.events, static_cast<std::int64_t>(conv.trace.events.size()));
            (void)snapshot_to_json(s, nullptr).dump();
        } else {
            ++errors;
            EXPECT_FALSE(r.error().message.empty());
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 2.0);
    EXPECT_GT(errors, 0);
    EXPECT_GT(ok, 0);
    RecordProperty("mutations_ok", ok);
    RecordProperty("mutations_error", errors);
}

}  // namespace

// Stream ids from kGraphPoolStream (2^20) up stand for CUDA graph private
// pools in the allocator model; a trace with 2^20 distinct streams would have
// had its last ones read as graph pools. It is refused, naming the snapshot.
TEST(Snapshot, TooManyStreamsAreRefusedNotReadAsGraphPools) {
    gpumem::sim::Snapshot s;
    s.origin = "streams.json";
    s.layout = gpumem::sim::SnapshotLayout::DeviceTraces;
    s.has_device_traces = true;
    s.device_traces.resize(1);
    auto& t = s.device_traces[0];
    t.reserve(std::size_t{1} << 20);
    for (std::int64_t i = 1; i <= (std::int64_t{1} << 20); ++i) {
        gpumem::sim::SnapshotTraceEntry e;
        e.action = gpumem::sim::TraceAction::Alloc;
        e.addr = i * 512;
        e.size = gpumem::Bytes(512);
        e.stream = i;
        t.push_back(e);
    }
    try {
        (void)gpumem::sim::to_trace(s, 0);
        ADD_FAILURE() << "a trace with 2^20 distinct streams was accepted";
    } catch (const gpumem::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("1048575 distinct CUDA streams"), std::string::npos) << e.what();
    }
}
