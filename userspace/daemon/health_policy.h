// kplegd's health policy: the one report that grpc.health.v1, GET /healthz and /readyz, and the
// Stats RPC's healthy and health_reasons all answer from. It decides which conditions fail the
// node's events (the runtime unreachable, the kernel path detached or not consumed, no recent
// successful reconcile, a failing relist), which only degrade them (named as reasons, still
// healthy: the tracked-cgroup map full, kernel records lost, running containers the kernel path
// does not see, a pod whose runtime calls fail, a CRI call stuck in flight), and when the answer
// can change with no input changing (recheck_in), so that the API server sleeps until then.
//
// It owns the conditions that the kernel path reports between reconciles (records lost, coverage,
// the map full) and reads the rest from the components at each report; each note_* call says
// whether the report changed, for the daemon to tell the health listener.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
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
  };

  // What a report reads. ebpf mode: kernel, reconciler and tracker are set; relist mode: relist.
  struct Components {
    cri::GrpcCriClient& cri;
    const cri::InflightCalls& inflight;
    bool ebpf = false;
    kernel::BpfKernelSource* kernel = nullptr;
    pleg::Reconciler* reconciler = nullptr;
    pleg::Tracker* tracker = nullptr;
    pleg::GenericRelist* relist = nullptr;
    const std::string& fallback_reason;  // why auto mode runs relist mode; "" when it does not
  };

  explicit HealthPolicy(Settings settings) : settings_(std::move(settings)) {}

  api::HealthReport health(const Components& c) const;

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

  const Settings settings_;
  // Kernel records lost: how many, and when last (steady clock, ns).
  std::atomic<uint64_t> lost_records_{0};
  std::atomic<int64_t> last_loss_ns_{0};
  mutable std::mutex coverage_mu_;
  size_t uncovered_ = 0;           // guarded by coverage_mu_
  std::string uncovered_example_;  // guarded by coverage_mu_
  std::atomic<bool> untracked_{false};
};

}  // namespace kpleg::daemon
