#include "pleg/tracker.h"

#include "pleg/runtime_view.h"

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

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
  rec.identity.sandbox = obs.sandbox;
  if (!obs.pod_uid.empty()) rec.identity.pod_uid = obs.pod_uid;
  if (!obs.pod_name.empty()) rec.identity.pod_name = obs.pod_name;
  if (!obs.pod_namespace.empty()) rec.identity.pod_namespace = obs.pod_namespace;
  if (!obs.name.empty()) rec.identity.name = obs.name;
}

void Tracker::on_kernel_event(const kernel::KernelEvent& ev) {
  if (auto* mk = std::get_if<kernel::CgroupMkdir>(&ev.body)) {
    index_.on_mkdir(mk->cgroup_id, mk->path);
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
      if (rank(rec.reported) >= rank(ContainerState::kExited) || rec.kernel_exit_ts != 0) return;
      rec.kernel_exit_ts = ts;
      want = Want::kExited;
    }
    ++rec.pending;
    ++stats_.kernel_signals;
    first_look = want == Want::kRunning ? start_lag_.first_look() : exit_lag_.first_look();
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

Result<Tracker::Observation> Tracker::observe(const std::string& id, bool sandbox_known,
                                              bool sandbox) {
  Observation obs;
  if (!sandbox_known || !sandbox) {
    auto st = cri_.container_status(id);
    if (st) {
      obs.snapshot = from_status(*st);
      obs.state = obs.snapshot.state;
      obs.name = container_name(*st);
      auto pod = pod_identity(*st, nullptr);
      obs.pod_uid = pod.uid;
      obs.pod_name = pod.name;
      obs.pod_namespace = pod.namespace_;
      return obs;
    }
    if (!is_not_found(st.error())) return st.error();
    if (sandbox_known) {
      obs.state = obs.snapshot.state = ContainerState::kNonExistent;
      return obs;
    }
  }
  auto ps = cri_.pod_sandbox_status(id);
  if (!ps) {
    if (!is_not_found(ps.error())) return ps.error();
    obs.state = obs.snapshot.state = ContainerState::kNonExistent;
    obs.sandbox = sandbox;
    return obs;
  }
  obs.sandbox = true;
  obs.snapshot = from_status(*ps);
  obs.state = obs.snapshot.state;
  auto pod = pod_identity(*ps);
  obs.pod_uid = pod.uid;
  obs.pod_name = pod.name;
  obs.pod_namespace = pod.namespace_;
  return obs;
}

void Tracker::confirm(const std::string& id, Want want, std::chrono::milliseconds delay,
                      Clock::time_point deadline, Clock::time_point signal_at,
                      Clock::duration last_miss) {
  const int want_rank = want == Want::kRunning ? 1 : 2;
  bool sandbox_known, sandbox;
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
    sandbox = rec.identity.sandbox;
  }
  const auto look = Clock::now() - signal_at;
  auto obs = observe(id, sandbox_known, sandbox);
  note_call(id, obs.ok() ? nullptr : &obs.error());

  // A start the runtime does not know yet (RunPodSandbox/StartContainer still in progress, the
  // id not in its store) is not a removal: wait for it like for any other lag.
  const bool unknown_start =
      want == Want::kRunning && obs.ok() && obs->state == ContainerState::kNonExistent;
  const bool settled = obs.ok() && rank(obs->state) >= want_rank && !unknown_start;
  if (unknown_start && Clock::now() - signal_at >= opts_.foreign_after) {
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
  if (!settled && Clock::now() + delay < deadline) {
    // The runtime has not caught up with the kernel yet (or did not answer): try again soon.
    {
      std::lock_guard lk(mu_);
      ++stats_.confirm_retries;
    }
    // Short steps: the runtime usually catches up within tens of milliseconds, and a long
    // step would add its overshoot to the detection latency. A start the runtime does not know
    // at all yet (a sandbox still being set up, or another runtime's container) is waited for
    // less eagerly.
    auto next = std::min(delay * 2, std::chrono::milliseconds(unknown_start ? 200 : 20));
    std::string pod;
    {
      std::lock_guard lk(mu_);
      pod = records_[id].identity.pod_uid;
    }
    queue_.post(
        queue_key(pod, id),
        [this, id, want, next, deadline, signal_at, look] {
          confirm(id, want, next, deadline, signal_at, look);
        },
        Clock::now() + delay);
    return;
  }

  std::unique_lock lk(mu_);
  auto& rec = records_[id];
  --rec.pending;
  if (!obs.ok()) {
    ++stats_.confirm_failures;
    lk.unlock();
    inconsistent("could not confirm " + id.substr(0, 12) + ": " + obs.error().message);
    return;
  }
  adopt_identity(rec, *obs);
  if (!settled) {
    // The runtime still reports the old state after the whole budget: let a relist decide.
    ++stats_.confirm_failures;
    lk.unlock();
    inconsistent("runtime still reports " + std::string(to_string(obs->state)) + " for " +
                 id.substr(0, 12) + " after a kernel " +
                 (want == Want::kRunning ? "start" : "exit"));
    return;
  }
  std::optional<std::chrono::milliseconds> miss;
  if (last_miss >= Clock::duration::zero())
    miss = std::chrono::duration_cast<std::chrono::milliseconds>(last_miss);
  (want == Want::kRunning ? start_lag_ : exit_lag_).settled(miss);
  if (advance(rec, obs->state, obs->snapshot, EventSource::kKernel, false) > 0)
    ++stats_.confirmations;
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
  if (target == ContainerState::kExited) schedule_removal_check(rec);
  if (target == ContainerState::kNonExistent) rec.removal_scheduled = rec.removal_swept = false;
  return int(types.size());
}

void Tracker::schedule_removal_check(Record& rec) {
  if (rec.removal_scheduled) return;
  rec.removal_scheduled = true;
  rec.removal_backoff = opts_.removal_check_first;
  const std::string id = rec.identity.id;
  queue_.post(
      queue_key(rec.identity.pod_uid, id), [this, id] { check_removed(id); },
      Clock::now() + rec.removal_backoff);
}

void Tracker::check_removed(const std::string& id, bool follow_up) {
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
  std::lock_guard lk(mu_);
  auto& rec = records_[id];
  if (obs.ok() && obs->state == ContainerState::kNonExistent) {
    advance(rec, ContainerState::kNonExistent, obs->snapshot, EventSource::kKernel, false);
    return;
  }
  if (!follow_up) return;
  // Still there (or the runtime did not answer): look again later, less often, and after the
  // check at the longest interval, together with every other long-exited container.
  if (rec.removal_backoff >= opts_.removal_check_max) {
    join_removal_sweep(rec);
    return;
  }
  rec.removal_backoff = std::min(rec.removal_backoff * 2, opts_.removal_check_max);
  queue_.post(
      queue_key(rec.identity.pod_uid, id), [this, id] { check_removed(id); },
      Clock::now() + rec.removal_backoff);
}

void Tracker::join_removal_sweep(Record& rec) {
  rec.removal_swept = true;
  if (removal_sweep_scheduled_) return;
  removal_sweep_scheduled_ = true;
  queue_.post(
      kRemovalSweepKey, [this] { removal_sweep(); }, Clock::now() + opts_.removal_sweep_period);
}

void Tracker::removal_sweep() {
  bool containers = false, sandboxes = false;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, rec] : records_) {
      if (!rec.removal_swept) continue;
      (rec.identity.sandbox ? sandboxes : containers) = true;
    }
  }
  // Exited is final in the CRI: an exited container that is no longer listed as exited has
  // been removed.
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
  if (containers) {
    v1::ContainerFilter f;
    f.mutable_state()->set_state(v1::CONTAINER_EXITED);
    listed = collect(cri_.list_containers(f));
  }
  if (sandboxes && listed) {
    v1::PodSandboxFilter f;
    f.mutable_state()->set_state(v1::SANDBOX_NOTREADY);
    listed = collect(cri_.list_pod_sandboxes(f));
  }
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
  spdlog::debug("tracker: removal sweep: {} long-exited watched, {} removed{}", watched, removed,
                listed ? "" : " (the list failed: next sweep)");
  if (!remaining) {
    removal_sweep_scheduled_ = false;
    return;
  }
  queue_.post(
      kRemovalSweepKey, [this] { removal_sweep(); }, Clock::now() + opts_.removal_sweep_period);
}

