// The daemon: wires the runtime client, the kernel source, the cgroup index, the tracker and
// reconciler (ebpf mode) or the generic relist (relist mode), and the event bus; and answers
// what the consumer API asks of it (state, health, stats). main() only parses flags.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/providers.h"
#include "bus/event_bus.h"
#include "cgroup/cgroup_index.h"
#include "common/result.h"
#include "cri/grpc_cri_client.h"
#include "cri/inflight_calls.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/cri_endpoint.h"
#include "daemon/health_policy.h"
#include "daemon/metrics_mirror.h"
#include "daemon/removal_hints.h"
#include "kernel/dir_removal_watch.h"
#include "kernel/kernel_source.h"
#include "pleg/generic_relist.h"
#include "pleg/reconciler.h"
#include "pleg/runtime_events.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

enum class Mode { kAuto, kEbpf, kRelist };
const char* to_string(Mode m);

struct DaemonOptions {
  std::string runtime_endpoint = "unix:///run/containerd/containerd.sock";
  Mode mode = Mode::kAuto;
  std::chrono::milliseconds reconcile_period{std::chrono::seconds(300)};
  std::chrono::milliseconds relist_period{std::chrono::seconds(1)};
  std::chrono::milliseconds relist_health_threshold{std::chrono::minutes(3)};
  std::chrono::milliseconds cri_timeout{std::chrono::seconds(2)};
  // Full lists (reconcile, relist, removal sweep) get this deadline instead.
  std::chrono::milliseconds cri_list_timeout{std::chrono::seconds(60)};
  // ebpf mode: confirm by the runtime's GetContainerEvents stream where it is served.
  bool runtime_events = true;
  // ebpf mode: where exited containers' removals are hinted from (--removal-hints; kKernel:
  // the daemon asks the kernel source for the hint's programs).
  RemovalHintSource removal_hints = RemovalHintSource::kAuto;
  // kAuto: these directories (--removal-hint-dir); none: the runtime's, from its Status.
  std::vector<std::string> removal_hint_dirs;
  // The CRI endpoint for the kubelet (--cri-listen): "" off.
  std::string cri_listen;
  // Answer the endpoint's GetContainerEvents from kpleg's events (else forward the runtime's),
  // with full pod statuses (each costs the calls of the kubelet's pod inspection) or as hints
  // (no call; kubelets from 1.37 need no more).
  bool cri_serve_events = true;
  bool cri_event_statuses = true;
  // A CRI call in flight this long is named in health, kplegctl stuck and the log.
  std::chrono::milliseconds stuck_call_threshold{std::chrono::seconds(60)};
  kernel::KernelSourceOptions kernel;
  bus::EventBusOptions bus;  // its on_publish is the daemon's (metrics)
};

class Daemon : public api::StateProvider, public api::HealthProvider, public api::StatsProvider {
 public:
  // Connects to the runtime (an unreachable runtime is an error), starts the kernel source
  // (ebpf/auto) or the relister, and the initial sync. `mode_reason` says why relist mode was
  // picked when auto fell back.
  static Result<std::unique_ptr<Daemon>> start(const DaemonOptions& opts);
  ~Daemon() override;
  void stop();

  bus::EventBus& bus() { return *bus_; }
  metrics::Registry& registry() { return metrics_.registry(); }
  Mode active_mode() const { return active_; }
  const std::string& fallback_reason() const { return fallback_reason_; }

  api::StateSnapshot snapshot() override;
  api::HealthReport health() override;
  api::HealthReport liveness() override;
  void set_health_listener(std::function<void()> fn) override;
  api::DaemonStats stats() override;
  std::vector<api::InflightCallRecord> inflight_calls(std::chrono::milliseconds min_age) override;

  // Components, for metrics and tests.
  cri::GrpcCriClient& cri() { return *cri_; }
  pleg::Tracker* tracker() { return tracker_.get(); }
  pleg::Reconciler* reconciler() { return reconciler_.get(); }
  pleg::RuntimeEvents* runtime_events() { return runtime_events_.get(); }
  pleg::GenericRelist* relist() { return relist_.get(); }
  kernel::BpfKernelSource* kernel_source() { return kernel_.get(); }

 private:
  explicit Daemon(const DaemonOptions& opts);
  Status start_ebpf();
  Status start_relist();

  void on_kernel_event(const kernel::KernelEvent& ev);
  // The removal hint of --removal-hints (kernel: the program's; auto: the runtime's dirs).
  void start_removal_hints();
  // An input of health() changed: tells the health listener.
  void health_changed();
  // What the health policy reads, for readiness and liveness alike.
  HealthPolicy::Components health_components();
  // Which running containers of a reconcile's view the kernel path does not see.
  void check_coverage(const std::vector<pleg::RuntimeContainer>& view);
  // A cgroup refused by its pod's budget (at most once a second per pod): counted, and the pod
  // named in the log (once per 30 s per pod).
  void on_over_budget(const kernel::CgroupMkdir& mk);
  // At each reconcile: the kernel's tracked-cgroup map catches up with the tree (cgroups it
  // had no room for, entries of vanished cgroups), the index first when cgroups went untracked.
  void resync_kernel();
  Status start_cri_endpoint();
  // The pod a sandbox or container id (or a bare pod uid) belongs to, from kpleg's state.
  std::optional<cri::PodIdentity> identify(const cri::CallSubject& subject);

  DaemonOptions opts_;
  MetricsMirror metrics_;
  HealthPolicy health_policy_;
  Mode active_ = Mode::kRelist;
  std::string fallback_reason_;
  std::string runtime_name_;  // from the runtime's Version answer at start
  uint64_t start_time_ns_ = 0;
  std::unique_ptr<bus::EventBus> bus_;
  std::unique_ptr<cri::GrpcCriClient> cri_;
  std::unique_ptr<cgroup::CgroupIndex> index_;
  std::unique_ptr<pleg::Tracker> tracker_;
  std::unique_ptr<pleg::Reconciler> reconciler_;
  std::unique_ptr<pleg::RuntimeEvents> runtime_events_;
  std::unique_ptr<kernel::BpfKernelSource> kernel_;
  std::unique_ptr<kernel::DirRemovalWatch> removal_dirs_;  // --removal-hints auto
  std::unique_ptr<pleg::RemovalHints> removal_hints_;  // over kernel_'s program or removal_dirs_
  std::unique_ptr<pleg::GenericRelist> relist_;
  std::shared_ptr<cri::InflightCalls> inflight_ = std::make_shared<cri::InflightCalls>();
  std::unique_ptr<criendpoint::ContainerEventFeed> event_feed_;
  std::unique_ptr<criendpoint::CriEndpoint> cri_endpoint_;
  std::atomic<bool> stopped_{false};
  uint64_t lost_at_last_resync_ = 0;   // reconciler thread only
  std::mutex over_budget_mu_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> over_budget_logged_;
  std::mutex health_listener_mu_;  // held while the listener runs: unset means never called
  std::function<void()> health_listener_;
};

}  // namespace kpleg::daemon
