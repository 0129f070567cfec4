#include "cri/h2_stream.h"
#include "cri/h2_common.h"

#include <grpcpp/support/status_code_enum.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <optional>

namespace kpleg::cri {
namespace {

using grpc::StatusCode;
using h2::header;

struct Call {
  int fd = -1;
  nghttp2_session* session = nullptr;
  int32_t stream_id = -1;
  std::string body;  // the request, framed
  size_t body_sent = 0;
  std::string pending;  // received bytes of messages not complete yet
  h2::ResponseStatus response;
  std::optional<Error> failure;  // the first local reason to end the call
  size_t max_message = 0;
  const std::function<bool(std::string_view)>* on_message = nullptr;

  void fail(int code, std::string message) {
    if (!failure) failure = Error{code, std::move(message)};
  }
};

ssize_t on_send(nghttp2_session*, const uint8_t* data, size_t len, int, void* user) {
  auto* c = static_cast<Call*>(user);
  ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return n;
  if (errno == EAGAIN || errno == EWOULDBLOCK) return NGHTTP2_ERR_WOULDBLOCK;
  if (errno == EINTR) return NGHTTP2_ERR_WOULDBLOCK;
  c->fail(StatusCode::UNAVAILABLE, std::string("writing to the runtime: ") + std::strerror(errno));
  return NGHTTP2_ERR_CALLBACK_FAILURE;
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  auto* c = static_cast<Call*>(user);
  if (frame->hd.stream_id != c->stream_id) return 0;
  std::string_view n(reinterpret_cast<const char*>(name), namelen);
  std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  c->response.on_header(n, v);
  return 0;
}

int on_data(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
            void* user) {
  auto* c = static_cast<Call*>(user);
  if (stream_id != c->stream_id || c->failure) return 0;
  c->pending.append(reinterpret_cast<const char*>(data), len);
  // gRPC's framing: a compressed flag (1 byte), the length (4 bytes, big-endian), the message.
  size_t at = 0;
  while (c->pending.size() - at >= 5) {
    const auto* p = reinterpret_cast<const uint8_t*>(c->pending.data() + at);
    const uint32_t size = (uint32_t(p[1]) << 24) | (uint32_t(p[2]) << 16) |
                          (uint32_t(p[3]) << 8) | uint32_t(p[4]);
    if (p[0] != 0) {
      c->fail(StatusCode::INTERNAL, "the runtime sent a compressed message, which was not asked for");
    } else if (size > c->max_message) {
      c->fail(StatusCode::RESOURCE_EXHAUSTED,
              "the runtime sent a message of " + std::to_string(size) + " bytes, over the limit of " +
                  std::to_string(c->max_message));
    }
    if (c->failure) {
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, c->stream_id, NGHTTP2_CANCEL);
      c->pending.clear();
      return 0;
    }
    if (c->pending.size() - at - 5 < size) break;
    if (!(*c->on_message)(std::string_view(c->pending.data() + at + 5, size))) {
      c->fail(StatusCode::INTERNAL, "the runtime sent a message that does not parse");
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, c->stream_id, NGHTTP2_CANCEL);
      c->pending.clear();
      return 0;
    }
    at += 5 + size;
  }
  c->pending.erase(0, at);
  return 0;
}

