// TrackerCore: what the kernel-driven path's parts share, and the rules for sharing it.
//
//   - one state lock (`mu`) over the ContainerTable, the counters and the pods' troubles;
//   - CRI calls are made without it (look());
//   - events are computed under it and published after it is released, in the order the state
//     changed (publish(): the publish lock is taken before the state lock is let go, so the
//     next emitter waits for these events to be out, and a snapshot read under both locks is
//     exactly the state after the events published so far);
//   - all timed work goes through the pod work queue (one pod's work in order, a hung pod
//     holding at most one worker).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/log_limiter.h"
#include "cri/cri_client.h"
#include "pleg/container_table.h"
#include "pleg/event.h"
#include "pleg/pod_work_queue.h"
#include "pleg/runtime_looks.h"

namespace kpleg::pleg {

struct TrackerOptions {
  size_t workers = 4;  // pods confirmed in parallel
  // Confirmation retries while the runtime has not caught up with the kernel yet.
  // The first look goes when the runtime has usually caught up (learned, see lag_learner.h);
  // then retries double from this step up to 20 ms. A confirmation still unsettled after the
  // budget (a stalled shim, a PID 1 whose namespace dies slowly, a slow StartContainer) is
  // logged and counted, and keeps looking, backing off up to confirm_backoff_max: it is never
  // dropped. A cgroup rmdir (the init is gone for sure) makes it look at once.
  std::chrono::milliseconds confirm_retry_first{5};
  std::chrono::milliseconds confirm_budget{5000};
  std::chrono::milliseconds confirm_backoff_max{10'000};
  // Removal, which no kernel event marks, is watched by one sweep for all exited containers:
  // a full ListContainers (ListPodSandbox when sandboxes are watched), whatever their number,
  // instead of a call per container. Only a full list is evidence of a removal (a
  // state-filtered one drops a container that the runtime reloaded as UNKNOWN after a
  // restart). The first sweep goes removal_sweep_first after a death when none is planned; then
  // every removal_sweep_period while something changes (a removal, a new death), and, while
  // nothing does, twice as long each time up to removal_sweep_idle_max. A death pulls a sweep
  // planned further off back to removal_sweep_period.
  std::chrono::milliseconds removal_sweep_first{1000};
  std::chrono::milliseconds removal_sweep_period{1000};
  std::chrono::milliseconds removal_sweep_idle_max{10'000};
  // With the runtime's event stream live (GetContainerEvents, runtime_events.h), its events
  // confirm the signals and removals: a signal's first look goes runtime_event_grace after the
  // runtime usually reports the transition, only in case its event is late or lost, and the
  // removal sweep runs every removal_sweep_with_events at most, in case a DELETED event was.
  std::chrono::milliseconds runtime_event_grace{100};
  std::chrono::milliseconds runtime_event_check{250};  // at most one check of overdue events per
  std::chrono::milliseconds removal_sweep_with_events{30'000};
  // A removal such a sweep finds is one the stream left out unless its DELETED comes within
  // this long (it may be on its way); then the sweep runs as without the stream.
  std::chrono::milliseconds removal_event_grace{1000};
  // The kernel's removal hint (removal_watcher.h): a hinted id is swept for removal_hint_delay
  // after its hint, and one removal_sweep_period after the last sweep at the soonest (hints of
  // many removals share one sweep); once hints are trusted, ids the
  // kernel watches are swept for every removal_sweep_with_hints at most (as the reconcile
  // looks for removals too, the same period by default).
  std::chrono::milliseconds removal_hint_delay{1000};
  // inotify's hint comes once the directory is gone (the kernel's at the rmdir's entry), and
  // its watch already gathers the hints of removals that come together (DirRemovalWatch's
  // hold-off): its sweep goes this soon. The runtime forgets the id just after it removes the
  // directory; a sweep that still finds it looks again, removal_hint_delay apart.
  std::chrono::milliseconds removal_dir_hint_delay{100};
  std::chrono::milliseconds removal_sweep_with_hints{300'000};
  // A difference found by a reconcile is re-checked after this grace period (a kernel event in
  // flight is not a missed one) before it becomes a correction.
  std::chrono::milliseconds correction_grace{300};
  // A started container that the runtime still does not know after this long belongs to
  // someone else (another runtime under the same kubepods root): its kernel signals are
  // ignored from then on, without a reconcile. A reconcile that lists it after all reports it
  // as a correction.
  // (3 s: on a busy node containerd can take over a second between a sandbox's pause exec and
  // listing the sandbox. While the runtime answers NOT_FOUND, looks back off to 200 ms.)
  std::chrono::milliseconds foreign_after{3000};
  // How long a removed container's record stays, so that a runtime list taken just before the
  // removal cannot bring it back. Swept on every reconcile.
  std::chrono::milliseconds removed_retention{60'000};
};

struct TrackerStats {
  uint64_t kernel_signals = 0;      // kernel events that mapped to a container
  uint64_t unresolved_signals = 0;  // kernel events for cgroups the index does not know
  uint64_t confirmations = 0;       // targeted CRI confirmations that changed state
  uint64_t confirm_retries = 0;
  uint64_t confirm_failures = 0;    // still unsettled after the budget (it keeps looking)
  uint64_t looks_dropped = 0;       // queued looks of a death chain a later signal replaced
  uint64_t removal_checks = 0;      // targeted removal checks (asked for by a reconcile)
  uint64_t removal_sweeps = 0;      // list calls of the removal sweep
  uint64_t runtime_events = 0;      // events of the runtime's stream for a known container
  uint64_t runtime_event_confirmations = 0;  // of those, the ones that changed state
  uint64_t runtime_events_early = 0;  // came before the kernel's signal made the record, then settled its chain
  uint64_t runtime_events_unmatched = 0;  // for no known container (or saying nothing new to look for)
  uint64_t runtime_events_late = 0;  // looks that settled a signal while the stream was live
  uint64_t runtime_events_missed_removals = 0;  // removals the sweep found and the stream never reported
  uint64_t removal_hints = 0;         // the kernel's removal hints for a watched id
  uint64_t removal_hints_missed = 0;  // armed removals the sweep found and the kernel never hinted
  bool removal_hints_trusted = false;  // Tracker::stats() fills it in
  bool runtime_events_cover_removals = true;  // false once the stream left a removal out (until it stops); Tracker::stats() fills it in
  bool runtime_events_live = false;  // the runtime's event stream confirms (see runtime_events.h)
  uint64_t foreign_containers = 0;  // started containers the runtime does not know
  uint64_t foreign_signals = 0;     // kernel signals of those, ignored
  // Kernel signals from a cgroup that claims a container id whose container has an older
  // cgroup (a look-alike path, e.g. in a user's delegated subtree): ignored, no call made.
  uint64_t lookalike_signals = 0;
  size_t records = 0;               // containers and sandboxes held in memory (incl. removed)
  std::map<std::string, uint64_t> corrections;  // by event type
  uint64_t corrections_total() const;
};

// A pod whose targeted CRI calls have been failing (a hung or erroring runtime for that pod),
// with how long and why; cleared by the pod's next successful call.
struct PodTrouble {
  std::string pod_uid;
  uint64_t failures = 0;
  std::chrono::steady_clock::duration failing_for{};
  std::string last_error;
};

class TrackerCore {
 public:
  using Clock = std::chrono::steady_clock;
  using Lock = std::unique_lock<std::mutex>;

  TrackerCore(cri::CriClient& cri, EventSink& sink, TrackerOptions opts);

  // One targeted look (runtime_looks.h), its outcome noted for the pod (troubled_pods()).
  // Called without `mu`.
  Result<Observation> look(const std::string& id, bool kind_known, bool sandbox);

  // ContainerTable::advance, plus: corrections counted, an exit handed to `on_exited` (the
  // removal watcher). Caller holds `mu`.
  int advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
              EventSource source, bool correction, Events& out);
  // Releases `lk` (on `mu`) and publishes `out`, in order, before any later emitter's events.
  void publish(Lock& lk, Events& out);
  // Runs `f` with `mu` and the publish lock held: the state with exactly the events published
  // so far.
  template <typename F>
  auto with_published_state(F&& f) const {
    std::lock_guard lk(mu);
    std::lock_guard pub(publish_mu_);
    return f();
  }

  // Runs `task` in the pod's order (a container of no known pod is its own key). Returns the
  // task's ticket for cancel().
  PodWorkTicket post(const std::string& pod_uid, const std::string& id, PodWorkQueue::Task task,
                     Clock::time_point at = Clock::now());
  // Drops a task post() queued, if it has not started: true when it will never run.
  bool cancel(const PodWorkTicket& ticket) { return queue.cancel(ticket); }

  // Asks the daemon for a reconcile (logged).
  void inconsistent(const std::string& reason);
  void set_inconsistency_handler(std::function<void(const std::string&)> fn);

  std::vector<PodTrouble> troubled_pods() const;

  cri::CriClient& cri;
  const TrackerOptions opts;
  PodWorkQueue queue;

  mutable std::mutex mu;  // the state lock: everything below
  ContainerTable table;
  TrackerStats stats;
  std::function<void(Record&)> on_exited;  // called with `mu` held
  // The runtime's event stream is delivering (runtime_events.h): the confirmations wait for it.
  bool runtime_events_live = false;
  std::function<void(bool)> on_runtime_events_live;  // called with `mu` held, on each change
  // The runtime's stream reported a container or sandbox removed (its DELETED event), whether
  // or not the tracker holds its record. Called with `mu` held.
  std::function<void(const std::string&)> on_deleted_event;

 private:
  void note_call(const std::string& id, const Error* error);

  EventSink& sink_;
  mutable std::mutex publish_mu_;
  struct Trouble {
    Clock::time_point since;
    uint64_t failures = 0;
    std::string last_error;
  };
  std::map<std::string, Trouble> troubles_;  // by pod uid; under mu
  std::function<void(const std::string&)> on_inconsistency_;  // under mu
  // One warning per 10 s for signals a workload can make frequent (unknown cgroups).
  LogLimiter inconsistency_log_{std::chrono::seconds(10)};
};

}  // namespace kpleg::pleg
