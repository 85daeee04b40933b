// gpumem/sim/pickle.hpp — a small, safe reader for plain-data Python pickles.
//
// torch.cuda.memory._dump_snapshot() writes its snapshot with pickle.dump()
// (the default protocol: 4 on Python 3.8-3.13, 5 on 3.14); the C++ API
// torch::cuda::_memory_snapshot_pickled() writes protocol 2 with the TorchScript
// pickler. Both hold only dicts, lists, tuples, ints, floats, strings, bools
// and None. This reader understands exactly those opcodes and refuses every
// opcode that would name or call Python code (GLOBAL, STACK_GLOBAL, REDUCE,
// BUILD, NEWOBJ, INST, OBJ, PERSID, EXT*, out-of-band buffers): no code is
// ever run, and a hostile file gets an error, never a crash.
//
// Opcodes read (Lib/pickle.py, Lib/pickletools.py):
//   framing     PROTO FRAME STOP
//   stack       MARK POP POP_MARK DUP
//   memo        PUT GET BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET
//   scalars     NONE NEWTRUE NEWFALSE INT LONG BININT BININT1 BININT2 LONG1 LONG4
//               FLOAT BINFLOAT
//   strings     BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINSTRING SHORT_BINSTRING
//               BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8
//   containers  EMPTY_DICT EMPTY_LIST EMPTY_TUPLE EMPTY_SET TUPLE TUPLE1 TUPLE2
//               TUPLE3 DICT LIST FROZENSET APPEND APPENDS SETITEM SETITEMS ADDITEMS
//
// The result is a Document: an arena of nodes addressed by Id. The memo lets a
// pickle refer to one object from many places (PyTorch shares its frame lists),
// so the tree is really a graph that may even contain cycles; consumers walk
// it along a fixed schema and never recurse on it without a bound. Integers
// wider than 64 bits (LONG1/LONG4 with more than 8 bytes) are kept as BigInt
// nodes: reading one as an integer is the consumer's error to report.
//
// Streaming (parse with a ListSink): the dicts appended to the lists of a
// top-level list (dict["device_traces"][d], 10^7 trace entries) are handed to
// the sink batch by batch as the pickle appends them (MARK ... APPENDS) and are
// not kept; the nodes they used are freed and their ids reused. What the memo
// still refers to survives: a list the sink read (a trace entry's frames,
// which torch shares between an alloc and its frees) as a node holding the
// sink's summary of it (Document::summary), any other value copied; a claimed
// dict itself becomes unreachable (a GET of it is an error). Memory then grows
// with the memo and the rest of the file, not with the claimed items.
//
// Streamed trace entries of the common shape are read without building them
// (StreamSpec::direct): a dict appended in a batch to a claimed list, made by
// EMPTY_DICT [MEMOIZE|BINPUT|LONG_BINPUT] MARK (key value)* SETITEMS whose
// keys are memo references to the strings "action", "addr", "size",
// "stream", "time_us", "device_free" or "frames" (each at most once) and
// whose values are memo references or integers of at most 64 bits, becomes a
// Dict node without items that carries the decoded fields
// (Document::direct); the sink reads those. Everything else a parse does is
// unchanged (the memo, the limits, the node count the sink's budget follows).
// Should such a dict be used as anything but a claimed entry (an item of
// another container, the target of SETITEM, the root, a memo value that
// outlives its batch), parse throws DirectFallback and the caller reads the
// file again without the shortcut.
//
// Limits keep memory bounded: every length is checked against the remaining
// bytes, each opcode creates at most one node, nesting deeper than
// Limits::max_depth is an error, and the memory held at any time (document,
// memo, stack) is checked against Limits::max_bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/result.hpp"

namespace gpumem::sim::pickle {

enum class Kind : std::uint8_t { None, Bool, Int, BigInt, Float, String, Bytes, List, Tuple, Dict, Set };
const char* kind_name(Kind k);

struct Limits {
    int max_depth = 256;                        // container nesting (and MARK nesting)
    std::size_t max_memo = 1u << 26;            // distinct memo keys
    std::size_t max_nodes = 400'000'000;        // values created
    std::size_t max_container = 1u << 28;       // items in one list/tuple/dict/set
    std::size_t max_string = std::size_t(1) << 31;  // bytes in one string
    // Memory the reader may hold at once: the document's nodes, strings and
    // item lists, the memo and the stack (vector capacities counted). Freed
    // streamed entries give theirs back; what stays (a huge list outside the
    // streamed key, memo-heavy data) is stopped here with an error.
    std::size_t max_bytes = std::size_t(384) << 20;
};

class Document {
public:
    using Id = std::uint32_t;
    // A streamed trace entry read directly (see above): its fields, present
    // where `has` says (kHasAction, ...); action and frames are nodes.
    struct DirectDict {
        static constexpr std::uint8_t kHasAction = 1, kHasAddr = 2, kHasSize = 4, kHasStream = 8, kHasTime = 16,
                                      kHasFree = 32, kHasFrames = 64;
        std::int64_t addr = 0, size = 0, stream = 0, time_us = 0, device_free = 0;
        Id action = 0, frames = 0;
        std::uint8_t has = 0;
    };

