// What the consumer API and the HTTP endpoints need from the daemon, as three small
// interfaces: kplegd implements them over its tracker, reconciler and kernel source; the API
// server and the metrics server only read through them. Implementations must be thread-safe
// (they are called from gRPC and HTTP threads) and quick (no CRI call in a snapshot).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/pod_identity.h"
#include "pleg/containers.h"
#include "pleg/event.h"

namespace kpleg::api {

// A List snapshot and the last event seq it reflects. Its pods are pleg::PodRecord
// (pleg/containers.h), the generic relist's own records, so that both modes answer in one
// shape; a container's `status` is what List shows, its state included. Take it inside
// bus::EventBus::with_seq() so that the seq is exact: a consumer then watches from `seq`
// without a gap or a duplicate.
struct StateSnapshot {
  uint64_t seq = 0;
  std::vector<pleg::PodRecord> pods;
};

class StateProvider {
 public:
  virtual ~StateProvider() = default;
  virtual StateSnapshot snapshot() = 0;
};

// healthy, or not with the reasons ("kernel path: ring buffer not consumed for 12 s", ...).
struct HealthReport {
  bool healthy = false;
  std::vector<std::string> reasons;
  // When this report can change with no input changing (a deadline passing, e.g. the last
  // reconcile growing too old); none when only an input can change it, which the provider
  // announces through its health listener.
  std::optional<std::chrono::milliseconds> recheck_in;
};

class HealthProvider {
 public:
  virtual ~HealthProvider() = default;
  // Whether the node's events can be trusted, with what degrades them: the runtime answers, the
  // kernel path is attached and consumed, a reconcile succeeded recently. Feeds the Stats RPC,
  // grpc.health.v1 ("" and kHealthServiceName), GET /healthz and /readyz.
  virtual HealthReport health() = 0;
  // Readiness: what GET /readyz and grpc.health.v1's kReadinessService answer.
  virtual HealthReport readiness() { return health(); }
  // Liveness: kplegd itself progresses (its own loops are not stuck); the runtime's problems do
  // not fail it, since a restart cannot fix them. GET /livez and kLivenessService. Must be cheap
  // and take no lock a stuck loop could hold for long.
  virtual HealthReport liveness() { return HealthReport{.healthy = true}; }
  // `fn` is called (from any thread, holding no lock that health() takes) whenever an input of
  // health() changed, so that a consumer re-reads it then instead of polling. Providers that
  // never announce changes must set recheck_in.
  virtual void set_health_listener(std::function<void()> fn) { (void)fn; }
};

// The daemon's key numbers for the Stats RPC; the event stream's own numbers (seq, history,
// subscribers) come from the EventBus.
struct DaemonStats {
  std::string mode;  // "ebpf" or "relist"
  uint64_t start_time_ns = 0;
  uint64_t pods = 0;
  uint64_t containers = 0;
  uint64_t kernel_events = 0;
  uint64_t lost_kernel_events = 0;
  uint64_t corrections = 0;
  uint64_t relists = 0;
  uint64_t last_reconcile_ns = 0;  // CLOCK_REALTIME ns, 0 = never
  uint64_t cri_calls = 0;          // CRI calls made since start, all methods
  std::map<std::string, uint64_t> cri_calls_by_method;  // the same by method (called ones only)
  uint64_t confirm_retries = 0;    // looks after a kernel signal that did not settle it
  std::map<std::string, uint64_t> loop_wakeups_by_cause;  // the event loop's (ebpf mode)
};

// A CRI call in flight (cri/inflight_calls.h), as the InflightCalls RPC reports it.
struct InflightCallRecord {
  std::string method, origin;
  PodIdentity pod;
  std::string id, container_name;
  std::chrono::milliseconds age{0};
  std::string description;
};

class StatsProvider {
 public:
  virtual ~StatsProvider() = default;
  virtual DaemonStats stats() = 0;
  // Calls in flight at least `min_age`, oldest first.
  virtual std::vector<InflightCallRecord> inflight_calls(std::chrono::milliseconds min_age) {
    (void)min_age;
    return {};
  }
};

}  // namespace kpleg::api
