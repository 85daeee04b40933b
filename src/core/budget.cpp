// The per-thread work budget (gpumem/core/budget.hpp).
#include "gpumem/core/budget.hpp"

namespace gpumem {

namespace detail {
thread_local WorkBudget* current_budget = nullptr;

void check_budget_slow(WorkBudget& b) {
    if ((++b.calls_ & 255u) != 0) return;
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
    : deadline_(s.deadline), limit_(s.limit), cancel_(s.cancel), previous_(detail::current_budget) {
    detail::current_budget = this;
}

std::optional<WorkBudget::Share> WorkBudget::current_share() {
    const WorkBudget* b = detail::current_budget;
    if (b == nullptr) return std::nullopt;
    return Share{b->deadline_, b->limit_, b->cancel_};
}

WorkBudget::~WorkBudget() { detail::current_budget = previous_; }

}  // namespace gpumem
