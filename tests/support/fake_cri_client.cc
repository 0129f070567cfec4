#include "support/fake_cri_client.h"

#include <grpcpp/support/status.h>

#include <cstdio>

namespace kpleg::cri {
namespace {

bool labels_match(const google::protobuf::Map<std::string, std::string>& selector,
                  const google::protobuf::Map<std::string, std::string>& labels) {
  for (const auto& [k, v] : selector) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

}  // namespace

FakeCriClient::FakeCriClient() {
  now_ns_ = [this] { return fake_clock_ns_ += 1'000'000; };
}

std::optional<Error> FakeCriClient::injected_failure(CriMethod method) {
  if (auto it = fail_next_.find(method); it != fail_next_.end() && !it->second.empty()) {
    Error e = it->second.front();
    it->second.erase(it->second.begin());
    return e;
  }
  if (auto it = fail_always_.find(method); it != fail_always_.end()) return it->second;
  return std::nullopt;
}

Error FakeCriClient::not_found(CriMethod method, const std::string& what, const std::string& id) {
  return Error{grpc::StatusCode::NOT_FOUND,
               std::string("CRI ") + std::string(cri_method_name(method)) +
                   " failed: NOT_FOUND: " + what + " \"" + id + "\" not found"};
}

std::string FakeCriClient::next_id() {
  char buf[65];
  std::snprintf(buf, sizeof buf, "%064llx", static_cast<unsigned long long>(next_id_++));
  return buf;
}

void FakeCriClient::fail_next(CriMethod method, Error error) {
  std::lock_guard lock(mu_);
  fail_next_[method].push_back(std::move(error));
}

void FakeCriClient::fail_always(CriMethod method, std::optional<Error> error) {
  std::lock_guard lock(mu_);
  if (error) {
    fail_always_[method] = std::move(*error);
  } else {
    fail_always_.erase(method);
  }
}

void FakeCriClient::set_clock(std::function<int64_t()> now_ns) {
  std::lock_guard lock(mu_);
  now_ns_ = std::move(now_ns);
}

uint64_t FakeCriClient::calls(CriMethod method) const {
  std::lock_guard lock(mu_);
  return stats_.total(method);
}

Result<v1::VersionResponse> FakeCriClient::version() {
  return call<Result<v1::VersionResponse>>(CriMethod::kVersion,
                                           [&]() -> Result<v1::VersionResponse> {
                                             v1::VersionResponse v;
                                             v.set_version("0.1.0");
                                             v.set_runtime_name("fake");
                                             v.set_runtime_version("1.0.0");
                                             v.set_runtime_api_version("v1");
                                             return v;
                                           });
}

Result<v1::RuntimeStatus> FakeCriClient::status() {
  return call<Result<v1::RuntimeStatus>>(CriMethod::kStatus, [&]() -> Result<v1::RuntimeStatus> {
    v1::RuntimeStatus s;
    for (const char* type : {"RuntimeReady", "NetworkReady"}) {
      auto* c = s.add_conditions();
      c->set_type(type);
      c->set_status(true);
    }
    return s;
  });
}

Result<std::vector<v1::PodSandbox>> FakeCriClient::list_pod_sandboxes(
    const v1::PodSandboxFilter& filter) {
  return call<Result<std::vector<v1::PodSandbox>>>(
      CriMethod::kListPodSandbox, [&]() -> Result<std::vector<v1::PodSandbox>> {
        std::vector<v1::PodSandbox> out;
        for (const auto& [id, pod] : pods_) {
          const auto& s = pod.status;
          if (!filter.id().empty() && filter.id() != id) continue;
          if (filter.has_state() && filter.state().state() != s.state()) continue;
          if (!labels_match(filter.label_selector(), s.labels())) continue;
          v1::PodSandbox p;
          p.set_id(id);
          *p.mutable_metadata() = s.metadata();
          p.set_state(s.state());
          p.set_created_at(s.created_at());
          *p.mutable_labels() = s.labels();
          *p.mutable_annotations() = s.annotations();
          out.push_back(std::move(p));
        }
        return out;
      });
}

Result<v1::PodSandboxStatus> FakeCriClient::pod_sandbox_status(const std::string& pod_sandbox_id) {
  return call<Result<v1::PodSandboxStatus>>(
      CriMethod::kPodSandboxStatus, [&]() -> Result<v1::PodSandboxStatus> {
        auto it = pods_.find(pod_sandbox_id);
        if (it == pods_.end())
          return not_found(CriMethod::kPodSandboxStatus, "sandbox", pod_sandbox_id);
        return it->second.status;
      });
}

Result<std::vector<v1::Container>> FakeCriClient::list_containers(
    const v1::ContainerFilter& filter) {
  return call<Result<std::vector<v1::Container>>>(
      CriMethod::kListContainers, [&]() -> Result<std::vector<v1::Container>> {
        std::vector<v1::Container> out;
        for (const auto& [id, c] : containers_) {
          const auto& s = c.status;
          if (!filter.id().empty() && filter.id() != id) continue;
          if (!filter.pod_sandbox_id().empty() && filter.pod_sandbox_id() != c.pod_sandbox_id)
            continue;
          if (filter.has_state() && filter.state().state() != s.state()) continue;
          if (!labels_match(filter.label_selector(), s.labels())) continue;
          v1::Container l;
          l.set_id(id);
          l.set_pod_sandbox_id(c.pod_sandbox_id);
          *l.mutable_metadata() = s.metadata();
          *l.mutable_image() = s.image();
          l.set_image_ref(s.image_ref());
          l.set_state(s.state());
          l.set_created_at(s.created_at());
          *l.mutable_labels() = s.labels();
          *l.mutable_annotations() = s.annotations();
          out.push_back(std::move(l));
        }
        return out;
      });
}

Result<v1::ContainerStatus> FakeCriClient::container_status(const std::string& container_id) {
  return call<Result<v1::ContainerStatus>>(
      CriMethod::kContainerStatus, [&]() -> Result<v1::ContainerStatus> {
        auto it = containers_.find(container_id);
        if (it == containers_.end())
          return not_found(CriMethod::kContainerStatus, "container", container_id);
        return it->second.status;
      });
}

Result<std::string> FakeCriClient::run_pod_sandbox(const v1::PodSandboxConfig& config,
                                                   const std::string& /*runtime_handler*/) {
  return call<Result<std::string>>(CriMethod::kRunPodSandbox, [&]() -> Result<std::string> {
    std::string id = next_id();
    Pod pod;
    auto& s = pod.status;
    s.set_id(id);
    *s.mutable_metadata() = config.metadata();
    s.set_state(v1::SANDBOX_READY);
    s.set_created_at(now_ns_());
    *s.mutable_labels() = config.labels();
    *s.mutable_annotations() = config.annotations();
    pods_[id] = std::move(pod);
    return id;
  });
}

Status FakeCriClient::stop_pod_sandbox(const std::string& pod_sandbox_id) {
  return call<Status>(CriMethod::kStopPodSandbox, [&]() -> Status {
    auto it = pods_.find(pod_sandbox_id);
    if (it == pods_.end()) return {};  // idempotent, as in the CRI
    it->second.status.set_state(v1::SANDBOX_NOTREADY);
    for (auto& [id, c] : containers_) {
      if (c.pod_sandbox_id != pod_sandbox_id || c.status.state() != v1::CONTAINER_RUNNING) continue;
      c.status.set_state(v1::CONTAINER_EXITED);
      c.status.set_finished_at(now_ns_());
      c.status.set_exit_code(137);
      c.status.set_reason("Error");
    }
    return {};
  });
}

Status FakeCriClient::remove_pod_sandbox(const std::string& pod_sandbox_id) {
  return call<Status>(CriMethod::kRemovePodSandbox, [&]() -> Status {
    std::erase_if(containers_,
                  [&](const auto& kv) { return kv.second.pod_sandbox_id == pod_sandbox_id; });
    pods_.erase(pod_sandbox_id);
    return {};
  });
}

Result<std::string> FakeCriClient::create_container(
    const std::string& pod_sandbox_id, const v1::ContainerConfig& config,
    const v1::PodSandboxConfig& /*sandbox_config*/) {
  return call<Result<std::string>>(CriMethod::kCreateContainer, [&]() -> Result<std::string> {
    auto pod = pods_.find(pod_sandbox_id);
    if (pod == pods_.end())
      return not_found(CriMethod::kCreateContainer, "sandbox", pod_sandbox_id);
    if (pod->second.status.state() != v1::SANDBOX_READY) {
      return Error{grpc::StatusCode::UNKNOWN, "CRI CreateContainer failed: UNKNOWN: sandbox " +
                                                  pod_sandbox_id + " is not ready"};
    }
    std::string id = next_id();
    ContainerRecord c;
    c.pod_sandbox_id = pod_sandbox_id;
    auto& s = c.status;
    s.set_id(id);
    *s.mutable_metadata() = config.metadata();
    s.set_state(v1::CONTAINER_CREATED);
    s.set_created_at(now_ns_());
    *s.mutable_image() = config.image();
    *s.mutable_labels() = config.labels();
    *s.mutable_annotations() = config.annotations();
    s.set_log_path(config.log_path());
    if (config.linux().has_resources())
      *s.mutable_resources()->mutable_linux() = config.linux().resources();
    containers_[id] = std::move(c);
    return id;
  });
}

Status FakeCriClient::start_container(const std::string& container_id) {
  return call<Status>(CriMethod::kStartContainer, [&]() -> Status {
    auto it = containers_.find(container_id);
    if (it == containers_.end())
      return not_found(CriMethod::kStartContainer, "container", container_id);
    auto& s = it->second.status;
    if (s.state() != v1::CONTAINER_CREATED) {
      return Error{grpc::StatusCode::UNKNOWN, "CRI StartContainer failed: UNKNOWN: container " +
                                                  container_id + " is not in created state"};
    }
    s.set_state(v1::CONTAINER_RUNNING);
    s.set_started_at(now_ns_());
    return {};
  });
}

Status FakeCriClient::stop_container(const std::string& container_id, int64_t /*grace_period_s*/) {
  return call<Status>(CriMethod::kStopContainer, [&]() -> Status {
    auto it = containers_.find(container_id);
    if (it == containers_.end())
      return not_found(CriMethod::kStopContainer, "container", container_id);
    auto& s = it->second.status;
    if (s.state() == v1::CONTAINER_RUNNING) {
      s.set_state(v1::CONTAINER_EXITED);
      s.set_finished_at(now_ns_());
      s.set_exit_code(137);
      s.set_reason("Error");
    }
    return {};
  });
}

Status FakeCriClient::remove_container(const std::string& container_id) {
  return call<Status>(CriMethod::kRemoveContainer, [&]() -> Status {
    containers_.erase(container_id);  // idempotent, as in the CRI
    return {};
  });
}

Status FakeCriClient::exit_container(const std::string& container_id, int32_t exit_code,
                                     const std::string& reason) {
  std::lock_guard lock(mu_);
  auto it = containers_.find(container_id);
  if (it == containers_.end() || it->second.status.state() != v1::CONTAINER_RUNNING) {
    return Error{ESRCH, "fake runtime: container " + container_id + " is not running"};
  }
  auto& s = it->second.status;
  s.set_state(v1::CONTAINER_EXITED);
  s.set_finished_at(now_ns_());
  s.set_exit_code(exit_code);
  s.set_reason(reason);
  return {};
}

Status FakeCriClient::set_unknown(const std::string& container_id) {
  std::lock_guard lock(mu_);
  auto it = containers_.find(container_id);
  if (it == containers_.end()) {
    return Error{ESRCH, "fake runtime: no container " + container_id};
  }
  it->second.status.set_state(v1::CONTAINER_UNKNOWN);
  return {};
}

}  // namespace kpleg::cri
