// Mapping between kpleg's in-process event model (pleg::PodLifecycleEvent) and the wire
// messages of kpleg.v1. Enum numbers differ on purpose (proto3 reserves 0 for UNSPECIFIED), so
// every mapping is explicit.
#pragma once

#include "api/providers.h"
#include "kpleg/v1/pleg.pb.h"
#include "pleg/event.h"

namespace kpleg::api {

v1::EventType to_proto(pleg::EventType t);
v1::EventSource to_proto(pleg::EventSource s);
v1::ContainerState to_proto(pleg::ContainerState s);
pleg::EventType from_proto(v1::EventType t);
pleg::EventSource from_proto(v1::EventSource s);
pleg::ContainerState from_proto(v1::ContainerState s);

void to_proto(const pleg::ContainerSnapshot& in, v1::ContainerStatus* out);
void to_proto(const pleg::PodLifecycleEvent& in, v1::Event* out);
void to_proto(const pleg::PodRecord& in, v1::Pod* out);

pleg::ContainerSnapshot from_proto(const v1::ContainerStatus& in);
pleg::PodLifecycleEvent from_proto(const v1::Event& in);

}  // namespace kpleg::api
