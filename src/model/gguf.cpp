// src/model/gguf.cpp — GGUF header reader (never reads tensor data).
//
// Follows gguf_init_from_file_impl in ggml/src/gguf.cpp at llama.cpp commit
// a95a11e5b834 (docs/research/llamacpp.md §1): the same fields in the same
// order and the same checks, plus bounds that keep a hostile file from making
// this reader allocate or loop beyond what the file's bytes can hold. All
// integers are read byte-wise as little-endian, so the reader is portable.
#include "gpumem/model/gguf.hpp"
#include "gpumem/core/budget.hpp"
#include "gpumem/core/input.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_map>

namespace gpumem {

namespace {

// ggml types: ggml/src/ggml.c type_traits[] (blck_size, type_size, type_name)
// @a95a11e5b834, checked against the static_asserts of ggml/src/ggml-common.h;
// the ggml.c line of each entry is in docs/research/llamacpp.md §1.
constexpr std::array<GgmlType, 34> kGgmlTypes{{
    {0, "f32", 1, 4},          // ggml.c:650
    {1, "f16", 1, 2},          // ggml.c:656
    {2, "q4_0", 32, 18},       // ggml.c:672
    {3, "q4_1", 32, 20},       // ggml.c:680
    // 4 (Q4_2) and 5 (Q4_3) were removed: blck_size 0, gguf.cpp rejects them.
    {6, "q5_0", 32, 22},       // ggml.c:700
    {7, "q5_1", 32, 24},       // ggml.c:708
    {8, "q8_0", 32, 34},       // ggml.c:716
    // Q8_1 is the dot-product partner of Q4_1/Q5_1 and not in the research
    // table; gguf.cpp accepts it. block_q8_1 (ggml-common.h): 2 halves + 32 int8.
    {9, "q8_1", 32, 36},
    {10, "q2_K", 256, 84},     // ggml.c:747
    {11, "q3_K", 256, 110},    // ggml.c:755
    {12, "q4_K", 256, 144},    // ggml.c:763
    {13, "q5_K", 256, 176},    // ggml.c:771
    {14, "q6_K", 256, 210},    // ggml.c:779
    {15, "q8_K", 256, 292},    // ggml.c:859
    {16, "iq2_xxs", 256, 66},  // ggml.c:787
    {17, "iq2_xs", 256, 74},   // ggml.c:795
    {18, "iq3_xxs", 256, 98},  // ggml.c:803
    {19, "iq1_s", 256, 50},    // ggml.c:827
    {20, "iq4_nl", 32, 18},    // ggml.c:843
    {21, "iq3_s", 256, 110},   // ggml.c:811
    {22, "iq2_s", 256, 82},    // ggml.c:819
    {23, "iq4_xs", 256, 136},  // ggml.c:851
    {24, "i8", 1, 1},
    {25, "i16", 1, 2},
    {26, "i32", 1, 4},
    {27, "i64", 1, 8},
    {28, "f64", 1, 8},
    {29, "iq1_m", 256, 56},    // ggml.c:835
    {30, "bf16", 1, 2},        // ggml.c:865
    // 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) were removed: blck_size 0.
    {34, "tq1_0", 256, 54},    // ggml.c:891
    {35, "tq2_0", 256, 66},    // ggml.c:899
    // 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were removed: blck_size 0.
    {39, "mxfp4", 32, 17},     // ggml.c:731
    {40, "nvfp4", 64, 36},
    {41, "q1_0", 128, 18},
}};

// GGUF metadata value types, ggml/include/gguf.h:54-66.
enum GgufValueType : std::int32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,  // 1 byte
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
};

const char* value_type_name(std::int32_t t) {
    switch (t) {
        case kU8: return "uint8";
        case kI8: return "int8";
        case kU16: return "uint16";
        case kI16: return "int16";
        case kU32: return "uint32";
        case kI32: return "int32";
        case kF32: return "float32";
        case kBool: return "bool";
        case kString: return "string";
        case kArray: return "array";
        case kU64: return "uint64";
        case kI64: return "int64";
        case kF64: return "float64";
        default: return "unknown";
    }
}

// Bytes of a fixed-size value type; 0 for string, array and unknown types.
std::int64_t value_type_size(std::int32_t t) {
    switch (t) {
        case kU8: case kI8: case kBool: return 1;
        case kU16: case kI16: return 2;
        case kU32: case kI32: case kF32: return 4;
        case kU64: case kI64: case kF64: return 8;
        default: return 0;
    }
}

bool is_integer_type(std::int32_t t) { return value_type_size(t) > 0 && t != kF32 && t != kF64; }

constexpr std::uint32_t kVersion = 3;                      // gguf.h:42 GGUF_VERSION
constexpr std::uint64_t kMaxTensorName = 64;               // ggml.h GGML_MAX_NAME: names are < 64 bytes (gguf.cpp)
constexpr std::int64_t kMaxCount = 1000000;                // our cap on n_tensors and n_kv
constexpr std::int64_t kMinTensorInfo = 24;                // name length 8 + n_dims 4 + type 4 + offset 8
constexpr std::int64_t kMinKv = 12;                        // key length 8 + value type 4
constexpr std::uint64_t kMaxString = 64ULL << 20;          // our cap on any one string (64 MiB)
constexpr std::uint64_t kKeepString = 1ULL << 20;          // string values kept up to 1 MiB
constexpr std::uint64_t kMaxStringArray = 1ULL << 24;      // our cap on string-array elements (16 Mi)
constexpr std::uint64_t kKeepIntArray = 4096;              // integer arrays kept up to this many elements
constexpr std::int64_t kChunk = 1 << 20;                   // file read-ahead

const char* const kNotGguf = "the file is truncated or not a GGUF file";

[[noreturn]] void bad_model(const std::string& msg) { fail(ErrorCode::InvalidArgument, "model", msg); }

// A key or tensor name for a message: quoted, non-printable bytes as \xNN,
// cut after 80 characters.
std::string quote_name(std::string_view s) {
    std::string out = "'";
    std::size_t n = 0;
    for (const char c : s) {
        if (++n > 80) {
            out += "...";
            break;
        }
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '\'' && c != '\\') {
            out += c;
        } else {
            static const char kHex[] = "0123456789abcdef";
            out += "\\x";
            out += kHex[u >> 4];
            out += kHex[u & 15];
        }
    }
    return out + "'";
}

