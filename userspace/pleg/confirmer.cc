#include "pleg/confirmer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

namespace kpleg::pleg {

using std::chrono::milliseconds;

void Confirmer::on_signal(const std::string& id, const std::string& pod_uid, Signal signal,
                          uint64_t ts_ns) {
  std::lock_guard lk(core_.mu);
  Record& rec = core_.table.at(id, pod_uid);
  if (rec.foreign) {
    ++core_.stats.foreign_signals;
    if (signal == Signal::kRmdir) {
      // Gone: let the retention forget it.
      rec.reported = ContainerState::kNonExistent;
      rec.removed_at = Clock::now();
    }
    return;
  }
  Anchor anchor = Anchor::kExec;
  switch (signal) {
    case Signal::kExec:
      rec.kernel_exec_seen = true;
      rec.kernel_start_ts = ts_ns;
      break;
    case Signal::kExit:
    case Signal::kExitOom:
      rec.kernel_exit_ts = ts_ns;
      rec.exit_signal_at = Clock::now();
      // The Died event says OOMKilled unless the runtime gives its own reason.
      if (signal == Signal::kExitOom) rec.oom_killed = true;
      anchor = Anchor::kExit;
      break;
    case Signal::kRmdir:
      // runc removes the cgroup after the init died: it confirms a death, and the runtime
      // records the death shortly after. Its chain replaces the exit's, wherever that is
      // (waiting for its first look, retrying, or backing off past its budget).
      if (rank(rec.reported) >= rank(ContainerState::kExited)) return;
      if (rec.kernel_exit_ts == 0) rec.kernel_exit_ts = ts_ns;
      anchor = Anchor::kRmdir;
      break;
  }
  start_chain(rec, pod_uid, anchor);
}

void Confirmer::start_chain(Record& rec, const std::string& pod_uid, Anchor anchor) {
  uint32_t chain = 0;
  if (anchor != Anchor::kExec) {
    chain = ++rec.death_chain;
    rec.confirm_overdue = false;  // a fresh chain, within its budget
  }
  ++rec.pending;
  ++core_.stats.kernel_signals;
  const auto now = Clock::now();
  const auto first_look = learner(anchor, core_.table.likely_sandbox(rec)).first_look();
  const auto deadline = now + core_.opts.confirm_budget;
  const std::string id = rec.identity.id;
  core_.post(
      pod_uid, id,
      [this, id, anchor, chain, deadline, now] {
        confirm(id, anchor, chain, core_.opts.confirm_retry_first, deadline, now,
                Clock::duration(-1));
      },
      now + first_look);
}

void Confirmer::confirm(const std::string& id, Anchor anchor, uint32_t chain, milliseconds delay,
                        Clock::time_point deadline, Clock::time_point signal_at,
                        Clock::duration last_miss) {
  const Want want = want_of(anchor);
  const int want_rank = want == Want::kRunning ? 1 : 2;
  bool kind_known, sandbox, known;
  {
    std::lock_guard lk(core_.mu);
    Record& rec = core_.table.at(id);
    // Another path got there first (a later signal's confirmation, a reconcile, a death that
    // came before the start could be confirmed), or a later chain took over: nothing to do.
    if (rank(rec.reported) >= want_rank || (want == Want::kExited && chain != rec.death_chain)) {
      --rec.pending;
      return;
    }
    kind_known = rec.sandbox_known;
    sandbox = core_.table.likely_sandbox(rec);
    known = rec.known();
  }
  const auto look = Clock::now() - signal_at;
  auto obs = core_.look(id, kind_known, sandbox);

  // A start the runtime does not know yet (RunPodSandbox/StartContainer still in progress, the
  // id not in its store) is not a removal: wait for it like for any other lag. One it knew and
  // no longer has is settled: it is gone.
  const bool unknown_start = want == Want::kRunning && obs.ok() &&
                             obs->state == ContainerState::kNonExistent && !known;
  const bool settled = obs.ok() && rank(obs->state) >= want_rank && !unknown_start;
  const auto now = Clock::now();

  TrackerCore::Lock lk(core_.mu);
  Record& rec = core_.table.at(id);
  if (unknown_start && now - signal_at >= core_.opts.foreign_after && rank(rec.reported) == 0 &&
      !rec.known()) {
    // Still unknown long after its start: not this runtime's container. Not an inconsistency
    // either, so no reconcile; its later signals are ignored.
    --rec.pending;
    rec.foreign = true;
    ++core_.stats.foreign_containers;
    lk.unlock();
    spdlog::info("tracker: {} started in a tracked cgroup but the runtime does not know it "
                 "(another runtime's container?): ignoring its kernel signals",
                 id.substr(0, 12));
    return;
  }
  if (!settled) {
    const auto next = next_delay(rec, want, delay, deadline, signal_at, unknown_start, obs);
    const std::string pod = rec.identity.pod_uid;
    lk.unlock();
    core_.post(
        pod, id,
        [this, id, anchor, chain, next, deadline, signal_at, look] {
          confirm(id, anchor, chain, next, deadline, signal_at, look);
        },
        now + delay);
    return;
  }

  --rec.pending;
  if (rec.pending == 0) rec.confirm_overdue = false;
  core_.table.adopt_identity(rec, *obs);
  std::optional<milliseconds> miss;
  if (last_miss >= Clock::duration::zero())
    miss = std::chrono::duration_cast<milliseconds>(last_miss);
  learner(anchor, obs->sandbox).settled(miss);
  if (anchor == Anchor::kRmdir && rec.exit_signal_at != Clock::time_point{}) {
    // The exit's chain gave way to this one: it learns when the death was there after the
    // exit, so that it looks after the rmdir's chain and, as long as an rmdir comes, not at all.
    learner(Anchor::kExit, obs->sandbox)
        .found_by_other(std::chrono::duration_cast<milliseconds>(now - rec.exit_signal_at));
  }
  Events out;
  if (core_.advance(rec, obs->state, obs->snapshot, EventSource::kKernel, false, out) > 0)
    ++core_.stats.confirmations;
  core_.publish(lk, out);
}

milliseconds Confirmer::next_delay(Record& rec, Want want, milliseconds delay,
                                   Clock::time_point deadline, Clock::time_point signal_at,
                                   bool unknown_start, const Result<Observation>& obs) {
  // The runtime has not caught up with the kernel yet (or did not answer): look again. Short
  // steps first: the runtime usually catches up within tens of milliseconds, and a long step
  // would add its overshoot to the detection latency. A start the runtime does not know at all
  // yet (a sandbox still being set up, or another runtime's container) is waited for less
  // eagerly. Past the budget, the looks back off but never stop: a confirmation that is
  // dropped is an event missed until the next reconcile.
  const auto now = Clock::now();
  ++core_.stats.confirm_retries;
  if (now + delay < deadline) return std::min(delay * 2, milliseconds(unknown_start ? 200 : 20));
  if (!rec.confirm_overdue) {
    rec.confirm_overdue = true;
    ++core_.stats.confirm_failures;
    const auto after = std::chrono::duration_cast<milliseconds>(now - signal_at).count();
    const char* what = want == Want::kRunning ? "start" : "exit";
    if (obs.ok()) {
      spdlog::warn("tracker: the runtime still reports {} for {} {} ms after a kernel {}; "
                   "looking again, less often",
                   to_string(obs->state), rec.identity.id.substr(0, 12), after, what);
    } else {
      spdlog::warn("tracker: no answer from the runtime for {} {} ms after a kernel {} ({}); "
                   "looking again, less often",
                   rec.identity.id.substr(0, 12), after, what, obs.error().message);
    }
  }
  return std::clamp(delay * 2, milliseconds(500), core_.opts.confirm_backoff_max);
}

}  // namespace kpleg::pleg
