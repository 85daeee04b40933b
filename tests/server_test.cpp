// The HTTP service (gpumem serve) in-process on 127.0.0.1, an ephemeral port.
#ifdef GPUMEM_HAVE_SERVER

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/server/server.hpp"
#include "test_util.hpp"

namespace {

using json = nlohmann::json;

class ServerTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        gpumem::server::ServerOptions opt;
        opt.threads = 12;  // a pool thread per keep-alive client (8 in the concurrency test)
        opt.max_body = 1 << 20;
        server_ = new gpumem::server::Server(opt);
        ASSERT_TRUE(server_->start("127.0.0.1", 0)) << server_->error();
        ASSERT_GT(server_->port(), 0);
    }
    static void TearDownTestSuite() {
        server_->stop();
        delete server_;
        server_ = nullptr;
    }
    static httplib::Client client() {
        httplib::Client c("127.0.0.1", server_->port());
        c.set_read_timeout(60, 0);
        return c;
    }
    static gpumem::server::Server* server_;
};
gpumem::server::Server* ServerTest::server_ = nullptr;

json body_json(const httplib::Result& r) { return json::parse(r->body); }

TEST_F(ServerTest, Healthz) {
    auto c = client();
    auto r = c.Get("/healthz");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_json(r), json({{"status", "ok"}}));
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
}

TEST_F(ServerTest, IndexPageAndCatalogs) {
    auto c = client();
    auto r = c.Get("/");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("<html"), std::string::npos);
    auto m = c.Get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    EXPECT_EQ(body_json(m), gpumem::api_call("models", json::object()).value());
    auto g = c.Get("/v1/gpus");
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 200);
}

TEST_F(ServerTest, EstimateMatchesApiCall) {
    const json req = {{"model", "llama-3.2-1b"}, {"batch", 2}, {"seq", 1024}};
    auto c = client();
    auto r = c.Post("/v1/estimate", req.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_json(r), gpumem::api_call("estimate", req).value());
}

