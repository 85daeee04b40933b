// The HTTP service (gpumem/server/server.hpp) on cpp-httplib (0.11: Debian's
// libcpp-httplib). httplib's own limits are not enough for untrusted clients:
// its read timeout is per read() call (a client sending one byte every few
// seconds holds a thread for ever), a header line is buffered whole before its
// length is checked, a chunked or length-less body has no size limit at all,
// an over-long Content-Length body is read and skipped, Content-Encoding
// bodies are decompressed without limit, and every open connection holds a
// pool thread. So the server overrides httplib's per-connection loop
// (Server::process_and_close_socket, a virtual) with its own: a Stream that
// bounds each request in time and bytes and writes each answer in one send(),
// TCP_NODELAY on every accepted socket, idle connections that wait in one
// epoll set (Parker) instead of on a thread, so that a worker is handed only
// connections with a request to read, in arrival order, and a pool that
// answers 503 to connections that waited too long for a thread.
// Header checks (Host, Origin, Content-Type, lengths) run before any body
// byte is read (httplib's pre-routing handler).
#include "gpumem/server/server.hpp"

#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/core/budget.hpp"
#include "gpumem/core/input.hpp"
#include "gpumem/core/version.hpp"
#include "gpumem/memory/request.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/report/render.hpp"
#include "gpumem/report/timeline_render.hpp"
#include "gpumem_web.hpp"  // the page (web/), embedded at build time: cmake/EmbedWeb.cmake

namespace gpumem::server {

namespace {

using json = nlohmann::json;
using httplib::Request;
using httplib::Response;
using Clock = std::chrono::steady_clock;

const char* const kJson = "application/json";

// Most JSON values (scalars, arrays, objects) one request body may hold: a
// parsed value costs ~50-100 bytes, so this bounds a body's parsed size
// (~50 MiB) whatever --max-body is. Real requests hold < 1,000.
constexpr std::size_t kMaxJsonValues = std::size_t{1} << 19;

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

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string host_for_url(const std::string& host) {
    return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// Refuses JSON text nested deeper than kMaxJsonDepth or holding more than
// kMaxJsonValues values, before it is parsed. Linear, no recursion.
void check_json_text(std::string_view text) { gpumem::check_json_text(text, "request body", kMaxJsonDepth, kMaxJsonValues); }

// ---------------------------------------------------------------------------
// One connection's state, shared by its Stream (which detects the limits) and
// the handlers on the same thread (which answer them).
// ---------------------------------------------------------------------------
struct ConnState {
    bool close = false;              // close after this answer (a refused or unread body)
    bool header_too_large = false;   // 431
    bool body_too_large = false;     // 413 (a chunked or length-less body over --max-body)
    bool bodies_over_total = false;  // 503 (all connections' bodies over max_body_total)
    bool timed_out = false;          // 408
};
thread_local ConnState* t_conn = nullptr;
thread_local bool t_shed = false;  // the pool: this connection waited too long for a thread

void mark_close() {
    if (t_conn) t_conn->close = true;
}

// Bytes of request bodies held by all connections (max_body_total).
struct BodyLedger {
    std::atomic<std::size_t> held{0};
    std::size_t limit = 0;
};

struct StreamLimits {
    std::size_t max_header = 0;
    std::size_t max_body_wire = 0;  // --max-body plus chunk framing allowance
    std::chrono::milliseconds read_timeout{0}, write_timeout{0};
    const std::atomic<bool>* stopping = nullptr;
    BodyLedger* ledger = nullptr;
};

// The connection's socket, its read buffer and its answer being written (kept
// across keep-alive requests, and while the connection waits in the Parker).
struct Connection {
    int sock = -1;
    std::uint64_t id = 0;        // the Parker's key (a socket number is reused)
    std::size_t left = 0;        // requests it may still make (keep_alive_max)
    bool first = true;           // no request served yet
    bool registered = false;     // in the Parker's epoll set
    Clock::time_point accepted;  // the first request must arrive within read_timeout of it
    std::string out;             // the answer, written at once when complete
    char buf[16384];
    std::size_t pos = 0, len = 0;
    [[nodiscard]] bool buffered() const { return pos < len; }
};

// Answers up to this size leave in one send() (headers and body together).
constexpr std::size_t kOutBuffer = std::size_t{64} << 10;

// Waits for `events` on the socket until `deadline`, in slices so that a
// stopping server is noticed. >0 ready, 0 timed out or stopping, <0 error.
int wait_socket(int sock, short events, Clock::time_point deadline, const std::atomic<bool>* stopping) {
    while (true) {
        if (stopping && stopping->load()) return 0;
        const auto now = Clock::now();
        if (now >= deadline) return 0;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
        pollfd p{sock, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left + 1, 100)));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -1 : 1;
    }
}

// httplib::Stream over one request of a connection: the request line and
// headers may hold max_header bytes, the body max_body_wire bytes, and all of
// it must arrive before read_timeout has passed since the request began; the
// answer must leave within write_timeout. Over a limit read()/write() fail,
// ConnState says which, and httplib answers 400 (our error handler turns it
// into 431, 413, 408 or 503).
class GuardedStream final : public httplib::Stream {
public:
    GuardedStream(Connection& c, const StreamLimits& lim, ConnState& st)
        : c_(c), lim_(lim), st_(st), read_deadline_(Clock::now() + lim.read_timeout) {}
    ~GuardedStream() override {
        if (lim_.ledger && ledger_bytes_ > 0) lim_.ledger->held.fetch_sub(ledger_bytes_);
    }
    GuardedStream(const GuardedStream&) = delete;
    GuardedStream& operator=(const GuardedStream&) = delete;

