#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/dtype.hpp"
#include "gpumem/core/result.hpp"

namespace gpumem {

// printf("%.2f <unit>") of n / 1024^k, without printf: the double n / 2^(10k)
// is exact (a power-of-two quotient of the double n), so its decimal rounding
// to two places, half to even as glibc's printf rounds an exact tie, is done
// on integers (tests/format_bytes_test.cpp compares it with snprintf).
std::string format_bytes(Bytes b) {
    const std::int64_t n = b.count();
    const double a = std::fabs(static_cast<double>(n));
    if (a < 1024.0) return std::to_string(n) + " B";
    static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
    const int k = a < 1024.0 * 1024.0 ? 1 : a < 1024.0 * 1024.0 * 1024.0 ? 2 : a < 1024.0 * 1024.0 * 1024.0 * 1024.0 ? 3 : 4;
    __extension__ typedef unsigned __int128 u128;
    const unsigned shift = 10u * static_cast<unsigned>(k);
    const u128 x = static_cast<u128>(a) * 100u;  // a <= 2^63: an integer, exact
    u128 q = x >> shift;
    const u128 r = x & ((u128(1) << shift) - 1), half = u128(1) << (shift - 1);
    if (r > half || (r == half && (q & 1u) != 0)) ++q;
    const auto whole = static_cast<unsigned long long>(q / 100u);
    const auto cents = static_cast<unsigned>(q % 100u);
    std::string out = n < 0 ? "-" : "";
    out += std::to_string(whole);
    out += '.';
    out += static_cast<char>('0' + cents / 10);
    out += static_cast<char>('0' + cents % 10);
    out += ' ';
    out += kUnits[k - 1];
    return out;
}

const char* to_string(ErrorCode c) {
    switch (c) {
        case ErrorCode::InvalidArgument: return "invalid_argument";
        case ErrorCode::ParseError: return "parse_error";
        case ErrorCode::NotFound: return "not_found";
        case ErrorCode::Unsupported: return "unsupported";
        case ErrorCode::Overflow: return "overflow";
        case ErrorCode::Io: return "io_error";
    }
    return "error";
}

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F64: return "float64";
        case DType::F32: return "float32";
        case DType::F16: return "float16";
        case DType::BF16: return "bfloat16";
        case DType::F8_E4M3: return "float8_e4m3fn";
        case DType::F8_E5M2: return "float8_e5m2";
        case DType::I64: return "int64";
        case DType::I32: return "int32";
        case DType::I16: return "int16";
        case DType::I8: return "int8";
        case DType::U8: return "uint8";
        case DType::Bool: return "bool";
        case DType::NF4: return "nf4";
        case DType::Int4: return "int4";
    }
    return "?";
}

std::optional<DType> parse_dtype(std::string_view in) {
    std::string s;
    for (char c : in) s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    if (s.rfind("torch.", 0) == 0) s = s.substr(6);
    struct Alias { const char* name; DType t; };
    static constexpr std::array<Alias, 30> kAliases{{
        {"float64", DType::F64}, {"f64", DType::F64}, {"double", DType::F64},
        {"float32", DType::F32}, {"f32", DType::F32}, {"fp32", DType::F32}, {"float", DType::F32},
        {"float16", DType::F16}, {"f16", DType::F16}, {"fp16", DType::F16}, {"half", DType::F16},
        {"bfloat16", DType::BF16}, {"bf16", DType::BF16},
        {"float8_e4m3fn", DType::F8_E4M3}, {"f8_e4m3", DType::F8_E4M3}, {"fp8", DType::F8_E4M3},
        {"float8_e5m2", DType::F8_E5M2}, {"f8_e5m2", DType::F8_E5M2},
        {"int64", DType::I64}, {"i64", DType::I64}, {"int32", DType::I32}, {"i32", DType::I32},
        {"int16", DType::I16}, {"i16", DType::I16}, {"int8", DType::I8}, {"i8", DType::I8},
        {"uint8", DType::U8}, {"u8", DType::U8}, {"bool", DType::Bool}, {"nf4", DType::NF4},
    }};
    for (const auto& a : kAliases)
        if (s == a.name) return a.t;
    if (s == "int4") return DType::Int4;
    return std::nullopt;
}

}  // namespace gpumem

namespace gpumem {

namespace {
std::string fold(std::string_view s) {
    std::string out;
    for (char c : s) out.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    return out;
}
}  // namespace

// Wagner-Fischer with one row.
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diag = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string>& candidates, std::size_t most) {
    const std::string n = fold(name);
    const std::size_t limit = std::max<std::size_t>(2, n.size() / 3);
    std::vector<std::pair<std::size_t, std::string>> scored;
    for (const auto& c : candidates) {
        const std::string f = fold(c);
        std::size_t d = edit_distance(n, f);
        // a prefix or a contained word counts as close ("--grad" -> "--grad-accum")
        if (n.size() >= 3 && (f.rfind(n, 0) == 0 || n.rfind(f, 0) == 0)) d = std::min<std::size_t>(d, 1);
        if (d <= limit) scored.emplace_back(d, c);
    }
    std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> out;
    for (const auto& [d, c] : scored) {
        if (out.size() >= most) break;
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
    return out;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
    const auto near = nearest_names(name, candidates);
    if (near.empty()) return "";
    std::string s = "; did you mean ";
    for (std::size_t i = 0; i < near.size(); ++i) s += (i == 0 ? "" : i + 1 == near.size() ? " or " : ", ") + near[i];
    return s + "?";
}

}  // namespace gpumem

#include "gpumem/core/version.hpp"

namespace gpumem {
const char* version() { return GPUMEM_VERSION; }  // defined by CMake from project(VERSION)
}  // namespace gpumem
