#include "cri/h2_unary_mux.h"

#include <nghttp2/nghttp2.h>
#include <sys/epoll.h>
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

struct H2UnaryMux::Call {
  std::string method;
  std::string body;  // the request, framed
  size_t body_sent = 0;
  Clock::time_point deadline;
  Done done;
  uint64_t timer = 0;
  int32_t stream = -1;
  std::string data;  // the answer, framed
  h2::ResponseStatus response;
  bool answered = false;  // anything of the answer arrived
  bool retried = false;
  std::optional<Error> failure;
  void fail(int code, std::string message) {
    if (!failure) failure = Error{code, std::move(message)};
  }
};

namespace {

using Call = H2UnaryMux::Call;
// At most this many PINGs are held back (H2UnaryOptions::ping_ack_hold).
constexpr size_t kMaxHeldPings = 8;

H2UnaryMux* mux_of(void* user) { return static_cast<H2UnaryMux*>(user); }
nghttp2_session* session_of(void* s) { return static_cast<nghttp2_session*>(s); }

int on_frame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type == NGHTTP2_PING && !(frame->hd.flags & NGHTTP2_FLAG_ACK))
    mux_of(user)->on_ping(frame->ping.opaque_data);
  return 0;
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  mux_of(user)->on_header(frame->hd.stream_id, {reinterpret_cast<const char*>(name), namelen},
                          {reinterpret_cast<const char*>(value), valuelen});
  return 0;
}

int on_data(nghttp2_session*, uint8_t, int32_t stream, const uint8_t* data, size_t len,
            void* user) {
  mux_of(user)->on_data(stream, data, len);
  return 0;
}

int on_close(nghttp2_session*, int32_t stream, uint32_t error_code, void* user) {
  mux_of(user)->on_close(stream, error_code);
  return 0;
}

ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags,
                  nghttp2_data_source* source, void*) {
  auto* c = static_cast<Call*>(source->ptr);
  return h2::send_body(c->body, c->body_sent, buf, len, flags);
}

// The answer's one message, or how the call ended otherwise.
Result<std::string> outcome(Call& c) {
  if (c.failure) return *c.failure;
  if (auto st = c.response.status(); !st) return st.error();
  return h2::take_message(c.data);
}

}  // namespace

H2UnaryMux::H2UnaryMux(std::string socket_path, Reactor& reactor, H2UnaryOptions opts)
    : socket_path_(std::move(socket_path)), reactor_(reactor), opts_(opts) {}

H2UnaryMux::~H2UnaryMux() {
  for (auto& [_, c] : calls_) reactor_.cancel(c->timer);
  calls_.clear();
  close_connection();
}

void H2UnaryMux::close_connection() {
  if (session_) nghttp2_session_del(session_of(session_));
  session_ = nullptr;
  if (fd_ >= 0) {
    reactor_.unwatch(fd_);
    close(fd_);
  }
  fd_ = -1;
  want_write_ = false;
  out_.clear();
  pings_.clear();
}

Status H2UnaryMux::connect() {
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
    close(fd_);
    fd_ = -1;
    return Error{StatusCode::UNAVAILABLE,
                 "connecting to " + socket_path_ + ": " + std::strerror(err)};
  }
  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_option* option = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&option) != 0) {
    if (cbs) nghttp2_session_callbacks_del(cbs);
    close(fd_);
    fd_ = -1;
    return Error{StatusCode::INTERNAL, "nghttp2: out of memory"};
  }
  nghttp2_session_callbacks_set_on_header_callback(cbs, cri::on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, cri::on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, cri::on_close);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame);
  nghttp2_option_set_no_auto_ping_ack(option, 1);  // held back, see ping_ack_hold
  nghttp2_session* session = nullptr;
  const int rv = nghttp2_session_client_new2(&session, cbs, this, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    close(fd_);
    fd_ = -1;
    return Error{StatusCode::INTERNAL, std::string("nghttp2: ") + nghttp2_strerror(rv)};
  }
  session_ = session;
  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, uint32_t(opts_.window_bytes)},
  };
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, opts_.window_bytes);
  ++connects_;
  reactor_.watch(fd_, EPOLLIN, [this](uint32_t events) { on_ready(events); }, "runtime calls");
  return {};
}

