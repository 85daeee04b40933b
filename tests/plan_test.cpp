// gpumem plan / sweep / estimate --tokens through the CLI: the JSON contracts
// and facts checked against separate estimates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpumem/sim/simulate.hpp"
#include "test_util.hpp"

using namespace gpumem;

TEST(Plan, JsonContractAndWinnerFits) {
    const auto r = test::run_cli("plan llama-3-8b --gpus 8 --gpu H100 --seq 4096 --global-batch 64 --top 3 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GT(j["evaluated"].get<std::int64_t>(), j["fitting"].get<std::int64_t>());
    EXPECT_GT(j["fitting"].get<std::int64_t>(), 0);
    ASSERT_EQ(j["top"].size(), 3u);
    const auto& best = j["top"][0];
    for (const char* k : {"tp", "pp", "dp", "zero", "recompute", "batch", "grad_accum", "per_gpu", "time"}) EXPECT_TRUE(best.contains(k)) << k;
    EXPECT_EQ(best["tp"].get<std::int64_t>() * best["pp"].get<std::int64_t>() * best["dp"].get<std::int64_t>() * best["cp"].get<std::int64_t>(), 8);
    EXPECT_EQ(best["dp"].get<std::int64_t>() * best["batch"].get<std::int64_t>() * best["grad_accum"].get<std::int64_t>(), 64);
    // Confirmed by the simulator: it fits within the 5% headroom of 80 GiB.
    EXPECT_TRUE(best["per_gpu"]["fits"].get<bool>());
    EXPECT_LE(best["per_gpu"]["total_device"].get<double>(), 0.95 * 80.0 * 1024 * 1024 * 1024);
    // Ranked by throughput.
    EXPECT_LE(j["top"][0]["time"]["step_seconds"].get<double>(), j["top"][2]["time"]["step_seconds"].get<double>());
}

TEST(Plan, RestrictionsAreHonoured) {
    const auto r = test::run_cli("plan llama-3-8b --gpus 8 --gpu H100 --seq 2048 --only-tp 2 --only-zero 1 --top 5 --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& c : nlohmann::json::parse(r.out)["top"]) {
        EXPECT_EQ(c["tp"].get<int>(), 2);
        EXPECT_EQ(c["zero"].get<int>(), 1);
    }
    EXPECT_EQ(test::run_cli("plan llama-3-8b --gpus 8 --headroom lots").exit_code, 2);
}

TEST(Plan, EstimateTokensJson) {
    const auto r = test::run_cli("estimate llama-3.2-1b --seq 2048 --batch 4 --tokens 1e9 --gpu A100-80GB --format json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const double step = j["time"]["step_seconds"].get<double>();
    const double total = j["time"]["total_seconds"].get<double>();
    // total = tokens / (tokens per step / step time), tokens per step = 4 x 2048.
    EXPECT_NEAR(total, 1e9 / (4.0 * 2048.0) * step, total * 1e-6);
    EXPECT_GT(j["flops"]["per_step"].get<double>(), 0.0);
}

TEST(Plan, SweepCliWritesPlot) {
    const std::string svg = std::string(::testing::TempDir()) + "gpumem_sweep_" + std::to_string(getpid()) + ".svg";
    const auto r = test::run_cli("sweep gpt2 --batches 1,2,4 --seqs 512 --analytic --format json --plot " + svg);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["points"].size(), 3u);
    std::ifstream f(svg);
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_EQ(ss.str().rfind("<svg", 0), 0u);
    EXPECT_EQ(test::run_cli("sweep gpt2 --batches 1,x").exit_code, 2);
}
