// Plain-data pickle reader. Opcode values and semantics follow CPython's
// Lib/pickle.py (the opcode table and the _Unpickler load_* methods) and
// Lib/pickletools.py (argument encodings). Every read is bounds-checked; the
// parser is a loop over opcodes with explicit stacks, never recursive.
#include "gpumem/sim/pickle.hpp"
#include "gpumem/core/budget.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace gpumem::sim::pickle {

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::None: return "None";
        case Kind::Bool: return "a bool";
        case Kind::Int: return "an integer";
        case Kind::BigInt: return "an integer wider than 64 bits";
        case Kind::Float: return "a float";
        case Kind::String: return "a string";
        case Kind::Bytes: return "bytes";
        case Kind::List: return "a list";
        case Kind::Tuple: return "a tuple";
        case Kind::Dict: return "a dict";
        case Kind::Set: return "a set";
    }
    return "?";
}

double Document::as_float(Id id) const { return std::bit_cast<double>(nodes_[id].payload); }

std::span<const Document::Id> Document::items(Id id) const {
    const Node& n = nodes_[id];
    switch (n.kind) {
        case Kind::List:
        case Kind::Tuple:
        case Kind::Dict:
        case Kind::Set: return n.ref == kNoItems ? std::span<const Id>() : std::span<const Id>(containers_[n.ref]);
        default: return {};
    }
}

std::size_t Document::size(Id id) const {
    const auto s = items(id).size();
    return kind(id) == Kind::Dict ? s / 2 : s;
}

std::optional<Document::Id> Document::find(Id dict, std::string_view key) const {
    if (kind(dict) != Kind::Dict) return std::nullopt;
    const auto it = items(dict);
    for (std::size_t i = it.size(); i >= 2; i -= 2) {
        const Id k = it[i - 2];
        if (kind(k) == Kind::String && as_string(k) == key) return it[i - 1];
    }
    return std::nullopt;
}

namespace {

// Opcode bytes (Lib/pickle.py).
enum Op : std::uint8_t {
    MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I', BININT = 'J',
    BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R',
    STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a',
    BUILD = 'b', GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h',
    INST = 'i', LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q',
    LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
    PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86,
    TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b, BINBYTES = 'B',
    SHORT_BINBYTES = 'C', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f,
    ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
    BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};

struct OpName {
    std::uint8_t op;
    const char* name;
};
constexpr OpName kOpNames[] = {
    {MARK, "MARK"}, {STOP, "STOP"}, {POP, "POP"}, {POP_MARK, "POP_MARK"}, {DUP, "DUP"}, {FLOAT, "FLOAT"},
    {INT, "INT"}, {BININT, "BININT"}, {BININT1, "BININT1"}, {LONG, "LONG"}, {BININT2, "BININT2"},
    {NONE, "NONE"}, {PERSID, "PERSID"}, {BINPERSID, "BINPERSID"}, {REDUCE, "REDUCE"}, {STRING, "STRING"},
    {BINSTRING, "BINSTRING"}, {SHORT_BINSTRING, "SHORT_BINSTRING"}, {UNICODE, "UNICODE"},
    {BINUNICODE, "BINUNICODE"}, {APPEND, "APPEND"}, {BUILD, "BUILD"}, {GLOBAL, "GLOBAL"}, {DICT, "DICT"},
    {EMPTY_DICT, "EMPTY_DICT"}, {APPENDS, "APPENDS"}, {GET, "GET"}, {BINGET, "BINGET"}, {INST, "INST"},
    {LONG_BINGET, "LONG_BINGET"}, {LIST, "LIST"}, {EMPTY_LIST, "EMPTY_LIST"}, {OBJ, "OBJ"}, {PUT, "PUT"},
    {BINPUT, "BINPUT"}, {LONG_BINPUT, "LONG_BINPUT"}, {SETITEM, "SETITEM"}, {TUPLE, "TUPLE"},
    {EMPTY_TUPLE, "EMPTY_TUPLE"}, {SETITEMS, "SETITEMS"}, {BINFLOAT, "BINFLOAT"}, {PROTO, "PROTO"},
    {NEWOBJ, "NEWOBJ"}, {EXT1, "EXT1"}, {EXT2, "EXT2"}, {EXT4, "EXT4"}, {TUPLE1, "TUPLE1"},
    {TUPLE2, "TUPLE2"}, {TUPLE3, "TUPLE3"}, {NEWTRUE, "NEWTRUE"}, {NEWFALSE, "NEWFALSE"}, {LONG1, "LONG1"},
    {LONG4, "LONG4"}, {BINBYTES, "BINBYTES"}, {SHORT_BINBYTES, "SHORT_BINBYTES"},
    {SHORT_BINUNICODE, "SHORT_BINUNICODE"}, {BINUNICODE8, "BINUNICODE8"}, {BINBYTES8, "BINBYTES8"},
    {EMPTY_SET, "EMPTY_SET"}, {ADDITEMS, "ADDITEMS"}, {FROZENSET, "FROZENSET"}, {NEWOBJ_EX, "NEWOBJ_EX"},
    {STACK_GLOBAL, "STACK_GLOBAL"}, {MEMOIZE, "MEMOIZE"}, {FRAME, "FRAME"}, {BYTEARRAY8, "BYTEARRAY8"},
    {NEXT_BUFFER, "NEXT_BUFFER"}, {READONLY_BUFFER, "READONLY_BUFFER"},
};

}  // namespace

std::string opcode_name(std::uint8_t op) {
    for (const auto& o : kOpNames)
        if (o.op == op) return o.name;
    static const char* hex = "0123456789abcdef";
    return std::string("0x") + hex[op >> 4] + hex[op & 15];
}

class Parser {
public:
    using Id = Document::Id;
    using Node = Document::Node;
    struct MarkRec {
        std::size_t stack;                       // stack size at the MARK
        std::size_t nodes, strings, containers;  // arena sizes at the MARK
        std::size_t memolog;                     // memo_log_ size at the MARK
        Id min_ext;                              // smallest container extended since (kNoMemo: none)
        std::size_t direct = 0;                  // doc_.direct_ size at the MARK
    };

