// A consumer connection's HTTP/2 through nghttp2: reading and sending, a request's headers and
// body as they arrive, the responses and their trailers. The calls themselves are in h2_calls.cc
// and h2_streams.cc.
#include "api/h2_connection.h"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include <spdlog/spdlog.h>

#include "api/h2_stream.h"
#include "api/limits.h"

namespace kpleg::api::h2 {
namespace {

using Stream = Connection::Stream;

// grpc-message's escaping (the gRPC HTTP/2 protocol): printable ASCII but '%' as it is, the rest
// as %XX.
std::string percent_encode(std::string_view in) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : in) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

constexpr int32_t kMaxConcurrentStreams = 100;
[[maybe_unused]] constexpr uint64_t kResetBurst = 100'000;
[[maybe_unused]] constexpr uint64_t kResetsPerSecond = 10'000;

}  // namespace

// nghttp2's callbacks, all run under the connection's lock (inside mem_recv or send).
struct Callbacks {
  static Connection& self(void* user) { return *static_cast<Connection*>(user); }

  static ssize_t send(nghttp2_session*, const uint8_t* data, size_t len, int, void* user) {
    for (;;) {
      const ssize_t n = ::send(self(user).fd_, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return NGHTTP2_ERR_WOULDBLOCK;
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
  }

  static int begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
      self(user).streams_.emplace(frame->hd.stream_id,
                                  std::make_shared<Stream>(frame->hd.stream_id));
    return 0;
  }

  static int header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                    size_t name_len, const uint8_t* value, size_t value_len, uint8_t, void* user) {
    auto it = self(user).streams_.find(frame->hd.stream_id);
    if (it == self(user).streams_.end() || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    Stream& st = *it->second;
    const std::string_view n(reinterpret_cast<const char*>(name), name_len);
    const std::string_view v(reinterpret_cast<const char*>(value), value_len);
    if (n == ":path") st.path.assign(v);
    else if (n == ":method") st.post = v == "POST";
    else if (n == "grpc-encoding") st.encoding.assign(v);
    else if (n == "content-type")
      st.grpc_content = v == "application/grpc" || v.starts_with("application/grpc+") ||
                        v.starts_with("application/grpc;");
    return 0;
  }

  static int data_chunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                        void* user) {
    auto it = self(user).streams_.find(id);
    if (it == self(user).streams_.end()) return 0;
    Stream& st = *it->second;
    st.body_bytes += len;
    // A request is a few filters: beyond the bound the bytes are counted, not kept.
    if (st.body.size() + len <= 5 + size_t(kMaxRequestBytes))
      st.body.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }

  static int frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type != NGHTTP2_WINDOW_UPDATE && frame->hd.type != NGHTTP2_PING)
      ++self(user).other_frames_;
    if (frame->hd.type == NGHTTP2_GOAWAY)
      spdlog::debug("api: connection from {}: the client said GOAWAY ({})", self(user).client_,
                    nghttp2_http2_strerror(frame->goaway.error_code));
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 &&
        self(user).streams_.contains(frame->hd.stream_id))
      self(user).complete_.push_back(frame->hd.stream_id);
    return 0;
  }

  static int frame_sent(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR)
      spdlog::debug("api: connection from {}: GOAWAY ({})", self(user).client_,
                    nghttp2_http2_strerror(frame->goaway.error_code));
    return 0;
  }

  static int not_sent(nghttp2_session*, const nghttp2_frame* frame, int lib_error, void* user) {
    spdlog::debug("api: connection from {}: a frame (type {}) of stream {} not sent: {}",
                  self(user).client_, int(frame->hd.type), frame->hd.stream_id,
                  nghttp2_strerror(lib_error));
    return 0;
  }

  static int error(nghttp2_session*, int, const char* msg, size_t len, void* user) {
    spdlog::debug("api: connection from {}: {}", self(user).client_, std::string_view(msg, len));
    return 0;
  }

  static int stream_close(nghttp2_session*, int32_t id, uint32_t, void* user) {
    auto it = self(user).streams_.find(id);
    if (it == self(user).streams_.end()) return 0;
    self(user).end_stream_state(*it->second);
    self(user).streams_.erase(it);
    return 0;
  }
};

Connection::Connection(int fd, int epoll_fd, std::string client, Shared& shared)
    : fd_(fd), epoll_fd_(epoll_fd), client_(std::move(client)), shared_(shared) {}

Connection::~Connection() { close(); }

bool Connection::open() {
  std::lock_guard l(mu_);
  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_send_callback(cbs, Callbacks::send);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, Callbacks::begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, Callbacks::header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, Callbacks::data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, Callbacks::frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, Callbacks::stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, Callbacks::frame_sent);
  nghttp2_session_callbacks_set_error_callback2(cbs, Callbacks::error);
  nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, Callbacks::not_sent);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
#ifdef KPLEG_HAVE_NGHTTP2_RESET_RATE_LIMIT
  // nghttp2 answers more than 1000 stream resets at 33 a second with GOAWAY, against "rapid
  // reset" floods. A consumer cancelling its Watches resets streams too (kplegctl, a relay that
  // re-subscribes, the API's fuzzer thousands a second on one connection), only the socket's
  // owner (or group) can connect, and grpc++ had no such limit here: it stays, for a flood only.
  nghttp2_option_set_stream_reset_rate_limit(opt, kResetBurst, kResetsPerSecond);
#endif
  const int rv = nghttp2_session_server_new2(&session_, cbs, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) return false;
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16 * 1024}};
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (timer_fd_ < 0) return false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = timer_key(fd_);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev) != 0) return false;
  flush();
  return !closed_;
}

