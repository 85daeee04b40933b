// The planner (plan/planner.hpp): enumerate layouts, score each with the
// analytic estimate and the time model `gpumem estimate` uses, bisect the
// micro-batch (memory grows with it), rank by throughput, confirm the winners
// with the step simulation.
#include "gpumem/plan/planner.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "gpumem/core/budget.hpp"
#include "gpumem/core/parallel.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/sim/step.hpp"

namespace gpumem {

namespace {

// How the states are sharded over data parallelism: the alternatives the
// frameworks offer (Megatron's distributed optimizer, DeepSpeed ZeRO,
// PyTorch FSDP / HSDP).
enum class Shard { None, DistOpt, Zero1, Zero2, Zero3, Fsdp, Hsdp };

const char* shard_name(Shard s) {
    switch (s) {
        case Shard::None: return "no sharding";
        case Shard::DistOpt: return "distributed optimizer";
        case Shard::Zero1: return "ZeRO-1";
        case Shard::Zero2: return "ZeRO-2";
        case Shard::Zero3: return "ZeRO-3";
        case Shard::Fsdp: return "FSDP";
        case Shard::Hsdp: return "HSDP";
    }
    return "?";
}

struct Family {
    std::int64_t tp = 1, cp = 1, pp = 1, vpp = 1, ep = 1, dp = 1;
    bool emb_layer = false, loss_layer = false;
    Shard shard = Shard::None;
    bool offload = false;
    std::optional<Precision> precision;
    Optimizer optimizer = Optimizer::AdamW;
    Recompute recompute = Recompute::None;
};

struct Found {
    bool ok = false;
    Family f;
    std::int64_t mb = 1, ga = 1;
    double step = 0, tokens_per_second = 0;
    TimeBreakdown parts;
    PerGpu per_gpu;
    std::int64_t evaluated = 0, estimates = 0, fitting = 0;
    bool ruled_out = false;  // by its model states alone, before any estimate
};

template <class T>
bool allowed(const std::vector<T>& only, T v) {
    return only.empty() || std::find(only.begin(), only.end(), v) != only.end();
}

EstimateRequest to_request(const EstimateRequest& base, const Family& f, std::int64_t mb, std::int64_t ga) {
    EstimateRequest r = base;
    r.batch = mb;
    r.grad_accum = ga;
    r.precision = f.precision;
    r.optimizer = f.optimizer;
    r.recompute = f.recompute;
    ParallelConfig& p = r.parallel;
    p.tp = f.tp;
    p.cp = f.cp;
    p.pp = f.pp;
    p.ep = f.ep;
    p.sp = f.tp > 1;
    p.schedule = f.vpp > 1 ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
    p.vpp = f.vpp;
    p.pp_embedding_layer = f.emb_layer;
    p.pp_loss_layer = f.loss_layer;
    p.pp_layers.clear();
    p.pp_first_layers.reset();
    p.pp_last_layers.reset();
    p.zero = f.shard == Shard::Zero1 ? 1 : f.shard == Shard::Zero2 ? 2 : f.shard == Shard::Zero3 ? 3 : 0;
    p.fsdp = f.shard == Shard::Fsdp ? Fsdp::Full : f.shard == Shard::Hsdp ? Fsdp::Hybrid : Fsdp::None;
    p.distributed_optimizer = f.shard == Shard::DistOpt;
    p.offload_optimizer = f.offload ? Offload::Cpu : Offload::None;
    return r;
}

// --- divisors in time that does not grow with n -----------------------------
// A cluster of 10^12 GPUs or a global batch of 2^62 sequences must not take a
// trial division up to sqrt(n): n is factored (deterministic Miller-Rabin and
// Pollard's rho, O(n^1/4)) and its divisors are built from the factors (at
// most 103,680 for any 64-bit n), keeping those up to `limit`.
using u64 = std::uint64_t;
__extension__ typedef unsigned __int128 u128;

u64 mul_mod(u64 a, u64 b, u64 m) { return static_cast<u64>(static_cast<u128>(a) * b % m); }

u64 pow_mod(u64 a, u64 e, u64 m) {
    u64 r = 1;
    a %= m;
    while (e > 0) {
        if (e & 1) r = mul_mod(r, a, m);
        a = mul_mod(a, a, m);
        e >>= 1;
    }
    return r;
}

bool is_prime(u64 n) {
    if (n < 2) return false;
    for (u64 p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37})
        if (n % p == 0) return n == p;
    u64 d = n - 1;
    int r = 0;
    while ((d & 1) == 0) {
        d >>= 1;
        ++r;
    }
    for (u64 a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {  // deterministic below 3.3e24
        u64 x = pow_mod(a, d, n);
        if (x == 1 || x == n - 1) continue;
        bool composite = true;
        for (int i = 1; i < r && composite; ++i) {
            x = mul_mod(x, x, n);
            if (x == n - 1) composite = false;
        }
        if (composite) return false;
    }
    return true;
}

u64 gcd_u64(u64 a, u64 b) {
    while (b != 0) {
        const u64 t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// A non-trivial factor of the odd composite n (Pollard's rho, Brent's cycle finding).
u64 rho(u64 n) {
    for (u64 c = 1;; ++c) {
        auto f = [&](u64 x) { return (mul_mod(x, x, n) + c) % n; };
        u64 x = 2, y = 2, d = 1, power = 1, lam = 1;
        while (d == 1) {
            if (power == lam) {
                x = y;
                power *= 2;
                lam = 0;
            }
            y = f(y);
            ++lam;
            d = gcd_u64(x > y ? x - y : y - x, n);
        }
        if (d != n) return d;
    }
}

void factor(u64 n, std::vector<u64>& out) {
    if (n == 1) return;
    for (u64 p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
        if (n % p == 0) {
            out.push_back(p);
            factor(n / p, out);
            return;
        }
    }
    if (is_prime(n)) {
        out.push_back(n);
        return;
    }
    const u64 d = rho(n);
    factor(d, out);
    factor(n / d, out);
}

// The divisors of n (n >= 1) up to `limit`, ascending.
std::vector<std::int64_t> divisors_upto(std::int64_t n, std::int64_t limit) {
    std::vector<std::int64_t> out;
    if (n < 1 || limit < 1) return out;
    std::vector<u64> f;
    factor(static_cast<u64>(n), f);
    std::sort(f.begin(), f.end());
    std::vector<u64> divs{1};
    for (std::size_t i = 0; i < f.size();) {
        std::size_t j = i;
        while (j < f.size() && f[j] == f[i]) ++j;
        const std::size_t base = divs.size();
        u64 pk = 1;
        for (std::size_t e = i; e < j; ++e) {
            pk *= f[i];
            if (pk > static_cast<u64>(limit)) break;
            for (std::size_t k = 0; k < base; ++k)
                if (divs[k] <= static_cast<u64>(limit) / pk) divs.push_back(divs[k] * pk);
        }
        i = j;
    }
    for (u64 d : divs) out.push_back(static_cast<std::int64_t>(d));
    std::sort(out.begin(), out.end());
    return out;
}

// The largest micro-batch searched (sequences per GPU per forward).
constexpr std::int64_t kMaxMicroBatch = 64;

std::string layout_name(const Family& f) {
    std::string s = fmt::format("tp{} pp{}", f.tp, f.pp);
    if (f.vpp > 1) s += fmt::format(" (interleaved x{})", f.vpp);
    if (f.cp > 1) s += fmt::format(" cp{}", f.cp);
    if (f.ep > 1) s += fmt::format(" ep{}", f.ep);
    s += fmt::format(" dp{}, {}", f.dp, shard_name(f.shard));
    if (f.offload) s += " + optimizer offload";
    return s;
}

}  // namespace

Result<PlanResult> plan(const PlanRequest& pr) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pr.base.params_count) return Error{ErrorCode::InvalidArgument, "plan needs a model graph, not --params", "params"};
    if (pr.base.mode == Mode::Infer) return Error{ErrorCode::InvalidArgument, "plan searches training layouts: use --mode train, lora or qlora", "mode"};
    if (!(pr.headroom >= 0 && pr.headroom < 1)) return Error{ErrorCode::InvalidArgument, "--headroom must be in [0, 100%)", "headroom"};
    if (pr.base.parallel.gpus < 1) return Error{ErrorCode::InvalidArgument, "--gpus must be a positive number of GPUs", "gpus"};
    if (pr.global_batch < 0) return Error{ErrorCode::InvalidArgument, "--global-batch must be a positive number of sequences", "global-batch"};
    auto gr = load_model(pr.base.model, model_options(pr.base));
    if (!gr) return gr.error();
    const ModelGraph& g = gr.value();
    if (!g.transformer) return Error{ErrorCode::InvalidArgument, "plan needs a transformer model (preset or config.json)", "model"};
    const TransformerDims& d = *g.transformer;
    const std::int64_t gpus = pr.base.parallel.gpus;

