// Relay: kpleg-cri-relay, the kubelet's CRI endpoint in a process of its own. Every call is
// forwarded to the runtime unchanged (criforward); GetContainerEvents is answered from kplegd's
// events (its API, kplegd_follower.h), the statuses built from the runtime as kplegd's own
// endpoint builds them (criendpoint's feed). It needs only the runtime's socket to serve, no
// BPF; kplegd may be down, restarting or slow to start: calls go on, the event streams stay
// open and quiet, and the pods that changed meanwhile are caught up when kplegd is back.
//
// Stopping is graceful: no new connection is taken (socket-activated, they wait in the backlog
// for the next relay), the event streams end (OK), every client is told to go away (GOAWAY),
// and the calls in flight finish for up to stop_timeout, which is longer than the kubelet's
// deadlines (2 min): a call is never cancelled half way through, it ends by its own deadline.
//
// The calls in flight are the stuck-call watchdog's: they are served on the status socket as
// kplegd's InflightCalls RPC (`kplegctl --socket <status socket> stuck`).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/result.h"

namespace kpleg::relay {

struct RelayOptions {
  std::string listen_endpoint;  // where the kubelet connects (unix path), unless listen_fd
  int listen_fd = -1;           // a socket systemd passed (its owner keeps it open)
  std::string runtime_endpoint;
  std::string kplegd_socket;  // kplegd's API
  std::string status_socket;  // empty: none
  size_t max_calls = 1024;
  size_t max_event_streams = 16;
  size_t max_queued_events = 10000;  // per event stream
  size_t max_feed_queue = 4096;      // events waiting for their statuses
  bool full_statuses = true;
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(150)};
};

struct RelayStats {
  std::map<std::pair<std::string, int>, uint64_t> calls;  // (method, code) -> finished
  uint64_t calls_in_flight = 0;
  uint64_t calls_refused = 0;
  uint64_t event_streams = 0;
  uint64_t events_sent = 0;
  uint64_t kplegd_events = 0;
  uint64_t catch_up_events = 0;
  uint64_t kplegd_disconnects = 0;
  bool kplegd_connected = false;
};

class Relay {
 public:
  static Result<std::unique_ptr<Relay>> start(RelayOptions options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  // Graceful stop (above); idempotent.
  void stop();
  RelayStats stats() const;

  class Impl;

 private:
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kpleg::relay
