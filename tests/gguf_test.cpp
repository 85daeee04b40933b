// Tests of the GGUF header reader (src/model/gguf.cpp). The files are built
// here with a small writer that follows the layout of ggml/include/gguf.h and
// ggml/src/gguf.cpp at llama.cpp a95a11e5b834 (docs/research/llamacpp.md §1);
// every expected number comes from that format definition or from a
// calculation written in the test.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpumem/model/gguf.hpp"

namespace gpumem {
namespace {

namespace fs = std::filesystem;

// ggml type sizes from docs/research/llamacpp.md §1 "ggml type sizes", which
// records ggml.c type_traits[] and the static_asserts of ggml/src/ggml-common.h
// @a95a11e5b834: {id, name, elements per block, bytes per block}.
struct TypeRow {
    int id;
    const char* name;
    std::int64_t block;
    std::int64_t bytes;
};
const TypeRow kResearchTable[] = {
    {0, "f32", 1, 4},          {1, "f16", 1, 2},          {30, "bf16", 1, 2},       {2, "q4_0", 32, 18},
    {3, "q4_1", 32, 20},       {6, "q5_0", 32, 22},       {7, "q5_1", 32, 24},      {8, "q8_0", 32, 34},
    {10, "q2_K", 256, 84},     {11, "q3_K", 256, 110},    {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},    {15, "q8_K", 256, 292},    {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98},  {19, "iq1_s", 256, 50},    {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},    {23, "iq4_xs", 256, 136},  {29, "iq1_m", 256, 56},   {34, "tq1_0", 256, 54},
    {35, "tq2_0", 256, 66},    {39, "mxfp4", 32, 17},
    // "Newer types" and the integer types, same section.
    {40, "nvfp4", 64, 36},     {41, "q1_0", 128, 18},     {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},         {27, "i64", 1, 8},         {28, "f64", 1, 8},
};

const TypeRow& row(const char* name) {
    for (const auto& r : kResearchTable)
        if (std::strcmp(r.name, name) == 0) return r;
    throw std::logic_error(std::string("no type row ") + name);
}

// ggml ids used below (ggml.h enum ggml_type).
constexpr int kF32 = 0, kF16 = 1, kQ4K = 12, kQ6K = 14, kF64 = 28;

// Independent size calculation: ne[0] / block * bytes * ne[1] * ... (0 when
// it overflows: only the error tests build such shapes).
std::int64_t expect_bytes(const char* type, const std::vector<std::int64_t>& ne) {
    const TypeRow& r = row(type);
    std::int64_t b = (ne.empty() ? 1 : ne[0]) / r.block * r.bytes;
    for (std::size_t i = 1; i < ne.size(); ++i)
        if (__builtin_mul_overflow(b, ne[i], &b)) return 0;
    return b;
}

std::uint64_t pad(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

// GGUF value types, gguf.h:54-66.
enum : std::int32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kFloat32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kFloat64 = 12,
};

// Little-endian byte writer.
struct Buf {
    std::string s;
    Buf& le(std::uint64_t v, int n) {
        for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
        return *this;
    }
    Buf& u8(std::uint8_t v) { return le(v, 1); }
    Buf& u16(std::uint16_t v) { return le(v, 2); }
    Buf& u32(std::uint32_t v) { return le(v, 4); }
    Buf& i32(std::int32_t v) { return le(static_cast<std::uint32_t>(v), 4); }
    Buf& u64(std::uint64_t v) { return le(v, 8); }
    Buf& i64(std::int64_t v) { return le(static_cast<std::uint64_t>(v), 8); }
    Buf& f32(float v) {
        std::uint32_t b;
        std::memcpy(&b, &v, 4);
        return u32(b);
    }
    Buf& f64(double v) {
        std::uint64_t b;
        std::memcpy(&b, &v, 8);
        return u64(b);
    }
    Buf& str(const std::string& v) {
        u64(v.size());
        s += v;
        return *this;
    }
    Buf& raw(const std::string& v) {
        s += v;
        return *this;
    }
};

struct TensorSpec {
    std::string name;
    std::vector<std::int64_t> ne;
    const char* type;                     // name in kResearchTable
    std::optional<std::uint64_t> offset;  // default: the running padded sum
    std::optional<int> type_id;           // default: the id of `type`
};

// Builds a GGUF file: magic, version, counts, kv pairs, tensor infos, padding
// to the alignment, tensor data (zeros, each tensor padded).
class Builder {
public:
    std::string magic = "GGUF";
    std::uint32_t version = 3;
    std::uint64_t alignment = 32;  // used for the layout; add general.alignment with kv_u32 to change it in the file
    std::optional<std::int64_t> n_tensors_override, n_kv_override;
    Buf kv;
    std::int64_t n_kv = 0;
    std::vector<TensorSpec> tensors;