    // The job on one GPU: sequence length, GPU, capacity.
    EstimateRequest probe = pr.base;
    probe.parallel = ParallelConfig{};
    probe.batch = 1;
    probe.grad_accum = 1;
    probe.analytic = true;
    auto bres = estimate(g, probe);
    if (!bres) return bres.error();
    const std::int64_t seq = bres.value().seq();
    const GpuSpec gpu = bres.value().gpu();
    const double capacity = static_cast<double>(bres.value().per_gpu.capacity.count()) * (1.0 - pr.headroom);
    std::int64_t per_node = pr.base.parallel.gpus_per_node > 0 ? pr.base.parallel.gpus_per_node
                            : pr.base.parallel.nodes > 0       ? std::max<std::int64_t>(1, gpus / pr.base.parallel.nodes)
                                                               : gpu.gpus_per_node;
    per_node = std::min(per_node, gpus);
    if (pr.global_batch == 0 && gpus > std::numeric_limits<std::int64_t>::max() / 4)
        return Error{ErrorCode::InvalidArgument, "--gpus " + std::to_string(gpus) + " is too many to derive a global batch (4 per GPU) from; give --global-batch",
                     "gpus"};
    const std::int64_t gb = pr.global_batch > 0 ? pr.global_batch : gpus * 4;
    const std::int64_t L = d.layers;

