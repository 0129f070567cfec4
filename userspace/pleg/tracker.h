// Tracker: kpleg's per-container state machine with the kubelet PLEG's semantics.
//
// Kernel signals (first exec, init exit, OOM, cgroup rmdir) arrive on the kernel source's
// thread; the tracker resolves the cgroup to a container (CgroupIndex) at once and hands a
// confirmation task to the pod's work queue. The task makes ONE targeted CRI call for that
// container (ContainerStatus, or PodSandboxStatus for a sandbox), retried briefly while the
// runtime catches up; only a state the runtime reports is ever emitted. Removal, which no kernel
// event marks, is found by targeted status checks of exited containers on a backoff schedule.
//
// Every emission goes through one forward-only transition per container (created/unknown ->
// running -> exited -> non-existent), under one lock: no duplicate, no Died before Started, no
// event for a state the runtime has not reported, whatever order the kernel path and the
// reconciler see things in.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cgroup/cgroup_index.h"
#include "cri/cri_client.h"
#include "kernel/kernel_event.h"
#include "pleg/event.h"
#include "pleg/lag_learner.h"
#include "pleg/pod_work_queue.h"

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
  std::chrono::milliseconds removal_sweep_first{500};
  std::chrono::milliseconds removal_sweep_period{1000};
  std::chrono::milliseconds removal_sweep_idle_max{10'000};
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

// One container (or sandbox) as a full runtime list reports it.
struct RuntimeContainer {
  std::string id;
  std::string pod_uid;
  std::string pod_name;
  std::string pod_namespace;
  std::string name;  // empty for sandboxes
  bool sandbox = false;
  ContainerState state = ContainerState::kUnknown;
};

// ListPodSandbox + ListContainers, as the reconciler and the List API need them.
Result<std::vector<RuntimeContainer>> list_runtime(cri::CriClient& cri);

// A container as the tracker last reported it (for List).
struct TrackedContainer {
  RuntimeContainer identity;  // state = last reported state
  ContainerSnapshot status;   // what the runtime said at the last reported transition
  bool oom_killed = false;
};

struct TrackerStats {
  uint64_t kernel_signals = 0;      // kernel events that mapped to a container
  uint64_t unresolved_signals = 0;  // kernel events for cgroups the index does not know
  uint64_t confirmations = 0;       // targeted CRI confirmations that changed state
  uint64_t confirm_retries = 0;
  uint64_t confirm_failures = 0;    // still unsettled after the budget (it keeps looking)
  uint64_t removal_checks = 0;      // targeted removal checks (asked for by a reconcile)
  uint64_t removal_sweeps = 0;      // list calls of the removal sweep
  uint64_t foreign_containers = 0;  // started containers the runtime does not know
  uint64_t foreign_signals = 0;     // kernel signals of those, ignored
  size_t records = 0;               // containers and sandboxes held in memory (incl. removed)
  std::map<std::string, uint64_t> corrections;  // by event type
  uint64_t corrections_total() const;
};

class Tracker {
 public:
  Tracker(cri::CriClient& cri, cgroup::CgroupIndex& index, EventSink& sink,
          TrackerOptions opts = {});
  ~Tracker();

  // Called on the kernel source's thread; never blocks on the runtime.
  void on_kernel_event(const kernel::KernelEvent& ev);

  // Applies a full runtime view. `initial` is the start-up sync (its events are ordinary events
  // with source reconcile); later differences are corrections, after a grace-period re-check.
  void reconcile(const std::vector<RuntimeContainer>& view, bool initial);

  // Called when the tracker finds itself inconsistent (a confirmation that never settled, a
  // signal for an unknown cgroup): the daemon reconciles at once.
  void set_inconsistency_handler(std::function<void(const std::string& reason)> fn);

  TrackerStats stats() const;
  std::vector<TrackedContainer> containers() const;
  // The containers together with `seq_now()` read under the same lock that every emission
  // holds: the snapshot is exactly the state after the events up to that sequence number.
  std::pair<uint64_t, std::vector<TrackedContainer>> containers_at(
      const std::function<uint64_t()>& seq_now) const;
  // Pods whose targeted CRI calls have been failing (a hung or erroring runtime for that pod),
  // with how long and why; cleared by the pod's next successful call.
  struct PodTrouble {
    std::string pod_uid;
    uint64_t failures = 0;
    std::chrono::steady_clock::duration failing_for{};
    std::string last_error;
  };
  std::vector<PodTrouble> troubled_pods() const;
  void stop();

  // What one targeted CRI call reported of a container or sandbox.
  struct Observation {
    ContainerState state = ContainerState::kUnknown;
    ContainerSnapshot snapshot;
    bool sandbox = false;
    std::string pod_uid, pod_name, pod_namespace, name;
  };

 private:
  struct Record {
    RuntimeContainer identity;
    bool sandbox_known = false;
    ContainerState reported = ContainerState::kUnknown;  // last emitted state
    ContainerSnapshot status;                            // snapshot of the last emitted state
    bool kernel_exec_seen = false;
    bool oom_killed = false;
    uint64_t kernel_start_ts = 0;  // realtime ns
    uint64_t kernel_exit_ts = 0;
    int pending = 0;             // kernel confirmations queued or running
    bool confirm_overdue = false;  // a pending confirmation is past its budget
    bool removal_swept = false;    // exited: the removal sweep watches it
    bool foreign = false;        // the runtime does not know it (see foreign_after)
    std::chrono::steady_clock::time_point removed_at{};  // when it became kNonExistent
  };
  enum class Want { kRunning, kExited };


  Result<Observation> observe(const std::string& id, bool sandbox_known, bool sandbox);
  // One look at the runtime for a kernel signal received at `signal_at`; `last_miss` is when
  // (after the signal) the previous look still saw the old state, negative for none.
  void confirm(const std::string& id, Want want, std::chrono::milliseconds delay,
               std::chrono::steady_clock::time_point deadline,
               std::chrono::steady_clock::time_point signal_at,
               std::chrono::steady_clock::duration last_miss);
  // One targeted look for the removal of exited `id` (a reconcile no longer lists it).
  void check_removed(const std::string& id);
  // Forgets removed containers older than removed_retention. Caller holds mu_.
  void sweep_removed();
  // Hands an exited container to the removal sweep, due within removal_sweep_first. Caller
  // holds mu_.
  void join_removal_sweep(Record& rec);
  // Schedules the sweep at `at` unless one is due earlier. Caller holds mu_.
  void schedule_removal_sweep(std::chrono::steady_clock::time_point at);
  void removal_sweep(std::chrono::steady_clock::time_point due);
  // Looks at `id` with a targeted call and moves it to what the runtime reports; a change is a
  // correction when `correction` (a reconcile's difference), an ordinary event otherwise (the
  // start-up sync's). Retries, backing off, while the runtime does not answer.
  void recheck(const std::string& id, std::chrono::milliseconds retry, bool correction);
  // Inspects what a start-up list reports as running or exited, so its events carry the
  // runtime's status (exit code, reason, timestamps), as the kubelet's first relist does.
  std::map<std::string, Observation> inspect(const std::vector<RuntimeContainer>& view);
  // Records the outcome of a targeted call for the pod of `id` (troubled_pods()).
  void note_call(const std::string& id, const Error* error);
  // Moves a container forward to `target` and publishes the events the transition implies.
  // Caller holds mu_. Returns the number of events published.
  int advance(Record& rec, ContainerState target, const ContainerSnapshot& snap, EventSource source,
              bool correction);
  void inconsistent(const std::string& reason);
  void adopt_identity(Record& rec, const Observation& obs);
  // Whether the pod's sandbox is known and not exited. Caller holds mu_.
  bool pod_has_live_sandbox(const std::string& pod_uid) const;

  cri::CriClient& cri_;
  cgroup::CgroupIndex& index_;
  EventSink& sink_;
  TrackerOptions opts_;
  PodWorkQueue queue_;

  mutable std::mutex mu_;
  std::map<std::string, Record> records_;  // by container/sandbox id
  struct Trouble {
    std::chrono::steady_clock::time_point since;
    uint64_t failures = 0;
    std::string last_error;
  };
  std::map<std::string, Trouble> troubles_;  // by pod uid
  std::map<std::string, std::string> sandbox_of_pod_;  // pod uid -> its latest sandbox id
  TrackerStats stats_;
  std::function<void(const std::string&)> on_inconsistency_;
  std::optional<std::chrono::steady_clock::time_point> sweep_due_;  // the next removal sweep
  std::chrono::milliseconds sweep_interval_{0};                     // after that one
  bool sweep_joined_ = false;  // a container joined the sweep since its last run
  // When the runtime reports a start / an exit, for containers [0] and sandboxes [1] apart
  // (containerd lists a sandbox tens of milliseconds after its pause started).
  LagLearner start_lag_[2], exit_lag_[2];
};

}  // namespace kpleg::pleg
