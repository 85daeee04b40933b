#include "gpumem/server/server.hpp"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <future>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/api/api.hpp"
#include "gpumem/core/version.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/report/timeline_render.hpp"
#include "gpumem_web.hpp"  // the page (web/), embedded at build time: cmake/EmbedWeb.cmake

namespace gpumem::server {

namespace {

using json = nlohmann::json;
using httplib::Request;
using httplib::Response;

const char* const kJson = "application/json";

// The commands served as POST /v1/<command> with a JSON body.
const std::vector<std::string>& json_commands() {
    static const std::vector<std::string> c = {"estimate", "fit", "plan", "sweep", "advise", "doctor", "timeline", "calibrate"};
    return c;
}

json error_body(const std::string& code, const std::string& message, const std::string& field = "") {
    return {{"error", {{"code", code}, {"message", message}, {"field", field}}}};
}

void send(Response& res, int status, const json& j) {
    res.status = status;
    res.set_content(j.dump(), kJson);
}

// A request names a model: the service accepts built-in presets only, so a
// path ("/etc/passwd", "config.json") never reaches the file-reading loader.
std::optional<Error> check_model(const json& body) {
    if (!body.is_object()) return std::nullopt;
    const auto it = body.find("model");
    if (it == body.end() || !it->is_string()) return std::nullopt;
    const std::string m = it->get<std::string>();
    if (m.empty() || preset_config_text(m) != nullptr) return std::nullopt;
    std::string msg = "unknown model \"" + m + "\": the service takes built-in presets only (GET /v1/models) and reads no files";
    if (auto r = load_preset(m); !r) {
        const auto& em = r.error().message;
        if (const auto pos = em.find("did you mean"); pos != std::string::npos) msg += "; " + em.substr(pos);
    }
    return Error{ErrorCode::NotFound, msg, "model"};
}

// Runs work on its own thread and waits at most the time budget; work over
// budget finishes in the background (its answer is dropped). At most
// max_overdue such jobs at once: beyond that the service answers 503 busy.
// drain() waits for every background job, so none outlives the server (a job
// still running while the process tears down its statics would crash it).
class Budget {
public:
    Budget(std::chrono::milliseconds limit, int max_overdue) : limit_(limit), max_overdue_(max_overdue) {}
    Budget(const Budget&) = delete;
    Budget& operator=(const Budget&) = delete;
    ~Budget() { drain(); }

    void drain() {
        std::unique_lock lock(live_->m);
        live_->cv.wait(lock, [&] { return live_->running == 0; });
    }

