#include "pleg/reconcile_diff.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kpleg::pleg {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

ReconcileDiff::Inspected ReconcileDiff::inspect(
    cri::CriClient& cri, const std::vector<RuntimeContainer>& view,
    const std::function<int(const std::string&)>& reported_rank) {
  Inspected out;
  for (const auto& rc : view) {
    if (rank(rc.state) == 0) continue;  // nothing to emit for created/unknown
    if (reported_rank(rc.id) >= rank(rc.state)) continue;
    out.emplace(rc.id, look(cri, rc.id, true, rc.sandbox));
  }
  return out;
}

void ReconcileDiff::apply(const std::vector<RuntimeContainer>& view, bool initial,
                          const Inspected& inspected) {
  std::map<std::string, const RuntimeContainer*> seen;
  for (const auto& rc : view) seen[rc.id] = &rc;
  for (const auto& [id, obs] : inspected) core_.note_call(id, obs.ok() ? nullptr : &obs.error());

  Events out;
  // A difference may be a kernel event still on its way: look again after a grace period with
  // a targeted call before calling it a correction. At start-up, a container missing from the
  // list may have been made after the list was taken: a look, never an event from the list.
  auto look_again = [&](const std::string& id) {
    const bool correction = !initial;
    core_.at(Clock::now() + (initial ? milliseconds(0) : core_.opts().correction_grace),
             [this, id, correction] { recheck(id, milliseconds(1000), correction); },
             "reconcile: recheck");
  };
  for (const auto& rc : view) {
    Record& rec = core_.table().at(rc.id);
    core_.table().adopt_listed(rec, rc);
    if (rank(rc.state) <= rank(rec.reported)) continue;
    if (initial) {
      // With the runtime's status, as inspected above (the bare list state if that failed).
      auto it = inspected.find(rc.id);
      ContainerSnapshot snap;
      snap.state = rc.state;
      if (it != inspected.end() && it->second.ok()) snap = it->second->snapshot;
      core_.advance(rec, snap.state, snap, EventSource::kReconcile, false, out);
    } else if (rec.pending == 0) {
      look_again(rc.id);
    }
  }
  // Tracked containers the runtime no longer lists.
  for (auto& [id, rec] : core_.table().records()) {
    if (seen.count(id) || rec.reported == ContainerState::kNonExistent) continue;
    if (!rec.known() && rank(rec.reported) == 0) continue;  // never known
    if (rec.reported == ContainerState::kExited && !initial) {
      // Removals of exited containers have no kernel signal: the removal watcher finds them. A
      // relist that comes first is not a correction; it only makes the watcher look now (a
      // list taken before the container was created would not show it either, hence the look).
      core_.at(Clock::now(), [this, id = id] { removal_.check(id); }, "reconcile: removal check");
    } else if (rec.pending == 0 || initial) {
      look_again(id);
    }
  }
  core_.table().forget_removed(Clock::now(), core_.opts().removed_retention);
  core_.publish(out);
}

void ReconcileDiff::recheck(const std::string& id, milliseconds retry, bool correction) {
  const Record* rec = core_.table().find(id);
  if (rec == nullptr) return;                    // removed and forgotten meanwhile
  if (rec->pending > 0 && correction) return;  // the kernel path has it
  core_.look(rec->identity.pod.uid, id, true, rec->identity.sandbox,
             [this, id, retry, correction](Result<Observation> obs) {
               on_recheck(id, retry, correction, std::move(obs));
             });
}

void ReconcileDiff::on_recheck(const std::string& id, milliseconds retry, bool correction,
                               Result<Observation> obs) {
  if (!obs) {
    // The runtime does not answer for this pod (hung, erroring): keep asking, less and less
    // often, rather than leaving a known difference to the next periodic reconcile.
    auto next = std::min(retry * 2, milliseconds(30'000));
    core_.at(Clock::now() + retry,
             [this, id, next, correction] { recheck(id, next, correction); },
             "reconcile: recheck");
    return;
  }
  Record* found = core_.table().find(id);
  if (found == nullptr) return;
  Record& rec = *found;
  if (rec.pending > 0 && correction) return;
  core_.table().adopt_identity(rec, *obs);
  Events out;
  const bool corrected =
      core_.advance(rec, obs->state, obs->snapshot, EventSource::kReconcile, correction, out) > 0 &&
      correction;
  const std::string what = rec.identity.sandbox ? "sandbox" : "container";
  const std::string ns = rec.identity.pod.namespace_, name = rec.identity.pod.name;
  core_.publish(out);
  if (corrected) spdlog::warn("reconcile corrected {} {}/{} to {}", what, ns, name, to_string(obs->state));
}

}  // namespace kpleg::pleg
