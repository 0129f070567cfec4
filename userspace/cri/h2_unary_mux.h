// Unary gRPC calls over one HTTP/2 (h2c) connection on a unix socket, made on an event loop
// without ever blocking it: every call is a stream of the one connection, any number in flight
// at once, each with its own deadline (a RST_STREAM ends it then: a hung pod's look is one
// stream, and holds neither the loop nor the other calls). The loop is the caller's (Reactor):
// the mux asks it to watch its socket and to run a function at a time, and is used on its
// thread only. Same framing, status rules and PING hold as H2UnaryConnection (h2_unary.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "cri/h2_unary.h"
#include "cri/reactor.h"

namespace kpleg::cri {

class H2UnaryMux {
 public:
  using Clock = std::chrono::steady_clock;
  // The serialized answer, or the gRPC status (see H2UnaryConnection::call).
  using Done = std::function<void(Result<std::string>)>;

  H2UnaryMux(std::string socket_path, Reactor& reactor, H2UnaryOptions opts = {});
  ~H2UnaryMux();
  H2UnaryMux(const H2UnaryMux&) = delete;
  H2UnaryMux& operator=(const H2UnaryMux&) = delete;

  // Starts a call of `method` with the serialized `request`; `done` is called once, on the
  // loop: at once when the call cannot start (no connection), else when its answer came, its
  // connection failed, or `deadline` passed. A call that got nothing of its answer before its
  // connection closed is made once more on a new connection, so `method` must be safe to
  // repeat. Never throws.
  void call(std::string_view method, std::string_view request, Clock::time_point deadline,
            Done done);
  // Ends every call (CANCELLED) and closes the connection.
  void cancel_all();

  size_t in_flight() const { return calls_.size(); }
  uint64_t connects() const { return connects_; }

  // For nghttp2's callbacks (h2_unary_mux.cc).
  struct Call;
  void on_header(int32_t stream, std::string_view name, std::string_view value);
  void on_data(int32_t stream, const uint8_t* data, size_t len);
  void on_close(int32_t stream, uint32_t error_code);
  void on_ping(const uint8_t* payload);

 private:
  Status connect();
  // Ends the connection; its calls that got no answer are made again (once) on a new one, the
  // others fail with `why`.
  void broken(const std::string& why);
  void close_connection();
  bool submit(const std::shared_ptr<Call>& call);
  void on_ready(uint32_t events);
  // Sends what nghttp2 queued, as far as the socket takes it; the rest waits for EPOLLOUT.
  bool flush();
  void expire(const std::shared_ptr<Call>& call);
  // Hands the calls that ended to their callers (outside nghttp2's callbacks).
  void finish();

  const std::string socket_path_;
  Reactor& reactor_;
  const H2UnaryOptions opts_;
  int fd_ = -1;
  void* session_ = nullptr;  // nghttp2_session
  bool want_write_ = false;  // EPOLLOUT asked for
  std::string out_;          // bytes nghttp2 produced that the socket has not taken yet
  uint64_t connects_ = 0;
  std::map<int32_t, std::shared_ptr<Call>> calls_;  // by stream id
  std::vector<std::shared_ptr<Call>> ended_;         // to finish()
  struct HeldPing {
    std::array<uint8_t, 8> payload;
    Clock::time_point at;
  };
  std::vector<HeldPing> pings_;
  bool answer_pings_ = false;  // the next flush answers the held PINGs that are due
  bool cancelled_ = false;     // cancel_all(): every later call fails at once
};

}  // namespace kpleg::cri