    Builder& key(const std::string& k, std::int32_t type) {
        kv.str(k).i32(type);
        ++n_kv;
        return *this;
    }
    Builder& kv_u32(const std::string& k, std::uint32_t v) { key(k, kU32).kv.u32(v); return *this; }
    Builder& kv_i32(const std::string& k, std::int32_t v) { key(k, kI32).kv.i32(v); return *this; }
    Builder& kv_u64(const std::string& k, std::uint64_t v) { key(k, kU64).kv.u64(v); return *this; }
    Builder& kv_f32(const std::string& k, float v) { key(k, kFloat32).kv.f32(v); return *this; }
    Builder& kv_str(const std::string& k, const std::string& v) { key(k, kString).kv.str(v); return *this; }
    Builder& kv_str_array(const std::string& k, const std::vector<std::string>& v) {
        key(k, kArray).kv.i32(kString).u64(v.size());
        for (const auto& x : v) kv.str(x);
        return *this;
    }
    Builder& kv_i32_array(const std::string& k, const std::vector<std::int32_t>& v) {
        key(k, kArray).kv.i32(kI32).u64(v.size());
        for (const auto x : v) kv.i32(x);
        return *this;
    }
    Builder& kv_f32_array(const std::string& k, std::size_t n) {
        key(k, kArray).kv.i32(kFloat32).u64(n);
        for (std::size_t i = 0; i < n; ++i) kv.f32(static_cast<float>(i) * -0.5f);
        return *this;
    }
    Builder& tensor(const std::string& name, std::vector<std::int64_t> ne, const char* type) {
        tensors.push_back({name, std::move(ne), type, std::nullopt, std::nullopt});
        return *this;
    }

