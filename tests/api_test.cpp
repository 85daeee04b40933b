// api_call (the entry point of the HTTP service and the Python bindings)
// returns what the CLI prints with --format json for the same request.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "test_util.hpp"

using namespace gpumem;

TEST(Api, EstimateEqualsCliJson) {
    const auto cli = test::run_cli("estimate llama-3.2-1b --batch 2 --seq 1024 --gpu A100-80GB --recompute full --format json");
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    auto r = api_call("estimate", {{"model", "llama-3.2-1b"}, {"batch", 2}, {"seq", 1024}, {"gpu", "A100-80GB"}, {"recompute", "full"}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value(), nlohmann::json::parse(cli.out));
}

TEST(Api, OtherCommandsAndErrors) {
    EXPECT_TRUE(api_call("models", nlohmann::json::object()).ok());
    auto sw = api_call("sweep", {{"model", "gpt2"}, {"batches", {1, 2}}, {"seq", 256}, {"analytic", true}});
    ASSERT_TRUE(sw.ok()) << sw.error().message;
    EXPECT_EQ(sw.value()["points"].size(), 2u);
    auto bad = api_call("estimate", {{"model", "gpt2"}, {"batch", -1}});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().field, "batch");
    auto path = api_call("snapshot", {{"path", "/etc/passwd"}});
    ASSERT_FALSE(path.ok());
    EXPECT_EQ(path.error().field, "path");
    EXPECT_FALSE(api_call("nope", nlohmann::json::object()).ok());
}

// An uploaded config.json (the web page reads it in the browser and sends it
// inline) estimates like the same file given to the CLI.
TEST(Api, InlineConfigEqualsCliOnTheFile) {
    const std::string path = test::source_path("data/presets/configs/smollm2-135m.json");
    const auto cli = test::run_cli("estimate " + path + " --batch 2 --seq 512 --format json");
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    auto r = api_call("estimate", {{"config", test::read_json("data/presets/configs/smollm2-135m.json")}, {"batch", 2}, {"seq", 512}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    auto want = nlohmann::json::parse(cli.out);
    EXPECT_EQ(r.value()["per_gpu"], want["per_gpu"]);
    EXPECT_EQ(r.value()["breakdown"], want["breakdown"]);
    auto bad = api_call("estimate", {{"config", {{"model_type", "nope"}}}});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().field, "model_type");
}

// `plan --analytic` ranks with the analytic estimate alone: no candidate is
// re-checked by the step simulation (the flag's help: "skip the step
// simulation"); without it the fastest are confirmed.
TEST(Api, PlanAnalyticSkipsTheConfirmingSimulation) {
    const nlohmann::json base = {{"model", "llama-3.2-1b"}, {"gpus", 8}, {"top", 4}};
    nlohmann::json analytic = base;
    analytic["analytic"] = true;
    auto a = api_call("plan", analytic);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_FALSE(a.value()["top"].empty());
    for (const auto& c : a.value()["top"]) EXPECT_FALSE(c["confirmed_by_simulation"].get<bool>()) << c["command"];
    auto s = api_call("plan", base);
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_FALSE(s.value()["top"].empty());
    EXPECT_TRUE(s.value()["top"][0]["confirmed_by_simulation"].get<bool>()) << s.value()["top"][0]["command"];
    // The same layouts rank first either way (the ranking is the analytic one).
    EXPECT_EQ(a.value()["top"][0]["command"], s.value()["top"][0]["command"]);
}
