// The consumer API server: kpleg.v1.PodLifecycle (List, Watch, Stats) and the standard
// grpc.health.v1.Health, on a unix socket (owner-only by default) and optionally on TCP with
// TLS. Watch streams come from the EventBus; List, health and stats from the daemon's
// providers. A slow consumer is cut off by the bus and its stream ends with
// RESOURCE_EXHAUSTED; nothing a consumer does can block the daemon.
//
// The unix socket's connections are served by kplegd's own HTTP/2 code (h2_server.h: the
// publishing thread writes each Watch event itself, no thread hand-off per event); TCP by
// grpc++'s sync server (TLS, client certificates), which starts only with --listen. Both call
// the same handlers (PodLifecycleService, HealthService) and share the stream slots.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <thread>

#include "api/health_names.h"
#include "api/options.h"
#include "api/providers.h"
#include "bus/event_bus.h"
#include "common/result.h"

namespace grpc {
class Server;
}

namespace kpleg::api {

class PodLifecycleService;
class HealthService;
class StreamSlots;
class UnixListener;
class H2Server;

class ApiServer {
 public:
  // The bus and the providers must outlive the server.
  ApiServer(ApiServerOptions options, bus::EventBus& bus, StateProvider& state,
            HealthProvider& health, StatsProvider& stats);
  ~ApiServer();  // stop()
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Validates the options, prepares the socket (creates its directory, removes a stale
  // socket, refuses one a live server answers on), binds and starts serving.
  Status start();
  // Ends every Watch with UNAVAILABLE, stops serving within `grace` (then cancels what is
  // left), and removes the socket. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(2));

  // Re-reads the HealthProvider now and updates grpc.health.v1 (it is also re-read when the
  // provider announces a change and when its report's recheck_in passes). Safe from any thread.
  void refresh_health();

  // The bound TCP port (useful with --listen host:0); 0 without --listen.
  int tcp_port() const { return tcp_port_; }
  // Calls of cut-off Watches cancelled after ApiServerOptions::cut_off_grace.
  uint64_t cut_off_watches_cancelled() const;
  // Watch handlers running now (a cut-off one until its call ends).
  size_t open_watches() const;
  const ApiServerOptions& options() const { return options_; }

 private:
  void health_loop();
  void drop_unix_listener();
  // What the health listener calls: the health thread re-reads the provider.
  void request_health_refresh();

  ApiServerOptions options_;
  bus::EventBus& bus_;
  HealthProvider& health_;
  std::unique_ptr<StreamSlots> streams_;
  std::unique_ptr<PodLifecycleService> service_;
  std::unique_ptr<HealthService> health_service_;
  std::mutex server_mu_;  // refresh_health() may race with stop()
  bool serving_ = false;
  std::unique_ptr<grpc::Server> server_;  // --listen
  std::unique_ptr<H2Server> h2_;          // --socket
  std::unique_ptr<UnixListener> unix_listener_;
  int tcp_port_ = 0;
  gid_t socket_gid_ = static_cast<gid_t>(-1);
  ino_t socket_ino_ = 0;  // to remove only the socket this server created

  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool stopping_ = false;
  bool refresh_requested_ = false;  // the provider announced a change
  std::optional<std::chrono::steady_clock::time_point> recheck_at_;  // the next timed re-read
  std::thread health_thread_;
};

}  // namespace kpleg::api
