// The runtime's containers (and sandboxes: a sandbox is a container with `sandbox` set and no
// name, as the kubelet treats it) in the three shapes kpleg carries them in:
//
//   RuntimeContainer  who one container is (id, kind, name, pod) and its state, as a full list
//                     reports it; the tracker's records keep one per id.
//   Observation       a RuntimeContainer and the status one inspection returned: a targeted
//                     look, a runtime event, a tracked container's last confirmed status.
//   ContainerRecord   one container of a PodRecord, which groups a pod's sandboxes and
//                     containers under one PodIdentity: the generic relist's view of a pod, and
//                     List's answer in either mode.
//
// Plain data with no protobuf, so that the consumer API (api/) shares them.
#pragma once

#include <string>
#include <vector>

#include "common/pod_identity.h"
#include "pleg/event.h"

namespace kpleg::pleg {

struct RuntimeContainer {
  std::string id;
  bool sandbox = false;
  std::string name;  // empty for sandboxes: the kubelet gives them no container name
  PodIdentity pod;
  ContainerState state = ContainerState::kUnknown;
};

struct Observation : RuntimeContainer {
  // What the runtime said. A look's state is snapshot.state; a tracked container's state is the
  // one last reported, and this the status that came with it.
  ContainerSnapshot snapshot;
  // A runtime's event: when the runtime sent it (CRI's created_at, realtime ns); 0 for a look.
  int64_t reported_at_ns = 0;
};

struct ContainerRecord {
  std::string id;  // the sandbox's own id when `sandbox` is true
  std::string name;
  bool sandbox = false;
  // The runtime's state as listed (created is kept; compare with pleg_state()).
  ContainerState state = ContainerState::kUnknown;
  // As listed (state, created_at_ns), or, once the pod was inspected, what the inspection said.
  ContainerSnapshot status;
};

struct PodRecord : PodIdentity {
  // Sandboxes and containers (see ContainerRecord::sandbox), each in the runtime's list order.
  std::vector<ContainerRecord> containers;

  // The container or sandbox with this id, or nullptr.
  const ContainerRecord* find(const std::string& id) const {
    for (const auto& c : containers)
      if (c.id == id) return &c;
    return nullptr;
  }
};

}  // namespace kpleg::pleg