void H2UnaryMux::call(std::string_view method, std::string_view request, Clock::time_point deadline,
                      Done done) {
  auto c = std::make_shared<Call>();
  c->method = method;
  c->body.clear();
  h2::append_message(c->body, request);
  c->deadline = deadline;
  c->done = std::move(done);
  if (cancelled_) {
    c->fail(StatusCode::CANCELLED, "cancelled");
    ended_.push_back(c);
  } else if (submit(c)) {
    std::weak_ptr<Call> weak = c;
    c->timer = reactor_.at(
        deadline,
        [this, weak] {
          if (auto call = weak.lock()) expire(call);
        },
        "runtime call: deadline");
    flush();
  }
  finish();
}

bool H2UnaryMux::submit(const std::shared_ptr<Call>& c) {
  if (fd_ < 0) {
    if (auto st = connect(); !st) {
      c->fail(st.error().code, st.error().message);
      ended_.push_back(c);
      return false;
    }
  }
  const std::string timeout = h2::grpc_timeout(c->deadline - Clock::now());
  const nghttp2_nv headers[] = {
      h2::header(":method", "POST"),
      h2::header(":scheme", "http"),
      h2::header(":path", c->method),
      h2::header(":authority", "localhost"),
      h2::header("content-type", "application/grpc"),
      h2::header("te", "trailers"),
      h2::header("grpc-timeout", timeout),
      h2::header("user-agent", "kplegd"),
  };
  c->body_sent = 0;
  nghttp2_data_provider body{};
  body.source.ptr = c.get();
  body.read_callback = read_body;
  const int32_t id = nghttp2_submit_request(session_of(session_), nullptr, headers,
                                            std::size(headers), &body, nullptr);
  if (id < 0) {
    // The session takes no new stream (a GOAWAY, or its stream ids ran out): a new connection
    // for this call, once; the calls in flight on the old one end as they would have.
    if (!c->retried) {
      c->retried = true;
      broken("the connection takes no more streams");
      return submit(c);
    }
    c->fail(StatusCode::UNAVAILABLE, std::string("nghttp2: ") + nghttp2_strerror(id));
    ended_.push_back(c);
    return false;
  }
  c->stream = id;
  calls_[id] = c;
  answer_pings_ = !pings_.empty();
  return true;
}

void H2UnaryMux::on_ping(const uint8_t* payload) {
  HeldPing held;
  std::memcpy(held.payload.data(), payload, held.payload.size());
  held.at = Clock::now();
  pings_.push_back(held);
  if (pings_.size() > kMaxHeldPings) {
    nghttp2_submit_ping(session_of(session_), NGHTTP2_FLAG_ACK, pings_.front().payload.data());
    pings_.erase(pings_.begin());
  }
}

void H2UnaryMux::on_header(int32_t stream, std::string_view name, std::string_view value) {
  auto it = calls_.find(stream);
  if (it == calls_.end()) return;
  it->second->answered = true;
  it->second->response.on_header(name, value);
}

void H2UnaryMux::on_data(int32_t stream, const uint8_t* data, size_t len) {
  auto it = calls_.find(stream);
  if (it == calls_.end() || it->second->failure) return;
  Call& c = *it->second;
  c.answered = true;
  if (c.data.size() + len > opts_.max_message_bytes + 5) {
    c.fail(StatusCode::RESOURCE_EXHAUSTED, "the runtime's answer is over the limit of " +
                                               std::to_string(opts_.max_message_bytes) + " bytes");
    nghttp2_submit_rst_stream(session_of(session_), NGHTTP2_FLAG_NONE, stream, NGHTTP2_CANCEL);
    c.data.clear();
    return;
  }
  c.data.append(reinterpret_cast<const char*>(data), len);
}

void H2UnaryMux::on_close(int32_t stream, uint32_t error_code) {
  auto it = calls_.find(stream);
  if (it == calls_.end()) return;  // ended already (its deadline)
  it->second->response.on_close(error_code);
  ended_.push_back(std::move(it->second));
  calls_.erase(it);
}

