// Work for pods, run by a small pool of threads: one pod's tasks run one at a time, in order
// among those that are due, different pods run in parallel, and a task can be delayed (retries
// while the runtime catches up, removal checks) without holding a thread or the tasks behind it. A pod whose CRI calls hang occupies at
// most one worker, so the others keep confirming other pods' events.
//
// Idle workers sleep in epoll on two descriptors they share, each registered EPOLLEXCLUSIVE so
// that the kernel wakes one of them per event: a timerfd set to the earliest delayed task, and an
// eventfd written for a task that is ready at once. Posting a delayed task costs a
// timerfd_settime and wakes nobody; when it is due, one worker wakes and runs it. (With a
// condition variable and one worker waiting out the earliest time, each look cost three or four
// wakeups: the post woke a worker to re-arm the wait, a superseded wait still woke at its old
// time, and a worker that took the timer's task woke another to wait in its place.)
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::pleg {

// A queued task, as post() returns it for cancel(): its due time and its number (never 0 for a
// task; a default ticket names none).
struct PodWorkTicket {
  std::chrono::steady_clock::time_point at{};
  uint64_t id = 0;
  explicit operator bool() const { return id != 0; }
};

class PodWorkQueue {
 public:
  using Clock = std::chrono::steady_clock;
  using Task = std::function<void()>;
  using Ticket = PodWorkTicket;

  explicit PodWorkQueue(size_t workers);
  ~PodWorkQueue();
  PodWorkQueue(const PodWorkQueue&) = delete;
  PodWorkQueue& operator=(const PodWorkQueue&) = delete;

  // Runs `task` for `pod` no earlier than `not_before`, after the pod's earlier tasks. Returns
  // the task's ticket for cancel().
  Ticket post(const std::string& pod, Task task, Clock::time_point not_before = Clock::now());
  // Drops the task of `ticket` if it has not started: true when it was dropped (it will never
  // run), false when it ran, is running or is unknown. A dropped delayed task wakes nobody.
  bool cancel(const Ticket& ticket);
  // Stops the workers; pending tasks are dropped.
  void stop();

  size_t pending() const;

 private:
  struct Item {
    Clock::time_point not_before;
    Task task;
    uint64_t ticket;
  };
  // A worker's loop; `ep` is its own epoll descriptor (made by the constructor, closed here).
  void run(int ep);
  // Wakes one idle worker (the eventfd). Caller holds mu_.
  void wake_one();
  // Sets the timerfd to `at` unless it is set to that already. Caller holds mu_.
  void arm(Clock::time_point at);
  // When the earliest task of a pod without a running task is due (max: none). Caller holds mu_.
  Clock::time_point earliest_idle() const;

  mutable std::mutex mu_;
  std::map<std::string, std::deque<Item>> queues_;
  // Every queued task by (due time, ticket), to its pod (the key of its queue in queues_, which
  // lives while the queue holds a task): a worker finds the earliest task of an idle pod without
  // scanning every pod's queue.
  std::map<std::pair<Clock::time_point, uint64_t>, const std::string*> due_;
  std::set<std::string> busy_;  // pods with a task running
  bool stopping_ = false;
  uint64_t last_ticket_ = 0;
  // When the timerfd fires next; max: not set. Once past, it has fired (or is about to).
  Clock::time_point armed_at_ = Clock::time_point::max();
  int timer_fd_ = -1;  // CLOCK_MONOTONIC, the clock of steady_clock
  int ready_fd_ = -1;  // eventfd: a task is ready now
  int stop_fd_ = -1;   // eventfd: every worker ends
  std::vector<std::thread> threads_;
};

}  // namespace kpleg::pleg
