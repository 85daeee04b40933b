// gpumem_load_test: the HTTP service under load, in-process on 127.0.0.1 (an
// ephemeral port; nothing leaves loopback), bounded in time.
//
//   1. throughput: C keep-alive connections (8, then 64) from one poll() loop
//      post the analytic /v1/estimate for --phase-s seconds each, one request
//      in flight per connection: requests/s, p50/p99, answers per connection
//      (min..max, Jain's fairness index); every answer byte-identical to the
//      in-process one;
//   2. burst: --burst connections at once, without keep-alive, from one
//      poll() loop: normal posts, GET /healthz, garbage bytes, over-long
//      headers, and slow clients that send half a request and stall;
//   3. during the burst, a checker posts one (simulated) request and compares
//      each 200 answer's bytes with the in-process API's (api_call) for the
//      same body.
// Passes (exit 0) when every answer is 200, 4xx or 503, connections reset
// without an answer stay under 1% of the burst, every checked estimate is
// equal, both throughput phases and the checker got answers, and the run
// stayed within --limit-s.
//
//   gpumem_load_test [--phase-s 3] [--burst 2000] [--limit-s 20] [--concurrency N]
#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/server/server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double arg_value(int argc, char** argv, const char* name, double def) {
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return std::strtod(argv[i + 1], nullptr);
    return def;
}

const std::string kBody = R"({"model": "llama-3.2-1b", "batch": 2, "seq": 1024, "analytic": true})";

struct Tally {
    std::mutex m;
    std::map<int, long> status;  // HTTP status -> count; 0: no answer
    long bad_status = 0;         // anything but 200, 4xx, 503
    void add(int s) {
        std::lock_guard lock(m);
        ++status[s];
        if (!(s == 200 || (s >= 400 && s < 500) || s == 503)) ++bad_status;
    }
};

// Phase 1: `clients` keep-alive connections, each with one request in flight
// at a time, driven by one poll() loop (so that the client costs little of
// the cores it shares with the server), posting the analytic estimate for
// `seconds`. Every 200 answer must be byte-identical to `expected` (the
// in-process answer as the service serializes it). A connection the server
// closes (Connection: close, keep_alive_max) is opened again in its slot;
// fairness is the spread of answers per slot.
struct Throughput {
    long ok = 0, busy = 0, failed = 0, mismatched = 0, reconnects = 0;
    double seconds = 0, p50 = 0, p99 = 0, max = 0;
    long min_per_client = 0, max_per_client = 0;
    double jain = 0;  // Jain's fairness index of the per-client counts: 1 = equal
};

