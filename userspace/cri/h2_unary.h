// Unary gRPC calls over HTTP/2 without TLS (h2c) on a unix socket, made on the calling thread
// over connections that stay open between calls: poll(2) on the socket (and a CancelToken),
// nghttp2 for the framing, the request and the response as serialized bytes.
//
// Why not grpc++: kplegd's confirmation looks (ContainerStatus, PodSandboxStatus) are small
// calls made one at a time from a few worker threads, and under churn each one cost ~0.3 ms of
// daemon CPU through grpc++'s synchronous stub (call and completion-queue machinery, five
// wakeups per look) — most of the daemon's CPU on a runtime without an event stream. Here a
// call is one send(2) of the request and, usually, one wakeup and one recv(2) of the answer.
// Only read-only calls go this way (a call that found its idle connection closed is made
// again on a new one); everything else stays on grpc++.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "cri/cancel_token.h"

struct nghttp2_session;

namespace kpleg::cri {

struct H2UnaryOptions {
  // A larger answer fails the call (RESOURCE_EXHAUSTED), like grpc++'s receive limit.
  size_t max_message_bytes = 16u << 20;
  // HTTP/2 flow-control window, stream and connection: a WINDOW_UPDATE per this much data.
  int32_t window_bytes = 16 << 20;
  // How long the answer to the runtime's PING is held back: it goes out after the frames of
  // the first request made once the PING is this old. A gRPC-Go server (containerd, CRI-O)
  // sends a PING (with a WINDOW_UPDATE) on a request's data whenever its last PING has been
  // answered, to estimate the bandwidth; answered at once, every call brought one, and it
  // often came apart from the answer and woke the calling thread a second time. Held back, the
  // server sends at most one per this period and connection. Every PING is answered.
  std::chrono::milliseconds ping_ack_hold{1000};
};

// One connection; one call at a time (not thread-safe). Connects at its first call and again
// after a failure.
class H2UnaryConnection {
 public:
  using Clock = std::chrono::steady_clock;
  explicit H2UnaryConnection(std::string socket_path, H2UnaryOptions opts = {});
  ~H2UnaryConnection();
  H2UnaryConnection(const H2UnaryConnection&) = delete;
  H2UnaryConnection& operator=(const H2UnaryConnection&) = delete;

  // Calls `method` ("/package.Service/Method") with the serialized `request` and returns the
  // serialized answer, or the gRPC status the server sent; DEADLINE_EXCEEDED past `deadline`
  // (the server is told it in grpc-timeout), UNAVAILABLE when the connection failed, CANCELLED
  // once `cancel` (may be null) is cancelled, INTERNAL for a protocol error. A call whose
  // reused connection turns out closed before any of its answer arrived is made once more on a
  // new connection, so `method` must be safe to repeat. Never throws.
  Result<std::string> call(std::string_view method, std::string_view request,
                           Clock::time_point deadline, CancelToken* cancel);

  // Whether the connection is open and may carry the next call.
  bool open() const { return fd_ >= 0; }
  // Connections opened so far (1 while the first one holds).
  uint64_t connects() const { return connects_; }

  // nghttp2's callbacks (h2_unary.cc).
  struct Stream;
  // What nghttp2's callbacks see: the call in progress, and the PINGs not answered yet.
  struct HeldPing {
    std::array<uint8_t, 8> payload;
    Clock::time_point at;
  };
  struct Peer {
    Stream* current = nullptr;  // null between calls
    std::vector<HeldPing> pings;
  };

 private:
  Result<std::string> attempt(std::string_view method, std::string_view request,
                              Clock::time_point deadline, CancelToken* cancel, bool* retry);
  Status connect();
  void close_connection();
  // Reads what an idle connection has (a PING, a GOAWAY, its end) so a closed one is noticed
  // before a call is made on it.
  void drain_idle();
  // Queues the answers to the held PINGs that are due; whether there was any.
  bool answer_held_pings();
  // Sends everything nghttp2 has queued (and, in a call's first flush, the answers to the
  // held PINGs that are due, after the rest); false (and a failure in `stream`) when it cannot.
  bool flush(Stream& stream, Clock::time_point deadline, CancelToken* cancel);
  // Reads what the socket has into nghttp2; false on end of connection or error.
  bool receive(Stream* stream);

  const std::string socket_path_;
  const H2UnaryOptions opts_;
  int fd_ = -1;
  nghttp2_session* session_ = nullptr;
  Peer peer_;
  bool answer_pings_ = false;  // this call's first flush answers the held PINGs due
  std::string out_;            // bytes to send
  uint64_t connects_ = 0;
};

// Connections for calls from several threads: a call takes an idle connection (or opens one)
// and gives it back when it is still open. At most `max_idle` are kept.
class H2UnaryPool {
 public:
  H2UnaryPool(std::string socket_path, size_t max_idle, H2UnaryOptions opts = {});
  Result<std::string> call(std::string_view method, std::string_view request,
                           H2UnaryConnection::Clock::time_point deadline, CancelToken* cancel);
  // Connections opened so far, over all connections.
  uint64_t connects() const;

 private:
  const std::string socket_path_;
  const size_t max_idle_;
  const H2UnaryOptions opts_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<H2UnaryConnection>> idle_;  // under mu_
  uint64_t connects_ = 0;  // opened by any of them, under mu_
};

}  // namespace kpleg::cri