    // ---- what is searched -------------------------------------------------------------
    std::vector<std::optional<Precision>> precs;
    if (!pr.precision.empty()) {
        for (auto p : pr.precision) precs.emplace_back(p);
    } else {
        precs.push_back(pr.base.precision);
        if (pr.search_precision)
            for (Precision p : {Precision::AmpBF16, Precision::BF16})
                if (!pr.base.precision || *pr.base.precision != p) precs.emplace_back(p);
    }
    std::vector<Optimizer> opts;
    if (!pr.optimizer.empty()) opts = pr.optimizer;
    else {
        opts.push_back(pr.base.optimizer);
        if (pr.search_optimizer)
            for (Optimizer o : {Optimizer::AdamW8bit, Optimizer::Adafactor})
                if (o != pr.base.optimizer) opts.push_back(o);
    }
    // Selective recompute rebuilds the eager attention core; with fused
    // attention there is nothing to rebuild (same memory and time as none).
    // Frameworks with op-level selective checkpointing (torchtitan) search it too.
    std::vector<Recompute> recs = !pr.recompute.empty() ? pr.recompute
                                  : pr.base.attention == Attention::Flash ? std::vector<Recompute>{Recompute::None, Recompute::Full}
                                                                          : std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full};
    if (pr.recompute.empty() && pr.base.framework && framework_profile(*pr.base.framework).recompute == Recompute::Ops) recs.push_back(Recompute::Ops);

