// PyTorch memory snapshots, part 1: reading the file (pickle or JSON) into a
// Snapshot, checking every field on the way, and the names of its enums.
// Field names and meanings follow torch/csrc/cuda/Module.cpp
// (THCPModule_memorySnapshot), torch/csrc/cuda/memory_snapshot.cpp
// (_memory_snapshot_pickled), torch/cuda/memory.py (_snapshot docstring) and
// torch/cuda/_memory_viz.py (_block_extra_legacy for the old `history` blocks).
#include "gpumem/sim/snapshot.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "gpumem/core/budget.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/sim/pickle.hpp"
#include "snapshot_internal.hpp"

namespace gpumem::sim {

// ---------------------------------------------------------------------------
// Names.

const char* block_state_name(BlockState s) {
    switch (s) {
        case BlockState::ActiveAllocated: return "active_allocated";
        case BlockState::ActivePendingFree: return "active_pending_free";
        case BlockState::Inactive: return "inactive";
        case BlockState::Unknown: return "unknown";
    }
    return "unknown";
}

const char* trace_action_name(TraceAction a) {
    switch (a) {
        case TraceAction::Alloc: return "alloc";
        case TraceAction::FreeRequested: return "free_requested";
        case TraceAction::FreeCompleted: return "free_completed";
        case TraceAction::SegmentAlloc: return "segment_alloc";
        case TraceAction::SegmentFree: return "segment_free";
        case TraceAction::SegmentMap: return "segment_map";
        case TraceAction::SegmentUnmap: return "segment_unmap";
        case TraceAction::Snapshot: return "snapshot";
        case TraceAction::Oom: return "oom";
        case TraceAction::Other: return "other";
    }
    return "other";
}

const char* snapshot_layout_name(SnapshotLayout l) {
    switch (l) {
        case SnapshotLayout::DeviceTraces: return "device_traces";
        case SnapshotLayout::BlockHistory: return "block_history";
        case SnapshotLayout::SegmentsOnly: return "segments_only";
    }
    return "segments_only";
}

std::string frame_label(const SnapshotFrame& f) {
    std::string_view file = f.filename;
    const auto slash = file.find_last_of("/\\");
    if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
    std::string out(file);
    if (!out.empty()) out += ":" + std::to_string(f.line);
    if (!f.name.empty()) out += (out.empty() ? "" : " ") + f.name;
    return out;
}

namespace {

// ---------------------------------------------------------------------------
// Text hygiene: strings from the file end up in terminals and JSON; keep
// them valid UTF-8 without control characters, and bounded.

std::string clean_text(std::string_view s, std::size_t max_len = 512) {
    std::string out;
    out.reserve(std::min(s.size(), max_len));
    std::size_t i = 0;
    while (i < s.size()) {
        if (out.size() >= max_len) {
            out += "...";
            break;
        }
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
            ++i;
            continue;
        }
        std::size_t len = 0;
        std::uint32_t cp = 0;
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1fu;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0fu;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07u;
        bool ok = len != 0 && i + len <= s.size();
        for (std::size_t k = 1; ok && k < len; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            ok = (cc & 0xc0) == 0x80;
            cp = (cp << 6) | (cc & 0x3fu);
        }
        if (ok) {
            const std::uint32_t min_cp = len == 2 ? 0x80 : (len == 3 ? 0x800 : 0x10000);
            ok = cp >= min_cp && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
        }
        if (ok) {
            out.append(s.substr(i, len));
            i += len;
        } else {
            out += "\xef\xbf\xbd";  // U+FFFD
            ++i;
        }
    }
    return out;
}

std::string double_text(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

// ---------------------------------------------------------------------------
// One view over both inputs: a pickle node or a JSON value.

enum class VKind { Null, Bool, Int, BigInt, Float, String, Bytes, List, Dict };
const char* vkind_name(VKind k) {
    switch (k) {
        case VKind::Null: return "None/null";
        case VKind::Bool: return "a bool";
        case VKind::Int: return "an integer";
        case VKind::BigInt: return "an integer wider than 64 bits";
        case VKind::Float: return "a float";
        case VKind::String: return "a string";
        case VKind::Bytes: return "bytes";
        case VKind::List: return "a list";
        case VKind::Dict: return "a dict";
    }
    return "?";
}

struct PRef {
    const pickle::Document* d;
    pickle::Document::Id id;
};
VKind vkind(PRef r) {
    using pickle::Kind;
    switch (r.d->kind(r.id)) {
        case Kind::None: return VKind::Null;
        case Kind::Bool: return VKind::Bool;
        case Kind::Int: return VKind::Int;
        case Kind::BigInt: return VKind::BigInt;
        case Kind::Float: return VKind::Float;
        case Kind::String: return VKind::String;
        case Kind::Bytes: return VKind::Bytes;
        case Kind::List:
        case Kind::Tuple:
        case Kind::Set: return VKind::List;
        case Kind::Dict: return VKind::Dict;
    }
    return VKind::Null;
}
bool vbool(PRef r) { return r.d->as_bool(r.id); }
std::int64_t vint(PRef r) { return r.d->as_int(r.id); }
double vfloat(PRef r) { return r.d->as_float(r.id); }
std::string_view vstr(PRef r) { return r.d->as_string(r.id); }
std::size_t vsize(PRef r) { return r.d->size(r.id); }
PRef vat(PRef r, std::size_t i) { return {r.d, r.d->items(r.id)[i]}; }
std::optional<PRef> vget(PRef r, std::string_view key) {
    const auto id = r.d->find(r.id, key);
    if (!id) return std::nullopt;
    return PRef{r.d, *id};
}
std::string key_text(PRef k) {
    switch (vkind(k)) {
        case VKind::String: return clean_text(vstr(k), 128);
        case VKind::Int: return std::to_string(vint(k));
        case VKind::Bool: return vbool(k) ? "True" : "False";
        case VKind::Null: return "None";
        case VKind::Float: return double_text(vfloat(k));
        default: return std::string("<") + vkind_name(vkind(k)) + ">";
    }
}
// Calls f(key text, value) for the first `limit` entries of a dict.
template <class F>
void vfor_each(PRef r, std::size_t limit, F&& f) {
    const auto it = r.d->items(r.id);
    for (std::size_t i = 0; i + 1 < it.size() && i / 2 < limit; i += 2) f(key_text(PRef{r.d, it[i]}), PRef{r.d, it[i + 1]});
}
std::uint64_t videntity(PRef r) { return r.id; }
std::optional<std::int64_t> vsummary(PRef r) { return r.d->summary(r.id); }
// Calls f(key, value) for every entry of a dict whose key is a string, in order.
template <class F>
void vfor_each_str(PRef r, F&& f) {
    const auto it = r.d->items(r.id);
    for (std::size_t i = 0; i + 1 < it.size(); i += 2)
        if (r.d->kind(it[i]) == pickle::Kind::String) f(r.d->as_string(it[i]), PRef{r.d, it[i + 1]});
}

using json = nlohmann::json;
struct JRef {
    const json* j;
};
VKind vkind(JRef r) {
    switch (r.j->type()) {
        case json::value_t::null: return VKind::Null;
        case json::value_t::boolean: return VKind::Bool;
        case json::value_t::number_integer: return VKind::Int;
        case json::value_t::number_unsigned:
            return r.j->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX) ? VKind::BigInt : VKind::Int;
        case json::value_t::number_float: return VKind::Float;
        case json::value_t::string: return VKind::String;
        case json::value_t::binary: return VKind::Bytes;
        case json::value_t::array: return VKind::List;
        case json::value_t::object: return VKind::Dict;
        default: return VKind::Null;
    }
}
bool vbool(JRef r) { return r.j->get<bool>(); }
std::int64_t vint(JRef r) {
    if (r.j->is_number_unsigned()) return static_cast<std::int64_t>(r.j->get<std::uint64_t>());
    return r.j->get<std::int64_t>();
}
double vfloat(JRef r) { return r.j->get<double>(); }
std::string_view vstr(JRef r) { return r.j->get_ref<const std::string&>(); }
std::size_t vsize(JRef r) { return r.j->size(); }
JRef vat(JRef r, std::size_t i) { return {&(*r.j)[i]}; }
std::optional<JRef> vget(JRef r, std::string_view key) {
    const auto it = r.j->find(key);
    if (it == r.j->end()) return std::nullopt;
    return JRef{&*it};
}
std::uint64_t videntity(JRef r) { return reinterpret_cast<std::uintptr_t>(r.j); }
std::optional<std::int64_t> vsummary(JRef) { return std::nullopt; }
template <class F>
void vfor_each_str(JRef r, F&& f) {
    for (auto it = r.j->begin(); it != r.j->end(); ++it) f(std::string_view(it.key()), JRef{&it.value()});
}
template <class F>
void vfor_each(JRef r, std::size_t limit, F&& f) {
    std::size_t n = 0;
    for (auto it = r.j->begin(); it != r.j->end() && n < limit; ++it, ++n) f(clean_text(it.key(), 128), JRef{&it.value()});
}

// One JSON trace entry as FastJson reads it alone (see FastJson::fvalue):
// flat nodes, the items of each container contiguous (a dict's keys and
// values interleaved, in the order written, so a repeated key's last value
// is the one vget finds, as nlohmann's object keeps it), strings as views
// of the text (the fast lexer takes only strings without escapes, whose
// text is their value). Reused from entry to entry.
//
// The "frames" list of an entry read directly (FastJson::direct_entry) is
// also read through a memo of its text (FramesMemo): real traces repeat a few thousand call stacks millions of
// times, and JSON repeats each as the same bytes. A list whose exact text was
// read before becomes a node that carries what the Reader made of it (the
// index of its top frame, vsummary) instead of its items; a new one is read
// as usual and carries its text, under which the Reader then files it.
// Identical bytes read in the same place are the same value, and what the
// Reader makes of a frames list depends on nothing else (raw_frame and
// intern are lookups of the frame's own text).
struct FramesMemo {
    static constexpr std::size_t kMaxTexts = std::size_t(1) << 16;
    static constexpr std::size_t kMaxTextBytes = std::size_t(16) << 10;  // longer lists are not filed
    static constexpr std::size_t kMaxTotalBytes = std::size_t(16) << 20;  // (real traces: a few thousand stacks of 1-3 KB)
    struct Hash {
        using is_transparent = void;
        // 32 bytes at a time in four independent multiply lanes (the texts
        // are ~100-200 bytes and all begin alike; std::hash's serial byte
        // mixing was a sixth of reading an entry).
        std::size_t operator()(std::string_view s) const noexcept {
            constexpr std::uint64_t k = 0xff51afd7ed558ccdull;
            std::uint64_t l[4] = {s.size(), 0x9e3779b97f4a7c15ull, 0xc4ceb9fe1a85ec53ull, 0x2545f4914f6cdd1dull};
            std::size_t i = 0;
            for (; i + 32 <= s.size(); i += 32)
                for (int j = 0; j < 4; ++j) {
                    std::uint64_t w;
                    std::memcpy(&w, s.data() + i + 8 * j, 8);
                    l[j] = (l[j] ^ w) * k;
                    l[j] ^= l[j] >> 29;
                }
            for (int j = 0; i < s.size(); i += 8, ++j) {
                std::uint64_t w = 0;
                std::memcpy(&w, s.data() + i, std::min<std::size_t>(8, s.size() - i));
                l[j] = (l[j] ^ w) * k;
                l[j] ^= l[j] >> 29;
            }
            std::uint64_t h = ((l[0] * k) ^ l[1]) * k;
            h = ((h ^ l[2]) * k ^ l[3]) * k;
            return static_cast<std::size_t>(h ^ (h >> 32));
        }
    };
    std::unordered_map<std::string, std::int32_t, Hash, std::equal_to<>> top;
    std::size_t bytes = 0;
    const std::int32_t* find(std::string_view text) const {
        const auto it = top.find(text);
        return it == top.end() ? nullptr : &it->second;
    }
    void put(std::string_view text, std::int32_t idx) {
        if (text.size() > kMaxTextBytes || top.size() >= kMaxTexts || bytes + text.size() > kMaxTotalBytes) return;
        if (top.emplace(std::string(text), idx).second) bytes += text.size();
    }
};
struct FDoc {
    struct Node {
        VKind kind = VKind::Null;
        bool summary = false;                // a frames list the memo knew: `i` is its summary
        std::uint32_t first = 0, count = 0;  // containers: items[first, first + count)
        std::int64_t i = 0;                  // Int, BigInt (as vint gives it)
        double f = 0;                        // Float
        std::string_view s;                  // String; an entry's frames list read in full: its text
    };
    std::vector<Node> nodes;
    std::vector<std::uint32_t> items;
    std::vector<std::uint32_t> stack;  // items of the containers being read
    FramesMemo* memo = nullptr;
    void clear() {
        nodes.clear();
        items.clear();
        stack.clear();
    }
};
struct FRef {
    const FDoc* d;
    std::uint32_t id;
};
const FDoc::Node& fnode(FRef r) { return r.d->nodes[r.id]; }
VKind vkind(FRef r) { return fnode(r).kind; }
std::int64_t vint(FRef r) { return fnode(r).i; }
double vfloat(FRef r) { return fnode(r).f; }
std::string_view vstr(FRef r) { return fnode(r).s; }
std::size_t vsize(FRef r) {
    const auto& n = fnode(r);
    return n.kind == VKind::Dict ? n.count / 2 : n.count;
}
FRef vat(FRef r, std::size_t i) { return {r.d, r.d->items[fnode(r).first + i]}; }
std::optional<FRef> vget(FRef r, std::string_view key) {
    const auto& n = fnode(r);
    for (std::uint32_t k = n.count; k >= 2; k -= 2) {
        const std::uint32_t kid = r.d->items[n.first + k - 2];
        if (r.d->nodes[kid].s == key) return FRef{r.d, r.d->items[n.first + k - 1]};
    }
    return std::nullopt;
}
std::uint64_t videntity(FRef r) { return r.id; }
// A frames list the memo knew: the index of its top frame.
std::optional<std::int64_t> vsummary(FRef r) {
    const auto& n = fnode(r);
    if (n.summary) return n.i;
    return std::nullopt;
}
// Files what the Reader made of a frames list read in full under its text.
void vremember(FRef r, std::int32_t top) {
    const auto& n = fnode(r);
    if (r.d->memo && n.kind == VKind::List && !n.summary && !n.s.empty()) r.d->memo->put(n.s, top);
}
template <class V>
void vremember(V, std::int32_t) {}
template <class F>
void vfor_each_str(FRef r, F&& f) {
    const auto& n = fnode(r);
    for (std::uint32_t k = 0; k + 1 < n.count; k += 2)
        f(r.d->nodes[r.d->items[n.first + k]].s, FRef{r.d, r.d->items[n.first + k + 1]});
}

// A JSON trace entry of the common shape, read by FastJson::direct_entry
// straight into its fields: "action" a string, "addr", "size" and
// "device_free" integers from 0 to 2^63-1, "stream" and "time_us" integers,
// "frames" a list (a node of FastJson's entry document), each at most once
// and no other key (the has_ flags find a repeated one). Reader::entries
// makes of it what read_entry makes of the same entry read as a document.
struct DirectEntry {
    TraceAction action = TraceAction::Other;
    std::int64_t addr = 0, size = 0, stream = 0, time_us = 0, device_free = 0;
    bool has_action = false, has_addr = false, has_size = false, has_stream = false, has_time = false, has_free = false,
         has_frames = false;
    FRef frames{nullptr, 0};
};

// An entry's "action" text as its enum (Other: one gpumem does not know).
TraceAction parse_trace_action(std::string_view a) {
    // The common actions first, told apart by length and one letter.
    if (a.size() == 5 && a == "alloc") return TraceAction::Alloc;
    if (a.size() == 14 && a[5] == 'r' && a == "free_requested") return TraceAction::FreeRequested;
    if (a.size() == 14 && a[5] == 'c' && a == "free_completed") return TraceAction::FreeCompleted;
    if (a == "segment_alloc") return TraceAction::SegmentAlloc;
    if (a == "segment_free") return TraceAction::SegmentFree;
    if (a == "segment_map") return TraceAction::SegmentMap;
    if (a == "segment_unmap") return TraceAction::SegmentUnmap;
    if (a == "snapshot") return TraceAction::Snapshot;
    if (a == "oom") return TraceAction::Oom;
    return TraceAction::Other;
}

// ---------------------------------------------------------------------------
// Field paths, formatted only on error: "segments[3].blocks[2].size".

struct Path {
    const Path* parent = nullptr;
    std::string_view key;
    std::int64_t index = -1;
};
std::string path_text(const Path* p) {
    std::vector<const Path*> chain;
    for (; p; p = p->parent) chain.push_back(p);
    std::string out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const Path* q = *it;
        if (q->index >= 0) out += "[" + std::to_string(q->index) + "]";
        else if (!q->key.empty()) out += (out.empty() ? "" : ".") + std::string(q->key);
    }
    return out.empty() ? "top level" : out;
}