std::string shape_str(const std::vector<std::int64_t>& ne) {
    std::string s = "[";
    for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// The bytes of a header: from memory, or from a file read ahead in chunks so
// that skipping a tokenizer array costs a seek, not a read.
class Input {
public:
    Input(std::string_view mem, std::int64_t limit) : mem_(mem), limit_(limit) {}
    Input(std::ifstream* file, std::int64_t limit, std::string origin)
        : file_(file), limit_(limit), origin_(std::move(origin)) {}

    [[nodiscard]] std::int64_t pos() const { return pos_; }
    [[nodiscard]] std::int64_t remaining() const { return limit_ - pos_; }

    // Copies n bytes (the caller checked n <= remaining()).
    void copy(char* dst, std::int64_t n) {
        if (!file_) {
            std::memcpy(dst, mem_.data() + pos_, static_cast<std::size_t>(n));
            pos_ += n;
            return;
        }
        while (n > 0) {
            if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_len_) fill();
            const std::int64_t at = pos_ - buf_start_;
            const std::int64_t k = std::min(n, buf_len_ - at);
            std::memcpy(dst, buf_.data() + at, static_cast<std::size_t>(k));
            dst += k;
            pos_ += k;
            n -= k;
        }
    }
    // Skips n bytes (the caller checked n <= remaining()); files seek lazily.
    void skip(std::int64_t n) { pos_ += n; }

private:
    void fill() {
        const std::int64_t want = std::min(kChunk, limit_ - pos_);
        buf_.resize(static_cast<std::size_t>(want));
        file_->clear();
        file_->seekg(static_cast<std::streamoff>(pos_));
        file_->read(buf_.data(), static_cast<std::streamsize>(want));
        const auto got = static_cast<std::int64_t>(file_->gcount());
        if (got <= 0)
            fail(ErrorCode::Io, "model",
                 origin_ + ": cannot read at byte " + std::to_string(pos_) + " (did the file change while it was read?)");
        buf_start_ = pos_;
        buf_len_ = got;
    }

    std::string_view mem_;
    std::ifstream* file_ = nullptr;
    std::int64_t limit_ = 0;
    std::string origin_;
    std::int64_t pos_ = 0;
    std::vector<char> buf_;
    std::int64_t buf_start_ = 0;
    std::int64_t buf_len_ = 0;
};