    std::vector<std::int64_t> tps;
    for (std::int64_t tp : pr.tp.empty() ? divisors_upto(per_node, d.heads) : pr.tp) {
        if (tp < 1 || gpus % tp != 0 || d.heads % tp != 0) continue;
        if (d.kv_heads > 0 && d.kv_heads % tp != 0 && tp % d.kv_heads != 0) continue;
        tps.push_back(tp);
    }
    auto layer_splits = [&](std::int64_t pp) {
        // Megatron's splits: even, or the embedding / loss taking a layer's slot.
        std::vector<std::pair<bool, bool>> out;
        if (L % pp == 0) out.emplace_back(false, false);
        else if ((L + 2) % pp == 0) out.emplace_back(true, true);
        else if ((L + 1) % pp == 0) out.emplace_back(true, false);
        return out;
    };
    std::vector<Family> families;
    families.reserve(tps.size() * 64 * precs.size() * opts.size() * recs.size());
    for (std::int64_t tp : tps)
        for (std::int64_t cp = 1; cp <= 64 && tp * cp <= gpus; cp *= 2) {
            if (!allowed(pr.cp, cp) || gpus % (tp * cp) != 0 || (cp > 1 && seq % (2 * cp) != 0)) continue;
            for (std::int64_t pp : divisors_upto(gpus / (tp * cp), L)) {
                if (!allowed(pr.pp, pp) || pp > L) continue;
                const std::int64_t dp = gpus / (tp * cp * pp);
                if (gb % dp != 0) continue;
                for (const auto& [emb, loss] : (pp > 1 ? layer_splits(pp) : std::vector<std::pair<bool, bool>>{{false, false}})) {
                    std::vector<std::int64_t> vpps{1};
                    if (pp > 2) {
                        const std::int64_t slots = (L + (emb ? 1 : 0) + (loss ? 1 : 0)) / pp;
                        for (std::int64_t v : {2, 3, 4, 5, 6, 8})
                            if (v <= slots && slots % v == 0) vpps.push_back(v);
                    }
                    std::vector<std::int64_t> eps{1};
                    if (d.experts > 1)
                        for (std::int64_t e = 2; e <= std::min(dp * cp, d.experts); e *= 2)
                            if (d.experts % e == 0 && dp % e == 0) eps.push_back(e);
                    std::vector<Shard> shards;
                    if (!pr.zero.empty()) {
                        for (int z : pr.zero) shards.push_back(z == 0 ? Shard::None : z == 1 ? Shard::Zero1 : z == 2 ? Shard::Zero2 : Shard::Zero3);
                    } else if (dp == 1) {
                        shards = {Shard::None};
                    } else if (pp > 1) {
                        shards = {Shard::None, Shard::DistOpt};  // ZeRO-2/3 and FSDP do not combine with pipelines
                    } else {
                        shards = {Shard::None, Shard::DistOpt, Shard::Zero2, Shard::Zero3, Shard::Fsdp};
                        if (dp * tp * cp > per_node && per_node % (tp * cp) == 0 && per_node / (tp * cp) > 1) shards.push_back(Shard::Hsdp);
                    }
                    for (std::int64_t vpp : vpps)
                        for (std::int64_t ep : eps) {
                            if (!pr.ep.empty() && !allowed(pr.ep, ep)) continue;
                            for (Shard sh : shards) {
                                if ((sh == Shard::Zero2 || sh == Shard::Zero3 || sh == Shard::Fsdp || sh == Shard::Hsdp) && pp > 1) continue;
                                for (const auto& prec : precs)
                                    for (Optimizer o : opts)
                                        for (Recompute rc : recs) {
                                            Family f;
                                            f.tp = tp;
                                            f.cp = cp;
                                            f.pp = pp;
                                            f.vpp = vpp;
                                            f.ep = ep;
                                            f.dp = dp;
                                            f.emb_layer = emb;
                                            f.loss_layer = loss;
                                            f.shard = sh;
                                            f.precision = prec;
                                            f.optimizer = o;
                                            f.recompute = rc;
                                            families.push_back(f);
                                        }
                            }
                        }
                }
            }
        }

