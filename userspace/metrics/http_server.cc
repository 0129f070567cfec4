#include "metrics/http_server.h"
#include "common/thread_name.h"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

namespace kpleg::metrics {
namespace {

// Bounds that keep /healthz answering while clients misbehave. httplib's own timeouts are per
// read: a client that sends one header byte a second holds a worker for as long as it likes, and
// 32 of them held every worker (any process that reaches the port could starve the probes). So
// each connection serves one request and has a deadline for the whole of it, counted from the
// moment a worker takes it: the request (line, headers, body) must have arrived within
// kRequestDeadline, the response must be written within kResponseDeadline after that. A local
// client sends its request in one segment; a trickling one is cut off after kRequestDeadline, so
// with 40 of them reconnecting as fast as they can, a probe waits about one deadline for a
// worker. A request body (no endpoint takes one) is refused above kMaxBody. Idle workers sleep:
// the pool costs no wakeup.
constexpr size_t kWorkers = 32;
constexpr auto kRequestDeadline = std::chrono::seconds(1);
constexpr auto kResponseDeadline = std::chrono::seconds(2);
constexpr size_t kMaxBody = 4096;

// A connection's socket as httplib reads and writes it, with the whole-request deadline (httplib's
// SocketStream has only a timeout per read).
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, std::chrono::steady_clock::time_point read_deadline,
                 std::chrono::steady_clock::time_point write_deadline)
      : fd_(fd), read_deadline_(read_deadline), write_deadline_(write_deadline) {}

  bool is_readable() const override { return wait_for(POLLIN, read_deadline_); }
  bool is_writable() const override { return wait_for(POLLOUT, write_deadline_); }

  ssize_t read(char* ptr, size_t size) override {
    // httplib reads the request line and headers a byte at a time: serve them from a buffer.
    if (begin_ == end_) {
      if (!is_readable()) return -1;
      ssize_t n;
      do {
        n = ::recv(fd_, buf_.data(), buf_.size(), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buf_.data() + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  bool wait_for(short events, std::chrono::steady_clock::time_point deadline) const {
    if (begin_ != end_ && events == POLLIN) return true;
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      return r > 0;
    }
  }
  void address_of(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char host[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
      port = ntohs(in6->sin6_port);
    }
    ip = host;
  }

  const int fd_;
  const std::chrono::steady_clock::time_point read_deadline_, write_deadline_;
  std::array<char, 4096> buf_{};
  size_t begin_ = 0, end_ = 0;
};

}  // namespace

// httplib's server with its connection handling replaced (the virtual it calls for every
// accepted socket): one request per connection, under DeadlineStream's deadlines.
class DeadlineServer final : public httplib::Server {
 private:
  bool process_and_close_socket(socket_t sock) override {
    const auto read_deadline = std::chrono::steady_clock::now() + kRequestDeadline;
    bool ok = false;
    {
      DeadlineStream stream(sock, read_deadline, read_deadline + kResponseDeadline);
      bool closed = false;
      ok = process_request(stream, /*close_connection=*/true, closed, nullptr);
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }
};

namespace {

void answer_health(const api::HealthReport& report, httplib::Response& res) {
  if (report.healthy) {
    res.status = 200;
    res.set_content("ok\n", "text/plain; charset=utf-8");
    return;
  }
  std::string body = "unhealthy\n";
  for (const auto& r : report.reasons) body += "- " + r + "\n";
  res.status = 503;
  res.set_content(body, "text/plain; charset=utf-8");
}

}  // namespace

Result<std::pair<std::string, int>> parse_host_port(const std::string& address) {
  std::string host;
  std::string port_text;
  if (!address.empty() && address[0] == '[') {
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return Error{EINVAL, "--metrics-address " + address + ": expected [v6 address]:port"};
    host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon)
      return Error{EINVAL, "--metrics-address " + address + ": expected host:port"};
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  int port = -1;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (host.empty() || ec != std::errc() || p != port_text.data() + port_text.size() || port < 0 ||
      port > 65535)
    return Error{EINVAL, "--metrics-address " + address + ": expected host:port"};
  return std::pair<std::string, int>(host, port);
}

void add_metrics_flags(CLI::App& app, MetricsServerOptions& o) {
  app.add_option("--metrics-address", o.address,
                 "host:port for /metrics, /livez, /readyz and /healthz; empty to disable")
      ->capture_default_str();
}

MetricsServer::MetricsServer(MetricsServerOptions options, Registry& registry,
                             api::HealthProvider& health)
    : options_(std::move(options)), registry_(registry), health_(health) {}

MetricsServer::~MetricsServer() { stop(); }

Status MetricsServer::start() {
  if (server_) return Error{EALREADY, "metrics server already started"};
  auto hp = parse_host_port(options_.address);
  if (!hp) return hp.error();
  host_ = hp->first;

  auto server = std::make_unique<DeadlineServer>();
  // httplib's default adds SO_REUSEPORT, which would let a second kplegd bind the same port
  // and silently take half the scrapes: keep only SO_REUSEADDR (quick restarts).
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  server->set_payload_max_length(kMaxBody);
  server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->Get("/livez", [this](const httplib::Request&, httplib::Response& res) {
    answer_health(health_.liveness(), res);
  });
  server->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    answer_health(health_.health(), res);
  });
  server->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    answer_health(health_.readiness(), res);
  });

  errno = 0;
  if (hp->second == 0) {
    port_ = server->bind_to_any_port(host_);
    if (port_ <= 0) {
      int err = errno;
      return Error{err != 0 ? err : EADDRNOTAVAIL,
                   fmt::format("--metrics-address {}: cannot bind: {}", options_.address,
                               err != 0 ? std::strerror(err) : "unknown error")};
    }
  } else {
    if (!server->bind_to_port(host_, hp->second)) {
      int err = errno;
      return Error{err != 0 ? err : EADDRNOTAVAIL,
                   fmt::format("--metrics-address {}: cannot bind: {}", options_.address,
                               err != 0 ? std::strerror(err) : "unknown error")};
    }
    port_ = hp->second;
  }
  server_ = std::move(server);
  thread_ = named_thread("kpleg-http", [s = server_.get()] { s->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop has started: wait for it, or a quick
  // start-stop would leave stop() joining a thread that never ends.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  spdlog::info("metrics: serving /metrics, /livez, /healthz, /readyz on {}:{}", host_, port_);
  return {};
}

void MetricsServer::stop() {
  if (!server_) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace kpleg::metrics
