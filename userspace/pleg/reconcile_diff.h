// ReconcileDiff: holds a full runtime list against the tracker's records. At start-up (the
// initial sync) the list is the truth, inspected container by container so that its events
// carry the runtime's status, as the kubelet's first relist does. Later, a difference may be a
// kernel event still on its way: it is looked at again with a targeted call after a grace
// period and only then emitted, as a counted correction. A list miss is never enough to emit
// Died or Removed: a look decides.
//
// apply() runs on the tracker's loop; the start-up sync's inspection (a look per container,
// blocking) is made before, on the caller's thread (inspect()).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "pleg/removal_watcher.h"
#include "pleg/tracker_core.h"

namespace kpleg::pleg {

class ReconcileDiff {
 public:
  using Inspected = std::map<std::string, Result<Observation>>;
  ReconcileDiff(TrackerCore& core, RemovalWatcher& removal) : core_(core), removal_(removal) {}

  // Looks at what a start-up list reports as running or exited, unless `reported(id)` says
  // the tracker has reported that state already. Off the loop: blocking calls.
  static Inspected inspect(cri::CriClient& cri, const std::vector<RuntimeContainer>& view,
                           const std::function<int(const std::string&)>& reported_rank);
  // On the loop.
  void apply(const std::vector<RuntimeContainer>& view, bool initial, const Inspected& inspected);

 private:
  // Looks at `id` with a targeted call and moves it to what the runtime reports; a change is a
  // correction when `correction` (a reconcile's difference), an ordinary event otherwise (the
  // start-up sync's). Retries, backing off, while the runtime does not answer.
  void recheck(const std::string& id, std::chrono::milliseconds retry, bool correction);
  void on_recheck(const std::string& id, std::chrono::milliseconds retry, bool correction,
                  Result<Observation> obs);

  TrackerCore& core_;
  RemovalWatcher& removal_;
};

}  // namespace kpleg::pleg