class Parser {
public:
    // `partial`: the input holds only the first bytes of a larger file.
    Parser(Input& in, std::string origin, bool partial) : in_(in), origin_(std::move(origin)), partial_(partial) {}

    GgufFile run(std::int64_t file_size);

private:
    [[noreturn]] void bad(const std::string& what) const { bad_model(origin_ + ": " + what); }

    void need(std::int64_t n, const std::string& what) const {
        if (n >= 0 && n <= in_.remaining()) return;
        const std::string at = " at byte " + std::to_string(in_.pos());
        if (partial_)
            bad("the header runs past the " + std::to_string(in_.pos() + in_.remaining()) + " bytes given: " + what +
                at + " needs " + std::to_string(n) + " bytes");
        bad("the file is truncated: it ends inside " + what + at + " (needs " + std::to_string(n) + " bytes, " +
            std::to_string(in_.remaining()) + " remain); " + kNotGguf);
    }

    // An array whose elements (each at least `per` bytes) cannot fit in what remains.
    [[noreturn]] void too_long(const std::string& what, std::int64_t per) const {
        const std::string room = std::to_string(in_.remaining()) + " bytes remain" +
                                 (partial_ ? " in the bytes given" : std::string("; ") + kNotGguf);
        bad(what + " needs at least " + std::to_string(per) + " bytes per element, but only " + room);
    }

    std::uint64_t read_le(int nbytes, const std::string& what) {
        need(nbytes, what);
        unsigned char b[8] = {};
        in_.copy(reinterpret_cast<char*>(b), nbytes);
        std::uint64_t v = 0;
        for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | b[i];
        return v;
    }
    std::uint32_t read_u32(const std::string& what) { return static_cast<std::uint32_t>(read_le(4, what)); }
    std::int32_t read_i32(const std::string& what) { return static_cast<std::int32_t>(read_u32(what)); }
    std::uint64_t read_u64(const std::string& what) { return read_le(8, what); }
    std::int64_t read_i64(const std::string& what) { return static_cast<std::int64_t>(read_u64(what)); }

    // A GGUF string: uint64 length, then the bytes without NUL (gguf.h:26,
    // gguf.cpp:333). Keeps at most `keep` bytes, skips the rest.
    std::string read_string(const std::string& what, std::uint64_t keep = kMaxString) {
        const std::uint64_t len = read_u64("the length of " + what);
        if (len > kMaxString)
            bad("the length of " + what + " is " + std::to_string(len) + " bytes, more than the 64 MiB limit; " +
                kNotGguf);
        need(static_cast<std::int64_t>(len), what);
        const std::uint64_t k = std::min(len, keep);
        std::string s(static_cast<std::size_t>(k), '\0');
        in_.copy(s.data(), static_cast<std::int64_t>(k));
        in_.skip(static_cast<std::int64_t>(len - k));
        return s;
    }

    // A fixed-size numeric value as int64 (integers, bool) or double (floats).
    struct Number {
        bool is_float = false;
        std::int64_t i = 0;
        double f = 0;
    };
    Number read_number(std::int32_t type, const std::string& what) {
        const auto size = static_cast<int>(value_type_size(type));
        const std::uint64_t raw = read_le(size, what);
        Number n;
        switch (type) {
            case kU8: case kU16: case kU32: n.i = static_cast<std::int64_t>(raw); break;
            case kI8: n.i = static_cast<std::int8_t>(static_cast<std::uint8_t>(raw)); break;
            case kI16: n.i = static_cast<std::int16_t>(static_cast<std::uint16_t>(raw)); break;
            case kI32: n.i = static_cast<std::int32_t>(static_cast<std::uint32_t>(raw)); break;
            case kI64: n.i = static_cast<std::int64_t>(raw); break;
            case kBool: n.i = raw != 0 ? 1 : 0; break;
            case kU64:
                if (raw > static_cast<std::uint64_t>(INT64_MAX))
                    bad(what + " is " + std::to_string(raw) + ", which exceeds INT64_MAX (" +
                        std::to_string(INT64_MAX) + ")");
                n.i = static_cast<std::int64_t>(raw);
                break;
            case kF32: {
                const auto bits = static_cast<std::uint32_t>(raw);
                float x = 0;
                std::memcpy(&x, &bits, sizeof x);
                n.is_float = true;
                n.f = static_cast<double>(x);
                break;
            }
            case kF64: {
                double x = 0;
                std::memcpy(&x, &raw, sizeof x);
                n.is_float = true;
                n.f = x;
                break;
            }
            default: break;
        }
        return n;
    }

