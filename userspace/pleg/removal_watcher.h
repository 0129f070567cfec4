// RemovalWatcher: finds the removal of exited containers and sandboxes, which no kernel event
// marks. One sweep answers for all of them: a full ListContainers (ListPodSandbox when
// sandboxes are watched), whatever their number, instead of a call per container; what a full
// list leaves out the runtime no longer has. Sweeps run every period while containers die and
// go, and back off while nothing changes (TrackerOptions::removal_sweep_*). While the runtime's
// event stream is live its DELETED events confirm the removals, and the sweep only catches one
// that was lost (TrackerOptions::removal_sweep_with_events).
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>

#include "pleg/tracker_core.h"

namespace kpleg::pleg {

class RemovalWatcher {
 public:
  explicit RemovalWatcher(TrackerCore& core) : core_(core) {}

  // An exited record joins the sweep. Caller holds core.mu.
  void join(Record& rec);
  // The runtime's event stream started or stopped confirming removals (its DELETED events):
  // while it does, sweeps are rare; when it stops, one goes soon. Caller holds core.mu.
  void on_runtime_events_live(bool live);
  // One targeted look at exited `id` (a reconcile no longer lists it): removed if the runtime
  // does not know it any more; otherwise the sweep goes on.
  void check(const std::string& id);

 private:
  using Clock = std::chrono::steady_clock;
  // Plans the sweep at `at` unless one is due earlier. Caller holds core.mu.
  void schedule(Clock::time_point at);
  void sweep(Clock::time_point due);

  TrackerCore& core_;
  // Under core_.mu:
  std::set<std::string> watched_;          // ids of the records that joined (a sweep walks these, not every record)
  std::optional<Clock::time_point> due_;  // the next sweep
  std::chrono::milliseconds interval_{0};  // after that one
  bool joined_ = false;                    // a record joined since the last sweep
};

}  // namespace kpleg::pleg