void Tracker::reconcile(const std::vector<RuntimeContainer>& view, bool initial) {
  std::map<std::string, const RuntimeContainer*> seen;
  for (const auto& rc : view) seen[rc.id] = &rc;

  std::lock_guard lk(mu_);
  // A difference may be a kernel event still on its way: look again after a grace period with
  // a targeted call before calling it a correction.
  auto recheck = [&](const std::string& id, const Record& rec) {
    queue_.post(
        queue_key(rec.identity.pod_uid, id),
        [this, id] { recheck_correction(id, std::chrono::milliseconds(1000)); },
        Clock::now() + opts_.correction_grace);
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
    if (rank(rc.state) <= rank(rec.reported)) continue;
    if (initial) {
      ContainerSnapshot snap;
      snap.state = rc.state;
      advance(rec, rc.state, snap, EventSource::kReconcile, false);
    } else if (rec.pending == 0) {
      recheck(rc.id, rec);
    }
  }
  // Tracked containers the runtime no longer lists.
  for (auto& [id, rec] : records_) {
    if (seen.count(id) || rec.reported == ContainerState::kNonExistent) continue;
    if (rec.identity.pod_name.empty() && rank(rec.reported) == 0) continue;  // never known
    if (initial) {
      advance(rec, ContainerState::kNonExistent, {ContainerState::kNonExistent},
              EventSource::kReconcile, false);
    } else if (rec.reported == ContainerState::kExited) {
      // Removals of exited containers have no kernel signal: the removal checks and sweep
      // find them, within removal_check_max. A relist that comes first is not a correction;
      // it only tells the removal path to look now (a list taken before the container was
      // created would not show it either, hence the look).
      queue_.post(queue_key(rec.identity.pod_uid, id), [this, id] { check_removed(id, false); });
    } else if (rec.pending == 0) {
      recheck(id, rec);
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
    it = expired ? records_.erase(it) : std::next(it);
  }
}

void Tracker::recheck_correction(const std::string& id, std::chrono::milliseconds retry) {
  bool sandbox;
  std::string pod;
  {
    std::lock_guard lk(mu_);
    auto it = records_.find(id);
    if (it == records_.end()) return;  // removed and forgotten meanwhile
    auto& rec = it->second;
    if (rec.pending > 0) return;  // the kernel path has it
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
        queue_key(pod, id), [this, id, next] { recheck_correction(id, next); },
        Clock::now() + retry);
    return;
  }
  std::lock_guard lk(mu_);
  auto& rec = records_[id];
  if (rec.pending > 0) return;
  adopt_identity(rec, *obs);
  if (advance(rec, obs->state, obs->snapshot, EventSource::kReconcile, true) > 0) {
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
