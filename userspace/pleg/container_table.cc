#include "pleg/container_table.h"

namespace kpleg::pleg {

std::string death_reason(bool oom_killed, const std::string& runtime_reason) {
  // The kernel saw the OOM killer end the init itself. A runtime says OOMKilled once it has the
  // cgroup's OOM event, which can come after the exit (containerd 1.6 under load): until then it
  // says Error, the reason of any other non-zero exit, and the kubelet's later looks correct it.
  // Any other reason of the runtime's stands.
  if (oom_killed && (runtime_reason.empty() || runtime_reason == "Error")) return kOomKilledReason;
  return runtime_reason;
}

int rank(ContainerState s) {
  switch (s) {
    case ContainerState::kCreated:
    case ContainerState::kUnknown:
      return 0;
    case ContainerState::kRunning:
      return 1;
    case ContainerState::kExited:
      return 2;
    case ContainerState::kNonExistent:
      return 3;
  }
  return 0;
}

Record& ContainerTable::at(const std::string& id, const std::string& pod_uid) {
  auto& rec = records_[id];
  if (rec.identity.id.empty()) {
    rec.identity.id = id;
    rec.identity.pod.uid = pod_uid;
  }
  return rec;
}

Record* ContainerTable::find(const std::string& id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

int ContainerTable::advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
                            EventSource source, bool correction, Clock::time_point now,
                            uint64_t emit_ns, Events& out) {
  const ContainerState from = rec.reported;
  if (rank(target) <= rank(from)) return 0;
  if (target == ContainerState::kNonExistent) {
    rec.removed_at = now;
    rec.removal_swept = false;
    // Gone before the runtime ever reported it to us: nothing a consumer could have seen.
    if (rank(from) == 0 && !rec.known()) {
      rec.reported = target;
      return 0;
    }
  }
  rec.foreign = false;  // the runtime reports it: it is this runtime's after all

  EventType types[2];
  int n = 0;
  switch (target) {
    case ContainerState::kRunning:
      types[n++] = EventType::kContainerStarted;
      break;
    case ContainerState::kExited:
      // The kernel saw it start though no one reported it running (it lived for
      // milliseconds): report the start too, the runtime's started_at backs it.
      if (rank(from) == 0 && rec.kernel_exec_seen && snap.started_at_ns != 0)
        types[n++] = EventType::kContainerStarted;
      types[n++] = EventType::kContainerDied;
      break;
    case ContainerState::kNonExistent:
      if (from != ContainerState::kExited) types[n++] = EventType::kContainerDied;
      types[n++] = EventType::kContainerRemoved;
      break;
    default:
      return 0;  // created/unknown: ContainerChanged, never sent
  }
  rec.reported = target;
  rec.status = snap;

  for (int i = 0; i < n; ++i) {
    PodLifecycleEvent& ev = out.emplace_back();
    ev.type = types[i];
    ev.pod_uid = rec.identity.pod.uid;
    ev.pod_name = rec.identity.pod.name;
    ev.pod_namespace = rec.identity.pod.namespace_;
    ev.container_id = rec.identity.id;
    ev.container_name = rec.identity.name;
    ev.sandbox = rec.identity.sandbox;
    ev.source = source;
    ev.correction = correction;
    ev.status = snap;
    if (ev.type == EventType::kContainerStarted) {
      ev.kernel_ts_ns = source == EventSource::kKernel ? rec.kernel_start_ts : 0;
    } else if (ev.type == EventType::kContainerDied) {
      ev.kernel_ts_ns = source == EventSource::kKernel ? rec.kernel_exit_ts : 0;
      ev.exit_code = snap.exit_code;
      ev.reason = death_reason(rec.oom_killed, snap.reason);
    }
    ev.emit_ts_ns = emit_ns;
  }
  return n;
}

void ContainerTable::adopt_identity(Record& rec, const Observation& obs) {
  rec.sandbox_known = true;
  if (obs.sandbox && !obs.pod.uid.empty()) sandbox_of_pod_[obs.pod.uid] = rec.identity.id;
  rec.identity.sandbox = obs.sandbox;
  PodIdentity& pod = rec.identity.pod;
  if (!obs.pod.uid.empty()) pod.uid = obs.pod.uid;
  if (!obs.pod.name.empty()) pod.name = obs.pod.name;
  if (!obs.pod.namespace_.empty()) pod.namespace_ = obs.pod.namespace_;
  if (!obs.name.empty()) rec.identity.name = obs.name;
}

void ContainerTable::adopt_listed(Record& rec, const RuntimeContainer& rc) {
  if (!rec.known()) {
    // Keep what was reported: a record made by a kernel signal has state kUnknown.
    const auto reported = rec.reported;
    rec.identity = rc;
    rec.reported = reported;
  }
  rec.sandbox_known = true;
  rec.identity.sandbox = rc.sandbox;
  if (rc.sandbox) sandbox_of_pod_[rc.pod.uid] = rc.id;
}

bool ContainerTable::pod_has_live_sandbox(const std::string& pod_uid) const {
  if (pod_uid.empty()) return false;
  auto it = sandbox_of_pod_.find(pod_uid);
  if (it == sandbox_of_pod_.end()) return false;
  auto rec = records_.find(it->second);
  return rec != records_.end() && rank(rec->second.reported) < rank(ContainerState::kExited);
}

bool ContainerTable::likely_sandbox(const Record& rec) const {
  return rec.sandbox_known ? rec.identity.sandbox : !pod_has_live_sandbox(rec.identity.pod.uid);
}

void ContainerTable::forget_removed(Clock::time_point now, Clock::duration retention) {
  for (auto it = records_.begin(); it != records_.end();) {
    const Record& rec = it->second;
    if (rec.reported != ContainerState::kNonExistent || rec.pending > 0 ||
        now - rec.removed_at < retention) {
      ++it;
      continue;
    }
    if (auto s = sandbox_of_pod_.find(rec.identity.pod.uid);
        s != sandbox_of_pod_.end() && s->second == it->first)
      sandbox_of_pod_.erase(s);
    it = records_.erase(it);
  }
}

std::vector<Observation> ContainerTable::confirmed() const {
  std::vector<Observation> out;
  for (const auto& [id, rec] : records_) {
    // Only what the runtime confirmed: a cgroup the runtime does not know (another runtime's
    // container, a start not yet confirmed) is not a container of this node's pods yet.
    if (rec.reported == ContainerState::kNonExistent || rank(rec.reported) == 0) continue;
    Observation& c = out.emplace_back();
    static_cast<RuntimeContainer&>(c) = rec.identity;
    c.state = rec.reported;
    c.snapshot = rec.status;
    c.snapshot.reason = death_reason(rec.oom_killed, c.snapshot.reason);
  }
  return out;
}

}  // namespace kpleg::pleg