template <class R>
class Reader {
public:
    Reader(Snapshot& out, std::size_t budget) : out_(out), budget_(budget) {}

    // Streaming: entries go to `sink`; a pickle's visit budget follows the
    // values created so far (`doc`).
    void stream_to(TraceEntrySink* sink, const pickle::Document* doc) {
        sink_ = sink;
        budget_doc_ = doc;
    }
    // A batch of trace entries of device `d` (streaming): document values,
    // JSON entries the fast lexer read alone (FRef), or JSON entries it read
    // straight into their fields (DirectEntry, all present ones valid).
    template <class V>
    void entries(std::size_t d, std::span<const V> items) {
        const Path dp{nullptr, "device_traces"};
        if (d >= 65536) value_error(dp, "more than 65536 devices");
        if (out_.streamed_entries.size() <= d) out_.streamed_entries.resize(d + 1);
        const Path p{&dp, {}, static_cast<std::int64_t>(d)};
        // A JSON entry is built at the same address each time: its frames
        // are never the same list as anything else's (JSON shares nothing).
        cache_frames_ = std::is_same_v<V, PRef>;
        for (const V& e : items) {
            const auto i = out_.streamed_entries[d];
            const Path ep{&p, {}, i};
            if constexpr (std::is_same_v<V, DirectEntry>) {
                emit(d, i, entry_fields(e.action, e.addr, e.size, e.stream, e.time_us, e.device_free,
                                        e.has_frames ? &e.frames : nullptr, ep));
            } else {
                if constexpr (std::is_same_v<V, PRef>) {
                    // An entry the pickle parser read directly (pickle.hpp).
                    if (const auto* dd = e.d->direct(e.id)) {
                        using DD = pickle::Document::DirectDict;
                        const PRef frames{e.d, dd->frames};
                        emit(d, i,
                             entry_fields(action_of(e.d, dd->action), dd->addr, dd->size, dd->stream, dd->time_us, dd->device_free,
                                          (dd->has & DD::kHasFrames) ? &frames : nullptr, ep));
                        continue;
                    }
                }
                emit(d, i, read_entry(require_dict(e, ep), ep));
            }
        }
        cache_frames_ = true;
    }
    // read_entry's result for an entry whose present fields are all valid
    // (absent ones 0, no frames: nullptr), its sizes counted in its order.
    template <class F>
    SnapshotTraceEntry entry_fields(TraceAction action, std::int64_t addr, std::int64_t size, std::int64_t stream,
                                    std::int64_t time_us, std::int64_t device_free, const F* frames, const Path& ep) {
        SnapshotTraceEntry te;
        te.action = action;
        te.addr = addr;
        te.size = Bytes(account(size, ep));
        te.stream = stream;
        te.time_us = time_us;
        te.device_free = Bytes(account(device_free, ep));
        if (frames) te.frame = top_frame(*frames, Path{&ep, "frames"});
        return te;
    }
    std::optional<std::int64_t> frames_summary(std::uint64_t ident) const {
        const auto it = frame_cache_.find(ident);
        if (it == frame_cache_.end()) return std::nullopt;
        return it->second;
    }
    // Nodes from `from` on were freed: identities cached for them are stale.
    void forget_from(std::uint64_t from) {
        for (auto it = frame_cache_.begin(); it != frame_cache_.end();) {
            if (it->first >= from) it = frame_cache_.erase(it);
            else ++it;
        }
        for (auto& a : action_cache_)
            if (a.first >= from) a = {kNoNode, TraceAction::Other};
    }

    void read_root(R root) {
        const Path top{};
        if (vkind(root) == VKind::List) {
            // torch.cuda.memory_snapshot(): the list of segments alone.
            read_segments(root, top);
            out_.notes.push_back("the file holds a bare list of segments (torch.cuda.memory_snapshot()); no event trace");
            finish_layout();
            return;
        }
        if (vkind(root) != VKind::Dict) type_error(top, "a dict with \"segments\"", root);
        charge(vsize(root));
        const auto segs = vget(root, "segments");
        if (!segs)
            fail(ErrorCode::ParseError, "segments",
                 out_.origin + ": no \"segments\" key: not a torch.cuda.memory._snapshot() dump");
        const Path sp{nullptr, "segments"};
        read_segments(*segs, sp);
        if (const auto dt = vget(root, "device_traces"); dt && vkind(*dt) != VKind::Null) {
            const Path dp{nullptr, "device_traces"};
            read_device_traces(*dt, dp);
        }
        if (const auto as = vget(root, "allocator_settings"); as && vkind(*as) != VKind::Null) {
            const Path ap{nullptr, "allocator_settings"};
            if (vkind(*as) != VKind::Dict) type_error(ap, "a dict", *as);
            charge(vsize(*as));
            vfor_each(*as, 256, [&](std::string key, R v) { out_.allocator_settings[std::move(key)] = to_text(v, 0); });
        }
        finish_layout();
    }

private:
    // --- helpers -------------------------------------------------------------
    void charge(std::size_t n) {
        visits_ += n + 1;
        if (visits_ > budget_ && (!budget_doc_ || visits_ > 8 * budget_doc_->created_count() + (1u << 20)))
            fail(ErrorCode::ParseError, out_.origin,
                 out_.origin + ": too many shared references (the pickle reuses objects far more than a snapshot does)");
    }
    template <class V>
    [[noreturn]] void type_error(const Path& p, const char* expected, V got) {
        const std::string where = path_text(&p);
        fail(ErrorCode::ParseError, where,
             out_.origin + ": field " + where + ": expected " + expected + ", got " + vkind_name(vkind(got)));
    }
    [[noreturn]] void value_error(const Path& p, const std::string& what) {
        const std::string where = path_text(&p);
        fail(ErrorCode::ParseError, where, out_.origin + ": field " + where + ": " + what);
    }
    template <class V>
    std::int64_t as_int(V v, const Path& p) {
        if (vkind(v) != VKind::Int) type_error(p, "an integer", v);
        return vint(v);
    }
    template <class V>
    std::int64_t as_size(V v, const Path& p) {
        const std::int64_t x = as_int(v, p);
        if (x < 0) value_error(p, "must not be negative (got " + std::to_string(x) + ")");
        return x;
    }
    // Every size in the file is added here once, so that no sum a consumer
    // forms (reserved, allocated, seeded bytes, ...) can overflow.
    std::int64_t account(std::int64_t v, const Path& p) {
        if (__builtin_add_overflow(total_, v, &total_))
            value_error(p, "the sizes in the file add up to more than 2^63 bytes");
        return v;
    }
    std::optional<std::int64_t> opt_int(R d, std::string_view key, const Path& parent, bool nonneg) {
        const auto v = vget(d, key);
        if (!v || vkind(*v) == VKind::Null) return std::nullopt;
        const Path p{&parent, key};
        return nonneg ? as_size(*v, p) : as_int(*v, p);
    }
    std::int64_t req_int(R d, std::string_view key, const Path& parent, bool nonneg) {
        const auto v = opt_int(d, key, parent, nonneg);
        if (!v) {
            const Path p{&parent, key};
            value_error(p, "missing (an integer is required)");
        }
        return *v;
    }
    std::optional<std::string> opt_str(R d, std::string_view key, const Path& parent) {
        const auto v = vget(d, key);
        if (!v || vkind(*v) == VKind::Null) return std::nullopt;
        if (vkind(*v) != VKind::String) {
            const Path p{&parent, key};
            type_error(p, "a string", *v);
        }
        return clean_text(vstr(*v), 128);
    }
    R require_list(R v, const Path& p) {
        if (vkind(v) != VKind::List) type_error(p, "a list", v);
        charge(vsize(v));
        return v;
    }
    template <class V>
    V require_dict(V v, const Path& p) {
        if (vkind(v) != VKind::Dict) type_error(p, "a dict", v);
        charge(vsize(v));
        return v;
    }
    // Bounded textual form of any value (allocator settings).
    std::string to_text(R v, int depth) {
        switch (vkind(v)) {
            case VKind::Null: return "None";
            case VKind::Bool: return vbool(v) ? "True" : "False";
            case VKind::Int: return std::to_string(vint(v));
            case VKind::BigInt: return "<wide integer>";
            case VKind::Float: return double_text(vfloat(v));
            case VKind::String: return clean_text(vstr(v), 256);
            case VKind::Bytes: return "<bytes>";
            case VKind::List:
            case VKind::Dict: {
                if (depth >= 3) return "...";
                const bool dict = vkind(v) == VKind::Dict;
                const std::size_t n = vsize(v);
                charge(std::min<std::size_t>(n, 64));
                std::string o = dict ? "{" : "[";
                if (dict) {
                    bool first = true;
                    vfor_each(v, 64, [&](const std::string& k, R x) {
                        o += (first ? "" : ", ") + k + ": " + to_text(x, depth + 1);
                        first = false;
                    });
                } else {
                    for (std::size_t i = 0; i < n && i < 64; ++i) o += (i ? ", " : "") + to_text(vat(v, i), depth + 1);
                }
                if (n > 64) o += ", ...";
                return o + (dict ? "}" : "]");
            }
        }
        return "";
    }

