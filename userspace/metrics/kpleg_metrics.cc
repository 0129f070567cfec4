#include "metrics/kpleg_metrics.h"

#include <map>
#include <string>

#include "bus/event_bus.h"
#include "cri/call_stats.h"

#ifndef KPLEG_VERSION
#define KPLEG_VERSION "unknown"
#endif

namespace kpleg::metrics {
namespace {

// Prometheus' client default buckets (seconds), as the kubelet's PLEG histograms use.
constexpr double kDefaultBuckets[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10};
// Detection latency runs from ~100 us (exec seen, one ContainerStatus call) to seconds (CRI
// retries while the runtime catches up): finer at the low end than the default buckets.
constexpr double kDetectionBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};

constexpr MetricDefinition kDefinitions[] = {
    {"kubelet_pleg_relist_duration_seconds",
     MetricType::kHistogram,
     "Duration in seconds for relisting pods in PLEG.",
     {},
     kDefaultBuckets},
    {"kubelet_pleg_relist_interval_seconds",
     MetricType::kHistogram,
     "Interval in seconds between relisting in PLEG.",
     {},
     kDefaultBuckets},
    {"kubelet_pleg_last_seen_seconds", MetricType::kGauge,
     "Timestamp in seconds when PLEG was last seen active."},
    {"kubelet_pleg_discard_events", MetricType::kCounter,
     "The number of discard events in PLEG: events a consumer did not get because it "
     "fell too far behind and was cut off."},
    {"kpleg_kernel_events_total",
     MetricType::kCounter,
     "Kernel records consumed from the ring buffer, by kind.",
     {"kind"}},
    {"kpleg_lost_events_total", MetricType::kCounter,
     "Kernel records lost before userspace could read them."},
    {"kpleg_corrections_total",
     MetricType::kCounter,
     "Differences the reconcile relist had to fix, by kind; zero in a correct system.",
     {"kind"}},
    {"kpleg_cri_calls_total",
     MetricType::kCounter,
     "CRI calls by method and gRPC status code.",
     {"method", "code"}},
    {"kpleg_detection_latency_seconds",
     MetricType::kHistogram,
     "Time from the kernel's timestamp of a container transition to the confirmed "
     "event being emitted.",
     {},
     kDetectionBuckets},
    {"kpleg_events_total",
     MetricType::kCounter,
     "Pod lifecycle events emitted, by type and source.",
     {"type", "source"}},
    {"kpleg_subscribers", MetricType::kGauge, "Open Watch subscriptions."},
    {"kpleg_subscribers_cut_off_total", MetricType::kCounter,
     "Watch subscribers cut off because their queue was full."},
    {"kpleg_mode", MetricType::kGauge, "1 for the active event source mode.", {"mode"}},
    {"kpleg_foreign_containers_total", MetricType::kCounter,
     "Containers started in a tracked cgroup that the runtime does not know; their "
     "kernel signals are ignored."},
    {"kpleg_lookalike_cgroup_signals_total", MetricType::kCounter,
     "Kernel signals from cgroups that claim a container id whose container has an "
     "older cgroup (a look-alike path, e.g. in a user's delegated subtree); ignored "
     "without a runtime call."},
    {"kpleg_tracked_records", MetricType::kGauge,
     "Containers and sandboxes held by the tracker, removed ones included until they "
     "expire."},
    {"kpleg_runtime_events_total", MetricType::kCounter,
     "Events received on the runtime's GetContainerEvents stream (containerd >= 1.7), "
     "which confirm the kernel's signals."},
    {"kpleg_runtime_events_live", MetricType::kGauge,
     "1 while the runtime's event stream confirms the kernel's signals, 0 while "
     "targeted looks do."},
    {"kpleg_runtime_events_missed_removals_total", MetricType::kCounter,
     "Removals the removal sweep found that the runtime's live event stream never "
     "reported (no DELETED event): after the first, removals are swept for as without "
     "the stream until it stops."},
    {"kpleg_removal_hints_total", MetricType::kCounter,
     "Removal hints: removals of a directory named by an exited container's or "
     "sandbox's id (inotify in the runtime's directories, or the kernel's syscall "
     "tracepoints), which bring the removal sweep."},
    {"kpleg_removal_hints_missed_total", MetricType::kCounter,
     "Removals the removal sweep found that a hint was armed for but never came: after "
     "one, removals are swept for as without the hint until a hinted one is found."},
    {"kpleg_removal_hints_trusted", MetricType::kGauge,
     "1 while the removal hints stand for the periodic removal sweep of the ids they "
     "watch."},
    {"kpleg_exit_wakes", MetricType::kGauge,
     "1 while the kernel's record of a container init's exit wakes kplegd; 0 once it learned "
     "that the container cgroup's removal right after the exit does (one wakeup per death)."},
    {"kpleg_bpf_wake_after_seconds",
     MetricType::kGauge,
     "How long after it is made the kernel's record of a container's first exec, and of a "
     "cgroup's removal, wakes kplegd at the latest (the lag it learned for the runtime to "
     "report the change; 0: at once). Only with the BPF wake timer (Linux 5.15+).",
     {"record"}},
    {"kpleg_exit_wakeups_restored_total", MetricType::kCounter,
     "Times a death was confirmed without its cgroup's removal while exits woke nobody, "
     "and exits woke kplegd again."},
    {"kpleg_loop_wakeups_total",
     MetricType::kCounter,
     "Times kplegd's event loop (ebpf mode) woke, by what woke it: a descriptor that was "
     "ready, the first timer that ran, or a message from another thread.",
     {"cause"}},
    {"kpleg_uncovered_containers", MetricType::kGauge,
     "Running containers and sandboxes the last reconcile listed that the kernel path "
     "does not see."},
    {"kpleg_bpf_emitted_total", MetricType::kCounter,
     "Records the BPF programs committed to the ring buffer."},
    {"kpleg_bpf_filtered_total", MetricType::kCounter,
     "BPF hook invocations outside tracked cgroups, dropped in the kernel."},
    {"kpleg_bpf_ringbuf_drops_total",
     MetricType::kCounter,
     "Kernel records lost because the ring buffer was full, by record type.",
     {"type"}},
    {"kpleg_bpf_helper_failures_total",
     MetricType::kCounter,
     "BPF helper calls that returned an error, by program and errno (63: 63 or more).",
     {"program", "errno"}},
    {"kpleg_bpf_not_claimed_total",
     MetricType::kCounter,
     "Execs and exits in tracked cgroups that are not a container's start or death, by "
     "what they were.",
     {"what"}},
    {"kpleg_bpf_track_full_total", MetricType::kCounter,
     "Cgroups under a tracked root that the BPF tracked-cgroup map had no room for."},
    {"kpleg_bpf_over_budget_total", MetricType::kCounter,
     "Cgroups not tracked because their pod was over its budget (cgroups tracked below the pod, "
     "or mkdirs per second); the pod pays for its own noise."},
    {"kpleg_pods_over_budget", MetricType::kGauge,
     "Pods (pod cgroups) that have had a cgroup refused by their budget."},
    {"kpleg_bpf_tracked_cgroups", MetricType::kGauge, "Entries in the BPF tracked-cgroup map."},
    {"kpleg_bpf_tracked_cgroups_capacity", MetricType::kGauge,
     "Capacity of the BPF tracked-cgroup map (--max-tracked-cgroups)."},
    {"kpleg_untracked_cgroups", MetricType::kGauge,
     "Cgroups under a tracked root that are not tracked because the map was full; "
     "their containers' events come from the reconcile alone."},
    {"kpleg_stale_tracked_cgroups_removed_total", MetricType::kCounter,
     "Entries of cgroups that no longer exist, removed from the tracked-cgroup map at "
     "reconcile."},
    {"kpleg_cri_calls_in_flight",
     MetricType::kGauge,
     "CRI calls in flight now, by method and origin (kplegd: its own; endpoint: a "
     "client of --cri-listen, forwarded).",
     {"method", "origin"}},
    {"kpleg_cri_call_oldest_in_flight_seconds",
     MetricType::kGauge,
     "Age of the oldest CRI call in flight, by method and origin; 0 when none is.",
     {"method", "origin"}},
    {"kpleg_cri_endpoint_calls_total",
     MetricType::kCounter,
     "Calls forwarded through the CRI endpoint (--cri-listen), by method and the "
     "runtime's gRPC status code.",
     {"method", "code"}},
    {"kpleg_cri_endpoint_event_streams", MetricType::kGauge,
     "GetContainerEvents streams open on the CRI endpoint."},
    {"kpleg_cri_endpoint_events_total", MetricType::kCounter,
     "Container events built for the CRI endpoint's GetContainerEvents subscribers."},
    {"kpleg_cri_endpoint_events_dropped_total", MetricType::kCounter,
     "Container events the CRI endpoint could not build (the runtime's calls failed "
     "every attempt)."},
    {"kpleg_build_info", MetricType::kGauge, "kpleg's version; always 1.", {"version"}},
};

std::vector<std::string> label_names(const MetricDefinition& d) {
  std::vector<std::string> out;
  for (auto l : d.labels)
    if (!l.empty()) out.emplace_back(l);
  return out;
}

}  // namespace

