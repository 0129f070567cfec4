#include "pleg/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/thread_name.h"
#include "pleg/timerfd.h"

namespace kpleg::pleg {
namespace {

void write_one(int fd) {
  const uint64_t one = 1;
  while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void drain(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

}  // namespace

EventLoop::EventLoop() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  message_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || timer_fd_ < 0 || message_fd_ < 0) {
    const int err = errno;
    for (int fd : {epoll_fd_, timer_fd_, message_fd_})
      if (fd >= 0) close(fd);
    throw std::runtime_error(std::string("event loop: ") + std::strerror(err));
  }
  for (int fd : {timer_fd_, message_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

EventLoop::~EventLoop() {
  stop();
  for (int fd : {epoll_fd_, timer_fd_, message_fd_}) close(fd);
}

void EventLoop::start(const std::string& name) {
  thread_ = named_thread(name, [this] {
    // Before anything runs on it: a message that asks in_loop() must be told yes.
    thread_id_.store(std::this_thread::get_id());
    run();
  });
  thread_id_.store(thread_.get_id());
}

void EventLoop::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (!thread_.joinable()) stopped_ = true;
  }
  write_one(message_fd_);
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  stopped_ = true;
  thread_id_.store(std::thread::id{});
}

bool EventLoop::enqueue(Task task) {
  std::lock_guard lk(mu_);
  if (stopped_ || (stopping_ && !thread_.joinable())) return false;
  messages_.push_back(std::move(task));
  if (!signalled_) {
    signalled_ = true;
    write_one(message_fd_);
  }
  return true;
}

void EventLoop::post(Task task) { (void)enqueue(std::move(task)); }

EventLoop::TimerId EventLoop::at(Clock::time_point at, Task task, const char* what) {
  return this->at(at, Clock::duration::zero(), std::move(task), what);
}

EventLoop::TimerId EventLoop::at(Clock::time_point at, Clock::duration slack, Task task,
                                 const char* what) {
  const TimerId id = ++last_timer_;
  const auto latest = at + std::max(slack, Clock::duration::zero());
  timers_.emplace(std::pair{at, id}, Timer{std::move(task), what, latest});
  latest_.emplace(latest, id);
  timer_at_.emplace(id, at);
  if (!in_batch_ && (latest < armed_at_ || armed_at_ <= Clock::now())) arm();
  return id;
}

bool EventLoop::cancel(TimerId id) {
  auto it = timer_at_.find(id);
  if (it == timer_at_.end()) return false;
  auto node = timers_.extract({it->second, id});
  latest_.erase({node.mapped().latest, id});
  timer_at_.erase(it);
  // A timer set for this one alone would wake the loop for nothing.
  if (!in_batch_ && armed_at_ != Clock::time_point::max() &&
      (latest_.empty() || latest_.begin()->first > armed_at_))
    arm();
  return true;
}

void EventLoop::arm() {
  const auto next = latest_.empty() ? Clock::time_point::max() : latest_.begin()->first;
  if (next == armed_at_) return;
  armed_at_ = next;
  set_timerfd(timer_fd_, next);
}

void EventLoop::watch(int fd, uint32_t events, std::function<void(uint32_t)> on_ready,
                      const char* what) {
  auto it = watched_.find(fd);
  const bool in_set = it != watched_.end() && it->second.in_set;  // watched again: replaced
  watched_[fd] = Watched{std::move(on_ready), what, in_set};
  modify(fd, events);
}

void EventLoop::modify(int fd, uint32_t events) {
  auto it = watched_.find(fd);
  if (it == watched_.end()) return;
  bool& in_set = it->second.in_set;
  if (events == 0) {
    if (in_set) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    in_set = false;
    return;
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, in_set ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
  in_set = true;
}

void EventLoop::unwatch(int fd) {
  auto it = watched_.find(fd);
  if (it == watched_.end()) return;
  if (it->second.in_set) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  watched_.erase(it);
}

void EventLoop::run_messages() {
  std::deque<Task> batch;
  {
    std::lock_guard lk(mu_);
    batch.swap(messages_);
    signalled_ = false;
  }
  for (auto& t : batch) t();
}

const char* EventLoop::run_timers() {
  const auto now = Clock::now();
  const char* woke = nullptr;
  auto woke_latest = Clock::time_point::max();
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_at_.erase(node.key().second);
    latest_.erase({node.mapped().latest, node.key().second});
    // The timerfd was set for the one that could wait least.
    if (node.mapped().latest < woke_latest) {
      woke_latest = node.mapped().latest;
      woke = node.mapped().what;
    }
    node.mapped().task();
  }
  return woke;
}

void EventLoop::count(const char* what) {
  auto it = woken_by_.find(std::string_view(what));
  if (it == woken_by_.end()) it = woken_by_.emplace(what, 0).first;
  ++it->second;
}

void EventLoop::run() {
  epoll_event out[16];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, out, 16, -1);
    if (n < 0) continue;  // EINTR
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    in_batch_ = true;
    bool messages = false, timers = false;
    if (first_at_wakeup_) first_at_wakeup_();
    for (int i = 0; i < n; ++i) {
      const int fd = out[i].data.fd;
      if (fd == message_fd_) {
        drain(fd);
        messages = true;
        count("message");
      } else if (fd == timer_fd_) {
        drain(fd);
        timers = true;
      } else if (auto it = watched_.find(fd); it != watched_.end()) {
        count(it->second.what);
        auto on_ready = it->second.on_ready;  // may unwatch itself
        on_ready(out[i].events);
      }
    }
    if (messages) {
      bool stop;
      {
        std::lock_guard lk(mu_);
        stop = stopping_;
      }
      run_messages();
      if (stop) {
        // What was posted before stop() has run; what comes later finds stopped_.
        std::lock_guard lk(mu_);
        stopped_ = true;
      }
      if (stop) {
        run_messages();
        timers_.clear();
        latest_.clear();
        timer_at_.clear();
        in_batch_ = false;
        return;
      }
    }
    // Every wakeup runs what is due: a timer with slack that another cause woke the loop for
    // in time costs no wakeup of its own (and is not counted as what woke the loop).
    const char* woke = run_timers();
    if (timers) {
      count(woke != nullptr ? woke : "timer: nothing due");
      armed_at_ = Clock::time_point::max();  // it fired: the timerfd is disarmed
    }
    in_batch_ = false;
    arm();  // the earliest timer now, if it changed
  }
}

}  // namespace kpleg::pleg
