#include "daemon/health_policy.h"

#include <utility>

namespace kpleg::daemon {

namespace {
// How long the report names a loss of kernel records (the ring buffer was full).
constexpr std::chrono::minutes kLossReasonFor{5};

int64_t seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}
}  // namespace

api::HealthReport HealthPolicy::health(const Components& c) const {
  api::HealthReport r;
  r.healthy = true;
  auto fail = [&r](std::string why) {
    r.healthy = false;
    r.reasons.push_back(std::move(why));
  };
  (void)runtime_down_for(c.cri, std::chrono::steady_clock::now());
  if (!c.cri.connected()) {
    fail("container runtime unreachable at " + settings_.runtime_endpoint + " (" +
         std::string(cri::connection_state_name(c.cri.state())) + ")");
  }
  if (c.ebpf) {
    auto ks = c.kernel->stats();
    if (!ks.attached) fail("kernel event source not attached");
    if (!ks.consuming) fail("kernel event source stopped consuming the ring buffer");
    auto rs = c.reconciler->stats();
    auto threshold = 2 * settings_.reconcile_period + std::chrono::seconds(60);
    if (!rs.last_success_mono) {
      fail("no successful reconcile yet" + (rs.last_error.empty() ? "" : ": " + rs.last_error));
    } else if (!rs.last_error.empty()) {
      // The runtime did not answer the last full list (it hangs, or fails): until one succeeds,
      // an event kplegd missed would not be recovered. A restart would not help: liveness holds.
      fail("the last reconcile failed: " + rs.last_error);
    } else if (auto age = std::chrono::steady_clock::now() - *rs.last_success_mono;
               age <= threshold) {
      // Healthy until the last success grows too old (each reconcile announces itself).
      r.recheck_in = std::chrono::duration_cast<std::chrono::milliseconds>(threshold - age) +
                     std::chrono::milliseconds(1);
    } else {
      fail("last successful reconcile " + std::to_string(seconds(age)) + " s ago" +
           (rs.last_error.empty() ? "" : ": " + rs.last_error));
    }
    if (const uint64_t untracked = ks.untracked_cgroups; untracked > 0) {
      // Degraded, not failing: a restart would meet the same tree; the reconcile covers them.
      r.reasons.push_back("the kernel's tracked-cgroup map is full (--max-tracked-cgroups=" +
                          std::to_string(ks.map_capacity) + "): " + std::to_string(untracked) +
                          " cgroups are not tracked and their containers' events come only from "
                          "the reconcile; raise --max-tracked-cgroups");
    }
    if (const uint64_t lost = lost_records_.load(); lost > 0) {
      const auto since = std::chrono::steady_clock::now() -
                         std::chrono::steady_clock::time_point(
                             std::chrono::steady_clock::duration(last_loss_ns_.load()));
      if (since < kLossReasonFor) {
        r.reasons.push_back(std::to_string(lost) + " kernel records lost since start, the last " +
                            std::to_string(seconds(since)) +
                            " s ago (ring buffer full); a reconcile recovered their events each "
                            "time; raise --ringbuf-kib if this recurs");
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kLossReasonFor - since) +
                    std::chrono::milliseconds(1);
        if (!r.recheck_in || left < *r.recheck_in) r.recheck_in = left;
      }
    }
    {
      // Degraded, not failing: those containers' events still come, at reconcile speed.
      std::lock_guard lk(coverage_mu_);
      if (uncovered_ > 0) {
        r.reasons.push_back(
            std::to_string(uncovered_) +
            " running containers and sandboxes are not seen by the kernel path, e.g. " +
            uncovered_example_ + "; their events come only from the reconcile (every " +
            std::to_string(seconds(settings_.reconcile_period)) + " s)");
      }
    }
    // A pod whose runtime calls fail is named, but does not make the node's events unhealthy:
    // every other pod is confirmed by other workers.
    for (const auto& t : c.tracker->troubled_pods()) {
      r.reasons.push_back("pod " + t.pod_uid + ": " + std::to_string(t.failures) +
                          " container runtime calls failed in the last " +
                          std::to_string(seconds(t.failing_for)) + " s: " + t.last_error);
    }
  } else if (c.relist) {
    auto h = c.relist->health();
    if (!h.healthy) fail(h.reason);
    for (const auto& p : h.pending_inspections) {
      r.reasons.push_back("pod " + p.pod.namespace_ + "/" + p.pod.name + " (" + p.pod.uid +
                          ") failed inspection " + std::to_string(p.attempts) +
                          " times: " + p.error);
    }
    if (!c.fallback_reason.empty())
      r.reasons.push_back("relist mode because: " + c.fallback_reason);
    // Relist mode polls the runtime anyway: its health follows the relist period.
    r.recheck_in = settings_.relist_period;
  }
  report_stuck_calls(c.inflight, r);
  return r;
}

