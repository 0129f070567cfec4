// Selective decoders for what kpleg reads on its event loop: the runtime's GetContainerEvents
// messages, and the ids of a full list (the removal sweep's).
//
// Each event carries the pod's full sandbox status and the status of every container of the pod
// (annotations, mounts, image, resources, network...), of which kpleg reads a few fields of one
// container. The generated parser decodes all of it, and on a daemon that sleeps between events
// that cost more than reading the event off the socket. This decoder reads only what
// pleg::observation_of() uses:
//   container_id, container_event_type, created_at;
//   pod_sandbox_status: id, metadata, state, created_at, labels;
//   containers_statuses: only the entry of container_id, with id, metadata, state, created_at,
//     started_at, finished_at, exit_code, reason, message, labels;
// and skips every other field (unknown ones included) without copying it.
//
// Measured alone (kpleg-bench-event-decode, kubelet-like pods; CPU per event): STOPPED 2.9 us and
// 54 allocations against the generated parser's 5.0 us and 105 (5 containers: 3.7 us, 57 against
// 15.9 us, 289); CREATED 0.1-0.2 against 4-14 us; with cold caches 13-42 against 58-95 us.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cri/api.pb.h"

namespace kpleg::cri {

// Clears `out` and fills the fields above from the serialized ContainerEventResponse `wire`.
// False when `wire` is not a well-formed message (truncated, bad varint or length); `out` is
// then unspecified. For CREATED events only the first three fields are read.
bool decode_container_event(std::string_view wire, runtime::v1::ContainerEventResponse& out);

// The ids of a serialized ListContainersResponse or ListPodSandboxResponse (field 1: the items;
// each item's field 1: its id), in the list's order; nothing else of the items is read (a
// node's full list is mostly labels and annotations). False when `wire` is malformed.
bool decode_listed_ids(std::string_view wire, std::vector<std::string>& ids);

}  // namespace kpleg::cri
