// src/model/safetensors.cpp — safetensors header reader (never reads weights).
#include "gpumem/model/safetensors.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "gpumem/core/input.hpp"

#include "load_internal.hpp"

namespace gpumem {

namespace {

using nlohmann::json;

constexpr std::int64_t kMaxHeaderBytes = 100LL * 1000 * 1000;  // safetensors' own limit (100 MB)
const char* const kFix = "the file is truncated or not a safetensors file";

struct StDtype {
    const char* name;
    DType type;
};
constexpr std::array<StDtype, 12> kDtypes{{
    {"F64", DType::F64},
    {"F32", DType::F32},
    {"F16", DType::F16},
    {"BF16", DType::BF16},
    {"F8_E4M3", DType::F8_E4M3},
    {"F8_E5M2", DType::F8_E5M2},
    {"I64", DType::I64},
    {"I32", DType::I32},
    {"I16", DType::I16},
    {"I8", DType::I8},
    {"U8", DType::U8},
    {"BOOL", DType::Bool},
}};

std::string supported_list() {
    std::string s;
    for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
    return s;
}

[[noreturn]] void bad(const std::string& origin, const std::string& tensor, const std::string& what,
                      ErrorCode code = ErrorCode::ParseError, const char* fix = kFix) {
    std::string msg = origin + ": ";
    if (!tensor.empty()) msg += "tensor \"" + tensor + "\": ";
    msg += what;
    if (fix && *fix) msg += std::string("; ") + fix;
    fail(code, tensor.empty() ? origin : tensor, msg);
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// A non-negative integer that fits int64 (json integers may be unsigned 64-bit).
bool as_nonneg_int(const json& v, std::int64_t& out) {
    if (v.is_number_unsigned()) {
        const auto u = v.get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(INT64_MAX)) return false;
        out = static_cast<std::int64_t>(u);
        return true;
    }
    if (v.is_number_integer()) {
        const auto i = v.get<std::int64_t>();
        if (i < 0) return false;
        out = i;
        return true;
    }
    return false;
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(const std::string& json_text, std::int64_t data_size,
                                                   const std::string& origin) {
    return detail::guard([&]() -> Result<SafetensorsHeader> {
        check_json_depth(json_text, origin + " (safetensors header)");
        json doc;
        try {
            doc = json::parse(json_text);
        } catch (const json::parse_error& e) {
            bad(origin, "", "header is not valid JSON (byte " + std::to_string(e.byte) + " of the header)");
        }
        if (!doc.is_object())
            bad(origin, "", std::string("header must be a JSON object, got ") + detail::json_kind(doc));

        SafetensorsHeader h;
        for (const auto& [name, v] : doc.items()) {
            if (name == "__metadata__") continue;
            if (!v.is_object()) bad(origin, name, std::string("entry must be an object, got ") + detail::json_kind(v));
            SafetensorsEntry e;
            e.name = name;

            // dtype
            if (!v.contains("dtype") || !v["dtype"].is_string()) bad(origin, name, "missing \"dtype\" (string)");
            const std::string dt = v["dtype"].get<std::string>();
            const auto it =
                std::find_if(kDtypes.begin(), kDtypes.end(), [&](const StDtype& d) { return dt == d.name; });
            if (it == kDtypes.end())
                bad(origin, name, "dtype \"" + dt + "\" is not supported (supported: " + supported_list() + ")",
                    ErrorCode::Unsupported, "");
            e.dtype = it->type;

            // shape
            if (!v.contains("shape") || !v["shape"].is_array()) bad(origin, name, "missing \"shape\" (array)");
            e.numel = 1;
            bool overflow = false;
            for (const auto& d : v["shape"]) {
                std::int64_t n = 0;
                if (!as_nonneg_int(d, n))
                    bad(origin, name, "\"shape\" must hold non-negative integers, got " + d.dump());
                e.shape.push_back(n);
                if (!overflow && __builtin_mul_overflow(e.numel, n, &e.numel)) overflow = true;
            }
            std::int64_t nbytes = 0;
            if (!overflow) {
                const std::int64_t bits = dtype_bits(e.dtype);
                if (__builtin_mul_overflow(e.numel, bits / 8, &nbytes)) overflow = true;
            }
            if (overflow)
                bad(origin, name, "shape " + shape_str(e.shape) + " x " + dt + " overflows 64-bit byte counts",
                    ErrorCode::Overflow);

            // data_offsets
            if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
                bad(origin, name, "missing \"data_offsets\" [begin, end]");
            if (!as_nonneg_int(v["data_offsets"][0], e.begin) || !as_nonneg_int(v["data_offsets"][1], e.end) ||
                e.end < e.begin)
                bad(origin, name,
                    "\"data_offsets\" " + v["data_offsets"].dump() + " must be integers with 0 <= begin <= end");
            if (e.end - e.begin != nbytes)
                bad(origin, name,
                    "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] span " +
                        std::to_string(e.end - e.begin) + " bytes but shape " + shape_str(e.shape) + " x " + dt +
                        " needs " + std::to_string(nbytes) + " bytes");
            if (e.end > data_size)
                bad(origin, name,
                    "data_offsets end " + std::to_string(e.end) + " is past the data section (" +
                        std::to_string(data_size) + " bytes)");
            h.tensors.push_back(std::move(e));
        }

        // No two tensors may share bytes.
        std::vector<const SafetensorsEntry*> by_begin;
        for (const auto& e : h.tensors)
            if (e.end > e.begin) by_begin.push_back(&e);
        std::sort(by_begin.begin(), by_begin.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
            return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
        });
        for (std::size_t i = 1; i < by_begin.size(); ++i) {
            const auto* a = by_begin[i - 1];
            const auto* b = by_begin[i];
            if (b->begin < a->end)
                bad(origin, b->name,
                    "bytes [" + std::to_string(b->begin) + ", " + std::to_string(b->end) + ") overlap tensor \"" +
                        a->name + "\" [" + std::to_string(a->begin) + ", " + std::to_string(a->end) + ")");
        }
        std::sort(h.tensors.begin(), h.tensors.end(),
                  [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
        h.file_size = checked_add(checked_add(8, static_cast<std::int64_t>(json_text.size())), data_size);
        return h;
    });
}

Result<SafetensorsHeader> read_safetensors_header(const std::string& path) {
    return detail::guard([&]() -> Result<SafetensorsHeader> {
        // A regular file of any size (only the header is read; the weights may
        // be hundreds of GB): a FIFO or device is refused before it is opened.
        const std::int64_t file_size =
            check_input_file(path, std::numeric_limits<std::int64_t>::max(), "safetensors");
        if (file_size < 8)
            bad(path, "", "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
        std::ifstream in(path, std::ios::binary);
        if (!in) fail(ErrorCode::Io, path, path + ": cannot open the file for reading (check its permissions)");
        unsigned char len_bytes[8];
        in.read(reinterpret_cast<char*>(len_bytes), 8);
        if (!in) bad(path, "", "cannot read the 8-byte header length");
        std::uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
        if (n == 0) bad(path, "", "header length is 0");
        if (n > static_cast<std::uint64_t>(kMaxHeaderBytes))
            bad(path, "", "header length " + std::to_string(n) + " exceeds the 100 MB limit");
        if (n > static_cast<std::uint64_t>(file_size - 8))
            bad(path, "",
                "header length " + std::to_string(n) + " is larger than the file (" + std::to_string(file_size) +
                    " bytes)");
        std::string text(static_cast<std::size_t>(n), '\0');
        in.read(text.data(), static_cast<std::streamsize>(n));
        if (!in) bad(path, "", "cannot read the " + std::to_string(n) + "-byte header");
        const std::int64_t data_size = file_size - 8 - static_cast<std::int64_t>(n);
        auto r = parse_safetensors_header(text, data_size, path);
        if (!r) return r;
        SafetensorsHeader h = std::move(r).value();
        h.file_size = file_size;
        return h;
    });
}

}  // namespace gpumem
