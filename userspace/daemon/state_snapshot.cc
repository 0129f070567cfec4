#include "daemon/state_snapshot.h"

#include <map>
#include <string>
#include <utility>

namespace kpleg::daemon {

namespace {

// Pods by uid, in uid order.
class PodsByUid {
 public:
  api::PodRecord& pod(const std::string& uid) {
    auto& p = pods_[uid];
    p.uid = uid;
    return p;
  }
  api::StateSnapshot take(uint64_t seq) {
    api::StateSnapshot snap;
    snap.seq = seq;
    for (auto& [_, p] : pods_) snap.pods.push_back(std::move(p));
    return snap;
  }

 private:
  std::map<std::string, api::PodRecord> pods_;
};

api::ContainerRecord record_of(const std::string& id, const std::string& name, bool sandbox,
                               const pleg::ContainerSnapshot& status, pleg::ContainerState state) {
  api::ContainerRecord cr;
  cr.id = id;
  cr.name = name;
  cr.sandbox = sandbox;
  cr.status = status;
  cr.status.state = state;
  return cr;
}

}  // namespace

api::StateSnapshot snapshot_of(uint64_t seq,
                               const std::vector<pleg::TrackedContainer>& containers) {
  PodsByUid pods;
  for (const auto& tc : containers) {
    const auto& id = tc.identity;
    auto& pod = pods.pod(id.pod_uid);
    if (!id.pod_name.empty()) pod.name = id.pod_name;
    if (!id.pod_namespace.empty()) pod.pod_namespace = id.pod_namespace;
    auto cr = record_of(id.id, id.name, id.sandbox, tc.status, id.state);
    if (tc.oom_killed && cr.status.reason.empty()) cr.status.reason = "OOMKilled";
    pod.containers.push_back(std::move(cr));
  }
  return pods.take(seq);
}

api::StateSnapshot snapshot_of(uint64_t seq, const std::vector<pleg::PodRecord>& records) {
  PodsByUid pods;
  for (const auto& pr : records) {
    auto& pod = pods.pod(pr.uid);
    pod.name = pr.name;
    pod.pod_namespace = pr.namespace_;
    for (const auto* list : {&pr.sandboxes, &pr.containers}) {
      for (const auto& c : *list)
        pod.containers.push_back(record_of(c.id, c.name, c.sandbox, c.status, c.state));
    }
  }
  return pods.take(seq);
}

}  // namespace kpleg::daemon
