// The metric families kpleg exports. Where the meaning is the kubelet's, the name is the
// kubelet's (kubelet_pleg_*), so existing dashboards and alerts keep working; the rest are
// kpleg_*. Components get a handle once and update it on their hot path.
#pragma once

#include <array>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "metrics/registry.h"
#include "pleg/event.h"

namespace kpleg::bus {
class EventBus;
}
namespace kpleg::cri {
class CallStats;
}

namespace kpleg::metrics {

// One family kpleg exports. Names, types, labels and help texts are an interface: dashboards
// and alerts select on them, and docs/api.md lists them.
struct MetricDefinition {
  std::string_view name;
  MetricType type;
  std::string_view help;
  std::array<std::string_view, 2> labels{};  // label names; an empty one is none
  std::span<const double> buckets{};         // a histogram's upper bounds
};

// Every family, in the order registered.
std::span<const MetricDefinition> metric_definitions();

struct KplegMetrics {
  // Registers every family of metric_definitions() in `registry`.
  explicit KplegMetrics(Registry& registry);

  // kubelet_pleg_relist_duration_seconds: one relist (list + inspect + diff), either mode.
  Histogram& relist_duration;
  // kubelet_pleg_relist_interval_seconds: time between the starts of two relists.
  Histogram& relist_interval;
  // kubelet_pleg_last_seen_seconds: Unix time the pipeline was last seen active (a relist ran
  // or kernel events were consumed); the kubelet's PLEG-is-not-healthy alert reads it.
  Gauge& last_seen;
  // kubelet_pleg_discard_events: events a consumer did not get because it fell too far
  // behind and was cut off (mirrored from the event bus at scrape time).
  Counter& discard_events;

  // kpleg_kernel_events_total{kind}: kernel records consumed (exec, exit, cgroup_mkdir, ...).
  Family<Counter>& kernel_events;
  // kpleg_lost_events_total: kernel records lost (ring buffer full, helper failure).
  Counter& lost_events;
  // kpleg_corrections_total{kind}: differences the reconcile relist had to fix; zero in a
  // correct system.
  Family<Counter>& corrections;
  // kpleg_cri_calls_total{method,code}: CRI calls by result (mirrored from cri::CallStats).
  Family<Counter>& cri_calls;
  // kpleg_detection_latency_seconds: kernel timestamp of a transition -> event emitted.
  Histogram& detection_latency;
  // kpleg_events_total{type,source}: events emitted.
  Family<Counter>& events;
  // kpleg_subscribers / kpleg_subscribers_cut_off_total: Watch consumers (from the bus).
  Gauge& subscribers;
  Counter& subscribers_cut_off;
  // kpleg_mode{mode}: 1 for the active mode ("ebpf" or "relist"), 0 for the other.
  Family<Gauge>& mode;
  // kpleg_foreign_containers_total: containers that started in a tracked cgroup but that the
  // runtime does not know (another runtime's); their kernel signals are ignored.
  Counter& foreign_containers;
  Counter& lookalike_signals;
  // kpleg_tracked_records: containers and sandboxes the ebpf-mode tracker holds in memory,
  // removed ones included until they expire.
  Gauge& tracked_records;
  // kpleg_runtime_events_total: events received on the runtime's GetContainerEvents stream;
  // kpleg_runtime_events_live: 1 while that stream confirms the kernel's signals (ebpf mode).
  Counter& runtime_events;
  Gauge& runtime_events_live;
  // kpleg_runtime_events_missed_removals_total: removals the sweep found that the live stream
  // never reported (after the first, removals are swept for as without the stream).
  Counter& runtime_events_missed_removals;
  // kpleg_removal_hints_total: removal hints (the removal of a directory named by an exited
  // container's or sandbox's id); kpleg_removal_hints_missed_total: removals the sweep found
  // that a hint was armed for but never came; kpleg_removal_hints_trusted: 1 while hinted
  // ids are swept for rarely (a hinted removal was found, and no unhinted one since).
  Counter& removal_hints;
  Counter& removal_hints_missed;
  Gauge& removal_hints_trusted;
  // kpleg_exit_wakes: 1 while an init's exit wakes the tracker (0 once it learned that the
  // cgroup's rmdir right after it does: pleg/exit_wakeup.h); kpleg_exit_wakeups_restored_total:
  // times a death was then confirmed without that rmdir, and exits woke it again.
  Gauge& exit_wakes;
  // kpleg_bpf_wake_after_seconds{record}: how long an exec's ("exec") and a cgroup removal's
  // ("rmdir") record may wait to wake kplegd (kernel::BpfProgram::set_wake_after); set only
  // with the wake timer.
  Family<Gauge>& bpf_wake_after;
  Counter& exit_wakeups_restored;
  // kpleg_loop_wakeups_total{cause}: times the kernel-driven path's event loop woke, by what
  // woke it (pleg/event_loop.h: EventLoop::woken_by).
  Family<Counter>& loop_wakeups;
  // kpleg_uncovered_containers: running containers and sandboxes that the last reconcile listed
  // but that the kernel path does not see (their cgroup is not under a tracked root, or they
  // have none on the host: kata, gVisor): their events come from the reconcile alone.
  Gauge& uncovered_containers;

