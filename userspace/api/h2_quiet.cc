// A connection's quiet input (h2_connection.h): while a Watch flows, the consumer's
// flow-control frames are read by the publishing thread before it writes, and the server's
// thread is not woken for them.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "api/h2_connection.h"
#include "api/h2_stream.h"
#include "pleg/timerfd.h"

namespace kpleg::api::h2 {
namespace {

// Below this a window is read at once (by the server's thread), so that a consumer reading
// again gets its events without waiting for the quiet to end.
constexpr int32_t kLowWindow = 16 * 1024;

}  // namespace

void Connection::after_read_round(bool flow_control_only) {
  const auto now = Clock::now();
  bool flowing = false;
  for (auto& [id, st] : streams_)
    if (st->kind == Stream::Kind::kWatch && !st->gone && !st->end) flowing = true;
  // Two rounds of only flow-control frames within the span: the consumer is reading a stream
  // of events, and the next round is likely the same (one round alone stays served here, so a
  // rare event costs no timer besides).
  const bool again = flow_control_only && last_flow_round_ != Clock::time_point{} &&
                     now - last_flow_round_ < kQuietSpan;
  last_flow_round_ = flow_control_only ? now : Clock::time_point{};
  set_quiet(again && flowing && cursor_.at_boundary() && !shared_.stopping.load() &&
            !windows_low());
}

void Connection::read_flow_control_input() {
  if (!quiet_) return;
  uint8_t buf[4096];
  const ssize_t n = recv(fd_, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) {
    const size_t take = whole_flow_control_frames(buf, size_t(n));
    if (take > 0 && (recv(fd_, buf, take, MSG_DONTWAIT) != ssize_t(take) || !feed(buf, take))) {
      set_quiet(false);  // the server's thread finds out what broke
      return;
    }
    if (take < size_t(n)) {
      set_quiet(false);  // something else waits: the server's thread reads it
      return;
    }
  }
  // Nothing more (or the peer's hang-up, which wakes the server's thread): what comes next is
  // read at the next event or when the span ends.
  pleg::set_timerfd(timer_fd_, Clock::now() + kQuietSpan);
}

void Connection::set_quiet(bool quiet) {
  if (quiet == quiet_ || closed_) return;
  quiet_ = quiet;
  watch_events();
  pleg::set_timerfd(timer_fd_, quiet ? Clock::now() + kQuietSpan : Clock::time_point::max());
}

bool Connection::windows_low() {
  if (nghttp2_session_get_remote_window_size(session_) < kLowWindow) return true;
  for (auto& [id, st] : streams_)
    if (st->kind == Stream::Kind::kWatch && !st->gone &&
        nghttp2_session_get_stream_remote_window_size(session_, id) < kLowWindow)
      return true;
  return false;
}

bool Connection::on_quiet_timer() {
  std::lock_guard l(mu_);
  if (closed_) return false;
  uint64_t expirations;
  [[maybe_unused]] ssize_t r = read(timer_fd_, &expirations, sizeof expirations);
  set_quiet(false);
  last_flow_round_ = {};  // the events stopped: the next round alone does not quiet it again
  return alive_locked();
}

}  // namespace kpleg::api::h2