    // --- frames ---------------------------------------------------------------
    template <class V>
    std::int32_t top_frame(V frames, const Path& p) {
        if (const auto s = vsummary(frames)) {
            charge(0);
            return static_cast<std::int32_t>(*s);
        }
        if (vkind(frames) == VKind::Null) return -1;
        if (vkind(frames) != VKind::List) type_error(p, "a list of frames", frames);
        const auto ident = videntity(frames);
        if (const auto it = cache_frames_ ? frame_cache_.find(ident) : frame_cache_.end(); it != frame_cache_.end()) {
            charge(0);
            return it->second;
        }
        const std::size_t n = std::min<std::size_t>(vsize(frames), 256);
        charge(n);
        // Records stay put while the map grows (nodes); it is emptied only
        // here, before any is pointed to.
        if (raw_frames_.size() >= kMaxRawFrames) raw_frames_.clear();
        RawFrame *first = nullptr, *first_py = nullptr;
        for (std::size_t i = 0; i < n && !first_py; ++i) {
            const V f = vat(frames, i);
            if (vkind(f) != VKind::Dict) continue;  // frames are cosmetic: skip odd ones
            charge(vsize(f));
            const auto fn = vget(f, "filename");
            const auto ln = vget(f, "line");
            const auto nm = vget(f, "name");
            const std::string_view fns = fn && vkind(*fn) == VKind::String ? vstr(*fn) : std::string_view();
            const std::string_view nms = nm && vkind(*nm) == VKind::String ? vstr(*nm) : std::string_view();
            const std::int64_t line = ln && vkind(*ln) == VKind::Int ? vint(*ln) : 0;
            RawFrame& rec = raw_frame(fns, line, nms);
            if (rec.empty) continue;
            if (!first) first = &rec;
            if (rec.py) first_py = &rec;
        }
        std::int32_t idx = -1;
        if (RawFrame* chosen = first_py ? first_py : first) {
            if (chosen->idx == kNotInterned) chosen->idx = intern(chosen->frame);
            idx = chosen->idx;
        }
        if (cache_frames_) frame_cache_.emplace(ident, idx);
        vremember(frames, idx);
        return idx;
    }
    // The action a pickled string node names: a trace repeats a handful of
    // memoized action strings, each compared once while its node lives.
    TraceAction action_of(const pickle::Document* doc, pickle::Document::Id id) {
        for (const auto& a : action_cache_)
            if (a.first == id) return a.second;
        const TraceAction act = parse_trace_action(doc->as_string(id));
        action_cache_[action_next_++ % action_cache_.size()] = {id, act};
        return act;
    }
    static constexpr std::uint64_t kNoNode = std::numeric_limits<std::uint64_t>::max();
    std::array<std::pair<std::uint64_t, TraceAction>, 4> action_cache_{
        {{kNoNode, TraceAction::Other}, {kNoNode, TraceAction::Other}, {kNoNode, TraceAction::Other}, {kNoNode, TraceAction::Other}}};
    std::size_t action_next_ = 0;
    // A frame as written (file name, line, function name) and what reading
    // it gives: the cleaned text, whether it names nothing, whether it is a
    // Python file's, and its index once interned. Real traces repeat a few
    // thousand frames millions of times; JSON repeats them as text.
    struct RawFrame {
        SnapshotFrame frame;
        bool empty = false, py = false;
        std::int32_t idx = -2;
    };
    static constexpr std::int32_t kNotInterned = -2;
    static constexpr std::size_t kMaxRawFrames = std::size_t(1) << 16;
    RawFrame& raw_frame(std::string_view fn, std::int64_t line, std::string_view nm) {
        // The key: the file name's length, the name, the line, the function
        // name (unambiguous whatever the texts hold).
        char num[24];
        raw_key_.clear();
        raw_key_.append(num, std::to_chars(num, num + sizeof num, fn.size()).ptr);
        raw_key_ += ':';
        raw_key_ += fn;
        raw_key_.append(num, std::to_chars(num, num + sizeof num, line).ptr);
        raw_key_ += '\n';
        raw_key_ += nm;
        if (const auto it = raw_frames_.find(raw_key_); it != raw_frames_.end()) return it->second;
        RawFrame rec;
        rec.frame.filename = clean_text(fn, 256);
        rec.frame.line = line;
        rec.frame.name = clean_text(nm, 256);
        rec.empty = rec.frame.filename.empty() && rec.frame.name.empty();
        const std::string_view fv = rec.frame.filename;
        rec.py = fv.size() >= 3 && fv.substr(fv.size() - 3) == ".py";
        return raw_frames_.emplace(raw_key_, std::move(rec)).first->second;
    }
    std::int32_t intern(const SnapshotFrame& f) {
        std::string key = f.filename + '\n' + std::to_string(f.line) + '\n' + f.name;
        const auto it = frame_index_.find(key);
        if (it != frame_index_.end()) return it->second;
        // Frames only label allocations: past kMaxFrames distinct ones (a real
        // program has a few thousand call sites) the rest go unlabelled.
        if (out_.frames.size() >= kMaxFrames) {
            if (!frames_capped_)
                out_.notes.push_back("more than " + std::to_string(kMaxFrames) +
                                     " distinct stack frames; allocations at further ones are unlabelled");
            frames_capped_ = true;
            return -1;
        }
        const auto idx = static_cast<std::int32_t>(out_.frames.size());
        out_.frames.push_back(f);
        frame_index_.emplace(std::move(key), idx);
        return idx;
    }

