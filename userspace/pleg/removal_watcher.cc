#include "pleg/removal_watcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace kpleg::pleg {


void RemovalWatcher::join(Record& rec) {
  rec.removal_swept = true;
  const std::string& id = rec.identity.id;
  watched_.insert(id);
  joined_ = true;
  bool gone = false;
  if (hints_ != nullptr && !armed_.count(id)) {
    const RemovalHints::Arm arm = hints_->watch(id);
    if (arm != RemovalHints::Arm::kFailed) armed_.insert(id);
    gone = arm == RemovalHints::Arm::kGone;
  }
  const auto now = Clock::now();
  if (const auto wait = sweep_wait_allowed(rec); wait.count() > 0) {
    if (!due_) interval_ = wait;
    schedule(now + wait);
  } else if (!due_) {
    interval_ = core_.opts().removal_sweep_period;
    schedule(now + core_.opts().removal_sweep_first);
  } else {
    schedule(now + core_.opts().removal_sweep_period);  // no later than that
  }
  // Removed before its death was confirmed (a RemoveContainer right after StopContainer): the
  // hint that came then is taken now.
  if (gone) {
    spdlog::debug("tracker: {} was removed before its death was confirmed: that is its removal hint",
                  id.substr(0, 12));
    on_hint(id);
  }
}

std::chrono::milliseconds RemovalWatcher::sweep_wait_allowed(const Record& rec) const {
  std::chrono::milliseconds wait{0};
  if (events_cover_removals(rec.identity.sandbox)) wait = core_.opts().removal_sweep_with_events;
  // A paused source hints nothing: the stream's lost DELETED is waited for no longer than
  // without hints.
  if (hints_trusted_ && !hints_paused_ && armed_.count(rec.identity.id))
    wait = std::max(wait, core_.opts().removal_sweep_with_hints);
  return wait;
}

void RemovalWatcher::forget(const std::string& id) {
  // A removal the sweep found before its hint stays armed at the source until the hint comes
  // or its grace is over (find_missed_hints): the watch may be holding the hint back, and
  // disarmed, it would drop it.
  if (armed_.erase(id) && hints_ != nullptr && !awaiting_hint_.count(id)) hints_->unwatch(id);
  hinted_.erase(id);
  rechecks_.erase(id);
}

void RemovalWatcher::on_hint(const std::string& id) {
  ++core_.stats().removal_hints;
  // A sweep that found the removal first: it was hinted after all.
  if (awaiting_hint_.erase(id) > 0) {
    // Kept armed at the source for this hint alone (forget): disarmed now.
    if (!armed_.count(id) && hints_ != nullptr) hints_->unwatch(id);
    trust_hints(id);
    return;
  }
  if (!armed_.count(id)) {
    if (hints_ != nullptr) hints_->unwatch(id);  // forgotten since it was armed
    return;
  }
  hinted_.insert(id);
  rechecks_[id] = kHintRechecks;
  // While the runtime's DELETED events report removals, the event reports this one: the hint
  // brings no sweep (the sweep kept for a lost event finds it, should the event not come).
  if (const Record* rec = core_.table().find(id);
      rec != nullptr && events_cover_removals(rec->identity.sandbox))
    return;
  // Hints of removals that come one after another share a sweep: one a removal_sweep_period at
  // most, as without hints while containers die and go.
  auto at = Clock::now() + hint_delay();
  if (last_sweep_) at = std::max(at, *last_sweep_ + core_.opts().removal_sweep_period);
  schedule(at);
}

void RemovalWatcher::trust_hints(const std::string& hinted_id) {
  if (hints_trusted_) return;
  hints_trusted_ = true;
  spdlog::info("tracker: a hinted removal was confirmed (e.g. {}): the removals of hinted ids "
               "are swept for every {} s at most",
               hinted_id.substr(0, 12), core_.opts().removal_sweep_with_hints.count() / 1000);
}

