#include "pleg/tracker.h"

#include "pleg/runtime_view.h"

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>

namespace kpleg::pleg {

namespace v1 = ::runtime::v1;
using Clock = std::chrono::steady_clock;

namespace {

// Work for one pod runs in order; a container whose pod is not known yet is its own key.
const std::string& queue_key(const std::string& pod_uid, const std::string& id) {
  return pod_uid.empty() ? id : pod_uid;
}

// Forward order of the states a container id passes through; it never goes back.
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

// The removal sweep's own queue key: it runs beside the pods' work, never behind a hung pod.
constexpr const char* kRemovalSweepKey = "\x01removal-sweep";

bool is_not_found(const Error& e) { return e.code == grpc::StatusCode::NOT_FOUND; }

}  // namespace

uint64_t TrackerStats::corrections_total() const {
  uint64_t n = 0;
  for (const auto& [_, v] : corrections) n += v;
  return n;
}

Result<std::vector<RuntimeContainer>> list_runtime(cri::CriClient& cri) {
  auto sandboxes = cri.list_pod_sandboxes({});
  if (!sandboxes) return sandboxes.error();
  auto containers = cri.list_containers({});
  if (!containers) return containers.error();

  std::vector<RuntimeContainer> out;
  for (const auto& [uid, pod] : build_snapshot(*sandboxes, *containers).pods) {
    for (const auto* list : {&pod.sandboxes, &pod.containers}) {
      for (const auto& c : *list) {
        out.push_back({c.id, pod.uid, pod.name, pod.namespace_, c.name, c.sandbox, c.state});
      }
    }
  }
  return out;
}

Tracker::Tracker(cri::CriClient& cri, cgroup::CgroupIndex& index, EventSink& sink,
                 TrackerOptions opts)
    : cri_(cri), index_(index), sink_(sink), opts_(opts), queue_(opts.workers) {}

Tracker::~Tracker() { stop(); }

void Tracker::stop() { queue_.stop(); }

void Tracker::set_inconsistency_handler(std::function<void(const std::string&)> fn) {
  std::lock_guard lk(mu_);
  on_inconsistency_ = std::move(fn);
}

void Tracker::inconsistent(const std::string& reason) {
  std::function<void(const std::string&)> fn;
  {
    std::lock_guard lk(mu_);
    fn = on_inconsistency_;
  }
  spdlog::warn("tracker: {}; reconciling", reason);
  if (fn) fn(reason);
}

void Tracker::adopt_identity(Record& rec, const Observation& obs) {
  rec.sandbox_known = true;
  if (obs.sandbox && !obs.pod_uid.empty()) sandbox_of_pod_[obs.pod_uid] = rec.identity.id;
  rec.identity.sandbox = obs.sandbox;
  if (!obs.pod_uid.empty()) rec.identity.pod_uid = obs.pod_uid;
  if (!obs.pod_name.empty()) rec.identity.pod_name = obs.pod_name;
  if (!obs.pod_namespace.empty()) rec.identity.pod_namespace = obs.pod_namespace;
  if (!obs.name.empty()) rec.identity.name = obs.name;
}

void Tracker::on_kernel_event(const kernel::KernelEvent& ev) {
  if (auto* mk = std::get_if<kernel::CgroupMkdir>(&ev.body)) {
    index_.on_mkdir(mk->cgroup_id, mk->path, mk->parent_cgroup_id);
    return;
  }
  auto entry = index_.lookup(ev.cgroup_id());
  if (std::holds_alternative<kernel::CgroupRmdir>(ev.body)) index_.on_rmdir(ev.cgroup_id());
  if (!entry) {
    if (!std::holds_alternative<kernel::CgroupRmdir>(ev.body)) {
      {
        std::lock_guard lk(mu_);
        ++stats_.unresolved_signals;
      }
      inconsistent("kernel " + std::string(ev.kind()) + " for unknown cgroup " +
                   std::to_string(ev.cgroup_id()));
    }
    return;
  }
  if (entry->identity.kind != cgroup::Kind::kContainerOrSandbox) return;
  const std::string id = entry->identity.container_id;
  const uint64_t ts = kernel::monotonic_to_realtime_ns(ev.ktime_ns);

  Want want;
  std::chrono::milliseconds first_look{0};
  {
    std::lock_guard lk(mu_);
    auto& rec = records_[id];
    if (rec.identity.id.empty()) {
      rec.identity.id = id;
      rec.identity.pod_uid = entry->identity.pod_uid;
    }
    if (rec.foreign) {
      ++stats_.foreign_signals;
      if (std::holds_alternative<kernel::CgroupRmdir>(ev.body)) {
        // Gone: let the sweep forget it.
        rec.reported = ContainerState::kNonExistent;
        rec.removed_at = Clock::now();
      }
      return;
    }
    if (std::holds_alternative<kernel::ProcessExec>(ev.body)) {
      rec.kernel_exec_seen = true;
      rec.kernel_start_ts = ts;
      want = Want::kRunning;
    } else if (std::holds_alternative<kernel::ProcessExit>(ev.body)) {
      rec.kernel_exit_ts = ts;
      want = Want::kExited;
    } else if (std::holds_alternative<kernel::OomKill>(ev.body)) {
      rec.oom_killed = true;  // the exit that follows says OOMKilled
      return;
    } else {  // rmdir: runc removes the cgroup after the init died; confirms a death
      if (rank(rec.reported) >= rank(ContainerState::kExited)) return;
      // A confirmation of the exit within its budget is on its way: it needs no help. One that
      // is past its budget (backing off) or none at all (the exit was never seen, e.g. the
      // init had moved to a child cgroup): look now.
      if (rec.kernel_exit_ts != 0 && rec.pending > 0 && !rec.confirm_overdue) return;
      if (rec.kernel_exit_ts == 0) rec.kernel_exit_ts = ts;
      want = Want::kExited;
    }
    ++rec.pending;
    ++stats_.kernel_signals;
    const bool sandbox = rec.sandbox_known ? rec.identity.sandbox
                                           : !pod_has_live_sandbox(rec.identity.pod_uid);
    first_look = (want == Want::kRunning ? start_lag_ : exit_lag_)[sandbox].first_look();
  }
  const auto now = Clock::now();
  const auto deadline = now + opts_.confirm_budget;
  queue_.post(
      queue_key(entry->identity.pod_uid, id),
      [this, id, want, deadline, now] {
        confirm(id, want, opts_.confirm_retry_first, deadline, now, Clock::duration(-1));
      },
      now + first_look);
}

namespace {

Result<Tracker::Observation> look_container(cri::CriClient& cri, const std::string& id) {
  auto st = cri.container_status(id);
  if (!st) return st.error();
  Tracker::Observation obs;
  obs.snapshot = from_status(*st);
  obs.state = obs.snapshot.state;
  obs.name = container_name(*st);
  auto pod = pod_identity(*st, nullptr);
  obs.pod_uid = pod.uid;
  obs.pod_name = pod.name;
  obs.pod_namespace = pod.namespace_;
  return obs;
}

Result<Tracker::Observation> look_sandbox(cri::CriClient& cri, const std::string& id) {
  auto ps = cri.pod_sandbox_status(id);
  if (!ps) return ps.error();
  Tracker::Observation obs;
  obs.sandbox = true;
  obs.snapshot = from_status(*ps);
  obs.state = obs.snapshot.state;
  auto pod = pod_identity(*ps);
  obs.pod_uid = pod.uid;
  obs.pod_name = pod.name;
  obs.pod_namespace = pod.namespace_;
  return obs;
}

}  // namespace

Result<Tracker::Observation> Tracker::observe(const std::string& id, bool sandbox_known,
                                              bool sandbox) {
  // An id of unknown kind is looked up with the likelier call first (`sandbox` is then the
  // guess) and with the other one only when the runtime does not know it as that.
  for (int attempt = 0; attempt < (sandbox_known ? 1 : 2); ++attempt) {
    const bool as_sandbox = attempt == 0 ? sandbox : !sandbox;
    auto obs = as_sandbox ? look_sandbox(cri_, id) : look_container(cri_, id);
    if (obs || !is_not_found(obs.error())) return obs;
  }
  Observation gone;
  gone.state = gone.snapshot.state = ContainerState::kNonExistent;
  gone.sandbox = sandbox;
  return gone;
}

void Tracker::confirm(const std::string& id, Want want, std::chrono::milliseconds delay,
                      Clock::time_point deadline, Clock::time_point signal_at,
                      Clock::duration last_miss) {
  const int want_rank = want == Want::kRunning ? 1 : 2;
  bool sandbox_known, sandbox, known;
  {
    std::lock_guard lk(mu_);
    auto& rec = records_[id];
    // Another path got there first (a later signal's confirmation, a reconcile, a death that
    // came before the start could be confirmed): nothing left to confirm.
    if (rank(rec.reported) >= want_rank) {
      --rec.pending;
      return;
    }
    sandbox_known = rec.sandbox_known;
    // Of unknown kind: the first id of a pod without a live sandbox is most likely its sandbox.
    sandbox = sandbox_known ? rec.identity.sandbox : !pod_has_live_sandbox(rec.identity.pod_uid);
    known = !rec.identity.pod_name.empty();  // the runtime reported it before
  }
  const auto look = Clock::now() - signal_at;
  auto obs = observe(id, sandbox_known, sandbox);
  note_call(id, obs.ok() ? nullptr : &obs.error());

  // A start the runtime does not know yet (RunPodSandbox/StartContainer still in progress, the
  // id not in its store) is not a removal: wait for it like for any other lag. One it knew and
  // no longer has is settled: it is gone.
  const bool unknown_start = want == Want::kRunning && obs.ok() &&
                             obs->state == ContainerState::kNonExistent && !known;
  const bool settled = obs.ok() && rank(obs->state) >= want_rank && !unknown_start;
  const auto now = Clock::now();
  if (unknown_start && now - signal_at >= opts_.foreign_after) {
    std::lock_guard lk(mu_);
    auto& rec = records_[id];
    if (rank(rec.reported) == 0 && rec.identity.pod_name.empty()) {
      // Still unknown long after its start: not this runtime's container. Not an
      // inconsistency either, so no reconcile; its later signals are ignored.
      --rec.pending;
      rec.foreign = true;
      ++stats_.foreign_containers;
      spdlog::info(
          "tracker: {} started in a tracked cgroup but the runtime does not know it "
          "(another runtime's container?): ignoring its kernel signals",
          id.substr(0, 12));
      return;
    }
  }
  if (!settled) {
    // The runtime has not caught up with the kernel yet (or did not answer): look again.
    // Short steps first: the runtime usually catches up within tens of milliseconds, and a long
    // step would add its overshoot to the detection latency. A start the runtime does not know
    // at all yet (a sandbox still being set up, or another runtime's container) is waited for
    // less eagerly. Past the budget, the looks back off but never stop: a confirmation that is
    // dropped is an event missed until the next reconcile.
    std::chrono::milliseconds next;
    std::string pod;
    {
      std::lock_guard lk(mu_);
      auto& rec = records_[id];
      ++stats_.confirm_retries;
      if (now + delay < deadline) {
        next = std::min(delay * 2, std::chrono::milliseconds(unknown_start ? 200 : 20));
      } else {
        if (!rec.confirm_overdue) {
          rec.confirm_overdue = true;
          ++stats_.confirm_failures;
          const auto after =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - signal_at).count();
          const char* what = want == Want::kRunning ? "start" : "exit";
          if (obs.ok()) {
            spdlog::warn("tracker: the runtime still reports {} for {} {} ms after a kernel {}; "
                         "looking again, less often",
                         to_string(obs->state), id.substr(0, 12), after, what);
          } else {
            spdlog::warn("tracker: no answer from the runtime for {} {} ms after a kernel {} "
                         "({}); looking again, less often",
                         id.substr(0, 12), after, what, obs.error().message);
          }
        }
        next = std::clamp(delay * 2, std::chrono::milliseconds(500), opts_.confirm_backoff_max);
      }
      pod = rec.identity.pod_uid;
    }
    queue_.post(
        queue_key(pod, id),
        [this, id, want, next, deadline, signal_at, look] {
          confirm(id, want, next, deadline, signal_at, look);
        },
        now + delay);
    return;
  }

