// The per-thread work budget (gpumem/core/budget.hpp).
#include "gpumem/core/budget.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>

#include "gpumem/core/result.hpp"

namespace gpumem {

namespace detail {
thread_local WorkBudget* current_budget = nullptr;

void check_budget_slow(WorkBudget& b) {
    // Called by check_budget() on every 256th call.
    if ((b.calls_ & 65535u) == 0) b.check_memory();
    if ((b.cancel_ != nullptr && b.cancel_->load(std::memory_order_relaxed)) || WorkBudget::Clock::now() >= b.deadline_)
        throw BudgetExceeded("the request needs more than its work budget of " + std::to_string(b.limit_.count()) +
                             " ms; ask for less (fewer layouts, points, GPUs or steps) or raise the budget (gpumem serve --time-limit)");
}
}  // namespace detail

WorkBudget::WorkBudget(std::chrono::milliseconds limit, const std::atomic<bool>* cancel)
    : deadline_(Clock::now() + limit), limit_(limit), cancel_(cancel), previous_(detail::current_budget) {
    detail::current_budget = this;
}

WorkBudget::WorkBudget(const Share& s)
    : deadline_(s.deadline),
      limit_(s.limit),
      cancel_(s.cancel),
      previous_(detail::current_budget),
      memory_base_(s.memory_base),
      memory_(s.memory) {
    detail::current_budget = this;
}

WorkBudget::WorkBudget(MemoryLimit memory)
    : deadline_(Clock::time_point::max()),
      limit_(0),
      cancel_(nullptr),
      previous_(detail::current_budget),
      memory_base_(resident_bytes()),
      memory_(std::move(memory)) {
    if (previous_ != nullptr) {
        deadline_ = previous_->deadline_;
        limit_ = previous_->limit_;
        cancel_ = previous_->cancel_;
    }
    detail::current_budget = this;
}

namespace {
std::atomic<std::int64_t> g_transient{0};
}  // namespace

void TransientMemory::add(std::int64_t delta) {
    bytes_.fetch_add(delta, std::memory_order_relaxed);
    g_transient.fetch_add(delta, std::memory_order_relaxed);
}

std::int64_t TransientMemory::held() { return g_transient.load(std::memory_order_relaxed); }

void WorkBudget::check_memory() const {
    if (memory_.max_growth > 0 && resident_bytes() - TransientMemory::held() - memory_base_ > memory_.max_growth)
        throw InputError(Error{ErrorCode::InvalidArgument, memory_.message, memory_.field});
}

void check_memory_now() {
    if (const WorkBudget* b = detail::current_budget) b->check_memory();
}

std::int64_t resident_bytes() {
    const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[128];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    if (n <= 0) return 0;
    // "size resident shared text lib data dt", in pages.
    const char* p = buf;
    const char* end = buf + n;
    while (p < end && *p != ' ') ++p;
    std::int64_t pages = 0;
    if (p < end) std::from_chars(p + 1, end, pages);
    return pages * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

std::optional<WorkBudget::Share> WorkBudget::current_share() {
    const WorkBudget* b = detail::current_budget;
    if (b == nullptr) return std::nullopt;
    return Share{b->deadline_, b->limit_, b->cancel_, b->memory_base_, b->memory_};
}

WorkBudget::~WorkBudget() { detail::current_budget = previous_; }

}  // namespace gpumem
