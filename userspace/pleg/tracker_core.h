// TrackerCore: what the kernel-driven path's parts share. All of it belongs to the tracker's
// event loop (event_loop.h) and is used on that thread only, so it has no lock:
//
//   - the ContainerTable, the counters and the pods' troubles;
//   - timers on the loop for all timed work (a look that is due, a back-off, a sweep);
//   - the CRI looks, made off the loop (offload.h: one pod's looks in order, a hung pod
//     holding at most one thread) and answered on it;
//   - publishing: events go out on the loop in the order the state changed, so a reader that
//     asks the loop (EventLoop::call) sees exactly the state after the events published so far.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/log_limiter.h"
#include "cri/cri_client.h"
#include "pleg/container_table.h"
#include "pleg/event.h"
#include "pleg/event_loop.h"
#include "pleg/offload.h"
#include "pleg/runtime_looks.h"

namespace kpleg::pleg {

// The kernel-driven path's timings. A kernel signal says that a container's process started or
// ended, not what the runtime says now, so each is confirmed by a CRI look; removals, which no
// kernel event marks, are found by one sweep for all exited containers (removal_watcher.h).
// Each default trades event latency against CRI calls on a busy node.
struct TrackerOptions {
  size_t workers = 4;  // threads for the looks (offload.h): a hung pod holds one, not all
  // Retries double from this up to 20 ms; the first look waits the learned lag (lag_learner.h).
  std::chrono::milliseconds confirm_retry_first{5};
  // Unsettled after this (a stalled shim, a slow StartContainer): logged, counted, never dropped,
  std::chrono::milliseconds confirm_budget{5000};
  std::chrono::milliseconds confirm_backoff_max{10'000};  // and looked at again up to this apart
  // The sweep lists everything: a state-filtered list drops what the runtime reloaded as UNKNOWN.
  std::chrono::milliseconds removal_sweep_first{1000};      // after a death, if none is planned
  std::chrono::milliseconds removal_sweep_period{1000};     // while deaths and removals come
  std::chrono::milliseconds removal_sweep_idle_max{10'000};  // doubling up to this while idle
  // While sweeps come one a period, the next may wait this long (a quarter of the period at
  // most) for a wakeup the loop has anyway.
  std::chrono::milliseconds removal_sweep_slack{200};
  // The runtime's event stream live (runtime_events.h): a look waits this for a late event.
  std::chrono::milliseconds runtime_event_grace{100};
  // While no signal waits for its event, the stream is read this often at most (its events
  // are then read together: a container's CREATED, a DELETED, what no signal waits for).
  std::chrono::milliseconds runtime_event_hold_off{250};
  std::chrono::milliseconds runtime_event_check{250};  // overdue events checked this often at most
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
  // Unknown to the runtime this long from its first answer that said so (not from the signal:
  // a runtime unreachable meanwhile has not answered yet): another runtime's container.
  // containerd can take >1 s to list one.
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
  bool exit_wakes = true;  // an init's exit wakes the loop (exit_wakeup.h); Tracker::stats() fills it in
  uint64_t exit_wakeups_off = 0;       // times it was learned that it need not
  uint64_t exit_wakeups_restored = 0;  // times an exit then came alone, and exits wake again
  // Times the loop woke, by what woke it (EventLoop::woken_by); Tracker::stats() fills it in.
  std::map<std::string, uint64_t> loop_woken_by;
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
  using OnLook = std::function<void(Result<Observation>)>;
  using TimerId = EventLoop::TimerId;

  TrackerCore(cri::CriClient& cri, EventSink& sink, TrackerOptions opts, EventLoop& loop);

  // One targeted look (runtime_looks.h): a stream of the loop's own HTTP/2 connection when the
  // client has one (cri::AsyncStatusCalls), else a blocking call off the loop in the order of
  // `pod_uid`'s looks (the id when empty). `done` gets the answer on the loop, its outcome
  // noted for the pod (troubled_pods()).
  void look(const std::string& pod_uid, const std::string& id, bool kind_known, bool sandbox,
            OnLook done);
  // Runs `work` off the loop (a full list) in the order of `key`'s work; it posts its outcome
  // back itself (loop()).
  void offload(const std::string& key, Offload::Work work) { offload_.run(key, std::move(work)); }

  // ContainerTable::advance, plus: corrections counted, an exit handed to the exit hook (the
  // removal watcher).
  int advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
              EventSource source, bool correction, Events& out);
  // Publishes `out`, in order.
  void publish(Events& out);

  // Runs `task` on the loop at `at`; cancel() drops it unless it ran.
  TimerId at(Clock::time_point at, EventLoop::Task task, const char* what = "timer") {
    return loop_.at(at, std::move(task), what);
  }
  // The same, for a task that may run up to `slack` later with another cause's wakeup.
  TimerId at(Clock::time_point at, Clock::duration slack, EventLoop::Task task, const char* what) {
    return loop_.at(at, slack, std::move(task), what);
  }
  bool cancel(TimerId id) { return id != 0 && loop_.cancel(id); }
  EventLoop& loop() { return loop_; }

  // Asks the daemon for a reconcile (logged).
  void inconsistent(const std::string& reason);
  void set_inconsistency_handler(std::function<void(const std::string&)> fn) {
    on_inconsistency_ = std::move(fn);
  }
  // What the parts tell one another (tracker.cc wires them): an exit (the removal watcher
  // joins it), the runtime's event stream started or stopped delivering, and its DELETED event.
  struct Hooks {
    std::function<void(Record&)> exited;
    std::function<void(bool)> runtime_events_live;
    std::function<void(const std::string&)> deleted_event;
  };
  void set_hooks(Hooks hooks) { hooks_ = std::move(hooks); }
  const Hooks& hooks() const { return hooks_; }

  // The runtime's event stream is delivering (runtime_events.h): the confirmations wait for it.
  bool runtime_events_live() const { return runtime_events_live_; }
  void set_runtime_events_live(bool live) { runtime_events_live_ = live; }
  // The stream's reading (RuntimeEvents::Options::set_reader): a hold ends, and with `now` what
  // has come is handed on at once (before a removal sweep lists what its DELETEDs may say).
  void set_event_reader(std::function<void(bool now)> reader) { event_reader_ = std::move(reader); }
  void read_events(bool now) {
    if (event_reader_) event_reader_(now);
  }

  ContainerTable& table() { return table_; }
  const ContainerTable& table() const { return table_; }
  TrackerStats& stats() { return stats_; }
  const TrackerStats& stats() const { return stats_; }
  const TrackerOptions& opts() const { return opts_; }
  cri::CriClient& cri() { return cri_; }
  // The client's calls on the loop (null: it has none, or the tracker stopped).
  cri::AsyncStatusCalls* async_calls() { return async_looks_.get(); }

  // Notes the outcome of a look at `id` for its pod (troubled_pods()).
  void note_call(const std::string& id, const Error* error);
  std::vector<PodTrouble> troubled_pods() const;
  // Stops the looks (their answers are dropped). Not on the loop's thread.
  void stop();

 private:
  // At trace level: each look's answer.
  static void trace_look(const std::string& id, bool kind_known, bool sandbox,
                         const Result<Observation>& obs);

  cri::CriClient& cri_;
  const TrackerOptions opts_;
  EventLoop& loop_;
  // The looks on the loop, when the client makes them without blocking (cri_client.h); else
  // on offload_'s threads.
  std::unique_ptr<cri::AsyncStatusCalls> async_looks_;
  Offload offload_;  // the blocking calls: the looks without async_looks_, the sweep's lists
  EventSink& sink_;
  ContainerTable table_;
  TrackerStats stats_;
  Hooks hooks_;
  bool runtime_events_live_ = false;
  std::function<void(bool now)> event_reader_;
  bool stopping_ = false;
  struct Trouble {
    Clock::time_point since;
    uint64_t failures = 0;
    std::string last_error;
  };
  std::map<std::string, Trouble> troubles_;  // by pod uid
  std::function<void(const std::string&)> on_inconsistency_;
  // One warning per 10 s for signals a workload can make frequent (unknown cgroups).
  LogLimiter inconsistency_log_{std::chrono::seconds(10)};
};

}  // namespace kpleg::pleg
