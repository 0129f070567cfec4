// A mode's pipeline: what turns the runtime's answers (and in ebpf mode the kernel's signals)
// into the bus's events, behind one interface, so that the daemon holds one of them and asks
// it, never its mode, what a report needs. Two exist: the kernel-driven one (ebpf_pipeline.h)
// and the generic relist (relist_pipeline.h). start_pipeline() picks one by --mode; auto falls
// back to the relist pipeline, with the reason, when the kernel path cannot start.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "api/providers.h"
#include "bus/event_bus.h"
#include "common/result.h"
#include "cri/grpc_cri_client.h"
#include "daemon/health_policy.h"
#include "daemon/metrics_mirror.h"
#include "daemon/options.h"

namespace kpleg::daemon {

// What a pipeline is built on; the daemon owns all of it and it outlives the pipeline.
struct PipelineContext {
  const DaemonOptions& opts;
  cri::GrpcCriClient& cri;
  bus::EventBus& bus;
  MetricsMirror& metrics;
  HealthPolicy& health;
  std::function<void()> health_changed;  // an input of the health report changed
  std::string runtime_name;              // from the runtime's Version answer at start
};

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  Pipeline() = default;
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  virtual Mode mode() const = 0;
  // Ends its threads. The runtime's calls in flight were cancelled first; the bus closes after.
  // Once only; the destructor stops a pipeline not stopped.
  virtual void stop() = 0;
  // The containers it knows, exactly as they are after the events published up to the
  // snapshot's sequence number (the consumer API's List).
  virtual api::StateSnapshot snapshot() = 0;
  // Its parts that the health policy reads, and that a scrape copies counters from.
  virtual void describe(HealthPolicy::Components& c) = 0;
  virtual void describe(MetricsMirror::Sources& s) = 0;
  // Its share of the Stats RPC: relists, the last one's time, kernel counters, corrections.
  virtual void add_stats(api::DaemonStats& s) = 0;
  // The runtime answers again after an outage.
  virtual void runtime_reconnected() = 0;
};

// The pipeline --mode asks for, started (its initial sync done or going on in the background).
Result<std::unique_ptr<Pipeline>> start_pipeline(const PipelineContext& ctx);

}  // namespace kpleg::daemon