    bool is_readable() const override { return c_.buffered() || wait_socket(c_.sock, POLLIN, read_deadline_, lim_.stopping) > 0; }
    // write() buffers and waits itself (within write_timeout).
    bool is_writable() const override { return !(lim_.stopping && lim_.stopping->load()); }

    ssize_t read(char* ptr, std::size_t size) override {
        if (size == 0) return 0;
        if (!c_.buffered()) {
            const ssize_t got = fill();
            if (got <= 0) return got;
        }
        std::size_t n = std::min(size, c_.len - c_.pos);
        if (!in_body_) {
            // Up to the end of the headers (a blank line), counted as header bytes.
            std::size_t i = 0;
            for (; i < n && !in_body_; ++i) {
                const char ch = c_.buf[c_.pos + i];
                if (ch == '\n') {
                    if (line_len_ == 0 || (line_len_ == 1 && last_ == '\r')) in_body_ = true;
                    line_len_ = 0;
                } else {
                    ++line_len_;
                }
                last_ = ch;
            }
            n = i;
            header_bytes_ += n;
            if (header_bytes_ > lim_.max_header) {
                st_.header_too_large = true;
                st_.close = true;
                return -1;
            }
        } else {
            body_bytes_ += n;
            if (body_bytes_ > lim_.max_body_wire) {
                st_.body_too_large = true;
                st_.close = true;
                return -1;
            }
            if (lim_.ledger) {
                const std::size_t before = lim_.ledger->held.fetch_add(n);
                ledger_bytes_ += n;
                if (before + n > lim_.ledger->limit) {
                    st_.bodies_over_total = true;
                    st_.close = true;
                    return -1;
                }
            }
        }
        std::memcpy(ptr, c_.buf + c_.pos, n);
        c_.pos += n;
        return static_cast<ssize_t>(n);
    }

    // httplib writes the status line and headers, then the body: both are
    // collected in the connection's buffer and leave in one send() at flush()
    // (after the request; before the stream waits for more input, so that a
    // "100 Continue" leaves), larger answers in pieces of kOutBuffer.
    ssize_t write(const char* ptr, std::size_t size) override {
        if (!write_started_) {
            write_started_ = true;
            write_deadline_ = Clock::now() + lim_.write_timeout;
        }
        if (c_.out.size() + size > kOutBuffer && !flush()) return -1;
        if (size > kOutBuffer) return send_all(ptr, size) ? static_cast<ssize_t>(size) : -1;
        c_.out.append(ptr, size);
        return static_cast<ssize_t>(size);
    }

