// RemovalWatcher: finds the removal of exited containers and sandboxes, which no kernel event
// marks. One sweep answers for all of them: a full ListContainers (ListPodSandbox when
// sandboxes are watched), whatever their number, instead of a call per container; what a full
// list leaves out the runtime no longer has. Sweeps run every period while containers die and
// go, and back off while nothing changes (TrackerOptions::removal_sweep_*). While the runtime's
// event stream is live its DELETED events confirm the removals, and the sweep only catches one
// that was lost (TrackerOptions::removal_sweep_with_events). A stream that leaves removals out
// (CRI-O sends no DELETED for the containers a RemovePodSandbox takes with it) is found out by
// such a sweep: a removal it finds whose DELETED has not come removal_event_grace later makes
// the sweep run as without the stream, until the stream stops. Sandboxes' removals are swept for
// as without the stream until it has reported one (CRI-O reports none): otherwise the first
// pod removal on such a runtime waited for the rare sweep before it could count as a miss.
#pragma once

#include <chrono>
#include <map>
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
  // The runtime's stream reported `id` removed (its DELETED event), whether or not a sweep had
  // found it first. Caller holds core.mu.
  void on_deleted_event(const std::string& id);
  // One targeted look at exited `id` (a reconcile no longer lists it): removed if the runtime
  // does not know it any more; otherwise the sweep goes on.
  void check(const std::string& id);
  // The live stream left a removal out (until it stops). Caller holds core.mu.
  bool events_miss_removals() const { return events_miss_removals_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Plans the sweep at `at` unless one is due earlier. Caller holds core.mu.
  void schedule(Clock::time_point at);
  void sweep(Clock::time_point due);
  // Whether the runtime's DELETED events stand for the sweep, for sandboxes' removals or for
  // containers'. Caller holds core.mu.
  bool events_cover_removals(bool sandbox) const {
    return core_.runtime_events_live && !events_miss_removals_ &&
           (!sandbox || sandbox_deleted_seen_);
  }
  // Removals a sweep found while the events covered them, whose DELETED has not come for
  // removal_event_grace, are ones the stream left out: from then on the sweep runs as without
  // it. Caller holds core.mu.
  void judge_suspects(Clock::time_point now);

  TrackerCore& core_;
  // Under core_.mu:
  std::set<std::string> watched_;          // ids of the records that joined (a sweep walks these, not every record)
  std::optional<Clock::time_point> due_;  // the next sweep
  std::chrono::milliseconds interval_{0};  // after that one
  bool joined_ = false;                    // a record joined since the last sweep
  // Removals a sweep found while the stream covered them, by when: each waits for its DELETED.
  std::map<std::string, Clock::time_point> suspects_;
  bool events_miss_removals_ = false;  // the live stream left a removal out (until it stops)
  bool sandbox_deleted_seen_ = false;  // the live stream reported a sandbox's removal
};

}  // namespace kpleg::pleg
