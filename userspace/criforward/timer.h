// Timer: runs callbacks at given times on one thread of its own, started with the first timer
// and asleep whenever none is due (no periodic wakeup). What a forwarder's user needs to end a
// Gate later without blocking a gRPC thread. Callbacks run one at a time, without the timer's
// lock held: they may set or cancel timers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace kpleg::criforward {

class Timer {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  Timer() = default;
  // Drops the timers not run yet and joins the thread.
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  Id at(Clock::time_point when, std::function<void()> fn);
  // A timer not run yet never runs; one running now finishes.
  void cancel(Id id);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, Id> due_;
  std::map<Id, std::function<void()>> fns_;
  Id next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kpleg::criforward