    Parser(std::string_view data, const std::string& origin, const Limits& limits, StreamSpec* stream = nullptr)
        : data_(data), origin_(origin), lim_(limits), stream_(stream && stream->sink ? stream : nullptr) {
        lim_.max_depth = std::clamp(lim_.max_depth, 1, 60000);
        direct_on_ = stream_ && stream_->direct;
    }

    Document run() {
        const std::size_t n = data_.size();
        while (true) {
            check_budget();  // the service's deadline (one load when none is set)
            if (pos_ >= n) truncated("the pickle has no STOP opcode");
            // Bytes behind are never read again (strings are copied): the
            // caller may drop them, whether or not entries were streamed.
            if (stream_ && pos_ - progress_pos_ >= (std::size_t(16) << 20)) {
                progress_pos_ = pos_;
                stream_->sink->progress(pos_);
            }
            op_pos_ = pos_;
            const std::uint8_t op = static_cast<std::uint8_t>(data_[pos_++]);
            switch (op) {
                case PROTO: {
                    const std::uint8_t v = u8();
                    if (v > 5) malformed("pickle protocol " + std::to_string(v) + " is newer than 5");
                    doc_.protocol_ = v;
                    break;
                }
                case FRAME: {
                    const std::uint64_t len = uint_le(8);
                    if (len > n - pos_)
                        truncated("a FRAME at byte " + std::to_string(op_pos_) + " declares " + std::to_string(len) +
                                  " bytes");
                    break;
                }
                case STOP: {
                    if (avail() < 1) malformed("STOP with an empty stack");
                    if (doc_.nodes_[stack_.back()].flags & Document::kDirect) throw DirectFallback{};
                    doc_.root_ = stack_.back();
                    return std::move(doc_);
                }
                case MARK:
                    if (marks_.size() >= static_cast<std::size_t>(lim_.max_depth)) too_deep();
                    marks_.push_back(MarkRec{stack_.size(), doc_.nodes_.size(), doc_.strings_.size(), doc_.containers_.size(),
                                             memo_log_.size(), kNoMemo, doc_.direct_.size()});
                    break;
                case POP:
                    if (avail() > 0) stack_.pop_back();
                    else pop_mark();
                    break;
                case POP_MARK: pop_mark(); break;
                case DUP:
                    need_stack(1);
                    push(stack_.back());
                    break;

                // Memo.
                case PUT: memo_put(parse_index_line()); break;
                case BINPUT: memo_put(u8()); break;
                case LONG_BINPUT: memo_put(static_cast<std::uint32_t>(uint_le(4))); break;
                case MEMOIZE: memo_put(static_cast<std::uint64_t>(memo_count_)); break;
                case GET: memo_get(parse_index_line()); break;
                case BINGET: memo_get(u8()); break;
                case LONG_BINGET: memo_get(static_cast<std::uint32_t>(uint_le(4))); break;

                // Scalars.
                case NONE: push(make(Kind::None, 0)); break;
                case NEWTRUE: push(make(Kind::Bool, 1)); break;
                case NEWFALSE: push(make(Kind::Bool, 0)); break;
                case BININT: push(make(Kind::Int, static_cast<std::int32_t>(static_cast<std::uint32_t>(uint_le(4))))); break;
                case BININT1: push(make(Kind::Int, u8())); break;
                case BININT2: push(make(Kind::Int, static_cast<std::int64_t>(uint_le(2)))); break;
                case LONG1: long_bytes(u8()); break;
                case LONG4: {
                    const auto len = static_cast<std::int32_t>(static_cast<std::uint32_t>(uint_le(4)));
                    if (len < 0) malformed("LONG4 with a negative length");
                    long_bytes(static_cast<std::size_t>(len));
                    break;
                }
                case BINFLOAT: {
                    const std::uint64_t be = uint_be(8);
                    push(make(Kind::Float, std::bit_cast<std::int64_t>(be)));
                    break;
                }
                case INT: text_int(/*is_long=*/false); break;
                case LONG: text_int(/*is_long=*/true); break;
                case FLOAT: text_float(); break;

                // Strings and bytes.
                case SHORT_BINUNICODE: push_string(Kind::String, u8()); break;
                case BINUNICODE: push_string(Kind::String, uint_le(4)); break;
                case BINUNICODE8: push_string(Kind::String, uint_le(8)); break;
                case SHORT_BINSTRING: push_string(Kind::String, u8()); break;
                case BINSTRING: {
                    const auto len = static_cast<std::int32_t>(static_cast<std::uint32_t>(uint_le(4)));
                    if (len < 0) malformed("BINSTRING with a negative length");
                    push_string(Kind::String, static_cast<std::uint64_t>(len));
                    break;
                }
                case SHORT_BINBYTES: push_string(Kind::Bytes, u8()); break;
                case BINBYTES: push_string(Kind::Bytes, uint_le(4)); break;
                case BINBYTES8:
                case BYTEARRAY8: push_string(Kind::Bytes, uint_le(8)); break;

                // Containers.
                case EMPTY_DICT:
                    if (direct_on_ && direct_entry()) break;
                    push(make_container(Kind::Dict, {}));
                    break;
                case EMPTY_LIST: push(make_container(Kind::List, {})); break;
                case EMPTY_TUPLE: push(make_container(Kind::Tuple, {})); break;
                case EMPTY_SET: push(make_container(Kind::Set, {})); break;
                case TUPLE1:
                case TUPLE2:
                case TUPLE3: {
                    const std::size_t k = op == TUPLE1 ? 1 : (op == TUPLE2 ? 2 : 3);
                    need_stack(k);
                    std::vector<Id> items(stack_.end() - static_cast<std::ptrdiff_t>(k), stack_.end());
                    stack_.resize(stack_.size() - k);
                    push(make_container(Kind::Tuple, std::move(items)));
                    break;
                }
                case TUPLE: push(make_container(Kind::Tuple, pop_mark())); break;
                case LIST: push(make_container(Kind::List, pop_mark())); break;
                case FROZENSET: push(make_container(Kind::Set, pop_mark())); break;
                case DICT: {
                    auto items = pop_mark();
                    if (items.size() % 2) malformed("DICT with an odd number of items");
                    check_keys(items);
                    push(make_container(Kind::Dict, std::move(items)));
                    break;
                }
                case APPEND: {
                    need_stack(2);
                    const Id v = stack_.back();
                    stack_.pop_back();
                    if (!claim({&v, 1}, stack_.size() - 1, nullptr)) extend(stack_.back(), Kind::List, {&v, 1});
                    break;
                }
                case APPENDS: {
                    // The items stay on the stack while they are used (no copy).
                    const auto items = mark_items();
                    const std::size_t k = last_mark_.stack;
                    if (k - (marks_.empty() ? 0 : marks_.back().stack) < 1)
                        malformed("stack underflow (needs 1 values above the last MARK)");
                    const MarkRec rec = last_mark_;
                    if (!claim(items, k - 1, &rec)) extend(stack_[k - 1], Kind::List, items);
                    stack_.resize(k);
                    break;
                }
                case ADDITEMS: {
                    auto items = pop_mark();
                    need_stack(1);
                    extend(stack_.back(), Kind::Set, items);
                    break;
                }
                case SETITEM: {
                    need_stack(3);
                    const Id kv[2] = {stack_[stack_.size() - 2], stack_.back()};
                    stack_.resize(stack_.size() - 2);
                    check_keys({kv, 2});
                    extend(stack_.back(), Kind::Dict, {kv, 2});
                    break;
                }
                case SETITEMS: {
                    const auto items = mark_items();
                    const std::size_t k = last_mark_.stack;
                    if (items.size() % 2) malformed("SETITEMS with an odd number of items");
                    if (k - (marks_.empty() ? 0 : marks_.back().stack) < 1)
                        malformed("stack underflow (needs 1 values above the last MARK)");
                    check_keys(items);
                    extend(stack_[k - 1], Kind::Dict, items);
                    stack_.resize(k);
                    break;
                }

                // Everything that names, builds or calls Python objects.
                case GLOBAL:
                case STACK_GLOBAL:
                case REDUCE:
                case BUILD:
                case NEWOBJ:
                case NEWOBJ_EX:
                case INST:
                case OBJ:
                case PERSID:
                case BINPERSID:
                case EXT1:
                case EXT2:
                case EXT4:
                case NEXT_BUFFER:
                case READONLY_BUFFER:
                    fail_at(ErrorCode::Unsupported,
                            "unsupported pickle opcode " + opcode_name(op) + " at byte " + std::to_string(op_pos_) +
                                ": gpumem reads only plain data (dicts, lists, numbers, strings)");
                case STRING:
                case UNICODE:
                    fail_at(ErrorCode::Unsupported,
                            "unsupported pickle opcode " + opcode_name(op) + " at byte " + std::to_string(op_pos_) +
                                ": protocol-0 text strings are not read; write the snapshot with protocol 2 or newer");
                default:
                    malformed("unknown pickle opcode " + opcode_name(op) + " at byte " + std::to_string(op_pos_),
                              /*with_pos=*/false);
            }
        }
    }

private:
    // --- errors -------------------------------------------------------------
    [[noreturn]] void fail_at(ErrorCode code, const std::string& what) {
        fail(code, origin_, origin_ + ": " + what);
    }
    [[noreturn]] void malformed(const std::string& what, bool with_pos = true) {
        fail_at(ErrorCode::ParseError,
                with_pos ? "malformed pickle at byte " + std::to_string(op_pos_) + " (" + opcode_name(op_byte()) +
                               "): " + what
                         : what);
    }
    [[noreturn]] void truncated(const std::string& why) {
        fail_at(ErrorCode::ParseError, "truncated at byte " + std::to_string(data_.size()) + ": " + why +
                                           "; the file is incomplete (was the dump interrupted?)");
    }
    [[noreturn]] void too_deep() {
        fail_at(ErrorCode::ParseError, "nesting deeper than " + std::to_string(lim_.max_depth) + " levels at byte " +
                                           std::to_string(op_pos_) + "; not a memory snapshot");
    }
    std::uint8_t op_byte() const { return static_cast<std::uint8_t>(data_[op_pos_]); }

