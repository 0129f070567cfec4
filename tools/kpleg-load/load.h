// What kpleg-load's commands share: its output (one JSON line per result on stdout, diagnostics
// on stderr), the pod options of `run` and `churn`, and Load, which makes and tears down pods
// and containers through the CRI the way the kubelet does.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"
#include "cri/cri_client.h"
#include "kpleg-load/kubelet_pod.h"

namespace kpleg::load {

using json = nlohmann::json;

int64_t realtime_ns();
// One result line on stdout, flushed at once (a consumer reads them as they come).
void emit(const json& line);
// A diagnostic on stderr; returns the exit status of a failed command (1).
int fail(const std::string& message);
// $TMPDIR/kpleg-load/pods (TMPDIR defaults to /tmp).
std::string default_log_root();

struct PodOptions {
  std::string namespace_ = "kpleg-load";
  std::string name_prefix = "load";
  std::string qos = "auto";
  std::string image{kDefaultImage};
  std::string command = "sleep 1000000";
  int64_t memory_limit = 0;
  bool pod_network = false;
  std::string log_root = default_log_root();
  std::string runtime_handler;  // "" the runtime's default
};

// A pod this process created: enough to create its containers and to tear it down.
struct CreatedPod {
  PodSpec spec;
  v1::PodSandboxConfig config;
  std::string sandbox_id;
};

class Load {
 public:
  explicit Load(cri::CriClient& cri) : cri_(cri) {}

  Result<CreatedPod> create_pod(const PodOptions& o, int index, QosClass qos);

  // Creates and (unless `start` is false) starts one container; a container whose start
  // failed is removed. With a `trace`, each CRI call is emitted as a line based on it.
  Result<std::string> start_container(const CreatedPod& pod, const ContainerSpec& c,
                                      json* trace = nullptr, bool start = true);

  // Stops and removes a pod sandbox (and so its containers), then does the kubelet's part:
  // the pod cgroup and the log directory. Its running containers are killed first, without a
  // grace period, as the kubelet kills a pod whose grace is over: a runtime's StopPodSandbox
  // may give each container a grace period of its own first (CRI-O waits 10 s for a PID 1 that
  // ignores SIGTERM, such as sleep).
  Status remove_pod(const std::string& sandbox_id, const std::string& pod_uid,
                    const std::string& log_directory);

  // One CRI call as a line: `base` plus the call, its transition, its times and its result.
  static void emit_call(const json& base, std::string_view call, std::string_view transition,
                        int64_t t_begin, int64_t t_end, const std::string& container_id,
                        const Status& result);

 private:
  static Status remove_pod_leftovers(const std::string& pod_uid, const std::string& log_directory);

  cri::CriClient& cri_;
};

// The kubelet starts no pod-network pod while the runtime reports NetworkReady=false, and for
// good reason: containerd 1.6 then keeps the failed sandbox and cannot remove it either (its
// network teardown fails the same way) until a CNI config appears.
Status require_pod_network(cri::CriClient& cri, const PodOptions& o);

// --qos, where "auto" is burstable with a memory limit and best-effort without.
Result<QosClass> effective_qos(const PodOptions& o);

}  // namespace kpleg::load