    void read_kv(std::int64_t index, GgufFile& g);
    GgufTensor read_tensor_info(std::int64_t index);

    Input& in_;
    std::string origin_;
    bool partial_ = false;
    std::set<std::string> keys_;
    std::unordered_map<std::string, std::int64_t> tensor_index_;
};

// One key/value pair (gguf.cpp:496-525): key string, int32 type, value; an
// array is int32 element type, uint64 count, then the elements.
void Parser::read_kv(std::int64_t index, GgufFile& g) {
    const std::string key = read_string("the key of metadata entry " + std::to_string(index));
    if (!keys_.insert(key).second) bad("duplicate metadata key " + quote_name(key) + " (gguf.cpp rejects duplicate keys)");
    const std::string qkey = quote_name(key);
    const std::int32_t type = read_i32("the value type of " + qkey);
    if (type == kArray) {
        const std::int32_t elem = read_i32("the element type of array " + qkey);
        if (elem == kArray)
            bad("metadata key " + qkey +
                " is a nested array (an array of arrays), which llama.cpp does not read (gguf.cpp:522-525 accepts "
                "only arrays of scalars or strings)");
        if (elem != kString && value_type_size(elem) == 0)
            bad("metadata key " + qkey + " is an array of unknown value type " + std::to_string(elem) +
                " (GGUF types are 0-12, gguf.h:54-66)");
        const std::uint64_t n = read_u64("the length of array " + qkey);
        const std::string what = "array " + qkey + " (" + std::to_string(n) + " " + value_type_name(elem) + ")";
        if (elem == kString) {
            // Every element is at least its 8-byte length.
            if (n > static_cast<std::uint64_t>(in_.remaining()) / 8) too_long(what, 8);
            if (n > kMaxStringArray)
                bad(what + " has more than " + std::to_string(kMaxStringArray) + " strings, the reader's limit");
            for (std::uint64_t j = 0; j < n; ++j) {
                check_budget();
                const std::uint64_t len = read_u64("the length of element " + std::to_string(j) + " of " + what);
                if (len > kMaxString)
                    bad("element " + std::to_string(j) + " of " + what + " is " + std::to_string(len) +
                        " bytes long, more than the 64 MiB limit; " + kNotGguf);
                need(static_cast<std::int64_t>(len), "element " + std::to_string(j) + " of " + what);
                in_.skip(static_cast<std::int64_t>(len));
            }
        } else {
            const std::int64_t size = value_type_size(elem);
            if (n > static_cast<std::uint64_t>(in_.remaining()) / static_cast<std::uint64_t>(size))
                too_long(what, size);
            if (is_integer_type(elem) && n <= kKeepIntArray) {
                std::vector<std::int64_t> values;
                values.reserve(static_cast<std::size_t>(n));
                for (std::uint64_t j = 0; j < n; ++j)
                    values.push_back(read_number(elem, "element " + std::to_string(j) + " of " + what).i);
                g.int_arrays[key] = std::move(values);
            } else {
                in_.skip(static_cast<std::int64_t>(n) * size);
            }
        }
        g.array_lengths[key] = static_cast<std::int64_t>(n);
        if (key == "general.alignment" || key == "general.architecture")
            bad("metadata key " + qkey + " is an array; llama.cpp reads it as a " +
                (key == "general.alignment" ? "uint32 (gguf.cpp:560-561)" : "string"));
        return;
    }
    if (type == kString) {
        std::string value = read_string("the value of " + qkey, kKeepString);
        if (key == "general.alignment")
            bad("general.alignment is a string; llama.cpp reads it as a uint32 (gguf.cpp:560-561)");
        if (key == "general.architecture") g.architecture = value;
        g.strings[key] = std::move(value);
        return;
    }
    if (value_type_size(type) == 0)
        bad("metadata key " + qkey + " has unknown value type " + std::to_string(type) +
            " (GGUF types are 0-12, gguf.h:54-66); " + kNotGguf);
    const Number v = read_number(type, "the value of " + qkey);
    if (key == "general.architecture")
        bad("general.architecture is a " + std::string(value_type_name(type)) + ", not a string");
    if (key == "general.alignment") {
        // gguf.cpp:560-561 reads it with gguf_get_val_u32 (which asserts the
        // type) and requires a nonzero power of two.
        if (type != kU32)
            bad("general.alignment is a " + std::string(value_type_name(type)) +
                "; llama.cpp reads it as a uint32 (gguf.cpp:560-561)");
        const auto a = static_cast<std::uint64_t>(v.i);
        if (a == 0 || (a & (a - 1)) != 0)
            bad("general.alignment is " + std::to_string(a) + ", not a nonzero power of two (gguf.cpp:560-561)");
        g.alignment = a;
    }
    if (v.is_float)
        g.floats[key] = v.f;
    else
        g.ints[key] = v.i;
}