    EstimateRequest base = pr.base;
    base.analytic = true;
    base.parallel.gpus_per_node = per_node;
    base.parallel.nodes = 0;

    // One family: the micro-batches that divide the data-parallel share, the
    // largest that fits found by bisection, the fastest of those that fit.
    auto run_family = [&](const Family& f) {
        Found out;
        out.f = f;
        const std::int64_t per_dp = gb / f.dp;
        std::vector<std::int64_t> mbs;
        for (std::int64_t mb : divisors_upto(per_dp, kMaxMicroBatch)) {
            if (f.vpp > 1 && (per_dp / mb) % f.pp != 0) continue;  // Megatron's interleaving: micro-batches a multiple of pp
            mbs.push_back(mb);
        }
        if (mbs.empty()) return out;
        out.evaluated = static_cast<std::int64_t>(mbs.size());
        // Model states alone above the GPU: no micro-batch fits (they do not
        // depend on it), and no estimate is needed to say so: a floor under
        // every estimate (memory/parallel.hpp model_states_floor). 1,174
        // families of `plan llama-3.1-405b --gpus 16384` end here, 1,174 of
        // the 3,098 estimates it made without the floor.
        if (auto job = estimate_job(g, nullptr, to_request(base, f, mbs[0], per_dp / mbs[0]));
            job && static_cast<double>(model_states_floor(g, *job.value()).count()) > capacity) {
            out.ruled_out = true;
            return out;
        }
        std::vector<std::optional<EstimateResult>> mem(mbs.size());
        auto fits = [&](std::size_t i) -> bool {
            if (!mem[i]) {
                auto r = estimate(g, to_request(base, f, mbs[i], per_dp / mbs[i]));
                ++out.estimates;
                if (!r) return false;
                mem[i] = std::move(r).value();
            }
            return static_cast<double>(mem[i]->per_gpu.total_device.count()) <= capacity;
        };
        if (!fits(0)) return out;
        std::size_t lo = 0, hi = mbs.size() - 1;
        while (lo < hi) {  // the largest fitting index in [lo, hi]
            const std::size_t mid = (lo + hi + 1) / 2;
            if (fits(mid)) lo = mid;
            else hi = mid - 1;
        }
        out.fitting = static_cast<std::int64_t>(lo + 1);
        for (std::size_t i = 0; i <= lo; ++i) {
            // The job of an estimated micro-batch is the estimate's own.
            const auto resolved = estimate_job(g, mem[i] ? &*mem[i] : nullptr, to_request(base, f, mbs[i], per_dp / mbs[i]));
            if (!resolved) continue;
            const Job& job = *resolved.value();
            // States (what the time model reads from the estimate) do not depend on the micro-batch.
            auto t = compute_time(g, job, *mem[0], pr.compute);
            if (!t) continue;
            if (!out.ok || t.value().step_seconds < out.step) {
                out.ok = true;
                out.mb = mbs[i];
                out.ga = per_dp / mbs[i];
                out.step = t.value().step_seconds;
                out.tokens_per_second = t.value().tokens_per_second;
                out.parts = t.value().breakdown;
            }
        }
        if (out.ok) {
            const auto it = std::find(mbs.begin(), mbs.end(), out.mb);
            const std::size_t i = static_cast<std::size_t>(it - mbs.begin());
            fits(i);
            out.per_gpu = mem[i]->per_gpu;
        }
        return out;
    };
    auto search = [&](const std::vector<Family>& fams) {
        std::vector<Found> found(fams.size());
        parallel_for(fams.size(), pr.threads, [&](std::size_t i) { found[i] = run_family(fams[i]); });
        return found;
    };

