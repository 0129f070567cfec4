#include "cri/h2_unary.h"

#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <optional>

#include "cri/h2_common.h"

namespace kpleg::cri {

using grpc::StatusCode;

// One call's stream.
struct H2UnaryConnection::Stream {
  int32_t id = -1;
  std::string body;  // the request, framed
  size_t body_sent = 0;
  std::string data;  // the answer, framed
  size_t max_message = 0;
  h2::ResponseStatus response;
  bool answered = false;  // anything of the answer arrived
  std::optional<Error> failure;

  void fail(int code, std::string message) {
    if (!failure) failure = Error{code, std::move(message)};
  }
};

namespace {

using Stream = H2UnaryConnection::Stream;

using Peer = H2UnaryConnection::Peer;

// nghttp2's user data is the connection's Peer.
Stream* stream_of(void* user) { return static_cast<Peer*>(user)->current; }

// At most this many PINGs are held back (h2_unary.h, ping_ack_hold); past it the oldest is
// answered with the next frames sent.
constexpr size_t kMaxHeldPings = 8;

int on_frame(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_PING || (frame->hd.flags & NGHTTP2_FLAG_ACK)) return 0;
  auto& pings = static_cast<Peer*>(user)->pings;
  H2UnaryConnection::HeldPing held;
  std::memcpy(held.payload.data(), frame->ping.opaque_data, held.payload.size());
  held.at = std::chrono::steady_clock::now();
  pings.push_back(held);
  if (pings.size() > kMaxHeldPings) {
    nghttp2_submit_ping(session, NGHTTP2_FLAG_ACK, pings.front().payload.data());
    pings.erase(pings.begin());
  }
  return 0;
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  Stream* s = stream_of(user);
  if (!s || frame->hd.stream_id != s->id) return 0;
  s->answered = true;
  std::string_view n(reinterpret_cast<const char*>(name), namelen);
  std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  s->response.on_header(n, v);
  return 0;
}

int on_data(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
            void* user) {
  Stream* s = stream_of(user);
  if (!s || stream_id != s->id || s->failure) return 0;
  s->answered = true;
  if (s->data.size() + len > s->max_message + 5) {
    s->fail(StatusCode::RESOURCE_EXHAUSTED, "the runtime's answer is over the limit of " +
                                                std::to_string(s->max_message) + " bytes");
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    s->data.clear();
    return 0;
  }
  s->data.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int on_close(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* user) {
  Stream* s = stream_of(user);
  if (!s || stream_id != s->id) return 0;
  s->response.on_close(error_code);
  return 0;
}

ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags,
                  nghttp2_data_source*, void* user) {
  Stream* s = stream_of(user);
  return h2::send_body(s->body, s->body_sent, buf, len, flags);
}

// The answer's one message, or how the call ended otherwise.
Result<std::string> outcome(Stream& s) {
  if (s.failure) return *s.failure;
  if (auto st = s.response.status(); !st) return st.error();
  return h2::take_message(s.data);
}

int ms_until(std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return int(std::clamp<int64_t>(left.count(), 0, INT32_MAX));
}

}  // namespace

H2UnaryConnection::H2UnaryConnection(std::string socket_path, H2UnaryOptions opts)
    : socket_path_(std::move(socket_path)), opts_(opts) {}

H2UnaryConnection::~H2UnaryConnection() { close_connection(); }

void H2UnaryConnection::close_connection() {
  if (session_) nghttp2_session_del(session_);
  session_ = nullptr;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  peer_.pings.clear();
}

