// gpumem/server/server.hpp — the HTTP service (gpumem serve).
//
// A thin JSON-over-HTTP front end over api_call(): POST /v1/<command> with the
// same JSON body the Python bindings take, answered with the JSON the CLI
// prints with --format json. It serves untrusted clients (docs/security.md):
//   - loopback only unless a host is given; the Host header must name this
//     server (DNS rebinding) and an Origin header must be the Host's own;
//     POST bodies must be application/json (snapshots: octet-stream too), so a
//     web page cannot post to it cross-site without a CORS preflight;
//   - requests never touch files: model names resolve to built-in presets only
//     (ModelLoadOptions::files = false), configs and snapshots are sent inline;
//   - every connection is bounded in time (the whole request must arrive
//     within read_timeout, the whole answer leave within write_timeout, idle
//     connections wait without a thread and close after keep_alive_timeout,
//     at most 1,024 of them at once) and in bytes (headers, body,
//     chunked bodies too; JSON depth and size);
//   - at most `concurrency` computations run at once, each on the connection's
//     own thread under a WorkBudget of time_limit: over it, the work is
//     cancelled (BudgetExceeded) and the answer is 503 "timeout"; a request
//     that finds no free slot within queue_timeout gets 503 "busy".
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/result.hpp"

namespace gpumem::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                                 // 0: an ephemeral port (see Server::port())
    // Connection threads: each serves one connection's request at a time (idle
    // connections wait without one). 0: 64.
    int threads = 0;
    // Computations (POST /v1/...) running at once. 0: the hardware threads, 2..8.
    int concurrency = 0;
    std::size_t max_body = std::size_t{8} << 20;     // bytes; larger bodies (chunked too) get 413
    std::size_t max_header = std::size_t{64} << 10;  // request line + headers, bytes; larger: 431
    // Bytes of request bodies held at once by all connections; over it: 503. 0: 16 x max_body.
    std::size_t max_body_total = 0;
    std::chrono::milliseconds time_limit{10000};     // work per request; over it: cancelled, 503 timeout
    std::chrono::milliseconds queue_timeout{2000};   // wait for a computation slot; over it: 503 busy
    std::chrono::milliseconds read_timeout{10000};   // the whole request (line, headers, body); over it: 408
    std::chrono::milliseconds write_timeout{10000};  // the whole answer; over it: the connection closes
    std::chrono::milliseconds keep_alive_timeout{5000};  // an idle keep-alive connection closes after it
    int keep_alive_max = 100;                        // requests per connection
    std::vector<std::string> allow_hosts;            // Host names accepted besides loopback and the bound address
    bool quiet = false;                              // no startup line on stderr
};

// An in-process server: start() binds and serves on a background thread.
class Server {
public:
    explicit Server(ServerOptions opt = {});
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds host:port (port 0: ephemeral) and starts serving; false (and
    // error()) when the address cannot be bound.
    bool start();
    bool start(const std::string& host, int port);
    // The bound port (after a successful start()).
    [[nodiscard]] int port() const;
    [[nodiscard]] const std::string& error() const;
    // Computations running now (tests: a cancelled request frees its slot).
    [[nodiscard]] int running() const;
    // Stops accepting, cancels the work in flight, closes the connections and
    // joins the threads.
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Serves until SIGINT/SIGTERM; prints "gpumem serving on http://HOST:PORT" to
// stderr. Returns the process exit code (0 on a clean stop, 1 if it cannot bind).
int run_server(const ServerOptions& opt);

// "10s", "500ms", "2m", "1.5s" or a plain number of seconds.
Result<std::chrono::milliseconds> parse_duration(std::string_view s, std::string_view field);

// The HTTP status for an Error code (400, 404, 500).
int http_status(ErrorCode code);

// Whether `host` (a Host header's value, with or without a port) names this
// server: localhost, 127.0.0.1, [::1], `bound` (the listening address or the
// connection's local address) or one of `allowed`. Case-insensitive.
bool host_allowed(std::string_view host, const std::vector<std::string>& bound, const std::vector<std::string>& allowed);

}  // namespace gpumem::server