  std::lock_guard lk(mu_);
  auto& rec = records_[id];
  --rec.pending;
  if (rec.pending == 0) rec.confirm_overdue = false;
  adopt_identity(rec, *obs);
  std::optional<std::chrono::milliseconds> miss;
  if (last_miss >= Clock::duration::zero())
    miss = std::chrono::duration_cast<std::chrono::milliseconds>(last_miss);
  (want == Want::kRunning ? start_lag_ : exit_lag_)[obs->sandbox].settled(miss);
  if (advance(rec, obs->state, obs->snapshot, EventSource::kKernel, false) > 0)
    ++stats_.confirmations;
}

bool Tracker::pod_has_live_sandbox(const std::string& pod_uid) const {
  if (pod_uid.empty()) return false;
  auto it = sandbox_of_pod_.find(pod_uid);
  if (it == sandbox_of_pod_.end()) return false;
  auto rec = records_.find(it->second);
  return rec != records_.end() && rank(rec->second.reported) < rank(ContainerState::kExited);
}

int Tracker::advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
                     EventSource source, bool correction) {
  const ContainerState from = rec.reported;
  if (rank(target) <= rank(from)) return 0;
  if (target == ContainerState::kNonExistent) rec.removed_at = Clock::now();
  // Gone before the runtime ever reported it to us: nothing a consumer could have seen.
  if (target == ContainerState::kNonExistent && rank(from) == 0 && rec.identity.pod_name.empty()) {
    rec.reported = target;
    return 0;
  }
  rec.foreign = false;  // the runtime reports it: it is this runtime's after all

  std::vector<EventType> types;
  switch (target) {
    case ContainerState::kRunning:
      types = {EventType::kContainerStarted};
      break;
    case ContainerState::kExited:
      // The kernel saw it start though no one reported it running (it lived for
      // milliseconds): report the start too, the runtime's started_at backs it.
      if (rank(from) == 0 && rec.kernel_exec_seen && snap.started_at_ns != 0) {
        types = {EventType::kContainerStarted, EventType::kContainerDied};
      } else {
        types = {EventType::kContainerDied};
      }
      break;
    case ContainerState::kNonExistent:
      types = from == ContainerState::kExited
                  ? std::vector<EventType>{EventType::kContainerRemoved}
                  : std::vector<EventType>{EventType::kContainerDied, EventType::kContainerRemoved};
      break;
    default:
      return 0;  // created/unknown: ContainerChanged, never sent
  }
  rec.reported = target;
  rec.status = snap;

  for (EventType t : types) {
    PodLifecycleEvent ev;
    ev.type = t;
    ev.pod_uid = rec.identity.pod_uid;
    ev.pod_name = rec.identity.pod_name;
    ev.pod_namespace = rec.identity.pod_namespace;
    ev.container_id = rec.identity.id;
    ev.container_name = rec.identity.name;
    ev.sandbox = rec.identity.sandbox;
    ev.source = source;
    ev.correction = correction;
    ev.status = snap;
    if (t == EventType::kContainerStarted) {
      ev.kernel_ts_ns = source == EventSource::kKernel ? rec.kernel_start_ts : 0;
    } else if (t == EventType::kContainerDied) {
      ev.kernel_ts_ns = source == EventSource::kKernel ? rec.kernel_exit_ts : 0;
      ev.exit_code = snap.exit_code;
      ev.reason = snap.reason;
      if (rec.oom_killed && ev.reason.empty()) ev.reason = "OOMKilled";
    }
    ev.emit_ts_ns = realtime_now_ns();
    if (correction) ++stats_.corrections[to_string(t)];
    sink_.publish(std::move(ev));
  }
  if (target == ContainerState::kExited) join_removal_sweep(rec);
  if (target == ContainerState::kNonExistent) rec.removal_swept = false;
  return int(types.size());
}