bool Connection::on_readable() {
  std::vector<Call> calls;
  {
    std::lock_guard l(mu_);
    if (closed_) return false;
    uint8_t buf[16 * 1024];
    other_frames_ = 0;
    // Level-triggered: a flood is read in rounds, between which the other connections get
    // their turn.
    for (int round = 0; round < 16; ++round) {
      const ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (!feed(buf, size_t(n))) {
          flush();  // its GOAWAY, if it queued one
          return false;
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      spdlog::debug("api: connection from {} {}", client_, n == 0 ? "closed" : std::strerror(errno));
      return false;  // the peer closed the connection, or it broke
    }
    calls = take_calls();
    flush();
    after_read_round(other_frames_ == 0);
  }
  for (auto& c : calls) serve(std::move(c));
  return alive();
}

bool Connection::feed(const uint8_t* data, size_t len) {
  cursor_.feed(data, len);
  if (const ssize_t rv = nghttp2_session_mem_recv(session_, data, len); rv < 0) {
    spdlog::debug("api: connection from {}: {}", client_, nghttp2_strerror(int(rv)));
    return false;
  }
  return true;
}

bool Connection::on_writable() {
  std::lock_guard l(mu_);
  flush();
  return alive_locked();
}

bool Connection::alive() {
  std::lock_guard l(mu_);
  return alive_locked();
}

bool Connection::alive_locked() {
  return !closed_ && (nghttp2_session_want_read(session_) || nghttp2_session_want_write(session_));
}

void Connection::flush() {
  if (closed_ || session_ == nullptr) return;
  if (const int rv = nghttp2_session_send(session_); rv != 0) {
    spdlog::debug("api: connection from {}: {}", client_, nghttp2_strerror(rv));
    // The peer is gone or broke the protocol: the server's thread sees the socket end and
    // closes the connection.
    shutdown(fd_, SHUT_RDWR);
    return;
  }
  const bool want = nghttp2_session_want_write(session_) != 0;
  if (want != want_out_) {
    want_out_ = want;
    watch_events();
  }
}

void Connection::watch_events() {
  epoll_event ev{};
  // The peer's hang-up wakes the server's thread, quiet or not: EPOLLRDHUP (asked for here) when
  // it shuts its side, EPOLLHUP (always reported) when both sides are shut.
  ev.events = EPOLLRDHUP | (quiet_ ? 0u : EPOLLIN) | (want_out_ ? EPOLLOUT : 0u);
  ev.data.fd = fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
}

void Connection::respond(Stream& st, const std::string& instance_id) {
  std::vector<nghttp2_nv> h = {header(":status", "200"),
                               header("content-type", "application/grpc")};
  if (!instance_id.empty()) h.push_back(header("kpleg-instance-id", instance_id));
  nghttp2_data_provider body{};
  body.source.ptr = &st;
  body.read_callback = read_body;
  st.responding = true;
  nghttp2_submit_response(session_, st.id, h.data(), h.size(), &body);
}

void Connection::finish(Stream& st, int code, const std::string& message) {
  if (st.gone || st.end) return;
  st.end = {code, message};
  if (st.responding) {
    nghttp2_session_resume_data(session_, st.id);
    return;
  }
  // Trailers-only: the status in the response's only HEADERS frame.
  const std::string code_text = std::to_string(code);
  const std::string text = percent_encode(message);
  const nghttp2_nv h[] = {header(":status", "200"), header("content-type", "application/grpc"),
                          header("grpc-status", code_text), header("grpc-message", text)};
  nghttp2_submit_response(session_, st.id, h, message.empty() ? 3 : 4, nullptr);
}

ssize_t Connection::read_body(nghttp2_session* session, int32_t id, uint8_t* buf, size_t len,
                              uint32_t* flags, nghttp2_data_source* source, void* user) {
  auto& self = *static_cast<Connection*>(user);
  auto& st = *static_cast<Stream*>(source->ptr);
  if (st.out_taken == st.out.size() && st.kind == Stream::Kind::kWatch && !st.end)
    self.fill_from_subscription(st, len);
  const size_t n = std::min(len, st.out.size() - st.out_taken);
  std::memcpy(buf, st.out.data() + st.out_taken, n);
  st.out_taken += n;
  if (st.out_taken == st.out.size()) {
    st.out.clear();
    st.out_taken = 0;
    if (st.end) {
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const std::string code = std::to_string(st.end->first);
      const std::string text = percent_encode(st.end->second);
      const nghttp2_nv t[] = {header("grpc-status", code), header("grpc-message", text)};
      nghttp2_submit_trailer(session, id, t, st.end->second.empty() ? 1 : 2);
      return ssize_t(n);
    }
  }
  return n > 0 ? ssize_t(n) : NGHTTP2_ERR_DEFERRED;
}

void Connection::end_stream_state(Stream& st) {
  if (st.gone) return;
  st.gone = true;
  if (st.kind == Stream::Kind::kWatch) shared_.open_watches.fetch_sub(1);
  st.sub.cancel();
  st.slot.reset();
  st.reap_at.reset();
}

void Connection::close() {
  std::lock_guard l(mu_);
  if (closed_) return;
  closed_ = true;
  for (auto& [id, st] : streams_) end_stream_state(*st);
  streams_.clear();
  if (session_) nghttp2_session_del(session_);
  session_ = nullptr;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  ::close(fd_);
  if (timer_fd_ >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, timer_fd_, nullptr);
    ::close(timer_fd_);
    timer_fd_ = -1;
  }
}

}  // namespace kpleg::api::h2
