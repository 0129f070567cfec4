// Setting a CLOCK_MONOTONIC timerfd to a steady_clock time, for the event loop, the pod work
// queue and the API server's quiet connections (api/h2_quiet.cc).
#pragma once

#include <sys/timerfd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace kpleg::pleg {

// Sets `fd` to fire at `at`; time_point::max() disarms it. Relative to now, not an absolute
// CLOCK_MONOTONIC time: the same thing, except to tools that shift the clocks of a process
// (libfaketime rewrites absolute timer times, which moved every look by the wall clock's step
// in the clock-step test).
inline void set_timerfd(int fd, std::chrono::steady_clock::time_point at) {
  itimerspec its{};  // all zero: disarmed
  if (at != std::chrono::steady_clock::time_point::max()) {
    const auto left = std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               at - std::chrono::steady_clock::now())
                                               .count());
    its.it_value.tv_sec = left / 1'000'000'000;
    its.it_value.tv_nsec = left % 1'000'000'000;
  }
  timerfd_settime(fd, 0, &its, nullptr);
}

}  // namespace kpleg::pleg