void Tracker::check_removed(const std::string& id) {
  bool sandbox;
  {
    std::lock_guard lk(mu_);
    auto it = records_.find(id);
    if (it == records_.end() || it->second.reported == ContainerState::kNonExistent) return;
    sandbox = it->second.identity.sandbox;
    ++stats_.removal_checks;
  }
  auto obs = observe(id, true, sandbox);
  note_call(id, obs.ok() ? nullptr : &obs.error());
  if (!obs.ok() || obs->state != ContainerState::kNonExistent) return;  // the sweep goes on
  std::lock_guard lk(mu_);
  advance(records_[id], ContainerState::kNonExistent, obs->snapshot, EventSource::kKernel, false);
}

void Tracker::join_removal_sweep(Record& rec) {
  rec.removal_swept = true;
  sweep_joined_ = true;
  const auto now = Clock::now();
  if (!sweep_due_) {
    sweep_interval_ = opts_.removal_sweep_period;
    schedule_removal_sweep(now + opts_.removal_sweep_first);
  } else {
    schedule_removal_sweep(now + opts_.removal_sweep_period);  // no later than that
  }
}

void Tracker::schedule_removal_sweep(Clock::time_point at) {
  if (sweep_due_ && *sweep_due_ <= at) return;
  // A sweep posted for later becomes a no-op when it finds sweep_due_ changed.
  sweep_due_ = at;
  queue_.post(kRemovalSweepKey, [this, at] { removal_sweep(at); }, at);
}

