// Relist mode: the kubelet's generic PLEG (pkg/kubelet/pleg/generic.go), re-implemented over
// kpleg's CriClient. It is kpleg's fallback where the kernel path cannot run, and the baseline
// the kernel path is measured against, so it keeps the kubelet's behaviour including its costs:
//
//  - every period: ListPodSandbox + ListContainers (everything, exited included), grouped into
//    pods as GetPods does (runtime_view.h);
//  - per pod, the old record (as of the pod's last successful inspection) is diffed against the
//    current list, container by container, sandboxes included (generate_events());
//  - each pod with events, or left over from a failed inspection, is inspected SERIALLY as
//    GetPodStatus does: ListPodSandbox by pod uid, PodSandboxStatus for each sandbox,
//    ListContainers by pod uid, ContainerStatus for each container (NOT_FOUND from the status
//    calls means "removed meanwhile" and is not a failure);
//  - a failed inspection leaves the pod's record as it was and marks the pod for re-inspection,
//    so the same diff comes back next relist: its events are delayed, never lost or doubled;
//  - a successful one replaces the record and publishes the pod's events, ContainerChanged
//    excepted. Each event carries the inspected status of its container (exit code and reason
//    for ContainerDied) and the time it was emitted.
//
// A pod that vanished from the lists entirely is not inspected (there is nothing to ask about),
// exactly like the kubelet's updateCache(nil pod).
//
// Thread safety: relist_once() may be called from any thread (relists are serialised); the
// accessors never wait for a relist in progress.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/pod_identity.h"
#include "common/result.h"
#include "cri/cri_client.h"
#include "pleg/event.h"
#include "pleg/runtime_view.h"

namespace kpleg::pleg {

// Timing of the relist loop. Clock readings are the options' clocks: *_ns are realtime (ns since
// the epoch), durations and intervals come from the monotonic clock.
struct RelistStats {
  uint64_t relists = 0;               // attempts
  uint64_t failed_relists = 0;        // the initial lists failed
  uint64_t consecutive_failures = 0;  // since the last successful relist
  int64_t last_start_ns = 0;
  int64_t last_end_ns = 0;
  // kubelet_pleg_relist_duration_seconds: start to end of the last relist, failed ones too.
  int64_t last_duration_ns = 0;
  // kubelet_pleg_relist_interval_seconds: from the start of the previous successful relist to
  // the start of the last one (period + duration in a healthy loop). 0 until there is one.
  int64_t last_interval_ns = 0;
  // kubelet_pleg_last_seen_seconds: start of the last relist whose lists succeeded; 0 if none.
  int64_t last_success_ns = 0;
  std::string last_error;  // of the last failed relist or inspection
  uint64_t inspections = 0;
  uint64_t failed_inspections = 0;
  uint64_t events_published = 0;
  size_t pods = 0;        // in the last successful list
  size_t containers = 0;  // sandboxes included
};

// A pod whose last inspection failed; it is inspected again on every relist until one succeeds.
struct PendingInspection {
  PodIdentity pod;
  std::string error;            // of the last attempt
  uint64_t attempts = 0;        // failed attempts in a row
  int64_t first_failed_ns = 0;  // realtime
};

struct RelistHealth {
  // The kubelet's Healthy(): false before the first successful relist and when the last one
  // started longer than the threshold ago.
  bool healthy = false;
  std::string reason;  // why not healthy; empty when healthy
  // Pods waiting for a successful inspection, so a stalled pod can be named even while the
  // relist itself is healthy.
  std::vector<PendingInspection> pending_inspections;
};

struct GenericRelistOptions {
  // Pause between the end of one relist and the start of the next (the kubelet's relist period,
  // applied the way wait.Until applies it).
  std::chrono::milliseconds period{1000};
  // The kubelet's relistThreshold.
  std::chrono::milliseconds health_threshold{std::chrono::minutes(3)};
  EventSource source = EventSource::kRelist;
  // Clocks, in nanoseconds; injectable so tests can pin time. Defaults: CLOCK_REALTIME and
  // CLOCK_MONOTONIC.
  std::function<int64_t()> realtime_ns;
  std::function<int64_t()> monotonic_ns;
  // Called after every relist (failed ones too) on the relisting thread, with the stats as they
  // then are: the metrics exporter observes its histograms here. Keep it short.
  std::function<void(const RelistStats&)> on_relist;
};

class GenericRelist {
 public:
  GenericRelist(cri::CriClient& cri, EventSink& sink, GenericRelistOptions options = {});
  ~GenericRelist();  // stops the loop
  GenericRelist(const GenericRelist&) = delete;
  GenericRelist& operator=(const GenericRelist&) = delete;

  // One relist. Fails only when the initial lists fail, and then nothing changes; a failed
  // pod inspection is not a failed relist (the pod is retried next time; see health()).
  Status relist_once();

  // Relists at once and then every period after the previous relist ended, on its own thread,
  // until stop(). Idempotent.
  void start();
  // Wakes the loop and joins it; returns as soon as a relist in progress has finished.
  // Idempotent.
  void stop();
  bool running() const;

  RelistStats stats() const;
  // now_mono_ns on the options' monotonic clock.
  RelistHealth health(int64_t now_mono_ns) const;
  RelistHealth health() const;

  // The pods as of their last successful inspection (the confirmed view, for List), ordered by
  // pod uid. A pod whose first inspection has not yet succeeded is not in it.
  std::vector<PodRecord> pods() const;
  // The records together with `seq_now()` read under the lock that every publication holds:
  // the snapshot is exactly the state after the events up to that sequence number.
  std::pair<uint64_t, std::vector<PodRecord>> pods_at(const std::function<uint64_t()>& seq_now) const;

 private:
  struct Record {
    std::shared_ptr<const PodRecord> old;  // as of the last successful inspection
    std::optional<PodRecord> current;      // as of this relist's lists
  };
  // Container id -> what GetPodStatus said about it.
  using Inspection = std::map<std::string, ContainerSnapshot>;

  Result<Inspection> inspect(const PodRecord& pod);
  Status finish_relist(int64_t start_mono, Status result);
  void run_loop();

  cri::CriClient& cri_;
  EventSink& sink_;
  GenericRelistOptions options_;

  std::mutex relist_mu_;  // one relist at a time; guards records_
  std::map<std::string, Record> records_;

  mutable std::mutex state_mu_;  // what the accessors read
  RelistStats stats_;
  int64_t last_success_mono_ = 0;
  bool succeeded_once_ = false;
  std::map<std::string, PendingInspection> pending_;
  std::map<std::string, std::shared_ptr<const PodRecord>> confirmed_;  // records_' olds

  std::mutex lifecycle_mu_;  // start() and stop()
  mutable std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stop_requested_ = false;
  std::thread loop_;
  bool running_ = false;
};

}  // namespace kpleg::pleg