int connect_nonblocking(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// A complete HTTP/1.1 answer at the start of `in` (Content-Length framed):
// its size, status, body and whether it closes the connection; 0 if incomplete.
struct Answer {
    std::size_t size = 0;
    int status = 0;
    std::string_view body;
    bool close = false;
};

Answer parse_answer(const std::string& in) {
    Answer a;
    const auto end = in.find("\r\n\r\n");
    if (end == std::string::npos || in.size() < 12 || in.compare(0, 9, "HTTP/1.1 ") != 0) return a;
    std::size_t length = 0;
    bool close = false;
    for (std::size_t i = in.find("\r\n") + 2; i < end;) {
        const std::size_t e = in.find("\r\n", i);
        std::string line = in.substr(i, e - i);
        for (char& ch : line) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (line.rfind("content-length:", 0) == 0) length = std::strtoul(line.c_str() + 15, nullptr, 10);
        if (line.rfind("connection:", 0) == 0 && line.find("close") != std::string::npos) close = true;
        i = e + 2;
    }
    if (in.size() < end + 4 + length) return a;
    a.size = end + 4 + length;
    a.status = std::atoi(in.c_str() + 9);
    a.body = std::string_view(in).substr(end + 4, length);
    a.close = close;
    return a;
}

Throughput throughput(int port, int clients, double seconds, const std::string& body, const std::string& expected, Tally& tally) {
    struct Client {
        int fd = -1;
        std::size_t sent = 0;
        std::string in;
        Clock::time_point t0;
        long answers = 0;
    };
    const std::string request = "POST /v1/estimate HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    std::vector<Client> cs(static_cast<std::size_t>(clients));
    std::vector<double> lat;
    Throughput r;
    const auto open = [&](Client& c) {
        c.fd = connect_nonblocking(port);
        c.sent = 0;
        c.in.clear();
        c.t0 = Clock::now();
        if (c.fd < 0 && r.failed++ < 5) std::fprintf(stderr, "gpumem_load_test: cannot connect: %s\n", std::strerror(errno));
    };
    const auto drop = [&](Client& c) {
        if (c.fd >= 0) ::close(c.fd);
        c.fd = -1;
    };
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (auto& c : cs) open(c);
    std::vector<pollfd> ps(cs.size());
    char buf[65536];
    while (Clock::now() < end) {
        for (std::size_t i = 0; i < cs.size(); ++i) {
            if (cs[i].fd < 0) open(cs[i]);
            ps[i] = {cs[i].fd, static_cast<short>(cs[i].sent < request.size() ? POLLOUT : POLLIN), 0};
        }
        if (::poll(ps.data(), ps.size(), 50) <= 0) continue;
        for (std::size_t i = 0; i < cs.size(); ++i) {
            Client& c = cs[i];
            if (ps[i].revents == 0 || c.fd < 0) continue;
            if (c.sent < request.size()) {
                const ssize_t w = ::send(c.fd, request.data() + c.sent, request.size() - c.sent, MSG_NOSIGNAL);
                if (w > 0) c.sent += static_cast<std::size_t>(w);
                else if (errno != EAGAIN) {
                    if (r.failed++ < 5) std::fprintf(stderr, "gpumem_load_test: send: %s\n", std::strerror(errno));
                    tally.add(0);
                    drop(c);
                }
                continue;
            }
            const ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
            if (got < 0 && errno == EAGAIN) continue;
            if (got <= 0) {  // closed before a whole answer
                if (r.failed++ < 5) std::fprintf(stderr, "gpumem_load_test: connection closed without an answer\n");
                tally.add(0);
                drop(c);
                continue;
            }
            c.in.append(buf, static_cast<std::size_t>(got));
            const Answer a = parse_answer(c.in);
            if (a.size == 0) continue;
            const auto t1 = Clock::now();
            tally.add(a.status);
            if (a.status == 200 && a.body == expected) {
                ++r.ok;
                ++c.answers;
                lat.push_back(std::chrono::duration<double, std::milli>(t1 - c.t0).count());
            } else if (a.status == 200) {
                if (r.mismatched++ < 3) std::fprintf(stderr, "gpumem_load_test: an answer differs from the in-process one\n");
            } else if (a.status == 503) {
                ++r.busy;
            } else {
                if (r.failed++ < 5) std::fprintf(stderr, "gpumem_load_test: status %d\n", a.status);
            }
            if (a.close || a.size != c.in.size()) {
                ++r.reconnects;
                drop(c);
                continue;
            }
            c.in.clear();
            c.sent = 0;
            c.t0 = t1;
            const ssize_t w = ::send(c.fd, request.data(), request.size(), MSG_NOSIGNAL);
            if (w > 0) c.sent = static_cast<std::size_t>(w);
        }
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    double sum = 0, sum2 = 0;
    r.min_per_client = cs.empty() ? 0 : cs[0].answers;
    for (auto& c : cs) {
        drop(c);
        r.min_per_client = std::min(r.min_per_client, c.answers);
        r.max_per_client = std::max(r.max_per_client, c.answers);
        sum += static_cast<double>(c.answers);
        sum2 += static_cast<double>(c.answers) * static_cast<double>(c.answers);
    }
    r.jain = sum2 > 0 ? sum * sum / (static_cast<double>(cs.size()) * sum2) : 0;
    std::sort(lat.begin(), lat.end());
    const auto pct = [&](double p) {
        if (lat.empty()) return 0.0;
        return lat[std::min(lat.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(lat.size() - 1) + 0.5))];
    };
    r.p50 = pct(50);
    r.p99 = pct(99);
    r.max = lat.empty() ? 0 : lat.back();
    return r;
}

// Phase 2: `n` connections at once from one poll() loop.
struct Burst {
    long answered = 0, resets = 0, closed_silently = 0, unfinished = 0, connect_failed = 0;
};

Burst burst(int port, int n, double seconds, Tally& tally) {
    enum Kind { Post, Health, Garbage, Huge, Slow };
    struct Conn {
        int fd = -1;
        Kind kind = Post;
        std::string out;
        std::size_t sent = 0;
        std::string in;
        bool done = false;
    };
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    std::vector<Conn> cs(static_cast<std::size_t>(n));
    Burst b;
    for (int i = 0; i < n; ++i) {
        Conn& c = cs[static_cast<std::size_t>(i)];
        const int k = i % 10;
        c.kind = k < 6 ? Post : k < 8 ? Health : k == 8 ? (i % 20 == 8 ? Garbage : Huge) : Slow;
        switch (c.kind) {
            case Post:
                c.out = "POST /v1/estimate HTTP/1.1\r\n" + host + "Connection: close\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
                break;
            case Health: c.out = "GET /healthz HTTP/1.1\r\n" + host + "Connection: close\r\n\r\n"; break;
            case Garbage: c.out = std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n", 36); break;
            case Huge: c.out = "GET /healthz HTTP/1.1\r\n" + host + "X-Big: " + std::string(100000, 'a') + "\r\n\r\n"; break;
            case Slow: c.out = "POST /v1/estimate HTTP/1.1\r\n" + host; break;  // and nothing more
        }
        c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (c.fd < 0) {
            ++b.connect_failed;
            c.done = true;
            continue;
        }
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        if (::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
            ++b.connect_failed;
            ::close(c.fd);
            c.fd = -1;
            c.done = true;
        }
    }
    const auto finish = [&](Conn& c, int status) {
        c.done = true;
        ::close(c.fd);
        c.fd = -1;
        if (status > 0) {
            ++b.answered;
            tally.add(status);
        }
    };
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    std::vector<pollfd> ps;
    std::vector<std::size_t> idx;
    while (Clock::now() < end) {
        ps.clear();
        idx.clear();
        for (std::size_t i = 0; i < cs.size(); ++i) {
            if (cs[i].done) continue;
            const short ev = cs[i].sent < cs[i].out.size() ? POLLOUT : POLLIN;
            ps.push_back({cs[i].fd, ev, 0});
            idx.push_back(i);
        }
        if (ps.empty()) break;
        if (::poll(ps.data(), ps.size(), 50) <= 0) continue;
        for (std::size_t j = 0; j < ps.size(); ++j) {
            Conn& c = cs[idx[j]];
            if (ps[j].revents == 0) continue;
            if (c.sent < c.out.size()) {
                const ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
                if (w > 0) c.sent += static_cast<std::size_t>(w);
                else if (errno != EAGAIN) {
                    // The server may answer and close before reading everything (over-long headers).
                    c.sent = c.out.size();
                }
                continue;
            }
            char buf[16384];
            const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
            if (r > 0) {
                c.in.append(buf, static_cast<std::size_t>(r));
                continue;
            }
            if (r < 0 && errno == EAGAIN) continue;
            const int status = c.in.rfind("HTTP/1.1 ", 0) == 0 && c.in.size() >= 12 ? std::atoi(c.in.substr(9, 3).c_str()) : 0;
            if (status == 0) {
                if (r < 0 && errno == ECONNRESET) ++b.resets;
                else ++b.closed_silently;
            }
            finish(c, status);
        }
    }
    for (auto& c : cs)
        if (!c.done) {
            ++b.unfinished;
            finish(c, 0);
        }
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    const double phase_s = std::clamp(arg_value(argc, argv, "--phase-s", 3), 0.5, 60.0);
    const int burst_n = static_cast<int>(std::clamp(arg_value(argc, argv, "--burst", 2000), 10.0, 20000.0));
    const double limit_s = std::clamp(arg_value(argc, argv, "--limit-s", 20), 5.0, 600.0);
    const int concurrency = static_cast<int>(arg_value(argc, argv, "--concurrency", 0));

    // Thousands of sockets on both ends of loopback.
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &rl);
    }

    gpumem::server::ServerOptions opt;
    opt.concurrency = concurrency;
    opt.read_timeout = std::chrono::milliseconds(2000);  // the slow clients are answered 408 within the run
    opt.queue_timeout = std::chrono::milliseconds(5000);
    gpumem::server::Server server(opt);
    if (!server.start("127.0.0.1", 0)) {
        std::fprintf(stderr, "gpumem_load_test: %s\n", server.error().c_str());
        return 1;
    }
    const int port = server.port();
    const auto start = Clock::now();

    // The checker: one (simulated) request whose answer must equal the
    // in-process API's, posted all through the burst. (The throughput phases
    // check every answer themselves; a simulation every 20 ms beside them
    // would take a share of the cores they measure.)
    const json check_req = {{"model", "gpt2"}, {"batch", 3}, {"seq", 256}, {"gpu", "A100-40GB"}};
    const std::string expected = gpumem::api_call("estimate", check_req).value().dump();  // the bytes the service sends
    std::atomic<bool> stop{false};
    std::atomic<long> checked{0}, mismatched{0}, check_busy{0}, check_failed{0};
    const auto check_loop = [&] {
        httplib::Client cli("127.0.0.1", port);
        cli.set_read_timeout(30, 0);
        while (!stop) {
            auto r = cli.Post("/v1/estimate", check_req.dump(), "application/json");
            if (!r) ++check_failed;
            else if (r->status == 503) ++check_busy;
            else if (r->status != 200) ++check_failed;
            else if (r->body == expected) ++checked;
            else ++mismatched;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    };

    Tally tally;
    bool ok = true;
    // The throughput phases: the analytic estimate (no step simulation), whose
    // answer must be byte-identical to the in-process one.
    const json load_req = json::parse(kBody);
    const std::string load_expected = gpumem::api_call("estimate", load_req).value().dump();
    for (const int clients : {8, 64}) {
        const Throughput t = throughput(port, clients, phase_s, kBody, load_expected, tally);
        std::printf("keep-alive, %2d clients: %6.0f requests/s, p50 %6.2f ms, p99 %6.2f ms, max %6.2f ms; per client %ld..%ld answers "
                    "(Jain fairness %.3f); %ld ok, %ld busy 503, %ld failed, %ld different, %ld reconnects, %.1f s\n",
                    clients, static_cast<double>(t.ok) / t.seconds, t.p50, t.p99, t.max, t.min_per_client, t.max_per_client, t.jain, t.ok, t.busy,
                    t.failed, t.mismatched, t.reconnects, t.seconds);
        if (t.ok == 0 || t.failed > 0 || t.mismatched > 0) ok = false;
    }
    std::thread checker(check_loop);
    const Burst b = burst(port, burst_n, std::min(8.0, limit_s / 2), tally);
    std::printf("burst of %d connections (no keep-alive; posts, /healthz, garbage, 100 KB headers, slow): %ld answered, %ld reset, %ld closed "
                "without an answer, %ld unfinished, %ld could not connect\n",
                burst_n, b.answered, b.resets, b.closed_silently, b.unfinished, b.connect_failed);
    stop = true;
    checker.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    server.stop();

    std::printf("statuses:");
    for (const auto& [s, n] : tally.status) std::printf(" %d x%ld", s, n);
    std::printf("\nchecker: %ld equal to the in-process answer, %ld different, %ld busy, %ld failed\n", checked.load(), mismatched.load(),
                check_busy.load(), check_failed.load());
    std::printf("total %.1f s (limit %.0f s)\n", elapsed, limit_s);

    const long lost = b.resets + b.unfinished + b.connect_failed;
    if (tally.bad_status > 0) ok = false, std::fprintf(stderr, "gpumem_load_test: answers other than 200, 4xx, 503\n");
    if (lost * 100 > burst_n) ok = false, std::fprintf(stderr, "gpumem_load_test: more than 1%% of the burst reset or unanswered\n");
    if (mismatched > 0 || checked == 0 || check_failed > 0) ok = false, std::fprintf(stderr, "gpumem_load_test: checked estimates wrong or missing\n");
    if (elapsed > limit_s) ok = false, std::fprintf(stderr, "gpumem_load_test: over the %.0f s limit\n", limit_s);
    return ok ? 0 : 1;
}
