// Polling with a deadline, for a state that no event announces (a counter, a log line, a
// process's exit): `done` is asked every `every` until it holds or `within` has passed, and once
// more at the end. The tests' one wait-until-true loop: a test that polls calls this (where an
// event or a condition variable announces the state, wait on that instead).
#pragma once

#include <chrono>
#include <thread>

namespace kpleg::testing {

template <typename F>
bool eventually(F&& done, std::chrono::milliseconds within = std::chrono::seconds(5),
                std::chrono::milliseconds every = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(every);
  }
  return done();
}

}  // namespace kpleg::testing