void Tracker::removal_sweep(Clock::time_point due) {
  bool containers = false, sandboxes = false, joined = false;
  {
    std::lock_guard lk(mu_);
    if (sweep_due_ != due) return;  // superseded by an earlier sweep
    sweep_due_.reset();
    joined = std::exchange(sweep_joined_, false);
    for (const auto& [id, rec] : records_) {
      if (!rec.removal_swept) continue;
      (rec.identity.sandbox ? sandboxes : containers) = true;
    }
  }
  // Full lists, not ones filtered by state: a container the runtime reloaded as UNKNOWN (after
  // a restart that could not read its status) is not listed as exited but still exists. What a
  // full list leaves out, the runtime no longer has: that is the evidence the kubelet's relist
  // takes for ContainerRemoved too.
  std::set<std::string> still_there;
  auto collect = [&](const auto& listed_ids) {
    if (!listed_ids) {
      spdlog::debug("tracker: removal sweep: {}", listed_ids.error().message);
      return false;
    }
    for (const auto& item : *listed_ids) still_there.insert(item.id());
    return true;
  };
  bool listed = true;
  if (containers) listed = collect(cri_.list_containers({}));
  if (sandboxes && listed) listed = collect(cri_.list_pod_sandboxes({}));
  std::lock_guard lk(mu_);
  stats_.removal_sweeps += uint64_t(containers) + uint64_t(sandboxes);
  size_t watched = 0, removed = 0;
  bool remaining = false;
  for (auto& [id, rec] : records_) {
    if (!rec.removal_swept) continue;
    // Judge only the kinds listed above: a record may have joined since.
    const bool kind_listed = rec.identity.sandbox ? sandboxes : containers;
    if (listed && kind_listed && rec.reported == ContainerState::kExited &&
        !still_there.count(id)) {
      ContainerSnapshot gone;
      gone.state = ContainerState::kNonExistent;
      advance(rec, ContainerState::kNonExistent, gone, EventSource::kKernel, false);
      ++removed;
    }
    ++watched;
    if (rec.reported == ContainerState::kNonExistent) {
      rec.removal_swept = false;
    } else {
      remaining = true;
    }
  }
  spdlog::debug("tracker: removal sweep: {} exited watched, {} removed{}", watched, removed,
                listed ? "" : " (the list failed: next sweep)");
  if (!remaining) return;
  // While containers die and go, one sweep a period answers for all of them; while nothing
  // changes (long-exited containers only: init containers, finished jobs, the dead instance
  // the kubelet keeps for its logs), less and less often.
  sweep_interval_ = removed > 0 || joined
                        ? opts_.removal_sweep_period
                        : std::min(sweep_interval_ * 2, opts_.removal_sweep_idle_max);
  schedule_removal_sweep(Clock::now() + sweep_interval_);
}