    // Sends the buffered answer; false (and the connection closes) if it
    // cannot leave within write_timeout.
    bool flush() {
        if (c_.out.empty()) return true;
        const bool sent = send_all(c_.out.data(), c_.out.size());
        c_.out.clear();
        return sent;
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
    void get_local_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
    socket_t socket() const override { return c_.sock; }

private:
    bool send_all(const char* ptr, std::size_t size) {
        while (size > 0) {
            const ssize_t n = ::send(c_.sock, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n >= 0) {
                ptr += n;
                size -= static_cast<std::size_t>(n);
                continue;
            }
            if (errno == EINTR) continue;
            if ((errno != EAGAIN && errno != EWOULDBLOCK) || wait_socket(c_.sock, POLLOUT, write_deadline_, lim_.stopping) <= 0) {
                st_.close = true;
                return false;
            }
        }
        return true;
    }

    // Reads more into the connection's buffer: >0 bytes, 0 end of stream, <0 error or time out.
    ssize_t fill() {
        if (!flush()) return -1;
        const int w = wait_socket(c_.sock, POLLIN, read_deadline_, lim_.stopping);
        if (w == 0) {
            st_.timed_out = true;
            st_.close = true;
            return -1;
        }
        if (w < 0) return -1;
        while (true) {
            const ssize_t n = ::recv(c_.sock, c_.buf, sizeof c_.buf, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return n;
            c_.pos = 0;
            c_.len = static_cast<std::size_t>(n);
            return n;
        }
    }

    void address(bool local, std::string& ip, int& port) const {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        ip.clear();
        port = -1;
        if ((local ? ::getsockname(c_.sock, reinterpret_cast<sockaddr*>(&a), &len) : ::getpeername(c_.sock, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
            return;
        char text[INET6_ADDRSTRLEN] = {};
        if (a.ss_family == AF_INET) {
            const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
            ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
            port = ntohs(v4->sin_port);
        } else if (a.ss_family == AF_INET6) {
            const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
            ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
            port = ntohs(v6->sin6_port);
        }
        ip = text;
    }

    Connection& c_;
    const StreamLimits& lim_;
    ConnState& st_;
    Clock::time_point read_deadline_;
    Clock::time_point write_deadline_{};
    bool write_started_ = false;
    bool in_body_ = false;
    std::size_t line_len_ = 0;
    char last_ = 0;
    std::size_t header_bytes_ = 0, body_bytes_ = 0, ledger_bytes_ = 0;
};

// ---------------------------------------------------------------------------
// The connection pool: `threads` workers take ready connections in order
// (newly accepted ones, and kept-alive ones whose next request has come; see
// Parker). A connection that waited longer than `max_wait`, or came when more
// than `max_queue` others were waiting, is answered 503 at once (t_shed)
// instead of being served late.
// ---------------------------------------------------------------------------
class ConnectionPool final : public httplib::TaskQueue {
public:
    ConnectionPool(std::size_t threads, std::size_t max_queue, std::chrono::milliseconds max_wait)
        : max_queue_(max_queue), max_wait_(max_wait) {
        for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
    }
    ~ConnectionPool() override { shutdown(); }
    ConnectionPool(const ConnectionPool&) = delete;
    ConnectionPool& operator=(const ConnectionPool&) = delete;

    // A newly accepted connection (httplib's accept loop): judged by the whole
    // line ahead of it.
    void enqueue(std::function<void()> fn) override { push(std::move(fn), false); }

    // A connection whose next request has come (from the Parker, or
    // pipelined): judged by the requests ahead of it only. New connections in
    // line mostly have nothing to say yet and are parked at once; counting
    // them would shed a request because a burst of idle connections came.
    void enqueue_ready(std::function<void()> fn) { push(std::move(fn), true); }

    void shutdown() override {
        {
            std::lock_guard lock(m_);
            if (down_) return;
            down_ = true;
        }
        cv_.notify_all();
        for (auto& t : threads_) t.join();
    }

    // Connections waiting for a worker.
    [[nodiscard]] std::size_t waiting() const { return waiting_.load(); }

private:
    struct Job {
        Clock::time_point queued;
        std::size_t ahead = 0;  // connections (ready: requests) in line before it when it came
        bool ready = false;
        std::function<void()> fn;
    };

    void push(std::function<void()> fn, bool ready) {
        {
            std::lock_guard lock(m_);
            jobs_.push_back({Clock::now(), ready ? ready_ : jobs_.size(), ready, std::move(fn)});
            if (ready) ++ready_;
            waiting_.store(jobs_.size());
        }
        cv_.notify_one();
    }

    void work() {
        while (true) {
            Job job;
            {
                std::unique_lock lock(m_);
                cv_.wait(lock, [&] { return down_ || !jobs_.empty(); });
                if (jobs_.empty()) return;  // down_ and drained
                job = std::move(jobs_.front());
                jobs_.pop_front();
                if (job.ready) --ready_;
                waiting_.store(jobs_.size());
            }
            // Judged by where it stood in line, not by who came after it: the
            // first in line is served even while a burst queues behind it.
            t_shed = job.ahead > max_queue_ || Clock::now() - job.queued > max_wait_;
            job.fn();  // always run: it closes or parks the socket
            t_shed = false;
        }
    }

    std::size_t max_queue_;
    std::chrono::milliseconds max_wait_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    std::size_t ready_ = 0;  // ready jobs in jobs_
    std::atomic<std::size_t> waiting_{0};
    bool down_ = false;
    std::vector<std::thread> threads_;
};

// Reads what the peer already sent (without waiting) so that close() sends a
// FIN, not a reset that could destroy the answer in flight.
void drain_now(int sock) {
    char sink[16384];
    for (int i = 0; i < 64; ++i)
        if (::recv(sock, sink, sizeof sink, MSG_DONTWAIT) <= 0) break;
}

// Closes a connection that has nothing more to say (after its answer, or idle).
void close_quietly(Connection* c) {
    ::shutdown(c->sock, SHUT_WR);
    drain_now(c->sock);
    ::close(c->sock);
    delete c;
}

// Answers 503 busy and closes: a connection the service has no room for.
void shed(Connection* c) {
    const std::string body = error_body("busy", "the service has more connections than threads (gpumem serve --threads); retry later").dump();
    const std::string msg = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    drain_now(c->sock);
    [[maybe_unused]] const ssize_t n = ::send(c->sock, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close_quietly(c);
}

// ---------------------------------------------------------------------------
// Idle connections wait here, in one epoll set, not on a pool thread: a
// kept-alive connection between requests, and a new one whose first bytes have
// not come. When a connection has bytes to read (or hangs up) it goes back to
// the pool (`resume`), behind the connections already waiting there. Each has
// a deadline (the first request: read_timeout after the accept; later ones:
// keep_alive_timeout after the last answer), past it the connection closes. At
// most `max_parked` wait at once; beyond that the kept-alive connection nearest
// its deadline closes (its client opens another), or if none is kept-alive,
// the new connection nearest its deadline is answered 503 busy.
// ---------------------------------------------------------------------------
class Parker {
public:
    explicit Parker(std::size_t max_parked) : max_parked_(max_parked) {}
    ~Parker() { stop(); }
    Parker(const Parker&) = delete;
    Parker& operator=(const Parker&) = delete;

    void start(std::function<void(Connection*)> resume) {
        resume_ = std::move(resume);
        stopped_ = false;
        ep_ = ::epoll_create1(EPOLL_CLOEXEC);
        wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = 0;  // connection ids start at 1
        ::epoll_ctl(ep_, EPOLL_CTL_ADD, wake_, &ev);
        thread_ = std::thread([this] { loop(); });
    }

    // Hands `c` over until it is readable or its deadline passes. After
    // stop(), closes it.
    void park(Connection* c, Clock::time_point deadline) {
        Connection* evicted = nullptr;
        bool evicted_new = false;
        {
            std::lock_guard lock(m_);
            if (!stopped_ && ep_ >= 0) {
                if (parked_.size() >= max_parked_) {
                    // Kept-alive connections (not first) before new ones, then the nearest deadline.
                    const auto victim = std::min_element(parked_.begin(), parked_.end(), [](const auto& a, const auto& b) {
                        return std::pair(a.second.conn->first, a.second.deadline) < std::pair(b.second.conn->first, b.second.deadline);
                    });
                    evicted = victim->second.conn;
                    evicted_new = evicted->first;
                    ::epoll_ctl(ep_, EPOLL_CTL_DEL, evicted->sock, nullptr);
                    parked_.erase(victim);
                }
                epoll_event ev{};
                ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
                ev.data.u64 = c->id;
                if (::epoll_ctl(ep_, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->sock, &ev) == 0) {
                    c->registered = true;
                    parked_.emplace(c->id, Parked{c, deadline});
                    c = nullptr;
                }
            }
        }
        if (evicted && evicted_new) shed(evicted);
        else if (evicted) close_quietly(evicted);
        if (c) close_quietly(c);
    }

    // Closes every parked connection; later park() calls close theirs at once.
    void stop() {
        {
            std::lock_guard lock(m_);
            if (stopped_) return;
            stopped_ = true;
        }
        if (thread_.joinable()) {
            const std::uint64_t one = 1;
            [[maybe_unused]] const ssize_t n = ::write(wake_, &one, sizeof one);
            thread_.join();
        }
        std::unordered_map<std::uint64_t, Parked> left;
        {
            std::lock_guard lock(m_);
            left.swap(parked_);
        }
        for (auto& [id, p] : left) close_quietly(p.conn);
        if (ep_ >= 0) ::close(ep_);
        if (wake_ >= 0) ::close(wake_);
        ep_ = wake_ = -1;
    }

private:
    struct Parked {
        Connection* conn;
        Clock::time_point deadline;
    };

    void loop() {
        std::array<epoll_event, 256> evs{};
        std::vector<Connection*> ready, expired;
        auto next_scan = Clock::now();
        while (true) {
            const int n = ::epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), 50);
            ready.clear();
            expired.clear();
            {
                std::lock_guard lock(m_);
                if (stopped_) return;
                for (int i = 0; i < n; ++i) {
                    const auto it = parked_.find(evs[static_cast<std::size_t>(i)].data.u64);
                    if (it == parked_.end()) continue;  // the wake-up event, or a connection evicted meanwhile
                    ready.push_back(it->second.conn);
                    parked_.erase(it);
                }
                const auto now = Clock::now();
                if (now >= next_scan) {
                    next_scan = now + std::chrono::milliseconds(50);
                    for (auto it = parked_.begin(); it != parked_.end();) {
                        if (it->second.deadline <= now) {
                            expired.push_back(it->second.conn);
                            it = parked_.erase(it);
                        } else {
                            ++it;
                        }
                    }
                }
            }
            for (Connection* c : ready) resume_(c);
            for (Connection* c : expired) close_quietly(c);
        }
    }

    std::size_t max_parked_;
    std::function<void(Connection*)> resume_;
    int ep_ = -1, wake_ = -1;
    std::mutex m_;
    std::unordered_map<std::uint64_t, Parked> parked_;
    bool stopped_ = false;
    std::thread thread_;
};

// httplib::Server with the connection loop replaced (see the file comment).
class GuardedServer final : public httplib::Server {
public:
    StreamLimits limits;
    std::chrono::milliseconds keep_alive_timeout{5000};
    std::size_t keep_alive_max = 100;
    ConnectionPool* pool = nullptr;  // set by new_task_queue
    std::atomic<bool>* stopping = nullptr;
    Parker parker{kMaxParked};

    // Most idle connections held at once (Parker).
    static constexpr std::size_t kMaxParked = 1024;

    // httplib 0.11 listens with a backlog of 5: a burst of connections would
    // be dropped at SYN and retried a second later.
    void raise_backlog(int n) const { ::listen(svr_sock_, n); }

    void start_parker() {
        parker.start([this](Connection* c) { pool->enqueue_ready([this, c] { serve(c, true); }); });
    }

private:
    bool process_and_close_socket(socket_t sock) override {
        const int one = 1;
        // Keep-alive answers written as headers + body would otherwise wait
        // ~40 ms for the client's delayed ACK (Nagle).
        ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto* c = new (std::nothrow) Connection;
        if (!c) {
            ::close(sock);
            return false;
        }
        c->sock = sock;
        c->id = next_id_.fetch_add(1) + 1;
        c->left = keep_alive_max;
        c->accepted = Clock::now();
        serve(c, false);
        return true;
    }

    // Serves the requests `c` has ready (`readable`: it has bytes or hung up),
    // then parks it until its next request comes, or closes it.
    void serve(Connection* c, bool readable) {
        if (t_shed) {  // late or behind too many: 503 if it has a request, else it waits without a thread
            if (c->buffered() || readable || readable_now(c->sock)) shed(c);
            else park(c);
            return;
        }
        bool refused = false, timed_out = false;
        while (!stopped()) {
            if (!c->buffered() && !readable && !readable_now(c->sock)) {
                park(c);
                return;
            }
            readable = false;
            ConnState st;
            t_conn = &st;
            bool closed = false, ret = false;
            {
                GuardedStream strm(*c, limits, st);
                ret = process_request(strm, c->left == 1, closed, nullptr);
                if (!strm.flush()) ret = false;
            }
            t_conn = nullptr;
            c->first = false;
            refused = st.close;
            timed_out = st.timed_out;
            if (!ret || closed || st.close || --c->left == 0) break;
            // The next request: wait for it in the Parker, or (pipelined) serve
            // it now unless other connections wait for a worker.
            if (!c->buffered()) {
                park(c);
                return;
            }
            if (pool && pool->waiting() > 0) {
                pool->enqueue_ready([this, c] { serve(c, true); });
                return;
            }
        }
        ::shutdown(c->sock, SHUT_WR);
        if (refused && !timed_out) linger(c->sock);  // a client too slow to send its request gets no more time
        else drain_now(c->sock);
        ::close(c->sock);
        delete c;
    }

    bool stopped() const { return svr_sock_ == INVALID_SOCKET || (stopping && stopping->load()); }

    static bool readable_now(int sock) {
        pollfd p{sock, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;
    }

    void park(Connection* c) {
        parker.park(c, c->first ? c->accepted + limits.read_timeout : Clock::now() + keep_alive_timeout);
    }

    // After a refused request whose body was not read: stop sending, then read
    // and drop what the client still sends (up to 1 s or 16 MiB) so that it
    // sees the answer rather than a reset.
    void linger(int sock) const {
        const auto deadline = Clock::now() + std::chrono::seconds(1);
        char sink[16384];
        std::size_t total = 0;
        while (total < (std::size_t{16} << 20) && wait_socket(sock, POLLIN, deadline, stopping) > 0) {
            const ssize_t n = ::recv(sock, sink, sizeof sink, 0);
            if (n <= 0) break;
            total += static_cast<std::size_t>(n);
        }
    }

    std::atomic<std::uint64_t> next_id_{0};
};

// At most `max` computations at once; a request waits for a slot up to a
// limit. Slots go to the waiters in arrival order (each waits on its own
// condition variable), so that under load no request waits much longer than
// the others.
class WorkGate {
public:
    explicit WorkGate(int max) : max_(max) {}
    bool acquire(std::chrono::milliseconds wait, const std::atomic<bool>& stopping) {
        std::unique_lock lock(m_);
        if (stopping.load()) return false;
        if (running_ < max_ && waiters_.empty()) {
            ++running_;
            return true;
        }
        Waiter w;
        waiters_.push_back(&w);
        w.cv.wait_for(lock, wait, [&] { return w.granted || stopping.load(); });
        if (w.granted) return true;  // the slot is ours (a stopping server cancels the work)
        waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &w));
        return false;
    }
    void release() {
        std::lock_guard lock(m_);
        --running_;
        while (running_ < max_ && !waiters_.empty()) {
            Waiter* w = waiters_.front();
            waiters_.pop_front();
            w->granted = true;
            ++running_;
            w->cv.notify_one();
        }
    }
    void wake_all() {
        std::lock_guard lock(m_);
        for (Waiter* w : waiters_) w->cv.notify_one();
    }
    int running() const {
        std::lock_guard lock(m_);
        return running_;
    }

private:
    struct Waiter {
        std::condition_variable cv;
        bool granted = false;
    };
    int max_;
    int running_ = 0;
    std::deque<Waiter*> waiters_;
    mutable std::mutex m_;
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
        } catch (const BudgetExceeded& e) {
            send(res, 503, error_body("timeout", e.what()));
        } catch (const std::bad_alloc&) {
            send(res, 503, error_body("out_of_memory", "the request needs more memory than the service can give it; ask for less"));
        } catch (const std::exception& e) {
            send(res, 500, error_body("internal", std::string("internal error: ") + e.what()));
        } catch (...) {
            send(res, 500, error_body("internal", "internal error"));
        }
    };
}

// "host:port", "[v6]:port", "host" -> "host" (lower case, no brackets).
std::string host_name(std::string_view h) {
    std::string s(h);
    if (!s.empty() && s.front() == '[') {
        const auto e = s.find(']');
        return lower(e == std::string::npos ? s.substr(1) : s.substr(1, e - 1));
    }
    const auto colon = s.find(':');
    if (colon != std::string::npos && s.find(':', colon + 1) == std::string::npos) s.resize(colon);
    while (!s.empty() && s.back() == '.') s.pop_back();  // "localhost." is localhost
    return lower(s);
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

bool host_allowed(std::string_view host, const std::vector<std::string>& bound, const std::vector<std::string>& allowed) {
    const std::string h = host_name(host);
    if (h.empty()) return false;
    if (h == "localhost" || h == "127.0.0.1" || h == "::1") return true;
    for (const auto& b : bound)
        if (!b.empty() && b != "0.0.0.0" && b != "::" && host_name(b.find(':') != std::string::npos && b.front() != '[' ? "[" + b + "]" : b) == h) return true;
    for (const auto& a : allowed)
        if (host_name(a) == h) return true;
    return false;
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
    GuardedServer svr;
    std::thread thread;
    int port = -1;
    std::string error;
    std::atomic<bool> stopping{false};
    BodyLedger ledger;
    std::unique_ptr<WorkGate> gate;
    std::set<std::string> post_routes = {"/v1/snapshot"}, get_routes = {"/healthz", "/v1/models", "/v1/gpus", "/v1/fields"};

    explicit Impl(ServerOptions o) : opt(std::move(o)) {}

    int threads() const { return opt.threads > 0 ? opt.threads : 64; }
    int concurrency() const {
        if (opt.concurrency > 0) return opt.concurrency;
        return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
    }

    // Runs one computation on this (the connection's) thread: waits for a slot
    // up to queue_timeout (503 busy), then runs under a WorkBudget of
    // time_limit that the engine's loops check (503 timeout when spent, the
    // work unwound). `work` parses the body itself, so that large parses are
    // bounded by the concurrency too.
    void respond(Response& res, const std::function<Result<json>()>& work, const char* raw_type = nullptr) {
        if (!gate->acquire(opt.queue_timeout, stopping)) {
            res.set_header("Retry-After", "1");
            send(res, 503, error_body("busy", "the service is busy: " + std::to_string(concurrency()) +
                                                  " requests are computing and none finished within " + std::to_string(opt.queue_timeout.count()) +
                                                  " ms (gpumem serve --concurrency, --queue-timeout); retry later"));
            return;
        }
        struct Release {
            WorkGate& g;
            ~Release() { g.release(); }
        } release{*gate};
        std::optional<Result<json>> r;
        try {
            WorkBudget budget(opt.time_limit, &stopping);
            r.emplace(work());
        } catch (const BudgetExceeded&) {
            send(res, 503, error_body("timeout", "the request needs more than the service's time limit of " + std::to_string(opt.time_limit.count()) +
                                                     " ms (gpumem serve --time-limit) and was cancelled; narrow it (plan: only-*, top; sweep: fewer "
                                                     "points; fewer GPUs) or run the CLI"));
            return;
        }
        if (*r && raw_type && r->value().is_string()) res.set_content(r->value().get<std::string>(), raw_type);
        else if (*r) send(res, 200, r->value());
        else send(res, http_status(r->error().code), error_to_json(r->error()));
    }

    static json parse_body(const std::string& text) {
        check_json_text(text);
        try {
            return json::parse(text);
        } catch (const json::exception& e) {
            fail(ErrorCode::ParseError, "", std::string("the request body is not valid JSON: ") + e.what());
        }
    }

    // Before the body is read: the Host names this server, an Origin is its
    // own, a POST says its length (411) within the limit (413), sends JSON
    // (415; snapshots may send bytes) and is not compressed.
    httplib::Server::HandlerResponse screen(const Request& req, Response& res) const {
        const auto refuse = [&](int status, const std::string& code, const std::string& msg) {
            send(res, status, error_body(code, msg));
            res.set_header("Connection", "close");
            mark_close();
            return httplib::Server::HandlerResponse::Handled;
        };
        const std::string host = req.get_header_value("Host");
        if (req.has_header("Host") && !host_allowed(host, {opt.host, req.local_addr}, opt.allow_hosts))
            return refuse(403, "forbidden_host", "Host \"" + host.substr(0, 200) + "\" is not this server's name (localhost, 127.0.0.1, [::1] or the listening address); "
                                                 "to reach it under another name start it with --allow-host NAME");
        if (req.get_header_value_count("Host") > 1) return refuse(400, "bad_request", "more than one Host header");
        if (req.has_header("Origin")) {
            const std::string origin = req.get_header_value("Origin");
            const std::string want = "http://" + lower(host);
            if (!req.has_header("Host") || lower(origin) != want)
                return refuse(403, "forbidden_origin", "Origin \"" + origin.substr(0, 200) + "\" is not this server (" + want +
                                                           "): the service answers its own page only, no cross-site requests");
        }
        if (req.method != "POST") return httplib::Server::HandlerResponse::Unhandled;

        const std::string te = lower(req.get_header_value("Transfer-Encoding"));
        const bool chunked = te == "chunked";
        if (req.has_header("Transfer-Encoding") && !chunked)
            return refuse(501, "not_implemented", "Transfer-Encoding \"" + te.substr(0, 100) + "\": only chunked (or a Content-Length) is accepted");
        if (chunked && req.has_header("Content-Length")) return refuse(400, "bad_request", "both Content-Length and Transfer-Encoding: send one");
        if (!chunked && !req.has_header("Content-Length"))
            return refuse(411, "length_required", "a POST needs a Content-Length header (or Transfer-Encoding: chunked)");
        if (!chunked) {
            const std::string cl = req.get_header_value("Content-Length");
            std::uint64_t n = 0;
            const auto [p, ec] = std::from_chars(cl.data(), cl.data() + cl.size(), n);
            if (ec != std::errc() || p != cl.data() + cl.size()) return refuse(400, "bad_request", "Content-Length \"" + cl.substr(0, 40) + "\" is not a number");
            if (n > opt.max_body) return refuse(413, "payload_too_large", too_large_message());
        }
        const std::string ce = lower(req.get_header_value("Content-Encoding"));
        if (!ce.empty() && ce != "identity")
            return refuse(415, "unsupported_media_type", "Content-Encoding \"" + ce.substr(0, 100) + "\": send the body uncompressed");

        if (post_routes.count(req.path) == 0) return httplib::Server::HandlerResponse::Unhandled;  // 404 / 405 after the (bounded) body
        std::string type = lower(req.get_header_value("Content-Type"));
        if (const auto semi = type.find(';'); semi != std::string::npos) type.resize(semi);
        while (!type.empty() && type.back() == ' ') type.pop_back();
        const bool snapshot = req.path == "/v1/snapshot";
        if (type != kJson && !(snapshot && type == "application/octet-stream"))
            return refuse(415, "unsupported_media_type",
                          "Content-Type \"" + type.substr(0, 100) + "\": send the body as application/json" +
                              (snapshot ? std::string(" (or the snapshot's bytes as application/octet-stream)") : std::string()));
        return httplib::Server::HandlerResponse::Unhandled;
    }

    std::string too_large_message() const {
        return "the request body is over the service's limit of " + std::to_string(opt.max_body) + " bytes (gpumem serve --max-body)";
    }

    void setup() {
        const int n = threads();
        gate = std::make_unique<WorkGate>(concurrency());
        ledger.limit = opt.max_body_total > 0 ? opt.max_body_total : 16 * opt.max_body;
        svr.limits.max_header = opt.max_header;
        // Chunk framing ("<hex>\r\n ... \r\n") on top of the payload: 1/8 more.
        svr.limits.max_body_wire = opt.max_body + opt.max_body / 8 + 4096;
        svr.limits.read_timeout = opt.read_timeout;
        svr.limits.write_timeout = opt.write_timeout;
        svr.limits.stopping = &stopping;
        svr.limits.ledger = &ledger;
        svr.keep_alive_timeout = opt.keep_alive_timeout;
        svr.keep_alive_max = static_cast<std::size_t>(std::max(1, opt.keep_alive_max));
        svr.stopping = &stopping;
        svr.new_task_queue = [this, n] {
            auto* pool = new ConnectionPool(static_cast<std::size_t>(n), static_cast<std::size_t>(4 * n), 2 * opt.read_timeout);
            svr.pool = pool;
            return pool;
        };
        svr.set_payload_max_length(opt.max_body);
        svr.set_keep_alive_max_count(svr.keep_alive_max);
        svr.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(opt.keep_alive_timeout.count() / 1000)));
        svr.set_tcp_nodelay(true);
        svr.set_pre_routing_handler([this](const Request& req, Response& res) { return screen(req, res); });
        // "Expect: 100-continue" (curl, for bodies over 1 MiB): the same checks
        // answer before the client sends the body.
        svr.set_expect_100_continue_handler([this](const Request& req, Response& res) {
            return screen(req, res) == httplib::Server::HandlerResponse::Handled ? res.status : 100;
        });

        for (const auto& cmd : json_commands()) {
            post_routes.insert("/v1/" + cmd);
            svr.Post("/v1/" + cmd, guarded([this, cmd](const Request& req, Response& res) {
                         if (req.body.size() > opt.max_body) {  // a chunked body, decoded
                             send(res, 413, error_body("payload_too_large", too_large_message()));
                             return;
                         }
                         // POST /v1/timeline?format=svg: the plot the CLI writes
                         // (--timeline FILE.svg), drawn by the same renderer.
                         if (cmd == "timeline" && req.has_param("format") && req.get_param_value("format") != "json") {
                             if (req.get_param_value("format") != "svg")
                                 fail(ErrorCode::InvalidArgument, "format", "format: \"" + req.get_param_value("format").substr(0, 40) + "\" is not json or svg");
                             respond(
                                 res,
                                 [&req]() -> Result<json> {
                                     const json body = parse_body(req.body);
                                     auto a = run(Command::Timeline, body);
                                     if (!a) return a.error();
                                     const auto& e = std::get<FullEstimate>(a.value().result).memory;
                                     return json(render_timeline_svg(*e.simulation, e.model_name + " - " + to_string(e.request().mode) + " on " + e.gpu().name,
                                                                     e.per_gpu.capacity));
                                 },
                                 "image/svg+xml");
                             return;
                         }
                         respond(res, [&req, &cmd] {
                             json body = parse_body(req.body);
                             // The planner's confirming simulations run on this
                             // thread only: under its budget, never one thread per
                             // request field.
                             if (cmd == "plan" && body.is_object()) body["threads"] = 1;
                             return api_call(cmd, body, false);
                         });
                     }));
        }

        svr.Post("/v1/snapshot", guarded([this](const Request& req, Response& res) {
                     if (req.body.size() > opt.max_body) {
                         send(res, 413, error_body("payload_too_large", too_large_message()));
                         return;
                     }
                     // JSON-wrapped form ({"data": ...}, as api_call takes it):
                     // with Content-Type application/json; "path" is refused
                     // (allow_paths=false).
                     std::string type = lower(req.get_header_value("Content-Type"));
                     if (type.rfind(kJson, 0) == 0) {
                         respond(res, [&req] { return api_call("snapshot", parse_body(req.body), false); });
                         return;
                     }
                     json opts = json::object();
                     if (req.has_param("alloc-conf")) opts["alloc-conf"] = req.get_param_value("alloc-conf");
                     if (req.has_param("device")) {
                         const std::string d = req.get_param_value("device");
                         int dev = 0;
                         const auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), dev);
                         if (ec != std::errc() || p != d.data() + d.size() || dev < 0)
                             fail(ErrorCode::InvalidArgument, "device", "device: \"" + d.substr(0, 40) + "\" is not a device index (0, 1, ...)");
                         opts["device"] = dev;
                     }
                     if (req.body.empty()) fail(ErrorCode::InvalidArgument, "data", "send the snapshot file's bytes as the request body");
                     respond(res, [&req, &opts] { return api_snapshot_bytes(req.body, opts); });
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
                        res.set_header("X-Content-Type-Options", "nosniff");
                        res.set_header("X-Frame-Options", "DENY");
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

        svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own JSON error
            const ConnState* st = t_conn;
            if (st && st->header_too_large) {
                send(res, 431, error_body("headers_too_large", "the request line and headers are over the service's limit of " +
                                                                   std::to_string(opt.max_header) + " bytes"));
            } else if (st && st->body_too_large) {
                send(res, 413, error_body("payload_too_large", too_large_message()));
            } else if (st && st->bodies_over_total) {
                res.set_header("Retry-After", "1");
                send(res, 503, error_body("busy", "the service holds too many request bodies at once; retry later"));
            } else if (st && st->timed_out) {
                send(res, 408, error_body("request_timeout", "the request did not arrive within the service's read timeout of " +
                                                                 std::to_string(opt.read_timeout.count()) + " ms (gpumem serve --read-timeout)"));
            } else if (res.status == 404) {
                const bool is_post = post_routes.count(req.path) > 0, is_get = get_routes.count(req.path) > 0;
                if (is_post || is_get) {
                    res.set_header("Allow", is_post ? "POST" : "GET, HEAD");
                    send(res, 405, error_body("method_not_allowed", req.method + " " + req.path.substr(0, 200) + ": use " + (is_post ? "POST" : "GET")));
                } else {
                    send(res, 404, error_body("not_found", "no route " + req.method.substr(0, 20) + " " + req.path.substr(0, 200) +
                                                               " (POST /v1/estimate, /v1/fit, /v1/plan, /v1/sweep, /v1/advise, /v1/doctor, /v1/calibrate, "
                                                               "/v1/timeline, /v1/snapshot; GET /v1/models, /v1/gpus, /v1/fields, /healthz, / (the page))"));
                }
            } else if (res.status == 413) {
                send(res, 413, error_body("payload_too_large", too_large_message()));
            } else {
                const int status = res.status;
                send(res, status, error_body("http_" + std::to_string(status), "HTTP " + std::to_string(status)));
            }
            if (res.status >= 400 && res.status != 404 && res.status != 405) {
                res.set_header("Connection", "close");
                mark_close();
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
    impl_->svr.raise_backlog(1024);
    impl_->port = bound;
    impl_->svr.start_parker();
    impl_->thread = std::thread([this] { impl_->svr.listen_after_bind(); });
    // stop() only works once the accept loop runs.
    for (int i = 0; i < 5000 && !impl_->svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
}

int Server::port() const { return impl_->port; }

const std::string& Server::error() const { return impl_->error; }

int Server::running() const { return impl_->gate ? impl_->gate->running() : 0; }

void Server::stop() {
    if (!impl_ || !impl_->thread.joinable()) return;
    impl_->stopping = true;  // cancels the work in flight (WorkBudget) and ends the connection loops
    if (impl_->gate) impl_->gate->wake_all();
    impl_->svr.parker.stop();  // before the pool goes: it hands connections to it
    impl_->svr.stop();
    impl_->thread.join();
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
    if (!opt.quiet) {
        std::fprintf(stderr, "gpumem serving on http://%s:%d\n", host_for_url(opt.host).c_str(), s.port());
        const std::string h = host_name(opt.host);
        if (h != "127.0.0.1" && h != "::1" && h != "localhost")
            std::fprintf(stderr, "gpumem: warning: listening on %s, not loopback: anyone who can reach it can use the service (docs/security.md)\n",
                         opt.host.c_str());
    }
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "gpumem: stopping\n");
    s.stop();
    return 0;
}

}  // namespace gpumem::server
