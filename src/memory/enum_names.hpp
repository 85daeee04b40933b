// src/memory/enum_names.hpp — flag-value tables for the request enums
// (private to src/memory): parsing with an error that names the flag and
// lists the accepted values, and the canonical name of a value.
#pragma once

#include <array>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>

#include "gpumem/core/result.hpp"

namespace gpumem::detail {

template <class E, std::size_t N>
using EnumNames = std::array<std::pair<const char*, E>, N>;

template <class E, std::size_t N>
Result<E> parse_enum(std::string_view s, const EnumNames<E, N>& rows, std::string_view flag) {
    std::string lower;
    for (char c : s) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    for (const auto& [name, v] : rows)
        if (lower == name) return v;
    std::string list;
    for (const auto& [name, v] : rows) list += (list.empty() ? "" : "|") + std::string(name);
    return Error{ErrorCode::InvalidArgument, "--" + std::string(flag) + ": unknown value \"" + std::string(s) + "\"; use one of " + list,
                 std::string(flag)};
}

template <class E, std::size_t N>
const char* enum_name(E v, const EnumNames<E, N>& rows) {
    for (const auto& [name, e] : rows)
        if (e == v) return name;
    return "?";
}

}  // namespace gpumem::detail
