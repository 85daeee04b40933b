// gpumem/server/server.hpp — the HTTP service (gpumem serve).
//
// A thin JSON-over-HTTP front end over api_call(): POST /v1/<command> with the
// same JSON body the Python bindings take, answered with the JSON the CLI
// prints with --format json. Safe by default: loopback only unless a host is
// given, a request body limit, no filesystem access from requests (model
// names must be built-in presets, snapshots are uploaded bytes), and a time
// budget per request (503 {"error": {"code": "timeout"}} when over it).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "gpumem/core/result.hpp"

namespace gpumem::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                                 // 0: an ephemeral port (see Server::port())
    int threads = 0;                                 // request threads; 0: 2 x hardware_concurrency
    std::size_t max_body = std::size_t{8} << 20;     // bytes; larger bodies get 413
    std::chrono::milliseconds time_budget{10000};    // per request; over it: 503 timeout
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
    // Stops accepting, finishes the requests in flight and joins the thread.
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

}  // namespace gpumem::server
