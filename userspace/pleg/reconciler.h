// Reconciler: the slow full relist that keeps the kernel-driven tracker honest. It runs at
// start, every period (default 300 s), and at once when asked (ring-buffer loss, a runtime
// reconnect, a tracker inconsistency). Each run lists the runtime and hands the view to the
// tracker, which turns any difference into a counted correction.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cri/cri_client.h"
#include "pleg/tracker.h"

namespace kpleg::pleg {

struct ReconcilerStats {
  uint64_t runs = 0;
  uint64_t failures = 0;
  uint64_t requested = 0;  // runs asked for out of schedule
  uint64_t coalesced = 0;  // requests that found one pending and joined it
  std::optional<std::chrono::system_clock::time_point> last_success;  // for people
  // The same on the monotonic clock, for ages: a step of the wall clock (NTP, a VM resumed)
  // must not make the last success look an hour old, or from the future.
  std::optional<std::chrono::steady_clock::time_point> last_success_mono;
  std::chrono::nanoseconds last_duration{0};
  std::string last_error;
  std::string last_reason;  // why the last run happened
  // Since when the run in progress runs (none between runs): liveness tells a slow run, bounded
  // by its calls' deadlines, from a stuck one.
  std::optional<std::chrono::steady_clock::time_point> running_since;
};

class Reconciler {
 public:
  // Runs asked for (request()) start at least `min_spacing` after the previous run ended:
  // whatever asks meanwhile is coalesced into that one run, so no signal, however frequent
  // (a workload's cgroup storm, repeated losses), relists the node back to back.
  Reconciler(cri::CriClient& cri, Tracker& tracker, std::chrono::milliseconds period,
             std::chrono::milliseconds min_spacing = std::chrono::seconds(1));
  ~Reconciler();

  // Starts the thread, whose first run is the initial sync, and waits up to `wait` for it: its
  // error is returned (an unreachable runtime at start is the caller's to report), ETIMEDOUT
  // when it is still running (a full list on a big node may take many seconds; it goes on).
  Status start(std::chrono::milliseconds wait = std::chrono::seconds(2));
  void stop();
  // Asks for a run as soon as possible (coalesced).
  void request(const std::string& reason);
  ReconcilerStats stats() const;
  // Called after every run (on the reconciler's thread), with whether it succeeded.
  void set_on_run(std::function<void(const ReconcilerStats&, bool ok)> fn) { on_run_ = std::move(fn); }
  // Called with every runtime view a run listed (on the reconciler's thread), after the
  // tracker applied it. Set before start().
  void set_on_view(std::function<void(const std::vector<RuntimeContainer>&)> fn) {
    on_view_ = std::move(fn);
  }

 private:
  Status run_once(const std::string& reason, bool initial);
  void loop();

  cri::CriClient& cri_;
  Tracker& tracker_;
  std::chrono::milliseconds period_;
  std::chrono::milliseconds min_spacing_;
  std::optional<std::chrono::steady_clock::time_point> last_end_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::optional<std::string> requested_;
  bool initial_done_ = false;
  bool initial_finished_ = false;  // the first run ended, well or not
  Status initial_status_;
  ReconcilerStats stats_;
  std::function<void(const ReconcilerStats&, bool)> on_run_;
  std::function<void(const std::vector<RuntimeContainer>&)> on_view_;
  std::thread thread_;
};

}  // namespace kpleg::pleg
