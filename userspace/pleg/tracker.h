// Tracker: kpleg's kernel-driven PLEG, with the kubelet PLEG's semantics.
//
// Everything the tracker holds belongs to one thread, its event loop (event_loop.h): kernel
// signals (first exec, init exit, OOM, cgroup rmdir) are read there (the ring buffer's
// descriptor registered with watch()) or posted to it, the cgroup is resolved to a container
// (CgroupIndex) and the signal handed to the tracker's parts, each with one job:
//
//   ContainerTable  the records and the kubelet's transition table (pure; container_table.h)
//   Confirmer       one targeted CRI look per signal, retried until the runtime agrees, or the
//                   runtime's own event when it streams them (GetContainerEvents)
//   RemovalWatcher  one adaptive list sweep for the removal of every exited container
//   ReconcileDiff   a full runtime list held against the records (start-up sync, reconcile)
//   TrackerCore     what they share: the loop's timers, the CRI looks (made off the loop, their
//                   answers back on it), and publishing in order (tracker_core.h)
//
// Other threads never touch that state: what they hand in is posted to the loop, and what they
// read (stats, containers, troubles) is asked of it (EventLoop::call), so they see exactly the
// state after the events published so far. No lock is taken per event.
//
// Only a state the runtime reports is ever emitted, through one forward-only transition per
// container (created/unknown -> running -> exited -> non-existent): no duplicate, no Died
// before Started, whatever order the kernel path and the reconciler see things in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
#include "pleg/event_loop.h"
#include "pleg/event.h"
#include "pleg/reconcile_diff.h"
#include "pleg/removal_watcher.h"
#include "pleg/runtime_events.h"
#include "pleg/runtime_looks.h"
#include "pleg/tracker_core.h"

namespace kpleg::pleg {

class Tracker {
 public:
  Tracker(cri::CriClient& cri, cgroup::CgroupIndex& index, EventSink& sink,
          TrackerOptions opts = {});
  ~Tracker();

  // A kernel event: handled at once on the loop's thread (the ring buffer read by the loop),
  // posted to the loop from any other. Never blocks on the runtime.
  void on_kernel_event(const kernel::KernelEvent& ev);
  // The removal hint's source saw a directory named by `id` removed (RemovalHints): taken at
  // once on the loop's thread (the inotify watch is read there, on_loop()), posted to the loop
  // from any other.
  void on_removal_hint(const std::string& id);
  // Reads `fd` on the loop: `on_readable` runs on the loop's thread whenever it is readable
  // (the kernel source's ring buffer, consumed without a thread of its own; the events it hands
  // to on_kernel_event are then handled at once). The descriptor stays registered until
  // stop(), which is to come before `fd` is closed. `first_at_wakeup`: it also runs first at
  // every wakeup of the loop (EventLoop::set_first_at_wakeup), for a ring buffer whose records
  // do not all wake the loop.
  void watch(int fd, std::function<void()> on_readable, const char* what = "other",
             bool first_at_wakeup = false);
  // Runs `f` with the loop on the loop's thread and returns what it returns (at once on that
  // thread, and on the caller's once the tracker has stopped): a component that lives on the
  // loop, its descriptors and timers there (the removal hint's inotify watch,
  // kernel/dir_removal_watch.h), is made and destroyed through it.
  template <typename F>
  auto on_loop(F&& f) {
    return loop_.call([&] { return f(static_cast<cri::Reactor&>(loop_)); });
  }
  // The removal hint (removal_watcher.h), armed for every container and sandbox that
  // exits from now on; nullptr: none. `hints` outlives the tracker's use of it (stop()).
  // `trusted` and `after_removal`: see RemovalWatcher::set_hints.
  void set_removal_hints(RemovalHints* hints, bool trusted = false, bool after_removal = false);
  // Switches whether an init's exit wakes the loop (exit_wakeup.h: kernel::BpfProgram::
  // set_exit_wakeup), as learned; called on the loop. Unset: exits always wake.
  void set_exit_wakeup(std::function<void(bool wake)> set);
  // How long after an exec, and after a cgroup's rmdir, their records must wake the loop at the
  // latest (Confirmer::set_wake_after: kernel::BpfProgram::set_wake_after); called on the loop,
  // at once and as the lags are learned. Unset: records wake the loop when they are made.
  void set_wake_after(Confirmer::WakeAfter set);

  // An event of the runtime's GetContainerEvents stream (runtime_events.h), from its thread:
  // the runtime's confirmation of what the kernel signalled, without a look.
  void on_runtime_event(const cri::v1::ContainerEventResponse& ev);
  // The stream ended or failed: signals are confirmed by looks alone again.
  void runtime_events_stopped();
  // The runtime's event stream read on the tracker's loop, its events taken there without a
  // hand-off, when the client serves it that way (cri::AsyncStatusCalls); nullptr: it has to be
  // read on a thread of its own (RuntimeEvents' other constructor, feeding the two above).
  // Stopped before the tracker is.
  std::unique_ptr<RuntimeEvents> runtime_events(RuntimeEvents::Options opts = {});

  // Applies a full runtime view. `initial` is the start-up sync (its events are ordinary events
  // with source reconcile); later differences are corrections, after a grace-period re-check.
  void reconcile(const std::vector<RuntimeContainer>& view, bool initial);

  // Called when the tracker finds itself inconsistent (a signal for an unknown cgroup): the
  // daemon reconciles at once.
  void set_inconsistency_handler(std::function<void(const std::string& reason)> fn);
  // How a signal for a cgroup the index does not know is resolved before anything else: the
  // kernel's record of the cgroup's parent (CgroupIndex::resolve). Set before events flow.
  void set_cgroup_parents(cgroup::CgroupIndex::ParentOf parent_of);

  TrackerStats stats() const;
  std::vector<Observation> containers() const;
  // The containers together with `seq_now()`, read with the state exactly as it is after the
  // events published up to that sequence number.
  std::pair<uint64_t, std::vector<Observation>> containers_at(
      const std::function<uint64_t()>& seq_now) const;
  std::vector<PodTrouble> troubled_pods() const;
  // Ends the loop and the looks' threads; the readers above then read the final state.
  void stop();
  // Times the loop's thread woke, for tests and benchmarks.
  uint64_t loop_wakeups() const { return loop_.wakeups(); }

 private:
  void handle(const kernel::KernelEvent& ev);
  void take_runtime_event(const std::optional<Observation>& report);
  // The index entry of an event's cgroup; resolves one the index missed (a lost mkdir record).
  std::optional<cgroup::CgroupIndex::Entry> entry_of(const kernel::KernelEvent& ev);
  // When a kernel record was made, on the loop's clock (its looks count from then).
  static Confirmer::Clock::time_point made_at(uint64_t ktime_ns);
  static constexpr std::chrono::seconds kTrustedAge{10};

  cgroup::CgroupIndex& index_;
  cgroup::CgroupIndex::ParentOf parent_of_;
  // Cgroups that the index could not resolve and that have asked for their reconcile already:
  // their further signals cost a counter, not another reconcile each (until their rmdir).
  // Bounded: forgotten all at once when full.
  static constexpr size_t kMaxUnresolved = 4096;
  std::unordered_set<uint64_t> unresolved_;
  LogLimiter lookalike_log_{std::chrono::seconds(10)};  // rare lines
  mutable EventLoop loop_;
  TrackerCore core_;
  Confirmer confirmer_;
  RemovalWatcher removal_;
  ReconcileDiff diff_;
};

}  // namespace kpleg::pleg
