#include "metrics/http_server.h"
#include "common/thread_name.h"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include <sys/socket.h>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

namespace kpleg::metrics {
namespace {

// Bounds that keep /healthz answering while clients misbehave (the liveness probe restarts the
// daemon when it does not answer): a connection that sends nothing, or stalls mid-request,
// holds a worker for at most kReadTimeout (httplib's default is 5 s, with 8 workers: 64 idle
// connections kept /healthz waiting for 40 s); an idle keep-alive connection is closed after
// kKeepAlive; a request body (no endpoint takes one) is refused above kMaxBody. Idle workers
// sleep: the pool costs no wakeup.
constexpr size_t kWorkers = 32;
constexpr auto kReadTimeout = std::chrono::seconds(1);
constexpr auto kWriteTimeout = std::chrono::seconds(2);
constexpr time_t kKeepAliveSeconds = 1;
constexpr size_t kKeepAliveMaxRequests = 100;
constexpr size_t kMaxBody = 4096;

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

  auto server = std::make_unique<httplib::Server>();
  // httplib's default adds SO_REUSEPORT, which would let a second kplegd bind the same port
  // and silently take half the scrapes: keep only SO_REUSEADDR (quick restarts).
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  server->set_read_timeout(kReadTimeout);
  server->set_write_timeout(kWriteTimeout);
  server->set_keep_alive_timeout(kKeepAliveSeconds);
  server->set_keep_alive_max_count(kKeepAliveMaxRequests);
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
  thread_ = std::thread([s = server_.get()] {
    set_thread_name("kpleg-http");
    s->listen_after_bind();
  });
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