int on_close(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* user) {
  auto* c = static_cast<Call*>(user);
  if (stream_id != c->stream_id) return 0;
  c->response.on_close(error_code);
  return 0;
}

ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags,
                  nghttp2_data_source*, void* user) {
  auto* c = static_cast<Call*>(user);
  const size_t n = std::min(len, c->body.size() - c->body_sent);
  std::memcpy(buf, c->body.data() + c->body_sent, n);
  c->body_sent += n;
  if (c->body_sent == c->body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}


// How the call ended, once the loop is over.
Status outcome(const Call& c) {
  if (c.failure) return *c.failure;
  return c.response.status();
}

struct SessionGuard {
  Call& c;
  ~SessionGuard() {
    if (c.session) nghttp2_session_del(c.session);
    if (c.fd >= 0) close(c.fd);
  }
};

// Connects to `socket_path` and submits the call: the start both ways of reading share.
Status open_stream(Call& c, const std::string& socket_path, std::string_view method,
                   std::string_view request, const H2StreamOptions& opts) {
  c.max_message = opts.max_message_bytes;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path))
    return Error{StatusCode::INVALID_ARGUMENT, "socket path too long: " + socket_path};
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  c.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c.fd < 0) return Error{StatusCode::UNAVAILABLE, std::string("socket: ") + std::strerror(errno)};
  if (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Error{StatusCode::UNAVAILABLE,
                 "connecting to " + socket_path + ": " + std::strerror(errno)};
  }

  nghttp2_session_callbacks* cbs = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0) return Error{StatusCode::INTERNAL, "nghttp2: out of memory"};
  nghttp2_session_callbacks_set_send_callback(cbs, on_send);
  nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
  const int rv = nghttp2_session_client_new(&c.session, cbs, &c);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) return Error{StatusCode::INTERNAL, std::string("nghttp2: ") + nghttp2_strerror(rv)};

  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, uint32_t(opts.window_bytes)},
  };
  nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, settings, 2);
  nghttp2_session_set_local_window_size(c.session, NGHTTP2_FLAG_NONE, 0, opts.window_bytes);

  c.body.clear();
  h2::append_message(c.body, request);
  const nghttp2_nv headers[] = {
      header(":method", "POST"),
      header(":scheme", "http"),
      header(":path", method),
      header(":authority", "localhost"),
      header("content-type", "application/grpc"),
      header("te", "trailers"),
      header("user-agent", "kplegd"),
  };
  nghttp2_data_provider body{};
  body.read_callback = read_body;
  c.stream_id = nghttp2_submit_request(c.session, nullptr, headers, std::size(headers), &body, &c);
  if (c.stream_id < 0) {
    return Error{StatusCode::INTERNAL, std::string("nghttp2: ") + nghttp2_strerror(c.stream_id)};
  }
  return {};
}

// Everything the socket has, in as few reads as it takes, into nghttp2 (and the messages it
// completes to on_message).
void read_available(Call& c) {
  char buf[64 * 1024];
  while (!c.response.closed && !c.failure) {
    ssize_t got = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      c.fail(StatusCode::UNAVAILABLE, std::string("reading from the runtime: ") + std::strerror(errno));
      break;
    }
    if (got == 0) {
      if (!c.response.closed) c.fail(StatusCode::UNAVAILABLE, "the runtime closed the connection");
      break;
    }
    ssize_t used = nghttp2_session_mem_recv(c.session, reinterpret_cast<const uint8_t*>(buf), size_t(got));
    if (used < 0) {
      c.fail(StatusCode::INTERNAL,
             std::string("HTTP/2 from the runtime: ") + nghttp2_strerror(int(used)));
      break;
    }
    if (size_t(got) < sizeof(buf)) break;  // drained (a full buffer may have more behind it)
  }
}

// What nghttp2 has to send (the request, window updates, PING answers), as far as the socket
// takes it; false (and a failure) when it cannot.
bool send_pending(Call& c) {
  if (int r = nghttp2_session_send(c.session); r != 0) {
    c.fail(StatusCode::UNAVAILABLE, std::string("sending to the runtime: ") + nghttp2_strerror(r));
    return false;
  }
  return true;
}

}  // namespace