    [[nodiscard]] Id root() const { return root_; }
    [[nodiscard]] int protocol() const { return protocol_; }  // 0 when no PROTO opcode
    [[nodiscard]] std::size_t node_count() const { return nodes_.size(); }
    // Values created while parsing, freed ones included (== node_count() without a sink).
    [[nodiscard]] std::size_t created_count() const { return created_; }
    // A list a ListSink read and summarized before its items were freed.
    [[nodiscard]] std::optional<std::int64_t> summary(Id id) const {
        if (nodes_[id].flags & kSummary) return nodes_[id].payload;
        return std::nullopt;
    }

    // A streamed trace entry read directly, or nullptr.
    [[nodiscard]] const DirectDict* direct(Id id) const {
        return (nodes_[id].flags & kDirect) ? &direct_[static_cast<std::size_t>(nodes_[id].payload)] : nullptr;
    }

    [[nodiscard]] Kind kind(Id id) const { return nodes_[id].kind; }
    [[nodiscard]] bool as_bool(Id id) const { return nodes_[id].payload != 0; }
    [[nodiscard]] std::int64_t as_int(Id id) const { return nodes_[id].payload; }
    [[nodiscard]] double as_float(Id id) const;
    // String, Bytes and BigInt (little-endian two's complement bytes).
    [[nodiscard]] std::string_view as_string(Id id) const { return strings_[nodes_[id].ref]; }
    // List, Tuple, Set: the elements. Dict: keys and values interleaved
    // (k0, v0, k1, v1, ...) in insertion order; a repeated key appears twice,
    // the later one wins (find() looks from the end).
    [[nodiscard]] std::span<const Id> items(Id id) const;
    // Elements of a list/tuple/set, entries of a dict.
    [[nodiscard]] std::size_t size(Id id) const;
    // Value of the last entry whose key is the string `key` in dict `dict`.
    [[nodiscard]] std::optional<Id> find(Id dict, std::string_view key) const;

private:
    friend class Parser;
    static constexpr std::uint32_t kNoItems = 0xffffffffu;  // Node::ref of a container with no items yet
    static constexpr std::uint8_t kSummary = 1;              // Node::flags: payload is a ListSink summary
    static constexpr std::uint8_t kDirect = 2;               // Node::flags: payload indexes direct_
    struct Node {
        Kind kind = Kind::None;
        std::uint8_t flags = 0;
        std::uint16_t height = 0;  // nesting height as built (0 for scalars)
        std::uint32_t ref = 0;     // index into strings_ or containers_
        std::int64_t payload = 0;  // Int value, Bool 0/1, Float bits
    };
    std::vector<Node> nodes_;
    std::vector<std::string> strings_;
    std::vector<std::vector<Id>> containers_;
    std::vector<DirectDict> direct_;
    Id root_ = 0;
    int protocol_ = 0;
    std::size_t created_ = 0;
};

// Receives the items appended to the lists held by a top-level dict's list
// under `key` (see "Streaming" above).
class ListSink {
public:
    virtual ~ListSink() = default;
    // `items` were appended to list number `list_index` of dict[key]; the
    // sink reads them now (errors are thrown as InputError).
    virtual void items(const Document& doc, std::size_t list_index, std::span<const Document::Id> items) = 0;
    // A list the memo refers to is about to be freed: a summary the sink
    // made of it (a trace entry's top frame), kept in its place.
    virtual std::optional<std::int64_t> summary(Document::Id /*list*/) { return std::nullopt; }
    // Every node from id `from` on was freed; its ids will be reused.
    virtual void released(Document::Id /*from*/) {}
    // The parser is at byte `pos`: bytes before it are not read again.
    virtual void progress(std::size_t /*pos*/) {}
};

struct StreamSpec {
    std::string_view key;     // "device_traces"
    ListSink* sink = nullptr;
    // Filled by parse: whether any items went to the sink, and the nodes of
    // the dict[key] list they were appended under (the caller checks that
    // the final document holds that list at root[key]).
    bool claimed = false;
    Document::Id root = 0, list = 0;
    // Read trace entries of the common shape directly (see above).
    bool direct = true;
};

// Thrown by parse when a directly read entry is used otherwise (see above).
struct DirectFallback {};

// Parses one pickle from `data`. `origin` (a file name) starts every error
// message: "snapshot.pickle: unsupported pickle opcode GLOBAL at byte 2: ...".
// Bytes after STOP are ignored, as pickle.loads() does.
Result<Document> parse(std::string_view data, const std::string& origin, const Limits& limits = {});
Result<Document> parse(std::string_view data, const std::string& origin, const Limits& limits, StreamSpec& stream);

// "GLOBAL", "BININT1", ... or "0x.." for bytes that are no opcode.
std::string opcode_name(std::uint8_t op);

}  // namespace gpumem::sim::pickle