// One tensor info (gguf.cpp:600-690): name, uint32 n_dims, int64 ne[n_dims],
// int32 ggml type, uint64 offset.
GgufTensor Parser::read_tensor_info(std::int64_t index) {
    GgufTensor t;
    const std::string which = "tensor " + std::to_string(index);
    const std::uint64_t len = read_u64("the name length of " + which);
    if (len >= kMaxTensorName)
        bad("the name of " + which + " is " + std::to_string(len) + " bytes long; llama.cpp allows at most " +
            std::to_string(kMaxTensorName - 1) + " (GGML_MAX_NAME)");
    need(static_cast<std::int64_t>(len), "the name of " + which);
    t.name.resize(static_cast<std::size_t>(len));
    in_.copy(t.name.data(), static_cast<std::int64_t>(len));
    const std::string qname = quote_name(t.name);
    const auto [it, inserted] = tensor_index_.emplace(t.name, index);
    if (!inserted)
        bad("duplicate tensor name " + qname + " (tensors " + std::to_string(it->second) + " and " +
            std::to_string(index) + ")");

    const std::uint32_t n_dims = read_u32("the dimension count of tensor " + qname);
    if (n_dims < 1 || n_dims > 4)
        bad("tensor " + qname + " has " + std::to_string(n_dims) +
            " dimensions; GGUF tensors have 1 to 4 (GGML_MAX_DIMS, gguf.cpp:609)");
    std::int64_t elements = 1;
    bool overflow = false;
    for (std::uint32_t j = 0; j < n_dims; ++j) {
        const std::int64_t d = read_i64("dimension " + std::to_string(j) + " of tensor " + qname);
        if (d < 0) bad("tensor " + qname + " dimension " + std::to_string(j) + " is negative (" + std::to_string(d) + ")");
        t.ne.push_back(d);
        if (!overflow && __builtin_mul_overflow(elements, d, &elements)) overflow = true;
    }
    if (overflow)
        bad("tensor " + qname + " shape " + shape_str(t.ne) + " has more elements than int64 holds (overflow)");

    t.type = read_i32("the ggml type of tensor " + qname);
    const GgmlType* gt = ggml_type_by_id(t.type);
    if (!gt)
        bad("tensor " + qname + " has unknown ggml type " + std::to_string(t.type) +
            " (gguf.cpp:649; this reader knows ids 0-41 except the removed 4, 5, 31-33 and 36-38)");
    if (t.ne[0] % gt->block != 0)
        bad("tensor " + qname + " of type " + gt->name + " has ne[0] = " + std::to_string(t.ne[0]) +
            " elements per row, not a multiple of the block size " + std::to_string(gt->block));
    std::int64_t row = 0;
    if (__builtin_mul_overflow(t.ne[0] / gt->block, gt->bytes, &row)) overflow = true;
    std::int64_t bytes = row;
    for (std::size_t j = 1; j < t.ne.size() && !overflow; ++j)
        if (__builtin_mul_overflow(bytes, t.ne[j], &bytes)) overflow = true;
    if (overflow)
        bad("tensor " + qname + " shape " + shape_str(t.ne) + " x " + gt->name +
            " has more bytes than int64 holds (overflow)");
    t.bytes = bytes;
    t.offset = read_u64("the data offset of tensor " + qname);
    return t;
}

