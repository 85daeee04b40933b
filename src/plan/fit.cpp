#include "gpumem/plan/fit.hpp"

#include <algorithm>

#include "gpumem/model/load.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

namespace {

struct Probe {
    bool ok = false;       // the estimate ran
    bool fits = false;
    EstimateResult result;
    Error error;
};

// What grows the most between two estimates: the row that explains the step up.
std::string growth(const EstimateResult& a, const EstimateResult& b) {
    std::string key;
    Bytes best(-1);
    for (const auto& rb : b.breakdown) {
        Bytes before;
        for (const auto& ra : a.breakdown)
            if (ra.key == rb.key) before = ra.bytes;
        if (rb.bytes - before > best) {
            best = rb.bytes - before;
            key = rb.label;
        }
    }
    return key.empty() ? "total" : key + " (+" + format_bytes(best) + ")";
}

FitAxis search(const ModelGraph& g, const FitRequest& fr, bool batch_axis) {
    FitAxis ax;
    ax.axis = batch_axis ? "batch" : "seq";
    const std::int64_t limit = batch_axis ? fr.max_batch
                                          : (g.max_positions > 0 ? std::min<std::int64_t>(fr.max_seq, g.max_positions) : fr.max_seq);
    auto probe = [&](std::int64_t v) {
        Probe p;
        EstimateRequest r = fr.base;
        if (batch_axis) r.batch = v;
        else r.seq = v;
        auto e = fr.simulate ? simulate_estimate(g, r) : estimate(g, r);
        ++ax.probes;
        if (!e) {
            p.error = e.error();
            return p;
        }
        p.ok = true;
        p.fits = e.value().per_gpu.fits;
        p.result = std::move(e).value();
        return p;
    };
    Probe lo_p = probe(1);
    if (!lo_p.ok) {
        ax.limit = lo_p.error.message;
        return ax;
    }
    ax.capacity = lo_p.result.per_gpu.capacity;
    if (!lo_p.fits) {
        ax.total_next = lo_p.result.per_gpu.total_device;
        ax.limit = "even " + ax.axis + " 1 needs " + format_bytes(lo_p.result.per_gpu.total_device) + " of " + format_bytes(ax.capacity) +
                   "; the fixed parts (weights, optimizer states) do not fit: see gpumem advise";
        return ax;
    }
    // Double until a probe does not fit (or an estimate is rejected, e.g. overflow).
    std::int64_t lo = 1, hi = 0;
    Probe best = lo_p, over;
    while (hi == 0) {
        const std::int64_t next = lo * 2;
        if (next > limit) {
            if (lo < limit) {
                Probe p = probe(limit);
                if (p.ok && p.fits) {
                    lo = limit;
                    best = std::move(p);
                } else {
                    hi = limit;
                    over = std::move(p);
                    break;
                }
            }
            ax.largest = lo;
            ax.total_at_largest = best.result.per_gpu.total_device;
            ax.limit = batch_axis ? "reached the search limit of " + std::to_string(limit)
                                  : (g.max_positions > 0 && limit == g.max_positions ? "reached the model's maximum of " + std::to_string(limit) + " positions"
                                                                                    : "reached the search limit of " + std::to_string(limit));
            return ax;
        }
        Probe p = probe(next);
        if (p.ok && p.fits) {
            lo = next;
            best = std::move(p);
        } else {
            hi = next;
            over = std::move(p);
        }
    }
    while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        Probe p = probe(mid);
        if (p.ok && p.fits) {
            lo = mid;
            best = std::move(p);
        } else {
            hi = mid;
            over = std::move(p);
        }
    }
    ax.largest = lo;
    ax.total_at_largest = best.result.per_gpu.total_device;
    if (over.ok) {
        ax.total_next = over.result.per_gpu.total_device;
        ax.limit = ax.axis + " " + std::to_string(hi) + " needs " + format_bytes(over.result.per_gpu.total_device) + " of " +
                   format_bytes(ax.capacity) + " (over by " + format_bytes(over.result.per_gpu.total_device - ax.capacity) +
                   "); growing most: " + growth(best.result, over.result);
    } else {
        ax.limit = ax.axis + " " + std::to_string(hi) + " is rejected: " + over.error.message;
    }
    return ax;
}

}  // namespace

Result<FitResult> fit(const FitRequest& fr) {
    if (fr.base.params_count)
        return Error{ErrorCode::InvalidArgument, "fit needs a model graph (a preset, config.json, folder or layer-list JSON), not --params", "params"};
    auto g = load_model(fr.base.model, model_options(fr.base));
    if (!g) return g.error();
    // Validate the settings once with the request as given (batch/seq aside).
    EstimateRequest check = fr.base;
    check.batch = 1;
    auto base = estimate(g.value(), check);
    if (!base) return base.error();
    FitResult r;
    r.model = g.value().name;
    r.gpu = base.value().gpu().name;
    r.assumptions = base.value().assumptions;
    r.batch = search(g.value(), fr, true);
    if (g.value().has_sequence) r.seq = search(g.value(), fr, false);
    else r.seq.axis = "seq", r.seq.limit = "this model has a fixed input shape";
    return r;
}

}  // namespace gpumem
