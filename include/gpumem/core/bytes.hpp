// gpumem/core/bytes.hpp — a strong type for byte counts.
//
// Every memory quantity in gpumem is a Bytes: signed 64-bit, with checked
// arithmetic so that an absurd configuration (a 10^12-element tensor times
// a 10^9 batch) raises OverflowError instead of wrapping silently. Signed so
// that differences (reserved - allocated, deltas between settings) are
// representable. Binary units (KiB = 2^10, MiB = 2^20, GiB = 2^30) are used
// in human-readable output; decimal GB = 10^9 only where a source uses it.
#pragma once

#include <compare>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpumem {

// Thrown by checked arithmetic; loaders convert it into an input error that
// names the field that caused it.
class OverflowError : public std::overflow_error {
public:
    using std::overflow_error::overflow_error;
};

// Checked helpers on plain int64 (element counts, shapes).
inline std::int64_t checked_add(std::int64_t a, std::int64_t b) {
    std::int64_t r;
    if (__builtin_add_overflow(a, b, &r)) throw OverflowError("64-bit overflow in addition");
    return r;
}
inline std::int64_t checked_sub(std::int64_t a, std::int64_t b) {
    std::int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) throw OverflowError("64-bit overflow in subtraction");
    return r;
}
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
    std::int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) throw OverflowError("64-bit overflow in multiplication");
    return r;
}
// Integer division rounding up (k > 0), and n rounded up to a multiple of m.
inline std::int64_t checked_ceil_div(std::int64_t n, std::int64_t k) {
    if (k <= 0) throw std::invalid_argument("ceil_div by a non-positive number");
    return n / k + ((n % k) > 0 ? 1 : 0);
}
inline std::int64_t checked_round_up(std::int64_t n, std::int64_t m) { return checked_mul(checked_ceil_div(n, m), m); }

class Bytes {
public:
    constexpr Bytes() = default;
    constexpr explicit Bytes(std::int64_t n) : n_(n) {}

    [[nodiscard]] constexpr std::int64_t count() const { return n_; }
    [[nodiscard]] double mib() const { return static_cast<double>(n_) / (1024.0 * 1024.0); }
    [[nodiscard]] double gib() const { return static_cast<double>(n_) / (1024.0 * 1024.0 * 1024.0); }
    [[nodiscard]] double gb() const { return static_cast<double>(n_) / 1e9; }

    Bytes& operator+=(Bytes o) { n_ = checked_add(n_, o.n_); return *this; }
    Bytes& operator-=(Bytes o) { n_ = checked_sub(n_, o.n_); return *this; }
    friend Bytes operator+(Bytes a, Bytes b) { return Bytes(checked_add(a.n_, b.n_)); }
    friend Bytes operator-(Bytes a, Bytes b) { return Bytes(checked_sub(a.n_, b.n_)); }
    friend Bytes operator*(Bytes a, std::int64_t k) { return Bytes(checked_mul(a.n_, k)); }
    friend Bytes operator*(std::int64_t k, Bytes a) { return Bytes(checked_mul(a.n_, k)); }
    // Integer division rounding up: used when a state is split into shards.
    [[nodiscard]] Bytes ceil_div(std::int64_t k) const { return Bytes(checked_ceil_div(n_, k)); }
    [[nodiscard]] Bytes round_up(std::int64_t multiple) const { return Bytes(checked_round_up(n_, multiple)); }

    friend constexpr auto operator<=>(Bytes, Bytes) = default;

private:
    std::int64_t n_ = 0;
};

constexpr Bytes KiB(std::int64_t n) { return Bytes(n * 1024); }
constexpr Bytes MiB(std::int64_t n) { return Bytes(n * 1024 * 1024); }
constexpr Bytes GiB(std::int64_t n) { return Bytes(n * 1024 * 1024 * 1024); }

inline Bytes max(Bytes a, Bytes b) { return a < b ? b : a; }

// "1.50 GiB", "512 B", "12.00 MiB": binary units, two decimals.
std::string format_bytes(Bytes b);

}  // namespace gpumem
