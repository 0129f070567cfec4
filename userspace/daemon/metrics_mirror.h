// kplegd's metrics (metrics/kpleg_metrics.h) and where their values come from. The components
// keep their own counters and know nothing of the metrics library; this is the one place that
// turns them into metrics: at event time, through the daemon's callbacks (events published,
// kernel events and losses, reconcile and relist runs, coverage), and at scrape time, by copying
// the components' counters in (the bus, CRI calls and those in flight, the CRI endpoint, the
// tracker, the BPF programs' counters and maps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <type_traits>
#include <variant>

#include "bus/event_bus.h"
#include "cri/call_stats.h"
#include "cri/inflight_calls.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/cri_endpoint.h"
#include "kernel/kernel_source.h"
#include "metrics/kpleg_metrics.h"
#include "metrics/registry.h"
#include "pleg/event.h"
#include "pleg/generic_relist.h"
#include "pleg/reconciler.h"
#include "pleg/runtime_events.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

class MetricsMirror {
 public:
  // What a scrape copies from; null: not started, or not in this mode.
  struct Sources {
    const cri::InflightCalls* inflight = nullptr;
    criendpoint::CriEndpoint* cri_endpoint = nullptr;
    criendpoint::ContainerEventFeed* event_feed = nullptr;
    bool ebpf = false;  // ebpf mode: tracker and kernel are set
    pleg::Tracker* tracker = nullptr;
    pleg::RuntimeEvents* runtime_events = nullptr;
    kernel::BpfKernelSource* kernel = nullptr;
  };

  MetricsMirror();
  MetricsMirror(const MetricsMirror&) = delete;
  MetricsMirror& operator=(const MetricsMirror&) = delete;

  metrics::Registry& registry() { return registry_; }

  // Scrape time. The bus and the call stats must outlive the mirror; `sources` is asked at
  // every scrape, from the scraping thread.
  void mirror_bus(const bus::EventBus& bus) { metrics_.mirror_bus(bus); }
  void mirror_cri_calls(const cri::CallStats& calls) { metrics_.mirror_cri_calls(calls); }
  void mirror_at_scrape(std::function<Sources()> sources);

  // Event time.
  void set_mode(std::string_view active) { metrics_.set_mode(active); }
  void on_published(const pleg::PodLifecycleEvent& ev);  // EventBusOptions::on_publish
  void on_kernel_event(const kernel::KernelEvent& ev) {
    kernel_events_by_kind_[ev.body.index()]->inc();
  }
  // A removal hint of the inotify watch (--removal-hints auto), which never passes through the
  // ring buffer: counted with the kernel's own, kpleg_kernel_events_total{kind="removal_hint"}.
  void on_removal_hint() { kernel_events_by_kind_[kRemovalHintKind]->inc(); }
  void on_records_lost(uint64_t n);
  // ebpf mode: the reconcile is kpleg's relist, so the kubelet's relist metrics describe it.
  void on_reconcile(const pleg::ReconcilerStats& rs, bool ok);
  void on_relist(const pleg::RelistStats& rs);  // relist mode
  void on_coverage(size_t uncovered);           // running containers the kernel path misses
  void on_stale_tracked_removed(uint64_t n);    // by a resync of the tracked-cgroup map

 private:
  void mirror(const Sources& s);
  // The BPF programs' counters and the tracked map.
  void mirror_kernel(kernel::BpfKernelSource& kernel);

  metrics::Registry registry_;
  metrics::KplegMetrics metrics_{registry_};
  metrics::Counter* kernel_events_by_kind_[kernel::kKernelEventKinds] = {};
  static constexpr size_t kRemovalHintKind = kernel::kKernelEventKinds - 1;
  static_assert(
      std::is_same_v<std::variant_alternative_t<kRemovalHintKind, kernel::KernelEventBody>,
                     kernel::RemovalHint>);
};

}  // namespace kpleg::daemon