Status H2UnaryConnection::connect() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(addr.sun_path))
    return Error{StatusCode::INVALID_ARGUMENT, "socket path too long: " + socket_path_};
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0)
    return Error{StatusCode::UNAVAILABLE, std::string("socket: ") + std::strerror(errno)};
  // A unix socket connects at once or not at all (EAGAIN: the listener's backlog is full).
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close_connection();
    return Error{StatusCode::UNAVAILABLE,
                 "connecting to " + socket_path_ + ": " + std::strerror(err)};
  }
  nghttp2_session_callbacks* cbs = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0) {
    close_connection();
    return Error{StatusCode::INTERNAL, "nghttp2: out of memory"};
  }
  nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame);
  nghttp2_option* option = nullptr;
  if (nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(cbs);
    close_connection();
    return Error{StatusCode::INTERNAL, "nghttp2: out of memory"};
  }
  nghttp2_option_set_no_auto_ping_ack(option, 1);  // held back, see ping_ack_hold
  const int rv = nghttp2_session_client_new2(&session_, cbs, &peer_, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    session_ = nullptr;
    close_connection();
    return Error{StatusCode::INTERNAL, std::string("nghttp2: ") + nghttp2_strerror(rv)};
  }
  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, uint32_t(opts_.window_bytes)},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, opts_.window_bytes);
  ++connects_;
  return {};
}

bool H2UnaryConnection::receive(Stream* stream) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t got = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (stream)
        stream->fail(StatusCode::UNAVAILABLE,
                     std::string("reading from the runtime: ") + std::strerror(errno));
      return false;
    }
    if (got == 0) {
      if (stream && !stream->response.closed)
        stream->fail(StatusCode::UNAVAILABLE, "the runtime closed the connection");
      return false;
    }
    const ssize_t used =
        nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(buf), size_t(got));
    if (used < 0) {
      if (stream)
        stream->fail(StatusCode::INTERNAL,
                     std::string("HTTP/2 from the runtime: ") + nghttp2_strerror(int(used)));
      return false;
    }
    if (size_t(got) < sizeof(buf)) return true;  // drained (a full buffer may have more behind)
  }
}

void H2UnaryConnection::drain_idle() {
  if (fd_ < 0) return;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
  // A GOAWAY leaves the session nothing to read or write once its streams are done.
  if (!receive(nullptr) || nghttp2_session_want_read(session_) == 0) close_connection();
}

bool H2UnaryConnection::answer_held_pings() {
  answer_pings_ = false;
  const auto due = Clock::now() - opts_.ping_ack_hold;
  bool any = false;
  auto& pings = peer_.pings;
  for (auto it = pings.begin(); it != pings.end();) {
    if (it->at > due) {
      ++it;
      continue;
    }
    nghttp2_submit_ping(session_, NGHTTP2_FLAG_ACK, it->payload.data());
    it = pings.erase(it);
    any = true;
  }
  return any;
}

bool H2UnaryConnection::flush(Stream& stream, Clock::time_point deadline, CancelToken* cancel) {
  out_.clear();
  for (;;) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session_, &data);
    if (n < 0) {
      stream.fail(StatusCode::INTERNAL, std::string("nghttp2: ") + nghttp2_strerror(int(n)));
      return false;
    }
    if (n == 0) {
      // After the request's frames, so that the server takes the request before the answer.
      if (!answer_pings_ || !answer_held_pings()) break;
      continue;
    }
    out_.append(reinterpret_cast<const char*>(data), size_t(n));
  }
  size_t off = 0;
  while (off < out_.size()) {
    const ssize_t w = send(fd_, out_.data() + off, out_.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd fds[2] = {{fd_, POLLOUT, 0}, {cancel ? cancel->fd() : -1, POLLIN, 0}};
      const int r = poll(fds, 2, ms_until(deadline));
      if (r == 0) {
        stream.fail(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
        return false;
      }
      if (fds[1].revents & POLLIN) {
        stream.fail(StatusCode::CANCELLED, "cancelled");
        return false;
      }
      continue;
    }
    stream.fail(StatusCode::UNAVAILABLE,
                std::string("writing to the runtime: ") + std::strerror(errno));
    return false;
  }
  return true;
}

Result<std::string> H2UnaryConnection::call(std::string_view method, std::string_view request,
                                            Clock::time_point deadline, CancelToken* cancel) {
  bool retry = false;
  auto r = attempt(method, request, deadline, cancel, &retry);
  if (retry) r = attempt(method, request, deadline, cancel, &retry);
  return r;
}

