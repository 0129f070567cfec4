#include "pleg/confirmer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

namespace kpleg::pleg {

using std::chrono::milliseconds;

void Confirmer::on_signal(const std::string& id, const std::string& pod_uid, Signal signal,
                          uint64_t ts_ns, Clock::time_point signal_at) {
  Record& rec = core_.table().at(id, pod_uid);
  if (spdlog::should_log(spdlog::level::trace)) {
    static constexpr const char* kNames[] = {"exec", "exit", "exit (OOM)", "rmdir"};
    spdlog::trace("tracker: {} of {} (reported {}, {} looks pending)", kNames[int(signal)],
                  std::string_view(id).substr(0, 12), to_string(rec.reported), rec.pending);
  }
  if (rec.foreign) {
    ++core_.stats().foreign_signals;
    if (signal == Signal::kRmdir) {
      // Gone: let the retention forget it.
      rec.reported = ContainerState::kNonExistent;
      rec.removed_at = Clock::now();
    }
    return;
  }
  learn_exit_wakeup(rec, signal);
  Anchor anchor = Anchor::kExec;
  switch (signal) {
    case Signal::kExec:
      rec.kernel_exec_seen = true;
      rec.kernel_start_ts = ts_ns;
      break;
    case Signal::kExit:
    case Signal::kExitOom:
      rec.kernel_exit_ts = ts_ns;
      rec.exit_signal_at = signal_at;
      // The Died event says OOMKilled unless the runtime gives another reason than Error.
      if (signal == Signal::kExitOom) rec.oom_killed = true;
      anchor = Anchor::kExit;
      break;
    case Signal::kRmdir:
      // runc removes the cgroup after the init died: it confirms a death, and the runtime
      // records the death shortly after. Its chain replaces the exit's, wherever that is
      // (waiting for its first look, retrying, or backing off past its budget).
      if (rank(rec.reported) >= rank(ContainerState::kExited)) return;
      if (rec.kernel_exit_ts == 0) rec.kernel_exit_ts = ts_ns;
      rec.kernel_rmdir_ts = ts_ns;
      anchor = Anchor::kRmdir;
      break;
  }
  Events out;
  start_chain(rec, pod_uid, anchor, signal_at, out);
  core_.publish(out);
}

void Confirmer::start_chain(Record& rec, const std::string& pod_uid, Anchor anchor,
                            Clock::time_point signal_at, Events& out) {
  uint32_t chain = 0;
  if (anchor != Anchor::kExec) {
    chain = ++rec.death_chain;
    rec.confirm_overdue = false;  // a fresh chain, within its budget
    // The chain this one replaces would only wake the loop to find itself superseded (an
    // exit's look is learned to come after the rmdir's): its timer is dropped.
    if (core_.cancel(rec.death_look)) {
      --rec.pending;
      ++core_.stats().looks_dropped;
    }
    rec.death_look = 0;
    // Nor is it waited for after an unanswered look any more.
    unanswered_.erase({rec.identity.id, int(Anchor::kExit)});
    unanswered_.erase({rec.identity.id, int(Anchor::kRmdir)});
  }
  ++core_.stats().kernel_signals;
  const auto now = Clock::now();
  if (take_early(rec, anchor, now, out)) return;
  ++rec.pending;
  const Clock::duration first = first_look(anchor, core_.table().likely_sandbox(rec));
  Look look{rec.identity.id, anchor, chain, core_.opts().confirm_retry_first,
            signal_at + core_.opts().confirm_budget, signal_at, Clock::duration(-1)};
  (void)pod_uid;
  if (core_.runtime_events_live()) {
    // The runtime's event is the confirmation; a look only for an event late or lost. (The
    // record is read at the event's usual lag after the signal, or with the event itself: an
    // event that came meanwhile is read at the loop's next turn, without a sleep.)
    awaiting_.push_back({std::move(look), signal_at + first});
    core_.read_events(false);  // the stream may be holding off
    schedule_check(signal_at + first + core_.opts().runtime_event_grace);
    return;
  }
  schedule(look, signal_at + first);
}

void Confirmer::schedule(const Look& look, Clock::time_point at, bool unanswered) {
  const auto timer = core_.at(
      at, [this, look] { confirm(look); }, look.last_miss < Clock::duration::zero() ? "look" : "look again");
  if (unanswered) unanswered_[{look.id, int(look.anchor)}] = Unanswered{timer, look};
  if (look.anchor == Anchor::kExec) return;
  Record* rec = core_.table().find(look.id);
  if (rec != nullptr && rec->death_chain == look.chain) rec->death_look = timer;
}

bool Confirmer::settled_or_superseded(const Record& rec, Anchor anchor, uint32_t chain) const {
  const Want want = want_of(anchor);
  const int want_rank = want == Want::kRunning ? 1 : 2;
  return rank(rec.reported) >= want_rank || (want == Want::kExited && chain != rec.death_chain);
}

void Confirmer::note_answer(bool answered, Clock::time_point now) {
  if (!answered) {
    if (!silent_since_) silent_since_ = now;
    return;
  }
  const bool after_silence = silent_since_ && now - *silent_since_ >= kSilence;
  silent_since_.reset();
  if (!after_silence || unanswered_.empty()) return;
  auto waiting = std::move(unanswered_);
  unanswered_.clear();
  size_t again = 0;
  for (auto& [key, u] : waiting) {
    if (!core_.cancel(u.timer)) continue;  // it ran, or a later chain took over
    Look look = u.look;
    look.delay = core_.opts().confirm_retry_first;  // as a fresh chain's retries, should it miss
    schedule(look, now);
    ++again;
  }
  if (again > 0)
    spdlog::info("tracker: the runtime answers again: {} confirmation(s) waiting after "
                 "unanswered looks look now",
                 again);
}

void Confirmer::confirm(const Look& look) {
  unanswered_.erase({look.id, int(look.anchor)});
  Record& rec = core_.table().at(look.id);
  if (look.anchor != Anchor::kExec && rec.death_chain == look.chain) rec.death_look = 0;
  // Another path got there first (a later signal's confirmation, a reconcile, a death that
  // came before the start could be confirmed), or a later chain took over: nothing to do.
  if (settled_or_superseded(rec, look.anchor, look.chain)) {
    --rec.pending;
    return;
  }
  const auto look_at = Clock::now() - look.signal_at;
  const bool known = rec.known();
  core_.look(rec.identity.pod.uid, look.id, rec.sandbox_known, core_.table().likely_sandbox(rec),
             [this, look, look_at, known](Result<Observation> obs) {
               on_answer(look, look_at, known, std::move(obs));
             });
}

void Confirmer::on_answer(const Look& look, Clock::duration look_at, bool known,
                          Result<Observation> obs) {
  const Want want = want_of(look.anchor);
  const int want_rank = want == Want::kRunning ? 1 : 2;
  const auto now = Clock::now();
  const std::string& id = look.id;
  Record& rec = core_.table().at(id);
  note_answer(obs.ok(), now);
  // A start the runtime does not know yet (RunPodSandbox/StartContainer still in progress, the
  // id not in its store) is not a removal: wait for it like for any other lag. So is the exit
  // of a process of a cgroup kplegd found with processes in it and never saw start: a runtime's
  // setup process taken for the init of a sandbox still being made. One the runtime knew and
  // no longer has is settled: it is gone.
  const bool unknown_start =
      (look.anchor == Anchor::kExec || (look.anchor == Anchor::kExit && !rec.kernel_exec_seen)) &&
      obs.ok() && obs->state == ContainerState::kNonExistent && !known;
  const bool settled = obs.ok() && rank(obs->state) >= want_rank && !unknown_start;
  const auto unknown_since =
      look.unknown_since != Clock::time_point{} ? look.unknown_since : now;
  if (unknown_start && now - unknown_since >= core_.opts().foreign_after &&
      rank(rec.reported) == 0 && !rec.known()) {
    // Still unknown long after its start: not this runtime's container. Not an inconsistency
    // either, so no reconcile; its later signals are ignored.
    --rec.pending;
    rec.foreign = true;
    ++core_.stats().foreign_containers;
    spdlog::info("tracker: {} started in a tracked cgroup but the runtime does not know it "
                 "(another runtime's container?): ignoring its kernel signals",
                 id.substr(0, 12));
    return;
  }
  if (!settled) {
    // Not what this chain waits for, but news all the same: an exit's chain that finds the
    // container running, not reported yet, reports the start. (A process taken for the init of
    // a container seeded while runc was still setting it up exits, and the real init's exec
    // is then no longer news to the kernel program: the runtime's answer is all there is.)
    if (obs.ok() && !unknown_start && obs->state != ContainerState::kNonExistent &&
        rank(obs->state) > rank(rec.reported)) {
      core_.table().adopt_identity(rec, *obs);
      Events out;
      core_.advance(rec, obs->state, obs->snapshot, EventSource::kKernel, false, out);
      core_.publish(out);
    }
    Look next = look;
    next.delay = next_delay(rec, look, unknown_start, obs);
    next.last_miss = look_at;
    next.unknown_since = unknown_start ? unknown_since : Clock::time_point{};
    schedule(next, now + look.delay, !obs.ok());
    return;
  }

  --rec.pending;
  if (rec.pending == 0) rec.confirm_overdue = false;
  // The exit's own chain found the death recorded: no rmdir came before the runtime recorded it
  // (an rmdir's chain would have taken over).
  if (look.anchor == Anchor::kExit) exit_wakeup_.exit_alone();
  if (core_.runtime_events_live()) {
    // The look came first although the stream is live: its event is late (or lost, or the
    // stream stalled). Until the next event arrives, signals are looked at without waiting.
    ++core_.stats().runtime_events_late;
    set_live(false);
    uint64_t left_out = 0;
    if (late_log_.allow(left_out)) {
      spdlog::info("tracker: the runtime's event for {} came later than a look ({} ms after "
                   "the kernel's signal); confirming by looks until its next event{}",
                   id.substr(0, 12),
                   std::chrono::duration_cast<milliseconds>(now - look.signal_at).count(),
                   left_out > 0 ? fmt::format(" ({} more like it not logged)", left_out) : "");
    }
  }
  core_.table().adopt_identity(rec, *obs);
  std::optional<milliseconds> miss;
  if (look.last_miss >= Clock::duration::zero())
    miss = std::chrono::duration_cast<milliseconds>(look.last_miss);
  learner(look.anchor, obs->sandbox).settled(miss);
  if (look.anchor == Anchor::kRmdir && rec.exit_signal_at != Clock::time_point{}) {
    // The exit's chain gave way to this one: it learns when the death was there after the
    // exit, so that it looks after the rmdir's chain and, as long as an rmdir comes, not at all.
    learner(Anchor::kExit, obs->sandbox)
        .found_by_other(std::chrono::duration_cast<milliseconds>(now - rec.exit_signal_at));
  }
  publish_wake_after();
  Events out;
  if (core_.advance(rec, obs->state, obs->snapshot, EventSource::kKernel, false, out) > 0)
    ++core_.stats().confirmations;
  core_.publish(out);
}

milliseconds Confirmer::next_delay(Record& rec, const Look& look, bool unknown_start,
                                   const Result<Observation>& obs) {
  // The runtime has not caught up with the kernel yet (or did not answer): look again. Short
  // steps first: the runtime usually catches up within tens of milliseconds, and a long step
  // would add its overshoot to the detection latency. A start the runtime does not know at all
  // yet (a sandbox still being set up, or another runtime's container) is waited for less
  // eagerly. Past the budget, the looks back off but never stop: a confirmation that is
  // dropped is an event missed until the next reconcile.
  const auto now = Clock::now();
  const milliseconds delay = look.delay;
  ++core_.stats().confirm_retries;
  if (now + delay < look.deadline)
    return std::min(delay * 2, milliseconds(unknown_start ? 200 : 20));
  if (!rec.confirm_overdue) {
    rec.confirm_overdue = true;
    ++core_.stats().confirm_failures;
    const auto after = std::chrono::duration_cast<milliseconds>(now - look.signal_at).count();
    const char* what = want_of(look.anchor) == Want::kRunning ? "start" : "exit";
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
  return std::clamp(delay * 2, milliseconds(500), core_.opts().confirm_backoff_max);
}

Confirmer::Clock::duration Confirmer::exit_look_after(bool sandbox) {
  Clock::duration after = first_look(Anchor::kExit, sandbox);
  if (core_.runtime_events_live()) after += core_.opts().runtime_event_grace;
  return after;
}

void Confirmer::learn_exit_wakeup(const Record& rec, Signal signal) {
  if (signal != Signal::kRmdir) return;
  // The rmdir of a cgroup whose exit's chain still waits for a look (its timer is set) or, while
  // the runtime's stream is live, for the runtime's event: that exit did not need to wake the
  // loop. (A death the exit's own chain confirmed is noted in on_answer().)
  if (rank(rec.reported) < rank(ContainerState::kExited) &&
      rec.exit_signal_at != Clock::time_point{} &&
      (rec.death_look != 0 ||
       (core_.runtime_events_live() &&
        Clock::now() - rec.exit_signal_at <= exit_look_after(core_.table().likely_sandbox(rec)))))
    exit_wakeup_.rmdir_in_time();
}

}  // namespace kpleg::pleg
