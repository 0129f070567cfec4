#include "daemon/state_snapshot.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace kpleg::daemon {

namespace {

// List shows a container's state in its status.
pleg::ContainerRecord record_of(const pleg::RuntimeContainer& c,
                                const pleg::ContainerSnapshot& status) {
  pleg::ContainerRecord cr{c.id, c.name, c.sandbox, c.state, status};
  cr.status.state = c.state;
  return cr;
}

}  // namespace

api::StateSnapshot snapshot_of(uint64_t seq, const std::vector<pleg::Observation>& containers) {
  std::map<std::string, pleg::PodRecord> pods;  // by uid, in uid order
  for (const auto& c : containers) {
    auto& pod = pods[c.pod.uid];
    pod.uid = c.pod.uid;
    if (!c.pod.name.empty()) pod.name = c.pod.name;
    if (!c.pod.namespace_.empty()) pod.namespace_ = c.pod.namespace_;
    pod.containers.push_back(record_of(c, c.snapshot));
  }
  api::StateSnapshot snap;
  snap.seq = seq;
  for (auto& [_, p] : pods) snap.pods.push_back(std::move(p));
  return snap;
}

api::StateSnapshot snapshot_of(uint64_t seq, std::vector<pleg::PodRecord> pods) {
  std::sort(pods.begin(), pods.end(), [](const auto& a, const auto& b) { return a.uid < b.uid; });
  for (auto& pod : pods)
    for (auto& c : pod.containers) c.status.state = c.state;
  return api::StateSnapshot{seq, std::move(pods)};
}

}  // namespace kpleg::daemon
