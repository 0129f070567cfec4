// The Confirmer's side of the runtime's event stream (runtime_events.h): its reports, the
// signals that wait for them, and the reports that come before their signal.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "pleg/confirmer.h"

namespace kpleg::pleg {

using std::chrono::milliseconds;

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

bool Confirmer::take_early(Record& rec, Anchor anchor, Clock::time_point now, Events& out) {
  if (early_.empty()) return false;
  auto it = early_.find(rec.identity.id);
  if (it == early_.end()) return false;
  // Taken once: the record exists from now on, and later events find it.
  const Early early = it->second;
  early_.erase(it);
  const ContainerState s = early.obs.state;
  const bool says = s == ContainerState::kRunning || s == ContainerState::kExited;
  if (now - early.at >= kEarlyFor || !says ||
      rank(s) < (want_of(anchor) == Want::kRunning ? 1 : 2))
    return false;
  // The runtime already said so, before this signal made the record.
  core_.table().adopt_identity(rec, early.obs);
  if (core_.advance(rec, s, early.obs.snapshot, EventSource::kKernel, false, out) > 0)
    ++core_.stats().runtime_event_confirmations;
  ++core_.stats().runtime_events_early;
  return true;
}

void Confirmer::schedule_check(Clock::time_point at) {
  at = std::max(at, last_check_ + core_.opts().runtime_event_check);
  if (check_due_ && *check_due_ <= at) return;
  core_.cancel(check_timer_);  // a later check would wake the loop for nothing
  check_due_ = at;
  check_timer_ = core_.at(at, [this] { check_awaiting(); }, "runtime events: overdue check");
}

void Confirmer::check_awaiting() {
  check_due_.reset();
  check_timer_ = 0;
  const auto now = Clock::now();
  last_check_ = now;
  const bool live = core_.runtime_events_live();
  const auto grace = live ? Clock::duration(core_.opts().runtime_event_grace)
                          : Clock::duration::zero();
  std::optional<Clock::time_point> next;
  std::deque<Awaiting> keep;
  for (auto& a : awaiting_) {
    Record* rec = core_.table().find(a.look.id);
    if (rec == nullptr || rec->foreign ||
        settled_or_superseded(*rec, a.look.anchor, a.look.chain)) {
      if (rec != nullptr) --rec->pending;  // the event (or another path) settled it
      continue;
    }
    const auto look_at = a.first_look + grace;
    if (look_at <= now || !live) {
      // Overdue (or the stream stopped): the look it would have had.
      schedule(a.look, std::max(now, look_at));
      continue;
    }
    next = next ? std::min(*next, look_at) : look_at;
    keep.push_back(std::move(a));
  }
  awaiting_.swap(keep);
  if (next) schedule_check(*next);
}

void Confirmer::drop_settled_awaiting() {
  if (awaiting_.empty() || check_timer_ == 0) return;
  for (const auto& a : awaiting_) {
    const Record* rec = core_.table().find(a.look.id);
    if (rec != nullptr && !rec->foreign && !settled_or_superseded(*rec, a.look.anchor, a.look.chain))
      return;  // the check still has one to look at, if its event is late
  }
  for (const auto& a : awaiting_) {
    if (Record* rec = core_.table().find(a.look.id)) --rec->pending;
  }
  awaiting_.clear();
  core_.cancel(check_timer_);
  check_timer_ = 0;
  check_due_.reset();
}

void Confirmer::set_live(bool live) {
  if (core_.runtime_events_live() == live) return;
  core_.set_runtime_events_live(live);
  publish_wake_after();
  if (!live && !awaiting_.empty()) {
    // No event will come: every awaited signal gets its look now, or when it usually would.
    last_check_ = {};
    schedule_check(Clock::now());
  }
  if (core_.hooks().runtime_events_live) core_.hooks().runtime_events_live(live);
}

void Confirmer::learn_from_report(const Record& rec, const Observation& obs) {
  // From when the runtime sent the event (read later when the stream was held, or with a
  // record that waited for its wake timer: counted from then, the lag would grow by the wait
  // it sets itself).
  const uint64_t now_ns = realtime_now_ns();
  const uint64_t at_ns =
      obs.reported_at_ns > 0 && uint64_t(obs.reported_at_ns) < now_ns ? uint64_t(obs.reported_at_ns)
                                                                       : now_ns;
  auto learn = [&](Anchor anchor, uint64_t signal_ts) {
    if (signal_ts != 0 && at_ns > signal_ts)
      learner(anchor, obs.sandbox).found_by_other(milliseconds((at_ns - signal_ts) / 1'000'000));
  };
  if (obs.state == ContainerState::kRunning) {
    learn(Anchor::kExec, rec.kernel_start_ts);
  } else if (obs.state == ContainerState::kExited) {
    if (rec.exit_signal_at != Clock::time_point{}) learn(Anchor::kExit, rec.kernel_exit_ts);
    // The rmdir's too: its record then wakes the loop when the event is usually there.
    learn(Anchor::kRmdir, rec.kernel_rmdir_ts);
  }
  publish_wake_after();
}

void Confirmer::set_wake_after(WakeAfter set) {
  wake_after_ = std::move(set);
  wake_after_set_.reset();
  publish_wake_after();
}

void Confirmer::publish_wake_after() {
  if (!wake_after_) return;
  // The containers' lags: sandboxes start and die far less often, and their learners learn
  // from a few samples (a sandbox's record woken for early or late costs one wakeup more, not a
  // later event: its look goes at its own lag). While the runtime's event stream is live, an
  // rmdir wakes the loop at once: the stream is held as a rule when a container dies (nothing
  // waits for an event), and the rmdir's wakeup is what ends the hold, so that STOPPED is read
  // when it comes; had the rmdir waited its lag (24-41 ms on containerd 2.4.2), so would
  // ContainerDied whenever the event came sooner (its median went from 80 to 103 ms). A start's
  // STARTED comes within a few milliseconds of the exec.
  const milliseconds rmdir =
      core_.runtime_events_live() ? milliseconds(0) : first_look(Anchor::kRmdir, false);
  const std::pair values{first_look(Anchor::kExec, false), rmdir};
  if (wake_after_set_ == values) return;
  wake_after_set_ = values;
  wake_after_(values.first, values.second);
}

void Confirmer::on_report(const Observation& obs) {
  const std::string& id = obs.id;
  set_live(true);
  if (obs.state == ContainerState::kNonExistent && core_.hooks().deleted_event)
    core_.hooks().deleted_event(id);
  Record* rec = core_.table().find(id);
  if (rec == nullptr || rec->foreign) {
    // Not one of the kernel path's containers (yet): a container the kernel has not signalled
    // is found by its signal's look or by the reconcile, never made from an event alone (the
    // stream starts with a backlog of events about containers long gone). Its signal may be
    // on its way, though: kept briefly for it (early_).
    ++core_.stats().runtime_events_unmatched;
    if (rec == nullptr) remember_early(id, obs, Clock::now());
    return;
  }
  ++core_.stats().runtime_events;
  if (rank(obs.state) <= rank(rec->reported)) return;
  if (obs.state != ContainerState::kNonExistent) core_.table().adopt_identity(*rec, obs);
  // A signal waits for this: its learner learns when the runtime had it, as from a look.
  if (rec->pending > 0) learn_from_report(*rec, obs);
  Events out;
  if (core_.advance(*rec, obs.state, obs.snapshot, EventSource::kKernel, false, out) > 0)
    ++core_.stats().runtime_event_confirmations;
  core_.publish(out);
  drop_settled_awaiting();
}

}  // namespace kpleg::pleg