std::span<const MetricDefinition> metric_definitions() { return kDefinitions; }

// Registers every definition, in the table's order, and hands each member its family by name
// (std::out_of_range for a name the table lacks or holds with another type).
class KplegMetrics::Families {
 public:
  explicit Families(Registry& r) {
    for (const auto& d : kDefinitions) {
      const std::string name(d.name), help(d.help);
      switch (d.type) {
        case MetricType::kCounter:
          counters_.emplace(d.name, &r.counter(name, help, label_names(d)));
          break;
        case MetricType::kGauge:
          gauges_.emplace(d.name, &r.gauge(name, help, label_names(d)));
          break;
        case MetricType::kHistogram:
          histograms_.emplace(d.name, &r.histogram(name, help, {d.buckets.begin(), d.buckets.end()},
                                                   label_names(d)));
          break;
      }
    }
  }
  Family<Counter>& counters(std::string_view name) const { return *counters_.at(name); }
  Family<Gauge>& gauges(std::string_view name) const { return *gauges_.at(name); }
  Counter& counter(std::string_view name) const { return counters(name).get(); }
  Gauge& gauge(std::string_view name) const { return gauges(name).get(); }
  Histogram& histogram(std::string_view name) const { return histograms_.at(name)->get(); }

 private:
  std::map<std::string_view, Family<Counter>*> counters_;
  std::map<std::string_view, Family<Gauge>*> gauges_;
  std::map<std::string_view, Family<Histogram>*> histograms_;
};

