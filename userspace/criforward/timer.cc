#include "criforward/timer.h"

#include "common/thread_name.h"

namespace kpleg::criforward {

Timer::~Timer() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Timer::Id Timer::at(Clock::time_point when, std::function<void()> fn) {
  std::lock_guard lk(mu_);
  const Id id = next_id_++;
  fns_.emplace(id, std::move(fn));
  const bool earliest = due_.empty() || when < due_.begin()->first;
  due_.emplace(when, id);
  if (!thread_.joinable()) {
    thread_ = named_thread("kpleg-timer", [this] { run(); });
  } else if (earliest) {
    cv_.notify_one();
  }
  return id;
}

void Timer::cancel(Id id) {
  std::lock_guard lk(mu_);
  fns_.erase(id);  // its entry in due_ is skipped when it comes up
}

void Timer::run() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.wait(lk);
      continue;
    }
    const auto [when, id] = *due_.begin();
    if (Clock::now() < when) {
      cv_.wait_until(lk, when);
      continue;
    }
    due_.erase(due_.begin());
    auto it = fns_.find(id);
    if (it == fns_.end()) continue;  // cancelled
    auto fn = std::move(it->second);
    fns_.erase(it);
    lk.unlock();
    fn();
    lk.lock();
  }
}

}  // namespace kpleg::criforward
