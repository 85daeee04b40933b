// src/report/svg_util.hpp — helpers shared by the SVG renderers (private to src/report).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

namespace gpumem::svg {

inline std::string esc(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '&') o += "&amp;";
        else if (c == '<') o += "&lt;";
        else if (c == '>') o += "&gt;";
        else if (c == '"') o += "&quot;";
        else o += c;
    }
    return o;
}

// A "nice" tick step (1, 2, 5 x 10^k) giving about `n` ticks over `range`.
inline double nice_step(double range, int n) {
    const double raw = range / std::max(1, n);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (raw <= m * mag) return m * mag;
    return 10 * mag;
}

}  // namespace gpumem::svg
