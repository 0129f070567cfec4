// The daemon: connects to the runtime, starts the pipeline of its mode (pipeline.h: the
// kernel-driven one or the generic relist), the event bus, the CRI endpoint for the kubelet
// (--cri-listen); and answers what the consumer API asks of it (state, health, stats, calls in
// flight) from the pipeline, the health policy and the runtime client. main() only parses flags.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/providers.h"
#include "bus/event_bus.h"
#include "common/result.h"
#include "cri/grpc_cri_client.h"
#include "cri/inflight_calls.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/cri_endpoint.h"
#include "daemon/health_policy.h"
#include "daemon/metrics_mirror.h"
#include "daemon/options.h"
#include "daemon/pipeline.h"

namespace kpleg::daemon {

class Daemon : public api::StateProvider, public api::HealthProvider, public api::StatsProvider {
 public:
  // Connects to the runtime (an unreachable runtime is an error), starts the pipeline of
  // --mode (auto: the relist pipeline where the kernel path cannot start, the reason named in
  // health) and its initial sync, then the CRI endpoint.
  static Result<std::unique_ptr<Daemon>> start(const DaemonOptions& opts);
  ~Daemon() override;
  void stop();

  bus::EventBus& bus() { return *bus_; }
  metrics::Registry& registry() { return metrics_.registry(); }
  Mode active_mode() const { return pipeline_->mode(); }

  api::StateSnapshot snapshot() override { return pipeline_->snapshot(); }
  api::HealthReport health() override;
  api::HealthReport liveness() override;
  void set_health_listener(std::function<void()> fn) override;
  api::DaemonStats stats() override;
  std::vector<api::InflightCallRecord> inflight_calls(std::chrono::milliseconds min_age) override;

 private:
  explicit Daemon(const DaemonOptions& opts);
  // Connects the runtime client and asks the runtime's Version.
  Status connect_runtime();
  Status start_cri_endpoint();
  // An input of health() changed: tells the health listener.
  void health_changed();
  // What the health policy reads, for readiness and liveness alike.
  HealthPolicy::Components health_components();
  // The pod a sandbox or container id (or a bare pod uid) belongs to, from kpleg's state.
  std::optional<cri::CallSubject> identify(const cri::CallSubject& subject);

  const DaemonOptions opts_;
  MetricsMirror metrics_;
  HealthPolicy health_policy_;
  std::string runtime_name_;  // from the runtime's Version answer at start
  uint64_t start_time_ns_ = 0;
  std::unique_ptr<bus::EventBus> bus_;
  std::shared_ptr<cri::InflightCalls> inflight_ = std::make_shared<cri::InflightCalls>();
  std::unique_ptr<cri::GrpcCriClient> cri_;
  std::unique_ptr<Pipeline> pipeline_;
  // pipeline_ once it runs, for the runtime client's threads (reconnects, resolving a call's
  // pod), which may call in while it starts and stops.
  std::atomic<Pipeline*> running_{nullptr};
  std::unique_ptr<criendpoint::ContainerEventFeed> event_feed_;
  std::unique_ptr<criendpoint::CriEndpoint> cri_endpoint_;
  std::atomic<bool> stopped_{false};
  std::mutex health_listener_mu_;  // held while the listener runs: unset means never called
  std::function<void()> health_listener_;
};

}  // namespace kpleg::daemon
