// band_for(job) (memory/uncertainty.hpp) looks the band up without building
// band_paths(job); both must pick the same band for every kind of job. The
// grid: every framework x one GPU, data parallel, ZeRO-1/3, FSDP, tensor and
// pipeline parallel, and inference.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "gpumem/memory/job.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/memory/uncertainty.hpp"
#include "gpumem/model/load.hpp"

namespace gpumem {
namespace {

TEST(ErrorBandLookup, SameBandAsTheListOfPaths) {
    const ModelGraph g = load_model("gpt2").value();
    int checked = 0;
    std::set<std::string> seen;
    for (int fw = 0; fw <= static_cast<int>(Framework::LlamaFactory); ++fw)
        for (int layout = 0; layout < 7; ++layout) {
            EstimateRequest req;
            req.model = "gpt2";
            req.framework = static_cast<Framework>(fw);
            ParallelConfig& p = req.parallel;
            switch (layout) {
                case 0: break;
                case 1: p.gpus = 8; break;
                case 2: p.gpus = 8; p.zero = 1; break;
                case 3: p.gpus = 8; p.zero = 3; break;
                case 4: p.gpus = 8; p.fsdp = Fsdp::Full; break;
                case 5: p.gpus = 4; p.tp = 2; p.pp = 2; break;
                case 6: req.mode = Mode::Infer; break;
            }
            auto job = resolve_job(g, req);
            if (!job) continue;  // a framework that refuses the layout
            const ErrorBand& fast = band_for(job.value());
            const ErrorBand& listed = band_for_paths(band_paths(job.value()));
            EXPECT_EQ(&fast, &listed) << request_to_command(req) << ": " << fast.path << " vs " << listed.path;
            seen.insert(fast.path);
            ++checked;
        }
    EXPECT_GT(checked, 50);
    EXPECT_GE(seen.size(), 5u);  // framework paths, kind paths, train/distributed, infer
}

}  // namespace
}  // namespace gpumem
