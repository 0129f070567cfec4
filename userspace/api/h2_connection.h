// One consumer connection on the API's unix socket, served by kplegd's own HTTP/2 code (nghttp2)
// rather than grpc++: the gRPC protocol over HTTP/2 for the API's five methods, unary
// (PodLifecycle List, Stats, InflightCalls, grpc.health Check) and server-streaming (Watch and
// grpc.health Watch). Why: with grpc++'s sync API every Watch event woke the stream's handler
// thread and gRPC's poller, about 2.6 thread wakeups and 330 µs of the serving process per event
// (bench/watch_write_cost.cc); here the publishing thread frames the event and hands it to the
// socket itself, and only what the consumer sends back (its flow-control updates) wakes the
// server's thread.
//
// Who runs what, all under the connection's one lock:
// - the API server's thread (h2_server.h) reads what the consumer sends, answers unary calls and
//   starts streams (handlers run without the lock), sends what the socket did not take, and
//   resets cut-off streams whose consumer still reads nothing after the grace;
// - the publishing thread (the bus's on_ready, EventBus::subscribe) resumes a Watch stream: its
//   data source takes events from the subscription as the stream's flow control and the socket
//   allow, so a consumer that stops reading leaves them in its bus queue, which cuts it off
//   when full, as for every subscriber; on a quiet connection it first reads the consumer's
//   flow-control frames;
// - the health thread (health_changed) writes a changed status to the health Watches.
// Nothing here blocks: the socket is non-blocking, and what it does not take waits for EPOLLOUT.
#pragma once

#include <grpcpp/support/status.h>
#include <nghttp2/nghttp2.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/h2_frame_cursor.h"
#include "api/stream_slots.h"
#include "bus/event_bus.h"

namespace kpleg::api {

class PodLifecycleService;
class HealthService;

namespace h2 {

// What every connection serves and shares; owned by the server, outlives its connections.
struct Shared {
  PodLifecycleService& lifecycle;
  HealthService& health;
  bus::EventBus& bus;
  StreamSlots& slots;
  std::chrono::milliseconds cut_off_grace;
  std::function<void()> wake_server;  // a reap deadline was set: the server's thread re-plans
  std::atomic<bool> stopping{false};
  std::atomic<size_t> open_watches{0};          // PodLifecycle Watch streams open now
  std::atomic<uint64_t> cut_off_cancelled{0};   // cut-off Watches reset after the grace
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = std::chrono::steady_clock;
  // Takes `fd` (connected, non-blocking); `client` names its peer for the stream slots.
  Connection(int fd, int epoll_fd, std::string client, Shared& shared);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  // The server's thread. Each returns false once the connection is done (the peer went away,
  // broke the protocol, or everything was said after a shut_down): the server then close()s it.
  bool open();  // sends the server's SETTINGS
  bool on_readable();
  bool on_writable();
  // The quiet span ended with no publisher's read: the server's thread reads again.
  bool on_quiet_timer();
  // How long what a quiet connection's consumer sends may wait for a reader (h2_connection.h).
  static constexpr std::chrono::milliseconds kQuietSpan{500};
  // The epoll key of the connection's quiet timer (its socket's key is the descriptor).
  static uint64_t timer_key(int fd) { return (uint64_t{1} << 32) | uint32_t(fd); }
  // Resets the cut-off streams whose grace passed; the next such deadline, if any.
  std::optional<Clock::time_point> reap(Clock::time_point now);
  // Ends every stream with UNAVAILABLE and says GOAWAY; the connection is done when all is sent.
  bool shut_down();
  // Closes the socket and ends every stream's subscription and slot. Idempotent.
  void close();
  // Something is still to be read or sent (false after a shut_down once all was said).
  bool alive();

  // The health thread: writes the status of each health Watch whose status changed.
  void health_changed();

  // Internal (h2_stream.h): a call's stream, and a complete request taken out for its handler.
  struct Stream;
  struct Call;

 private:
  friend struct Callbacks;

  // Under mu_.
  bool alive_locked();
  void flush();  // nghttp2 sends what it can; EPOLLOUT is asked for when the socket is full
  void watch_events();  // the socket's epoll interest: input unless quiet, output when wanted
  bool feed(const uint8_t* data, size_t len);  // to nghttp2; false: the peer broke the protocol
  // Quiet input (h2_quiet.cc): after the server's thread read a round of input; the publishing
  // thread's read; entering and leaving.
  void after_read_round(bool flow_control_only);
  void read_flow_control_input();
  void set_quiet(bool quiet);
  bool windows_low();
  // Response headers (with the instance id as initial metadata when given) and the body that
  // read_body takes from st.out, then st.end's trailers.
  void respond(Stream& st, const std::string& instance_id);
  // The call's status: after the body when responding, else as a trailers-only response.
  void finish(Stream& st, int code, const std::string& message);
  void end_stream_state(Stream& st);  // the stream is gone: its subscription, slot, counts
  std::vector<Call> take_calls();

  // Handlers, without mu_ (h2_calls.cc: unary and dispatch; h2_streams.cc: streams).
  void serve(Call call);
  void start_watch(Call call);
  void start_health_watch(Call call);
  void refuse_call(Stream& st, const grpc::Status& status);  // takes mu_
  // The publishing thread, through on_ready.
  void watch_ready(const std::weak_ptr<Stream>& stream);
  // Under mu_: a Watch's data source found its subscription closed.
  void watch_closed(Stream& st);
  static ssize_t read_body(nghttp2_session*, int32_t id, uint8_t* buf, size_t len,
                           uint32_t* flags, nghttp2_data_source* source, void* user);
  void fill_from_subscription(Stream& st, size_t room);

  const int fd_;
  const int epoll_fd_;
  const std::string client_;
  Shared& shared_;
  std::mutex mu_;
  nghttp2_session* session_ = nullptr;
  bool closed_ = false;
  bool want_out_ = false;  // EPOLLOUT asked for
  bool quiet_ = false;     // input read by the publishing thread (above)
  int timer_fd_ = -1;      // ends the quiet
  FrameCursor cursor_;     // what nghttp2 was given
  int other_frames_ = 0;   // frames of this read round other than WINDOW_UPDATE and PING
  Clock::time_point last_flow_round_{};  // the last round of flow-control input only
  std::map<int32_t, std::shared_ptr<Stream>> streams_;
  std::vector<int32_t> complete_;  // streams whose request ended, not yet handed to a handler
};

}  // namespace h2
}  // namespace kpleg::api
