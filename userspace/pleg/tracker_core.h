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

// The kernel-driven path's timings. A kernel signal says that a container's process started or
// ended, not what the runtime says now, so each is confirmed by a CRI look; removals, which no
// kernel event marks, are found by one sweep for all exited containers (removal_watcher.h).
// Each default trades event latency against CRI calls on a busy node.
struct TrackerOptions {
  size_t workers = 4;  // pods confirmed in parallel: a hung pod holds one worker, not all
  // Retries double from this up to 20 ms; the first look waits the learned lag (lag_learner.h).
  std::chrono::milliseconds confirm_retry_first{5};
  // Unsettled after this (a stalled shim, a slow StartContainer): logged, counted, never dropped,
  std::chrono::milliseconds confirm_budget{5000};
  std::chrono::milliseconds confirm_backoff_max{10'000};  // and looked at again up to this apart
  // The sweep lists everything: a state-filtered list drops what the runtime reloaded as UNKNOWN.
  std::chrono::milliseconds removal_sweep_first{1000};      // after a death, if none is planned
  std::chrono::milliseconds removal_sweep_period{1000};     // while deaths and removals come
  std::chrono::milliseconds removal_sweep_idle_max{10'000};  // doubling up to this while idle
  // The runtime's event stream live (runtime_events.h): a look waits this for a late event.
  std::chrono::milliseconds runtime_event_grace{100};
  std::chrono::milliseconds runtime_event_check{250};  // at most one check of overdue events per
  std::chrono::milliseconds removal_sweep_with_events{30'000};  // only for a lost DELETED
  // A swept removal's DELETED later than this: the stream misses removals; sweep as without it.
  std::chrono::milliseconds removal_event_grace{1000};
  // After the kernel's hint (the rmdir's entry), one removal_sweep_period after the last sweep.
  std::chrono::milliseconds removal_hint_delay{1000};
  // inotify's hint comes after the rmdir, already gathered by DirRemovalWatch's hold-off.
  std::chrono::milliseconds removal_dir_hint_delay{100};
  // Once hints are trusted; the reconcile looks for removals as often by default.
  std::chrono::milliseconds removal_sweep_with_hints{300'000};
  // A reconcile's difference is re-checked after this: a kernel event in flight is not missed.
  std::chrono::milliseconds correction_grace{300};
  // Unknown to the runtime this long: another runtime's; containerd can take >1 s to list one.
  std::chrono::milliseconds foreign_after{3000};
  // A removed record stays this long, so that a list taken before the removal cannot revive it.
  std::chrono::milliseconds removed_retention{60'000};
};

struct TrackerStats {
  uint64_t kernel_signals = 0;      // kernel events that mapped to a container
  uint64_t unresolved_signals = 0;  // kernel events for cgroups the index does not know
  uint64_t resolved_cgroups = 0;     // ... that it then found (their mkdir record was lost)
  uint64_t unresolved_repeats = 0;   // ... for one that asked for its reconcile already
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
