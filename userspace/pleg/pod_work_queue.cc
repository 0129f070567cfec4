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
#include "pleg/timerfd.h"

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
    threads_.push_back(named_thread("kpleg-work", [this, ep] { run(ep); }));
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
  set_timerfd(timer_fd_, at);
}

PodWorkQueue::Ticket PodWorkQueue::post(const std::string& pod, Task task,
                                        Clock::time_point not_before) {
  std::lock_guard lk(mu_);
  const Ticket ticket{not_before, ++last_ticket_};
  if (stopping_) return ticket;
  auto q = queues_.try_emplace(pod).first;
  q->second.push_back({not_before, std::move(task), ticket.id});
  due_.emplace(std::pair{not_before, ticket.id}, &q->first);
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

bool PodWorkQueue::cancel(const Ticket& ticket) {
  std::lock_guard lk(mu_);
  auto d = due_.find({ticket.at, ticket.id});
  if (d == due_.end()) return false;  // ran, running, dropped or never queued
  const std::string* pod = d->second;
  due_.erase(d);
  auto q = queues_.find(*pod);
  auto& items = q->second;
  items.erase(std::find_if(items.begin(), items.end(),
                           [&](const Item& i) { return i.ticket == ticket.id; }));
  if (items.empty() && !busy_.count(q->first)) queues_.erase(q);
  // The timer set for this task alone would wake a worker for nothing: set it to the next one.
  if (ticket.at == armed_at_ && armed_at_ > Clock::now()) arm(earliest_idle());
  return true;
}

void PodWorkQueue::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    due_.clear();
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
  return due_.size();
}

PodWorkQueue::Clock::time_point PodWorkQueue::earliest_idle() const {
  for (const auto& [key, pod] : due_) {
    if (!busy_.count(*pod)) return key.first;
  }
  return Clock::time_point::max();
}

void PodWorkQueue::run(int ep) {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    // The idle pod whose earliest task is due first, in one walk over the due times that stops
    // at the first delayed task of an idle pod (a busy pod's tasks are skipped).
    const auto now = Clock::now();
    Clock::time_point next_due = Clock::time_point::max();
    const std::string* pick = nullptr;
    bool more_ready = false;
    for (const auto& [key, pod] : due_) {
      if (busy_.count(*pod) || (pick && *pod == *pick)) continue;
      if (key.first > now) {
        next_due = key.first;  // the earliest delayed task of another idle pod
        break;
      }
      if (pick) {
        more_ready = true;
        break;
      }
      pick = pod;
    }
    // The timer follows the earliest delayed task of an idle pod (a busy pod's worker looks
    // again itself), and another ready task goes to another idle worker.
    if (!more_ready && (next_due < armed_at_ || armed_at_ <= now)) arm(next_due);
    if (more_ready) wake_one();
    if (!pick) {
      lk.unlock();
      epoll_event out[3];
      const int n = epoll_wait(ep, out, 3, -1);  // EINTR: n < 0, look again
      for (int i = 0; i < n; ++i) {
        if (out[i].data.fd != stop_fd_) drain(out[i].data.fd);
      }
      lk.lock();
      continue;
    }
    // The pod's first task that is due, in the order they were posted: a delayed task (a
    // retry, a removal check) does not hold back the ready tasks queued behind it, and every
    // task re-reads the runtime and moves its container forward only, so their order within a
    // pod does not change what is emitted.
    auto& q = queues_.find(*pick)->second;
    auto item = std::find_if(q.begin(), q.end(), [&](const Item& i) { return i.not_before <= now; });
    Task task = std::move(item->task);
    due_.erase({item->not_before, item->ticket});
    const std::string pod = *pick;
    q.erase(item);
    busy_.insert(pod);
    lk.unlock();
    task();
    lk.lock();
    busy_.erase(pod);
    auto it = queues_.find(pod);
    if (it != queues_.end() && it->second.empty()) queues_.erase(it);
    // This worker looks again itself (the pod's next task included) before it sleeps.
  }
  lk.unlock();
  close(ep);
}

}  // namespace kpleg::pleg