KplegMetrics::KplegMetrics(Registry& r) : KplegMetrics(r, Families(r)) {}

KplegMetrics::KplegMetrics(Registry& r, const Families& f)
    : relist_duration(f.histogram("kubelet_pleg_relist_duration_seconds")),
      relist_interval(f.histogram("kubelet_pleg_relist_interval_seconds")),
      last_seen(f.gauge("kubelet_pleg_last_seen_seconds")),
      discard_events(f.counter("kubelet_pleg_discard_events")),
      kernel_events(f.counters("kpleg_kernel_events_total")),
      lost_events(f.counter("kpleg_lost_events_total")),
      corrections(f.counters("kpleg_corrections_total")),
      cri_calls(f.counters("kpleg_cri_calls_total")),
      detection_latency(f.histogram("kpleg_detection_latency_seconds")),
      events(f.counters("kpleg_events_total")),
      subscribers(f.gauge("kpleg_subscribers")),
      subscribers_cut_off(f.counter("kpleg_subscribers_cut_off_total")),
      mode(f.gauges("kpleg_mode")),
      foreign_containers(f.counter("kpleg_foreign_containers_total")),
      lookalike_signals(f.counter("kpleg_lookalike_cgroup_signals_total")),
      tracked_records(f.gauge("kpleg_tracked_records")),
      runtime_events(f.counter("kpleg_runtime_events_total")),
      runtime_events_live(f.gauge("kpleg_runtime_events_live")),
      runtime_events_missed_removals(f.counter("kpleg_runtime_events_missed_removals_total")),
      removal_hints(f.counter("kpleg_removal_hints_total")),
      removal_hints_missed(f.counter("kpleg_removal_hints_missed_total")),
      removal_hints_trusted(f.gauge("kpleg_removal_hints_trusted")),
      exit_wakes(f.gauge("kpleg_exit_wakes")),
      bpf_wake_after(f.gauges("kpleg_bpf_wake_after_seconds")),
      exit_wakeups_restored(f.counter("kpleg_exit_wakeups_restored_total")),
      loop_wakeups(f.counters("kpleg_loop_wakeups_total")),
      uncovered_containers(f.gauge("kpleg_uncovered_containers")),
      bpf_over_budget(f.counter("kpleg_bpf_over_budget_total")),
      pods_over_budget(f.gauge("kpleg_pods_over_budget")),
      bpf_emitted(f.counter("kpleg_bpf_emitted_total")),
      bpf_filtered(f.counter("kpleg_bpf_filtered_total")),
      bpf_ringbuf_drops(f.counters("kpleg_bpf_ringbuf_drops_total")),
      bpf_helper_failures(f.counters("kpleg_bpf_helper_failures_total")),
      bpf_not_claimed(f.counters("kpleg_bpf_not_claimed_total")),
      bpf_track_full(f.counter("kpleg_bpf_track_full_total")),
      bpf_tracked_cgroups(f.gauge("kpleg_bpf_tracked_cgroups")),
      bpf_tracked_cgroups_capacity(f.gauge("kpleg_bpf_tracked_cgroups_capacity")),
      untracked_cgroups(f.gauge("kpleg_untracked_cgroups")),
      stale_tracked_removed(f.counter("kpleg_stale_tracked_cgroups_removed_total")),
      cri_calls_in_flight(f.gauges("kpleg_cri_calls_in_flight")),
      cri_call_oldest_seconds(f.gauges("kpleg_cri_call_oldest_in_flight_seconds")),
      cri_endpoint_calls(f.counters("kpleg_cri_endpoint_calls_total")),
      cri_endpoint_event_streams(f.gauge("kpleg_cri_endpoint_event_streams")),
      cri_endpoint_events(f.counter("kpleg_cri_endpoint_events_total")),
      cri_endpoint_events_dropped(f.counter("kpleg_cri_endpoint_events_dropped_total")),
      registry_(r) {
  f.gauges("kpleg_build_info").with({KPLEG_VERSION}).set(1);
  for (size_t t = 0; t < kTypes; ++t)
    for (size_t s = 0; s < kSources; ++s)
      events_by_type_source_[t][s] =
          &events.with({pleg::to_string(static_cast<pleg::EventType>(t)),
                        pleg::to_string(static_cast<pleg::EventSource>(s))});
  mode.with({"ebpf"});
  mode.with({"relist"});
}