std::map<std::string, Tracker::Observation> Tracker::inspect(
    const std::vector<RuntimeContainer>& view) {
  std::map<std::string, Observation> out;
  for (const auto& rc : view) {
    if (rank(rc.state) == 0) continue;  // nothing to emit for created/unknown
    {
      std::lock_guard lk(mu_);
      auto it = records_.find(rc.id);
      if (it != records_.end() && rank(it->second.reported) >= rank(rc.state)) continue;
    }
    auto obs = observe(rc.id, true, rc.sandbox);
    note_call(rc.id, obs.ok() ? nullptr : &obs.error());
    if (obs) out.emplace(rc.id, std::move(*obs));
  }
  return out;
}

void Tracker::reconcile(const std::vector<RuntimeContainer>& view, bool initial) {
  std::map<std::string, Observation> inspected;
  if (initial) inspected = inspect(view);
  std::map<std::string, const RuntimeContainer*> seen;
  for (const auto& rc : view) seen[rc.id] = &rc;

  std::lock_guard lk(mu_);
  // A difference may be a kernel event still on its way: look again after a grace period with
  // a targeted call before calling it a correction. At start-up, a container missing from the
  // list may have been made after the list was taken: a look, never an event from the list.
  auto look_again = [&](const std::string& id, const Record& rec) {
    const bool correction = !initial;
    queue_.post(
        queue_key(rec.identity.pod_uid, id),
        [this, id, correction] { recheck(id, std::chrono::milliseconds(1000), correction); },
        Clock::now() + (initial ? std::chrono::milliseconds(0) : opts_.correction_grace));
  };
  for (const auto& rc : view) {
    auto& rec = records_[rc.id];
    bool fresh = rec.identity.id.empty();
    if (fresh || rec.identity.pod_name.empty()) {
      auto reported = rec.identity.id.empty() ? ContainerState::kUnknown : rec.reported;
      rec.identity = rc;
      rec.reported = reported;
    }
    rec.sandbox_known = true;
    rec.identity.sandbox = rc.sandbox;
    if (rc.sandbox) sandbox_of_pod_[rc.pod_uid] = rc.id;
    if (rank(rc.state) <= rank(rec.reported)) continue;
    if (initial) {
      // With the runtime's status, as inspected above (the bare list state if that failed).
      auto it = inspected.find(rc.id);
      ContainerSnapshot snap;
      snap.state = rc.state;
      if (it != inspected.end()) snap = it->second.snapshot;
      advance(rec, snap.state, snap, EventSource::kReconcile, false);
    } else if (rec.pending == 0) {
      look_again(rc.id, rec);
    }
  }
  // Tracked containers the runtime no longer lists.
  for (auto& [id, rec] : records_) {
    if (seen.count(id) || rec.reported == ContainerState::kNonExistent) continue;
    if (rec.identity.pod_name.empty() && rank(rec.reported) == 0) continue;  // never known
    if (rec.reported == ContainerState::kExited && !initial) {
      // Removals of exited containers have no kernel signal: the removal sweep finds them. A
      // relist that comes first is not a correction; it only makes the removal path look now
      // (a list taken before the container was created would not show it either, hence the
      // look).
      queue_.post(queue_key(rec.identity.pod_uid, id), [this, id] { check_removed(id); });
    } else if (rec.pending == 0 || initial) {
      look_again(id, rec);
    }
  }
  sweep_removed();
}

