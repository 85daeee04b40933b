// Reuse of a step trace's event storage (sim/step.hpp recycle_trace_storage):
// a trace built into storage handed back from another trace must equal the
// trace built into a new vector, event for event, on a generated grid of jobs
// (single GPU and pipelines, 1F1B and interleaved, training and inference),
// whatever trace was handed back before it (longer or shorter); and storage
// that holds the trace already is really reused. Likewise replay()'s tables
// (sim/trace.hpp release_replay_storage): a replay whose id tables come from
// the replay before it must equal a replay on a fresh thread. A failing job
// is printed as its gpumem command.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "gpumem/memory/job.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/sim/step.hpp"
#include "gpumem/sim/trace.hpp"
#include "job_grid.hpp"

namespace gpumem {
namespace {

sim::StepTrace build(const EstimateRequest& r) { return test::grid_step_trace(r); }

// 8 jobs each of one GPU, pipelines and inference, drawn from `seed`.
std::vector<test::GridJob> three_kinds(std::uint64_t seed) {
    std::vector<test::GridJob> jobs;
    for (const auto kind : {test::GridKind::Single, test::GridKind::Pipeline, test::GridKind::Inference}) {
        auto part = test::job_grid(kind, 8, seed + static_cast<std::uint64_t>(kind));
        jobs.insert(jobs.end(), part.begin(), part.end());
    }
    return jobs;
}

// The trace as text: every event's fields, the cuts, labels, checkpoints, notes.
std::string dump(const sim::StepTrace& t) {
    std::string s;
    for (const auto& e : t.trace.events)
        s += std::to_string(static_cast<int>(e.kind)) + ',' + std::to_string(static_cast<int>(e.phase)) + ',' + std::to_string(e.stream) + ',' +
             std::to_string(e.id) + ',' + std::to_string(e.size.count()) + ',' + std::to_string(e.label) + ',' + std::to_string(e.step) + '\n';
    for (const auto& c : t.trace.cuts) s += "cut " + std::to_string(c.begin) + ' ' + std::to_string(c.at) + ' ' + std::to_string(c.copies) + '\n';
    for (const auto& l : t.trace.labels) s += l + '\n';
    for (const auto& c : t.steps)
        s += std::to_string(c.after_setup.count()) + ' ' + std::to_string(c.after_forward.count()) + ' ' + std::to_string(c.after_backward.count()) + ' ' +
             std::to_string(c.after_optimizer.count()) + ' ' + std::to_string(c.after_zero_grad.count()) + '\n';
    for (const auto& n : t.notes) s += n + '\n';
    return s + (t.approximate ? "approximate" : "exact");
}

// Built on a thread of its own: a new thread has no storage handed back.
std::string fresh(const EstimateRequest& r) {
    std::string out;
    std::thread([&] { out = dump(build(r)); }).join();
    return out;
}

TEST(TraceStorage, ReusedStorageGivesTheSameTrace) {
    const std::vector<test::GridJob> jobs = three_kinds(31);
    ASSERT_GE(jobs.size(), 20U);
    int checked = 0;
    std::thread([&] {
        // Each job is built into the storage of the job before it (longer or
        // shorter), then into its own.
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            const EstimateRequest& r = jobs[i].req;
            const std::string want = fresh(r);
            if (i > 0) sim::recycle_trace_storage(build(jobs[i - 1].req));
            sim::StepTrace after_other = build(r);
            EXPECT_EQ(dump(after_other), want) << request_to_command(r) << "\n    after " << request_to_command(jobs[i - 1].req);
            // Its own storage back: large enough, so the next trace is written into it.
            const sim::TraceEvent* storage = after_other.trace.events.data();
            const std::size_t capacity = after_other.trace.events.capacity();
            sim::recycle_trace_storage(std::move(after_other));
            const sim::StepTrace again = build(r);
            EXPECT_EQ(dump(again), want) << request_to_command(r) << "\n    built again into its own storage";
            if (capacity > 0 && capacity <= static_cast<std::size_t>(sim::kMaxSpareTraceEvents)) {
                EXPECT_EQ(again.trace.events.data(), storage) << request_to_command(r) << ": the storage handed back was not reused";
                ++checked;
            }
        }
    }).join();
    EXPECT_GE(checked, 20);
}

// A replay's answer as text: peaks, the peak's event and phase, final and
// fragmentation figures, per-phase rows, the timeline, the live tensors at the
// peak and the bytes by label, the oom and the counts of odd events.
std::string dump(const sim::ReplayResult& r) {
    auto b = [](Bytes x) { return std::to_string(x.count()) + ' '; };
    std::string s = b(r.peak_allocated) + b(r.peak_reserved) + std::to_string(r.events) + ' ' + std::to_string(r.peak_event) + ' ' +
                    std::to_string(static_cast<int>(r.peak_phase)) + ' ' + std::to_string(r.peak_step) + ' ' + b(r.final_allocated) + b(r.final_reserved) +
                    b(r.fragmentation_at_peak) + b(r.largest_free_block_at_peak) + std::to_string(r.failed_allocs) + ' ' +
                    std::to_string(r.unknown_frees) + ' ' + std::to_string(r.duplicate_allocs) + ' ' + std::to_string(r.oom_event) + '\n';
    for (const auto& p : r.phases) s += std::to_string(static_cast<int>(p.phase)) + ' ' + std::to_string(p.step) + ' ' + b(p.peak_allocated) + b(p.peak_reserved) + '\n';
    for (const auto& p : r.timeline) s += std::to_string(p.event) + ' ' + b(p.allocated) + b(p.reserved) + '\n';
    for (const auto& t : r.top_at_peak) s += std::to_string(t.id) + ' ' + b(t.size) + t.label + '\n';
    for (const auto& x : r.live_by_label) s += b(x);
    return s;
}

// Replayed on a thread of its own: a new thread has no tables handed on.
std::string fresh_replay(const sim::Trace& t, const sim::ReplayOptions& ro) {
    std::string out;
    std::thread([&] { out = dump(sim::replay(t, ro)); }).join();
    return out;
}

TEST(TraceStorage, ReplayTablesHandedOnGiveTheSameAnswer) {
    const std::vector<test::GridJob> jobs = three_kinds(57);
    ASSERT_GE(jobs.size(), 20U);
    std::vector<sim::StepTrace> traces;
    for (const auto& j : jobs) traces.push_back(build(j.req));
    sim::ReplayOptions ro;  // defaults: the caching allocator, timeline and top tensors recorded
    std::thread([&] {
        // Each trace replayed after the one before it (more ids or fewer), and
        // again after itself; the answers do not change.
        for (std::size_t i = 0; i < traces.size(); ++i) {
            const std::string want = fresh_replay(traces[i].trace, ro);
            EXPECT_GT(want.size(), 0U);
            if (i > 0) (void)sim::replay(traces[i - 1].trace, ro);
            const std::string before = i > 0 ? request_to_command(jobs[i - 1].req) : std::string("nothing");
            EXPECT_EQ(dump(sim::replay(traces[i].trace, ro)), want) << request_to_command(jobs[i].req) << "\n    after " << before;
            EXPECT_EQ(dump(sim::replay(traces[i].trace, ro)), want) << request_to_command(jobs[i].req) << "\n    replayed again";
        }
        sim::release_replay_storage();
        EXPECT_EQ(dump(sim::replay(traces.front().trace, ro)), fresh_replay(traces.front().trace, ro)) << "after release_replay_storage";
    }).join();
}

}  // namespace
}  // namespace gpumem