    // --- segments ---------------------------------------------------------------
    void read_segments(R segs, const Path& sp) {
        require_list(segs, sp);
        const std::size_t n = vsize(segs);
        out_.segments.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            const Path p{&sp, {}, static_cast<std::int64_t>(i)};
            const R s = require_dict(vat(segs, i), p);
            SnapshotSegment seg;
            const std::int64_t dev = opt_int(s, "device", p, true).value_or(0);
            if (dev > 65535) value_error(Path{&p, "device"}, "device index " + std::to_string(dev) + " is out of range");
            seg.device = static_cast<int>(dev);
            seg.address = req_int(s, "address", p, true);
            seg.total_size = Bytes(account(req_int(s, "total_size", p, true), p));
            seg.allocated_size = Bytes(opt_int(s, "allocated_size", p, true).value_or(0));
            seg.active_size = Bytes(opt_int(s, "active_size", p, true).value_or(0));
            seg.requested_size = Bytes(opt_int(s, "requested_size", p, true).value_or(0));
            seg.stream = opt_int(s, "stream", p, false).value_or(0);
            seg.segment_type = opt_str(s, "segment_type", p).value_or("");
            if (seg.segment_type.empty()) seg.segment_type = seg.total_size <= MiB(2) ? "small" : "large";
            if (const auto e = vget(s, "is_expandable"); e && vkind(*e) != VKind::Null) {
                if (vkind(*e) != VKind::Bool) type_error(Path{&p, "is_expandable"}, "a bool", *e);
                seg.is_expandable = vbool(*e);
            }
            const auto blocks = vget(s, "blocks");
            const Path bp{&p, "blocks"};
            if (!blocks) value_error(bp, "missing (a list of blocks is required)");
            read_blocks(*blocks, bp, seg);
            out_.segments.push_back(std::move(seg));
        }
    }

    void read_blocks(R blocks, const Path& bp, SnapshotSegment& seg) {
        require_list(blocks, bp);
        const std::size_t n = vsize(blocks);
        seg.blocks.reserve(n);
        std::int64_t next = seg.address;
        for (std::size_t i = 0; i < n; ++i) {
            const Path p{&bp, {}, static_cast<std::int64_t>(i)};
            const R b = require_dict(vat(blocks, i), p);
            SnapshotBlock blk;
            blk.size = Bytes(account(req_int(b, "size", p, true), p));
            blk.address = opt_int(b, "address", p, true).value_or(next);
            next = checked_add(blk.address, blk.size.count());
            const auto state = opt_str(b, "state", p);
            if (!state) value_error(Path{&p, "state"}, "missing (a string is required)");
            if (*state == "active_allocated") blk.state = BlockState::ActiveAllocated;
            else if (*state == "active_pending_free" || *state == "active_awaiting_free") blk.state = BlockState::ActivePendingFree;
            else if (*state == "inactive") blk.state = BlockState::Inactive;
            else {
                blk.state = BlockState::Unknown;
                if (!warned_state_) {
                    out_.notes.push_back("unknown block state \"" + *state + "\" (counted as neither allocated nor free)");
                    warned_state_ = true;
                }
            }
            if (const auto f = vget(b, "frames")) blk.frame = top_frame(*f, Path{&p, "frames"});
            if (const auto h = vget(b, "history"); h && vkind(*h) != VKind::Null) {
                has_history_ = true;
                const Path hp{&p, "history"};
                require_list(*h, hp);
                const std::size_t hn = vsize(*h);
                blk.history.reserve(hn);
                for (std::size_t k = 0; k < hn; ++k) {
                    const Path ep{&hp, {}, static_cast<std::int64_t>(k)};
                    const R e = require_dict(vat(*h, k), ep);
                    SnapshotHistoryEntry he;
                    he.addr = opt_int(e, "addr", ep, true).value_or(blk.address);
                    he.real_size = Bytes(account(opt_int(e, "real_size", ep, true).value_or(blk.size.count()), ep));
                    if (const auto f = vget(e, "frames")) he.frame = top_frame(*f, Path{&ep, "frames"});
                    blk.history.push_back(he);
                }
                if (blk.frame < 0 && !blk.history.empty()) blk.frame = blk.history.front().frame;
            }
            if (const auto rq = opt_int(b, "requested_size", p, true)) blk.requested_size = Bytes(account(*rq, p));
            else if (!blk.history.empty()) blk.requested_size = blk.history.front().real_size;
            else blk.requested_size = blk.size;
            seg.blocks.push_back(std::move(blk));
        }
    }

    // --- device traces -------------------------------------------------------------
    void read_device_traces(R dt, const Path& dp) {
        require_list(dt, dp);
        out_.has_device_traces = true;
        const std::size_t nd = vsize(dt);
        if (nd > 65536) value_error(dp, "more than 65536 devices");
        out_.device_traces.resize(nd);
        if (sink_) out_.streamed_entries.resize(std::max(out_.streamed_entries.size(), nd));
        for (std::size_t d = 0; d < nd; ++d) {
            const Path p{&dp, {}, static_cast<std::int64_t>(d)};
            const R list = vat(dt, d);
            if (vkind(list) == VKind::Null) continue;
            require_list(list, p);
            const std::size_t n = vsize(list);
            // Entries streamed during the parse come first (they were appended first).
            const std::int64_t first = sink_ ? out_.streamed_entries[d] : 0;
            if (!sink_) out_.device_traces[d].reserve(n);
            for (std::size_t i = 0; i < n; ++i) {
                const Path ep{&p, {}, first + static_cast<std::int64_t>(i)};
                const R e = require_dict(vat(list, i), ep);
                emit(d, first + static_cast<std::int64_t>(i), read_entry(e, ep));
            }
        }
    }
    void emit(std::size_t d, std::int64_t i, const SnapshotTraceEntry& te) {
        if (!sink_) {
            out_.device_traces[d].push_back(te);
            return;
        }
        ++out_.streamed_entries[d];
        sink_->entry(static_cast<int>(d), i, te);
    }
    // One trace entry. The dict is walked once (the last of repeated keys
    // wins, as a lookup from the end finds it); the fields are then checked
    // in a fixed order, so the first bad one is the one named.
    template <class V>
    SnapshotTraceEntry read_entry(V e, const Path& ep) {
        std::optional<V> f_action, f_addr, f_size, f_stream, f_time, f_free, f_frames;
        // (Told apart by length and first letter, then compared once: the
        // chain of comparisons was a sixth of reading a pickled trace.)
        vfor_each_str(e, [&](std::string_view k, V v) {
            if (k.empty()) return;
            std::optional<V>* slot = nullptr;
            std::string_view name;
            switch (k.size()) {
                case 4:
                    if (k[0] == 'a') slot = &f_addr, name = "addr";
                    else if (k[0] == 's') slot = &f_size, name = "size";
                    break;
                case 6:
                    if (k[0] == 'a') slot = &f_action, name = "action";
                    else if (k[0] == 's') slot = &f_stream, name = "stream";
                    else if (k[0] == 'f') slot = &f_frames, name = "frames";
                    break;
                case 7: slot = &f_time, name = "time_us"; break;
                case 11: slot = &f_free, name = "device_free"; break;
                default: break;
            }
            if (slot && k == name) *slot = v;
        });
        auto field_int = [&](const std::optional<V>& v, std::string_view key, bool nonneg) -> std::optional<std::int64_t> {
            if (!v || vkind(*v) == VKind::Null) return std::nullopt;
            const Path p{&ep, key};
            return nonneg ? as_size(*v, p) : as_int(*v, p);
        };
        SnapshotTraceEntry te;
        if (!f_action || vkind(*f_action) == VKind::Null) value_error(Path{&ep, "action"}, "missing (a string is required)");
        if (vkind(*f_action) != VKind::String) type_error(Path{&ep, "action"}, "a string", *f_action);
        te.action = parse_trace_action(vstr(*f_action));  // (cleaning the text cannot make it match)
        te.addr = field_int(f_addr, "addr", true).value_or(0);
        te.size = Bytes(account(field_int(f_size, "size", true).value_or(0), ep));
        te.stream = field_int(f_stream, "stream", false).value_or(0);
        if (f_time && vkind(*f_time) == VKind::Float) {
            const double x = vfloat(*f_time);
            te.time_us = (x > -9e18 && x < 9e18) ? static_cast<std::int64_t>(x) : 0;
        } else {
            te.time_us = field_int(f_time, "time_us", false).value_or(0);
        }
        te.device_free = Bytes(account(field_int(f_free, "device_free", true).value_or(0), ep));
        if (f_frames) te.frame = top_frame(*f_frames, Path{&ep, "frames"});
        return te;
    }

    void finish_layout() {
        bool any_entries = false;
        for (const auto& d : out_.device_traces) any_entries = any_entries || !d.empty();
        for (const auto n : out_.streamed_entries) any_entries = any_entries || n > 0;
        if (any_entries) out_.layout = SnapshotLayout::DeviceTraces;
        else if (has_history_) out_.layout = SnapshotLayout::BlockHistory;
        else out_.layout = SnapshotLayout::SegmentsOnly;
    }

    Snapshot& out_;
    std::size_t budget_;
    TraceEntrySink* sink_ = nullptr;
    bool cache_frames_ = true;
    const pickle::Document* budget_doc_ = nullptr;
    std::size_t visits_ = 0;
    std::int64_t total_ = 0;
    bool has_history_ = false;
    bool warned_state_ = false;
    bool frames_capped_ = false;
    static constexpr std::size_t kMaxFrames = 65536;
    std::unordered_map<std::uint64_t, std::int32_t> frame_cache_;
    std::unordered_map<std::string, std::int32_t> frame_index_;
    std::unordered_map<std::string, RawFrame> raw_frames_;
    std::string raw_key_;
};


// Called with the byte the parser has reached (streaming: pages before it can go).
using Progress = std::function<void(std::size_t)>;
// Drops the pages of bytes [from, to) of the text from the process (a
// mapped file's: they stay in the page cache); any thread.
using DropPages = std::function<void(std::size_t from, std::size_t to)>;

// Reads JSON text with nlohmann's SAX parser, building the document except
// for the trace entries (root["device_traces"][d][i]): each is built alone
// and handed to the Reader when it ends. Nesting deeper than kMaxJsonDepth
// stops the parse where it happens (the message check_json_depth gives).
// The memory the built values take is counted as they are made (an estimate
// of nlohmann's nodes: a json value, a string's heap copy, an object's tree
// node and key): the document outside the entries may hold at most
// kMaxJsonTreeBytes, one entry kMaxJsonEntryBytes, so no input makes the
// reader hold more, whatever its shape. With `skip` > 0 the values of the
// first `skip` top-level "device_traces" keys are read and dropped (a file
// that repeats the key: the last one counts, as in json.load).
class JsonStream {
public:
    static constexpr std::size_t kMaxJsonTreeBytes = std::size_t(384) << 20;
    static constexpr std::size_t kMaxJsonEntryBytes = std::size_t(16) << 20;

    using string_t = json::string_t;
    using number_integer_t = json::number_integer_t;
    using number_unsigned_t = json::number_unsigned_t;
    using number_float_t = json::number_float_t;
    using binary_t = json::binary_t;

    JsonStream(Reader<JRef>& r, std::string_view text, const std::string& origin, int skip = 0)
        : r_(r), text_(text), origin_(origin), skip_(skip) {}

    json& root() { return root_; }
    int device_traces_keys() const { return dt_keys_; }
    // Whether the next value is a trace entry (an element of
    // root["device_traces"][d] that is read, not skipped), and handing one
    // over that FastJson read alone.
    [[nodiscard]] bool at_entry() const { return !levels_.empty() && levels_.back().role == DeviceList; }
    void entry(FRef e) { r_.entries(device_, std::span<const FRef>(&e, 1)); }
    void entry(const DirectEntry& e) { r_.entries(device_, std::span<const DirectEntry>(&e, 1)); }

    bool null() { return value(json(nullptr)); }
    bool boolean(bool v) { return value(json(v)); }
    bool number_integer(number_integer_t v) { return value(json(v)); }
    bool number_unsigned(number_unsigned_t v) { return value(json(v)); }
    bool number_float(number_float_t v, const string_t&) { return value(json(v)); }
    bool string(string_t& v) {
        charge(v.size() > 15 ? v.size() + 1 : 0);
        return value(json(std::move(v)));
    }
    bool binary(binary_t& v) { return value(json::binary(std::move(v))); }
    bool start_object(std::size_t) { return open(json::value_t::object); }
    bool start_array(std::size_t) { return open(json::value_t::array); }
    bool key(string_t& k) {
        if (levels_.size() == 1 && k == "device_traces") ++dt_keys_;
        levels_.back().key = std::move(k);
        return true;
    }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
        fail(ErrorCode::ParseError, origin_, origin_ + ": not valid JSON: " + e.what());
    }

private:
    enum Role : std::uint8_t { Plain, DeviceTraces, DeviceList, Entry, Skip };
    static constexpr std::size_t kContainerBytes = 48;  // an object's map or an array's vector
    struct Level {
        json* v;
        Role role;
        std::string key;  // objects: the key of the value being read
    };

    // Counts `n` bytes against the document's or the current entry's limit.
    void charge(std::size_t n) {
        std::size_t& held = entry_level_ ? entry_bytes_ : tree_bytes_;
        held += n;
        const std::size_t limit = entry_level_ ? kMaxJsonEntryBytes : kMaxJsonTreeBytes;
        if (held <= limit) return;
        fail(ErrorCode::ParseError, origin_,
             origin_ + ": reading it needs more than " + std::to_string(limit >> 20) + " MiB of memory " +
                 (entry_level_ ? std::string("for one device_traces entry") : std::string("outside the device_traces entries")) +
                 " (gpumem's limit; a memory snapshot's segments, settings and entries need far less)");
    }
    // The first `skip_` top-level device_traces values are dropped.
    bool skipping_key() const {
        return levels_.size() == 1 && levels_[0].v->is_object() && levels_[0].key == "device_traces" && dt_keys_ <= skip_;
    }
    // Where a new value goes: the root, an array's end or an object's key.
    json* slot() {
        if (levels_.empty()) return &root_;
        Level& l = levels_.back();
        if (l.v->is_array()) {
            charge(2 * sizeof(json));  // the element, and the vector's spare room
            l.v->push_back(json());
            return &l.v->back();
        }
        charge(sizeof(json) + 64 + l.key.size());  // a map node: links, key, value
        return &(*l.v)[l.key];
    }
    bool value(json&& v) {
        if (!levels_.empty() && levels_.back().role == Skip) return true;
        if (skipping_key()) return true;
        if (!levels_.empty() && levels_.back().role == DeviceList) {
            entry_ = std::move(v);
            deliver();
            return true;
        }
        *slot() = std::move(v);
        return true;
    }
    bool open(json::value_t t) {
        if (static_cast<int>(levels_.size()) >= kMaxJsonDepth) {
            check_json_depth(text_, origin_);  // throws the message naming the byte
            fail(ErrorCode::ParseError, origin_,
                 origin_ + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        }
        Role role = Plain;
        json* v = nullptr;
        if ((!levels_.empty() && levels_.back().role == Skip) || skipping_key()) {
            levels_.push_back(Level{nullptr, Skip, {}});
            return true;
        }
        if (!levels_.empty() && levels_.back().role == DeviceList) {
            role = Entry;
            entry_level_ = levels_.size() + 1;
            entry_bytes_ = 0;
            entry_ = json(t);
            v = &entry_;
            charge(kContainerBytes);
        } else {
            if (levels_.size() == 1 && levels_[0].v->is_object() && levels_[0].key == "device_traces" &&
                t == json::value_t::array) {
                role = DeviceTraces;
            } else if (!levels_.empty() && levels_.back().role == DeviceTraces && t == json::value_t::array) {
                role = DeviceList;
                device_ = levels_.back().v->size();
            }
            v = slot();
            *v = json(t);
            charge(kContainerBytes);
        }
        levels_.push_back(Level{v, role, {}});
        return true;
    }
    bool close() {
        const Role role = levels_.back().role;
        levels_.pop_back();
        if (role == Entry) deliver();
        return true;
    }
    void deliver() {
        const JRef e{&entry_};
        r_.entries(device_, std::span<const JRef>(&e, 1));
        entry_ = json();
        entry_level_ = 0;
        entry_bytes_ = 0;
    }

    Reader<JRef>& r_;
    std::string_view text_;
    const std::string& origin_;
    json root_;
    json entry_;
    std::vector<Level> levels_;
    std::size_t device_ = 0;
    int dt_keys_ = 0;
    int skip_ = 0;
    std::size_t entry_level_ = 0;  // levels_.size() inside the entry being built (0: none)
    std::size_t tree_bytes_ = 0, entry_bytes_ = 0;
};