void H2UnaryMux::expire(const std::shared_ptr<Call>& c) {
  c->timer = 0;
  auto it = calls_.find(c->stream);
  if (it == calls_.end() || it->second != c) return;
  calls_.erase(it);
  c->fail(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
  ended_.push_back(c);
  // The stream alone ends: the connection and the other calls on it go on.
  nghttp2_submit_rst_stream(session_of(session_), NGHTTP2_FLAG_NONE, c->stream, NGHTTP2_CANCEL);
  flush();
  finish();
}

void H2UnaryMux::broken(const std::string& why) {
  auto calls = std::move(calls_);
  calls_.clear();
  close_connection();
  std::vector<std::shared_ptr<Call>> again;
  for (auto& [_, c] : calls) {
    // Closed before any of its answer came: most likely the runtime closed an idle connection
    // (it restarted, say), not in answer to this call.
    if (!c->answered && !c->retried) {
      c->retried = true;
      again.push_back(c);
      continue;
    }
    c->fail(StatusCode::UNAVAILABLE, why);
    ended_.push_back(c);
  }
  for (auto& c : again) {
    c->data.clear();
    c->response = {};
    if (!submit(c)) reactor_.cancel(c->timer);
  }
  if (!again.empty() && fd_ >= 0) flush();
}

bool H2UnaryMux::flush() {
  if (fd_ < 0) return false;
  for (;;) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session_of(session_), &data);
    if (n < 0) {
      broken(std::string("nghttp2: ") + nghttp2_strerror(int(n)));
      return false;
    }
    if (n == 0) {
      // After the requests' frames, so that the server takes a request before the answer.
      if (!answer_pings_) break;
      answer_pings_ = false;
      const auto due = Clock::now() - opts_.ping_ack_hold;
      bool any = false;
      for (auto it = pings_.begin(); it != pings_.end();) {
        if (it->at > due) {
          ++it;
          continue;
        }
        nghttp2_submit_ping(session_of(session_), NGHTTP2_FLAG_ACK, it->payload.data());
        it = pings_.erase(it);
        any = true;
      }
      if (!any) break;
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
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    broken(std::string("writing to the runtime: ") + std::strerror(errno));
    return false;
  }
  out_.erase(0, off);
  const bool want = !out_.empty();
  if (want != want_write_) {
    want_write_ = want;
    reactor_.modify(fd_, want ? EPOLLIN | EPOLLOUT : EPOLLIN);
  }
  return true;
}

void H2UnaryMux::on_ready(uint32_t events) {
  if (events & EPOLLOUT) {
    if (!flush()) {
      finish();
      return;
    }
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    char buf[64 * 1024];
    for (;;) {
      const ssize_t got = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        broken(std::string("reading from the runtime: ") + std::strerror(errno));
        finish();
        return;
      }
      if (got == 0) {
        broken("the runtime closed the connection");
        finish();
        return;
      }
      const ssize_t used = nghttp2_session_mem_recv(
          session_of(session_), reinterpret_cast<const uint8_t*>(buf), size_t(got));
      if (used < 0) {
        broken(std::string("HTTP/2 from the runtime: ") + nghttp2_strerror(int(used)));
        finish();
        return;
      }
      if (size_t(got) < sizeof(buf)) break;  // drained (a full buffer may have more behind)
    }
    // What the answers call for (window updates, a RST of an answer over the limit).
    if (flush() && nghttp2_session_want_read(session_of(session_)) == 0 && calls_.empty())
      close_connection();  // a GOAWAY: the next call opens a new connection
  }
  finish();
}

void H2UnaryMux::cancel_all() {
  cancelled_ = true;
  for (auto& [_, c] : calls_) {
    c->fail(StatusCode::CANCELLED, "cancelled");
    ended_.push_back(c);
  }
  calls_.clear();
  close_connection();
  finish();
}

void H2UnaryMux::finish() {
  while (!ended_.empty()) {
    auto ended = std::move(ended_);
    ended_.clear();
    for (auto& c : ended) {
      if (c->timer != 0) reactor_.cancel(c->timer);
      c->timer = 0;
      auto done = std::move(c->done);
      if (done) done(outcome(*c));
    }
  }
}

}  // namespace kpleg::cri