GgufFile Parser::run(std::int64_t file_size) {
    GgufFile g;
    g.file_size = file_size;

    // Magic "GGUF" (gguf.h:41, read at gguf.cpp:410).
    need(4, "the magic");
    char magic[4];
    in_.copy(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) {
        static const char kHex[] = "0123456789abcdef";
        std::string hex;
        for (const char c : magic) {
            const auto u = static_cast<unsigned char>(c);
            hex += (hex.empty() ? "" : " ") + std::string{kHex[u >> 4], kHex[u & 15]};
        }
        bad("not a GGUF file: the magic is " + quote_name(std::string_view(magic, 4)) + " (bytes " + hex +
            "), expected 'GGUF'");
    }

    // Version (gguf.h:42; v1 rejected at gguf.cpp:454).
    g.version = read_u32("the version");
    if (g.version == 1)
        bad("GGUF v1 files are no longer read by llama.cpp (gguf.cpp:454); convert the model again with a current "
            "convert_hf_to_gguf.py");
    if (g.version != 2 && g.version != kVersion) {
        if (g.version != 0 && (g.version & 0xFFFFu) == 0)
            bad("the version reads as " + std::to_string(g.version) +
                " (a byte-swapped small number): this is a big-endian GGUF, which is not supported");
        bad("GGUF version " + std::to_string(g.version) + " is not supported (llama.cpp reads versions 2 and 3)");
    }

    // Counts (gguf.cpp:466, 477), bounded by what the remaining bytes can hold.
    const std::int64_t n_tensors = read_i64("the tensor count");
    const std::int64_t n_kv = read_i64("the metadata count");
    if (n_tensors < 0 || n_tensors > kMaxCount)
        bad("the tensor count is " + std::to_string(n_tensors) + "; it must be in [0, " + std::to_string(kMaxCount) +
            "]; " + kNotGguf);
    if (n_kv < 0 || n_kv > kMaxCount)
        bad("the metadata count is " + std::to_string(n_kv) + "; it must be in [0, " + std::to_string(kMaxCount) +
            "]; " + kNotGguf);
    const std::int64_t least = n_tensors * kMinTensorInfo + n_kv * kMinKv;  // <= 3.6e7, no overflow
    if (least > in_.remaining()) {
        const std::string what = std::to_string(n_tensors) + " tensor infos and " + std::to_string(n_kv) +
                                 " metadata entries (at least " + std::to_string(least) + " bytes)";
        if (partial_)
            bad("the header declares " + what + " but the bytes given cannot hold them (" +
                std::to_string(in_.remaining()) + " remain)");
        bad("the header declares " + what + " but the file cannot hold them (" + std::to_string(in_.remaining()) +
            " bytes remain); " + kNotGguf);
    }

    for (std::int64_t i = 0; i < n_kv; ++i) read_kv(i, g);
    if (const auto it = g.ints.find("general.file_type"); it != g.ints.end()) g.file_type = it->second;

    for (std::int64_t i = 0; i < n_tensors; ++i) g.tensors.push_back(read_tensor_info(i));

    // The data section starts at the header end rounded up to the alignment
    // (gguf.cpp:702-710); each tensor's offset must equal the running sum of
    // the earlier sizes padded to the alignment (gguf.cpp:716-731).
    const auto header_end = static_cast<std::uint64_t>(in_.pos());
    const std::uint64_t a = g.alignment;  // a power of two below 2^32
    g.data_offset = (header_end + a - 1) & ~(a - 1);
    std::uint64_t running = 0;
    for (const auto& t : g.tensors) {
        if (t.offset != running)
            bad("tensor " + quote_name(t.name) + " has offset " + std::to_string(t.offset) + ", expected " +
                std::to_string(running) +
                ": each tensor starts where the previous one ends, padded to the alignment of " + std::to_string(a) +
                " bytes (gguf.cpp:716-731)");
        const std::uint64_t padded = (static_cast<std::uint64_t>(t.bytes) + a - 1) & ~(a - 1);
        if (padded < static_cast<std::uint64_t>(t.bytes) || running + padded < running ||
            running + padded > static_cast<std::uint64_t>(INT64_MAX))
            bad("the data section size overflows 64 bits at tensor " + quote_name(t.name));
        running += padded;
    }
    g.data_size = static_cast<std::int64_t>(running);
    // Every tensor's bytes must lie inside the file. This is the check
    // llama.cpp's loader makes (src/llama-model-loader.h, llama_tensor_weight:
    // "tensor data is not within the file bounds"): the padding after the last
    // tensor is not required to be present.
    for (const auto& t : g.tensors) {
        const std::uint64_t end = g.data_offset + t.offset + static_cast<std::uint64_t>(t.bytes);  // < 2^64
        if (end > static_cast<std::uint64_t>(file_size))
            bad("the file is truncated: the data of tensor " + quote_name(t.name) + " ends at byte " +
                std::to_string(end) + " (data section from byte " + std::to_string(g.data_offset) + ", " +
                std::to_string(g.data_size) + " bytes) but the file is " + std::to_string(file_size) +
                " bytes (an incomplete download?)");
    }
    return g;
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

}  // namespace

