// kplegd's health policy: the two answers every probe and the Stats RPC read.
//
// Readiness (health()): whether the node's events can be trusted; grpc.health.v1, GET /readyz and
// /healthz, the Stats RPC's healthy and health_reasons. It decides which conditions fail the
// node's events (the runtime unreachable, the kernel path detached or not consumed, no recent
// successful reconcile or a failed last one, a failing relist), which only degrade them (named as
// reasons, still healthy: the tracked-cgroup map full, kernel records lost, running containers the
// kernel path does not see, a pod whose runtime calls fail, a CRI call stuck in flight), and when
// the answer can change with no input changing (recheck_in), so that the API server sleeps until
// then.
//
// It owns the conditions that the kernel path reports between reconciles (records lost, coverage,
// the map full) and reads the rest from the components at each report; each note_* call says
// whether the report changed, for the daemon to tell the health listener.
//
// Liveness (liveness()): whether kplegd itself progresses, so that a restart could help: the
// kernel path's consumer thread runs, a reconcile does not outlast its calls' deadlines. The
// runtime's problems (hanging, failing, a slow first sync, a short outage) do not fail it: a
// restart cannot fix them and would only make every consumer resync. One exception: a runtime
// socket that has refused connections for kRuntimeRefusedFor. A runtime restarted on the host
// listens on a new socket, which a container that mounts the socket alone (the DaemonSet does)
// sees only once it is restarted.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "api/providers.h"
#include "cri/grpc_cri_client.h"
#include "cri/inflight_calls.h"
#include "kernel/kernel_source.h"
#include "pleg/generic_relist.h"
#include "pleg/reconciler.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

class HealthPolicy {
 public:
  struct Settings {
    std::string runtime_endpoint;
    std::chrono::milliseconds reconcile_period;
    std::chrono::milliseconds relist_period;
    std::chrono::milliseconds stuck_call_threshold;  // a call in flight longer is named
    std::chrono::milliseconds cri_list_timeout{std::chrono::seconds(60)};  // a full list's deadline
  };

  // What liveness reads (plain values, for tests).
  struct LivenessInputs {
    bool ebpf = false;
    bool kernel_consuming = false;  // ebpf: the ring buffer's consumer thread runs
    std::optional<std::chrono::steady_clock::time_point> reconcile_running_since;  // ebpf
    // How long the runtime's socket has refused connections (none: it is connected, or hangs).
    std::optional<std::chrono::steady_clock::duration> runtime_refused_for;
    std::chrono::steady_clock::time_point now;
  };
  static constexpr std::chrono::seconds kRuntimeRefusedFor{60};

  // What a report reads: the daemon's runtime client and call registry, and the pipeline's parts
  // (Pipeline::describe). ebpf mode: kernel, reconciler and tracker are set; relist mode: relist.
  struct Components {
    cri::GrpcCriClient& cri;
    const cri::InflightCalls& inflight;
    bool ebpf = false;
    kernel::BpfKernelSource* kernel = nullptr;
    pleg::Reconciler* reconciler = nullptr;
    pleg::Tracker* tracker = nullptr;
    pleg::GenericRelist* relist = nullptr;
    std::string fallback_reason = {};  // why auto mode runs relist mode; "" when it does not
  };

  explicit HealthPolicy(Settings settings) : settings_(std::move(settings)) {}

  api::HealthReport health(const Components& c) const;
  api::HealthReport liveness(const Components& c) const;
  api::HealthReport liveness(const LivenessInputs& in) const;
  // How long a reconcile may run before liveness calls kplegd stuck: its two full lists' deadlines
  // and a minute for the rest (the diff under the tracker's lock).
  std::chrono::milliseconds stuck_reconcile_after() const {
    return 2 * settings_.cri_list_timeout + std::chrono::minutes(1);
  }

  // `n` kernel records were lost (the ring buffer was full). True when the loss reason appears
  // (it stays kLossReasonFor after the last loss).
  bool note_records_lost(uint64_t n);
  // A reconcile's count of running containers the kernel path does not see, and one of them
  // described. Returns the count before.
  size_t note_uncovered(size_t uncovered, std::string example);
  // Whether cgroups are left untracked (the tracked-cgroup map is full). True when that changed.
  bool note_untracked(bool untracked) { return untracked_.exchange(untracked) != untracked; }

 private:
  void report_stuck_calls(const cri::InflightCalls& inflight, api::HealthReport& r) const;
  // How long the runtime's connection has been down, as first seen by a health or liveness read
  // (the probes read every few seconds); none while it is up.
  std::optional<std::chrono::steady_clock::duration> runtime_down_for(
      const cri::GrpcCriClient& cri, std::chrono::steady_clock::time_point now) const;

  const Settings settings_;
  // Kernel records lost: how many, and when last (steady clock, ns).
  std::atomic<uint64_t> lost_records_{0};
  std::atomic<int64_t> last_loss_ns_{0};
  mutable std::mutex coverage_mu_;
  size_t uncovered_ = 0;           // guarded by coverage_mu_
  std::string uncovered_example_;  // guarded by coverage_mu_
  std::atomic<bool> untracked_{false};
  mutable std::atomic<int64_t> runtime_down_since_ns_{0};  // steady clock; 0 while it is up
};

}  // namespace kpleg::daemon
