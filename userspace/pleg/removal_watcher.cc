#include "pleg/removal_watcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>

namespace kpleg::pleg {

namespace {
// The sweep's own queue key: it runs beside the pods' work, never behind a hung pod.
const std::string kSweepKey = "\x01removal-sweep";
}  // namespace

void RemovalWatcher::join(Record& rec) {
  rec.removal_swept = true;
  watched_.insert(rec.identity.id);
  joined_ = true;
  const auto now = Clock::now();
  if (events_cover_removals(rec.identity.sandbox)) {
    if (!due_) interval_ = core_.opts.removal_sweep_with_events;
    schedule(now + core_.opts.removal_sweep_with_events);
  } else if (!due_) {
    interval_ = core_.opts.removal_sweep_period;
    schedule(now + core_.opts.removal_sweep_first);
  } else {
    schedule(now + core_.opts.removal_sweep_period);  // no later than that
  }
}

void RemovalWatcher::on_runtime_events_live(bool live) {
  if (live) return;
  // A new stream (the runtime reconnected, perhaps upgraded) is trusted anew.
  suspects_.clear();
  events_miss_removals_ = false;
  sandbox_deleted_seen_ = false;
  if (watched_.empty()) return;
  interval_ = core_.opts.removal_sweep_period;
  schedule(Clock::now() + core_.opts.removal_sweep_first);
}

void RemovalWatcher::on_deleted_event(const std::string& id) {
  if (!suspects_.empty()) suspects_.erase(id);  // a sweep was first: a race, not a miss
  if (!sandbox_deleted_seen_) {
    const Record* rec = core_.table.find(id);
    if (rec != nullptr && rec->identity.sandbox) sandbox_deleted_seen_ = true;
  }
}

void RemovalWatcher::judge_suspects(Clock::time_point now) {
  size_t missed = 0;
  std::string example;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    if (now - it->second < core_.opts.removal_event_grace) {
      ++it;
      continue;
    }
    ++missed;
    example = it->first;
    it = suspects_.erase(it);
  }
  if (missed == 0) return;
  core_.stats.runtime_events_missed_removals += missed;
  if (events_miss_removals_ || !core_.runtime_events_live) return;
  events_miss_removals_ = true;
  spdlog::info("tracker: the runtime's event stream did not report {} removal(s) the sweep found "
               "(e.g. {}): removals are swept for as without the stream ({} ms after a death, "
               "not {} s) until it stops",
               missed, example.substr(0, 12), core_.opts.removal_sweep_period.count(),
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
    judge_suspects(Clock::now());
    joined = std::exchange(joined_, false);
    for (auto it = watched_.begin(); it != watched_.end();) {
      const Record* rec = core_.table.find(*it);
      // Removed some other way (a look, a reconcile, the runtime's event) since it joined, or
      // forgotten.
      if (rec == nullptr || !rec->removal_swept || rec->reported == ContainerState::kNonExistent) {
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
  bool all_covered = true;  // every record still watched is of a kind the events cover
  const auto now = Clock::now();
  Events out;
  for (auto wit = watched_.begin(); wit != watched_.end();) {
    Record* found = core_.table.find(*wit);
    if (found == nullptr || !found->removal_swept) {
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
      if (covered) suspects_.emplace(id, now);
    }
    ++watched;
    if (rec.reported == ContainerState::kNonExistent) {
      rec.removal_swept = false;
      wit = watched_.erase(wit);
    } else {
      remaining = true;
      all_covered = all_covered && covered;
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
    if (all_covered) interval_ = std::max(interval_, core_.opts.removal_sweep_with_events);
    next = now + interval_;
  }
  // The verdict on the removals whose DELETED is awaited (no list is made for it alone).
  for (const auto& [_, at] : suspects_)
    next = std::min(next, at + core_.opts.removal_event_grace);
  if (next != Clock::time_point::max()) schedule(next);
  core_.publish(lk, out);
  spdlog::debug("tracker: removal sweep: {} exited watched, {} removed{}", watched, removed,
                listed ? "" : " (the list failed: next sweep)");
}

}  // namespace kpleg::pleg
