// gpumem_load_test: starts the HTTP service in-process on 127.0.0.1 (an
// ephemeral port) and sends N POST /v1/estimate requests from T client
// threads over keep-alive connections. Reports latency percentiles and
// throughput; exits 1 on any error or when it runs past the time limit.
//
//   gpumem_load_test [--requests N=4000] [--threads T=8] [--server-threads S] [--limit-s 60]
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpumem/server/server.hpp"

namespace {

long arg_value(int argc, char** argv, const char* name, long def) {
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
    return def;
}

}  // namespace

int main(int argc, char** argv) {
    using clock = std::chrono::steady_clock;
    const long n = std::max(1L, arg_value(argc, argv, "--requests", 4000));
    const long t = std::clamp(arg_value(argc, argv, "--threads", 8), 1L, 256L);
    const long server_threads = arg_value(argc, argv, "--server-threads", 0);
    const long limit_s = std::clamp(arg_value(argc, argv, "--limit-s", 60), 1L, 3600L);

    gpumem::server::ServerOptions opt;
    opt.threads = static_cast<int>(std::max<long>(server_threads, 0));
    if (opt.threads == 0) opt.threads = std::max(8, static_cast<int>(t) + 2);  // a pool thread per keep-alive client
    gpumem::server::Server server(opt);
    if (!server.start("127.0.0.1", 0)) {
        std::fprintf(stderr, "gpumem_load_test: %s\n", server.error().c_str());
        return 1;
    }
    const int port = server.port();
    const std::string body = R"({"model": "llama-3.2-1b", "batch": 2, "seq": 1024})";

    std::atomic<long> next{0}, errors{0};
    std::atomic<bool> timed_out{false};
    std::mutex mu;
    std::vector<double> latencies_ms;
    latencies_ms.reserve(static_cast<std::size_t>(n));
    const auto start = clock::now();
    const auto deadline = start + std::chrono::seconds(limit_s);

    std::vector<std::thread> clients;
    for (long i = 0; i < t; ++i) {
        clients.emplace_back([&] {
            httplib::Client cli("127.0.0.1", port);
            cli.set_keep_alive(true);
            cli.set_read_timeout(30, 0);
            std::vector<double> mine;
            while (next.fetch_add(1) < n) {
                if (clock::now() > deadline) {
                    timed_out = true;
                    break;
                }
                const auto t0 = clock::now();
                auto res = cli.Post("/v1/estimate", body, "application/json");
                const auto t1 = clock::now();
                if (!res || res->status != 200) {
                    if (errors.fetch_add(1) < 5)
                        std::fprintf(stderr, "gpumem_load_test: request failed: %s\n",
                                     res ? (std::to_string(res->status) + " " + res->body.substr(0, 200)).c_str()
                                         : httplib::to_string(res.error()).c_str());
                    continue;
                }
                mine.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
            }
            std::lock_guard<std::mutex> lock(mu);
            latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
        });
    }
    for (auto& c : clients) c.join();
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    server.stop();

    std::sort(latencies_ms.begin(), latencies_ms.end());
    const auto pct = [&](double p) {
        if (latencies_ms.empty()) return 0.0;
        const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(latencies_ms.size() - 1) + 0.5);
        return latencies_ms[std::min(i, latencies_ms.size() - 1)];
    };
    std::printf("gpumem_load_test: %zu ok, %ld errors, %ld client threads, %d server threads, %.2f s\n", latencies_ms.size(), errors.load(), t,
                opt.threads, elapsed);
    std::printf("latency ms: p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", pct(50), pct(90), pct(99),
                latencies_ms.empty() ? 0.0 : latencies_ms.back());
    std::printf("throughput: %.0f requests/s\n", static_cast<double>(latencies_ms.size()) / elapsed);
    if (timed_out) std::fprintf(stderr, "gpumem_load_test: stopped at the %ld s limit\n", limit_s);
    return errors.load() == 0 && !timed_out && static_cast<long>(latencies_ms.size()) == n ? 0 : 1;
}
