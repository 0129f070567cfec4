// ContainerTable: the kernel-driven path's record of every container and sandbox, and the
// kubelet's transition table over it. Pure: no lock, no clock, no runtime call, no publishing.
// The owner (TrackerCore, on the tracker's event loop) passes the time in, and publishes the events that
// advance() returns; unit tests drive every transition directly.
//
// A container id moves forward only: created/unknown -> running -> exited -> non-existent.
// Each forward step yields the kubelet PLEG's events for it (generic.go's generateEvents):
//   -> running                ContainerStarted
//   -> exited                 ContainerDied (Started first when the kernel saw a start that
//                             nobody reported: it lived for milliseconds)
//   -> non-existent           ContainerRemoved (Died first when it was not reported exited)
// created/unknown give no event (ContainerChanged, which the kubelet never sends).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pleg/containers.h"
#include "pleg/event.h"

namespace kpleg::pleg {

// Forward order of the states a container id passes through; it never goes back.
int rank(ContainerState s);

struct Record {
  RuntimeContainer identity;
  bool sandbox_known = false;
  ContainerState reported = ContainerState::kUnknown;  // last emitted state
  ContainerSnapshot status;                            // snapshot of the last emitted state
  bool kernel_exec_seen = false;
  bool oom_killed = false;
  uint64_t kernel_start_ts = 0;  // realtime ns
  uint64_t kernel_exit_ts = 0;
  uint64_t kernel_rmdir_ts = 0;  // realtime ns
  int pending = 0;               // kernel confirmations queued or running
  bool confirm_overdue = false;  // a pending confirmation is past its budget
  uint32_t death_chain = 0;      // the death's current chain of looks (Confirmer)
  uint64_t death_look = 0;       // that chain's look's timer on the event loop, if any
  std::chrono::steady_clock::time_point exit_signal_at{};  // when the init's exit was made
  bool removal_swept = false;    // exited: the removal watcher watches it
  bool foreign = false;          // the runtime does not know it (see foreign_after)
  std::chrono::steady_clock::time_point removed_at{};  // when it became kNonExistent

  // The runtime reported it at least once (a list or a look named its pod).
  bool known() const { return !identity.pod.name.empty(); }
};

// A death's reason: the runtime's, except that a runtime's "Error" (or none) for an init the
// kernel saw the OOM killer end (oom_killed) is OOMKilled.
inline constexpr const char* kOomKilledReason = "OOMKilled";
std::string death_reason(bool oom_killed, const std::string& runtime_reason);

using Events = std::vector<PodLifecycleEvent>;

class ContainerTable {
 public:
  using Clock = std::chrono::steady_clock;

  // The record of `id`, made (of pod `pod_uid`) when there is none.
  Record& at(const std::string& id, const std::string& pod_uid = {});
  Record* find(const std::string& id);

  // Moves `rec` forward to `target` and appends the events the transition implies to `out`,
  // stamped `emit_ns`; `now` marks a removal. Returns the number of events (0: not forward).
  int advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
              EventSource source, bool correction, Clock::time_point now, uint64_t emit_ns,
              Events& out);

  // Takes what the runtime reported of `rec` (kind, pod, names).
  void adopt_identity(Record& rec, const Observation& obs);
  // Takes a runtime list's entry for `rec`.
  void adopt_listed(Record& rec, const RuntimeContainer& rc);

  // Whether the pod's latest sandbox is known and not exited.
  bool pod_has_live_sandbox(const std::string& pod_uid) const;
  // The likelier kind of `rec`: what the runtime said, else a sandbox when its pod has no live
  // sandbox (the first id of a pod is most likely its sandbox).
  bool likely_sandbox(const Record& rec) const;

  // Forgets removed records older than `retention`.
  void forget_removed(Clock::time_point now, Clock::duration retention);

  // What the runtime confirmed (not removed, not created/unknown), for List: each as last
  // reported (state) with the status that came with it, an OOM kill as its reason.
  std::vector<Observation> confirmed() const;

  std::map<std::string, Record>& records() { return records_; }
  size_t size() const { return records_.size(); }

 private:
  std::map<std::string, Record> records_;              // by container/sandbox id
  std::map<std::string, std::string> sandbox_of_pod_;  // pod uid -> its latest sandbox id
};

}  // namespace kpleg::pleg
