// gpumem/core/budget.hpp — a per-thread work budget that long computations obey.
//
// The service answers untrusted requests; a request may ask for work whose
// cost is large even after the input limits (a plan over a huge cluster, a
// sweep over many points). The front end that runs such work (the HTTP
// service, the Python module on request) installs a WorkBudget on the worker
// thread; every loop whose trip count depends on input calls check_budget(),
// which throws BudgetExceeded once the deadline has passed or the budget was
// cancelled. The work is therefore cancelled, not abandoned: the thread
// unwinds, frees what it built, and returns to the pool.
// Without an installed budget check_budget() costs one thread-local load.
//
// A budget may also bound memory (MemoryLimit): the process's resident size
// (/proc/self/statm) may grow by at most `max_growth` bytes while it is
// installed, read every 65,536 checks. Past it, check_budget() throws an
// InputError carrying the caller's message (exit 2, HTTP 400): reading a
// hostile snapshot is refused in one line instead of exhausting memory,
// whatever the shape of the file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace gpumem {

class BudgetExceeded : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class WorkBudget;
namespace detail {
void check_budget_slow(WorkBudget& b);
}

class WorkBudget {
public:
    using Clock = std::chrono::steady_clock;
    // Installs a budget on the calling thread for this object's lifetime.
    explicit WorkBudget(std::chrono::milliseconds limit, const std::atomic<bool>* cancel = nullptr);

    struct MemoryLimit {
        std::int64_t max_growth = 0;  // bytes the resident size may grow by
        std::string message;          // the error past it (one line: what, the limit, the fix)
        std::string field;            // the file or field it is about
    };
    // Installs a memory limit, keeping the enclosing budget's deadline and
    // cancel flag (none: no deadline).
    explicit WorkBudget(MemoryLimit memory);
    ~WorkBudget();
    WorkBudget(const WorkBudget&) = delete;
    WorkBudget& operator=(const WorkBudget&) = delete;

    [[nodiscard]] std::chrono::milliseconds limit() const { return limit_; }

    // What a worker thread needs to obey the budget of the thread that
    // started it (a budget is per thread): the same deadline and cancel flag.
    struct Share {
        Clock::time_point deadline;
        std::chrono::milliseconds limit;
        const std::atomic<bool>* cancel = nullptr;
        std::int64_t memory_base = 0;  // the memory limit: the process's growth from the same base
        MemoryLimit memory;
    };
    // The calling thread's budget, if one is installed.
    static std::optional<Share> current_share();
    // Installs a shared budget on the calling (worker) thread.
    explicit WorkBudget(const Share& s);

private:
    friend void detail::check_budget_slow(WorkBudget& b);
    friend void check_budget();
    friend void check_memory_now();
    void check_memory() const;
    Clock::time_point deadline_;
    std::chrono::milliseconds limit_;
    const std::atomic<bool>* cancel_;
    WorkBudget* previous_;
    std::uint32_t calls_ = 0;
    std::int64_t memory_base_ = 0;  // resident bytes when installed (with a memory limit)
    MemoryLimit memory_;
};

// The process's resident size in bytes (/proc/self/statm), 0 where unknown.
std::int64_t resident_bytes();

// Memory a computation holds for a while beside its own, bounded and given
// back before it returns (the JSON snapshot reader's read-ahead buffer):
// while a TransientMemory object lives, its bytes are left out of every
// memory limit's count, so a file is refused (or not) exactly as without
// the buffer. The holder keeps the bound small against the limit.
class TransientMemory {
public:
    TransientMemory() = default;
    ~TransientMemory() { add(-bytes_.load(std::memory_order_relaxed)); }
    TransientMemory(const TransientMemory&) = delete;
    TransientMemory& operator=(const TransientMemory&) = delete;
    // Holds `delta` more bytes (fewer when negative); any thread.
    void add(std::int64_t delta);
    // The bytes all live objects hold.
    static std::int64_t held();

private:
    std::atomic<std::int64_t> bytes_{0};
};
// Checks the calling thread's memory limit now (after a large reservation),
// not at the next 65,536th check_budget().
void check_memory_now();

namespace detail {
extern thread_local WorkBudget* current_budget;
}  // namespace detail

// Throws BudgetExceeded when the calling thread's budget is spent. Reads the
// clock once every 256 calls (the count is kept here, inline), so it is
// cheap enough for inner loops.
inline void check_budget() {
    if (WorkBudget* b = detail::current_budget)
        if ((++b->calls_ & 255u) == 0) detail::check_budget_slow(*b);
}

}  // namespace gpumem