// An input iterator over mapped text that calls `progress` every 64 MiB.
class ProgressIter {
public:
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;
    ProgressIter() = default;
    ProgressIter(const char* p, const char* base, const Progress* progress)
        : p_(p), base_(base), next_(progress && *progress ? p + kStep : nullptr), progress_(progress) {}
    reference operator*() const { return *p_; }
    ProgressIter& operator++() {
        if (++p_ == next_) {
            (*progress_)(static_cast<std::size_t>(p_ - base_));
            next_ += kStep;
        }
        return *this;
    }
    ProgressIter operator++(int) {
        ProgressIter t = *this;
        ++*this;
        return t;
    }
    bool operator==(const ProgressIter& o) const { return p_ == o.p_; }
    bool operator!=(const ProgressIter& o) const { return p_ != o.p_; }

private:
    static constexpr std::ptrdiff_t kStep = 64 << 20;
    const char* p_ = nullptr;
    const char* base_ = nullptr;
    const char* next_ = nullptr;
    const Progress* progress_ = nullptr;
};

// The common case of snapshot JSON, read fast: the same SAX calls as
// nlohmann's parser makes on it (numbers converted as it converts them:
// integers without fraction or exponent as int64 when negative, else uint64,
// falling back to double when they overflow; others with from_chars, which
// rounds correctly as strtod does). It gives up (returns false) on anything
// else — escapes or non-ASCII in strings, any syntax it does not expect —
// and the caller reads the text again with nlohmann's parser, which then
// accepts it or names the error as it always did.
class FastJson {
public:
    // `drop` (may be null): pages of the text the read-ahead has passed may
    // be dropped from the process (a mapped file).
    FastJson(std::string_view text, JsonStream& sax, const Progress& progress, const DropPages* drop = nullptr);
    ~FastJson();
    FastJson(const FastJson&) = delete;
    FastJson& operator=(const FastJson&) = delete;
    bool run() {
        ws();
        if (!value()) return false;
        ws();
        return p_ == end_;
    }

private:
    static constexpr std::ptrdiff_t kStep = 32 << 20;
    // (Every byte of JSON's structure and values is above 0x20: one compare
    // ends the common case, no whitespace or a single space.)
    static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
    void ws() {
        while (p_ < end_ && static_cast<unsigned char>(*p_) <= 0x20 && is_ws(*p_)) ++p_;
    }
    bool lit(std::string_view w) {
        if (static_cast<std::size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w) return false;
        p_ += w.size();
        return true;
    }
    // A string without escapes or non-ASCII (its text is its value), after
    // the opening quote is seen.
    bool scan_str(std::string_view& out) {
        ++p_;  // the opening quote
        const char* b = p_;
#if defined(__SSE2__)
        // 16 bytes at a time to the first quote, backslash, control or
        // non-ASCII byte (a signed compare with 0x20 finds both of the last).
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (end_ - p_ >= 16) {
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p_));
            const __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                             _mm_cmplt_epi8(v, space));
            if (const int m = _mm_movemask_epi8(hit)) {
                p_ += __builtin_ctz(static_cast<unsigned>(m));
                break;
            }
            p_ += 16;
        }
#endif
        while (p_ < end_) {
            const auto c = static_cast<unsigned char>(*p_);
            if (c == '"') {
                out = std::string_view(b, static_cast<std::size_t>(p_ - b));
                ++p_;
                return true;
            }
            if (c == '\\' || c < 0x20 || c >= 0x80) return false;
            ++p_;
        }
        return false;
    }
    bool str(std::string& out) {
        std::string_view v;
        if (!scan_str(v)) return false;
        out.assign(v);
        return true;
    }
    // A number as nlohmann's parser types it: Int (int64), Unsigned
    // (uint64) or Float.
    struct Number {
        enum Type : std::uint8_t { Int, Unsigned, Float } type = Int;
        std::int64_t i = 0;
        std::uint64_t u = 0;
        double f = 0;
    };
    bool number() {
        Number n;
        if (!scan_number(n)) return false;
        switch (n.type) {
            case Number::Int: return sax_->number_integer(n.i);
            case Number::Unsigned: return sax_->number_unsigned(n.u);
            case Number::Float: break;
        }
        static const std::string none;
        return sax_->number_float(n.f, none);
    }
    bool scan_number(Number& n) {
        // The common case, an integer of at most 18 digits (addresses, sizes,
        // times): its value as the digits are read, as from_chars gives it.
        {
            const char* q = p_;
            const bool neg = *q == '-';
            q += neg;
            if (q < end_ && *q >= '1' && *q <= '9') {
                std::uint64_t u = 0;
                const char* d = q;
                // Eight digits at a time where they are (SWAR, little-endian:
                // the check and the three-multiply conversion of fast_float's
                // parse_eight_digits_unrolled, written out here).
                if constexpr (std::endian::native == std::endian::little) {
                    while (end_ - q >= 8 && q - d <= 10) {
                        std::uint64_t w;
                        std::memcpy(&w, q, 8);
                        if ((((w & 0xf0f0f0f0f0f0f0f0ull) | (((w + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) >> 4)) !=
                             0x3333333333333333ull))
                            break;
                        w -= 0x3030303030303030ull;
                        w = w * 10 + (w >> 8);
                        w = (((w & 0x000000ff000000ffull) * (100 + (1000000ull << 32))) +
                             (((w >> 16) & 0x000000ff000000ffull) * (1 + (10000ull << 32)))) >> 32;
                        u = u * 100000000ull + w;
                        q += 8;
                    }
                }
                // The last 1-7 digits in one step where eight bytes are there:
                // the digits before the first non-digit moved to the top of
                // the word (the bytes below become zeros, digit 0), then the
                // same conversion. (A borrow of the subtraction runs only
                // into bytes after the first non-digit, which shift out.)
                if constexpr (std::endian::native == std::endian::little) {
                    if (end_ - q >= 8 && q - d <= 10) {
                        std::uint64_t w;
                        std::memcpy(&w, q, 8);
                        const std::uint64_t nd = ((w & 0xf0f0f0f0f0f0f0f0ull) | (((w + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) >> 4)) ^
                                                 0x3333333333333333ull;
                        if (nd != 0) {
                            const int k = __builtin_ctzll(nd) >> 3;  // digits before the first non-digit
                            if (k > 0) {
                                w = (w - 0x3030303030303030ull) << (8 * (8 - k));
                                w = w * 10 + (w >> 8);
                                w = (((w & 0x000000ff000000ffull) * (100 + (1000000ull << 32))) +
                                     (((w >> 16) & 0x000000ff000000ffull) * (1 + (10000ull << 32)))) >> 32;
                                static constexpr std::uint64_t kPow10[8] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000};
                                u = u * kPow10[k] + w;
                                q += k;
                            }
                        }
                    }
                }
                while (q < end_ && q - d < 19 && static_cast<unsigned>(*q - '0') < 10u) u = u * 10 + static_cast<unsigned>(*q++ - '0');
                if (q - d <= 18 && (q == end_ || (*q != '.' && *q != 'e' && *q != 'E' && static_cast<unsigned>(*q - '0') >= 10u))) {
                    p_ = q;
                    if (neg) n.type = Number::Int, n.i = -static_cast<std::int64_t>(u);
                    else n.type = Number::Unsigned, n.u = u;
                    return true;
                }
            }
        }
        // A lone 0 (a stream, a default): what from_chars gives below, 0 as
        // uint64, or as int64 after a minus sign.
        if (const char* q = p_ + (*p_ == '-'); q < end_ && *q == '0' &&
            (q + 1 == end_ || (q[1] != '.' && q[1] != 'e' && q[1] != 'E' && static_cast<unsigned>(q[1] - '0') >= 10u))) {
            n.type = q == p_ ? Number::Unsigned : Number::Int;
            n.i = 0;
            n.u = 0;
            p_ = q + 1;
            return true;
        }
        const char* b = p_;
        bool neg = false, integer = true;
        if (*p_ == '-') neg = true, ++p_;
        if (p_ == end_) return false;
        if (*p_ == '0') {
            ++p_;
            if (p_ < end_ && *p_ >= '0' && *p_ <= '9') return false;
        } else if (*p_ >= '1' && *p_ <= '9') {
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        } else {
            return false;
        }
        if (p_ < end_ && *p_ == '.') {
            integer = false;
            ++p_;
            const char* d = p_;
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
            if (p_ == d) return false;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            integer = false;
            ++p_;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
            const char* d = p_;
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
            if (p_ == d) return false;
        }
        if (integer) {
            if (neg) {
                const auto r = std::from_chars(b, p_, n.i);
                if (r.ec == std::errc() && r.ptr == p_) return n.type = Number::Int, true;
            } else {
                const auto r = std::from_chars(b, p_, n.u);
                if (r.ec == std::errc() && r.ptr == p_) return n.type = Number::Unsigned, true;
            }
        }
        const auto r = std::from_chars(b, p_, n.f);
        n.type = Number::Float;
        return r.ec == std::errc() && r.ptr == p_;
    }
    // The members of an object or the elements of an array, after the opening
    // bracket: `one` reads one (a key and its value, or a value); they are
    // separated by commas and end at `close`.
    template <class One>
    bool sequence(char close, One one) {
        ws();
        if (p_ < end_ && *p_ == close) {
            ++p_;
            return true;
        }
        while (true) {
            if (!one()) return false;
            ws();
            if (p_ == end_) return false;
            if (*p_ == ',') {
                ++p_;
                ws();
                continue;
            }
            if (*p_ != close) return false;
            ++p_;
            return true;
        }
    }
    bool value() {
        if (p_ == end_) return false;
        if (p_ >= next_) {
            progress_(static_cast<std::size_t>(p_ - base_));
            next_ = p_ + kStep;
        }
        switch (*p_) {
            case '{':
                if (sax_->at_entry()) {
                    if (ahead_start_ && p_ >= ahead_start_) {
                        // Where the read-ahead began: its entries are this list's next ones.
                        if (p_ == ahead_start_ && consume_ahead()) return true;
                        stop_ahead();  // (passed: it began elsewhere; or it read none)
                    }
                    const char* start = p_;
                    doc_.clear();
                    entry_end_ = static_cast<std::size_t>(end_ - p_) > kMaxEntryText ? p_ + kMaxEntryText : end_;
                    DirectEntry de;
                    if (direct_entry(de)) {
                        sax_->entry(de);
                        return true;
                    }
                    p_ = start;
                    doc_.clear();
                    if (fvalue(0)) {
                        sax_->entry(FRef{&doc_, doc_.stack.back()});
                        return true;
                    }
                    p_ = start;  // read it through the SAX calls instead
                }
                ++p_;
                sax_->start_object(static_cast<std::size_t>(-1));
                return sequence('}', [&] {
                           if (p_ == end_ || *p_ != '"' || !str(key_)) return false;
                           sax_->key(key_);
                           ws();
                           if (p_ == end_ || *p_ != ':') return false;
                           ++p_;
                           ws();
                           return value();
                       }) &&
                       sax_->end_object();
            case '[':
                ++p_;
                sax_->start_array(static_cast<std::size_t>(-1));
                return sequence(']', [&] { return value(); }) && sax_->end_array();
            case '"': {
                std::string v;
                if (!str(v)) return false;
                return sax_->string(v);
            }
            case 't': return lit("true") && sax_->boolean(true);
            case 'f': return lit("false") && sax_->boolean(false);
            case 'n': return lit("null") && sax_->null();
            default: return number();
        }
    }

    // A trace entry read alone into doc_, without the SAX calls and the
    // nlohmann values they build (most of the time a JSON snapshot took).
    // It gives up (false) on anything the SAX path would treat otherwise or
    // reject: text it gives up on, nesting deeper than kMaxEntryDepth, or an
    // entry longer than kMaxEntryText, whose values JsonStream might count
    // past its limit for one entry (JsonStream charges at most 40 bytes per
    // byte of text, 80 for each "[]" nested in an array: 256 KiB x 40 =
    // 10 MiB < 16 MiB). The caller then reads the same text through the SAX
    // calls.
    static constexpr std::size_t kMaxEntryText = std::size_t(256) << 10;
    static constexpr int kMaxEntryDepth = 8;
    bool fvalue(int depth) {
        if (p_ >= entry_end_) return false;
        const auto id = static_cast<std::uint32_t>(doc_.nodes.size());
        doc_.nodes.emplace_back();
        switch (*p_) {
            case '{':
            case '[': {
                if (depth >= kMaxEntryDepth) return false;
                const bool obj = *p_ == '{';
                ++p_;
                const std::size_t base = doc_.stack.size();
                const bool ok = sequence(obj ? '}' : ']', [&] {
                    if (obj) {
                        std::string_view k;
                        if (p_ >= entry_end_ || *p_ != '"' || !scan_str(k)) return false;
                        doc_.stack.push_back(static_cast<std::uint32_t>(doc_.nodes.size()));
                        auto& kn = doc_.nodes.emplace_back();
                        kn.kind = VKind::String;
                        kn.s = k;
                        ws();
                        if (p_ >= entry_end_ || *p_ != ':') return false;
                        ++p_;
                        ws();
                    }
                    return fvalue(depth + 1);
                });
                if (!ok || p_ > entry_end_) return false;
                auto& n = doc_.nodes[id];
                n.kind = obj ? VKind::Dict : VKind::List;
                n.first = static_cast<std::uint32_t>(doc_.items.size());
                n.count = static_cast<std::uint32_t>(doc_.stack.size() - base);
                doc_.items.insert(doc_.items.end(), doc_.stack.begin() + static_cast<std::ptrdiff_t>(base), doc_.stack.end());
                doc_.stack.resize(base);
                break;
            }
            case '"': {
                std::string_view v;
                if (!scan_str(v)) return false;
                doc_.nodes[id].kind = VKind::String;
                doc_.nodes[id].s = v;
                break;
            }
            case 't':
                if (!lit("true")) return false;
                doc_.nodes[id].kind = VKind::Bool;  // (no field of an entry reads a bool's value)
                break;
            case 'f':
                if (!lit("false")) return false;
                doc_.nodes[id].kind = VKind::Bool;
                break;
            case 'n':
                if (!lit("null")) return false;
                break;
            default: {
                Number num;
                if (!scan_number(num)) return false;
                auto& n = doc_.nodes[id];
                switch (num.type) {
                    case Number::Int: n.kind = VKind::Int, n.i = num.i; break;
                    case Number::Unsigned:
                        // As vint(JRef) reads nlohmann's unsigned numbers.
                        n.kind = num.u > static_cast<std::uint64_t>(INT64_MAX) ? VKind::BigInt : VKind::Int;
                        n.i = static_cast<std::int64_t>(num.u);
                        break;
                    case Number::Float: n.kind = VKind::Float, n.f = num.f; break;
                }
                break;
            }
        }
        doc_.stack.push_back(id);
        return true;
    }

    // The keys direct_entry reads (the read-ahead's start is an object whose
    // first key is one of them).
    static constexpr std::array<std::string_view, 7> kEntryKeys = {"action", "addr",   "size",       "stream",
                                                                     "time_us", "frames", "device_free"};
    // Whether key `k` is `lit`, compared inline (k's length is known to be
    // lit's where it is called: string_view's compare went out of line and
    // through memcmp, eleven times an entry, an eighth of reading one).
    template <std::size_t N>
    static bool key_is(std::string_view k, const char (&lit)[N]) {
        return k.size() == N - 1 && __builtin_memcmp(k.data(), lit, N - 1) == 0;
    }
    // The entry at p_ read straight into `e` when it has DirectEntry's shape
    // (false on anything else: the caller reads it again from its start).
    bool direct_entry(DirectEntry& e) {
        ++p_;  // '{'
        ws();
        if (p_ < entry_end_ && *p_ == '}') return false;  // (no "action": read_entry names the error)
        while (true) {
            std::string_view k;
            if (p_ >= entry_end_ || *p_ != '"' || !scan_str(k)) return false;
            ws();
            if (p_ >= entry_end_ || *p_ != ':') return false;
            ++p_;
            ws();
            if (p_ >= entry_end_) return false;
            // A number from 0 to 2^63-1 (nonneg) or any int64.
            auto integer = [&](std::int64_t& out, bool& has, bool nonneg) {
                if (has || (*p_ != '-' && (*p_ < '0' || *p_ > '9'))) return false;
                Number n;
                if (!scan_number(n)) return false;
                if (n.type == Number::Unsigned) {
                    if (n.u > static_cast<std::uint64_t>(INT64_MAX)) return false;
                    out = static_cast<std::int64_t>(n.u);
                } else if (n.type == Number::Int && !nonneg) {
                    out = n.i;
                } else {
                    return false;
                }
                has = true;
                return true;
            };
            bool ok = false;
            switch (k.size()) {
                case 4:
                    if (key_is(k, "addr")) ok = integer(e.addr, e.has_addr, true);
                    else if (key_is(k, "size")) ok = integer(e.size, e.has_size, true);
                    break;
                case 6:
                    if (key_is(k, "action")) {
                        std::string_view a;
                        ok = !e.has_action && *p_ == '"' && scan_str(a);
                        e.action = parse_trace_action(a);
                        e.has_action = true;
                    } else if (key_is(k, "stream")) {
                        ok = integer(e.stream, e.has_stream, false);
                    } else if (key_is(k, "frames")) {
                        if (!e.has_frames && *p_ == '[' && frames()) {
                            e.frames = FRef{&doc_, doc_.stack.back()};
                            e.has_frames = ok = true;
                        }
                    }
                    break;
                case 7:
                    if (key_is(k, "time_us")) ok = integer(e.time_us, e.has_time, false);
                    break;
                case 11:
                    if (key_is(k, "device_free")) ok = integer(e.device_free, e.has_free, true);
                    break;
                default: break;
            }
            if (!ok || p_ > entry_end_) return false;
            ws();
            if (p_ >= entry_end_) return false;
            if (*p_ == ',') {
                ++p_;
                ws();
                continue;
            }
            if (*p_ != '}') return false;
            ++p_;
            return e.has_action;
        }
    }
    // An entry's "frames" list (the value of its key, at p_): the memo's
    // node when its text was read before, else read in full, carrying its
    // text (see FramesMemo).
    // A frames list the memo knew, as its node: what the Reader made of it.
    void push_summary(std::int64_t top) {
        const auto id = static_cast<std::uint32_t>(doc_.nodes.size());
        auto& n = doc_.nodes.emplace_back();
        n.kind = VKind::List;
        n.summary = true;
        n.i = top;
        doc_.stack.push_back(id);
    }
    bool frames() {
        if (const char* e = list_end(p_); e && e <= entry_end_) {
            if (const std::int32_t* top = memo_.find(std::string_view(p_, static_cast<std::size_t>(e - p_)))) {
                push_summary(*top);
                p_ = e;
                return true;
            }
        }
        const char* b = p_;
        if (!fvalue(1)) return false;
        doc_.nodes[doc_.stack.back()].s = std::string_view(b, static_cast<std::size_t>(p_ - b));
        return true;
    }
    // Where the list starting at `p` ends (past its ']'), found by brackets
    // and quotes alone; nullptr at a backslash (an escape: FastJson gives up
    // on those) or the end of the text. Only a candidate for a memo lookup:
    // a text the memo holds was read in full before. 16 bytes at a time:
    // the bytes inside strings are the prefix XOR of the quotes' mask.
    const char* list_end(const char* p) const {
        int depth = 0;
        bool in_str = false;
#if defined(__SSE2__)
        while (end_ - p >= 16) {
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
            auto mask = [&](char c) { return static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(c)))); };
            if (mask('\\')) return nullptr;
            const std::uint32_t open = mask('['), close = mask(']');
            std::uint32_t str = mask('"');
            str ^= str << 1, str ^= str << 2, str ^= str << 4, str ^= str << 8;
            if (in_str) str = ~str;
            str &= 0xffffu;
            for (std::uint32_t br = (open | close) & ~str; br; br &= br - 1) {
                const int i = __builtin_ctz(br);
                if (open >> i & 1u) ++depth;
                else if (--depth == 0) return p + i + 1;
            }
            in_str = (str >> 15) & 1u;
            p += 16;
        }
