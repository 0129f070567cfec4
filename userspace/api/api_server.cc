#include "api/api_server.h"

#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "api/client_identity.h"
#include "api/h2_server.h"
#include "api/health_service.h"
#include "api/limits.h"
#include "api/pod_lifecycle_service.h"
#include "api/tls_credentials.h"
#include "api/unix_listener.h"
#include "api/unix_socket.h"
#include "common/thread_name.h"

namespace kpleg::api {

ApiServer::ApiServer(ApiServerOptions options, bus::EventBus& bus, StateProvider& state,
                     HealthProvider& health, StatsProvider& stats)
    : options_(std::move(options)),
      bus_(bus),
      health_(health),
      streams_(std::make_unique<StreamSlots>(options_.max_watchers,
                                             options_.max_watchers_per_client)),
      service_(std::make_unique<PodLifecycleService>(bus, state, health, stats, *streams_,
                                                     options_.cut_off_grace)),
      health_service_(std::make_unique<HealthService>(kWatchPoll, streams_.get())) {
  // A stream that finds every slot taken first has the open ones look whether their clients
  // went away (a cancelled idle stream would otherwise hold its slot up to kWatchPoll).
  streams_->set_reclaim([this] {
    service_->wake_watches();
    health_service_->wake_watches();
  });
  streams_->set_client_namer([](const grpc::ServerContext& ctx) { return client_of(ctx); });
}

ApiServer::~ApiServer() { stop(); }

uint64_t ApiServer::cut_off_watches_cancelled() const {
  return service_->cut_off_watches_cancelled() + (h2_ ? h2_->cut_off_watches_cancelled() : 0);
}
size_t ApiServer::open_watches() const {
  return service_->open_watches() + (h2_ ? h2_->open_watches() : 0);
}

Status ApiServer::start() {
  if (serving_) return Error{EALREADY, "API server already started"};
  if (auto st = options_.validate(); !st) return st;

  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  builder.RegisterService(health_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  // Threads: one per open stream (bounded by --max-watchers) plus room for unary calls; past
  // that gRPC answers RESOURCE_EXHAUSTED instead of growing without bound.
  grpc::ResourceQuota quota("kpleg-api");
  quota.SetMaxThreads(static_cast<int>(std::min<size_t>(options_.max_watchers + kUnaryThreads, 1 << 20)));
  builder.SetResourceQuota(quota);
  // A sync server's polling threads wait for calls with this timeout (gRPC's default: 10 s) and
  // then loop, or end if more than the minimum are polling: with the default each of them woke an
  // idle daemon every 10 s. Shutdown wakes them at once, so nothing needs the timeout but the
  // retiring of surplus pollers after a burst, which can wait an hour.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC,
                              kSyncPollerTimeoutMs);
  // One thread polls the connections (gRPC's default: up to two). A consumer's gRPC client
  // acknowledges every event it reads (a WINDOW_UPDATE); with two pollers the one it woke handed
  // the poll to the other through a wakeup fd, several wakeups per event (docs/design.md,
  // Threads). A unary call is handled by the thread that polled it, a new poller taking over.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);

  if (!options_.socket_group.empty()) {
    auto gid = socket_group_id(options_.socket_group);
    if (!gid) return gid.error();
    socket_gid_ = *gid;
  }
  if (!options_.socket_path.empty()) {
    if (auto st = prepare_socket_path(options_.socket_path); !st) return st;
    auto listener = UnixListener::bind(options_.socket_path);
    if (!listener) return listener.error();
    unix_listener_ = std::move(*listener);
  }
  if (!options_.listen_address.empty()) {
    auto creds = tcp_credentials(options_);
    if (!creds) return creds.error();
    builder.AddListeningPort(options_.listen_address, *creds, &tcp_port_);
    server_ = builder.BuildAndStart();
    if (!server_ || tcp_port_ == 0) {
      server_.reset();
      drop_unix_listener();
      return Error{EADDRNOTAVAIL, "--listen " + options_.listen_address + ": cannot bind"};
    }
  }
  if (!options_.socket_path.empty()) {
    auto ino = secure_socket(options_.socket_path, socket_gid_);
    if (ino) socket_ino_ = *ino;
    auto h2 = std::make_unique<H2Server>(*service_, *health_service_, bus_, *streams_,
                                         options_.cut_off_grace);
    Status started = ino ? h2->start() : Status(ino.error());
    if (!started) {
      if (server_) {
        server_->Shutdown();
        server_->Wait();
        server_.reset();
      }
      drop_unix_listener();
      unlink(options_.socket_path.c_str());  // ours: it was bound just above
      socket_ino_ = 0;
      return started;
    }
    h2_ = std::move(h2);
    unix_listener_->serve([h2 = h2_.get()](int fd, const ucred& peer) { h2->adopt(fd, peer); });
  }
  {
    std::lock_guard l(server_mu_);
    serving_ = true;
  }

  {
    std::lock_guard l(health_mu_);
    stopping_ = false;
  }
  health_service_->set_evaluated(kLivenessService, [this] { return health_.liveness().healthy; });
  health_.set_health_listener([this] { request_health_refresh(); });
  refresh_health();
  health_thread_ = named_thread("kpleg-health", [this] { health_loop(); });

  if (!options_.socket_path.empty())
    spdlog::info("api: serving kpleg.v1.PodLifecycle on unix:{} ({})", options_.socket_path,
                 options_.socket_group.empty() ? "0600" : "0660, group " + options_.socket_group);
  if (!options_.listen_address.empty())
    spdlog::info("api: serving kpleg.v1.PodLifecycle on {} (port {}, {})", options_.listen_address,
                 tcp_port_,
                 options_.insecure_tcp                 ? "insecure"
                 : options_.tls_client_ca_file.empty() ? "TLS"
                                                       : "TLS, client certificates required");
  return {};
}

void ApiServer::refresh_health() {
  std::optional<std::chrono::milliseconds> recheck_in;
  {
    std::lock_guard l(server_mu_);
    if (!serving_) return;
    HealthReport h = health_.health();
    HealthReport live = health_.liveness();
    recheck_in = h.recheck_in;
    if (live.recheck_in && (!recheck_in || *live.recheck_in < *recheck_in))
      recheck_in = live.recheck_in;
    health_service_->set("", h.healthy);
    health_service_->set(kHealthServiceName, h.healthy);
    health_service_->set(kReadinessService, h.healthy);
    health_service_->set(kLivenessService, live.healthy);
    if (h2_) h2_->health_changed();
  }
  std::lock_guard l(health_mu_);
  recheck_at_.reset();
  if (recheck_in) recheck_at_ = std::chrono::steady_clock::now() + *recheck_in;
  if (options_.health_refresh_interval.count() > 0) {
    auto periodic = std::chrono::steady_clock::now() + options_.health_refresh_interval;
    if (!recheck_at_ || periodic < *recheck_at_) recheck_at_ = periodic;
  }
  health_cv_.notify_all();  // the loop's next wake-up may have moved
}

void ApiServer::request_health_refresh() {
  {
    std::lock_guard l(health_mu_);
    refresh_requested_ = true;
  }
  health_cv_.notify_all();
}

void ApiServer::health_loop() {
  std::unique_lock l(health_mu_);
  while (!stopping_) {
    // Sleeps until the provider announces a change or the last report's deadline passes: no
    // wake-up while nothing changes. A refresh from outside that moves the deadline restarts
    // the wait.
    const auto due = recheck_at_;
    auto woken = [&] { return stopping_ || refresh_requested_ || recheck_at_ != due; };
    const bool passed = due ? !health_cv_.wait_until(l, *due, woken) : (health_cv_.wait(l, woken), false);
    if (stopping_) break;
    if (!passed && !refresh_requested_) continue;  // a new deadline: wait for that one
    refresh_requested_ = false;
    l.unlock();
    refresh_health();
    l.lock();
  }
}

void ApiServer::drop_unix_listener() {
  // Names of clients are asked for by calls: none is left once the server is gone.
  unix_listener_.reset();
}

void ApiServer::stop(std::chrono::milliseconds grace) {
  health_.set_health_listener(nullptr);
  {
    std::lock_guard l(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
  {
    std::lock_guard l(server_mu_);
    if (!serving_) return;
    serving_ = false;
  }

  if (unix_listener_) unix_listener_->stop();  // no new connection during the shutdown
  service_->stop();
  health_service_->stop();
  if (h2_) h2_->stop(grace);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    server_->Wait();
  }
  server_.reset();
  h2_.reset();
  drop_unix_listener();

  if (!options_.socket_path.empty() && socket_ino_ != 0) {
    remove_socket_if_ours(options_.socket_path, socket_ino_);
    socket_ino_ = 0;
  }
  spdlog::info("api: stopped");
}

}  // namespace kpleg::api