Result<std::string> H2UnaryConnection::attempt(std::string_view method, std::string_view request,
                                               Clock::time_point deadline, CancelToken* cancel,
                                               bool* retry) {
  *retry = false;
  if (cancel && cancel->cancelled()) return Error{StatusCode::CANCELLED, "cancelled"};
  drain_idle();
  const bool reused = fd_ >= 0;
  if (!reused) {
    if (auto st = connect(); !st) return st.error();
  }

  Stream s;
  s.max_message = opts_.max_message_bytes;
  s.body.clear();
  h2::append_message(s.body, request);
  const std::string timeout = h2::grpc_timeout(deadline - Clock::now());
  const nghttp2_nv headers[] = {
      h2::header(":method", "POST"),
      h2::header(":scheme", "http"),
      h2::header(":path", method),
      h2::header(":authority", "localhost"),
      h2::header("content-type", "application/grpc"),
      h2::header("te", "trailers"),
      h2::header("grpc-timeout", timeout),
      h2::header("user-agent", "kplegd"),
  };
  peer_.current = &s;
  struct Reset {
    Stream*& current;
    ~Reset() { current = nullptr; }
  } reset{peer_.current};
  nghttp2_data_provider body{};
  body.read_callback = read_body;
  s.id = nghttp2_submit_request(session_, nullptr, headers, std::size(headers), &body, nullptr);
  if (s.id < 0) {
    // The session takes no new stream (a GOAWAY, or its stream ids ran out): a new connection.
    close_connection();
    *retry = reused;
    return Error{StatusCode::UNAVAILABLE, std::string("nghttp2: ") + nghttp2_strerror(s.id)};
  }
  answer_pings_ = !peer_.pings.empty();

  bool broken = false;
  while (!s.response.closed && !s.failure) {
    if (!flush(s, deadline, cancel)) {
      broken = true;
      break;
    }
    pollfd fds[2] = {{fd_, POLLIN, 0}, {cancel ? cancel->fd() : -1, POLLIN, 0}};
    const int left = ms_until(deadline);
    const int n = left > 0 ? poll(fds, 2, left) : 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      s.fail(StatusCode::INTERNAL, std::string("poll: ") + std::strerror(errno));
      break;
    }
    if (n == 0) {
      s.fail(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
      break;
    }
    if (fds[1].revents & POLLIN) {
      s.fail(StatusCode::CANCELLED, "cancelled");
      break;
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    if (!receive(&s)) {
      broken = true;
      break;
    }
  }
  // A stream left open (deadline, cancel) or a failed connection: start afresh next time. So
  // does a session that will take no more streams (after a GOAWAY).
  if (broken || !s.response.closed || s.failure || nghttp2_session_want_read(session_) == 0) {
    close_connection();
    // The connection was closed before the call got any answer: the runtime closed it while
    // it was idle (it restarted, say), not in answer to this call.
    if (broken && reused && !s.answered && s.failure &&
        s.failure->code == int(StatusCode::UNAVAILABLE))
      *retry = true;
  }
  if (!s.response.closed && !s.failure)
    s.fail(StatusCode::UNAVAILABLE, "the runtime closed the connection");
  return outcome(s);
}

H2UnaryPool::H2UnaryPool(std::string socket_path, size_t max_idle, H2UnaryOptions opts)
    : socket_path_(std::move(socket_path)), max_idle_(max_idle), opts_(opts) {}

Result<std::string> H2UnaryPool::call(std::string_view method, std::string_view request,
                                      H2UnaryConnection::Clock::time_point deadline,
                                      CancelToken* cancel) {
  std::unique_ptr<H2UnaryConnection> conn;
  {
    std::lock_guard lk(mu_);
    if (!idle_.empty()) {
      conn = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!conn) conn = std::make_unique<H2UnaryConnection>(socket_path_, opts_);
  const uint64_t before = conn->connects();
  auto r = conn->call(method, request, deadline, cancel);
  std::lock_guard lk(mu_);
  connects_ += conn->connects() - before;
  if (conn->open() && idle_.size() < max_idle_) idle_.push_back(std::move(conn));
  return r;
}

uint64_t H2UnaryPool::connects() const {
  std::lock_guard lk(mu_);
  return connects_;
}

}  // namespace kpleg::cri
