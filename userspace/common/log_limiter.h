// At most one log line per period for a message that a workload can make frequent (a signal for
// a cgroup nobody knows, an undecodable record): the lines in between are counted, and the next
// line that is written says how many were left out. Called on the ring-buffer thread, where a
// line per event written to a slow stderr would hold up the kernel's events.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace kpleg {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(Clock::duration period) : period_(period) {}

  // Whether to write the line now. When it is, `left_out` is set to the number of lines left
  // out since the last one written.
  bool allow(uint64_t& left_out, Clock::time_point now = Clock::now()) {
    std::lock_guard lk(mu_);
    if (written_ && now - last_ < period_) {
      ++left_out_;
      return false;
    }
    written_ = true;
    last_ = now;
    left_out = left_out_;
    left_out_ = 0;
    return true;
  }

 private:
  const Clock::duration period_;
  std::mutex mu_;
  bool written_ = false;
  Clock::time_point last_{};
  uint64_t left_out_ = 0;
};

}  // namespace kpleg
