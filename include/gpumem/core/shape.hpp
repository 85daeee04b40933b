// gpumem/core/shape.hpp — a tensor's dimensions, held inline.
//
// The per-rank parameter and optimizer-state lists (memory/parallel.hpp
// RankTensor, memory/job.hpp TrainTensor) are rebuilt for every rank of every
// layout the planner scores; a std::vector per shape was two heap
// allocations per parameter tensor and rank, 42% of the allocations of
// `gpumem plan llama-3.1-405b --gpus 16384`'s analytic search (callgrind).
// A Shape holds up to kMaxDims dimensions in place. A longer shape (an ONNX
// initializer of more dimensions) folds its leading dimensions into the first:
// the element count and the last two dimensions -- all that the memory
// formulas read (numel; Adafactor's factored rows and columns, memory/job.cpp
// optimizer_bytes; Transformer Engine's rows x columns, memory/fp8.cpp) --
// are kept.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "gpumem/core/bytes.hpp"

namespace gpumem {

class Shape {
public:
    static constexpr std::size_t kMaxDims = 8;

    Shape() = default;
    Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
    Shape(const std::vector<std::int64_t>& dims) { assign(dims.data(), dims.size()); }  // NOLINT: implicit, as a vector would be

    [[nodiscard]] std::size_t size() const { return n_; }
    [[nodiscard]] bool empty() const { return n_ == 0; }
    [[nodiscard]] std::int64_t operator[](std::size_t i) const { return d_[i]; }
    [[nodiscard]] std::int64_t& operator[](std::size_t i) { return d_[i]; }
    [[nodiscard]] std::int64_t front() const { return d_[0]; }
    [[nodiscard]] std::int64_t back() const { return d_[n_ - 1]; }
    [[nodiscard]] const std::int64_t* begin() const { return d_.data(); }
    [[nodiscard]] const std::int64_t* end() const { return d_.data() + n_; }
    [[nodiscard]] std::vector<std::int64_t> to_vector() const { return {begin(), end()}; }
    friend bool operator==(const Shape& a, const Shape& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

private:
    void assign(const std::int64_t* dims, std::size_t n) {
        std::size_t from = 0;
        if (n > kMaxDims) {
            // Leading dimensions folded into the first one kept.
            from = n - kMaxDims;
            std::int64_t lead = 1;
            for (std::size_t i = 0; i <= from; ++i) lead = checked_mul(lead, dims[i]);
            d_[0] = lead;
            std::copy(dims + from + 1, dims + n, d_.begin() + 1);
            n_ = static_cast<std::uint8_t>(kMaxDims);
            return;
        }
        std::copy(dims, dims + n, d_.begin());
        n_ = static_cast<std::uint8_t>(n);
    }
    std::array<std::int64_t, kMaxDims> d_{};
    std::uint8_t n_ = 0;
};

}  // namespace gpumem
