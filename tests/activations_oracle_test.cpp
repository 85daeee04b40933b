// per_gpu.activations against the CPU oracle (oracle/activations_oracle.py,
// PyTorch 1.13 on CPU, saved_tensors_hooks deduplicated by storage). The
// fixture's `saved_bytes_modern_torch` drops the one 1.13-only save (mean()
// keeping its input, gone in torch >= 2.0 derivatives.yaml); dropout is
// measured through native_dropout (1-byte masks, as on CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/model/load.hpp"
#include "test_util.hpp"

using namespace gpumem;


TEST(ActivationsOracle, EveryCaseWithinThreePercent) {
    const auto fx = test::read_json("tests/fixtures/oracle/activations.json");
    int checked = 0;
    for (const auto& cs : fx["cases"]) {
        const auto& c = cs["config"];
        if (c.value("dropout_impl", "native") != "native") continue;  // CPU F.dropout saves fp32 noise
        const std::string family = cs["family"];
        auto g = load_hf_config_json(test::oracle_hf_config(c, family), "oracle case");
        ASSERT_TRUE(g.ok()) << g.error().message;
        EstimateRequest req;
        req.mode = Mode::Train;
        req.precision = Precision::FP32;
        req.attention = Attention::Eager;
        req.batch = cs["batch"].get<std::int64_t>();
        req.seq = cs["seq"].get<std::int64_t>();
        auto r = estimate(g.value(), req);
        ASSERT_TRUE(r.ok()) << r.error().message;
        const double want = cs["saved_bytes_modern_torch"].get<double>();
        const double got = static_cast<double>(r.value().per_gpu.activations.count());
        EXPECT_NEAR(got / want, 1.0, 0.03) << family << " b=" << req.batch << " s=" << *req.seq << " h=" << c["hidden"]
                                           << " L=" << c["layers"] << " want " << want << " got " << got;
        ++checked;
    }
    EXPECT_GE(checked, 30);
}