Status h2_server_stream(const std::string& socket_path, std::string_view method,
                        std::string_view request, CancelToken& cancel,
                        const std::function<bool(std::string_view message)>& on_message,
                        const H2StreamOptions& opts) {
  Call c;
  SessionGuard guard{c};
  c.on_message = &on_message;
  if (auto st = open_stream(c, socket_path, method, request, opts); !st) return st;

  while (!c.response.closed && !c.failure) {
    if (cancel.cancelled()) return Error{StatusCode::CANCELLED, "cancelled"};
    if (!send_pending(c)) break;
    pollfd fds[2] = {{c.fd, short(POLLIN | (nghttp2_session_want_write(c.session) ? POLLOUT : 0)), 0},
                     {cancel.fd(), POLLIN, 0}};
    int n = poll(fds, cancel.fd() >= 0 ? 2 : 1, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      c.fail(StatusCode::INTERNAL, std::string("poll: ") + std::strerror(errno));
      break;
    }
    if (cancel.fd() >= 0 && (fds[1].revents & POLLIN)) return Error{StatusCode::CANCELLED, "cancelled"};
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    read_available(c);
  }
  return outcome(c);
}

struct H2StreamReader::State {
  Call call;
  std::function<bool(std::string_view)> on_message;
  ~State() {
    if (call.session) nghttp2_session_del(call.session);
    if (call.fd >= 0) close(call.fd);
  }
};

H2StreamReader::H2StreamReader(Reactor& reactor) : reactor_(reactor) {}

H2StreamReader::~H2StreamReader() { end(); }

void H2StreamReader::end() {
  if (hold_timer_ != 0) reactor_.cancel(hold_timer_);
  hold_timer_ = 0;
  held_ = false;
  if (state_ && state_->call.fd >= 0) reactor_.unwatch(state_->call.fd);
  state_.reset();
}

void H2StreamReader::hold(std::chrono::steady_clock::time_point until) {
  if (!state_ || held_) return;
  held_ = true;
  watch_events();
  // The hold's end can wait for the loop's next wakeup: what is held is not waited for (a
  // signal that waits for an event ends the hold at once).
  hold_timer_ = reactor_.at(
      until, hold_end_slack(until - std::chrono::steady_clock::now()),
      [this] {
        hold_timer_ = 0;
        resume();
      },
      "runtime events: hold's end");
}

void H2StreamReader::resume() {
  if (!held_) return;
  held_ = false;
  if (hold_timer_ != 0) reactor_.cancel(hold_timer_);
  hold_timer_ = 0;
  // Level-triggered: what came meanwhile is read at the loop's next turn, without a sleep.
  if (state_) watch_events();
}

void H2StreamReader::read_queued() {
  if (state_) on_ready(EPOLLIN);
}

void H2StreamReader::watch_events() {
  reactor_.modify(state_->call.fd, (held_ ? 0u : uint32_t(EPOLLIN)) | (want_write_ ? uint32_t(EPOLLOUT) : 0u));
}

void H2StreamReader::start(const std::string& socket_path, std::string_view method,
                           std::string_view request,
                           std::function<bool(std::string_view message)> on_message,
                           std::function<void(Status)> on_end, const H2StreamOptions& opts) {
  end();
  state_ = std::make_unique<State>();
  state_->on_message = std::move(on_message);
  state_->call.on_message = &state_->on_message;
  on_end_ = std::move(on_end);
  if (auto st = open_stream(state_->call, socket_path, method, request, opts); !st) {
    state_.reset();
    auto on_end_now = std::move(on_end_);
    on_end_now(st);
    return;
  }
  reactor_.watch(
      state_->call.fd, EPOLLIN, [this](uint32_t events) { on_ready(events); }, "runtime events");
  pump();
}

void H2StreamReader::on_ready(uint32_t events) {
  if (!state_) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_available(state_->call);
  pump();
}

void H2StreamReader::pump() {
  Call& c = state_->call;
  if (!c.response.closed && !c.failure && send_pending(c)) {
    const bool want = nghttp2_session_want_write(c.session) != 0;
    if (want != want_write_) {
      want_write_ = want;
      watch_events();
    }
    return;
  }
  const Status st = outcome(c);
  end();
  want_write_ = false;
  auto on_end = std::move(on_end_);
  if (on_end) on_end(st);
}

}  // namespace kpleg::cri
