// fuzz/fuzz_graph.hpp — what a fuzz target does with a model it loaded.
//
// A loader that accepts hostile input must give a graph every later stage can
// use: absurd but accepted sizes must come out of the estimate as an answer
// or an error (an OverflowError is an error), never as a crash or a negative
// byte count. Each accepted graph is therefore estimated for training and for
// inference with the defaults.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "fuzz_common.hpp"
#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem_fuzz {

inline void exercise_graph(const gpumem::ModelGraph& g) {
    for (const gpumem::Mode mode : {gpumem::Mode::Train, gpumem::Mode::Infer}) {
        answer_or_error([&] {
            gpumem::EstimateRequest req;
            req.mode = mode;
            req.seq = 128;
            const auto r = gpumem::estimate(g, req);
            check_error_message(r);
            if (!r.ok()) return;
            const auto& p = r.value().per_gpu;
            for (const gpumem::Bytes b : {p.weights, p.gradients, p.optimizer_states, p.activations, p.kv_cache, p.transient,
                                          p.peak_allocated, p.peak_reserved, p.total_device}) {
                if (b.count() < 0) {
                    std::fprintf(stderr, "finding: a negative byte count (%lld) in an estimate\n",
                                 static_cast<long long>(b.count()));
                    std::abort();
                }
            }
        });
    }
}

// One fuzz input as a model file named `name`, read by `load` (a loader taking
// a path, returning Result<ModelGraph>); an accepted graph is then estimated.
template <class Load>
int fuzz_model_file(const char* name, const std::uint8_t* data, std::size_t size, Load load) {
    const std::string& path = write_scratch(name, as_text(data, size));
    answer_or_error([&] {
        auto g = load(path);
        check_error_message(g);
        if (g.ok()) exercise_graph(g.value());
    });
    return 0;
}

}  // namespace gpumem_fuzz