#endif
        while (p < end_) {
            const char c = *p++;
            if (c == '\\') return nullptr;
            if (c == '"') in_str = !in_str;
            else if (in_str) continue;
            else if (c == '[') ++depth;
            else if (c == ']' && --depth == 0) return p;
        }
        return nullptr;
    }

    const char* p_;
    const char* base_;
    const char* end_;
    const char* next_;
    const char* entry_end_ = nullptr;
    JsonStream* sax_;  // null: the read-ahead's lexer, which reads entries alone
    const Progress& progress_;
    std::string key_;
    FramesMemo memo_;
    FDoc doc_;

    // The read-ahead (below): started by the reader, at ahead_->start().
    class Ahead;
    explicit FastJson(std::string_view text);  // the read-ahead's lexer
    static const Progress& no_progress();
    static const char* entry_candidate(const char* from, const char* end);
    bool consume_ahead();
    void stop_ahead();
    std::unique_ptr<Ahead> ahead_;
    const char* ahead_start_ = nullptr;  // ahead_'s start
};

// ---------------------------------------------------------------------------
// The read-ahead (snapshot_internal.hpp): a second thread that reads trace
// entries from a point near the middle of the text, each as direct_entry
// reads it, into 32-byte records, while the reader reads the text before
// that point. The reader takes the records when it reaches the point as an
// entry of a trace list it reads (FastJson::value); it hands each to the
// Reader as the DirectEntry direct_entry would have made of the same text,
// in order, and goes on after the last one. Anything the read-ahead could
// not read alone (an entry of another shape, the list's end, more than
// 65,536 distinct streams or frames lists) ends its run there: the reader
// reads that entry itself. A start that is not such an entry (a guess
// inside a string, in a list that is skipped) is never reached: its
// records are dropped unread.
//
// What it costs (callgrind, bench/snapshot_gen.hpp's entries): reading an
// entry is ~2,750 instructions, lexing one alone ~2,400, handing a record
// over ~320 (mostly the Reader's part), so the reader reaches the start
// (at 42% of the text) about when the read-ahead ends. The reading of the
// 10M-entry file took 2.2 s instead of 4.2 s on the 2-core development
// machine; the conversion and replay after it (2.9 s there) are unchanged.
// The records wait in chunks of 1 MiB mapped from the system, at most
// kMaxHeldBytes at a time (the read-ahead waits for the reader past that);
// they are left out of the snapshot's memory limit while held
// (TransientMemory), so a file is accepted or refused as when one thread
// reads it. The text's pages the read-ahead has passed are dropped as the
// reader drops its own (`drop`).

std::mutex g_read_ahead_mutex;
detail::JsonReadAhead g_read_ahead;
std::atomic<std::size_t> g_read_ahead_entries{0};

}  // namespace

namespace detail {
JsonReadAhead json_read_ahead() {
    const std::lock_guard<std::mutex> lock(g_read_ahead_mutex);
    return g_read_ahead;
}
void set_json_read_ahead(const JsonReadAhead& r) {
    const std::lock_guard<std::mutex> lock(g_read_ahead_mutex);
    g_read_ahead = r;
}
std::size_t json_read_ahead_entries() { return g_read_ahead_entries.load(std::memory_order_relaxed); }
}  // namespace detail

namespace {

class FastJson::Ahead {
public:
    // One entry: the fields direct_entry reads. A nonzero device_free
    // takes a second record (its addr).
    struct Lexed {
        std::int64_t addr, size, time_us;
        std::int32_t frames;   // the frames list's text (text()), -1: no "frames"
        std::uint16_t stream;  // stream()'s index
        std::uint8_t action;   // TraceAction
        std::uint8_t more;     // 1: the next record's addr is device_free
    };
    static_assert(sizeof(Lexed) == 32);
    static constexpr std::size_t kChunkRecords = std::size_t(1) << 15;  // 1 MiB
    static constexpr std::size_t kChunkBytes = kChunkRecords * sizeof(Lexed);
    static constexpr std::size_t kMaxHeldBytes = std::size_t(160) << 20;
    static constexpr std::size_t kMaxChunks = kMaxHeldBytes / kChunkBytes;
    static constexpr std::size_t kMaxStreams = std::size_t(1) << 16;
    struct Chunk {
        Lexed* r = nullptr;
        std::size_t n = 0;
    };