    // --- input --------------------------------------------------------------
    void need_bytes(std::uint64_t k) {
        if (k > data_.size() - pos_)
            truncated("opcode " + opcode_name(op_byte()) + " at byte " + std::to_string(op_pos_) + " needs " +
                      std::to_string(k) + " more bytes");
    }
    std::uint8_t u8() {
        need_bytes(1);
        return static_cast<std::uint8_t>(data_[pos_++]);
    }
    std::uint64_t uint_le(int k) {
        need_bytes(static_cast<std::uint64_t>(k));
        std::uint64_t v = 0;
        for (int i = 0; i < k; ++i) v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(data_[pos_ + static_cast<std::size_t>(i)])) << (8 * i);
        pos_ += static_cast<std::size_t>(k);
        return v;
    }
    std::uint64_t uint_be(int k) {
        need_bytes(static_cast<std::uint64_t>(k));
        std::uint64_t v = 0;
        for (int i = 0; i < k; ++i) v = (v << 8) | static_cast<std::uint8_t>(data_[pos_ + static_cast<std::size_t>(i)]);
        pos_ += static_cast<std::size_t>(k);
        return v;
    }
    // A text argument ending in '\n' (protocol 0); at most 4096 bytes.
    std::string_view line() {
        constexpr std::size_t max_len = 4096;
        const std::string_view rest = data_.substr(pos_, max_len + 1);
        const auto nl = rest.find('\n');
        if (nl == std::string_view::npos) {
            if (rest.size() <= max_len)
                truncated("opcode " + opcode_name(op_byte()) + " at byte " + std::to_string(op_pos_) + " has no end of line");
            malformed("text argument longer than 4096 bytes");
        }
        pos_ += nl + 1;
        return rest.substr(0, nl);
    }

    // --- nodes --------------------------------------------------------------
    Id new_node(Node node) {
        if (doc_.created_ >= lim_.max_nodes || doc_.nodes_.size() >= kConsumed)
            malformed("more than " + std::to_string(lim_.max_nodes) + " values");
        ++doc_.created_;
        doc_.nodes_.push_back(node);
        check_bytes();
        return static_cast<Id>(doc_.nodes_.size() - 1);
    }
    Id make(Kind k, std::int64_t payload) {
        Node node;
        node.kind = k;
        node.payload = payload;
        return new_node(node);
    }
    Id make_container(Kind k, std::vector<Id> items) {
        if (items.size() > lim_.max_container) malformed("a container with more than " + std::to_string(lim_.max_container) + " items");
        if (doc_.containers_.size() >= std::numeric_limits<std::uint32_t>::max()) malformed("too many containers");
        int h = 0;
        for (Id c : items) {
            h = std::max(h, doc_.nodes_[c].height + 1);
            if (doc_.nodes_[c].flags & Document::kDirect) throw DirectFallback{};
        }
        if (h > lim_.max_depth) too_deep();
        Node node;
        node.kind = k;
        node.height = static_cast<std::uint16_t>(h);
        if (items.empty()) {
            // An empty container takes no item list until something is added
            // (a file of EMPTY_DICT opcodes costs a node per byte, no more).
            node.ref = Document::kNoItems;
            return new_node(node);
        }
        node.ref = static_cast<std::uint32_t>(doc_.containers_.size());
        const Id id = new_node(node);
        payload_ += items.size() * sizeof(Id);
        doc_.containers_.push_back(std::move(items));
        check_bytes();
        return id;
    }
    void push_string(Kind k, std::uint64_t len) {
        need_bytes(len);
        if (len > lim_.max_string) malformed("a string of " + std::to_string(len) + " bytes (limit " + std::to_string(lim_.max_string) + ")");
        if (doc_.strings_.size() >= std::numeric_limits<std::uint32_t>::max()) malformed("too many strings");
        Node node;
        node.kind = k;
        node.ref = static_cast<std::uint32_t>(doc_.strings_.size());
        const Id id = new_node(node);
        payload_ += static_cast<std::size_t>(len);
        if (len >= 65536) check_bytes_now();
        else check_bytes();
        doc_.strings_.emplace_back(data_.substr(pos_, static_cast<std::size_t>(len)));
        pos_ += static_cast<std::size_t>(len);
        push(id);
    }
    // LONG1 / LONG4: little-endian two's complement, `len` bytes.
    void long_bytes(std::size_t len) {
        need_bytes(len);
        if (len <= 8) {
            std::uint64_t v = 0;
            for (std::size_t i = 0; i < len; ++i)
                v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(data_[pos_ + i])) << (8 * i);
            if (len > 0 && len < 8 && (static_cast<std::uint8_t>(data_[pos_ + len - 1]) & 0x80))
                v |= ~std::uint64_t(0) << (8 * len);  // sign-extend
            pos_ += len;
            push(make(Kind::Int, static_cast<std::int64_t>(v)));
            return;
        }
        // Wider: still an int64 when the extra bytes only extend the sign.
        const std::uint8_t sign = (static_cast<std::uint8_t>(data_[pos_ + len - 1]) & 0x80) ? 0xff : 0x00;
        bool fits = (static_cast<std::uint8_t>(data_[pos_ + 7]) & 0x80) == (sign & 0x80);
        for (std::size_t i = 8; i < len && fits; ++i) fits = static_cast<std::uint8_t>(data_[pos_ + i]) == sign;
        if (fits) {
            std::uint64_t v = 0;
            for (std::size_t i = 0; i < 8; ++i)
                v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(data_[pos_ + i])) << (8 * i);
            pos_ += len;
            push(make(Kind::Int, static_cast<std::int64_t>(v)));
            return;
        }
        push_string(Kind::BigInt, len);
    }
    void text_int(bool is_long) {
        std::string_view s = line();
        if (!is_long && s == "00") return push(make(Kind::Bool, 0));
        if (!is_long && s == "01") return push(make(Kind::Bool, 1));
        if (is_long && !s.empty() && s.back() == 'L') s.remove_suffix(1);
        if (!s.empty() && s.front() == '+') s.remove_prefix(1);
        std::int64_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range) return push_big_decimal();
        if (ec != std::errc() || p != s.data() + s.size() || s.empty()) malformed("not an integer: \"" + printable(s) + "\"");
        push(make(Kind::Int, v));
    }
    void push_big_decimal() {
        // Kept as an opaque wide integer; the bytes are irrelevant to consumers.
        Node node;
        node.kind = Kind::BigInt;
        node.ref = static_cast<std::uint32_t>(doc_.strings_.size());
        const Id id = new_node(node);
        doc_.strings_.emplace_back();
        push(id);
    }
    void text_float() {
        const std::string_view s = line();
        double v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || s.empty()) malformed("not a float: \"" + printable(s) + "\"");
        push(make(Kind::Float, std::bit_cast<std::int64_t>(v)));
    }
    static std::string printable(std::string_view s) {
        std::string o;
        for (char c : s.substr(0, 40)) o += (c >= 0x20 && c < 0x7f) ? c : '?';
        return o;
    }

    // --- stack --------------------------------------------------------------
    std::size_t avail() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back().stack); }
    void need_stack(std::size_t k) {
        if (avail() < k) malformed("stack underflow (needs " + std::to_string(k) + " values above the last MARK)");
    }
    void push(Id id) {
        if (stack_.size() >= lim_.max_container) malformed("stack deeper than " + std::to_string(lim_.max_container));
        if (stack_.size() == stack_.capacity()) {
            stack_.reserve(2 * stack_.size() + 16);
            check_bytes_now();
        }
        stack_.push_back(id);
    }

    // --- memory -------------------------------------------------------------
    // What the document and the parser's own tables hold: vector capacities
    // (what the process really keeps, freed nodes' slots included), string
    // bytes and container items (payload_), the memo and the stack. Checked
    // at every growth against Limits::max_bytes, so that no input, whatever
    // its shape, makes the reader hold more than that.
    [[nodiscard]] std::size_t held_bytes() const {
        return doc_.nodes_.capacity() * sizeof(Node) + doc_.strings_.capacity() * sizeof(std::string) +
               doc_.direct_.capacity() * sizeof(Document::DirectDict) +
               doc_.containers_.capacity() * sizeof(std::vector<Id>) + payload_ + memo_dense_.capacity() * sizeof(Id) +
               memo_sparse_.size() * 48 + memo_log_.capacity() * sizeof(std::uint64_t) + stack_.capacity() * sizeof(Id) +
               marks_.capacity() * sizeof(MarkRec);
    }
    // Every 256th growth, or now: between two checks the held bytes grow by
    // at most 256 nodes' worth (strings of 64 KiB or more and table
    // reallocations are checked at once).
    void check_bytes() {
        if ((++growths_ & 255u) == 0) check_bytes_now();
    }
    void check_bytes_now() {
        if (held_bytes() <= lim_.max_bytes) return;
        fail_at(ErrorCode::ParseError,
                "reading it needs more than " + std::to_string(lim_.max_bytes >> 20) + " MiB of memory at byte " +
                    std::to_string(op_pos_) + (stream_ ? " for the values outside the streamed " + std::string(stream_->key) + " entries" : "") +
                    " (gpumem's limit for one pickle; a memory snapshot's segments and shared frames need far less)");
    }
    // The items above the last MARK, left on the stack (the caller resizes
    // it to last_mark_.stack when done); the MARK is popped.
    std::span<const Id> mark_items() {
        if (marks_.empty()) malformed("no MARK to pop to");
        last_mark_ = marks_.back();
        marks_.pop_back();
        if (!marks_.empty()) marks_.back().min_ext = std::min(marks_.back().min_ext, last_mark_.min_ext);
        return {stack_.data() + last_mark_.stack, stack_.size() - last_mark_.stack};
    }
    std::vector<Id> pop_mark() {
        if (marks_.empty()) malformed("no MARK to pop to");
        last_mark_ = marks_.back();
        const std::size_t k = last_mark_.stack;
        marks_.pop_back();
        if (!marks_.empty()) marks_.back().min_ext = std::min(marks_.back().min_ext, last_mark_.min_ext);
        std::vector<Id> items(stack_.begin() + static_cast<std::ptrdiff_t>(k), stack_.end());
        stack_.resize(k);
        return items;
    }
    void check_keys(std::span<const Id> kv) {
        for (std::size_t i = 0; i < kv.size(); i += 2) {
            const Kind k = doc_.nodes_[kv[i]].kind;
            if (k == Kind::List || k == Kind::Dict || k == Kind::Set) malformed(std::string("a dict key that is ") + kind_name(k));
        }
    }
    void extend(Id target, Kind want, std::span<const Id> items) {
        if (!marks_.empty()) marks_.back().min_ext = std::min(marks_.back().min_ext, target);
        Node& t = doc_.nodes_[target];
        if (t.flags & Document::kDirect) throw DirectFallback{};
        if (t.kind != want)
            malformed(std::string("adds items to ") + kind_name(t.kind) + ", expected " + kind_name(want));
        if (items.empty()) return;
        if (t.ref == Document::kNoItems) {
            if (doc_.containers_.size() >= std::numeric_limits<std::uint32_t>::max() - 1) malformed("too many containers");
            t.ref = static_cast<std::uint32_t>(doc_.containers_.size());
            doc_.containers_.emplace_back();
        }
        auto& c = doc_.containers_[t.ref];
        if (items.size() > lim_.max_container - c.size())
            malformed("a container with more than " + std::to_string(lim_.max_container) + " items");
        int h = t.height;
        for (Id id : items) {
            h = std::max(h, doc_.nodes_[id].height + 1);
            if (doc_.nodes_[id].flags & Document::kDirect) throw DirectFallback{};
        }
        if (h > lim_.max_depth) too_deep();
        t.height = static_cast<std::uint16_t>(h);
        payload_ += items.size() * sizeof(Id);
        check_bytes();
        c.insert(c.end(), items.begin(), items.end());
    }

    // --- memo ---------------------------------------------------------------
    std::uint64_t parse_index_line() {
        const std::string_view s = line();
        std::uint64_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || s.empty()) malformed("not a memo index: \"" + printable(s) + "\"");
        return v;
    }
    // The memo: keys below memo_dense_.size() in a flat array (MEMOIZE and
    // the picklers' BINPUT number them 0, 1, 2, ...: 4 bytes each), any
    // other key in a map. A file of MEMOIZE opcodes costs 4 bytes per byte
    // read, not a hash node per byte.
    static constexpr Id kNoMemo = std::numeric_limits<Id>::max();  // never a node id (new_node stops below it)
    static constexpr Id kConsumed = kNoMemo - 1;  // a dict handed to the ListSink and freed
    static constexpr std::uint8_t kClaimed = 4;   // Node::flags, within release(): handed to the ListSink
    void memo_put(std::uint64_t key) {
        need_stack(1);
        const Id v = stack_.back();
        if (stream_) {
            const auto cap = memo_log_.capacity();
            memo_log_.push_back(key);
            if (memo_log_.capacity() != cap) check_bytes_now();
        }
        if (key < memo_dense_.size() && memo_dense_[key] != kNoMemo) {
            memo_dense_[key] = v;
            return;
        }
        if (auto it = memo_sparse_.find(key); it != memo_sparse_.end()) {
            it->second = v;
            return;
        }
        if (memo_count_ >= lim_.max_memo) malformed("more than " + std::to_string(lim_.max_memo) + " memo entries");
        ++memo_count_;
        // Dense while the array stays at most twice the number of entries.
        if (key < memo_dense_.size()) {
            memo_dense_[key] = v;
        } else if (key <= 2 * memo_count_ + 1024) {
            memo_dense_.resize(static_cast<std::size_t>(key) + 1, kNoMemo);
            memo_dense_[key] = v;
        } else {
            memo_sparse_.emplace(key, v);
        }
        check_bytes();
    }
    void memo_get(std::uint64_t key) {
        Id* v = memo_slot(key);
        if (!v) malformed("memo key " + std::to_string(key) + " was never stored");
        if (*v == kConsumed)
            malformed("memo key " + std::to_string(key) + " refers to a " + std::string(stream_->key) +
                      " entry that was already read; a snapshot never repeats one");
        push(*v);
    }
    Id* memo_slot(std::uint64_t key) {
        if (key < memo_dense_.size() && memo_dense_[key] != kNoMemo) return &memo_dense_[key];
        const auto it = memo_sparse_.find(key);
        return it == memo_sparse_.end() ? nullptr : &it->second;
    }

    // --- streaming ------------------------------------------------------------
    // `items` are being appended to the list on top of the stack. When that
    // list is dict[key][i] of the top-level dict (still being filled: the
    // stack holds root, MARK, ..., key, list-of-lists, MARK, ..., list), the
    // sink gets them instead of the list, and after a MARK ... APPENDS batch
    // (`rec` its MARK) the nodes made since the MARK are freed.
    bool claim(std::span<const Id> items, std::size_t p, const MarkRec* rec) {
        if (!stream_ || items.empty() || marks_.size() < 2) return false;
        const MarkRec& m1 = marks_.back();
        Id outer = 0;
        if (!stream_list_at(p, marks_[marks_.size() - 2], m1, outer)) return false;
        stream_->claimed = true;
        stream_->root = stack_[0];
        stream_->list = outer;
        stream_->sink->items(doc_, doc_.items(outer).size() + (p - m1.stack), items);
        if (rec) release(*rec, items);
        stream_->sink->progress(op_pos_);
        return true;
    }

    // Whether stack_[p] is a list that claim() hands to the sink: a list of
    // the top-level dict's StreamSpec::key list (the one claimed before, if
    // any) with no items of its own, m0 the MARK of the root dict's items and
    // m1 the MARK of the list of lists' items; `outer` gets that list.
    bool stream_list_at(std::size_t p, const MarkRec& m0, const MarkRec& m1, Id& outer) {
        const Node& ln = doc_.nodes_[stack_[p]];
        if (ln.kind != Kind::List || ln.ref != Document::kNoItems || ln.flags) return false;
        if (m0.stack != 1 || doc_.nodes_[stack_[0]].kind != Kind::Dict) return false;
        if (m1.stack < m0.stack + 2 || (m1.stack - 1 - m0.stack) % 2 != 1 || p < m1.stack) return false;
        outer = stack_[m1.stack - 1];
        if (doc_.nodes_[outer].kind != Kind::List) return false;
        const Id key = stack_[m1.stack - 2];
        if (key != stream_key_) {
            if (doc_.nodes_[key].kind != Kind::String || doc_.as_string(key) != stream_->key) return false;
            stream_key_ = key;  // (compared once: every batch of a trace sits under it)
        }
        return !stream_->claimed || (stream_->root == stack_[0] && stream_->list == outer);
    }

    // --- trace entries read directly (pickle.hpp: "Streamed trace entries
    // of the common shape") ----------------------------------------------------
    enum Field : int { kAction, kAddr, kSize, kStream, kTime, kFree, kFrames };
    // The items run() would have held for the dict: a key and a value per field.
    static std::size_t direct_items(const Document::DirectDict& d) {
        std::size_t n = 0;
        for (std::uint8_t h = d.has; h; h &= static_cast<std::uint8_t>(h - 1)) ++n;  // (no popcount instruction in the baseline x86-64)
        return 2 * n;
    }
    int key_field(Id k) {
        for (const KeyField& c : key_cache_)
            if (c.id == k) return c.field;
        static constexpr std::string_view kNames[] = {"action", "addr", "size", "stream", "time_us", "device_free", "frames"};
        const std::string_view s = doc_.as_string(k);
        int f = -1;
        for (int i = 0; i < 7; ++i)
            if (s == kNames[i]) f = i;
        key_cache_[key_next_++ % key_cache_.size()] = KeyField{k, f};
        return f;
    }
    [[nodiscard]] std::uint8_t byte_at(std::size_t q) const { return static_cast<std::uint8_t>(data_[q]); }
    [[nodiscard]] std::uint64_t le_at(std::size_t q, std::size_t k) const {
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < k; ++i) v |= static_cast<std::uint64_t>(byte_at(q + i)) << (8 * i);
        return v;
    }
    // The node a BINGET or LONG_BINGET at q refers to (q moves past it);
    // kNoMemo for any other opcode, a key never stored or a consumed entry.
    // (Not an optional: returned through the stack, its two parts stalled
    // the load that read them back, a tenth of reading a pickled trace.)
    Id direct_get(std::size_t& q) {
        const std::size_t n = data_.size();
        std::uint64_t key = 0;
        if (byte_at(q) == BINGET) {
            if (n - q < 2) return kNoMemo;
            key = byte_at(q + 1);
            q += 2;
        } else if (byte_at(q) == LONG_BINGET) {
            if (n - q < 5) return kNoMemo;
            key = le_at(q + 1, 4);
            q += 5;
        } else {
            return kNoMemo;
        }
        const Id* v = memo_slot(key);
        return !v || *v >= kConsumed ? kNoMemo : *v;
    }
    // An integer opcode at q as run() reads it (BININT, BININT1, BININT2,
    // LONG1 of at most 8 bytes); q moves past it.
    bool direct_int(std::size_t& q, std::int64_t& out) const {
        const std::size_t n = data_.size();
        switch (byte_at(q)) {
            case BININT:
                if (n - q < 5) return false;
                out = static_cast<std::int32_t>(static_cast<std::uint32_t>(le_at(q + 1, 4)));
                q += 5;
                return true;
            case BININT1:
                if (n - q < 2) return false;
                out = byte_at(q + 1);
                q += 2;
                return true;
            case BININT2:
                if (n - q < 3) return false;
                out = static_cast<std::int64_t>(le_at(q + 1, 2));
                q += 3;
                return true;
            case LONG1: {
                if (n - q < 2) return false;
                const std::size_t len = byte_at(q + 1);
                if (len > 8 || n - q - 2 < len) return false;
                std::uint64_t v = le_at(q + 2, len);
                if (len > 0 && len < 8 && (byte_at(q + 2 + len - 1) & 0x80)) v |= ~std::uint64_t(0) << (8 * len);
                out = static_cast<std::int64_t>(v);
                q += 2 + len;
                return true;
            }
            default: return false;
        }
    }
    // At an EMPTY_DICT (pos_ just past it): the trace entry it starts, read
    // directly when it has the common shape and sits where claim() would
    // hand it to the sink (its conditions, the MARK batch on top); false, with
    // nothing changed, otherwise. On success the parse is where run() would
    // be after the SETITEMS, with the same memo, stack, batch MARK and node
    // count, the dict a kDirect node.
    bool direct_entry() {
        if (!stream_->claimed || marks_.size() < 3 || marks_.size() >= static_cast<std::size_t>(lim_.max_depth)) return false;
        const MarkRec& batch = marks_.back();
        Id outer = 0;
        if (batch.stack < 1 || !stream_list_at(batch.stack - 1, marks_[marks_.size() - 3], marks_[marks_.size() - 2], outer)) return false;

        const std::size_t n = data_.size();
        std::size_t q = pos_;
        std::optional<std::uint64_t> memo_key;
        std::size_t memo_pos = 0;
        if (q < n && byte_at(q) == MEMOIZE) {
            memo_key = memo_count_, memo_pos = q, q += 1;
        } else if (q < n && byte_at(q) == BINPUT) {
            if (n - q < 2) return false;
            memo_key = byte_at(q + 1), memo_pos = q, q += 2;
        } else if (q < n && byte_at(q) == LONG_BINPUT) {
            if (n - q < 5) return false;
            memo_key = le_at(q + 1, 4), memo_pos = q, q += 5;
        }
        if (q >= n || byte_at(q) != MARK) return false;
        ++q;
        Document::DirectDict d;
        int height = 0;
        std::size_t ints = 0;
        while (true) {
            if (q >= n) return false;
            if (byte_at(q) == SETITEMS) {
                ++q;
                break;
            }
            const Id k = direct_get(q);
            if (k == kNoMemo || doc_.nodes_[k].kind != Kind::String) return false;
            const int f = key_field(k);
            if (f < 0 || ((d.has >> f) & 1u) || q >= n) return false;
            std::int64_t iv = 0;
            Id v = kNoMemo;  // a memo reference's node, or kNoMemo for an integer
            if (direct_int(q, iv)) {
                ++ints;
            } else if ((v = direct_get(q)) == kNoMemo || (doc_.nodes_[v].flags & Document::kDirect)) {
                return false;
            }
            const bool node = v != kNoMemo;
            switch (f) {
                case kAction:
                    if (!node || doc_.nodes_[v].kind != Kind::String) return false;
                    d.action = v;
                    break;
                case kFrames:
                    if (!node) return false;
                    d.frames = v;
                    break;
                case kAddr:
                case kSize:
                case kFree:
                    if (node || iv < 0) return false;
                    (f == kAddr ? d.addr : f == kSize ? d.size : d.device_free) = iv;
                    break;
                default:  // kStream, kTime
                    if (node) return false;
                    (f == kStream ? d.stream : d.time_us) = iv;
                    break;
            }
            d.has = static_cast<std::uint8_t>(d.has | (1u << f));
            height = std::max(height, (node ? doc_.nodes_[v].height : 0) + 1);
        }
        if (!(d.has & Document::DirectDict::kHasAction) || height > lim_.max_depth || direct_items(d) > lim_.max_container ||
            doc_.created_ + ints + 1 >= lim_.max_nodes)
            return false;
        check_budget();
        Node node;
        node.kind = Kind::Dict;
        node.flags = Document::kDirect;
        node.height = static_cast<std::uint16_t>(height);
        node.ref = Document::kNoItems;
        node.payload = static_cast<std::int64_t>(doc_.direct_.size());
        const Id id = new_node(node);
        doc_.created_ += ints;  // (the integer nodes run() makes: the sink's budget follows the count)
        doc_.direct_.push_back(d);
        payload_ += direct_items(d) * sizeof(Id);
        check_bytes();
        push(id);
        if (memo_key) {
            op_pos_ = memo_pos;
            memo_put(*memo_key);
        }
        marks_.back().min_ext = std::min(marks_.back().min_ext, id);
        pos_ = q;
        return true;
    }

    // Frees the nodes made since MARK `rec` (the batch just handed over)
    // unless an older container was changed meanwhile. Memo entries that
    // refer to them are kept valid: claimed dicts become kConsumed, lists
    // the sink summarized become summary nodes, anything else is copied.
    void release(const MarkRec& rec, std::span<const Id> items) {
        const auto W = static_cast<Id>(rec.nodes);
        if (rec.min_ext < W) return;
        // Everything made since the MARK leaves payload_; what survives is added back below.
        for (std::size_t k = rec.strings; k < doc_.strings_.size(); ++k) payload_ -= doc_.strings_[k].size();
        for (std::size_t k = rec.containers; k < doc_.containers_.size(); ++k) payload_ -= doc_.containers_[k].size() * sizeof(Id);
        for (std::size_t k = rec.direct; k < doc_.direct_.size(); ++k) payload_ -= direct_items(doc_.direct_[k]) * sizeof(Id);
        // The young items handed over, flagged (the flag goes with the nodes
        // freed below; a copy drops it).
        for (Id i : items)
            if (i >= W) doc_.nodes_[i].flags |= kClaimed;
        std::unordered_map<Id, Id> moved;  // young id -> its id after the release
        std::vector<Node> nodes;
        std::vector<std::string> strings;
        std::vector<std::vector<Id>> containers;
        std::vector<Id*> fix;  // memo slots to point at moved nodes
        std::vector<Id> todo;
        auto copy = [&](Id x) {
            const auto it = moved.find(x);
            if (it != moved.end()) return;
            const auto nid = static_cast<Id>(W + nodes.size());
            moved.emplace(x, nid);
            Node n = doc_.nodes_[x];
            if (n.flags & Document::kDirect) throw DirectFallback{};
            n.flags = static_cast<std::uint8_t>(n.flags & ~kClaimed);
            if (n.kind == Kind::String || n.kind == Kind::Bytes || n.kind == Kind::BigInt) {
                strings.push_back(std::move(doc_.strings_[n.ref]));
                n.ref = static_cast<std::uint32_t>(rec.strings + strings.size() - 1);
            } else if (n.ref != Document::kNoItems &&
                       (n.kind == Kind::List || n.kind == Kind::Tuple || n.kind == Kind::Dict || n.kind == Kind::Set)) {
                containers.push_back(std::move(doc_.containers_[n.ref]));
                n.ref = static_cast<std::uint32_t>(rec.containers + containers.size() - 1);
                for (Id c : containers.back())
                    if (c >= W) todo.push_back(c);
            }
            nodes.push_back(n);
        };
        for (std::size_t k = rec.memolog; k < memo_log_.size(); ++k) {
            Id* slot = memo_slot(memo_log_[k]);
            if (!slot || *slot >= kConsumed || *slot < W) continue;
            const Id v = *slot;
            if (doc_.nodes_[v].flags & kClaimed) {
                *slot = kConsumed;
                continue;
            }
            fix.push_back(slot);
            if (moved.count(v)) continue;
            const Node& n = doc_.nodes_[v];
            if (n.kind == Kind::List && !n.flags) {
                if (const auto sum = stream_->sink->summary(v)) {
                    Node c;
                    c.kind = Kind::List;
                    c.flags = Document::kSummary;
                    c.height = n.height;
                    c.ref = Document::kNoItems;
                    c.payload = *sum;
                    moved.emplace(v, static_cast<Id>(W + nodes.size()));
                    nodes.push_back(c);
                    continue;
                }
            }
            todo.push_back(v);
            while (!todo.empty()) {
                const Id x = todo.back();
                todo.pop_back();
                copy(x);
            }
        }
        for (auto& c : containers)
            for (Id& i : c)
                if (i >= W) i = moved.at(i);
        for (Id* slot : fix) *slot = moved.at(*slot);
        for (const auto& x : strings) payload_ += x.size();
        for (const auto& x : containers) payload_ += x.size() * sizeof(Id);
        memo_log_.resize(rec.memolog);
        doc_.nodes_.resize(W);
        doc_.strings_.resize(rec.strings);
        doc_.containers_.resize(rec.containers);
        doc_.direct_.resize(rec.direct);
        for (auto& k : key_cache_)
            if (k.id >= W) k = KeyField{};
        if (stream_key_ >= W) stream_key_ = kNoMemo;
        doc_.nodes_.insert(doc_.nodes_.end(), nodes.begin(), nodes.end());
        for (auto& x : strings) doc_.strings_.push_back(std::move(x));
        for (auto& x : containers) doc_.containers_.push_back(std::move(x));
        stream_->sink->released(W);
    }

    std::string_view data_;
    const std::string& origin_;
    Limits lim_;
    std::size_t pos_ = 0;
    std::size_t op_pos_ = 0;
    StreamSpec* stream_;
    std::vector<Id> stack_;
    std::vector<MarkRec> marks_;
    MarkRec last_mark_{};
    std::size_t progress_pos_ = 0;  // where the sink was last told the position
    std::vector<std::uint64_t> memo_log_;  // memo keys stored (streaming only)
    std::vector<Id> memo_dense_;
    std::unordered_map<std::uint64_t, Id> memo_sparse_;
    std::size_t memo_count_ = 0;
    std::size_t payload_ = 0;     // string bytes and container items (4 bytes each) held
    std::uint32_t growths_ = 0;   // check_bytes() calls
    bool direct_on_ = false;
    // Which field of a trace entry a key string node names (-1: none), for
    // the few key nodes a trace uses; ids freed by a release are dropped.
    struct KeyField {
        Id id = kNoMemo;
        int field = -1;
    };
    std::array<KeyField, 8> key_cache_{};
    Id stream_key_ = kNoMemo;  // the string node found to be StreamSpec::key
    std::size_t key_next_ = 0;
    Document doc_;
};

Result<Document> parse(std::string_view data, const std::string& origin, const Limits& limits) {
    StreamSpec none;
    return parse(data, origin, limits, none);
}

Result<Document> parse(std::string_view data, const std::string& origin, const Limits& limits, StreamSpec& stream) {
    return capture([&]() -> Result<Document> {
        try {
            Parser p(data, origin, limits, &stream);
            return p.run();
        } catch (const std::bad_alloc&) {
            return Error{ErrorCode::ParseError, origin + ": out of memory while reading the pickle", origin};
        } catch (const std::length_error&) {
            return Error{ErrorCode::ParseError, origin + ": out of memory while reading the pickle", origin};
        }
    });
}

}  // namespace gpumem::sim::pickle
