// gpumem/core/addr_table.hpp — values by 64-bit key (a device address), in
// one flat array.
//
// The snapshot conversion (sim/snapshot_replay.cpp from_device_trace) looks
// up every trace entry's address twice: which addresses the trace has named,
// and which tensor lives at each. Node-based hash maps with their buckets
// reserved for every allocation of the trace were an eighth of reading and
// replaying a 10M-entry snapshot (a lookup missed the cache in a 26 MB
// bucket array; an allocator repeats a few thousand addresses). AddrTable is
// open addressing with linear probing in a power-of-two array at most half
// full, grown by doubling (the memory limit is checked at each growth);
// erasing shifts the rest of the run back (no tombstones). Any int64 is a
// key.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpumem/core/budget.hpp"

namespace gpumem {

template <class V>
class AddrTable {
public:
    [[nodiscard]] V* find(std::int64_t addr) {
        if (slots_.empty()) return nullptr;
        for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (!s.used) return nullptr;
            if (s.addr == addr) return &s.value;
        }
    }
    // Inserts (addr, v) unless addr is present; true when inserted.
    bool insert(std::int64_t addr, const V& v) {
        if (2 * (size_ + 1) > slots_.size()) grow();
        for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (!s.used) {
                s = Slot{addr, v, true};
                ++size_;
                return true;
            }
            if (s.addr == addr) return false;
        }
    }
    // Sets addr's value, inserting it if absent.
    void assign(std::int64_t addr, const V& v) {
        if (V* old = find(addr)) *old = v;
        else insert(addr, v);
    }
    void erase(std::int64_t addr) {
        if (slots_.empty()) return;
        std::size_t i = home(addr);
        for (;; i = (i + 1) & mask_) {
            if (!slots_[i].used) return;
            if (slots_[i].addr == addr) break;
        }
        // Backward shift: move up each later entry of the run whose home slot
        // is not between the hole and it, so that no probe stops short.
        for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
            if (!slots_[j].used) break;
            const std::size_t h = home(slots_[j].addr);
            const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
            if (stays) continue;
            slots_[i] = slots_[j];
            i = j;
        }
        slots_[i].used = false;
        --size_;
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    // Starts loading addr's home slot (a lookup a few entries ahead: a large
    // table's probes miss the cache, and the entries are read in order).
    void prefetch(std::int64_t addr) const {
        if (!slots_.empty()) __builtin_prefetch(&slots_[home(addr)]);
    }

private:
    struct Slot {
        std::int64_t addr = 0;
        V value{};
        bool used = false;
    };
    [[nodiscard]] std::size_t home(std::int64_t addr) const {
        // Fibonacci hashing: addresses are multiples of 512, the high bits mix them.
        return static_cast<std::size_t>((static_cast<std::uint64_t>(addr) * 0x9E3779B97F4A7C15ULL) >> shift_);
    }
    void grow() {
        std::vector<Slot> old = std::move(slots_);
        const std::size_t n = old.empty() ? 1024 : 2 * old.size();
        slots_.assign(n, Slot{});
        mask_ = n - 1;
        shift_ = 64 - static_cast<int>(std::countr_zero(n));
        size_ = 0;
        for (const Slot& s : old)
            if (s.used) insert(s.addr, s.value);
        check_memory_now();  // (the table's memory counts against the analysis's limit)
    }
    std::vector<Slot> slots_;
    std::size_t mask_ = 0;
    int shift_ = 64;
    std::size_t size_ = 0;
};

}  // namespace gpumem
