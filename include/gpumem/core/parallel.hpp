// gpumem/core/parallel.hpp — run independent items on a few threads.
//
// The planner confirms its best layouts with the step simulation, and one
// estimate of a pipeline simulates every rank that could hold the most: both
// are independent items whose cost (tens of milliseconds to seconds each)
// dwarfs starting a thread. parallel_for runs work(i) for every i in [0, n)
// on at most `requested` threads (0: the cores), never more than there are
// items or kMaxThreads. A thread the system refuses to start
// (std::system_error) is not an error: the threads that did start, and the
// calling thread, share the items. Workers obey the caller's work budget
// (core/budget.hpp: its deadline, cancel flag and memory limit); the first
// exception a worker throws stops the others from taking more items and is
// rethrown here once all have joined. Which thread runs which item is not
// deterministic: callers combine the results in item order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "gpumem/core/budget.hpp"

namespace gpumem {

inline constexpr unsigned kMaxThreads = 256;

// The threads parallel_for would use for n items when `requested` are asked for.
inline std::size_t parallel_width(std::size_t n, int requested) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    return std::min<std::size_t>({requested > 0 ? static_cast<std::size_t>(requested) : hw, n, kMaxThreads});
}

template <class F>
void parallel_for(std::size_t n, int requested, F&& work) {
    if (n == 0) return;
    const std::size_t want = parallel_width(n, requested);
    std::atomic<std::size_t> next{0};
    std::mutex failed_mutex;
    std::exception_ptr failed;
    const std::optional<WorkBudget::Share> budget = WorkBudget::current_share();
    auto drain = [&] {  // take items until none are left; the first failure stops everyone
        for (std::size_t i = next++; i < n; i = next++) {
            try {
                work(i);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(failed_mutex);
                if (!failed) failed = std::current_exception();
                next = n;  // no more items for anyone
            }
        }
    };
    auto body = [&] {
        std::optional<WorkBudget> mine;
        if (budget) mine.emplace(*budget);
        drain();
    };
    std::vector<std::thread> pool;
    pool.reserve(want > 0 ? want - 1 : 0);
    for (std::size_t t = 1; t < want; ++t) {
        try {
            pool.emplace_back(body);
        } catch (const std::system_error&) {
            break;  // the system has no more threads for us: run on those we have
        }
    }
    drain();  // the calling thread takes items too (its own budget is already installed)
    for (auto& th : pool) th.join();
    if (failed) std::rethrow_exception(failed);
}

}  // namespace gpumem