    // raw_type: the answer is a JSON string sent as that content type (an SVG).
    void respond(Response& res, std::function<Result<json>()> work, const char* raw_type = nullptr) {
        if (overdue_->load() >= max_overdue_) {
            send(res, 503, error_body("busy", "the service is still working on earlier requests that ran over the time budget; retry later"));
            return;
        }
        auto state = std::make_shared<std::atomic<int>>(0);  // 0 running, 1 done, 2 abandoned
        auto promise = std::make_shared<std::promise<Result<json>>>();
        auto future = promise->get_future();
        {
            std::lock_guard lock(live_->m);
            ++live_->running;
        }
        std::thread([state, promise, overdue = overdue_, live = live_, work = std::move(work)] {
            try {
                promise->set_value(work());
            } catch (...) {
                try {
                    promise->set_exception(std::current_exception());
                } catch (...) {
                }
            }
            if (state->exchange(1) == 2) overdue->fetch_sub(1);
            std::lock_guard lock(live->m);
            if (--live->running == 0) live->cv.notify_all();
        }).detach();
        if (future.wait_for(limit_) == std::future_status::timeout) {
            overdue_->fetch_add(1);
            int expected = 0;
            if (state->compare_exchange_strong(expected, 2)) {
                send(res, 503, error_body("timeout", "the request ran over the service's time budget of " + std::to_string(limit_.count()) +
                                                         " ms (gpumem serve --time-budget); narrow it (plan: only-*, top; sweep: fewer points) or run the CLI"));
                return;
            }
            overdue_->fetch_sub(1);  // finished just now
        }
        const Result<json> r = future.get();  // rethrows the work's exception
        if (r && raw_type && r.value().is_string()) res.set_content(r.value().get<std::string>(), raw_type);
        else if (r) send(res, 200, r.value());
        else send(res, http_status(r.error().code), error_to_json(r.error()));
    }

private:
    std::chrono::milliseconds limit_;
    int max_overdue_;
    std::shared_ptr<std::atomic<int>> overdue_ = std::make_shared<std::atomic<int>>(0);
    struct Live {
        std::mutex m;
        std::condition_variable cv;
        int running = 0;
    };
    std::shared_ptr<Live> live_ = std::make_shared<Live>();
};

// Catches everything a handler throws: bad input never gives 500, internal
// errors give 500 with a JSON message.
template <class F>
httplib::Server::Handler guarded(F f) {
    return [f = std::move(f)](const Request& req, Response& res) {
        try {
            f(req, res);
        } catch (const InputError& e) {
            send(res, http_status(e.error().code), error_to_json(e.error()));
        } catch (const std::exception& e) {
            send(res, 500, error_body("internal", std::string("internal error: ") + e.what()));
        } catch (...) {
            send(res, 500, error_body("internal", "internal error"));
        }
    };
}

std::string host_for_url(const std::string& host) {
    return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

int http_status(ErrorCode code) {
    switch (code) {
        case ErrorCode::InvalidArgument:
        case ErrorCode::ParseError:
        case ErrorCode::Unsupported:
        case ErrorCode::Overflow: return 400;
        case ErrorCode::NotFound: return 404;
        case ErrorCode::Io: return 500;
    }
    return 500;
}

Result<std::chrono::milliseconds> parse_duration(std::string_view s, std::string_view field) {
    const std::string f(field);
    const auto bad = [&] {
        return Error{ErrorCode::InvalidArgument, "--" + f + ": \"" + std::string(s) + "\" is not a duration such as 10s, 500ms or 2m", f};
    };
    std::size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (i == 0) return bad();
    double v = 0;
    try {
        v = std::stod(std::string(s.substr(0, i)));
    } catch (...) {
        return bad();
    }
    const std::string_view unit = s.substr(i);
    double ms = 0;
    if (unit.empty() || unit == "s") ms = v * 1000.0;
    else if (unit == "ms") ms = v;
    else if (unit == "m" || unit == "min") ms = v * 60000.0;
    else return bad();
    if (!(ms >= 1.0) || ms > 86400000.0) return bad();
    return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

struct Server::Impl {
    ServerOptions opt;
    httplib::Server svr;
    std::thread thread;
    int port = -1;
    std::string error;
    std::unique_ptr<Budget> budget;

    explicit Impl(ServerOptions o) : opt(std::move(o)) {}

    int threads() const {
        if (opt.threads > 0) return opt.threads;
        // httplib holds a pool thread per keep-alive connection: at least 8.
        return std::max(8, 2 * static_cast<int>(std::thread::hardware_concurrency()));
    }

    void setup() {
        const int n = threads();
        budget = std::make_unique<Budget>(opt.time_budget, std::max(2, n));
        svr.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<std::size_t>(n)); };
        svr.set_payload_max_length(opt.max_body);
        svr.set_keep_alive_max_count(1000);
        svr.set_keep_alive_timeout(5);
        svr.set_read_timeout(10);
        svr.set_write_timeout(10);

        std::set<std::string> post_routes = {"/v1/snapshot"}, get_routes = {"/healthz", "/v1/models", "/v1/gpus", "/v1/fields"};

        for (const auto& cmd : json_commands()) {
            post_routes.insert("/v1/" + cmd);
            svr.Post("/v1/" + cmd, guarded([this, cmd](const Request& req, Response& res) {
                         json body;
                         try {
                             body = json::parse(req.body);
                         } catch (const json::exception& e) {
                             send(res, 400, error_to_json(Error{ErrorCode::ParseError, std::string("the request body is not valid JSON: ") + e.what(), ""}));
                             return;
                         }
                         if (auto e = check_model(body)) {
                             send(res, http_status(e->code), error_to_json(*e));
                             return;
                         }
                         // POST /v1/timeline?format=svg: the plot the CLI writes
                         // (--timeline FILE.svg), drawn by the same renderer.
                         if (cmd == "timeline" && req.has_param("format") && req.get_param_value("format") != "json") {
                             if (req.get_param_value("format") != "svg")
                                 fail(ErrorCode::InvalidArgument, "format", "format: \"" + req.get_param_value("format") + "\" is not json or svg");
                             budget->respond(
                                 res,
                                 [body = std::move(body)]() -> Result<json> {
                                     auto a = run(Command::Timeline, body);
                                     if (!a) return a.error();
                                     const auto& e = std::get<FullEstimate>(a.value().result).memory;
                                     return json(render_timeline_svg(*e.simulation, e.model_name + " - " + to_string(e.request().mode) + " on " + e.gpu().name,
                                                                     e.per_gpu.capacity));
                                 },
                                 "image/svg+xml");
                             return;
                         }
                         budget->respond(res, [cmd, body = std::move(body)] { return api_call(cmd, body, false); });
                     }));
        }

        svr.Post("/v1/snapshot", guarded([this](const Request& req, Response& res) {
                     // JSON-wrapped form ({"data": ...}, as api_call takes it): only
                     // with Content-Type application/json and a "data" or "path"
                     // key; "path" is refused (allow_paths=false).
                     if (req.get_header_value("Content-Type").rfind(kJson, 0) == 0) {
                         json body = json::parse(req.body, nullptr, false);
                         if (body.is_object() && (body.contains("data") || body.contains("path"))) {
                             budget->respond(res, [body = std::move(body)] { return api_call("snapshot", body, false); });
                             return;
                         }
                     }
                     json opts = json::object();
                     if (req.has_param("alloc-conf")) opts["alloc-conf"] = req.get_param_value("alloc-conf");
                     if (req.has_param("device")) {
                         const std::string d = req.get_param_value("device");
                         int dev = 0;
                         const auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), dev);
                         if (ec != std::errc() || p != d.data() + d.size() || dev < 0)
                             fail(ErrorCode::InvalidArgument, "device", "device: \"" + d + "\" is not a device index (0, 1, ...)");
                         opts["device"] = dev;
                     }
                     if (req.body.empty()) fail(ErrorCode::InvalidArgument, "data", "send the snapshot file's bytes as the request body");
                     budget->respond(res, [data = req.body, opts = std::move(opts)] { return api_snapshot_bytes(data, opts); });
                 }));