void KplegMetrics::set_mode(std::string_view active) {
  mode.with({std::string(active)}).set(1);
  for (const char* m : {"ebpf", "relist"})
    if (active != m) mode.with({m}).set(0);
}

void KplegMetrics::observe_published(const pleg::PodLifecycleEvent& ev) {
  auto t = static_cast<size_t>(ev.type);
  auto s = static_cast<size_t>(ev.source);
  if (t < kTypes && s < kSources) events_by_type_source_[t][s]->inc();
  if (ev.kernel_ts_ns != 0 && ev.emit_ts_ns >= ev.kernel_ts_ns)
    detection_latency.observe(static_cast<double>(ev.emit_ts_ns - ev.kernel_ts_ns) / 1e9);
}

void KplegMetrics::mirror_cri_calls(const cri::CallStats& stats) {
  registry_.add_collector([this, &stats] {
    for (size_t m = 0; m < cri::kCriMethodCount; ++m) {
      auto method = static_cast<cri::CriMethod>(m);
      for (size_t c = 0; c < cri::kGrpcStatusCodeCount; ++c) {
        uint64_t n = stats.count(method, static_cast<int>(c));
        // Only pairs that happened: 14 methods x 17 codes would be mostly zeros.
        if (n == 0) continue;
        cri_calls
            .with({std::string(cri::cri_method_name(method)),
                   std::string(cri::grpc_code_name(static_cast<int>(c)))})
            .set(static_cast<double>(n));
      }
    }
  });
}

void KplegMetrics::mirror_bus(const bus::EventBus& bus) {
  registry_.add_collector([this, &bus] {
    bus::BusStats st = bus.stats();
    subscribers.set(static_cast<double>(st.subscribers));
    subscribers_cut_off.set(static_cast<double>(st.subscribers_cut_off));
    discard_events.set(static_cast<double>(st.discarded_events));
  });
}

void KplegMetrics::on_scrape(std::function<void()> f) { registry_.add_collector(std::move(f)); }

}  // namespace kpleg::metrics
