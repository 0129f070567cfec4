// What kplegd is asked to run (its flags, parsed by main()): the mode and each part's settings.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "bus/event_bus.h"
#include "daemon/removal_hints.h"
#include "kernel/kernel_source.h"

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
  // the kernel source loads the hint's programs).
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

}  // namespace kpleg::daemon
