#include "pleg/confirmer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

namespace kpleg::pleg {

using std::chrono::milliseconds;

void Confirmer::on_signal(const std::string& id, const std::string& pod_uid, Signal signal,
                          uint64_t ts_ns) {
  TrackerCore::Lock lk(core_.mu);
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
  Events out;
  start_chain(rec, pod_uid, anchor, out);
  if (!out.empty()) core_.publish(lk, out);
}

void Confirmer::remember_early(const std::string& id, const Observation& obs,
                               Clock::time_point now) {
  if (early_.size() >= kMaxEarly) {
    for (auto it = early_.begin(); it != early_.end();) {
      if (now - it->second.at >= kEarlyFor) it = early_.erase(it);
      else ++it;
    }
    if (early_.size() >= kMaxEarly) return;  // a burst of them: the grace's look covers it
  }
  auto [it, fresh] = early_.try_emplace(id, Early{obs, now});
  if (!fresh && rank(obs.state) >= rank(it->second.obs.state)) it->second = Early{obs, now};
}

void Confirmer::start_chain(Record& rec, const std::string& pod_uid, Anchor anchor,
                            Events& out) {
  uint32_t chain = 0;
  if (anchor != Anchor::kExec) {
    chain = ++rec.death_chain;
    rec.confirm_overdue = false;  // a fresh chain, within its budget
    // The chain this one replaces would only wake a worker to find itself superseded (an
    // exit's look is learned to come after the rmdir's): its queued look is dropped.
    if (rec.death_look && core_.cancel(rec.death_look)) {
      --rec.pending;
      ++core_.stats.looks_dropped;
    }
    rec.death_look = {};
  }
  ++core_.stats.kernel_signals;
  const auto now = Clock::now();
  if (!early_.empty()) {
    auto it = early_.find(rec.identity.id);
    if (it != early_.end()) {
      // Taken once: the record exists from now on, and later events find it.
      const Early early = it->second;
      early_.erase(it);
      const ContainerState s = early.obs.state;
      const bool says = s == ContainerState::kRunning || s == ContainerState::kExited;
      if (now - early.at < kEarlyFor && says &&
          rank(s) >= (want_of(anchor) == Want::kRunning ? 1 : 2)) {
        // The runtime already said so, before this signal made the record.
        core_.table.adopt_identity(rec, early.obs);
        if (core_.advance(rec, s, early.obs.snapshot, EventSource::kKernel, false, out) > 0)
          ++core_.stats.runtime_event_confirmations;
        ++core_.stats.runtime_events_early;
        return;
      }
    }
  }
  ++rec.pending;
  const Clock::duration first = first_look(anchor, core_.table.likely_sandbox(rec));
  const auto deadline = now + core_.opts.confirm_budget;
  if (core_.runtime_events_live) {
    // The runtime's event is the confirmation; a look only for an event late or lost.
    await_event(rec, pod_uid, anchor, chain, now, first, deadline);
    return;
  }
  post_look(rec.identity.id, pod_uid, anchor, chain, now, now + first, deadline);
}

void Confirmer::post_look(const std::string& id, const std::string& pod_uid, Anchor anchor,
                          uint32_t chain, Clock::time_point signal_at, Clock::time_point at,
                          Clock::time_point deadline) {
  const PodWorkTicket ticket = core_.post(
      pod_uid, id,
      [this, id, anchor, chain, deadline, signal_at] {
        confirm(id, anchor, chain, core_.opts.confirm_retry_first, deadline, signal_at,
                Clock::duration(-1));
      },
      at);
  note_death_look(id, anchor, chain, ticket);
}

void Confirmer::note_death_look(const std::string& id, Anchor anchor, uint32_t chain,
                                const PodWorkTicket& ticket) {
  if (anchor == Anchor::kExec) return;
  Record* rec = core_.table.find(id);
  if (rec != nullptr && rec->death_chain == chain) rec->death_look = ticket;
}

bool Confirmer::settled_or_superseded(const Record& rec, Anchor anchor, uint32_t chain) const {
  const Want want = want_of(anchor);
  const int want_rank = want == Want::kRunning ? 1 : 2;
  return rank(rec.reported) >= want_rank || (want == Want::kExited && chain != rec.death_chain);
}

void Confirmer::await_event(Record& rec, const std::string& pod_uid, Anchor anchor,
                            uint32_t chain, Clock::time_point signal_at,
                            Clock::duration first_look, Clock::time_point deadline) {
  awaiting_.push_back({rec.identity.id, pod_uid, anchor, chain, signal_at,
                       signal_at + first_look, deadline});
  schedule_check(signal_at + first_look + core_.opts.runtime_event_grace);
}

void Confirmer::schedule_check(Clock::time_point at) {
  at = std::max(at, last_check_ + core_.opts.runtime_event_check);
  if (check_due_ && *check_due_ <= at) return;
  check_due_ = at;
  static const std::string kCheckKey = "\x01runtime-event-check";
  core_.queue.post(kCheckKey, [this, at] { check_awaiting(at); }, at);
}

void Confirmer::check_awaiting(Clock::time_point due) {
  std::lock_guard lk(core_.mu);
  if (check_due_ != due) return;  // superseded by an earlier check
  check_due_.reset();
  const auto now = Clock::now();
  last_check_ = now;
  const auto grace = core_.runtime_events_live ? Clock::duration(core_.opts.runtime_event_grace)
                                               : Clock::duration::zero();
  std::optional<Clock::time_point> next;
  std::deque<Awaiting> keep;
  for (auto& a : awaiting_) {
    Record* rec = core_.table.find(a.id);
    if (rec == nullptr || rec->foreign || settled_or_superseded(*rec, a.anchor, a.chain)) {
      if (rec != nullptr) --rec->pending;  // the event (or another path) settled it
      continue;
    }
    const auto look_at = a.first_look + grace;
    if (look_at <= now || !core_.runtime_events_live) {
      // Overdue (or the stream stopped): the look it would have had.
      post_look(a.id, a.pod_uid, a.anchor, a.chain, a.signal_at, std::max(now, look_at),
                a.deadline);
      continue;
    }
    next = next ? std::min(*next, look_at) : look_at;
    keep.push_back(std::move(a));
  }
  awaiting_.swap(keep);
  if (next) schedule_check(*next);
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
    // Posted under the lock, so that a chain that replaces this one finds the retry's ticket.
    const PodWorkTicket ticket = core_.post(
        rec.identity.pod_uid, id,
        [this, id, anchor, chain, next, deadline, signal_at, look] {
          confirm(id, anchor, chain, next, deadline, signal_at, look);
        },
        now + delay);
    note_death_look(id, anchor, chain, ticket);
    return;
  }

