// The API's unix socket connections, served by kplegd's own HTTP/2 code (h2_connection.h says
// why): one thread, asleep in epoll_wait while no consumer sends anything, reads every
// connection, answers the unary calls, starts the streams and resets cut-off ones after their
// grace. Watch events are written by the publishing thread itself. TCP (with TLS) stays with
// grpc++ (api_server.h).
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/h2_connection.h"
#include "common/result.h"

namespace kpleg::api {

class H2Server {
 public:
  // Everything given must outlive the server.
  H2Server(PodLifecycleService& lifecycle, HealthService& health, bus::EventBus& bus,
           StreamSlots& slots, std::chrono::milliseconds cut_off_grace);
  ~H2Server();  // stop()
  H2Server(const H2Server&) = delete;
  H2Server& operator=(const H2Server&) = delete;

  Status start();
  // Serves `fd` (an accepted, non-blocking unix socket connection; taken over) for the process
  // `peer` names. Any thread.
  void adopt(int fd, const ucred& peer);
  // The health statuses changed: each health Watch whose status moved gets it. Any thread.
  void health_changed();
  // Ends every stream with UNAVAILABLE, says GOAWAY, and closes each connection once all is
  // sent, or when `grace` is over. Idempotent.
  void stop(std::chrono::milliseconds grace);

  size_t open_watches() const { return shared_.open_watches.load(); }
  uint64_t cut_off_watches_cancelled() const { return shared_.cut_off_cancelled.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  void loop();
  void wake();
  void take_new_connections();
  void drop(int fd);

  h2::Shared shared_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex mu_;  // what adopt(), stop() and health_changed() share with the thread
  std::vector<std::pair<int, std::string>> adopted_;  // connections and their clients, not yet served
  bool stop_requested_ = false;
  Clock::time_point stop_deadline_;
  std::map<int, std::shared_ptr<h2::Connection>> connections_;  // changed by the thread under mu_
};

}  // namespace kpleg::api