    [[nodiscard]] std::vector<std::uint64_t> offsets() const {
        std::vector<std::uint64_t> out;
        std::uint64_t run = 0;
        for (const auto& t : tensors) {
            out.push_back(run);
            run += pad(static_cast<std::uint64_t>(expect_bytes(t.type, t.ne)), alignment);
        }
        return out;
    }
    [[nodiscard]] std::int64_t data_size() const {
        std::uint64_t run = 0;
        for (const auto& t : tensors) run += pad(static_cast<std::uint64_t>(expect_bytes(t.type, t.ne)), alignment);
        return static_cast<std::int64_t>(run);
    }
    [[nodiscard]] std::string header() const {
        Buf b;
        b.raw(magic).u32(version);
        b.i64(n_tensors_override.value_or(static_cast<std::int64_t>(tensors.size())));
        b.i64(n_kv_override.value_or(n_kv));
        b.raw(kv.s);
        const auto offs = offsets();
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const auto& t = tensors[i];
            b.str(t.name).u32(static_cast<std::uint32_t>(t.ne.size()));
            for (const auto d : t.ne) b.i64(d);
            b.i32(t.type_id.value_or(row(t.type).id));
            b.u64(t.offset.value_or(offs[i]));
        }
        return b.s;
    }
    [[nodiscard]] std::uint64_t data_offset() const { return pad(header().size(), alignment); }
    [[nodiscard]] std::int64_t file_size() const {
        return static_cast<std::int64_t>(data_offset()) + data_size();
    }
    // The whole file with zero tensor data.
    [[nodiscard]] std::string file() const {
        std::string f = header();
        f.resize(static_cast<std::size_t>(file_size()), '\0');
        return f;
    }
};

constexpr std::int64_t kVocab = 32000;
constexpr int kLayers = 2;
constexpr std::int64_t kEmbd = 256, kFf = 768, kKvDim = 128;

std::vector<std::string> vocab(std::int64_t n) {
    std::vector<std::string> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back("tok" + std::to_string(i));
    return v;
}

// A tiny llama-like Q4_K_M file: 2 layers, q4_K token embedding [256, 32000].
Builder tiny_llama() {
    Builder b;
    b.kv_str("general.architecture", "llama")
        .kv_str("general.name", "tiny")
        .kv_u32("general.file_type", 15)  // LLAMA_FTYPE_MOSTLY_Q4_K_M
        .kv_u32("llama.block_count", kLayers)
        .kv_u32("llama.context_length", 4096)
        .kv_u32("llama.embedding_length", kEmbd)
        .kv_u32("llama.feed_forward_length", kFf)
        .kv_u32("llama.attention.head_count", 4)
        .kv_i32_array("llama.attention.head_count_kv", {2, 1})
        .kv_f32("llama.rope.freq_base", 10000.0f)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
        .kv_str("tokenizer.ggml.model", "llama")
        .kv_str_array("tokenizer.ggml.tokens", vocab(kVocab))
        .kv_f32_array("tokenizer.ggml.scores", kVocab)
        .kv_i32_array("tokenizer.ggml.token_type", std::vector<std::int32_t>(kVocab, 1))
        .kv_u32("tokenizer.ggml.bos_token_id", 1);
    b.key("tokenizer.ggml.add_bos_token", kBool).kv.u8(1);
    b.key("test.i8", kI8).kv.u8(0xfb);  // -5
    b.key("test.i16", kI16).kv.u16(0x8000);  // -32768
    b.key("test.u16", kU16).kv.u16(0xffff);
    b.key("test.u8", kU8).kv.u8(200);
    b.key("test.i64", kI64).kv.i64(-1234567890123LL);
    b.key("test.f64", kFloat64).kv.f64(0.25);
    b.kv_u64("test.u64", 1ULL << 40);

    b.tensor("token_embd.weight", {kEmbd, kVocab}, "q4_K");
    for (int l = 0; l < kLayers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        b.tensor(p + "attn_norm.weight", {kEmbd}, "f32")
            .tensor(p + "attn_q.weight", {kEmbd, kEmbd}, "q4_K")
            .tensor(p + "attn_k.weight", {kEmbd, kKvDim}, "q4_K")
            .tensor(p + "attn_v.weight", {kEmbd, kKvDim}, "q6_K")
            .tensor(p + "attn_output.weight", {kEmbd, kEmbd}, "q4_K")
            .tensor(p + "ffn_norm.weight", {kEmbd}, "f32")
            .tensor(p + "ffn_gate.weight", {kEmbd, kFf}, "q4_K")
            .tensor(p + "ffn_up.weight", {kEmbd, kFf}, "q4_K")
            .tensor(p + "ffn_down.weight", {kFf, kEmbd}, "q6_K");
    }
    b.tensor("output_norm.weight", {kEmbd}, "f32").tensor("output.weight", {kEmbd, kVocab}, "q6_K");
    return b;
}

// A small file for prefix and mutation tests: a few kv pairs of each kind and
// three tensors; the last one is 32 bytes, a multiple of the alignment, so the
// file ends exactly where the last tensor's data ends.
Builder small_file() {
    Builder b;
    b.kv_str("general.architecture", "llama")
        .kv_u32("general.alignment", 32)
        .kv_u32("llama.block_count", 1)
        .kv_i32_array("llama.attention.head_count_kv", {4})
        .kv_str_array("tokenizer.ggml.tokens", vocab(6))
        .kv_f32_array("tokenizer.ggml.scores", 6)
        .kv_f32("llama.rope.freq_base", 500000.0f);
    b.tensor("a", {256, 2}, "q4_K").tensor("b", {32, 3}, "q8_0").tensor("c", {8}, "f32");
    return b;
}

Result<GgufFile> parse(const Builder& b) { return parse_gguf(b.header(), b.file_size()); }

void expect_error(const Result<GgufFile>& r, const std::string& phrase) {
    ASSERT_FALSE(r.ok()) << "expected an error containing \"" << phrase << "\"";
    EXPECT_EQ(r.error().code, ErrorCode::InvalidArgument) << r.error().message;
    EXPECT_EQ(r.error().field, "model");
    EXPECT_NE(r.error().message.find(phrase), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------------------
// Type table

TEST(GgufTypes, TableMatchesResearch) {
    for (const auto& r : kResearchTable) {
        const GgmlType* t = ggml_type_by_id(r.id);
        ASSERT_NE(t, nullptr) << r.name;
        EXPECT_STREQ(t->name, r.name);
        EXPECT_EQ(t->block, r.block) << r.name;
        EXPECT_EQ(t->bytes, r.bytes) << r.name;
        EXPECT_EQ(ggml_type_by_name(r.name), t) << r.name;
    }
    // Q8_1 (id 9) is accepted by gguf.cpp but absent from the research table:
    // block_q8_1 in ggml-common.h is two halves (4 bytes) + 32 int8 quants.
    const GgmlType* q81 = ggml_type_by_id(9);
    ASSERT_NE(q81, nullptr);
    EXPECT_EQ(q81->block, 32);
    EXPECT_EQ(q81->bytes, 2 * 2 + 32);
    // Removed ids (blck_size 0 in ggml.c) and ids out of range.
    for (const int id : {-1, 4, 5, 31, 32, 33, 36, 37, 38, 42, 1000}) EXPECT_EQ(ggml_type_by_id(id), nullptr) << id;
}

TEST(GgufTypes, NamesAreCaseInsensitive) {
    for (const char* n : {"Q4_K", "q4_k", "q4_K"}) {
        const GgmlType* t = ggml_type_by_name(n);
        ASSERT_NE(t, nullptr) << n;
        EXPECT_EQ(t->id, kQ4K);
    }
    ASSERT_NE(ggml_type_by_name("IQ4_XS"), nullptr);
    EXPECT_EQ(ggml_type_by_name("IQ4_XS")->id, 23);
    ASSERT_NE(ggml_type_by_name("BF16"), nullptr);
    EXPECT_EQ(ggml_type_by_name("BF16")->id, 30);
    for (const char* n : {"", "q4_2", "q4", "fp16", "q4_K_M"}) EXPECT_EQ(ggml_type_by_name(n), nullptr) << n;
}

TEST(GgufTypes, RowAndTensorBytes) {
    const GgmlType& q4k = *ggml_type_by_id(kQ4K);
    const GgmlType& q6k = *ggml_type_by_id(kQ6K);
    EXPECT_EQ(ggml_row_bytes(q4k, 4096), 4096 / 256 * 144);
    EXPECT_EQ(ggml_row_bytes(q4k, 0), 0);
    EXPECT_EQ(ggml_nbytes(q6k, {4096, 11008}), 4096 / 256 * 210 * 11008LL);
    EXPECT_EQ(ggml_nbytes(*ggml_type_by_id(kF16), {7, 3, 2, 5}), 7 * 2 * 3 * 2 * 5);
    EXPECT_EQ(ggml_nbytes(*ggml_type_by_name("mxfp4"), {64, 10}), 64 / 32 * 17 * 10);
    EXPECT_EQ(ggml_nbytes(*ggml_type_by_name("tq1_0"), {512}), 512 / 256 * 54);

    auto err = [](auto f) { return capture([&] { return f(); }); };
    auto r1 = err([&] { return ggml_row_bytes(q4k, 100); });
    ASSERT_FALSE(r1.ok());
    EXPECT_EQ(r1.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(r1.error().message.find("not a multiple of the block size 256"), std::string::npos);
    auto r2 = err([&] { return ggml_nbytes(*ggml_type_by_id(kF64), {1LL << 31, 1LL << 31}); });  // 2^62 x 8 bytes
    ASSERT_FALSE(r2.ok());
    EXPECT_NE(r2.error().message.find("overflow"), std::string::npos);
    auto r3 = err([&] { return ggml_nbytes(q4k, {256, -1}); });
    ASSERT_FALSE(r3.ok());
    auto r4 = err([&] { return ggml_nbytes(q4k, {256, 1, 1, 1, 1}); });
    ASSERT_FALSE(r4.ok());
}

// ---------------------------------------------------------------------------
// A valid file

TEST(GgufParse, TinyLlama) {
    const Builder b = tiny_llama();
    const std::string header = b.header();
    const auto r = parse_gguf(header, b.file_size());
    ASSERT_TRUE(r.ok()) << r.error().message;
    const GgufFile& g = r.value();

    EXPECT_EQ(g.version, 3u);
    EXPECT_EQ(g.architecture, "llama");
    EXPECT_EQ(g.alignment, 32u);
    EXPECT_EQ(g.file_type, 15);
    EXPECT_EQ(g.file_size, b.file_size());
    // The data section starts at the header end rounded up to 32.
    EXPECT_EQ(g.data_offset % 32, 0u);
    EXPECT_GE(g.data_offset, header.size());
    EXPECT_LT(g.data_offset, header.size() + 32);

    EXPECT_EQ(g.arch_int("block_count"), std::optional<std::int64_t>(kLayers));
    EXPECT_EQ(g.arch_int("embedding_length"), std::optional<std::int64_t>(kEmbd));
    EXPECT_EQ(g.arch_int("no_such_key"), std::nullopt);
    EXPECT_EQ(g.ints.at("tokenizer.ggml.add_bos_token"), 1);
    EXPECT_EQ(g.ints.at("test.i8"), -5);
    EXPECT_EQ(g.ints.at("test.i16"), -32768);
    EXPECT_EQ(g.ints.at("test.u16"), 65535);
    EXPECT_EQ(g.ints.at("test.u8"), 200);
    EXPECT_EQ(g.ints.at("test.i64"), -1234567890123LL);
    EXPECT_EQ(g.ints.at("test.u64"), 1LL << 40);
    EXPECT_DOUBLE_EQ(g.floats.at("llama.rope.freq_base"), 10000.0);
    EXPECT_DOUBLE_EQ(g.floats.at("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
    EXPECT_DOUBLE_EQ(g.floats.at("test.f64"), 0.25);
    EXPECT_EQ(g.strings.at("general.name"), "tiny");
    EXPECT_EQ(g.strings.at("tokenizer.ggml.model"), "llama");

    // Arrays: every length recorded; small integer arrays kept.
    EXPECT_EQ(g.array_lengths.at("tokenizer.ggml.tokens"), kVocab);
    EXPECT_EQ(g.array_lengths.at("tokenizer.ggml.scores"), kVocab);
    EXPECT_EQ(g.array_lengths.at("tokenizer.ggml.token_type"), kVocab);
    EXPECT_EQ(g.array_lengths.at("llama.attention.head_count_kv"), kLayers);
    EXPECT_EQ(g.int_arrays.at("llama.attention.head_count_kv"), (std::vector<std::int64_t>{2, 1}));
    EXPECT_EQ(g.int_arrays.count("tokenizer.ggml.token_type"), 0u);  // > 4096 elements
    EXPECT_EQ(g.int_arrays.count("tokenizer.ggml.tokens"), 0u);
    EXPECT_EQ(g.ints.count("tokenizer.ggml.tokens"), 0u);

    // Tensors, in file order, with sizes from the independent calculation.
    ASSERT_EQ(g.tensors.size(), b.tensors.size());
    EXPECT_EQ(g.tensors.size(), static_cast<std::size_t>(3 + 9 * kLayers));
    const auto offs = b.offsets();
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < g.tensors.size(); ++i) {
        EXPECT_EQ(g.tensors[i].name, b.tensors[i].name);
        EXPECT_EQ(g.tensors[i].ne, b.tensors[i].ne);
        EXPECT_EQ(g.tensors[i].type, row(b.tensors[i].type).id);
        EXPECT_EQ(g.tensors[i].bytes, expect_bytes(b.tensors[i].type, b.tensors[i].ne));
        EXPECT_EQ(g.tensors[i].offset, offs[i]);
        sum += static_cast<std::int64_t>(pad(static_cast<std::uint64_t>(g.tensors[i].bytes), 32));
    }
    EXPECT_EQ(g.data_size, sum);
    const GgufTensor* emb = g.tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->type, kQ4K);
    EXPECT_EQ(emb->bytes, kEmbd / 256 * 144 * kVocab);  // q4_K: 144 bytes per 256 elements
    const GgufTensor* down = g.tensor("blk.1.ffn_down.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->bytes, kFf / 256 * 210 * kEmbd);  // q6_K: 210 bytes per 256 elements
    const GgufTensor* norm = g.tensor("output_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->type, kF32);
    EXPECT_EQ(norm->bytes, kEmbd * 4);
    EXPECT_EQ(g.tensor("nope"), nullptr);
}

TEST(GgufParse, CustomAlignmentAndVersion2) {
    Builder b = small_file();
    b.version = 2;
    b.alignment = 64;
    // Replace general.alignment 32 by 64: rebuild the kv section.
    b.kv = Buf{};
    b.n_kv = 0;
    b.kv_str("general.architecture", "gpt2").kv_u32("general.alignment", 64);
    const auto r = parse(b);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->version, 2u);
    EXPECT_EQ(r->alignment, 64u);
    EXPECT_EQ(r->data_offset % 64, 0u);
    // a: q4_K [256, 2] = 288 bytes -> padded to 320; b: q8_0 [32, 3] = 102 -> 128; c: 32 -> 64.
    ASSERT_EQ(r->tensors.size(), 3u);
    EXPECT_EQ(r->tensors[1].offset, 320u);
    EXPECT_EQ(r->tensors[2].offset, 320u + 128u);
    EXPECT_EQ(r->data_size, 320 + 128 + 64);
    EXPECT_EQ(r->file_type, -1);
}

TEST(GgufParse, LongStringsAreCapped) {
    Builder b;
    const std::string tmpl(std::size_t{1} << 20 | 10, 'x');  // 1 MiB + 10 bytes
    b.kv_str("tokenizer.chat_template", tmpl).kv_u32("after", 7);
    const auto r = parse(b);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->strings.at("tokenizer.chat_template").size(), std::size_t{1} << 20);
    EXPECT_EQ(r->ints.at("after"), 7);  // the rest was skipped correctly
    EXPECT_EQ(r->architecture, "");
    EXPECT_TRUE(r->tensors.empty());
    EXPECT_EQ(r->data_size, 0);
}

// ---------------------------------------------------------------------------
// Validation: each failure is one message with a recognisable phrase.

TEST(GgufErrors, HeaderFields) {
    {
        Builder b = small_file();
        b.magic = "GGUX";
        expect_error(parse(b), "not a GGUF file");
    }
    {
        Builder b = small_file();
        b.version = 1;
        expect_error(parse(b), "v1 files are no longer read by llama.cpp");
    }
    {
        Builder b = small_file();
        b.version = 4;
        expect_error(parse(b), "version 4 is not supported");
    }
    {
        Builder b = small_file();
        b.version = 0x03000000;  // 3 written big-endian, read little-endian
        expect_error(parse(b), "big-endian GGUF");
    }
    {
        Builder b = small_file();
        b.version = 0;
        expect_error(parse(b), "version 0 is not supported");
    }
    {
        Builder b = small_file();
        b.n_tensors_override = 2000000;
        expect_error(parse(b), "tensor count is 2000000");
    }
    {
        Builder b = small_file();
        b.n_kv_override = -1;
        expect_error(parse(b), "metadata count is -1");
    }
    {
        Builder b = small_file();
        b.n_tensors_override = 100000;  // 100000 x 24 bytes do not fit in the small header
        expect_error(parse(b), "cannot hold");
    }
    {
        Builder b = small_file();
        b.n_kv_override = 500;
        expect_error(parse(b), "cannot hold");
    }
}

TEST(GgufErrors, Metadata) {
    {
        Builder b;
        b.key("x", 13).kv.u32(0);
        expect_error(parse(b), "unknown value type 13");
    }
    {
        Builder b;
        b.key("x", kArray).kv.i32(kArray).u64(1).i32(kU8).u64(0);
        expect_error(parse(b), "nested array");
    }
    {
        Builder b;
        b.key("x", kArray).kv.i32(-3).u64(0);
        expect_error(parse(b), "unknown value type -3");
    }
    {
        Builder b;
        b.kv_u32("x", 1).kv_u32("x", 2);
        expect_error(parse(b), "duplicate metadata key 'x'");
    }
    {
        Builder b;
        b.kv_u64("big", 1ULL << 63);
        expect_error(parse(b), "exceeds INT64_MAX");
    }
    {
        Builder b;
        b.key("big", kArray).kv.i32(kU64).u64(1).u64(~0ULL);
        expect_error(parse(b), "exceeds INT64_MAX");
    }
    {
        Builder b;
        b.key("s", kString).kv.u64((64ULL << 20) + 1);
        expect_error(parse(b), "64 MiB");
    }
    {
        Builder b;
        b.key("s", kString).kv.u64(1000).raw("abc");
        const std::string h = b.header();  // the whole file: no tensors
        expect_error(parse_gguf(h, static_cast<std::int64_t>(h.size())), "the file is truncated");
    }
    {
        Builder b;
        b.key("arr", kArray).kv.i32(kString).u64(1000000);
        expect_error(parse(b), "bytes per element");
    }
    {
        Builder b;
        b.key("arr", kArray).kv.i32(kU32).u64(1ULL << 62);
        expect_error(parse(b), "bytes per element");
    }
    for (const std::uint32_t a : {0u, 48u}) {
        Builder b = small_file();
        b.kv = Buf{};
        b.n_kv = 0;
        b.kv_u32("general.alignment", a);
        expect_error(parse(b), "not a nonzero power of two");
    }
    {
        Builder b;
        b.kv_u64("general.alignment", 64);
        expect_error(parse(b), "uint32");
    }
    {
        Builder b;
        b.kv_u32("general.architecture", 1);
        expect_error(parse(b), "general.architecture is a uint32, not a string");
    }
}

TEST(GgufErrors, TensorInfos) {
    auto one = [](std::vector<std::int64_t> ne, const char* type) {
        Builder b;
        b.tensor("w", std::move(ne), type);
        return b;
    };
    {
        Builder b = one({256}, "f32");
        b.tensors[0].ne = {};
        expect_error(parse(b), "has 0 dimensions");
    }
    {
        Builder b = one({1, 1, 1, 1, 1}, "f32");
        expect_error(parse(b), "has 5 dimensions");
    }
    expect_error(parse_gguf(one({256, -2}, "f32").header(), 1 << 20), "dimension 1 is negative");
    {
        Builder b = one({1LL << 32, 1LL << 32}, "f32");  // 2^64 elements
        expect_error(parse_gguf(b.header(), INT64_MAX), "overflow");
    }
    {
        Builder b = one({1LL << 31, 1LL << 31}, "f64");  // 2^62 elements x 8 bytes
        b.tensors[0].type_id = kF64;
        expect_error(parse_gguf(b.header(), INT64_MAX), "overflow");
    }
    {
        Builder b = one({256}, "f32");
        b.tensors[0].type_id = 99;
        expect_error(parse(b), "tensor 'w' has unknown ggml type 99");
    }
    {
        Builder b = one({256}, "f32");
        b.tensors[0].type_id = 4;  // Q4_2, removed
        expect_error(parse(b), "unknown ggml type 4");
    }
    {
        Builder b = one({256}, "f32");
        b.tensors[0].ne = {100, 2};
        b.tensors[0].type_id = kQ4K;
        expect_error(parse_gguf(b.header(), 1 << 20), "not a multiple of the block size 256");
    }
    {
        Builder b;
        b.tensor("w", {32}, "f32").tensor("w", {32}, "f32");
        expect_error(parse(b), "duplicate tensor name 'w'");
    }
    {
        Builder b;
        b.tensor(std::string(64, 'n'), {32}, "f32");
        expect_error(parse(b), "GGML_MAX_NAME");
    }
    {
        Builder b;
        b.tensor("a", {32}, "f32").tensor("b", {32}, "f32");
        b.tensors[1].offset = 64;  // expected 128 (32 x 4 bytes)
        expect_error(parse(b), "tensor 'b' has offset 64, expected 128");
    }
    {
        Builder b;
        b.tensor("a", {32}, "f32");
        b.tensors[0].offset = 32;  // the first tensor starts at 0
        expect_error(parse(b), "has offset 32, expected 0");
    }
}

TEST(GgufErrors, TruncatedFiles) {
    const Builder b = small_file();
    // The data section lies past the end of a file that holds only the header.
    expect_error(parse_gguf(b.header(), static_cast<std::int64_t>(b.header().size())),
                 "the file is truncated: the data of tensor");
    // Bytes that end inside the header while the file is larger.
    const std::string h = b.header();
    expect_error(parse_gguf(h.substr(0, h.size() - 3), b.file_size()), "bytes given");
    // file_size smaller than the bytes.
    expect_error(parse_gguf(h, 10), "smaller than");
    // Empty input.
    expect_error(parse_gguf("", 0), "truncated");
}

// Every prefix of a valid file fails cleanly; the whole file parses.
TEST(GgufFuzz, EveryPrefixFails) {
    const Builder b = small_file();
    const std::string f = b.file();
    ASSERT_EQ(static_cast<std::int64_t>(f.size()), b.file_size());
    ASSERT_TRUE(parse_gguf(f, static_cast<std::int64_t>(f.size())).ok());
    for (std::size_t n = 0; n < f.size(); ++n) {
        const auto r = parse_gguf(std::string_view(f).substr(0, n), static_cast<std::int64_t>(n));
        ASSERT_FALSE(r.ok()) << "prefix " << n;
        EXPECT_EQ(r.error().field, "model");
        EXPECT_FALSE(r.error().message.empty());
    }
}

TEST(GgufFuzz, RandomMutations) {
    const std::string base = small_file().file();
    std::mt19937_64 rng(20250511);
    static const char kInteresting[] = {'\x00', '\x01', '\x02', '\x03', '\x04', '\x08', '\x09', '\x0c', '\x1f',
                                        '\x20', '\x7f', '\x80', '\xff', 'G',    'U',    'F'};
    int ok = 0, errors = 0;
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
                case 4: {  // overwrite 8 bytes with a large or negative count
                    const std::uint64_t v = (rng() % 2) ? ~0ULL - rng() % 4 : (1ULL << (rng() % 64));
                    for (int k = 0; k < 8 && pos + static_cast<std::size_t>(k) < d.size(); ++k)
                        d[pos + static_cast<std::size_t>(k)] = static_cast<char>((v >> (8 * k)) & 0xff);
                    break;
                }
                case 5: d.resize(pos); break;
            }
        }
        for (const std::int64_t size : {static_cast<std::int64_t>(d.size()), static_cast<std::int64_t>(d.size()) + 4096}) {
            const auto r = parse_gguf(d, size);
            if (r.ok()) {
                ++ok;
                const GgufFile& g = r.value();
                EXPECT_EQ(g.data_offset % g.alignment, 0u);
                for (const auto& t : g.tensors) EXPECT_GE(t.bytes, 0);
            } else {
                ++errors;
                EXPECT_EQ(r.error().field, "model");
            }
        }
    }
    EXPECT_EQ(ok + errors, 40000);
    EXPECT_GT(errors, 0);
}

// ---------------------------------------------------------------------------
// Files on disk

class GgufRead : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("gpumem_gguf_" + std::string(::testing::UnitTest::GetInstance()
                                                                             ->current_test_info()
                                                                             ->name()) +
                                            "_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    fs::path dir_;
};

TEST_F(GgufRead, RealFile) {
    // The tiny llama plus a 1.5 MiB string and a 200k-string array, so that
    // the header spans several of the reader's 1 MiB read-ahead chunks.
    Builder b = tiny_llama();
    b.kv_str("tokenizer.chat_template", std::string(3 << 19, 'c'));
    b.kv_str_array("tokenizer.ggml.merges", vocab(200000));
    b.kv_u32("after.merges", 42);
    const std::string header = b.header();
    const std::string path = (dir_ / "tiny.gguf").string();
    {
        std::ofstream out(path, std::ios::binary);
        out << header;
    }
    fs::resize_file(path, static_cast<std::uintmax_t>(b.file_size()));  // zero (sparse) tensor data

    const auto r = read_gguf(path);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const auto m = parse_gguf(header, b.file_size());
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(r->file_size, b.file_size());
    EXPECT_EQ(r->data_offset, m->data_offset);
    EXPECT_EQ(r->data_size, m->data_size);
    EXPECT_EQ(r->ints, m->ints);
    EXPECT_EQ(r->strings, m->strings);
    EXPECT_EQ(r->int_arrays, m->int_arrays);
    EXPECT_EQ(r->array_lengths, m->array_lengths);
    EXPECT_EQ(r->array_lengths.at("tokenizer.ggml.merges"), 200000);
    EXPECT_EQ(r->ints.at("after.merges"), 42);
    EXPECT_EQ(r->strings.at("tokenizer.chat_template").size(), std::size_t{1} << 20);
    ASSERT_EQ(r->tensors.size(), m->tensors.size());
    for (std::size_t i = 0; i < r->tensors.size(); ++i) {
        EXPECT_EQ(r->tensors[i].name, m->tensors[i].name);
        EXPECT_EQ(r->tensors[i].bytes, m->tensors[i].bytes);
        EXPECT_EQ(r->tensors[i].offset, m->tensors[i].offset);
    }

    // The same file cut short: the data of the last tensors is missing.
    fs::resize_file(path, static_cast<std::uintmax_t>(b.file_size() - 1000));
    const auto t = read_gguf(path);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find(path), std::string::npos);
    EXPECT_NE(t.error().message.find("truncated"), std::string::npos);
    // Cut inside the header.
    fs::resize_file(path, header.size() / 2);
    const auto h = read_gguf(path);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.error().message.find("truncated"), std::string::npos) << h.error().message;
}

TEST_F(GgufRead, DirectoryMissingAndFifo) {
    const auto d = read_gguf(dir_.string());
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.error().message.find(dir_.string()), std::string::npos);
    EXPECT_NE(d.error().message.find("is a folder"), std::string::npos) << d.error().message;

    const std::string missing = (dir_ / "missing.gguf").string();
    const auto m = read_gguf(missing);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code, ErrorCode::NotFound);
    EXPECT_NE(m.error().message.find(missing), std::string::npos);

    const std::string fifo = (dir_ / "pipe.gguf").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const auto p = read_gguf(fifo);  // must not block on open
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.error().message.find("is a pipe (FIFO); a GGUF model must be a regular file"), std::string::npos)
        << p.error().message;
}

}  // namespace
}  // namespace gpumem