  --rec.pending;
  if (rec.pending == 0) rec.confirm_overdue = false;
  if (core_.runtime_events_live) {
    // The look came first although the stream is live: its event is late (or lost, or the
    // stream stalled). Until the next event arrives, signals are looked at without waiting.
    ++core_.stats.runtime_events_late;
    set_live(false);
    uint64_t left_out = 0;
    if (late_log_.allow(left_out)) {
      spdlog::info("tracker: the runtime's event for {} came later than a look ({} ms after "
                   "the kernel's signal); confirming by looks until its next event{}",
                   id.substr(0, 12),
                   std::chrono::duration_cast<milliseconds>(now - signal_at).count(),
                   left_out > 0 ? fmt::format(" ({} more like it not logged)", left_out) : "");
    }
  }
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

void Confirmer::set_live(bool live) {
  if (core_.runtime_events_live == live) return;
  core_.runtime_events_live = live;
  if (!live && !awaiting_.empty()) {
    // No event will come: every awaited signal gets its look now, or when it usually would.
    last_check_ = {};
    schedule_check(Clock::now());
  }
  if (core_.on_runtime_events_live) core_.on_runtime_events_live(live);
}

void Confirmer::on_report(const std::string& id, const Observation& obs) {
  TrackerCore::Lock lk(core_.mu);
  set_live(true);
  if (obs.state == ContainerState::kNonExistent && core_.on_deleted_event)
    core_.on_deleted_event(id);
  Record* rec = core_.table.find(id);
  if (rec == nullptr || rec->foreign) {
    // Not one of the kernel path's containers (yet): a container the kernel has not signalled
    // is found by its signal's look or by the reconcile, never made from an event alone (the
    // stream starts with a backlog of events about containers long gone). Its signal may be
    // on its way, though: kept briefly for it (early_).
    ++core_.stats.runtime_events_unmatched;
    if (rec == nullptr) remember_early(id, obs, Clock::now());
    return;
  }
  ++core_.stats.runtime_events;
  if (rank(obs.state) <= rank(rec->reported)) return;
  if (obs.state != ContainerState::kNonExistent) core_.table.adopt_identity(*rec, obs);
  if (rec->pending > 0) {
    // A signal waits for this: its learner learns when the runtime had it, as from a look.
    const auto now_ns = realtime_now_ns();
    if (obs.state == ContainerState::kRunning && rec->kernel_start_ts != 0 &&
        now_ns > rec->kernel_start_ts) {
      learner(Anchor::kExec, obs.sandbox)
          .found_by_other(milliseconds((now_ns - rec->kernel_start_ts) / 1'000'000));
    } else if (obs.state == ContainerState::kExited &&
               rec->exit_signal_at != Clock::time_point{}) {
      learner(Anchor::kExit, obs.sandbox)
          .found_by_other(
              std::chrono::duration_cast<milliseconds>(Clock::now() - rec->exit_signal_at));
    }
  }
  Events out;
  if (core_.advance(*rec, obs.state, obs.snapshot, EventSource::kKernel, false, out) > 0)
    ++core_.stats.runtime_event_confirmations;
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
