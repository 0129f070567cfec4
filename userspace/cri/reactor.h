// Reactor: what a component that runs on an event loop needs of that loop (the kernel-driven
// path's, pleg/event_loop.h): descriptors watched and functions run at a time, all on the
// loop's thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

namespace kpleg::cri {

class Reactor {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Reactor() = default;
  // Calls `on_ready` with the epoll events each time `fd` is ready for `events` (EPOLLIN,
  // EPOLLOUT, level-triggered); modify() changes them, unwatch() ends it. `what` names the
  // descriptor in the loop's count of what woke it (a string that outlives the watch). With no
  // events (modify(fd, 0)) the descriptor wakes the loop for nothing, not even for a wakeup its
  // file sends without saying for what (inotify's): it is kept out of epoll until modified again.
  virtual void watch(int fd, uint32_t events, std::function<void(uint32_t)> on_ready,
                     const char* what = "other") = 0;
  virtual void modify(int fd, uint32_t events) = 0;
  virtual void unwatch(int fd) = 0;
  // Runs `task` at `at`; cancel() drops it unless it ran. Ids are never 0. `what` names the
  // timer in the loop's count of what woke it (a string that outlives the timer).
  virtual uint64_t at(Clock::time_point at, std::function<void()> task,
                      const char* what = "timer") = 0;
  // The same for a task that can wait: it runs with the loop's first wakeup at or after `at`,
  // whatever its cause, and at `at + slack` at the latest, where it wakes the loop itself.
  virtual uint64_t at(Clock::time_point at, Clock::duration slack, std::function<void()> task,
                      const char* what) = 0;
  virtual bool cancel(uint64_t id) = 0;
};

// The slack of a hold's end (something read later on purpose, nothing waiting for it): a
// quarter of the hold. Under churn the end goes with a wakeup of the loop's for something else.
inline Reactor::Clock::duration hold_end_slack(Reactor::Clock::duration hold) {
  return std::max(hold, Reactor::Clock::duration::zero()) / 4;
}

}  // namespace kpleg::cri
