#include "pleg/pod_work_queue.h"

namespace kpleg::pleg {

PodWorkQueue::PodWorkQueue(size_t workers) {
  for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
}

PodWorkQueue::~PodWorkQueue() { stop(); }

void PodWorkQueue::post(const std::string& pod, Task task, Clock::time_point not_before) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    queues_[pod].push_back({not_before, std::move(task)});
  }
  cv_.notify_all();
}

void PodWorkQueue::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    queues_.clear();
  }
  cv_.notify_all();
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

void PodWorkQueue::run() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    // The first ready task of an idle pod. A delayed task (a retry, a removal check) does not
    // hold back the ready tasks queued behind it: every task re-reads the runtime and moves its
    // container forward only, so their order within a pod does not change what is emitted.
    auto now = Clock::now();
    Clock::time_point next_due = Clock::time_point::max();
    std::string pick;
    std::deque<Item>::iterator item;
    bool found = false;
    for (auto& [pod, q] : queues_) {
      if (q.empty() || busy_.count(pod)) continue;
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (it->not_before <= now) {
          pick = pod;
          item = it;
          found = true;
          break;
        }
        next_due = std::min(next_due, it->not_before);
      }
      if (found) break;
    }
    if (!found) {
      if (next_due == Clock::time_point::max()) {
        cv_.wait(lk);
      } else {
        cv_.wait_until(lk, next_due);
      }
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
    cv_.notify_all();
  }
}

}  // namespace kpleg::pleg