TEST_F(ServerTest, CalibrateThenEstimateWithTheDocument) {
    // POST /v1/calibrate answers the calibration document; /v1/estimate takes it
    // inline as "calibration" (a path is refused: the service reads no files).
    const json job = {{"model", "gpt2"}, {"batch", 4}, {"seq", 512}, {"gpu", "A100-40GB"}, {"analytic", true}};
    json creq = job;
    creq["measured-total"] = "9GiB";
    auto c = client();
    auto cal = c.Post("/v1/calibrate", creq.dump(), "application/json");
    ASSERT_TRUE(cal);
    ASSERT_EQ(cal->status, 200) << cal->body;
    json ereq = job;
    ereq["calibration"] = body_json(cal);
    auto est = c.Post("/v1/estimate", ereq.dump(), "application/json");
    ASSERT_TRUE(est);
    ASSERT_EQ(est->status, 200) << est->body;
    EXPECT_EQ(body_json(est)["per_gpu"]["total_device"], std::int64_t{9} << 30);
    EXPECT_TRUE(body_json(est)["uncertainty"]["calibrated"].get<bool>());
    ereq["calibration"] = "calib.json";
    auto refused = c.Post("/v1/estimate", ereq.dump(), "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400);
    EXPECT_EQ(body_json(refused)["error"]["field"], "calibration");
}

TEST_F(ServerTest, BadInputIs400WithField) {
    auto c = client();
    auto r = c.Post("/v1/estimate", R"({"model": "llama-3.2-1b", "batch": -1, "seq": 1024})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_json(r)["error"]["field"], "batch");
}

TEST_F(ServerTest, MalformedJsonIs400) {
    auto c = client();
    auto r = c.Post("/v1/estimate", "{\"model\": ", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_json(r)["error"]["code"], "parse_error");
    EXPECT_EQ(body_json(r)["error"]["field"], "");
}

TEST_F(ServerTest, ModelPathsAreRefused) {
    auto c = client();
    const std::string path = gpumem::test::source_path("data/presets/configs");
    auto r = c.Post("/v1/estimate", json({{"model", path}, {"batch", 1}, {"seq", 128}}).dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(body_json(r)["error"]["field"], "model");
}

TEST_F(ServerTest, UnknownRouteIs404Json) {
    auto c = client();
    auto r = c.Get("/v1/nope");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(body_json(r)["error"]["code"], "not_found");
}

// A known route with the wrong method answers 405 (with an Allow header).
TEST_F(ServerTest, WrongMethodIs405) {
    auto c = client();
    auto r = c.Get("/v1/estimate");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "POST");
    EXPECT_EQ(body_json(r)["error"]["code"], "method_not_allowed");
    auto p = c.Post("/healthz", "{}", "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 405);
}

TEST_F(ServerTest, TooLargeBodyIs413) {
    auto c = client();
    const std::string big(2u << 20, ' ');  // limit is 1 MiB here
    auto r = c.Post("/v1/estimate", big, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(body_json(r)["error"]["code"], "payload_too_large");
}

TEST_F(ServerTest, SnapshotUpload) {
    std::ifstream f(gpumem::test::source_path("tests/fixtures/snapshots/train_step.pickle"), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    auto c = client();
    auto r = c.Post("/v1/snapshot", ss.str(), "application/octet-stream");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = body_json(r);
    const auto expected = gpumem::api_snapshot_bytes(ss.str(), json::object());
    ASSERT_TRUE(expected);
    EXPECT_EQ(j, expected.value());
    // peak_allocated is an integer somewhere in the summary.
    bool found = false;
    std::function<void(const json&)> walk = [&](const json& x) {
        if (x.is_object())
            for (const auto& [k, v] : x.items()) {
                if (k == "peak_allocated") {
                    EXPECT_TRUE(v.is_number_integer()) << v;
                    found = true;
                }
                walk(v);
            }
        else if (x.is_array())
            for (const auto& v : x) walk(v);
    };
    walk(j);
    EXPECT_TRUE(found) << j.dump().substr(0, 400);

    auto bad = c.Post("/v1/snapshot?device=x", ss.str(), "application/octet-stream");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_EQ(body_json(bad)["error"]["field"], "device");
    auto garbage = c.Post("/v1/snapshot", std::string("\x80\x04not a pickle", 14), "application/octet-stream");
    ASSERT_TRUE(garbage);
    EXPECT_EQ(garbage->status / 100, 4) << garbage->body;
}

TEST_F(ServerTest, SnapshotPathIsRefused) {
    auto c = client();
    const json req = {{"path", gpumem::test::source_path("tests/fixtures/snapshots/train_step.pickle")}};
    auto r = c.Post("/v1/snapshot", req.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_json(r)["error"]["field"], "path");
}

TEST_F(ServerTest, ConcurrentRequests) {
    const std::string req = R"({"model": "llama-3.2-1b", "batch": 1, "seq": 512})";
    std::atomic<int> ok{0}, bad{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 8; ++i)
        ts.emplace_back([&] {
            auto c = client();
            c.set_keep_alive(true);
            for (int k = 0; k < 50; ++k) {
                auto r = c.Post("/v1/estimate", req, "application/json");
                if (r && r->status == 200) ++ok;
                else ++bad;
            }
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(ok.load(), 400);
    EXPECT_EQ(bad.load(), 0);
}

TEST_F(ServerTest, TimeBudgetAnswers503) {
    gpumem::server::ServerOptions opt;
    opt.time_budget = std::chrono::milliseconds(1);
    opt.threads = 2;
    gpumem::server::Server s(opt);
    ASSERT_TRUE(s.start("127.0.0.1", 0));
    httplib::Client c("127.0.0.1", s.port());
    auto r = c.Post("/v1/plan", R"({"model": "llama-3-8b", "gpus": 8, "seq": 4096})", "application/json");
    ASSERT_TRUE(r);
    if (r->status == 503) EXPECT_EQ(body_json(r)["error"]["code"], "timeout");
    else EXPECT_EQ(r->status, 200);  // a very fast machine
    s.stop();
}

TEST(ServerParse, Durations) {
    using gpumem::server::parse_duration;
    EXPECT_EQ(parse_duration("10s", "t").value().count(), 10000);
    EXPECT_EQ(parse_duration("500ms", "t").value().count(), 500);
    EXPECT_EQ(parse_duration("2m", "t").value().count(), 120000);
    EXPECT_EQ(parse_duration("3", "t").value().count(), 3000);
    EXPECT_FALSE(parse_duration("fast", "t"));
    EXPECT_FALSE(parse_duration("0s", "t"));
}

}  // namespace

#endif  // GPUMEM_HAVE_SERVER
