// An in-memory container runtime behind the CriClient interface, for unit tests of the logic
// that calls the CRI (tracker, reconciler): the workload calls change its state the way
// containerd's CRI does, lists apply the CRI's filter semantics, and a test can make a
// container die, inject failures per method, and count calls. Built as its own library
// (kpleg_cri_fake, tests/support/CMakeLists.txt) that the unit tests and the capacity benchmark
// (bench/tracker_ceiling.cc) link.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cri/call_stats.h"
#include "cri/cri_client.h"

namespace kpleg::cri {

class FakeCriClient final : public CriClient {
 public:
  FakeCriClient();

  Result<v1::VersionResponse> version() override;
  Result<v1::RuntimeStatus> status() override;
  Result<std::vector<v1::PodSandbox>> list_pod_sandboxes(
      const v1::PodSandboxFilter& filter) override;
  Result<v1::PodSandboxStatus> pod_sandbox_status(const std::string& pod_sandbox_id) override;
  Result<std::vector<v1::Container>> list_containers(const v1::ContainerFilter& filter) override;
  Result<v1::ContainerStatus> container_status(const std::string& container_id) override;

  Result<std::string> run_pod_sandbox(const v1::PodSandboxConfig& config,
                                      const std::string& runtime_handler = {}) override;
  Status stop_pod_sandbox(const std::string& pod_sandbox_id) override;
  Status remove_pod_sandbox(const std::string& pod_sandbox_id) override;
  Result<std::string> create_container(const std::string& pod_sandbox_id,
                                       const v1::ContainerConfig& config,
                                       const v1::PodSandboxConfig& sandbox_config) override;
  Status start_container(const std::string& container_id) override;
  Status stop_container(const std::string& container_id, int64_t grace_period_s) override;
  Status remove_container(const std::string& container_id) override;

  // --- test controls -----------------------------------------------------------------------
  // The container's process exits by itself (as on a crash or an OOM kill).
  Status exit_container(const std::string& container_id, int32_t exit_code,
                        const std::string& reason = "Error");
  // The runtime can no longer read the container's status (containerd reloads such a container
  // as CONTAINER_UNKNOWN after a restart): it stays listed, in that state.
  Status set_unknown(const std::string& container_id);
  // The next call of `method` fails with `error` (queued: several calls fail in order).
  void fail_next(CriMethod method, Error error);
  // Every call of `method` fails with `error` until cleared with std::nullopt (a runtime that
  // is down: use grpc::StatusCode::UNAVAILABLE).
  void fail_always(CriMethod method, std::optional<Error> error);
  // Timestamps (created_at, started_at, finished_at) come from this clock, in nanoseconds.
  // Default: a counter that advances 1 ms per call, so order is visible and tests are exact.
  void set_clock(std::function<int64_t()> now_ns);
  uint64_t calls(CriMethod method) const;
  const CallStats& call_stats() const { return stats_; }

 private:
  struct Pod {
    v1::PodSandboxStatus status;
  };
  struct ContainerRecord {
    std::string pod_sandbox_id;
    v1::ContainerStatus status;
  };

  // Runs one call under the lock: an injected failure instead of `body` if there is one, and
  // the outcome counted in stats_.
  template <typename R, typename Body>
  R call(CriMethod method, Body&& body) {
    std::lock_guard lock(mu_);
    R result = [&]() -> R {
      if (auto e = injected_failure(method)) return *e;
      return body();
    }();
    stats_.record(method, result.ok() ? 0 : result.error().code);
    return result;
  }
  std::optional<Error> injected_failure(CriMethod method);
  Error not_found(CriMethod method, const std::string& what, const std::string& id);
  std::string next_id();

  mutable std::mutex mu_;
  std::map<std::string, Pod> pods_;
  std::map<std::string, ContainerRecord> containers_;
  std::map<CriMethod, std::vector<Error>> fail_next_;
  std::map<CriMethod, Error> fail_always_;
  std::function<int64_t()> now_ns_;
  int64_t fake_clock_ns_ = 1'000'000'000;
  uint64_t next_id_ = 1;
  CallStats stats_;
};

}  // namespace kpleg::cri