    PlanResult out;
    out.gpus_per_node = per_node;
    std::vector<Found> found = search(families);
    bool offloaded = false;
    if (pr.allow_offload && std::none_of(found.begin(), found.end(), [](const Found& f) { return f.ok; })) {
        // Nothing fits on the GPUs: optimizer offload (ZeRO-Offload) as the last resort.
        std::vector<Family> off;
        for (Family f : families)
            if (f.pp == 1 && f.dp > 1 && (f.shard == Shard::Zero2 || f.shard == Shard::Zero3)) {
                f.offload = true;
                off.push_back(f);
            }
        auto more = search(off);
        found.insert(found.end(), more.begin(), more.end());
        offloaded = true;
    }
    std::vector<const Found*> ok;
    std::int64_t ruled_out = 0;
    for (const auto& f : found) {
        ruled_out += f.ruled_out ? 1 : 0;
        out.evaluated += f.evaluated;
        out.estimates += f.estimates;
        out.fitting += f.fitting;
        if (f.ok) ok.push_back(&f);
    }
    std::stable_sort(ok.begin(), ok.end(), [](const Found* a, const Found* b) {
        if (a->step != b->step) return a->step < b->step;
        return a->per_gpu.total_device < b->per_gpu.total_device;
    });
    auto candidate = [&](const Found& f) {
        PlanCandidate c;
        c.request = to_request(pr.base, f.f, f.mb, f.ga);
        c.request.analytic = false;
        c.request.parallel.gpus_per_node = per_node;
        c.request.parallel.nodes = 0;
        c.total_device = f.per_gpu.total_device;
        c.per_gpu = f.per_gpu;
        c.step_seconds = f.step;
        c.tokens_per_second = f.tokens_per_second;
        c.time = f.parts;
        return c;
    };
    // Confirm the fastest with the step simulation (in parallel), going down
    // the ranking until `confirm` of them fit or a few more were tried.
    std::int64_t dropped = 0;
    std::vector<std::string> dropped_lines;
    const Found* winner = nullptr;
    {
        const std::size_t want = static_cast<std::size_t>(std::max<std::int64_t>(0, pr.confirm));
        const std::size_t tries = std::min(ok.size(), want == 0 ? std::size_t{0} : 2 * want + 2);
        std::vector<std::optional<EstimateResult>> sims(tries);
        std::vector<PlanCandidate> cands;
        cands.reserve(tries);
        for (std::size_t i = 0; i < tries; ++i) cands.push_back(candidate(*ok[i]));
        // The candidates confirmed are those a serial walk down the ranking
        // simulates: until `want` of them fit or `tries` were simulated. A free
        // thread takes the next candidate as soon as the walk needs it whatever
        // the simulations still running give (fewer than `want` fit or run
        // before it), waits while that depends on them, and stops once `want`
        // fit before it: no round waits for its slowest member, nothing is
        // simulated that the walk does not reach, and the answer does not
        // depend on the number of threads.
        enum class Sim : char { Pending, Fits, NoFit };
        std::vector<Sim> state(tries, Sim::Pending);
        std::mutex state_mutex;
        std::condition_variable state_changed;
        std::size_t next = 0;
        bool failed = false;
        struct Taken {
            std::size_t k;
            bool last;  // no other candidate can start until a running one ends
        };
        auto take = [&]() -> std::optional<Taken> {
            std::unique_lock<std::mutex> lock(state_mutex);
            for (;;) {
                if (failed || next >= tries) return std::nullopt;
                std::size_t fit = 0, running = 0;
                for (std::size_t j = 0; j < next; ++j) {
                    fit += state[j] == Sim::Fits ? 1 : 0;
                    running += state[j] == Sim::Pending ? 1 : 0;
                }
                if (fit >= want) return std::nullopt;  // the walk ends before `next`
                if (fit + running < want) {  // the walk reaches `next` whatever the running ones give
                    const std::size_t k = next++;
                    // With k running, the walk waits for a result before the
                    // next candidate (or has none left).
                    return Taken{k, fit + running + 1 >= want || next >= tries};
                }
                state_changed.wait(lock);
            }
        };
        auto settle = [&](std::size_t k, Sim v) {
            {
                const std::lock_guard<std::mutex> lock(state_mutex);
                state[k] = v;
                if (v == Sim::Pending) failed = true;
            }
            state_changed.notify_all();
        };
        const std::size_t workers = parallel_width(tries, pr.threads);
        // The threads left over simulate a candidate's pipeline ranks side by
        // side; so does every core for a candidate after which the walk waits
        // (the other workers would idle: `plan llama-3.1-405b --gpus 16384`
        // ended on one 32-rank candidate simulated on one core).
        SimulateOptions so;
        so.threads = static_cast<int>(std::max<std::size_t>(1, parallel_width(kMaxThreads, pr.threads) / std::max<std::size_t>(1, workers)));
        const int all_threads = static_cast<int>(parallel_width(kMaxThreads, pr.threads));
        // Each worker writes its next candidate's traces into the storage of
        // the last one (sim/simulate.hpp keep_trace_storage) and frees it when
        // it is done (with replay()'s tables and the runs' events handed on:
        // page faults of `gpumem plan llama-3-70b --gpus 64` 35k -> 18k).
        so.keep_trace_storage = true;
        // A candidate is confirmed only if it fits within `capacity`: its
        // simulation stops at the first rank that needs more (the walk then
        // drops it; the line says what that rank needs). Three of the six
        // candidates `plan llama-3.1-405b --gpus 16384` simulates do not fit.
        so.stop_above = Bytes(static_cast<std::int64_t>(std::floor(capacity)));
        // Only the peaks are read: no timeline.
        so.timeline = false;
        parallel_for(workers, pr.threads, [&](std::size_t) {
            const sim::ReleaseTraceStorageAtExit release;
            while (const auto t = take()) {
                const std::size_t k = t->k;
                try {
                    SimulateOptions mine = so;
                    if (t->last) mine.threads = all_threads;
                    auto sim = simulate_estimate(g, cands[k].request, mine);
                    const bool fits = sim && static_cast<double>(sim->per_gpu.total_device.count()) <= capacity;
                    if (sim) sims[k] = std::move(sim).value();
                    settle(k, fits ? Sim::Fits : Sim::NoFit);
                } catch (...) {
                    settle(k, Sim::Pending);  // stops the other threads (parallel_for rethrows)
                    throw;
                }
            }
        });
        std::size_t done = 0, fitting_confirmed = 0;
        while (done < tries && fitting_confirmed < want) {
            if (state[done] == Sim::Fits) ++fitting_confirmed;
            ++done;
        }
        for (std::size_t i = 0; i < ok.size() && static_cast<std::int64_t>(out.top.size()) < pr.top; ++i) {
            PlanCandidate c = i < cands.size() ? cands[i] : candidate(*ok[i]);
            if (i < done && sims[i]) {
                c.confirmed = true;
                c.per_gpu = sims[i]->per_gpu;
                c.total_device = c.per_gpu.total_device;
                c.fits_confirmed = static_cast<double>(c.total_device.count()) <= capacity;
                if (!c.fits_confirmed) {
                    const bool stopped = sims[i]->simulation && sims[i]->simulation->stopped_at_stage >= 0;
                    dropped_lines.push_back(request_to_command(c.request) + ": analytic " + format_bytes(ok[i]->per_gpu.total_device) +
                                            ", simulated " + (stopped ? "at least " : "") + format_bytes(c.total_device) +
                                            " (the caching allocator's fragmentation" +
                                            (stopped ? "; the simulation stopped at stage " + std::to_string(sims[i]->simulation->stopped_at_stage) +
                                                           ", the first that does not fit)"
                                                     : std::string(")")));
                    ++dropped;
                    continue;  // the simulation disagrees: not offered
                }
            }
            if (out.top.empty()) winner = ok[i];
            out.top.push_back(c);
        }
    }
    // Pareto front over (memory, step time).
    std::vector<const Found*> bymem = ok;
    std::stable_sort(bymem.begin(), bymem.end(), [](const Found* a, const Found* b) { return a->per_gpu.total_device < b->per_gpu.total_device; });
    double best = 1e300;
    for (const auto* f : bymem)
        if (f->step < best * 0.999) {
            best = f->step;
            out.pareto.push_back(candidate(*f));
            if (out.pareto.size() >= 12) break;
        }

