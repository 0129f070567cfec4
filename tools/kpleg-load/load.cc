#include "kpleg-load/load.h"

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "kpleg-load/pod_cgroups.h"

namespace kpleg::load {

namespace fs = std::filesystem;

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void emit(const json& line) {
  static std::mutex mu;  // whole lines, from churn's open-loop threads too
  std::lock_guard lk(mu);
  std::cout << line.dump() << '\n' << std::flush;
}

int fail(const std::string& message) {
  std::cerr << "kpleg-load: " << message << '\n';
  return 1;
}

std::string default_log_root() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kpleg-load/pods";
}

Result<CreatedPod> Load::create_pod(const PodOptions& o, int index, QosClass qos) {
  CreatedPod pod;
  pod.spec.name = o.name_prefix + "-" + std::to_string(index);
  pod.spec.namespace_ = o.namespace_;
  pod.spec.uid = new_pod_uid();
  pod.spec.qos = qos;
  pod.spec.host_network = !o.pod_network;
  pod.spec.log_directory = pod_log_directory(o.log_root, pod.spec);
  std::error_code ec;
  fs::create_directories(pod.spec.log_directory, ec);
  if (ec) {
    return Error{ec.value(),
                 "creating log directory " + pod.spec.log_directory + ": " + ec.message()};
  }
  pod.config = sandbox_config(pod.spec);
  auto id = cri_.run_pod_sandbox(pod.config, o.runtime_handler);
  if (!id) {
    (void)remove_pod_leftovers(pod.spec.uid, pod.spec.log_directory);
    return id.error();
  }
  pod.sandbox_id = std::move(*id);
  return pod;
}

Result<std::string> Load::start_container(const CreatedPod& pod, const ContainerSpec& c,
                                          json* trace, bool start) {
  std::error_code ec;
  fs::create_directories(pod.spec.log_directory + "/" + c.name, ec);  // the kubelet's job too
  auto config = container_config(pod.spec, c);
  int64_t t0 = realtime_ns();
  auto id = cri_.create_container(pod.sandbox_id, config, pod.config);
  int64_t t1 = realtime_ns();
  if (trace != nullptr) {
    emit_call(*trace, "CreateContainer", "", t0, t1, id ? *id : "",
              id ? Status{} : Status(id.error()));
  }
  if (!id) return id.error();
  if (!start) return id;
  t0 = realtime_ns();
  auto started = cri_.start_container(*id);
  t1 = realtime_ns();
  if (trace != nullptr) emit_call(*trace, "StartContainer", "started", t0, t1, *id, started);
  if (!started) {
    (void)cri_.remove_container(*id);
    return started.error();
  }
  return id;
}

Status Load::remove_pod(const std::string& sandbox_id, const std::string& pod_uid,
                        const std::string& log_directory) {
  v1::ContainerFilter running;
  running.set_pod_sandbox_id(sandbox_id);
  running.mutable_state()->set_state(v1::CONTAINER_RUNNING);
  if (auto cs = cri_.list_containers(running); cs.ok()) {
    for (const auto& c : *cs) (void)cri_.stop_container(c.id(), 0);
  }
  // A failed stop (e.g. the network teardown of a sandbox whose network setup failed) does
  // not end the attempt: the runtime may still be able to remove the sandbox.
  auto stopped = cri_.stop_pod_sandbox(sandbox_id);
  if (auto s = cri_.remove_pod_sandbox(sandbox_id); !s) {
    return stopped.ok() ? s
                        : Error{stopped.error().code,
                                stopped.error().message + "; then " + s.error().message};
  }
  return remove_pod_leftovers(pod_uid, log_directory);
}

void Load::emit_call(const json& base, std::string_view call, std::string_view transition,
                     int64_t t_begin, int64_t t_end, const std::string& container_id,
                     const Status& result) {
  json line = base;
  line["call"] = call;
  if (!transition.empty()) line["transition"] = transition;
  if (!container_id.empty()) line["container_id"] = container_id;
  line["t_begin_ns"] = t_begin;
  line["t_end_ns"] = t_end;
  line["ok"] = result.ok();
  if (!result.ok()) line["error"] = result.error().message;
  emit(line);
}

Status Load::remove_pod_leftovers(const std::string& pod_uid, const std::string& log_directory) {
  auto removed = remove_pod_cgroups(pod_uid, std::chrono::seconds(5));
  // Only ever delete a directory this tool made for this pod.
  if (!log_directory.empty() && log_directory.ends_with("_" + pod_uid)) {
    std::error_code ec;
    fs::remove_all(log_directory, ec);
  }
  if (!removed) return removed.error();
  return {};
}

Status require_pod_network(cri::CriClient& cri, const PodOptions& o) {
  if (!o.pod_network) return {};
  auto status = cri.status();
  if (!status) return status.error();
  for (const auto& c : status->conditions()) {
    if (c.type() == "NetworkReady" && !c.status()) {
      return Error{EHOSTUNREACH,
                   "--pod-network: the runtime's pod network is not ready (NetworkReady=false: " +
                       c.reason() + ": " + c.message() +
                       "); it needs a CNI config (scripts/testbed.sh up --cni)"};
    }
  }
  return {};
}

Result<QosClass> effective_qos(const PodOptions& o) {
  if (o.qos == "auto") return o.memory_limit > 0 ? QosClass::kBurstable : QosClass::kBestEffort;
  return parse_qos_class(o.qos);
}

}  // namespace kpleg::load
