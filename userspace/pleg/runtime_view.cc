#include "pleg/runtime_view.h"

#include <set>

namespace kpleg::pleg {
namespace {

using Labels = google::protobuf::Map<std::string, std::string>;

std::string label(const Labels& labels, const char* key) {
  auto it = labels.find(key);
  return it == labels.end() ? std::string() : it->second;
}

PodIdentity identity_from(const Labels& labels, const v1::PodSandboxMetadata& metadata) {
  PodIdentity id;
  id.uid = label(labels, kPodUidLabel);
  if (!id.uid.empty()) {
    id.labelled = true;
    id.name = label(labels, kPodNameLabel);
    id.namespace_ = label(labels, kPodNamespaceLabel);
  }
  // The metadata fills what the labels leave out: the CRI requires it on every sandbox.
  if (id.uid.empty()) id.uid = metadata.uid();
  if (id.name.empty()) id.name = metadata.name();
  if (id.namespace_.empty()) id.namespace_ = metadata.namespace_();
  return id;
}

PodIdentity container_identity(const Labels& labels, const PodIdentity* sandbox) {
  PodIdentity id;
  id.uid = label(labels, kPodUidLabel);
  if (!id.uid.empty()) {
    id.labelled = true;
    id.name = label(labels, kPodNameLabel);
    id.namespace_ = label(labels, kPodNamespaceLabel);
    if (sandbox != nullptr && sandbox->uid == id.uid) {
      if (id.name.empty()) id.name = sandbox->name;
      if (id.namespace_.empty()) id.namespace_ = sandbox->namespace_;
    }
    return id;
  }
  if (sandbox != nullptr) return *sandbox;
  return id;
}

std::string name_of(const Labels& labels, const v1::ContainerMetadata& metadata) {
  std::string name = label(labels, kContainerNameLabel);
  return name.empty() ? metadata.name() : name;
}

}  // namespace

ContainerState runtime_state(v1::ContainerState state) {
  switch (state) {
    case v1::CONTAINER_CREATED:
      return ContainerState::kCreated;
    case v1::CONTAINER_RUNNING:
      return ContainerState::kRunning;
    case v1::CONTAINER_EXITED:
      return ContainerState::kExited;
    default:
      return ContainerState::kUnknown;
  }
}

ContainerState runtime_state(v1::PodSandboxState state) {
  switch (state) {
    case v1::SANDBOX_READY:
      return ContainerState::kRunning;
    case v1::SANDBOX_NOTREADY:
      return ContainerState::kExited;
    default:
      return ContainerState::kUnknown;
  }
}

ContainerState pleg_state(ContainerState state) {
  return state == ContainerState::kCreated ? ContainerState::kUnknown : state;
}

ContainerSnapshot from_status(const v1::ContainerStatus& status) {
  ContainerSnapshot s;
  s.state = runtime_state(status.state());
  s.created_at_ns = status.created_at();
  s.started_at_ns = status.started_at();
  s.finished_at_ns = status.finished_at();
  s.exit_code = status.exit_code();
  s.reason = status.reason();
  s.message = status.message();
  return s;
}

ContainerSnapshot from_status(const v1::PodSandboxStatus& status) {
  ContainerSnapshot s;
  s.state = runtime_state(status.state());
  s.created_at_ns = status.created_at();
  return s;
}

PodIdentity pod_identity(const v1::PodSandbox& sandbox) {
  return identity_from(sandbox.labels(), sandbox.metadata());
}

PodIdentity pod_identity(const v1::PodSandboxStatus& status) {
  return identity_from(status.labels(), status.metadata());
}

PodIdentity pod_identity(const v1::Container& container, const PodIdentity* sandbox) {
  return container_identity(container.labels(), sandbox);
}

PodIdentity pod_identity(const v1::ContainerStatus& status, const PodIdentity* sandbox) {
  return container_identity(status.labels(), sandbox);
}

std::string container_name(const v1::Container& container) {
  return name_of(container.labels(), container.metadata());
}

std::string container_name(const v1::ContainerStatus& status) {
  return name_of(status.labels(), status.metadata());
}

ContainerState pleg_state_of(const PodRecord& pod, const std::string& id) {
  const ContainerRecord* c = pod.find(id);
  return c == nullptr ? ContainerState::kNonExistent : pleg_state(c->state);
}

size_t RuntimeSnapshot::container_count() const {
  size_t n = 0;
  for (const auto& [uid, pod] : pods) n += pod.containers.size();
  return n;
}

RuntimeSnapshot build_snapshot(const std::vector<v1::PodSandbox>& sandboxes,
                               const std::vector<v1::Container>& containers) {
  RuntimeSnapshot snap;
  std::map<std::string, PodIdentity> sandbox_pods;  // sandbox id -> its pod
  for (const auto& s : sandboxes) {
    if (s.id().empty()) continue;
    PodIdentity id = pod_identity(s);
    sandbox_pods[s.id()] = id;
    auto [it, inserted] = snap.pods.try_emplace(id.uid);
    PodRecord& pod = it->second;
    if (inserted) static_cast<PodIdentity&>(pod) = id;
    pod.labelled = pod.labelled || id.labelled;
    ContainerRecord r;
    r.id = s.id();
    r.sandbox = true;
    r.state = runtime_state(s.state());
    r.status.state = r.state;
    r.status.created_at_ns = s.created_at();
    pod.containers.push_back(std::move(r));
  }
  for (const auto& c : containers) {
    if (c.id().empty() || !c.has_metadata()) continue;
    auto sb = sandbox_pods.find(c.pod_sandbox_id());
    PodIdentity id = pod_identity(c, sb == sandbox_pods.end() ? nullptr : &sb->second);
    auto [it, inserted] = snap.pods.try_emplace(id.uid);
    PodRecord& pod = it->second;
    if (inserted) static_cast<PodIdentity&>(pod) = id;
    pod.labelled = pod.labelled || id.labelled;
    ContainerRecord r;
    r.id = c.id();
    r.name = container_name(c);
    r.state = runtime_state(c.state());
    r.status.state = r.state;
    r.status.created_at_ns = c.created_at();
    pod.containers.push_back(std::move(r));
  }
  return snap;
}

std::vector<const ContainerRecord*> containers_of(const PodRecord* old_pod,
                                                  const PodRecord* new_pod) {
  std::vector<const ContainerRecord*> out;
  std::set<std::string> seen;
  auto add = [&](const PodRecord& pod, bool sandboxes) {
    for (const auto& r : pod.containers)
      if (r.sandbox == sandboxes && seen.insert(r.id).second) out.push_back(&r);
  };
  for (const PodRecord* p : {old_pod, new_pod}) {
    if (p == nullptr) continue;
    add(*p, false);
    add(*p, true);
  }
  return out;
}

std::vector<PodLifecycleEvent> generate_events(const PodRecord& pod,
                                               const ContainerRecord& container,
                                               ContainerState old_state, ContainerState new_state) {
  old_state = pleg_state(old_state);
  new_state = pleg_state(new_state);
  if (old_state == new_state) return {};

  auto event = [&](EventType type) {
    PodLifecycleEvent ev;
    ev.type = type;
    ev.pod_uid = pod.uid;
    ev.pod_name = pod.name;
    ev.pod_namespace = pod.namespace_;
    ev.container_id = container.id;
    ev.container_name = container.name;
    ev.sandbox = container.sandbox;
    return ev;
  };
  switch (new_state) {
    case ContainerState::kRunning:
      return {event(EventType::kContainerStarted)};
    case ContainerState::kExited:
      return {event(EventType::kContainerDied)};
    case ContainerState::kNonExistent:
      // A container seen exited has had its ContainerDied already.
      if (old_state == ContainerState::kExited) return {event(EventType::kContainerRemoved)};
      return {event(EventType::kContainerDied), event(EventType::kContainerRemoved)};
    case ContainerState::kCreated:  // not reached: pleg_state() folds it into unknown
    case ContainerState::kUnknown:
      return {event(EventType::kContainerChanged)};
  }
  return {};
}

bool is_sent(EventType type) { return type != EventType::kContainerChanged; }

}  // namespace kpleg::pleg