    if (winner) {
        const Found& w = *winner;
        const TimeBreakdown& b = w.parts;
        const double step = w.step > 0 ? w.step : 1;
        out.why = fmt::format(
            "fastest fitting layout: {}, recompute {}, micro-batch {} x {}: {:.3f} s per step (compute {:.0f}%, pipeline bubble {:.0f}%, exposed "
            "communication {:.0f}%), {} of {} per GPU with {:.0f}% headroom",
            layout_name(w.f), to_string(w.f.recompute), w.mb, w.ga, w.step, 100 * b.compute / step, 100 * b.bubble / step,
            100 * (b.tp + b.cp + b.ep + b.pp + b.dp) / step, format_bytes(out.top.front().total_device),
            format_bytes(bres.value().per_gpu.capacity), 100 * pr.headroom);
    } else {
        out.why = "no layout fits: add GPUs, shorten the sequence, lower the global batch, or allow other precisions/optimizers "
                  "(--search-precision, --search-optimizer)";
    }
    out.assumptions.push_back("global batch " + std::to_string(gb) + " sequences of " + std::to_string(seq) + " tokens on " + std::to_string(gpus) +
                              " GPUs, " + std::to_string(per_node) + " per node" +
                              (pr.base.parallel.gpus_per_node > 0 || pr.base.parallel.nodes > 0 ? "" : " (the " + gpu.name + "'s board)"));
    out.assumptions.push_back(std::string("precision ") + (pr.base.precision ? to_string(*pr.base.precision) : "amp-bf16 (default)") + " and optimizer " +
                              to_string(pr.base.optimizer) +
                              (pr.search_precision || !pr.precision.empty() || pr.search_optimizer || !pr.optimizer.empty()
                                   ? "; alternatives searched as asked"
                                   : " kept as given (--search-precision / --search-optimizer to try others)"));
    out.assumptions.push_back(pr.tp.empty() ? "tensor parallelism inside a node (tp <= " + std::to_string(per_node) + "; --only-tp to go beyond)"
                                            : "tensor parallelism as given by --only-tp");
    out.assumptions.push_back("scored with the analytic estimate and the time model of `gpumem estimate --analytic` (" + std::to_string(out.estimates) +
                              " estimates for " + std::to_string(out.evaluated) + " configurations: memory grows with the micro-batch, so each family is bisected" +
                              (ruled_out > 0 ? "; " + std::to_string(ruled_out) + " families ruled out by their model states alone, before any estimate" : std::string()) + "); " +
                              (pr.confirm > 0 ? "the top " + std::to_string(pr.confirm) + " re-checked by the step simulation"
                                              : std::string("none re-checked by the step simulation (analytic peaks only)")) +
                              (dropped > 0 ? " (" + std::to_string(dropped) + " dropped: the simulation did not fit them)" : ""));
    for (const auto& l : dropped_lines) out.assumptions.push_back("not offered, the simulation does not fit it: " + l);
    if (offloaded) out.assumptions.push_back("nothing fits on the GPUs alone: optimizer offload to CPU memory searched");
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

}  // namespace gpumem