void RemovalWatcher::find_missed_hints(Clock::time_point now) {
  const std::vector<std::string> missed = take_overdue(awaiting_hint_, now);
  if (missed.empty()) return;
  // Kept armed at the source for their hints alone (forget): disarmed now, unless armed again.
  for (const auto& id : missed)
    if (hints_ != nullptr && !armed_.count(id)) hints_->unwatch(id);
  core_.stats().removal_hints_missed += missed.size();
  if (!hints_trusted_) return;
  hints_trusted_ = false;
  spdlog::info("tracker: no hint came for {} removal(s) the sweep found (e.g. {}): "
               "removals are swept for as without the hint until a hinted one is found",
               missed.size(), missed.front().substr(0, 12));
}

void RemovalWatcher::pause_hints_while_covered() {
  const bool pause = hints_ != nullptr && events_cover_removals(false) && events_cover_removals(true);
  if (pause == hints_paused_) return;
  hints_paused_ = pause;
  hints_->set_paused(pause);
  if (pause) {
    // A hint a sweep's removal waits for cannot come now: no miss of the hints.
    for (const auto& [id, _] : awaiting_hint_)
      if (!armed_.count(id)) hints_->unwatch(id);
    awaiting_hint_.clear();
    // A sweep planned as far off as trusted hints allow would be the only word on a DELETED
    // the stream loses: no later than the one kept for a lost event.
    if (!watched_.empty()) schedule(Clock::now() + core_.opts().removal_sweep_with_events);
  }
  spdlog::debug("tracker: removal hints {} (the runtime's events {} every removal)",
                pause ? "paused" : "read again", pause ? "report" : "no longer report");
}

void RemovalWatcher::on_runtime_events_live(bool live) {
  if (live) return;
  // A new stream (the runtime reconnected, perhaps upgraded) is trusted anew.
  awaiting_deleted_.clear();
  events_miss_removals_ = false;
  sandbox_deleted_seen_ = false;
  pause_hints_while_covered();  // not covered until the stream has reported a sandbox's removal
  if (watched_.empty()) return;
  interval_ = core_.opts().removal_sweep_period;
  schedule(Clock::now() + core_.opts().removal_sweep_first);
}

void RemovalWatcher::on_deleted_event(const std::string& id) {
  // A sweep was first: a race, not a miss.
  if (!awaiting_deleted_.empty()) awaiting_deleted_.erase(id);
  if (hinted_.count(id)) trust_hints(id);  // it had been hinted
  if (!sandbox_deleted_seen_) {
    const Record* rec = core_.table().find(id);
    if (rec != nullptr && rec->identity.sandbox) sandbox_deleted_seen_ = true;
    pause_hints_while_covered();
  }
}

std::vector<std::string> RemovalWatcher::take_overdue(
    std::map<std::string, Clock::time_point>& awaiting, Clock::time_point now) const {
  std::vector<std::string> overdue;
  for (auto it = awaiting.begin(); it != awaiting.end();) {
    if (now - it->second < core_.opts().removal_event_grace) {
      ++it;
      continue;
    }
    overdue.push_back(it->first);
    it = awaiting.erase(it);
  }
  return overdue;
}

void RemovalWatcher::find_missed_deleted_events(Clock::time_point now) {
  const std::vector<std::string> missed = take_overdue(awaiting_deleted_, now);
  if (missed.empty()) return;
  core_.stats().runtime_events_missed_removals += missed.size();
  if (events_miss_removals_ || !core_.runtime_events_live()) return;
  events_miss_removals_ = true;
  pause_hints_while_covered();
  spdlog::info("tracker: the runtime's event stream did not report {} removal(s) the sweep found "
               "(e.g. {}): removals are swept for as without the stream ({} ms after a death, "
               "not {} s) until it stops",
               missed.size(), missed.front().substr(0, 12), core_.opts().removal_sweep_period.count(),
               core_.opts().removal_sweep_with_events.count() / 1000);
}

}  // namespace kpleg::pleg
