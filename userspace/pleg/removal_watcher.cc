#include "pleg/removal_watcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

namespace kpleg::pleg {

namespace {
// The sweep's own queue key: it runs beside the pods' work, never behind a hung pod.
const std::string kSweepKey = "\x01removal-sweep";
// Sweeps (the first the hint's delay after it, then removal_hint_delay apart) that look for a
// hinted container the runtime still lists.
constexpr int kHintRechecks = 3;
}  // namespace

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
    interval_ = core_.opts.removal_sweep_period;
    schedule(now + core_.opts.removal_sweep_first);
  } else {
    schedule(now + core_.opts.removal_sweep_period);  // no later than that
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
  if (events_cover_removals(rec.identity.sandbox)) wait = core_.opts.removal_sweep_with_events;
  if (hints_trusted_ && armed_.count(rec.identity.id))
    wait = std::max(wait, core_.opts.removal_sweep_with_hints);
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
  ++core_.stats.removal_hints;
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
  // Hints of removals that come one after another share a sweep: one a removal_sweep_period at
  // most, as without hints while containers die and go.
  auto at = Clock::now() + hint_delay();
  if (last_sweep_) at = std::max(at, *last_sweep_ + core_.opts.removal_sweep_period);
  schedule(at);
}

void RemovalWatcher::trust_hints(const std::string& hinted_id) {
  if (hints_trusted_) return;
  hints_trusted_ = true;
  spdlog::info("tracker: a hinted removal was confirmed (e.g. {}): the removals of hinted ids "
               "are swept for every {} s at most",
               hinted_id.substr(0, 12), core_.opts.removal_sweep_with_hints.count() / 1000);
}

void RemovalWatcher::find_missed_hints(Clock::time_point now) {
  const std::vector<std::string> missed = take_overdue(awaiting_hint_, now);
  if (missed.empty()) return;
  // Kept armed at the source for their hints alone (forget): disarmed now, unless armed again.
  for (const auto& id : missed)
    if (hints_ != nullptr && !armed_.count(id)) hints_->unwatch(id);
  core_.stats.removal_hints_missed += missed.size();
  if (!hints_trusted_) return;
  hints_trusted_ = false;
  spdlog::info("tracker: no hint came for {} removal(s) the sweep found (e.g. {}): "
               "removals are swept for as without the hint until a hinted one is found",
               missed.size(), missed.front().substr(0, 12));
}

void RemovalWatcher::on_runtime_events_live(bool live) {
  if (live) return;
  // A new stream (the runtime reconnected, perhaps upgraded) is trusted anew.
  awaiting_deleted_.clear();
  events_miss_removals_ = false;
  sandbox_deleted_seen_ = false;
  if (watched_.empty()) return;
  interval_ = core_.opts.removal_sweep_period;
  schedule(Clock::now() + core_.opts.removal_sweep_first);
}

void RemovalWatcher::on_deleted_event(const std::string& id) {
  // A sweep was first: a race, not a miss.
  if (!awaiting_deleted_.empty()) awaiting_deleted_.erase(id);
  if (hinted_.count(id)) trust_hints(id);  // it had been hinted
  if (!sandbox_deleted_seen_) {
    const Record* rec = core_.table.find(id);
    if (rec != nullptr && rec->identity.sandbox) sandbox_deleted_seen_ = true;
  }
}