    // Starts reading at `start` (a '{'); throws std::system_error when no
    // thread can start.
    Ahead(std::string_view text, const char* start, const DropPages* drop)
        : lex_(text),
          start_(start),
          base_(text.data()),
          drop_(drop),
          texts_(new const std::string*[FramesMemo::kMaxTexts]),
          streams_(new std::int64_t[kMaxStreams]) {
        thread_ = std::thread([this] { run(); });
    }
    ~Ahead() {
        cancel();
        if (thread_.joinable()) thread_.join();
        for (; count_ > 0; --count_, head_ = (head_ + 1) % kMaxChunks) unmap(ring_[head_]);
    }
    Ahead(const Ahead&) = delete;
    Ahead& operator=(const Ahead&) = delete;

    [[nodiscard]] const char* start() const { return start_; }
    void cancel() {
        {
            const std::lock_guard<std::mutex> lock(m_);
            cancel_.store(true, std::memory_order_relaxed);
        }
        cv_.notify_all();
    }
    // The next chunk of records, waiting for it; false: there are no more.
    bool next(Chunk& c) {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return count_ > 0 || done_; });
        if (count_ == 0) return false;
        c = ring_[head_];
        head_ = (head_ + 1) % kMaxChunks;
        --count_;
        return true;
    }
    // A chunk taken by next(), read: its memory goes back.
    void release(Chunk& c) {
        unmap(c);
        {
            const std::lock_guard<std::mutex> lock(m_);
            --mapped_;
        }
        cv_.notify_all();
    }
    // Past the last entry read (after next() returned false).
    [[nodiscard]] const char* stop() const { return stop_; }
    [[nodiscard]] std::string_view text(std::int32_t id) const { return *texts_[static_cast<std::size_t>(id)]; }
    [[nodiscard]] std::int64_t stream(std::uint16_t i) const { return streams_[i]; }

private:
    void run() noexcept {
        Chunk cur;
        const char* last = nullptr;
        try {
            const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
            const std::size_t first = static_cast<std::size_t>(start_ - base_);
            std::size_t dropped = (first + page - 1) / page * page;  // (the page of `start` is the reader's too)
            const char* p = start_;
            while (!cancel_.load(std::memory_order_relaxed)) {
                lex_.p_ = p;
                lex_.doc_.clear();
                lex_.entry_end_ = static_cast<std::size_t>(lex_.end_ - p) > kMaxEntryText ? p + kMaxEntryText : lex_.end_;
                DirectEntry de;
                if (!lex_.direct_entry(de)) break;
                std::int32_t frames = -1;
                std::uint16_t si = 0;
                if ((de.has_frames && !frames_id(de, frames)) || !stream_index(de.stream, si)) break;
                const std::size_t need = de.device_free != 0 ? 2 : 1;
                if (cur.r && cur.n + need > kChunkRecords) hand(cur);
                if (!cur.r && !map(cur)) break;
                Lexed& r = cur.r[cur.n++];
                r = Lexed{de.addr, de.size, de.time_us, frames, si, static_cast<std::uint8_t>(de.action),
                          static_cast<std::uint8_t>(need - 1)};
                if (need == 2) cur.r[cur.n++] = Lexed{de.device_free, 0, 0, -1, 0, 0, 0};
                last = lex_.p_;
                // The list's next element, an object.
                lex_.ws();
                if (lex_.p_ == lex_.end_ || *lex_.p_ != ',') break;
                ++lex_.p_;
                lex_.ws();
                if (lex_.p_ == lex_.end_ || *lex_.p_ != '{') break;
                p = lex_.p_;
                const std::size_t pos = static_cast<std::size_t>(p - base_);
                const std::size_t upto = pos > (1u << 20) ? ((pos - (1u << 20)) / page) * page : 0;
                if (drop_ && upto >= dropped + (32u << 20)) {
                    (*drop_)(dropped, upto);
                    dropped = upto;
                }
            }
        } catch (...) {  // (memory: the reader reads the rest itself)
        }
        {
            const std::lock_guard<std::mutex> lock(m_);
            if (cur.r && cur.n > 0) {
                push(cur);
                cur = Chunk{};
            }
            stop_ = last;
            done_ = true;
        }
        if (cur.r) {  // (mapped, nothing written)
            unmap(cur);
            const std::lock_guard<std::mutex> lock(m_);
            --mapped_;
        }
        cv_.notify_all();
    }
    // Under m_: at most kMaxChunks are mapped, so the ring has room.
    void push(const Chunk& c) {
        ring_[(head_ + count_) % kMaxChunks] = c;
        ++count_;
    }
    // A full chunk to the reader.
    void hand(Chunk& cur) {
        {
            const std::lock_guard<std::mutex> lock(m_);
            push(cur);
        }
        cur = Chunk{};
        cv_.notify_all();
    }
    // A fresh chunk, once fewer than kMaxChunks are held; false when
    // cancelled or the system has none.
    bool map(Chunk& cur) {
        {
            std::unique_lock<std::mutex> lock(m_);
            cv_.wait(lock, [&] { return mapped_ < kMaxChunks || cancel_.load(std::memory_order_relaxed); });
            if (cancel_.load(std::memory_order_relaxed)) return false;
            ++mapped_;
        }
        void* p = ::mmap(nullptr, kChunkBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) {
            const std::lock_guard<std::mutex> lock(m_);
            --mapped_;
            return false;
        }
        held_.add(static_cast<std::int64_t>(kChunkBytes));
        cur = Chunk{static_cast<Lexed*>(p), 0};
        return true;
    }
    void unmap(Chunk& c) {
        if (!c.r) return;
        ::munmap(c.r, kChunkBytes);
        held_.add(-static_cast<std::int64_t>(kChunkBytes));
        c = Chunk{};
    }
    // The id of the entry's frames list: the read-ahead's memo files each
    // text it reads in full under the next id (false past the memo's caps).
    bool frames_id(const DirectEntry& de, std::int32_t& id) {
        const FDoc::Node& n = lex_.doc_.nodes[de.frames.id];
        if (n.summary) {
            id = static_cast<std::int32_t>(n.i);
            return true;
        }
        const std::string_view t = n.s;
        if (t.empty() || t.size() > FramesMemo::kMaxTextBytes || texts_n_ >= FramesMemo::kMaxTexts ||
            text_bytes_ + t.size() > FramesMemo::kMaxTotalBytes)
            return false;
        const auto [it, fresh] = lex_.memo_.top.emplace(std::string(t), static_cast<std::int32_t>(texts_n_));
        if (!fresh) {
            id = it->second;
            return true;
        }
        texts_[texts_n_] = &it->first;
        id = static_cast<std::int32_t>(texts_n_++);
        text_bytes_ += t.size();
        held_.add(static_cast<std::int64_t>(t.size() + 64));  // (the memo's copy and its node: transient too)
        return true;
    }
    bool stream_index(std::int64_t v, std::uint16_t& i) {
        if (streams_n_ > 0 && streams_[last_stream_] == v) {
            i = last_stream_;
            return true;
        }
        const auto it = stream_ids_.find(v);
        if (it != stream_ids_.end()) {
            i = last_stream_ = it->second;
            return true;
        }
        if (streams_n_ >= kMaxStreams) return false;
        i = last_stream_ = static_cast<std::uint16_t>(streams_n_);
        streams_[streams_n_++] = v;
        stream_ids_.emplace(v, i);
        return true;
    }

    FastJson lex_;  // the read-ahead's lexer: its own entry document and frames memo
    const char* start_;
    const char* base_;
    const DropPages* drop_;
    std::unique_ptr<const std::string*[]> texts_;  // by id: the memo's keys (nodes never move)
    std::size_t texts_n_ = 0, text_bytes_ = 0;
    std::unique_ptr<std::int64_t[]> streams_;
    std::size_t streams_n_ = 0;
    std::uint16_t last_stream_ = 0;
    std::unordered_map<std::int64_t, std::uint16_t> stream_ids_;
    TransientMemory held_;
    // Shared with the reader, under m_ (cancel_ is also read without it).
    std::mutex m_;
    std::condition_variable cv_;
    std::array<Chunk, kMaxChunks> ring_{};  // the chunks handed, from head_
    std::size_t head_ = 0, count_ = 0;
    std::size_t mapped_ = 0;
    bool done_ = false;
    std::atomic<bool> cancel_{false};
    const char* stop_ = nullptr;
    std::thread thread_;  // last: started once the rest exists
};

FastJson::FastJson(std::string_view text, JsonStream& sax, const Progress& progress, const DropPages* drop)
    : p_(text.data()), base_(text.data()), end_(text.data() + text.size()), sax_(&sax), progress_(progress) {
    next_ = progress_ ? p_ + kStep : end_ + 1;
    doc_.memo = &memo_;
    const detail::JsonReadAhead ra = detail::json_read_ahead();
    if (text.size() < std::max<std::size_t>(ra.min_bytes, 1) || !(ra.at > 0.0 && ra.at < 1.0) || std::thread::hardware_concurrency() < 2)
        return;
    const char* start = entry_candidate(p_ + static_cast<std::size_t>(static_cast<double>(text.size()) * ra.at), end_);
    if (!start) return;
    try {
        ahead_ = std::make_unique<Ahead>(text, start, drop);
        ahead_start_ = start;
    } catch (const std::exception&) {  // (no thread, no memory: one thread reads it all)
        ahead_.reset();
    }
}

FastJson::FastJson(std::string_view text)
    : p_(text.data()), base_(text.data()), end_(text.data() + text.size()), sax_(nullptr), progress_(no_progress()) {
    next_ = end_ + 1;
    doc_.memo = &memo_;
}

FastJson::~FastJson() = default;

void FastJson::stop_ahead() {
    ahead_.reset();
    ahead_start_ = nullptr;
}

const Progress& FastJson::no_progress() {
    static const Progress none;
    return none;
}

// The first '{' from `from` on (within 4 MiB) that looks like a trace
// entry in a list: after "}," (whitespace around), and its first key one
// of direct_entry's. Only a guess (it may be inside a string, or in a list
// of other objects): the reader takes the read-ahead's records only when
// it reaches this very byte as a trace entry.
const char* FastJson::entry_candidate(const char* from, const char* end) {
    const char* limit = end - from > (std::ptrdiff_t{4} << 20) ? from + (std::ptrdiff_t{4} << 20) : end;
    for (const char* q = from; q < limit; ++q) {
        q = static_cast<const char*>(std::memchr(q, '{', static_cast<std::size_t>(limit - q)));
        if (!q) return nullptr;
        const char* b = q;
        while (b > from && is_ws(b[-1])) --b;
        if (b <= from || b[-1] != ',') continue;
        --b;
        while (b > from && is_ws(b[-1])) --b;
        if (b <= from || b[-1] != '}') continue;
        const char* a = q + 1;
        while (a < end && is_ws(*a)) ++a;
        if (a == end || *a != '"') continue;
        const char* k = a + 1;
        const char* ke = static_cast<const char*>(std::memchr(k, '"', static_cast<std::size_t>(std::min<std::ptrdiff_t>(end - k, 16))));
        if (!ke) continue;
        const std::string_view key(k, static_cast<std::size_t>(ke - k));
        if (std::find(kEntryKeys.begin(), kEntryKeys.end(), key) != kEntryKeys.end()) return q;
    }
    return nullptr;
}