        svr.Get("/healthz", guarded([](const Request&, Response& res) { send(res, 200, json{{"status", "ok"}}); }));
        svr.Get("/v1/models", guarded([](const Request&, Response& res) {
                    const auto r = api_call("models", json::object(), false);
                    if (r) send(res, 200, r.value());
                    else send(res, http_status(r.error().code), error_to_json(r.error()));
                }));
        svr.Get("/v1/gpus", guarded([](const Request&, Response& res) {
                    const auto r = api_call("gpus", json::object(), false);
                    if (r) send(res, 200, r.value());
                    else send(res, http_status(r.error().code), error_to_json(r.error()));
                }));
        // The request field table: the page builds its form from it.
        svr.Get("/v1/fields", guarded([](const Request&, Response& res) {
                    json j = fields_json();
                    j["schema_version"] = kSchemaVersion;
                    j["version"] = gpumem::version();
                    send(res, 200, j);
                }));
        // The page: web/index.html at /, web/<file> at /<file>.
        for (std::size_t i = 0; i < web::kAssetCount; ++i) {
            const web::Asset& a = web::kAssets[i];
            get_routes.insert(std::string(a.path));
            std::string pattern;  // httplib's route is a regex: "/app.js" must not match "/appXjs"
            for (char ch : a.path) {
                if (ch == '.') pattern += '\\';
                pattern += ch;
            }
            svr.Get(pattern, guarded([&a](const Request&, Response& res) {
                        res.set_header("Cache-Control", "no-cache");
                        res.set_content(reinterpret_cast<const char*>(a.data), a.size, std::string(a.content_type));
                    }));
        }

        svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
            std::string what = "internal error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what += std::string(": ") + e.what();
            } catch (...) {
            }
            send(res, 500, error_body("internal", what));
        });

        const std::size_t max_body = opt.max_body;
        svr.set_error_handler(httplib::Server::HandlerWithResponse([post_routes, get_routes, max_body](const Request& req, Response& res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own JSON error
            if (res.status == 404) {
                const bool is_post = post_routes.count(req.path) > 0, is_get = get_routes.count(req.path) > 0;
                if (is_post || is_get) {
                    res.set_header("Allow", is_post ? "POST" : "GET, HEAD");
                    send(res, 405, error_body("method_not_allowed", req.method + " " + req.path + ": use " + (is_post ? "POST" : "GET")));
                } else {
                    send(res, 404, error_body("not_found", "no route " + req.method + " " + req.path +
                                                               " (POST /v1/estimate, /v1/fit, /v1/plan, /v1/sweep, /v1/advise, /v1/doctor, /v1/calibrate, "
                                                               "/v1/timeline, /v1/snapshot; GET /v1/models, /v1/gpus, /v1/fields, /healthz, / (the page))"));
                }
            } else if (res.status == 413) {
                send(res, 413, error_body("payload_too_large", "the request body is over the service's limit of " + std::to_string(max_body) +
                                                                  " bytes (gpumem serve --max-body)"));
            } else {
                const int status = res.status;
                send(res, status, error_body("http_" + std::to_string(status), "HTTP " + std::to_string(status)));
            }
            return httplib::Server::HandlerResponse::Handled;
        }));
    }
};

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) {}

Server::~Server() { stop(); }

bool Server::start() { return start(impl_->opt.host, impl_->opt.port); }

bool Server::start(const std::string& host, int port) {
    if (impl_->thread.joinable()) {
        impl_->error = "the server is already running";
        return false;
    }
    impl_->opt.host = host;
    impl_->opt.port = port;
    impl_->setup();
    int bound = -1;
    if (port == 0) bound = impl_->svr.bind_to_any_port(host);
    else if (impl_->svr.bind_to_port(host, port)) bound = port;
    if (bound <= 0) {
        impl_->error = "cannot listen on " + host_for_url(host) + ":" + std::to_string(port) + " (address in use or not local)";
        return false;
    }
    impl_->port = bound;
    impl_->thread = std::thread([this] { impl_->svr.listen_after_bind(); });
    // stop() only works once the accept loop runs.
    for (int i = 0; i < 5000 && !impl_->svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
}

int Server::port() const { return impl_->port; }

const std::string& Server::error() const { return impl_->error; }

void Server::stop() {
    if (!impl_ || !impl_->thread.joinable()) return;
    impl_->svr.stop();
    impl_->thread.join();
    if (impl_->budget) impl_->budget->drain();
}

int run_server(const ServerOptions& opt) {
    // Block the stop signals in every thread (the pool inherits the mask) and
    // wait for them here.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    Server s(opt);
    if (!s.start()) {
        std::fprintf(stderr, "gpumem: error: %s\n", s.error().c_str());
        return 1;
    }
    std::fprintf(stderr, "gpumem serving on http://%s:%d\n", host_for_url(opt.host).c_str(), s.port());
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "gpumem: stopping\n");
    s.stop();
    return 0;
}

}  // namespace gpumem::server
