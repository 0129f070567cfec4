#include "daemon/metrics_mirror.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace kpleg::daemon {

MetricsMirror::MetricsMirror() {
  for (size_t k = 0; k < kernel::kKernelEventKinds; ++k)
    kernel_events_by_kind_[k] = &metrics_.kernel_events.with({kernel::kKernelEventKindNames[k]});
}

void MetricsMirror::mirror_at_scrape(std::function<Sources()> sources) {
  metrics_.on_scrape([this, sources = std::move(sources)] { mirror(sources()); });
}

void MetricsMirror::on_published(const pleg::PodLifecycleEvent& ev) {
  metrics_.observe_published(ev);
  if (ev.correction) metrics_.corrections.with({pleg::to_string(ev.type)}).inc();
}

void MetricsMirror::on_records_lost(uint64_t n) { metrics_.lost_events.inc(double(n)); }

void MetricsMirror::on_reconcile(const pleg::ReconcilerStats& rs, bool ok) {
  metrics_.relist_duration.observe(std::chrono::duration<double>(rs.last_duration).count());
  if (ok) metrics_.last_seen.set_to_current_time();
}

void MetricsMirror::on_relist(const pleg::RelistStats& rs) {
  metrics_.relist_duration.observe(double(rs.last_duration_ns) / 1e9);
  if (rs.last_interval_ns > 0) metrics_.relist_interval.observe(double(rs.last_interval_ns) / 1e9);
  if (rs.consecutive_failures == 0) metrics_.last_seen.set_to_current_time();
}

void MetricsMirror::on_coverage(size_t uncovered) {
  metrics_.uncovered_containers.set(double(uncovered));
}

void MetricsMirror::on_stale_tracked_removed(uint64_t n) {
  metrics_.stale_tracked_removed.inc(double(n));
}

void MetricsMirror::mirror(const Sources& s) {
  if (s.inflight) {
    for (const auto& m : s.inflight->by_method()) {
      const std::vector<std::string> labels{m.method, cri::to_string(m.origin)};
      metrics_.cri_calls_in_flight.with(labels).set(double(m.count));
      metrics_.cri_call_oldest_seconds.with(labels).set(
          std::chrono::duration<double>(m.oldest).count());
    }
  }
  if (s.cri_endpoint) {
    auto es = s.cri_endpoint->stats();
    for (const auto& [key, n] : es.calls)
      metrics_.cri_endpoint_calls.with({key.first, std::string(cri::grpc_code_name(key.second))})
          .set(double(n));
    metrics_.cri_endpoint_event_streams.set(double(es.event_streams));
  }
  if (s.event_feed) {
    auto fs = s.event_feed->stats();
    metrics_.cri_endpoint_events.set(double(fs.sent));
    metrics_.cri_endpoint_events_dropped.set(double(fs.dropped));
  }
  if (!s.ebpf) return;  // relist mode (or auto fell back to it): none of the rest exists
  pleg::TrackerStats ts = s.tracker->stats();
  metrics_.foreign_containers.set(static_cast<double>(ts.foreign_containers));
  metrics_.lookalike_signals.set(static_cast<double>(ts.lookalike_signals));
  metrics_.tracked_records.set(static_cast<double>(ts.records));
  metrics_.runtime_events_live.set(ts.runtime_events_live ? 1 : 0);
  metrics_.runtime_events_missed_removals.set(
      static_cast<double>(ts.runtime_events_missed_removals));
  metrics_.removal_hints.set(static_cast<double>(ts.removal_hints));
  metrics_.removal_hints_missed.set(static_cast<double>(ts.removal_hints_missed));
  metrics_.removal_hints_trusted.set(ts.removal_hints_trusted ? 1 : 0);
  metrics_.exit_wakes.set(ts.exit_wakes ? 1 : 0);
  metrics_.exit_wakeups_restored.set(static_cast<double>(ts.exit_wakeups_restored));
  for (const auto& [cause, n] : ts.loop_woken_by)
    metrics_.loop_wakeups.with({cause}).set(static_cast<double>(n));
  if (s.runtime_events) {
    metrics_.runtime_events.set(static_cast<double>(s.runtime_events->stats().events));
  }
  // The kernel path is the pipeline in ebpf mode: while it is attached and consumed, the
  // pipeline is live now, not only at the last reconcile (every 300 s), which would trip the
  // kubelet's 3-minute staleness alerts.
  if (s.kernel->live()) metrics_.last_seen.set_to_current_time();
  mirror_kernel(*s.kernel);
}

void MetricsMirror::mirror_kernel(kernel::BpfKernelSource& kernel) {
  auto ks = kernel.stats();
  const auto& b = ks.bpf;
  metrics_.bpf_emitted.set(double(b.emitted));
  metrics_.bpf_filtered.set(double(b.filtered));
  for (size_t t = 0; t < kernel::kKernelEventKinds; ++t)
    metrics_.bpf_ringbuf_drops.with({kernel::kKernelEventKindNames[t]}).set(double(b.drops_by_type[t]));
  if (b.helper_failures > 0) {  // one map read per scrape only once something failed
    if (auto* p = kernel.program()) {
      if (auto failures = p->helper_failures()) {
        for (const auto& f : *failures)
          metrics_.bpf_helper_failures.with({f.program, std::to_string(f.error)}).set(double(f.count));
      }
    }
  }
  metrics_.bpf_not_claimed.with({"exec_repeated"}).set(double(b.exec_repeated));
  metrics_.bpf_not_claimed.with({"exec_runtime_reexec"}).set(double(b.exec_reexec));
  metrics_.bpf_not_claimed.with({"exec_hook"}).set(double(b.exec_hook));
  metrics_.bpf_not_claimed.with({"exit_not_init"}).set(double(b.exit_ignored));
  metrics_.bpf_track_full.set(double(b.track_full));
  metrics_.bpf_over_budget.set(double(b.over_budget));
  if (b.over_budget > 0) {  // one map walk per scrape only once a pod went over
    if (auto* p = kernel.program()) {
      size_t over = 0;
      for (const auto& [pod, budget] : p->pod_budgets()) over += budget.refused > 0;
      metrics_.pods_over_budget.set(double(over));
    }
  }
  if (auto* p = kernel.program()) {
    metrics_.bpf_tracked_cgroups.set(double(p->tracked_count()));
    if (p->wake_timer()) {
      const auto [exec, rmdir] = p->wake_after();
      metrics_.bpf_wake_after.with({"exec"}).set(std::chrono::duration<double>(exec).count());
      metrics_.bpf_wake_after.with({"rmdir"}).set(std::chrono::duration<double>(rmdir).count());
    }
  }
  metrics_.bpf_tracked_cgroups_capacity.set(double(ks.map_capacity));
  metrics_.untracked_cgroups.set(double(ks.untracked_cgroups));
}

}  // namespace kpleg::daemon
