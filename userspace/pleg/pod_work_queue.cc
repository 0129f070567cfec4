#include "pleg/pod_work_queue.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/thread_name.h"

namespace kpleg::pleg {
namespace {

void drain(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

void signal(int fd) {
  const uint64_t one = 1;
  while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

}  // namespace

PodWorkQueue::PodWorkQueue(size_t workers) {
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  ready_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Each worker's epoll descriptor is made here, where a failure can be reported: a worker
  // without one would spin.
  std::vector<int> eps;
  auto fail = [&](const char* what) {
    const int err = errno;
    for (int fd : eps) close(fd);
    for (int fd : {timer_fd_, ready_fd_, stop_fd_})
      if (fd >= 0) close(fd);
    throw std::runtime_error(std::string("pod work queue: ") + what + ": " + std::strerror(err));
  };
  if (timer_fd_ < 0 || ready_fd_ < 0 || stop_fd_ < 0) fail("timerfd/eventfd");
  for (size_t i = 0; i < workers; ++i) {
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1");
    eps.push_back(ep);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    ev.data.fd = timer_fd_;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, timer_fd_, &ev) != 0) fail("epoll_ctl");
    ev.data.fd = ready_fd_;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ready_fd_, &ev) != 0) fail("epoll_ctl");
    ev.events = EPOLLIN;  // every worker wakes to stop
    ev.data.fd = stop_fd_;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd_, &ev) != 0) fail("epoll_ctl");
  }
  for (int ep : eps)
    threads_.emplace_back([this, ep] {
      set_thread_name("kpleg-work");
      run(ep);
    });
}

PodWorkQueue::~PodWorkQueue() {
  stop();
  for (int fd : {timer_fd_, ready_fd_, stop_fd_})
    if (fd >= 0) close(fd);
}

void PodWorkQueue::wake_one() { signal(ready_fd_); }

void PodWorkQueue::arm(Clock::time_point at) {
  if (at == armed_at_) return;
  armed_at_ = at;
  itimerspec its{};  // all zero: disarmed
  if (at != Clock::time_point::max()) {
    // Relative to now, not an absolute CLOCK_MONOTONIC time: the same thing, except to tools
    // that shift the clocks of a process (libfaketime rewrites absolute timer times, which
    // moved every look by the wall clock's step in the clock-step test).
    const auto left = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(at - Clock::now()).count());
    its.it_value.tv_sec = left / 1'000'000'000;
    its.it_value.tv_nsec = left % 1'000'000'000;
  }
  timerfd_settime(timer_fd_, 0, &its, nullptr);
}

uint64_t PodWorkQueue::post(const std::string& pod, Task task, Clock::time_point not_before) {
  std::lock_guard lk(mu_);
  const uint64_t ticket = ++last_ticket_;
  if (stopping_) return ticket;
  queues_[pod].push_back({not_before, std::move(task), ticket});
  // The worker of a busy pod looks again when its task is done; otherwise a ready task wakes
  // one idle worker, and a delayed one moves the timer earlier if it is due first.
  if (busy_.count(pod)) return ticket;
  const auto now = Clock::now();
  if (not_before <= now) {
    wake_one();
  } else if (not_before < armed_at_ || armed_at_ <= now) {
    arm(not_before);
  }
  return ticket;
}

bool PodWorkQueue::cancel(const std::string& pod, uint64_t ticket) {
  std::lock_guard lk(mu_);
  auto q = queues_.find(pod);
  if (q == queues_.end()) return false;
  auto it = std::find_if(q->second.begin(), q->second.end(),
                         [&](const Item& i) { return i.ticket == ticket; });
  if (it == q->second.end()) return false;
  const auto at = it->not_before;
  q->second.erase(it);
  if (q->second.empty() && !busy_.count(pod)) queues_.erase(q);
  // The timer set for this task alone would wake a worker for nothing: set it to the next one.
  const auto now = Clock::now();
  if (at == armed_at_ && armed_at_ > now) {
    Clock::time_point next = Clock::time_point::max();
    for (const auto& [p, items] : queues_) {
      if (busy_.count(p)) continue;
      for (const auto& i : items) next = std::min(next, i.not_before);
    }
    arm(next);
  }
  return true;
}

void PodWorkQueue::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    queues_.clear();
  }
  signal(stop_fd_);
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

size_t PodWorkQueue::pending() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [_, q] : queues_) n += q.size();
  return n;
}

void PodWorkQueue::run(int ep) {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    // The first ready task of an idle pod. A delayed task (a retry, a removal check) does not
    // hold back the ready tasks queued behind it: every task re-reads the runtime and moves its
    // container forward only, so their order within a pod does not change what is emitted.
    const auto now = Clock::now();
    Clock::time_point next_due = Clock::time_point::max();
    std::string pick;
    std::deque<Item>::iterator item;
    bool found = false, more_ready = false;
    for (auto& [pod, q] : queues_) {
      if (q.empty() || busy_.count(pod)) continue;
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (it->not_before <= now) {
          if (found) {
            more_ready = true;
          } else {
            pick = pod;
            item = it;
            found = true;
          }
          break;  // this pod's other tasks wait for this one
        }
        next_due = std::min(next_due, it->not_before);
      }
      if (more_ready) break;
    }
    // The timer follows the earliest delayed task of an idle pod (a busy pod's worker looks
    // again itself), and another ready task goes to another idle worker.
    if (!more_ready && (next_due < armed_at_ || armed_at_ <= now)) arm(next_due);
    if (more_ready) wake_one();
    if (!found) {
      lk.unlock();
      epoll_event out[3];
      const int n = epoll_wait(ep, out, 3, -1);  // EINTR: n < 0, look again
      for (int i = 0; i < n; ++i) {
        if (out[i].data.fd != stop_fd_) drain(out[i].data.fd);
      }
      lk.lock();
      continue;
    }
    Task task = std::move(item->task);
    queues_[pick].erase(item);
    busy_.insert(pick);
    lk.unlock();
    task();
    lk.lock();
    busy_.erase(pick);
    auto it = queues_.find(pick);
    if (it != queues_.end() && it->second.empty()) queues_.erase(it);
    // This worker looks again itself (the pod's next task included) before it sleeps.
  }
  lk.unlock();
  close(ep);
}

}  // namespace kpleg::pleg
