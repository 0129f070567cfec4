#include "metrics/kpleg_metrics.h"

#include <string>

#include "bus/event_bus.h"
#include "cri/call_stats.h"

#ifndef KPLEG_VERSION
#define KPLEG_VERSION "unknown"
#endif

namespace kpleg::metrics {
namespace {

// Detection latency runs from ~100 us (exec seen, one ContainerStatus call) to seconds (CRI
// retries while the runtime catches up): finer at the low end than the default buckets.
std::vector<double> detection_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
}

}  // namespace

KplegMetrics::KplegMetrics(Registry& r)
    : relist_duration(r.histogram("kubelet_pleg_relist_duration_seconds",
                                  "Duration in seconds for relisting pods in PLEG.",
                                  default_buckets())
                          .get()),
      relist_interval(r.histogram("kubelet_pleg_relist_interval_seconds",
                                  "Interval in seconds between relisting in PLEG.",
                                  default_buckets())
                          .get()),
      last_seen(r.gauge("kubelet_pleg_last_seen_seconds",
                        "Timestamp in seconds when PLEG was last seen active.")
                    .get()),
      discard_events(r.counter("kubelet_pleg_discard_events",
                               "The number of discard events in PLEG: events a consumer did "
                               "not get because it fell too far behind and was cut off.")
                         .get()),
      kernel_events(r.counter("kpleg_kernel_events_total",
                              "Kernel records consumed from the ring buffer, by kind.", {"kind"})),
      lost_events(r.counter("kpleg_lost_events_total",
                            "Kernel records lost before userspace could read them.")
                      .get()),
      corrections(r.counter("kpleg_corrections_total",
                            "Differences the reconcile relist had to fix, by kind; zero in a "
                            "correct system.",
                            {"kind"})),
      cri_calls(r.counter("kpleg_cri_calls_total", "CRI calls by method and gRPC status code.",
                          {"method", "code"})),
      detection_latency(r.histogram("kpleg_detection_latency_seconds",
                                    "Time from the kernel's timestamp of a container "
                                    "transition to the confirmed event being emitted.",
                                    detection_buckets())
                            .get()),
      events(r.counter("kpleg_events_total", "Pod lifecycle events emitted, by type and source.",
                       {"type", "source"})),
      subscribers(r.gauge("kpleg_subscribers", "Open Watch subscriptions.").get()),
      subscribers_cut_off(r.counter("kpleg_subscribers_cut_off_total",
                                    "Watch subscribers cut off because their queue was full.")
                              .get()),
      mode(r.gauge("kpleg_mode", "1 for the active event source mode.", {"mode"})),
      foreign_containers(r.counter("kpleg_foreign_containers_total",
                                   "Containers started in a tracked cgroup that the runtime "
                                   "does not know; their kernel signals are ignored.")
                             .get()),
      lookalike_signals(r.counter("kpleg_lookalike_cgroup_signals_total",
                                  "Kernel signals from cgroups that claim a container id whose "
                                  "container has an older cgroup (a look-alike path, e.g. in a "
                                  "user's delegated subtree); ignored without a runtime call.")
                            .get()),
      tracked_records(r.gauge("kpleg_tracked_records",
                              "Containers and sandboxes held by the tracker, removed ones "
                              "included until they expire.")
                          .get()),
      runtime_events(r.counter("kpleg_runtime_events_total",
                               "Events received on the runtime's GetContainerEvents stream "
                               "(containerd >= 1.7), which confirm the kernel's signals.")
                         .get()),
      runtime_events_live(r.gauge("kpleg_runtime_events_live",
                                  "1 while the runtime's event stream confirms the kernel's "
                                  "signals, 0 while targeted looks do.")
                              .get()),
      runtime_events_missed_removals(
          r.counter("kpleg_runtime_events_missed_removals_total",
                    "Removals the removal sweep found that the runtime's live event stream never "
                    "reported (no DELETED event): after the first, removals are swept for as "
                    "without the stream until it stops.")
              .get()),
      removal_hints(r.counter("kpleg_removal_hints_total",
                              "Removal hints: removals of a directory named by an exited "
                              "container's or sandbox's id (inotify in the runtime's directories, "
                              "or the kernel's syscall tracepoints), which bring the removal sweep.")
                        .get()),
      removal_hints_missed(
          r.counter("kpleg_removal_hints_missed_total",
                    "Removals the removal sweep found that a hint was armed for but never "
                    "came: after one, removals are swept for as without the hint until a "
                    "hinted one is found.")
              .get()),
      removal_hints_trusted(r.gauge("kpleg_removal_hints_trusted",
                                    "1 while the removal hints stand for the periodic "
                                    "removal sweep of the ids they watch.")
                                .get()),
      uncovered_containers(r.gauge("kpleg_uncovered_containers",
                                   "Running containers and sandboxes the last reconcile listed "
                                   "that the kernel path does not see.")
                               .get()),
      bpf_emitted(r.counter("kpleg_bpf_emitted_total",
                            "Records the BPF programs committed to the ring buffer.")
                      .get()),
      bpf_filtered(r.counter("kpleg_bpf_filtered_total",
                             "BPF hook invocations outside tracked cgroups, dropped in the "
                             "kernel.")
                       .get()),
      bpf_ringbuf_drops(r.counter("kpleg_bpf_ringbuf_drops_total",
                                  "Kernel records lost because the ring buffer was full, by "
                                  "record type.",
                                  {"type"})),
      bpf_helper_failures(r.counter("kpleg_bpf_helper_failures_total",
                                    "BPF helper calls that returned an error, by program and "
                                    "errno (63: 63 or more).",
                                    {"program", "errno"})),
      bpf_not_claimed(r.counter("kpleg_bpf_not_claimed_total",
                                "Execs and exits in tracked cgroups that are not a container's "
                                "start or death, by what they were.",
                                {"what"})),
      bpf_track_full(r.counter("kpleg_bpf_track_full_total",
                               "Cgroups under a tracked root that the BPF tracked-cgroup map "
                               "had no room for.")
                         .get()),
      bpf_tracked_cgroups(r.gauge("kpleg_bpf_tracked_cgroups",
                                  "Entries in the BPF tracked-cgroup map.")
                              .get()),
      bpf_tracked_cgroups_capacity(r.gauge("kpleg_bpf_tracked_cgroups_capacity",
                                           "Capacity of the BPF tracked-cgroup map "
                                           "(--max-tracked-cgroups).")
                                       .get()),
      untracked_cgroups(r.gauge("kpleg_untracked_cgroups",
                                "Cgroups under a tracked root that are not tracked because the "
                                "map was full; their containers' events come from the "
                                "reconcile alone.")
                            .get()),
      stale_tracked_removed(r.counter("kpleg_stale_tracked_cgroups_removed_total",
                                      "Entries of cgroups that no longer exist, removed from the "
                                      "tracked-cgroup map at reconcile.")
                                .get()),
      cri_calls_in_flight(r.gauge("kpleg_cri_calls_in_flight",
                                  "CRI calls in flight now, by method and origin (kplegd: its "
                                  "own; endpoint: a client of --cri-listen, forwarded).",
                                  {"method", "origin"})),
      cri_call_oldest_seconds(r.gauge("kpleg_cri_call_oldest_in_flight_seconds",
                                      "Age of the oldest CRI call in flight, by method and "
                                      "origin; 0 when none is.",
                                      {"method", "origin"})),
      cri_endpoint_calls(r.counter("kpleg_cri_endpoint_calls_total",
                                   "Calls forwarded through the CRI endpoint (--cri-listen), "
                                   "by method and the runtime's gRPC status code.",
                                   {"method", "code"})),
      cri_endpoint_event_streams(r.gauge("kpleg_cri_endpoint_event_streams",
                                         "GetContainerEvents streams open on the CRI endpoint.")
                                     .get()),
      cri_endpoint_events(r.counter("kpleg_cri_endpoint_events_total",
                                    "Container events built for the CRI endpoint's "
                                    "GetContainerEvents subscribers.")
                              .get()),
      cri_endpoint_events_dropped(r.counter("kpleg_cri_endpoint_events_dropped_total",
                                            "Container events the CRI endpoint could not build "
                                            "(the runtime's calls failed every attempt).")
                                      .get()),
      registry_(r) {
  r.gauge("kpleg_build_info", "kpleg's version; always 1.", {"version"})
      .with({KPLEG_VERSION})
      .set(1);
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
