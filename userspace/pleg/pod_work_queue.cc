#include "pleg/pod_work_queue.h"
#include "common/thread_name.h"

namespace kpleg::pleg {

PodWorkQueue::PodWorkQueue(size_t workers) {
  for (size_t i = 0; i < workers; ++i)
    threads_.emplace_back([this] {
      set_thread_name("kpleg-work");
      run();
    });
}

PodWorkQueue::~PodWorkQueue() { stop(); }

void PodWorkQueue::post(const std::string& pod, Task task, Clock::time_point not_before) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    queues_[pod].push_back({not_before, std::move(task)});
    // An idle worker must look only if the task may run before anyone would look anyway: the
    // worker of a busy pod looks again when its task is done, and the timer's worker wakes at
    // timer_at_. Idle workers are interchangeable: one of them looks (see run()).
    wake = !busy_.count(pod) && (!timer_armed_ || not_before < timer_at_);
  }
  if (wake) cv_.notify_one();
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
      // Only one idle worker waits for the earliest delayed task (the timer); the others sleep
      // until a post or a hand-over wakes one of them. Waking every idle worker at every due
      // time and every post was most of an idle pool's CPU under churn.
      if (next_due != Clock::time_point::max() && (!timer_armed_ || next_due < timer_at_)) {
        timer_armed_ = true;
        timer_at_ = next_due;
        cv_.wait_until(lk, next_due);
        if (timer_armed_ && timer_at_ == next_due) timer_armed_ = false;
      } else {
        cv_.wait(lk);
      }
      continue;
    }
    Task task = std::move(item->task);
    queues_[pick].erase(item);
    busy_.insert(pick);
    // This worker may have been the timer, and other pods' tasks may be ready or delayed: hand
    // the looking over to an idle worker. (This pod's other tasks wait for this one anyway.)
    if (!timer_armed_) {
      bool others = false;
      for (const auto& [pod, q] : queues_) {
        if (!q.empty() && !busy_.count(pod)) {
          others = true;
          break;
        }
      }
      if (others) cv_.notify_one();
    }
    lk.unlock();
    task();
    lk.lock();
    busy_.erase(pick);
    auto it = queues_.find(pick);
    if (it != queues_.end() && it->second.empty()) queues_.erase(it);
    // This worker looks again itself (the pod's next task included) before it sleeps.
  }
}

}  // namespace kpleg::pleg
