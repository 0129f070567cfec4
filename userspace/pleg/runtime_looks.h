// The CRI calls of the kernel-driven path: one targeted look at a container or sandbox, and the
// full list that the start-up sync and the reconcile take. No state: what they return is
// judged by the tracker.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "cri/cri_client.h"
#include "pleg/event.h"

namespace kpleg::pleg {

// One container (or sandbox) as a full runtime list reports it.
struct RuntimeContainer {
  std::string id;
  std::string pod_uid;
  std::string pod_name;
  std::string pod_namespace;
  std::string name;  // empty for sandboxes
  bool sandbox = false;
  ContainerState state = ContainerState::kUnknown;
};

// ListPodSandbox + ListContainers, as the reconciler and the List API need them.
Result<std::vector<RuntimeContainer>> list_runtime(cri::CriClient& cri);

// What one targeted CRI call reported of a container or sandbox.
struct Observation {
  ContainerState state = ContainerState::kUnknown;
  ContainerSnapshot snapshot;
  bool sandbox = false;
  std::string pod_uid, pod_name, pod_namespace, name;
};

// One look at `id`: ContainerStatus, or PodSandboxStatus when `sandbox`. When the kind is not
// known (`kind_known` false, `sandbox` is then the guess), the other call follows only when the
// runtime does not know the id as the guessed kind. An id the runtime knows as neither is
// reported kNonExistent.
Result<Observation> look(cri::CriClient& cri, const std::string& id, bool kind_known,
                         bool sandbox);

// look() without blocking, on an event loop: `done` gets the outcome there.
void look_async(cri::AsyncStatusCalls& calls, const std::string& id, bool kind_known,
                bool sandbox, std::function<void(Result<Observation>)> done);

// What one event of the runtime's GetContainerEvents stream says of the container or sandbox it
// names (`container_id`; a sandbox's events name the sandbox itself): the same as a look at it
// at the moment the runtime sent the event, which it does after recording the change. A DELETED
// event says kNonExistent. nullopt when the event says nothing a look would (a CREATED event,
// no id, or a container missing from its pod's statuses).
std::optional<std::pair<std::string, Observation>> observation_of(
    const cri::v1::ContainerEventResponse& ev);

}  // namespace kpleg::pleg
