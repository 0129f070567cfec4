// Tracker: kpleg's kernel-driven PLEG, with the kubelet PLEG's semantics.
//
// Kernel signals (first exec, init exit, OOM, cgroup rmdir) arrive on the kernel source's
// thread; the tracker resolves the cgroup to a container (CgroupIndex) at once and hands the
// signal to its parts, each with one job:
//
//   ContainerTable  the records and the kubelet's transition table (pure; container_table.h)
//   Confirmer       one targeted CRI look per signal, retried until the runtime agrees, or the
//                   runtime's own event when it streams them (GetContainerEvents)
//   RemovalWatcher  one adaptive list sweep for the removal of every exited container
//   ReconcileDiff   a full runtime list held against the records (start-up sync, reconcile)
//   TrackerCore     what they share: the state lock, the pod work queue, the CRI looks, and
//                   publishing in order after the lock is released (tracker_core.h)
//
// Only a state the runtime reports is ever emitted, through one forward-only transition per
// container (created/unknown -> running -> exited -> non-existent): no duplicate, no Died
// before Started, whatever order the kernel path and the reconciler see things in.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_set>
#include <string>
#include <utility>
#include <vector>

#include "cgroup/cgroup_index.h"
#include "common/log_limiter.h"
#include "cri/cri_client.h"
#include "kernel/kernel_event.h"
#include "pleg/confirmer.h"
#include "pleg/container_table.h"
#include "pleg/event.h"
#include "pleg/reconcile_diff.h"
#include "pleg/removal_watcher.h"
#include "pleg/runtime_looks.h"
#include "pleg/tracker_core.h"

namespace kpleg::pleg {

class Tracker {
 public:
  Tracker(cri::CriClient& cri, cgroup::CgroupIndex& index, EventSink& sink,
          TrackerOptions opts = {});
  ~Tracker();

  // Called on the kernel source's thread (and the removal hint's inotify watch's, for its
  // RemovalHint events); never blocks on the runtime.
  void on_kernel_event(const kernel::KernelEvent& ev);
  // The removal hint (removal_watcher.h), armed for every container and sandbox that
  // exits from now on; nullptr: none. `hints` outlives the tracker's use of it (stop()).
  // `trusted` and `after_removal`: see RemovalWatcher::set_hints.
  void set_removal_hints(RemovalHints* hints, bool trusted = false, bool after_removal = false);

  // An event of the runtime's GetContainerEvents stream (runtime_events.h), on its thread: the
  // runtime's confirmation of what the kernel signalled, without a look. Never blocks on the
  // runtime.
  void on_runtime_event(const cri::v1::ContainerEventResponse& ev);
  // The stream ended or failed: signals are confirmed by looks alone again.
  void runtime_events_stopped();

  // Applies a full runtime view. `initial` is the start-up sync (its events are ordinary events
  // with source reconcile); later differences are corrections, after a grace-period re-check.
  void reconcile(const std::vector<RuntimeContainer>& view, bool initial);

  // Called when the tracker finds itself inconsistent (a signal for an unknown cgroup): the
  // daemon reconciles at once.
  void set_inconsistency_handler(std::function<void(const std::string& reason)> fn);
  // How a signal for a cgroup the index does not know is resolved before anything else: the
  // kernel's record of the cgroup's parent (CgroupIndex::resolve). Set before events flow.
  void set_cgroup_parents(cgroup::CgroupIndex::ParentOf parent_of) {
    parent_of_ = std::move(parent_of);
  }

  TrackerStats stats() const;
  std::vector<TrackedContainer> containers() const;
  // The containers together with `seq_now()`, read with the state exactly as it is after the
  // events published up to that sequence number.
  std::pair<uint64_t, std::vector<TrackedContainer>> containers_at(
      const std::function<uint64_t()>& seq_now) const;
  std::vector<PodTrouble> troubled_pods() const;
  void stop();

 private:
  // The index entry of an event's cgroup; resolves one the index missed (a lost mkdir record).
  std::optional<cgroup::CgroupIndex::Entry> entry_of(const kernel::KernelEvent& ev);

  cgroup::CgroupIndex& index_;
  cgroup::CgroupIndex::ParentOf parent_of_;
  // Cgroups that the index could not resolve and that have asked for their reconcile already:
  // their further signals cost a counter, not another reconcile each (until their rmdir). Only
  // the ring-buffer thread uses it. Bounded: forgotten all at once when full.
  static constexpr size_t kMaxUnresolved = 4096;
  std::unordered_set<uint64_t> unresolved_;
  LogLimiter lookalike_log_{std::chrono::seconds(10)};  // on the ring-buffer thread: rare lines
  TrackerCore core_;
  Confirmer confirmer_;
  RemovalWatcher removal_;
  ReconcileDiff diff_;
};

}  // namespace kpleg::pleg
