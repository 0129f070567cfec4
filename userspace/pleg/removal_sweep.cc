// RemovalWatcher's sweep (removal_watcher.h): planned on the tracker's loop, its lists made off
// the loop, its verdict back on the loop.
#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "pleg/removal_watcher.h"

namespace kpleg::pleg {

void RemovalWatcher::schedule(Clock::time_point at) {
  if (due_ && *due_ <= at) return;
  due_ = at;
  if (sweeping_) return;  // the sweep under way plans its successor (judge())
  core_.cancel(sweep_timer_);  // a later sweep would wake the loop for nothing
  // Containers dying and going (the last sweep a period or two ago): the loop is awake often
  // for them, and the sweep can go with one of those wakeups instead of one of its own. A
  // lone removal's sweep goes on time. A quarter of the period at most.
  const auto period = core_.opts().removal_sweep_period;
  const bool churn = last_sweep_ && at - *last_sweep_ <= 2 * period;
  const auto slack = churn ? std::min(core_.opts().removal_sweep_slack, period / 4)
                           : std::chrono::milliseconds::zero();
  sweep_timer_ = core_.at(at, slack, [this] { sweep(); }, "removal sweep");
}

void RemovalWatcher::check(const std::string& id) {
  const Record* rec = core_.table().find(id);
  if (rec == nullptr || rec->reported == ContainerState::kNonExistent) return;
  ++core_.stats().removal_checks;
  core_.look(rec->identity.pod.uid, id, true, rec->identity.sandbox,
             [this, id](Result<Observation> obs) {
               if (!obs.ok() || obs->state != ContainerState::kNonExistent) return;  // the sweep goes on
               Record* rec = core_.table().find(id);
               if (rec == nullptr) return;
               Events out;
               core_.advance(*rec, ContainerState::kNonExistent, obs->snapshot,
                             EventSource::kKernel, false, out);
               core_.publish(out);
             });
}

void RemovalWatcher::sweep() {
  sweep_timer_ = 0;
  due_.reset();
  // The runtime's events held back meanwhile (a DELETED) may settle what this would list for.
  core_.read_events(true);
  last_sweep_ = Clock::now();
  // So do the hints held back (the next sweep for those this one still finds: one period on).
  if (hints_ != nullptr) hints_->take_held();
  find_missed_deleted_events(Clock::now());
  find_missed_hints(Clock::now());
  const bool joined = std::exchange(joined_, false);
  bool containers = false, sandboxes = false;
  for (auto it = watched_.begin(); it != watched_.end();) {
    const Record* rec = core_.table().find(*it);
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
  // Full lists, not ones filtered by state: a container the runtime reloaded as UNKNOWN (after
  // a restart that could not read its status) is not listed as exited but still exists. What a
  // full list leaves out, the runtime no longer has: that is the evidence the kubelet's relist
  // takes for ContainerRemoved too.
  sweeping_ = true;
  if (list_on_loop(containers, sandboxes, joined)) return;
  // A client that cannot list on the loop (the tests' in-memory runtime): off the loop, a
  // blocking list of a large node takes long.
  static const std::string kSweepKey = "\x01removal-sweep";
  core_.offload(kSweepKey, [this, containers, sandboxes, joined] {
    auto still_there = std::make_shared<std::set<std::string>>();
    auto collect = [&](const auto& listed_ids) {
      if (!listed_ids) {
        spdlog::debug("tracker: removal sweep: {}", listed_ids.error().message);
        return false;
      }
      for (const auto& item : *listed_ids) still_there->insert(item.id());
      return true;
    };
    bool listed = true;
    if (containers) listed = collect(core_.cri().list_containers({}));
    if (sandboxes && listed) listed = collect(core_.cri().list_pod_sandboxes({}));
    core_.loop().post([this, containers, sandboxes, joined, listed, still_there] {
      judge(containers, sandboxes, joined, listed, *still_there);
    });
  });
}

bool RemovalWatcher::list_on_loop(bool containers, bool sandboxes, bool joined) {
  cri::AsyncStatusCalls* calls = core_.async_calls();
  if (calls == nullptr) return false;
  // Streams of the looks' connection: the loop is not held while the runtime lists, and only
  // the ids of its answer are decoded. The verdict once both lists are in.
  struct Lists {
    int left = 0;
    bool listed = true;
    std::set<std::string> still_there;
  };
  auto lists = std::make_shared<Lists>();
  lists->left = int(containers) + int(sandboxes);
  auto on_list = [this, lists, containers, sandboxes, joined](
                     Result<std::vector<std::string>> ids) {
    if (!ids) {
      spdlog::debug("tracker: removal sweep: {}", ids.error().message);
      lists->listed = false;
    } else {
      lists->still_there.insert(ids->begin(), ids->end());
    }
    if (--lists->left == 0)
      judge(containers, sandboxes, joined, lists->listed, lists->still_there);
  };
  if (lists->left == 0) {
    judge(containers, sandboxes, joined, true, {});
    return true;
  }
  bool started = false;
  for (const bool of_sandboxes : {false, true}) {
    if (!(of_sandboxes ? sandboxes : containers)) continue;
    if (calls->list_ids(of_sandboxes, on_list)) {
      started = true;
    } else if (!started) {
      return false;  // not served on the loop: the caller lists off it
    } else {
      on_list(Error{grpc::StatusCode::UNIMPLEMENTED, "ListPodSandbox not served on the loop"});
    }
  }
  return true;
}

void RemovalWatcher::judge(bool containers, bool sandboxes, bool joined, bool listed,
                           const std::set<std::string>& still_there) {
  sweeping_ = false;
  core_.stats().removal_sweeps += uint64_t(containers) + uint64_t(sandboxes);
  size_t watched = 0, removed = 0;
  bool remaining = false;
  bool early_hint = false;  // a hinted record is still there: its removal is under way
  // How long every record still watched may wait because something announces its removal.
  auto wait = std::chrono::milliseconds::max();
  const auto now = Clock::now();
  Events out;
  for (auto wit = watched_.begin(); wit != watched_.end();) {
    Record* found = core_.table().find(*wit);
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
      if (armed_.count(id) && !hints_paused_) {  // a paused source hints nothing meanwhile
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
    interval_ = removed > 0 || joined ? core_.opts().removal_sweep_period
                                      : std::min(interval_ * 2, core_.opts().removal_sweep_idle_max);
    interval_ = std::max(interval_, wait);  // zero unless every record's removal is announced
    next = now + interval_;
    if (early_hint) next = std::min(next, now + core_.opts().removal_hint_delay);
  }
  // The verdict on the removals whose DELETED or hint is awaited (no list is made for it alone).
  for (const auto& [_, at] : awaiting_deleted_)
    next = std::min(next, at + core_.opts().removal_event_grace);
  for (const auto& [_, at] : awaiting_hint_)
    next = std::min(next, at + core_.opts().removal_event_grace);
  // A sweep asked for while the lists were made.
  if (due_) next = std::min(next, *due_);
  due_.reset();
  if (next != Clock::time_point::max()) schedule(next);
  core_.publish(out);
  spdlog::debug("tracker: removal sweep: {} exited watched, {} removed{}", watched, removed,
                listed ? "" : " (the list failed: next sweep)");
}

}  // namespace kpleg::pleg
