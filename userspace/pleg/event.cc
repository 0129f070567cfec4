#include "pleg/event.h"

#include <time.h>

#include <nlohmann/json.hpp>

namespace kpleg::pleg {

const char* to_string(EventType t) {
  switch (t) {
    case EventType::kContainerStarted: return "ContainerStarted";
    case EventType::kContainerDied: return "ContainerDied";
    case EventType::kContainerRemoved: return "ContainerRemoved";
    case EventType::kPodSync: return "PodSync";
    case EventType::kContainerChanged: return "ContainerChanged";
    case EventType::kResync: return "Resync";
  }
  return "?";
}

const char* to_string(EventSource s) {
  switch (s) {
    case EventSource::kKernel: return "kernel";
    case EventSource::kRelist: return "relist";
    case EventSource::kReconcile: return "reconcile";
  }
  return "?";
}

const char* to_string(ContainerState s) {
  switch (s) {
    case ContainerState::kCreated: return "created";
    case ContainerState::kRunning: return "running";
    case ContainerState::kExited: return "exited";
    case ContainerState::kUnknown: return "unknown";
    case ContainerState::kNonExistent: return "non-existent";
  }
  return "?";
}

std::string to_json_line(const PodLifecycleEvent& ev) {
  nlohmann::ordered_json j;
  j["seq"] = ev.seq;
  j["type"] = to_string(ev.type);
  j["pod_uid"] = ev.pod_uid;
  j["pod_name"] = ev.pod_name;
  j["pod_namespace"] = ev.pod_namespace;
  j["container_id"] = ev.container_id;
  j["container_name"] = ev.container_name;
  j["sandbox"] = ev.sandbox;
  j["exit_code"] = ev.exit_code;
  j["reason"] = ev.reason;
  j["source"] = to_string(ev.source);
  j["correction"] = ev.correction;
  j["kernel_ts_ns"] = ev.kernel_ts_ns;
  j["emit_ts_ns"] = ev.emit_ts_ns;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

uint64_t realtime_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

}  // namespace kpleg::pleg
