#include "api/convert.h"

namespace kpleg::api {

v1::EventType to_proto(pleg::EventType t) {
  switch (t) {
    case pleg::EventType::kContainerStarted:
      return v1::EVENT_TYPE_CONTAINER_STARTED;
    case pleg::EventType::kContainerDied:
      return v1::EVENT_TYPE_CONTAINER_DIED;
    case pleg::EventType::kContainerRemoved:
      return v1::EVENT_TYPE_CONTAINER_REMOVED;
    case pleg::EventType::kPodSync:
      return v1::EVENT_TYPE_POD_SYNC;
    case pleg::EventType::kContainerChanged:
      return v1::EVENT_TYPE_CONTAINER_CHANGED;
    case pleg::EventType::kResync:
      return v1::EVENT_TYPE_RESYNC;
  }
  return v1::EVENT_TYPE_UNSPECIFIED;
}

pleg::EventType from_proto(v1::EventType t) {
  switch (t) {
    case v1::EVENT_TYPE_CONTAINER_STARTED:
      return pleg::EventType::kContainerStarted;
    case v1::EVENT_TYPE_CONTAINER_DIED:
      return pleg::EventType::kContainerDied;
    case v1::EVENT_TYPE_CONTAINER_REMOVED:
      return pleg::EventType::kContainerRemoved;
    case v1::EVENT_TYPE_CONTAINER_CHANGED:
      return pleg::EventType::kContainerChanged;
    case v1::EVENT_TYPE_RESYNC:
      return pleg::EventType::kResync;
    default:
      return pleg::EventType::kPodSync;  // "re-inspect the pod" is the safe reading
  }
}

v1::EventSource to_proto(pleg::EventSource s) {
  switch (s) {
    case pleg::EventSource::kKernel:
      return v1::EVENT_SOURCE_KERNEL;
    case pleg::EventSource::kRelist:
      return v1::EVENT_SOURCE_RELIST;
    case pleg::EventSource::kReconcile:
      return v1::EVENT_SOURCE_RECONCILE;
  }
  return v1::EVENT_SOURCE_UNSPECIFIED;
}

pleg::EventSource from_proto(v1::EventSource s) {
  switch (s) {
    case v1::EVENT_SOURCE_RELIST:
      return pleg::EventSource::kRelist;
    case v1::EVENT_SOURCE_RECONCILE:
      return pleg::EventSource::kReconcile;
    default:
      return pleg::EventSource::kKernel;
  }
}

v1::ContainerState to_proto(pleg::ContainerState s) {
  switch (s) {
    case pleg::ContainerState::kCreated:
      return v1::CONTAINER_STATE_CREATED;
    case pleg::ContainerState::kRunning:
      return v1::CONTAINER_STATE_RUNNING;
    case pleg::ContainerState::kExited:
      return v1::CONTAINER_STATE_EXITED;
    case pleg::ContainerState::kUnknown:
      return v1::CONTAINER_STATE_UNKNOWN;
    case pleg::ContainerState::kNonExistent:
      return v1::CONTAINER_STATE_NON_EXISTENT;
  }
  return v1::CONTAINER_STATE_UNSPECIFIED;
}

pleg::ContainerState from_proto(v1::ContainerState s) {
  switch (s) {
    case v1::CONTAINER_STATE_CREATED:
      return pleg::ContainerState::kCreated;
    case v1::CONTAINER_STATE_RUNNING:
      return pleg::ContainerState::kRunning;
    case v1::CONTAINER_STATE_EXITED:
      return pleg::ContainerState::kExited;
    case v1::CONTAINER_STATE_NON_EXISTENT:
      return pleg::ContainerState::kNonExistent;
    default:
      return pleg::ContainerState::kUnknown;
  }
}

void to_proto(const pleg::ContainerSnapshot& in, v1::ContainerStatus* out) {
  out->set_state(to_proto(in.state));
  out->set_created_at_ns(in.created_at_ns);
  out->set_started_at_ns(in.started_at_ns);
  out->set_finished_at_ns(in.finished_at_ns);
  out->set_exit_code(in.exit_code);
  out->set_reason(in.reason);
  out->set_message(in.message);
}

void to_proto(const pleg::PodLifecycleEvent& in, v1::Event* out) {
  out->Clear();
  out->set_seq(in.seq);
  out->set_type(to_proto(in.type));
  out->set_pod_uid(in.pod_uid);
  out->set_pod_name(in.pod_name);
  out->set_pod_namespace(in.pod_namespace);
  out->set_container_id(in.container_id);
  out->set_container_name(in.container_name);
  out->set_sandbox(in.sandbox);
  out->set_exit_code(in.exit_code);
  out->set_reason(in.reason);
  // A RESYNC marker was not observed by anything; its source would only mislead.
  out->set_source(in.type == pleg::EventType::kResync ? v1::EVENT_SOURCE_UNSPECIFIED
                                                      : to_proto(in.source));
  out->set_correction(in.correction);
  out->set_kernel_ts_ns(in.kernel_ts_ns);
  out->set_emit_ts_ns(in.emit_ts_ns);
  if (in.type != pleg::EventType::kResync) to_proto(in.status, out->mutable_status());
}

void to_proto(const PodRecord& in, v1::Pod* out) {
  out->set_uid(in.uid);
  out->set_name(in.name);
  out->set_namespace_(in.pod_namespace);
  for (const auto& c : in.containers) {
    auto* pc = out->add_containers();
    pc->set_id(c.id);
    pc->set_name(c.name);
    pc->set_sandbox(c.sandbox);
    to_proto(c.status, pc->mutable_status());
  }
}

pleg::ContainerSnapshot from_proto(const v1::ContainerStatus& in) {
  pleg::ContainerSnapshot out;
  out.state = from_proto(in.state());
  out.created_at_ns = in.created_at_ns();
  out.started_at_ns = in.started_at_ns();
  out.finished_at_ns = in.finished_at_ns();
  out.exit_code = in.exit_code();
  out.reason = in.reason();
  out.message = in.message();
  return out;
}

pleg::PodLifecycleEvent from_proto(const v1::Event& in) {
  pleg::PodLifecycleEvent out;
  out.seq = in.seq();
  out.type = from_proto(in.type());
  out.pod_uid = in.pod_uid();
  out.pod_name = in.pod_name();
  out.pod_namespace = in.pod_namespace();
  out.container_id = in.container_id();
  out.container_name = in.container_name();
  out.sandbox = in.sandbox();
  out.exit_code = in.exit_code();
  out.reason = in.reason();
  out.source = from_proto(in.source());
  out.correction = in.correction();
  out.kernel_ts_ns = in.kernel_ts_ns();
  out.emit_ts_ns = in.emit_ts_ns();
  out.status = from_proto(in.status());
  return out;
}

}  // namespace kpleg::api