// The read-ahead's records, at the byte where it began (p_): each handed
// to the Reader as direct_entry's DirectEntry of the same text; p_ then
// after the last. False when it read none (the reader reads on itself).
bool FastJson::consume_ahead() {
    const std::unique_ptr<Ahead> a = std::move(ahead_);
    ahead_start_ = nullptr;
    // What the memo gave for each of the read-ahead's frames texts (known
    // once a lookup found it: the memo never changes what it holds).
    constexpr std::int64_t kUnknown = std::numeric_limits<std::int64_t>::min();
    std::vector<std::int64_t> top;
    std::size_t used = 0;
    struct Taken {
        Ahead* a;
        Ahead::Chunk c;
        ~Taken() {
            if (c.r) a->release(c);
        }
    } taken{a.get(), {}};
    while (a->next(taken.c)) {
        const Ahead::Lexed* r = taken.c.r;
        for (std::size_t k = 0; k < taken.c.n; ++k, ++used) {
            const Ahead::Lexed& x = r[k];
            DirectEntry de;
            de.action = static_cast<TraceAction>(x.action);
            de.addr = x.addr;
            de.size = x.size;
            de.stream = a->stream(x.stream);
            de.time_us = x.time_us;
            if (x.more) de.device_free = r[++k].addr;
            doc_.clear();
            if (x.frames >= 0) {
                const auto id = static_cast<std::size_t>(x.frames);
                if (top.size() <= id) top.resize(id + 1, kUnknown);
                const std::string_view text = a->text(x.frames);
                const std::int32_t* known = top[id] != kUnknown ? nullptr : memo_.find(text);
                if (known) top[id] = *known;
                if (top[id] != kUnknown) {
                    push_summary(top[id]);
                } else {
                    // Read in full (the read-ahead read these bytes so: they are valid).
                    const char *p = p_, *e = end_, *ee = entry_end_;
                    p_ = text.data();
                    end_ = entry_end_ = text.data() + text.size();
                    const bool ok = fvalue(1);
                    p_ = p, end_ = e, entry_end_ = ee;
                    if (!ok) throw std::logic_error("snapshot JSON read-ahead: a frames list it read does not read again");
                    doc_.nodes[doc_.stack.back()].s = text;
                }
                de.frames = FRef{&doc_, doc_.stack.back()};
                de.has_frames = true;
            }
            sax_->entry(de);
        }
        a->release(taken.c);
    }
    if (used == 0) return false;
    g_read_ahead_entries.fetch_add(used, std::memory_order_relaxed);
    p_ = a->stop();
    return true;
}

Snapshot parse_json_streaming(std::string_view data, const std::string& origin, TraceEntrySink& sink,
                              const Progress& progress, const DropPages* drop) {
    // One pass over the text: the fast lexer, or nlohmann's SAX parser for
    // text the lexer hands back (escapes, non-ASCII, invalid JSON). Returns
    // the number of top-level "device_traces" keys; `snap` is complete when
    // it is at most skip + 1.
    auto pass = [&](Snapshot& snap, bool fast, int skip) {
        snap = Snapshot{};
        snap.origin = origin;
        snap.format = "json";
        Reader<JRef> reader(snap, std::numeric_limits<std::size_t>::max());
        reader.stream_to(&sink, nullptr);
        JsonStream handler(reader, data, origin, skip);
        if (fast) {
            if (!FastJson(data, handler, progress, drop).run()) return -1;
        } else {
            const ProgressIter first(data.data(), data.data(), &progress), last(data.data() + data.size(), data.data(), nullptr);
            json::sax_parse(first, last, &handler);
        }
        if (handler.device_traces_keys() <= skip + 1) reader.read_root(JRef{&handler.root()});
        return handler.device_traces_keys();
    };
    Snapshot snap;
    int keys = pass(snap, true, 0);
    const bool fast = keys >= 0;
    if (!fast) {
        sink.restart();
        keys = pass(snap, false, 0);
    }
    if (keys <= 1) return snap;
    // "device_traces" more than once at the top: the last one counts, as in
    // json.load; read again, dropping the earlier ones.
    sink.restart();
    pass(snap, fast, keys - 1);
    return snap;
}

Snapshot parse_json(std::string_view data, const std::string& origin) {
    // Nesting is bounded by a linear scan first (a snapshot nests ~6 levels);
    // the plain parse then builds the DOM in linear time. (nlohmann's callback
    // parser rescans the parent array at every object's end: quadratic.)
    check_json_depth(data, origin);
    json doc;
    try {
        doc = json::parse(data.begin(), data.end());
    } catch (const json::exception& e) {
        fail(ErrorCode::ParseError, origin, origin + ": not valid JSON: " + e.what());
    }
    Snapshot snap;
    snap.origin = origin;
    snap.format = "json";
    Reader<JRef> reader(snap, std::numeric_limits<std::size_t>::max());
    reader.read_root(JRef{&doc});
    return snap;
}

// Hands the trace entries of a pickle to the Reader as the parser appends them.
class PickleEntries final : public pickle::ListSink {
public:
    PickleEntries(Reader<PRef>& r, TraceEntrySink* sink, Progress progress)
        : r_(r), sink_(sink), progress_(std::move(progress)) {}
    void items(const pickle::Document& doc, std::size_t list, std::span<const pickle::Document::Id> items) override {
        r_.stream_to(sink_, &doc);
        buf_.clear();
        for (const auto id : items) buf_.push_back(PRef{&doc, id});
        r_.entries(list, std::span<const PRef>(buf_));
    }
    std::optional<std::int64_t> summary(pickle::Document::Id list) override { return r_.frames_summary(list); }
    void released(pickle::Document::Id from) override { r_.forget_from(from); }
    void progress(std::size_t pos) override {
        if (progress_) progress_(pos);
    }

private:
    Reader<PRef>& r_;
    TraceEntrySink* sink_;
    Progress progress_;
    std::vector<PRef> buf_;
};

Snapshot parse_pickle(std::string_view data, const std::string& origin, TraceEntrySink* sink = nullptr,
                      const Progress& progress = {}) {
    Snapshot snap;
    snap.origin = origin;
    snap.format = "pickle";
    if (sink) {
        // Streaming: trace entries are read as they are parsed and freed;
        // read again without the direct entries when they were used as
        // anything else (pickle::DirectFallback: never in a torch dump).
        auto stream = [&](bool direct) {
            snap = Snapshot{};
            snap.origin = origin;
            snap.format = "pickle";
            Reader<PRef> reader(snap, 0);
            PickleEntries entries(reader, sink, progress);
            pickle::StreamSpec spec;
            spec.key = "device_traces";
            spec.sink = &entries;
            spec.direct = direct;
            auto doc = pickle::parse(data, origin, {}, spec);
            if (!doc) throw InputError(doc.error());
            const pickle::Document& d = doc.value();
            const bool same = !spec.claimed || (d.root() == spec.root && d.find(d.root(), "device_traces") == spec.list);
            if (!same) return false;
            snap.pickle_protocol = d.protocol();
            reader.stream_to(sink, &d);
            reader.read_root(PRef{&d, d.root()});
            return true;
        };
        bool read = false;
        try {
            read = stream(true);
        } catch (const pickle::DirectFallback&) {
            sink->restart();
            read = stream(false);
        }
        if (read) return snap;
        // The entries went under a device_traces list that is not the
        // document's in the end (a repeated key): read it whole instead.
        sink->restart();
        snap = Snapshot{};
        snap.origin = origin;
        snap.format = "pickle";
    }
    auto doc = pickle::parse(data, origin);
    if (!doc) throw InputError(doc.error());
    const pickle::Document& d = doc.value();
    snap.pickle_protocol = d.protocol();
    // A snapshot visits each node about once; sharing (frames) is cached.
    const std::size_t budget = 8 * d.node_count() + (1u << 20);
    Reader<PRef> reader(snap, budget);
    reader.stream_to(sink, nullptr);
    reader.read_root(PRef{&d, d.root()});
    return snap;
}

// The file mapped read-only. Pages the parser has passed are dropped from
// the process as it goes (they stay in the page cache), so the resident
// size does not grow with the file.
class MappedFile {
public:
    explicit MappedFile(const std::string& path) {
        const std::int64_t size = check_input_file(path, kMaxSnapshotBytes, "snapshot");
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        struct stat st {};
        if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == size && size > 0) {
            void* p = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
            if (p != MAP_FAILED) {
                map_ = static_cast<const char*>(p);
                size_ = static_cast<std::size_t>(size);
                ::madvise(p, size_, MADV_SEQUENTIAL);
            }
        }
        if (fd >= 0) ::close(fd);
        // Not mappable (or changed since the check): read it, with its checks.
        if (!map_) copy_ = read_input_file(path, kMaxSnapshotBytes, "snapshot");
    }
    ~MappedFile() {
        if (map_) ::munmap(const_cast<char*>(map_), size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    [[nodiscard]] std::string_view data() const { return map_ ? std::string_view(map_, size_) : std::string_view(copy_); }
    // The parser is at `pos`: drop the pages more than 1 MiB behind it.
    void passed(std::size_t pos) {
        if (!map_) return;
        const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        const std::size_t upto = pos > (1u << 20) ? ((pos - (1u << 20)) / page) * page : 0;
        if (upto < dropped_ + (32u << 20)) return;
        ::madvise(const_cast<char*>(map_) + dropped_, upto - dropped_, MADV_DONTNEED);
        dropped_ = upto;
    }

    // Bytes [from, to) (page-aligned): dropped from the process (the read-ahead's pages; any thread).
    void drop(std::size_t from, std::size_t to) const {
        if (map_ && from < to && to <= size_) ::madvise(const_cast<char*>(map_) + from, to - from, MADV_DONTNEED);
    }

private:
    const char* map_ = nullptr;
    std::size_t size_ = 0;
    std::size_t dropped_ = 0;
    std::string copy_;
};

Snapshot parse_any(std::string_view data, const std::string& origin, TraceEntrySink* sink, const Progress& progress,
                   const DropPages* drop = nullptr) {
    if (data.empty()) fail(ErrorCode::ParseError, origin, origin + ": the file is empty");
    if (static_cast<unsigned char>(data[0]) == 0x80) return parse_pickle(data, origin, sink, progress);
    const auto first = data.find_first_not_of(" \t\r\n");
    if (first != std::string_view::npos && (data[first] == '{' || data[first] == '['))
        return sink ? parse_json_streaming(data, origin, *sink, progress, drop) : parse_json(data, origin);
    fail(ErrorCode::ParseError, origin,
         origin + ": neither a pickle (first byte 0x80) nor JSON; expected the file torch.cuda.memory._dump_snapshot() writes");
}

}  // namespace

Result<Snapshot> parse_snapshot_bytes(std::string_view data, std::string origin) {
    return capture([&]() -> Result<Snapshot> {
        try {
            return parse_any(data, origin, nullptr, {});
        } catch (const std::bad_alloc&) {
            return Error{ErrorCode::ParseError, origin + ": out of memory while reading the snapshot", origin};
        }
    });
}

Result<Snapshot> read_snapshot(const std::string& path) {
    // A regular file of at most kMaxSnapshotBytes: a FIFO, /dev/zero or a
    // folder is refused before it is opened.
    auto data = capture([&] { return read_input_file(path, kMaxSnapshotBytes, "snapshot"); });
    if (!data) return data.error();
    return parse_snapshot_bytes(*data, path);
}

Result<Snapshot> parse_snapshot_streaming(std::string_view data, std::string origin, TraceEntrySink& sink) {
    return capture([&]() -> Result<Snapshot> {
        try {
            return parse_any(data, origin, &sink, {});
        } catch (const std::bad_alloc&) {
            return Error{ErrorCode::ParseError, origin + ": out of memory while reading the snapshot", origin};
        }
    });
}

Result<Snapshot> read_snapshot_streaming(const std::string& path, TraceEntrySink& sink) {
    return capture([&]() -> Result<Snapshot> {
        try {
            MappedFile file(path);
            const DropPages drop = [&file](std::size_t from, std::size_t to) { file.drop(from, to); };
            return parse_any(file.data(), path, &sink, [&](std::size_t pos) { file.passed(pos); }, &drop);
        } catch (const std::bad_alloc&) {
            return Error{ErrorCode::ParseError, path + ": out of memory while reading the snapshot", path};
        }
    });
}

}  // namespace gpumem::sim
