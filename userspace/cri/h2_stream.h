// One gRPC server-streaming call over HTTP/2 without TLS (h2c) on a unix socket, read on the
// calling thread: poll(2) on the socket and a CancelToken, nghttp2 for the framing, and each
// message handed on as its serialized bytes.
//
// Why not grpc++'s reader: the runtime's event stream (GetContainerEvents) sends a message for
// every container change, and grpc++'s synchronous reader paid for each one in call machinery, a
// WINDOW_UPDATE per message and wakeups of gRPC's own threads: the event thread used 75 ms for
// 280 events under 10/s churn on containerd 2.4.2, and 38.5 ms read here. Here a message costs
// one wakeup, a recv and nghttp2's parse; the windows are large, so flow-control updates are
// rare. kplegd's read-only unary calls (Version, Status, the lists and the status looks) go the
// same way over connections kept open (h2_unary.h); only the calls that change something
// (kpleg-load's), the runtime connection's watcher and the CRI endpoint's forwarding
// (--cri-listen) use grpc++.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "cri/cancel_token.h"
#include "cri/reactor.h"

namespace kpleg::cri {

// No deadline: a server-streaming call's server sends its response headers with its first
// message (grpc-go does), so a quiet runtime says nothing for as long as nothing happens. A
// runtime that goes away closes the connection (UNAVAILABLE); CancelToken ends the wait.
struct H2StreamOptions {
  // A larger message ends the call (RESOURCE_EXHAUSTED), like grpc++'s default receive limit.
  size_t max_message_bytes = 4u << 20;
  // HTTP/2 flow-control window, stream and connection: a WINDOW_UPDATE per this much data.
  int32_t window_bytes = 16 << 20;
};

// Calls `method` ("/package.Service/Method") on the server listening on the unix socket
// `socket_path` with the serialized request `request`, and hands each response message to
// `on_message` on this thread until the stream ends (or `on_message` returns false: INTERNAL, the
// message does not parse). Returns OK when the server ended it with
// status OK; otherwise the gRPC status code and message the server sent (UNIMPLEMENTED for an
// unknown method), UNAVAILABLE when the connection failed or broke, CANCELLED after
// cancel.cancel(), INTERNAL for a protocol error. Never throws.
Status h2_server_stream(const std::string& socket_path, std::string_view method,
                        std::string_view request, CancelToken& cancel,
                        const std::function<bool(std::string_view message)>& on_message,
                        const H2StreamOptions& opts = {});

// The same call read on an event loop (reactor.h) without blocking it: each message to
// `on_message` and the end to `on_end` (once; at once when it cannot start), on the loop's
// thread. Destroyed or end()ed, it stops without calling on_end. Used on the loop's thread only.
class H2StreamReader {
 public:
  explicit H2StreamReader(Reactor& reactor);
  ~H2StreamReader();
  H2StreamReader(const H2StreamReader&) = delete;
  H2StreamReader& operator=(const H2StreamReader&) = delete;

  void start(const std::string& socket_path, std::string_view method, std::string_view request,
             std::function<bool(std::string_view message)> on_message,
             std::function<void(Status)> on_end, const H2StreamOptions& opts = {});
  void end();
  bool open() const { return state_ != nullptr; }
  // Reads nothing more until `until` (the socket leaves the loop's epoll set; what the server
  // sends meanwhile waits in the socket), then reads on as before, with the loop's first
  // wakeup from `until` on, a quarter of the hold later at the latest (its own wakeup then);
  // resume() ends it sooner.
  // Messages are then handed on together, in order, without a wakeup each. May be called from
  // on_message. A hold while held keeps the earlier end.
  void hold(std::chrono::steady_clock::time_point until);
  void resume();
  // Reads what the server has sent so far, held or not, without waiting (not from on_message).
  void read_queued();

 private:
  struct State;
  void on_ready(uint32_t events);
  // Sends what is due; hands the end over once the call ended.
  void pump();
  // The socket's epoll events: reading unless held, writing while nghttp2 has something to send.
  void watch_events();

  Reactor& reactor_;
  std::unique_ptr<State> state_;
  std::function<void(Status)> on_end_;
  bool want_write_ = false;
  bool held_ = false;
  uint64_t hold_timer_ = 0;  // the loop's timer that ends a hold; 0: none
};

}  // namespace kpleg::cri
