// A counting semaphore whose waiters give up at a deadline: it bounds how many CRI calls are in
// flight at once, so that a burst of confirmations (or a runtime that has stopped answering)
// cannot pile up unbounded threads on the runtime, while a call that waits for a slot still
// fails at its own deadline instead of at the deadlines of the calls ahead of it.
//
// Not std::counting_semaphore: the libstdc++ of GCC 12 (Debian 12's compiler) can miss a wakeup
// in it and sleep forever (GCC PR 104928); a mutex and a condition variable are plainly right.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace kpleg::cri {

class CallSlots {
 public:
  using Clock = std::chrono::steady_clock;

  explicit CallSlots(size_t slots) : free_(slots), capacity_(slots) {}
  CallSlots(const CallSlots&) = delete;
  CallSlots& operator=(const CallSlots&) = delete;

  // Takes a slot, waiting until one is free or the deadline passes. false: none before the
  // deadline.
  bool acquire_until(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [this] { return free_ > 0; })) return false;
    --free_;
    return true;
  }

  void release() {
    {
      std::lock_guard lock(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

  size_t in_use() const {
    std::lock_guard lock(mu_);
    return capacity_ - free_;
  }
  size_t capacity() const { return capacity_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t free_;
  const size_t capacity_;
};

// Holds one slot for a scope.
class CallSlot {
 public:
  CallSlot(CallSlots& slots, CallSlots::Clock::time_point deadline)
      : slots_(slots), held_(slots.acquire_until(deadline)) {}
  ~CallSlot() {
    if (held_) slots_.release();
  }
  CallSlot(const CallSlot&) = delete;
  CallSlot& operator=(const CallSlot&) = delete;
  bool held() const { return held_; }

 private:
  CallSlots& slots_;
  bool held_;
};

}  // namespace kpleg::cri