const GgmlType* ggml_type_by_id(int id) {
    for (const auto& t : kGgmlTypes)
        if (t.id == id) return &t;
    return nullptr;
}

const GgmlType* ggml_type_by_name(std::string_view name) {
    const std::string want = lower(name);
    for (const auto& t : kGgmlTypes)
        if (lower(t.name) == want) return &t;
    return nullptr;
}

std::int64_t ggml_row_bytes(const GgmlType& t, std::int64_t ne0) {
    if (ne0 < 0) bad_model("ggml " + std::string(t.name) + " row of " + std::to_string(ne0) + " elements: negative length");
    if (t.block <= 0 || ne0 % t.block != 0)
        bad_model("ggml " + std::string(t.name) + " row of " + std::to_string(ne0) +
                  " elements: not a multiple of the block size " + std::to_string(t.block));
    std::int64_t r = 0;
    if (__builtin_mul_overflow(ne0 / t.block, t.bytes, &r))
        bad_model("ggml " + std::string(t.name) + " row of " + std::to_string(ne0) + " elements: bytes overflow 64 bits");
    return r;
}

std::int64_t ggml_nbytes(const GgmlType& t, const std::vector<std::int64_t>& ne) {
    if (ne.size() > 4)
        bad_model("ggml tensor shape " + shape_str(ne) + " has " + std::to_string(ne.size()) +
                  " dimensions; ggml tensors have at most 4");
    for (const auto d : ne)
        if (d < 0) bad_model("ggml tensor shape " + shape_str(ne) + " has a negative dimension");
    std::int64_t bytes = ggml_row_bytes(t, ne.empty() ? 1 : ne[0]);
    for (std::size_t j = 1; j < ne.size(); ++j)
        if (__builtin_mul_overflow(bytes, ne[j], &bytes))
            bad_model("ggml tensor shape " + shape_str(ne) + " x " + t.name + ": bytes overflow 64 bits");
    return bytes;
}

std::optional<std::int64_t> GgufFile::arch_int(std::string_view key) const {
    const auto it = ints.find(architecture + "." + std::string(key));
    if (it == ints.end()) return std::nullopt;
    return it->second;
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
    for (const auto& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

Result<GgufFile> parse_gguf(std::string_view bytes, std::int64_t file_size) {
    return capture([&]() -> GgufFile {
        const std::string origin = "in-memory GGUF";
        if (file_size < static_cast<std::int64_t>(bytes.size()))
            bad_model(origin + ": file_size " + std::to_string(file_size) + " is smaller than the " +
                      std::to_string(bytes.size()) + " bytes given");
        Input in(bytes, static_cast<std::int64_t>(bytes.size()));
        Parser p(in, origin, file_size > static_cast<std::int64_t>(bytes.size()));
        return p.run(file_size);
    });
}

Result<GgufFile> read_gguf(const std::string& path) {
    return capture([&]() -> GgufFile {
        // A regular file of any size (only the header is read, in chunks):
        // a FIFO, device or folder is refused before it is opened.
        const auto size = check_input_file(path, std::numeric_limits<std::int64_t>::max(), "GGUF model");
        std::ifstream f(path, std::ios::binary);
        if (!f) fail(ErrorCode::Io, "model", path + ": cannot open the file for reading (check its permissions)");
        const auto file_size = static_cast<std::int64_t>(size);
        Input in(&f, file_size, path);
        Parser p(in, path, false);
        return p.run(file_size);
    });
}

}  // namespace gpumem