void Tracker::sweep_removed() {
  const auto now = Clock::now();
  for (auto it = records_.begin(); it != records_.end();) {
    const Record& rec = it->second;
    bool expired = rec.reported == ContainerState::kNonExistent && rec.pending == 0 &&
                   now - rec.removed_at >= opts_.removed_retention;
    if (!expired) {
      ++it;
      continue;
    }
    if (auto s = sandbox_of_pod_.find(rec.identity.pod_uid);
        s != sandbox_of_pod_.end() && s->second == it->first)
      sandbox_of_pod_.erase(s);
    it = records_.erase(it);
  }
}

void Tracker::recheck(const std::string& id, std::chrono::milliseconds retry, bool correction) {
  bool sandbox;
  std::string pod;
  {
    std::lock_guard lk(mu_);
    auto it = records_.find(id);
    if (it == records_.end()) return;  // removed and forgotten meanwhile
    auto& rec = it->second;
    if (rec.pending > 0 && correction) return;  // the kernel path has it
    sandbox = rec.identity.sandbox;
    pod = rec.identity.pod_uid;
  }
  auto obs = observe(id, true, sandbox);
  note_call(id, obs.ok() ? nullptr : &obs.error());
  if (!obs) {
    // The runtime does not answer for this pod (hung, erroring): keep asking, less and less
    // often, rather than leaving a known difference to the next periodic reconcile.
    auto next = std::min(retry * 2, std::chrono::milliseconds(30'000));
    queue_.post(
        queue_key(pod, id), [this, id, next, correction] { recheck(id, next, correction); },
        Clock::now() + retry);
    return;
  }
  std::lock_guard lk(mu_);
  auto& rec = records_[id];
  if (rec.pending > 0 && correction) return;
  adopt_identity(rec, *obs);
  if (advance(rec, obs->state, obs->snapshot, EventSource::kReconcile, correction) > 0 &&
      correction) {
    spdlog::warn("reconcile corrected {} {}/{} to {}",
                 rec.identity.sandbox ? "sandbox" : "container", rec.identity.pod_namespace,
                 rec.identity.pod_name, to_string(obs->state));
  }
}

TrackerStats Tracker::stats() const {
  std::lock_guard lk(mu_);
  TrackerStats st = stats_;
  st.records = records_.size();
  return st;
}

std::vector<TrackedContainer> Tracker::containers() const {
  return containers_at([] { return uint64_t(0); }).second;
}

std::pair<uint64_t, std::vector<TrackedContainer>> Tracker::containers_at(
    const std::function<uint64_t()>& seq_now) const {
  std::lock_guard lk(mu_);
  std::vector<TrackedContainer> out;
  for (const auto& [id, rec] : records_) {
    // Only what the runtime confirmed: a cgroup the runtime does not know (another runtime's
    // container, a start not yet confirmed) is not a container of this node's pods yet.
    if (rec.reported == ContainerState::kNonExistent || rank(rec.reported) == 0) continue;
    TrackedContainer tc;
    tc.identity = rec.identity;
    tc.identity.state = rec.reported;
    tc.status = rec.status;
    tc.oom_killed = rec.oom_killed;
    out.push_back(std::move(tc));
  }
  return {seq_now(), std::move(out)};
}

void Tracker::note_call(const std::string& id, const Error* error) {
  std::lock_guard lk(mu_);
  auto it = records_.find(id);
  const std::string pod = it == records_.end() || it->second.identity.pod_uid.empty()
                              ? id
                              : it->second.identity.pod_uid;
  if (!error) {
    troubles_.erase(pod);
    return;
  }
  auto [t, fresh] = troubles_.try_emplace(pod);
  if (fresh) t->second.since = Clock::now();
  ++t->second.failures;
  t->second.last_error = error->message;
}

std::vector<Tracker::PodTrouble> Tracker::troubled_pods() const {
  std::lock_guard lk(mu_);
  std::vector<PodTrouble> out;
  auto now = Clock::now();
  for (const auto& [pod, t] : troubles_)
    out.push_back({pod, t.failures, now - t.since, t.last_error});
  return out;
}

}  // namespace kpleg::pleg
