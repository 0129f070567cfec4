#include "api/convert.h"

#include <cstddef>
#include <utility>

namespace kpleg::api {

namespace {

// Each enum's pairs, written once and read both ways. A wire value without a pair (UNSPECIFIED,
// or a newer peer's) reads as the fallback its from_proto names.
template <typename Pleg, typename Wire>
using Pair = std::pair<Pleg, Wire>;

constexpr Pair<pleg::EventType, v1::EventType> kEventTypes[] = {
    {pleg::EventType::kContainerStarted, v1::EVENT_TYPE_CONTAINER_STARTED},
    {pleg::EventType::kContainerDied, v1::EVENT_TYPE_CONTAINER_DIED},
    {pleg::EventType::kContainerRemoved, v1::EVENT_TYPE_CONTAINER_REMOVED},
    {pleg::EventType::kPodSync, v1::EVENT_TYPE_POD_SYNC},
    {pleg::EventType::kContainerChanged, v1::EVENT_TYPE_CONTAINER_CHANGED},
    {pleg::EventType::kResync, v1::EVENT_TYPE_RESYNC},
};
constexpr Pair<pleg::EventSource, v1::EventSource> kEventSources[] = {
    {pleg::EventSource::kKernel, v1::EVENT_SOURCE_KERNEL},
    {pleg::EventSource::kRelist, v1::EVENT_SOURCE_RELIST},
    {pleg::EventSource::kReconcile, v1::EVENT_SOURCE_RECONCILE},
};
constexpr Pair<pleg::ContainerState, v1::ContainerState> kContainerStates[] = {
    {pleg::ContainerState::kCreated, v1::CONTAINER_STATE_CREATED},
    {pleg::ContainerState::kRunning, v1::CONTAINER_STATE_RUNNING},
    {pleg::ContainerState::kExited, v1::CONTAINER_STATE_EXITED},
    {pleg::ContainerState::kUnknown, v1::CONTAINER_STATE_UNKNOWN},
    {pleg::ContainerState::kNonExistent, v1::CONTAINER_STATE_NON_EXISTENT},
};

template <typename Pleg, typename Wire, size_t N>
constexpr Wire wire_of(const Pair<Pleg, Wire> (&pairs)[N], Pleg value, Wire otherwise) {
  for (const auto& [p, w] : pairs)
    if (p == value) return w;
  return otherwise;
}

template <typename Pleg, typename Wire, size_t N>
constexpr Pleg pleg_of(const Pair<Pleg, Wire> (&pairs)[N], Wire value, Pleg otherwise) {
  for (const auto& [p, w] : pairs)
    if (w == value) return p;
  return otherwise;
}

// One pair per kpleg value, in kpleg's order (its enums count up from 0): a value added to
// pleg/event.h without its pair stops the build, as the switch's -Wswitch did.
template <typename Pleg, typename Wire, size_t N>
constexpr bool pairs_all(const Pair<Pleg, Wire> (&pairs)[N], Pleg last) {
  if (N != static_cast<size_t>(last) + 1) return false;
  for (size_t i = 0; i < N; ++i)
    if (pairs[i].first != static_cast<Pleg>(i)) return false;
  return true;
}
static_assert(pairs_all(kEventTypes, pleg::EventType::kResync));
static_assert(pairs_all(kEventSources, pleg::EventSource::kReconcile));
static_assert(pairs_all(kContainerStates, pleg::ContainerState::kNonExistent));

}  // namespace

v1::EventType to_proto(pleg::EventType t) {
  return wire_of(kEventTypes, t, v1::EVENT_TYPE_UNSPECIFIED);
}
pleg::EventType from_proto(v1::EventType t) {
  // "re-inspect the pod" is the safe reading of a type kpleg does not know.
  return pleg_of(kEventTypes, t, pleg::EventType::kPodSync);
}

v1::EventSource to_proto(pleg::EventSource s) {
  return wire_of(kEventSources, s, v1::EVENT_SOURCE_UNSPECIFIED);
}
pleg::EventSource from_proto(v1::EventSource s) {
  return pleg_of(kEventSources, s, pleg::EventSource::kKernel);
}

v1::ContainerState to_proto(pleg::ContainerState s) {
  return wire_of(kContainerStates, s, v1::CONTAINER_STATE_UNSPECIFIED);
}
pleg::ContainerState from_proto(v1::ContainerState s) {
  return pleg_of(kContainerStates, s, pleg::ContainerState::kUnknown);
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

void to_proto(const pleg::PodRecord& in, v1::Pod* out) {
  out->set_uid(in.uid);
  out->set_name(in.name);
  out->set_namespace_(in.namespace_);
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
