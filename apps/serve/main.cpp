// gpumem-serve: the HTTP service front end (`gpumem serve ...` execs it).
// It is its own executable so that only the service loads what only the
// service needs (cpp-httplib and, through it, OpenSSL, brotli and zlib): the
// gpumem binary stays static and starts about as fast as a process can
// (issue 16; bench/README.md "CLI start-up"). Same flags and errors as before:
// a bad flag exits 2 with one line naming it, 3 is a bug.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpumem/api/api.hpp"
#include "gpumem/core/version.hpp"
#include "gpumem/server/server.hpp"

using namespace gpumem;

int main(int argc, char** argv) {
    // Called as `gpumem-serve serve ARGS` by gpumem, or directly as `gpumem-serve ARGS`.
    std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty() && args.front() == "serve") args.erase(args.begin());
    CLI::App serve{"serve the JSON API and the web page over HTTP (POST /v1/estimate, ...; loopback only unless --host; docs/security.md)", "gpumem serve"};
    serve.set_version_flag("--version", std::string("gpumem ") + version());
    server::ServerOptions opt;
    std::string max_body = "8MiB", limit = "10s", read = "10s", write = "10s", keep_alive = "5s", queue = "2s";
    serve.add_option("--host", opt.host, "address to listen on (not loopback: anyone who reaches it may use it)")->capture_default_str();
    serve.add_option("--port", opt.port, "TCP port (0: any free port)")->capture_default_str();
    serve.add_option("--allow-host", opt.allow_hosts, "a Host name the service answers to besides localhost, 127.0.0.1, [::1] and --host (repeatable)");
    serve.add_option("--threads", opt.threads, "connection threads (default 64)");
    serve.add_option("--concurrency", opt.concurrency, "requests computing at once (default: the cores, 2 to 8)");
    serve.add_option("--max-body", max_body, "largest request body, chunked too, e.g. 8MiB (over it: 413)")->capture_default_str();
    serve.add_option("--time-limit,--time-budget", limit, "work per request, e.g. 10s (over it: cancelled, 503)")->capture_default_str();
    serve.add_option("--queue-timeout", queue, "wait for a free computation slot (over it: 503 busy)")->capture_default_str();
    serve.add_option("--read-timeout", read, "the whole request must arrive within it (over it: 408)")->capture_default_str();
    serve.add_option("--write-timeout", write, "the whole answer must leave within it")->capture_default_str();
    serve.add_option("--keep-alive-timeout", keep_alive, "an idle keep-alive connection closes after it")->capture_default_str();
    try {
        std::vector<std::string> rev(args.rbegin(), args.rend());
        serve.parse(rev);
    } catch (const CLI::Success& e) {
        return serve.exit(e);
    } catch (const CLI::ParseError& e) {
        std::string what = e.what();
        for (char& c : what)
            if (c == '\n') c = ' ';
        std::fprintf(stderr, "gpumem: error: %s (run 'gpumem serve --help' for the flags)\n", what.c_str());
        return 2;
    }
    try {
        const std::int64_t body = take(parse_size(max_body, "max-body")).count();
        opt.max_body = static_cast<std::size_t>(body);
        opt.time_limit = take(server::parse_duration(limit, "time-limit"));
        opt.queue_timeout = take(server::parse_duration(queue, "queue-timeout"));
        opt.read_timeout = take(server::parse_duration(read, "read-timeout"));
        opt.write_timeout = take(server::parse_duration(write, "write-timeout"));
        opt.keep_alive_timeout = take(server::parse_duration(keep_alive, "keep-alive-timeout"));
        if (body < 1 || body > std::int64_t{1} << 30) fail(ErrorCode::InvalidArgument, "max-body", "--max-body must be 1 byte to 1GiB");
        if (opt.threads < 0 || opt.threads > 4096) fail(ErrorCode::InvalidArgument, "threads", "--threads must be 0 (default) to 4096");
        if (opt.concurrency < 0 || opt.concurrency > 1024) fail(ErrorCode::InvalidArgument, "concurrency", "--concurrency must be 0 (default) to 1024");
        if (opt.port < 0 || opt.port > 65535) fail(ErrorCode::InvalidArgument, "port", "--port must be 0..65535");
        return server::run_server(opt);
    } catch (const InputError& e) {
        std::fprintf(stderr, "gpumem: error: %s\n", e.error().message.c_str());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpumem: internal error: %s\n", e.what());
        return 3;
    }
}
