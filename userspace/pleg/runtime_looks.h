// The CRI calls of the kernel-driven path: one targeted look at a container or sandbox, and the
// full list that the start-up sync and the reconcile take. No state: what they return is
// judged by the tracker.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "cri/cri_client.h"
#include "pleg/containers.h"
#include "pleg/event.h"

namespace kpleg::pleg {

// ListPodSandbox + ListContainers, as the reconciler needs them: every container and sandbox
// (containers.h), with its pod.
Result<std::vector<RuntimeContainer>> list_runtime(cri::CriClient& cri);

// One look at `id`: ContainerStatus, or PodSandboxStatus when `sandbox`. When the kind is not
// known (`kind_known` false, `sandbox` is then the guess), the other call follows only when the
// runtime does not know the id as the guessed kind. An id the runtime knows as neither is
// reported kNonExistent. The observation names `id`, and its pod when the runtime knows it.
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
std::optional<Observation> observation_of(const cri::v1::ContainerEventResponse& ev);

}  // namespace kpleg::pleg
