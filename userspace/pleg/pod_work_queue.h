// Work for pods, run by a small pool of threads: one pod's tasks run one at a time, in order
// among those that are due, different pods run in parallel, and a task can be delayed (retries
// while the runtime catches up, removal checks) without holding a thread or the tasks behind it. A pod whose CRI calls hang occupies at
// most one worker, so the others keep confirming other pods' events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::pleg {

class PodWorkQueue {
 public:
  using Clock = std::chrono::steady_clock;
  using Task = std::function<void()>;

  explicit PodWorkQueue(size_t workers);
  ~PodWorkQueue();
  PodWorkQueue(const PodWorkQueue&) = delete;
  PodWorkQueue& operator=(const PodWorkQueue&) = delete;

  // Runs `task` for `pod` no earlier than `not_before`, after the pod's earlier tasks.
  void post(const std::string& pod, Task task, Clock::time_point not_before = Clock::now());
  // Stops the workers; pending tasks are dropped.
  void stop();

  size_t pending() const;

 private:
  struct Item {
    Clock::time_point not_before;
    Task task;
  };
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<Item>> queues_;
  std::set<std::string> busy_;  // pods with a task running
  bool stopping_ = false;
  bool timer_armed_ = false;     // an idle worker waits for timer_at_
  Clock::time_point timer_at_{};
  std::vector<std::thread> threads_;
};

}  // namespace kpleg::pleg
