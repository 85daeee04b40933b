#include "gpumem/sim/simulate.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>

#include "gpumem/core/parallel.hpp"
#include "gpumem/memory/features.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/allocator.hpp"
#include "gpumem/sim/step.hpp"
#include "gpumem/sim/trace.hpp"

namespace gpumem {

namespace {

// Kinds of live memory at the peak, told apart by the labels the step simulation (sim/step_*.cpp) writes.
enum Kind : std::uint8_t { kWeights, kAdapters, kMaster, kGrads, kOptStates, kFp8, kActivations, kActGrads, kCasts, kKv, kWorkspace, kOptTemp, kGathered, kComm, kKinds };

struct KindInfo {
    const char* key;
    const char* label;
};
constexpr std::array<KindInfo, kKinds> kKindInfo{{
    {"weights", "weights"},
    {"adapter_weights", "LoRA adapters"},
    {"master_weights", "fp32 master weights"},
    {"gradients", "parameter gradients"},
    {"optimizer_states", "optimizer states"},
    {"fp8_weight_copies", "FP8 weight copies and scaling state"},
    {"activations", "activations (saved and in flight)"},
    {"activation_gradients", "activation gradients"},
    {"autocast_weight_casts", "autocast 16-bit weight copies"},
    {"kv_cache", "KV cache"},
    {"cublas_workspace", "cuBLAS workspaces"},
    {"optimizer_temporaries", "optimizer temporaries"},
    {"gathered_params", "gathered parameters (ZeRO-3 / FSDP)"},
    {"comm_buffers", "communication buffers"},
}};

Kind kind_of(const std::string& label) {
    auto has = [&](const char* s) { return label.find(s) != std::string::npos; };
    if (has("(weight)")) return kWeights;
    if (has("(fp8 weight copy)") || has("(fp8 scaling state)")) return kFp8;
    if (has("gathered parameters")) return kGathered;
    if (has("gradient buckets") || has("pipeline receive buffer")) return kComm;
    if (has("LoRA adapters")) return kAdapters;
    if (has("master weights")) return kMaster;
    if (has("parameter gradients")) return kGrads;
    if (has("optimizer state")) return kOptStates;
    if (has("optimizer temporary")) return kOptTemp;
    if (has("activation gradients")) return kActGrads;
    if (has("autocast weight copy")) return kCasts;
    if (has("KV cache")) return kKv;
    if (has("cuBLAS workspace")) return kWorkspace;
    return kActivations;
}

}  // namespace

Result<EstimateResult> simulate_estimate(const ModelGraph& g, const EstimateRequest& req) { return simulate_estimate(g, req, SimulateOptions{}); }

Result<EstimateResult> simulate_estimate(const ModelGraph& g, const EstimateRequest& req, const SimulateOptions& sopt) {
    if (req.analytic || g.params_only > 0) return estimate(g, req);
    auto analytic = analytic_estimate(g, req);
    if (!analytic) return analytic;
    auto conf = sim::AllocatorConfig::parse(req.alloc_conf);
    if (!conf) return conf.error();
    return capture([&]() -> EstimateResult {
        EstimateResult r = std::move(analytic).value();
        const std::shared_ptr<const Job> job = r.job;  // the analytic estimate's: not resolved again
        const Job& j = *job;
        const bool pytorch = req.allocator == AllocatorKind::PyTorch;
        // Every pipeline rank is its own program: simulate each rank whose
        // analytic peak comes within 15% of the largest (the analytic and
        // simulated views agree within 5% on every rank, tests/invariants_test.cpp,
        // so no other rank can hold more) and report the one that holds most.
        ParallelResult local;
        // One GPU: the analytic estimate kept no layout, but its whole-model
        // activations are the chunk's (memory/parallel.hpp `whole`).
        if (!r.parallel) local = parallel_memory(g, j, g.params_only == 0 ? &r.activation_detail : nullptr);
        ParallelResult& par = r.parallel ? *r.parallel : local;
        Bytes analytic_max;
        for (const auto& st : par.stages) analytic_max = max(analytic_max, st.allocated);
        std::vector<std::int64_t> candidates;
        for (const auto& st : par.stages)
            if (static_cast<double>(st.allocated.count()) >= 0.85 * static_cast<double>(analytic_max.count())) candidates.push_back(st.stage);

        sim::ReplayOptions base_ro;
        base_ro.mode = pytorch ? sim::AllocatorMode::PyTorch : sim::AllocatorMode::None;
        base_ro.config = conf.value();
        const Bytes context = r.per_gpu.cuda_context + par.nccl_outside;
        const Bytes capacity = j.capacity > context ? j.capacity - context : Bytes(0);
        base_ro.top_tensors = 10;
        base_ro.record_timeline = sopt.timeline;

        // One rank's simulation. Ranks run side by side (core/parallel.hpp);
        // the one kept is the same whatever the threads: a rank that runs out
        // of memory before one that does not, then the larger reserved peak,
        // then the lower rank (the order a serial walk keeps).
        struct RankRun {
            std::size_t index = 0;
            sim::StepTrace trace;
            sim::ReplayResult rep;
            std::optional<sim::OomInfo> oom;
            std::int64_t oom_event = -1;
            std::string oom_phase;
        };
        // The reserved peak (the allocated one without an allocator model).
        auto reserved = [&](const sim::ReplayResult& x) { return pytorch ? x.peak_reserved : x.peak_allocated; };
        auto better = [&](const RankRun& a, const RankRun& b) {  // a is kept over b
            if (static_cast<bool>(a.oom) != static_cast<bool>(b.oom)) return static_cast<bool>(a.oom);
            if (reserved(a.rep) != reserved(b.rep)) return reserved(a.rep) > reserved(b.rep);
            return a.index < b.index;
        };
        std::vector<Bytes> peak_alloc(candidates.size()), peak_res(candidates.size());
        // The ranks are simulated heaviest first by their analytic peaks
        // (ties: the lower rank), each run kept by its position in that order.
        std::vector<std::size_t> order(candidates.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return par.stages[static_cast<std::size_t>(candidates[a])].allocated > par.stages[static_cast<std::size_t>(candidates[b])].allocated;
        });
        std::vector<std::optional<RankRun>> runs(candidates.size());
        // SimulateOptions::stop_above: the first position whose rank needs more
        // (positions are handed out in order, so every one before it ran).
        std::size_t stop_at = candidates.size();
        std::string too_large;
        std::mutex mutex;
        // This thread's spare trace storage is freed when the estimate ends,
        // on every path, unless the caller keeps it for its next simulation
        // (SimulateOptions::keep_trace_storage). The workers' spares go with
        // their threads.
        const sim::ReleaseTraceStorageAtExit release{!sopt.keep_trace_storage};
        parallel_for(candidates.size(), sopt.threads, [&](std::size_t pos) {
            {
                const std::lock_guard<std::mutex> lock(mutex);
                if (!too_large.empty()) return;  // the answer is the analytic one: no more ranks
                if (stop_at < pos) return;       // a rank before it needs more than stop_above
            }
            const std::size_t i = order[pos];
            const std::int64_t stage = candidates[i];
            sim::StepTraceOptions so;
            so.parallel = &par;
            so.stage = stage;
            so.cublas_workspaces = pytorch;
            so.cublas_workspace = req.cublas_workspace.value_or(j.gpu.cublas_workspace);
            so.all_micro_batches = sopt.full_replay;
            // Full replay: every decode step too (bounded by the trace's event cap).
            if (sopt.full_replay) so.max_decode_steps = static_cast<int>(std::min<std::int64_t>(req.gen_len, sim::kMaxTraceEvents));
            // Two answers: whether the job fits the GPU (a replay against its
            // capacity, where the allocator frees its cache and retries before
            // it fails; only where and how it failed is used) and what it needs
            // (a replay without a limit). The trace is built for the first; its
            // steady-state cuts hold for the replay settings it was built with.
            sim::ReplayOptions ro = base_ro;
            ro.capacity = capacity;
            ro.stop_at_oom = true;
            auto build = [&]() -> std::optional<sim::StepTrace> {
                so.steady_state = &ro;
                try {
                    return sim::build_step_trace(g, j, so);
                } catch (const sim::TraceTooLarge& e) {
                    const std::lock_guard<std::mutex> lock(mutex);
                    too_large = e.what();
                    return std::nullopt;
                }
            };
            std::optional<sim::StepTrace> built = build();
            if (!built) return;
            RankRun run;
            run.index = i;
            run.trace = std::move(*built);
            auto note_oom = [&run](const sim::OomInfo& o, std::int64_t event) {
                run.oom = o;
                run.oom_event = run.trace.trace.full_index(event);
                run.oom_phase = sim::phase_name(run.trace.trace.events[static_cast<std::size_t>(event)].phase);
            };
            // Both answers in one pass where the capacity decides nothing but
            // whether cudaMalloc succeeds (sim/trace.hpp
            // ReplayOptions::oom_capacity): the replay without a limit, which
            // also tells where the one against the GPU runs out of memory. A
            // trace without cuts or approximation does not depend on the
            // replay settings it was built with.
            const bool trace_neutral = run.trace.trace.cuts.empty() && !run.trace.approximate;
            std::optional<sim::ReplayResult> unlimited;
            if (pytorch && trace_neutral && sim::CachingAllocator::capacity_only_limits(ro.config)) {
                sim::ReplayOptions un = ro;
                un.capacity = Bytes(INT64_MAX / 4);
                un.stop_at_oom = false;
                un.oom_capacity = capacity;
                unlimited = sim::replay(run.trace.trace, un);
            }
            if (unlimited && unlimited->at_capacity_known) {
                if (unlimited->at_capacity_oom) note_oom(*unlimited->at_capacity_oom, unlimited->at_capacity_oom_event);
                run.rep = std::move(*unlimited);
            } else {
                // Otherwise: against the GPU (the answer when it fits), then,
                // when it does not, what it needs: the replay without a limit
                // already made, or made now (a trace with cuts is built again
                // for those settings).
                run.rep = sim::replay(run.trace.trace, ro);
                if (run.rep.oom) {
                    note_oom(*run.rep.oom, run.rep.oom_event);
                    if (unlimited) {
                        run.rep = std::move(*unlimited);
                    } else {
                        ro.capacity = Bytes(INT64_MAX / 4);
                        ro.stop_at_oom = false;
                        if (!trace_neutral) {
                            sim::recycle_trace_storage(std::move(run.trace));
                            built = build();
                            if (!built) return;
                            run.trace = std::move(*built);
                        }
                        run.rep = sim::replay(run.trace.trace, ro);
                    }
                }
            }
            peak_alloc[i] = run.rep.peak_allocated;
            peak_res[i] = reserved(run.rep);
            // The events are replayed: their storage goes to the next trace this
            // thread builds, whichever run is kept (it needs only the trace's
            // labels, checkpoints and notes), so a thread touches one trace's
            // pages, not one per rank kept in between.
            sim::recycle_trace_events(run.trace.trace.events);
            const bool over = sopt.stop_above > Bytes(0) && reserved(run.rep) + context > sopt.stop_above;
            const std::lock_guard<std::mutex> lock(mutex);
            if (over) stop_at = std::min(stop_at, pos);
            // A run beaten by one at an earlier position is never kept (that
            // one counts whenever it does): it is dropped at once, and so are
            // the later runs it beats. Few runs are held (keeping every run's
            // labels and timelines took `plan llama-3.1-405b --gpus 16384`
            // from 140 to 250 MiB).
            for (std::size_t q = 0; q < pos; ++q)
                if (runs[q] && better(*runs[q], run)) return;
            for (std::size_t q = pos + 1; q < runs.size(); ++q)
                if (runs[q] && better(run, *runs[q])) runs[q].reset();
            runs[pos] = std::move(run);
        });
        // The rank kept: the best of the positions up to stop_at (all of
        // them, without a stop), the same whatever the threads.
        std::optional<RankRun> best;
        // (Positions 0 to `last`: the ranks whose runs count.)
        const std::size_t counted = std::min(stop_at + 1, candidates.size());
        const std::size_t last = counted > 0 ? counted - 1 : 0;
        for (std::size_t pos = 0; pos < counted && too_large.empty(); ++pos)
            if (runs[pos] && (!best || better(*runs[pos], *best))) best = std::move(runs[pos]);
        const bool stopped = stop_at + 1 < candidates.size() && best;
        // Too long to simulate within bounded time and memory: the analytic
        // estimate (r, untouched so far), exactly what --analytic prints
        // (finished: error band, calibration), said so.
        if (!too_large.empty() || !best) {
            r.warnings.push_back("step simulation skipped: " + too_large +
                                 " (the model's layers times the simulated micro-batches); the analytic estimate is shown (--analytic)");
            r.assumptions.push_back("analytic estimate: the step simulation would exceed its event limit");
            finish_estimate(r);
            return r;
        }
        for (std::size_t pos = 0; pos < counted; ++pos) {
            const std::size_t i = order[pos];
            StageMemory& sm = par.stages[static_cast<std::size_t>(candidates[i])];
            sm.simulated = true;
            sm.simulated_peak_allocated = peak_alloc[i];
            sm.simulated_peak_reserved = peak_res[i];
        }
        const std::int64_t chosen = candidates[best->index];
        sim::StepTrace st = std::move(best->trace);
        sim::ReplayResult rep = std::move(best->rep);
        const std::optional<sim::OomInfo> oom = best->oom;
        const std::int64_t oom_event = best->oom_event;
        const std::string oom_phase = best->oom_phase;
        par.most_loaded = chosen;
        if (r.parallel) {
            const StageMemory& m = par.stages[static_cast<std::size_t>(chosen)];
            r.per_gpu.weights = m.weights;
            r.per_gpu.gradients = m.gradients;
            r.per_gpu.optimizer_states = m.optimizer_states;
            r.per_gpu.master_weights = m.master_weights;
            r.per_gpu.activations = m.activations;
            r.per_gpu.kv_cache = m.kv_cache;
        }

        SimulationSummary s;
        s.allocator = to_string(req.allocator);
        s.alloc_conf = conf.value().to_string();
        s.events = rep.events;
        s.peak_phase = sim::phase_name(rep.peak_phase);
        s.peak_step = rep.peak_step;
        s.fragmentation_at_peak = rep.fragmentation_at_peak;
        s.largest_free_block_at_peak = rep.largest_free_block_at_peak;
        const std::int32_t last_step = st.steps.empty() ? 0 : static_cast<std::int32_t>(st.steps.size()) - 1;
        for (const auto& ph : rep.phases) {
            s.phases.push_back({sim::phase_name(ph.phase), ph.step, ph.peak_allocated, ph.peak_reserved});
            if (ph.step == 0) {
                s.first_step_peak_allocated = max(s.first_step_peak_allocated, ph.peak_allocated);
                s.first_step_peak_reserved = max(s.first_step_peak_reserved, ph.peak_reserved);
            }
            if (ph.step == last_step) {
                s.steady_peak_allocated = max(s.steady_peak_allocated, ph.peak_allocated);
                s.steady_peak_reserved = max(s.steady_peak_reserved, ph.peak_reserved);
            }
        }
        for (const auto& t : rep.top_at_peak) s.top_at_peak.push_back({t.size, t.label, sim::phase_name(t.phase)});
        s.timeline.reserve(rep.timeline.size());
        for (const auto& p : rep.timeline) s.timeline.push_back({p.event, sim::phase_name(p.phase), p.step, p.allocated, p.reserved});
        if (!st.steps.empty()) {
            s.after_forward = st.steps.front().after_forward;
            s.after_backward = st.steps.front().after_backward;
            s.after_optimizer = st.steps.front().after_optimizer;
            s.after_zero_grad = st.steps.front().after_zero_grad;
        }
        if (oom) {
            s.oom = true;
            s.oom_detail = "on this GPU PyTorch would run out of memory at event " + std::to_string(oom_event) + " (" + oom_phase +
                           "): tried to allocate " + format_bytes(oom->requested) + " with " + format_bytes(oom->allocated) +
                           " allocated and " + format_bytes(oom->reserved) + " reserved of " + format_bytes(oom->capacity) +
                           " available; the peaks shown are what the job needs";
        }
        s.notes = st.notes;
        s.approximate = st.approximate;
        if (stopped) {
            s.stopped_at_stage = candidates[order[last]];
            s.notes.push_back("stopped after " + std::to_string(last + 1) + " of " + std::to_string(candidates.size()) +
                              " stages (heaviest first by the analytic peaks): stage " + std::to_string(candidates[order[last]]) + " needs more than " +
                              format_bytes(sopt.stop_above) + ", so the job does not fit that; the peak shown is the largest of the stages simulated");
        }
        if (rep.phases_left_out > 0)
            s.notes.push_back("per-phase rows: " + std::to_string(rep.phases_left_out) +
                              " rows of the steady state's repeated micro-batches not listed (they repeat the rows before them)");

        // Live memory at the allocated peak, by kind (requested bytes).
        std::array<Bytes, kKinds> by_kind{};
        for (std::size_t l = 0; l < rep.live_by_label.size(); ++l)
            if (rep.live_by_label[l] != Bytes(0))  // (most labels hold nothing at the peak: no search of their text)
                by_kind[l < st.trace.labels.size() ? kind_of(st.trace.labels[l]) : kActivations] += rep.live_by_label[l];

        PerGpu& pg = r.per_gpu;
        pg.peak_allocated = rep.peak_allocated;
        pg.peak_reserved = pytorch ? rep.peak_reserved : rep.peak_allocated;
        pg.allocator_overhead = pg.peak_reserved - pg.peak_allocated;
        pg.total_device = pg.peak_reserved + context;
        pg.fits = !oom && pg.total_device <= pg.capacity;
        pg.peak_phase = s.peak_phase;
        if (r.parallel) {
            const StageMemory& m = par.stages[static_cast<std::size_t>(chosen)];
            pg.peak_phase = "stage " + std::to_string(m.stage) + " (" + m.contents + "), " + s.peak_phase;
        }
        pg.transient = by_kind[kActGrads] + by_kind[kOptTemp];

        r.breakdown.clear();
        Bytes sum;
        for (int k = 0; k < kKinds; ++k) {
            const Bytes b = by_kind[static_cast<std::size_t>(k)];
            if (b == Bytes(0) && k != kWeights && k != kActivations) continue;
            r.breakdown.push_back({kKindInfo[static_cast<std::size_t>(k)].key, kKindInfo[static_cast<std::size_t>(k)].label, b,
                                   "live at the peak (" + s.peak_phase + ", step " + std::to_string(s.peak_step + 1) + ")"});
            sum += b;
        }
        r.breakdown.push_back({"allocator_rounding", "allocator rounding (512 B blocks, unsplit remainders)", pg.peak_allocated - sum,
                               pytorch ? "allocated minus requested bytes at the peak" : "none (--allocator none)"});
        // CUDA graphs: the graph pool's reserved bytes no tensor used at the
        // reserved peak, which no eager allocation could use either.
        Bytes graph_idle;
        if (j.framework.cuda_graphs != CudaGraphs::None && pytorch) {
            graph_idle = std::min(rep.graph_pool_free_at_reserved_peak, pg.allocator_overhead);
            r.breakdown.push_back({"cuda_graph_pool", "CUDA graph pool (reserved, unused at the peak)", graph_idle,
                                   "private pool of " + format_bytes(rep.graph_pool_reserved) + ": its free bytes at the reserved peak, which eager allocations cannot use"});
            s.graph_pool = rep.graph_pool_reserved;
            s.notes.push_back("CUDA graph pool: " + format_bytes(rep.graph_pool_reserved) + " reserved (" + to_string(j.framework.cuda_graphs) + ")");
        }
        r.breakdown.push_back({"allocator_overhead", "allocator cache (reserved - allocated)", pg.allocator_overhead - graph_idle,
                               pytorch ? "cached free blocks at the reserved peak; largest free block at the allocated peak " +
                                             format_bytes(s.largest_free_block_at_peak)
                                       : "none (--allocator none)"});
        if (r.parallel)
            r.breakdown.push_back({"nccl", "NCCL buffers (outside PyTorch)", r.parallel->nccl_outside,
                                   format_bytes(j.layout.cfg.nccl_per_communicator) + " per communicator"});
        r.breakdown.push_back({"cuda_context", "CUDA context (outside PyTorch)", r.per_gpu.cuda_context,
                               req.cuda_context ? "--cuda-context"
                                                : "default for " + r.gpu().name + (req.cuda_lazy_loading ? " with lazy module loading" : " with eager module loading")});
        r.assumptions.push_back(std::string("peaks simulated: ") + std::to_string(s.events) + " allocator events over " +
                                (j.train ? std::to_string(st.steps.size()) + " training steps" : std::string("prefill and decode")) +
                                ", allocator " + s.allocator + (s.alloc_conf.empty() ? "" : " (" + s.alloc_conf + ")"));
        if (s.oom && pg.total_device <= pg.capacity)
            r.warnings.push_back(s.oom_detail + " (fragmentation: the total fits but no free block is large enough)");
        // Outside the step's allocator peak (analytic rows of the rank simulated):
        // paged optimizer states and the load phase (memory/features.hpp).
        finish_outside_allocator(r, g, par, par.stages[static_cast<std::size_t>(chosen)]);
        // An approximate simulation (sim/step.hpp StepTrace::approximate:
        // interleaved pipelines past 64 micro-batches, an unsettled 1F1B
        // pipeline, decode past 64 steps) is checked within 1% of the full
        // replay (tests/sim_fast_path_test.cpp); a total that close to the
        // GPU's memory is no sure "fits" or "does not fit".
        if (s.approximate && r.per_gpu.capacity > Bytes(0)) {
            const double ratio = static_cast<double>(r.per_gpu.total_device.count()) / static_cast<double>(r.per_gpu.capacity.count());
            if (ratio > 0.99 && ratio < 1.01)
                r.warnings.push_back("the step simulation is approximate (see its notes; within 1% of a full replay on the test grids) and "
                                     "the total is within 1% of the GPU's memory: whether it fits is uncertain");
        }
        r.simulation = std::move(s);
        finish_estimate(r);
        return r;
    });
}

Result<EstimateResult> simulate_estimate(const EstimateRequest& req) {
    if (req.params_count) return estimate(req);
    if (req.model.empty()) return estimate(req);
    auto g = load_model(req.model, model_options(req));
    if (!g) return g.error();
    return simulate_estimate(g.value(), req);
}

}  // namespace gpumem