std::vector<std::string> RemovalWatcher::take_overdue(
    std::map<std::string, Clock::time_point>& awaiting, Clock::time_point now) const {
  std::vector<std::string> overdue;
  for (auto it = awaiting.begin(); it != awaiting.end();) {
    if (now - it->second < core_.opts.removal_event_grace) {
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
  core_.stats.runtime_events_missed_removals += missed.size();
  if (events_miss_removals_ || !core_.runtime_events_live) return;
  events_miss_removals_ = true;
  spdlog::info("tracker: the runtime's event stream did not report {} removal(s) the sweep found "
               "(e.g. {}): removals are swept for as without the stream ({} ms after a death, "
               "not {} s) until it stops",
               missed.size(), missed.front().substr(0, 12), core_.opts.removal_sweep_period.count(),
               core_.opts.removal_sweep_with_events.count() / 1000);
}

void RemovalWatcher::schedule(Clock::time_point at) {
  if (due_ && *due_ <= at) return;
  // A sweep posted for later becomes a no-op when it finds due_ changed.
  due_ = at;
  core_.queue.post(kSweepKey, [this, at] { sweep(at); }, at);
}

void RemovalWatcher::check(const std::string& id) {
  bool sandbox;
  {
    std::lock_guard lk(core_.mu);
    const Record* rec = core_.table.find(id);
    if (rec == nullptr || rec->reported == ContainerState::kNonExistent) return;
    sandbox = rec->identity.sandbox;
    ++core_.stats.removal_checks;
  }
  auto obs = core_.look(id, true, sandbox);
  if (!obs.ok() || obs->state != ContainerState::kNonExistent) return;  // the sweep goes on
  TrackerCore::Lock lk(core_.mu);
  Events out;
  core_.advance(core_.table.at(id), ContainerState::kNonExistent, obs->snapshot,
                EventSource::kKernel, false, out);
  core_.publish(lk, out);
}

void RemovalWatcher::sweep(Clock::time_point due) {
  bool containers = false, sandboxes = false, joined = false;
  {
    std::lock_guard lk(core_.mu);
    if (due_ != due) return;  // superseded by an earlier sweep
    due_.reset();
    last_sweep_ = Clock::now();
    find_missed_deleted_events(Clock::now());
    find_missed_hints(Clock::now());
    joined = std::exchange(joined_, false);
    for (auto it = watched_.begin(); it != watched_.end();) {
      const Record* rec = core_.table.find(*it);
      // Removed some other way (a look, a reconcile, the runtime's event) since it joined, or
      // forgotten.
      if (rec == nullptr || !rec->removal_swept || rec->reported == ContainerState::kNonExistent) {
        // A removal the runtime's event (or a look) confirmed after its hint came: the hints
        // work on this runtime.
        if (rec != nullptr && rec->reported == ContainerState::kNonExistent && hinted_.count(*it))
          trust_hints(*it);
        forget(*it);
        it = watched_.erase(it);
        continue;
      }
      (rec->identity.sandbox ? sandboxes : containers) = true;
      ++it;
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
  if (containers) listed = collect(core_.cri.list_containers({}));
  if (sandboxes && listed) listed = collect(core_.cri.list_pod_sandboxes({}));

  TrackerCore::Lock lk(core_.mu);
  core_.stats.removal_sweeps += uint64_t(containers) + uint64_t(sandboxes);
  size_t watched = 0, removed = 0;
  bool remaining = false;
  bool early_hint = false;  // a hinted record is still there: its removal is under way
  // How long every record still watched may wait because something announces its removal.
  auto wait = std::chrono::milliseconds::max();
  const auto now = Clock::now();
  Events out;
  for (auto wit = watched_.begin(); wit != watched_.end();) {
    Record* found = core_.table.find(*wit);
    if (found == nullptr || !found->removal_swept) {
      forget(*wit);
      wit = watched_.erase(wit);
      continue;
    }
    Record& rec = *found;
    const std::string& id = *wit;
    // Judge only the kinds listed above: a record may have joined since.
    const bool kind_listed = rec.identity.sandbox ? sandboxes : containers;
    const bool covered = events_cover_removals(rec.identity.sandbox);
    if (listed && kind_listed && rec.reported == ContainerState::kExited &&
        !still_there.count(id)) {
      ContainerSnapshot gone;
      gone.state = ContainerState::kNonExistent;
      core_.advance(rec, ContainerState::kNonExistent, gone, EventSource::kKernel, false, out);
      ++removed;
      // Its DELETED should have come: it may still be on its way, or never come.
      if (covered) awaiting_deleted_.emplace(id, now);
      if (armed_.count(id)) {
        if (hinted_.count(id)) {
          trust_hints(id);
        } else {
          awaiting_hint_.emplace(id, now);  // its hint may still be on its way
        }
      }
    } else if (auto rc = rechecks_.find(id); listed && kind_listed && rc != rechecks_.end()) {
      // Hinted, still there: the runtime removes its files before it forgets the container
      // (or the directory went for another reason: then after a few more looks, no more).
      // Armed again, and looked for again soon.
      if (rc->second == kHintRechecks && hints_ != nullptr) (void)hints_->watch(id);
      if (--rc->second > 0)
        early_hint = true;
      else
        rechecks_.erase(rc);
    }
    ++watched;
    if (rec.reported == ContainerState::kNonExistent) {
      rec.removal_swept = false;
      forget(id);
      wit = watched_.erase(wit);
    } else {
      remaining = true;
      wait = std::min(wait, sweep_wait_allowed(rec));
      ++wit;
    }
  }
  auto next = Clock::time_point::max();
  if (remaining) {
    // While containers die and go, one sweep a period answers for all of them; while nothing
    // changes (long-exited containers only: init containers, finished jobs, the dead instance
    // the kubelet keeps for its logs), less and less often.
    interval_ = removed > 0 || joined ? core_.opts.removal_sweep_period
                                      : std::min(interval_ * 2, core_.opts.removal_sweep_idle_max);
    interval_ = std::max(interval_, wait);  // zero unless every record's removal is announced
    next = now + interval_;
    if (early_hint) next = std::min(next, now + core_.opts.removal_hint_delay);
  }
  // The verdict on the removals whose DELETED or hint is awaited (no list is made for it alone).
  for (const auto& [_, at] : awaiting_deleted_)
    next = std::min(next, at + core_.opts.removal_event_grace);
  for (const auto& [_, at] : awaiting_hint_)
    next = std::min(next, at + core_.opts.removal_event_grace);
  if (next != Clock::time_point::max()) schedule(next);
  core_.publish(lk, out);
  spdlog::debug("tracker: removal sweep: {} exited watched, {} removed{}", watched, removed,
                listed ? "" : " (the list failed: next sweep)");
}

}  // namespace kpleg::pleg