api::HealthReport HealthPolicy::liveness(const Components& c) const {
  LivenessInputs in{.ebpf = c.ebpf, .now = std::chrono::steady_clock::now()};
  in.runtime_refused_for = runtime_down_for(c.cri, in.now);
  if (c.ebpf) {
    in.kernel_consuming = c.kernel->live();
    in.reconcile_running_since = c.reconciler->stats().running_since;
  }
  return liveness(in);
}

api::HealthReport HealthPolicy::liveness(const LivenessInputs& in) const {
  api::HealthReport r;
  r.healthy = true;
  if (in.runtime_refused_for) {
    if (*in.runtime_refused_for > kRuntimeRefusedFor) {
      r.healthy = false;
      r.reasons.push_back("the container runtime's socket has refused connections for " +
                          std::to_string(seconds(*in.runtime_refused_for)) +
                          " s: a runtime restarted since kplegd started listens on a new socket, "
                          "which kplegd sees after a restart when the socket is mounted alone");
    } else {
      r.recheck_in = std::chrono::duration_cast<std::chrono::milliseconds>(
                         kRuntimeRefusedFor - *in.runtime_refused_for) +
                     std::chrono::milliseconds(1);
    }
  }
  if (!in.ebpf) return r;  // relist mode: its loop's calls all have deadlines
  if (!in.kernel_consuming) {
    r.healthy = false;
    r.reasons.push_back("kernel event source stopped consuming the ring buffer");
  }
  if (in.reconcile_running_since) {
    const auto bound = stuck_reconcile_after();
    const auto running = in.now - *in.reconcile_running_since;
    if (running > bound) {
      r.healthy = false;
      r.reasons.push_back("a reconcile has been running for " + std::to_string(seconds(running)) +
                          " s, past its calls' deadlines (" + std::to_string(seconds(bound)) +
                          " s): kplegd is stuck");
    } else {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(bound - running) +
                  std::chrono::milliseconds(1);
      if (!r.recheck_in || left < *r.recheck_in) r.recheck_in = left;
    }
  }
  return r;
}

std::optional<std::chrono::steady_clock::duration> HealthPolicy::runtime_down_for(
    const cri::GrpcCriClient& cri, std::chrono::steady_clock::time_point now) const {
  // A hung runtime keeps the connection (READY); an idle channel is not a refusal.
  const auto state = cri.state();
  if (state == cri::ConnectionState::kReady || state == cri::ConnectionState::kIdle) {
    runtime_down_since_ns_.store(0);
    return std::nullopt;
  }
  const int64_t now_ns = now.time_since_epoch().count();
  int64_t since = 0;
  if (runtime_down_since_ns_.compare_exchange_strong(since, now_ns)) return now - now;
  return now - std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(since));
}

void HealthPolicy::report_stuck_calls(const cri::InflightCalls& inflight,
                                      api::HealthReport& r) const {
  const auto threshold = settings_.stuck_call_threshold;
  // Degraded, not failing: kpleg's events still flow; the call is the runtime's problem (or a
  // CNI plugin's), and naming it, before the kubelet's PLEG gives up, is the point.
  for (const auto& c : inflight.older_than(threshold)) r.reasons.push_back(cri::describe(c));
  if (auto left = inflight.until_one_reaches(threshold)) {
    *left += std::chrono::milliseconds(1);
    if (!r.recheck_in || *left < *r.recheck_in) r.recheck_in = *left;
  }
}

bool HealthPolicy::note_records_lost(uint64_t n) {
  lost_records_ += n;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t before = last_loss_ns_.exchange(now);
  return before == 0 || now - before >= std::chrono::nanoseconds(kLossReasonFor).count();
}

size_t HealthPolicy::note_uncovered(size_t uncovered, std::string example) {
  std::lock_guard lk(coverage_mu_);
  uncovered_example_ = std::move(example);
  return std::exchange(uncovered_, uncovered);
}

}  // namespace kpleg::daemon