  // The BPF programs' own counters (ebpf mode), copied in at scrape time:
  // kpleg_bpf_emitted_total: records committed to the ring buffer;
  // kpleg_bpf_filtered_total: hook invocations outside tracked cgroups, dropped in the kernel;
  // kpleg_bpf_ringbuf_drops_total{type}: records lost because the ring buffer was full;
  // kpleg_bpf_helper_failures_total: BPF helpers that returned an error;
  // kpleg_bpf_not_claimed_total{what}: execs and exits in tracked cgroups that are not a
  //   container's start or death (exec_repeated, exec_runtime_reexec, exec_hook, exit_not_init);
  // kpleg_bpf_track_full_total: cgroups the tracked-cgroup map had no room for;
  // kpleg_bpf_tracked_cgroups / kpleg_bpf_tracked_cgroups_capacity: the map's entries and size;
  // kpleg_untracked_cgroups: cgroups under a tracked root not tracked now (0 after a resync
  //   placed them all); kpleg_stale_tracked_cgroups_removed_total: entries of vanished cgroups
  //   removed at reconcile.
  // kpleg_bpf_over_budget_total: mkdirs not tracked because their pod was over its budget
  //   (--max-cgroups-per-pod, --max-cgroup-mkdirs-per-pod); kpleg_pods_over_budget: pods that
  //   have had a cgroup refused (the log names them).
  Counter& bpf_over_budget;
  Gauge& pods_over_budget;
  Counter& bpf_emitted;
  Counter& bpf_filtered;
  Family<Counter>& bpf_ringbuf_drops;
  Family<Counter>& bpf_helper_failures;
  Family<Counter>& bpf_not_claimed;
  Counter& bpf_track_full;
  Gauge& bpf_tracked_cgroups;
  Gauge& bpf_tracked_cgroups_capacity;
  Gauge& untracked_cgroups;
  Counter& stale_tracked_removed;
  // The stuck-call watchdog (cri/inflight_calls.h): by method and origin (kplegd, endpoint).
  Family<Gauge>& cri_calls_in_flight;
  Family<Gauge>& cri_call_oldest_seconds;
  // The CRI endpoint (--cri-listen).
  Family<Counter>& cri_endpoint_calls;
  Gauge& cri_endpoint_event_streams;
  Counter& cri_endpoint_events;
  Counter& cri_endpoint_events_dropped;

  void set_mode(std::string_view active);

  // For EventBusOptions::on_publish: counts the event and, when the kernel saw the
  // transition, its detection latency. One atomic add per event (handles are cached).
  void observe_published(const pleg::PodLifecycleEvent& ev);

  // Copy kept-elsewhere numbers in at every scrape; the sources must outlive the registry.
  void mirror_cri_calls(const cri::CallStats& stats);
  void mirror_bus(const bus::EventBus& bus);
  // Runs f before every scrape (to copy in numbers kept elsewhere); f's captures must outlive
  // the registry.
  void on_scrape(std::function<void()> f);

 private:
  class Families;
  KplegMetrics(Registry& registry, const Families& families);

  Registry& registry_;
  static constexpr size_t kTypes = 6, kSources = 3;
  std::array<std::array<Counter*, kSources>, kTypes> events_by_type_source_{};
};

}  // namespace kpleg::metrics
