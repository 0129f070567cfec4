#include "daemon/daemon.h"

#include <spdlog/spdlog.h>

#include <functional>
#include <utility>

#include <map>

namespace kpleg::daemon {

namespace {
// The tracker's removal hints over their source's arm and disarm: the BPF program's map
// (--removal-hints kernel) or the inotify watch of the runtime's directories (auto).
class RemovalHintsOver : public pleg::RemovalHints {
 public:
  RemovalHintsOver(std::function<Arm(const std::string&)> arm,
                   std::function<void(const std::string&)> disarm)
      : arm_(std::move(arm)), disarm_(std::move(disarm)) {}
  Arm watch(const std::string& id) override { return arm_(id); }
  void unwatch(const std::string& id) override { disarm_(id); }

 private:
  std::function<Arm(const std::string&)> arm_;
  std::function<void(const std::string&)> disarm_;
};
}  // namespace

// How long health() names a loss of kernel records (the ring buffer was full).
constexpr std::chrono::minutes kLossReasonFor{5};

const char* to_string(Mode m) {
  switch (m) {
    case Mode::kAuto: return "auto";
    case Mode::kEbpf: return "ebpf";
    case Mode::kRelist: return "relist";
  }
  return "?";
}

Daemon::Daemon(const DaemonOptions& opts) : opts_(opts) {}

Daemon::~Daemon() { stop(); }

Result<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& opts) {
  auto d = std::unique_ptr<Daemon>(new Daemon(opts));
  d->start_time_ns_ = pleg::realtime_now_ns();
  Daemon* self = d.get();
  bus::EventBusOptions bo = opts.bus;
  bo.on_publish = [self](const pleg::PodLifecycleEvent& ev) {
    self->metrics_.observe_published(ev);
    if (ev.correction) self->metrics_.corrections.with({pleg::to_string(ev.type)}).inc();
  };
  d->bus_ = std::make_unique<bus::EventBus>(bo);
  d->metrics_.mirror_bus(*d->bus_);
  for (size_t k = 0; k < kernel::kKernelEventKinds; ++k)
    d->kernel_events_by_kind_[k] = &d->metrics_.kernel_events.with({kernel::kKernelEventKindNames[k]});

  cri::GrpcCriClientOptions co;
  co.call_timeout = opts.cri_timeout;
  co.list_timeout = opts.cri_list_timeout;
  co.on_state_change = [self] { self->health_changed(); };
  co.inflight = d->inflight_;
  d->inflight_->set_resolver([self](const cri::CallSubject& s) { return self->identify(s); });
  co.on_reconnect = [self] {
    spdlog::info("container runtime reachable again");
    if (self->reconciler_) self->reconciler_->request("runtime reconnect");
    if (self->runtime_events_) self->runtime_events_->retry_now();
  };
  auto cri = cri::GrpcCriClient::create(opts.runtime_endpoint, co);
  if (!cri) return Error{cri.error().code, "bad --runtime-endpoint: " + cri.error().message};
  d->cri_ = std::move(*cri);
  d->metrics_.mirror_cri_calls(d->cri_->call_stats());
  if (auto v = d->cri_->version(); !v) {
    return Error{v.error().code, "cannot reach the container runtime at " + opts.runtime_endpoint +
                                     ": " + v.error().message};
  } else {
    spdlog::info("container runtime {} {} (CRI {}) at {}", v->runtime_name(),
                 v->runtime_version(), v->runtime_api_version(), opts.runtime_endpoint);
    d->runtime_name_ = v->runtime_name();
  }

  d->metrics_.on_scrape([self] {
    for (const auto& m : self->inflight_->by_method()) {
      const std::vector<std::string> labels{m.method, cri::to_string(m.origin)};
      self->metrics_.cri_calls_in_flight.with(labels).set(double(m.count));
      self->metrics_.cri_call_oldest_seconds.with(labels).set(
          std::chrono::duration<double>(m.oldest).count());
    }
    if (self->cri_endpoint_) {
      auto es = self->cri_endpoint_->stats();
      for (const auto& [key, n] : es.calls)
        self->metrics_.cri_endpoint_calls
            .with({key.first, std::string(cri::grpc_code_name(key.second))})
            .set(double(n));
      self->metrics_.cri_endpoint_event_streams.set(double(es.event_streams));
    }
    if (self->event_feed_) {
      auto fs = self->event_feed_->stats();
      self->metrics_.cri_endpoint_events.set(double(fs.sent));
      self->metrics_.cri_endpoint_events_dropped.set(double(fs.dropped));
    }
  });

  if (opts.mode == Mode::kRelist) {
    if (auto st = d->start_relist(); !st) return st.error();
    d->metrics_.set_mode("relist");
    if (auto es = d->start_cri_endpoint(); !es) return es.error();
    return d;
  }
  auto st = d->start_ebpf();
  if (st) {
    d->metrics_.set_mode("ebpf");
    if (auto es = d->start_cri_endpoint(); !es) return es.error();
    return d;
  }
  if (opts.mode == Mode::kEbpf) return st.error();
  // auto: the kernel path cannot run here; relist mode keeps the node's events flowing.
  d->fallback_reason_ = st.error().message;
  spdlog::warn("mode auto: kernel event source unavailable ({}); running in relist mode",
               st.error().message);
  d->kernel_.reset();
  d->removal_hints_.reset();
  d->removal_dirs_.reset();
  d->reconciler_.reset();
  d->tracker_.reset();
  d->index_.reset();
  if (auto rs = d->start_relist(); !rs) return rs.error();
  d->metrics_.set_mode("relist");
  if (auto es = d->start_cri_endpoint(); !es) return es.error();
  return d;
}

Status Daemon::start_cri_endpoint() {
  if (opts_.cri_listen.empty()) return {};
  if (opts_.cri_serve_events) {
    criendpoint::ContainerEventFeedOptions fo;
    fo.full_statuses = opts_.cri_event_statuses;
    event_feed_ = std::make_unique<criendpoint::ContainerEventFeed>(*cri_, *bus_, fo);
    event_feed_->start();
  }
  criendpoint::CriEndpointOptions eo;
  eo.listen_endpoint = opts_.cri_listen;
  eo.upstream_endpoint = opts_.runtime_endpoint;
  eo.serve_container_events = opts_.cri_serve_events;
  eo.inflight = inflight_;
  auto ep = criendpoint::CriEndpoint::start(eo, event_feed_.get());
  if (!ep) return ep.error();
  cri_endpoint_ = std::move(*ep);
  return {};
}

std::optional<cri::PodIdentity> Daemon::identify(const cri::CallSubject& subject) {
  if (stopped_) return std::nullopt;
  for (const auto& pod : snapshot().pods) {
    if (subject.id.empty()) {
      if (pod.uid == subject.pod_uid) return cri::PodIdentity{pod.uid, pod.name, pod.pod_namespace, "", false};
      continue;
    }
    for (const auto& c : pod.containers) {
      if (c.id != subject.id) continue;
      return cri::PodIdentity{pod.uid, pod.name, pod.pod_namespace, c.sandbox ? "" : c.name,
                              c.sandbox};
    }
  }
  return std::nullopt;
}

std::vector<api::InflightCallRecord> Daemon::inflight_calls(std::chrono::milliseconds min_age) {
  std::vector<api::InflightCallRecord> out;
  for (const auto& c : inflight_->older_than(min_age)) {
    const auto& s = c.subject;
    out.push_back(api::InflightCallRecord{c.method, cri::to_string(c.origin), s.pod_uid,
                                          s.pod_name, s.pod_namespace, s.id, s.container_name,
                                          c.age, cri::describe(c)});
  }
  return out;
}

void Daemon::report_stuck_calls(api::HealthReport& r) {
  const auto threshold = opts_.stuck_call_threshold;
  // Degraded, not failing: kpleg's events still flow; the call is the runtime's problem (or a
  // CNI plugin's), and naming it, before the kubelet's PLEG gives up, is the point.
  for (const auto& c : inflight_->older_than(threshold)) r.reasons.push_back(cri::describe(c));
  if (auto left = inflight_->until_one_reaches(threshold)) {
    *left += std::chrono::milliseconds(1);
    if (!r.recheck_in || *left < *r.recheck_in) r.recheck_in = *left;
  }
}

void Daemon::start_removal_hints() {
  std::string source;
  bool after_removal = false;  // the hint comes once the directory is gone
  // Hints trusted from the start: on a runtime known to remove a directory named by the id on
  // every removal, seen where it keeps it (the kernel sees them all; containerd names its own).
  // Directories given by --removal-hint-dir are trusted once a hinted removal is confirmed.
  bool layout_known = true;
  if (auto* p = kernel_->program(); p != nullptr && p->removal_hints_attached()) {
    // Attached when the kernel options ask for it (--removal-hints kernel).
    removal_hints_ = std::make_unique<RemovalHintsOver>(
        [p](const std::string& id) {
          if (!p->watch_removal(id)) return pleg::RemovalHints::Arm::kFailed;
          // Armed, then asked: a removal in between is hinted by the program.
          return p->take_early_removal(id) ? pleg::RemovalHints::Arm::kGone
                                           : pleg::RemovalHints::Arm::kArmed;
        },
        [p](const std::string& id) { p->unwatch_removal(id); });
    source = "the kernel's rmdir of a directory named by the id";
  } else if (opts_.removal_hints == RemovalHintSource::kAuto) {
    std::vector<std::string> dirs = opts_.removal_hint_dirs;
    layout_known = dirs.empty();
    if (dirs.empty()) {
      auto info = cri_->status_info();
      if (info) dirs = kernel::removal_dirs_from_status_info(*info);
      if (dirs.empty()) {
        spdlog::info("removal hint: {} names no per-container directory{}: exited containers "
                     "are swept for (--removal-hint-dir names them)",
                     runtime_name_, info ? "" : " (Status: " + info.error().message + ")");
        return;
      }
    }
    auto watch = kernel::DirRemovalWatch::start(dirs, [this](const std::string& id) {
      kernel::KernelEvent ev;
      ev.body = kernel::RemovalHint{id};
      on_kernel_event(ev);
    });
    if (!watch) {
      spdlog::warn("removal hint: {}: exited containers are swept for", watch.error().message);
      return;
    }
    removal_dirs_ = std::move(*watch);
    auto* w = removal_dirs_.get();
    removal_hints_ = std::make_unique<RemovalHintsOver>(
        [w](const std::string& id) {
          switch (w->watch(id)) {
            case kernel::DirRemovalWatch::Arm::kArmed: return pleg::RemovalHints::Arm::kArmed;
            case kernel::DirRemovalWatch::Arm::kGone: return pleg::RemovalHints::Arm::kGone;
            case kernel::DirRemovalWatch::Arm::kNotAnId: break;
          }
          return pleg::RemovalHints::Arm::kFailed;
        },
        [w](const std::string& id) { w->unwatch(id); });
    after_removal = true;
    source = "the removal of their directory in ";
    for (size_t i = 0; i < dirs.size(); ++i) source += (i ? ", " : "") + dirs[i];
  } else {
    return;
  }
  // containerd and CRI-O remove a directory named by the id on every RemoveContainer and
  // RemovePodSandbox (measured).
  const bool known = layout_known && (runtime_name_ == "containerd" || runtime_name_ == "cri-o");
  spdlog::info("removal hint attached: exited containers' removals are announced by {} ({})",
               source,
               known ? "trusted for " + runtime_name_
                     : "trusted once a hinted removal is confirmed");
  tracker_->set_removal_hints(removal_hints_.get(), known, after_removal);
}

void Daemon::on_kernel_event(const kernel::KernelEvent& ev) {
  kernel_events_by_kind_[ev.body.index()]->inc();
  tracker_->on_kernel_event(ev);
}

Status Daemon::start_ebpf() {
  index_ = std::make_unique<cgroup::CgroupIndex>();
  tracker_ = std::make_unique<pleg::Tracker>(*cri_, *index_, *bus_);
  reconciler_ = std::make_unique<pleg::Reconciler>(*cri_, *tracker_, opts_.reconcile_period);
  // In ebpf mode the reconcile is kpleg's relist: the kubelet's relist metrics describe it.
  reconciler_->set_on_run([this](const pleg::ReconcilerStats& rs, bool ok) {
    metrics_.relist_duration.observe(std::chrono::duration<double>(rs.last_duration).count());
    if (ok) metrics_.last_seen.set_to_current_time();
    health_changed();
  });
  reconciler_->set_on_view([this](const std::vector<pleg::RuntimeContainer>& view) {
    resync_kernel();
    check_coverage(view);
  });
  tracker_->set_inconsistency_handler(
      [this](const std::string& why) { reconciler_->request("tracker: " + why); });
  metrics_.on_scrape([this] {
    if (active_ != Mode::kEbpf) return;  // auto fell back to relist mode: none of this exists
    pleg::TrackerStats ts = tracker_->stats();
    metrics_.foreign_containers.set(static_cast<double>(ts.foreign_containers));
    metrics_.lookalike_signals.set(static_cast<double>(ts.lookalike_signals));
    metrics_.tracked_records.set(static_cast<double>(ts.records));
    metrics_.runtime_events_live.set(ts.runtime_events_live ? 1 : 0);
    metrics_.runtime_events_missed_removals.set(
        static_cast<double>(ts.runtime_events_missed_removals));
    metrics_.removal_hints.set(static_cast<double>(ts.removal_hints));
    metrics_.removal_hints_missed.set(static_cast<double>(ts.removal_hints_missed));
    metrics_.removal_hints_trusted.set(ts.removal_hints_trusted ? 1 : 0);
    if (runtime_events_) {
      metrics_.runtime_events.set(static_cast<double>(runtime_events_->stats().events));
    }
    // The kernel path is the pipeline in ebpf mode: while it is attached and consumed, the
    // pipeline is live now, not only at the last reconcile (every 300 s), which would trip the
    // kubelet's 3-minute staleness alerts.
    if (kernel_->live()) metrics_.last_seen.set_to_current_time();
    mirror_kernel_metrics();
  });

  kernel::KernelSourceOptions ko = opts_.kernel;
  ko.bpf.removal_hint = opts_.removal_hints == RemovalHintSource::kKernel;
  kernel_ = std::make_unique<kernel::BpfKernelSource>(ko);
  kernel::KernelSink sink;
  sink.on_event = [this](const kernel::KernelEvent& ev) { on_kernel_event(ev); };
  sink.on_loss = [this](uint64_t n) {
    metrics_.lost_events.inc(double(n));
    lost_records_ += n;
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    const int64_t before = last_loss_ns_.exchange(now);
    reconciler_->request("kernel events lost: " + std::to_string(n));
    // The health reason appears (it stays kLossReasonFor after the last loss).
    if (before == 0 || now - before >= std::chrono::nanoseconds(kLossReasonFor).count())
      health_changed();
  };
  sink.on_untracked = [this](const std::string& path) {
    // Whatever happens in that cgroup is unseen: the reconcile finds its containers now, and
    // the resync that follows tracks it as soon as there is room.
    reconciler_->request("cgroup " + path + " not tracked: the tracked-cgroup map is full");
    if (!untracked_reported_.exchange(true)) health_changed();
  };
  sink.on_stopped = [this] { health_changed(); };
  if (auto st = kernel_->start(sink); !st) return st;
  // The index is seeded after the kernel source attached, so that no mkdir falls between.
  if (auto st = index_->seed(kernel_->stats().cgroup2_mount); !st) return st;
  // Nothing fails after this (no fallback leaves it behind), and before the initial sync, so
  // that the exited containers it finds are armed.
  start_removal_hints();
  if (auto st = reconciler_->start(opts_.cri_timeout); !st) {
    spdlog::warn("initial sync failed ({}); going on in the background", st.error().message);
  }
  if (opts_.runtime_events) {
    // After the initial sync: the stream's backlog then finds the records it may confirm.
    runtime_events_ = std::make_unique<pleg::RuntimeEvents>(
        [this](cri::CancelToken& cancel, const pleg::RuntimeEvents::OnEvent& on_event) {
          return cri_->container_events(cancel, on_event);
        },
        [this](cri::v1::ContainerEventResponse& ev) { tracker_->on_runtime_event(ev); },
        [this] { tracker_->runtime_events_stopped(); });
    runtime_events_->start();
  }
  active_ = Mode::kEbpf;
  spdlog::info("running in ebpf mode (reconcile every {} s)",
               std::chrono::duration_cast<std::chrono::seconds>(opts_.reconcile_period).count());
  return {};
}

Status Daemon::start_relist() {
  pleg::GenericRelistOptions ro;
  ro.period = opts_.relist_period;
  ro.health_threshold = opts_.relist_health_threshold;
  ro.on_relist = [this](const pleg::RelistStats& rs) {
    metrics_.relist_duration.observe(double(rs.last_duration_ns) / 1e9);
    if (rs.last_interval_ns > 0) metrics_.relist_interval.observe(double(rs.last_interval_ns) / 1e9);
    if (rs.consecutive_failures == 0) metrics_.last_seen.set_to_current_time();
  };
  relist_ = std::make_unique<pleg::GenericRelist>(*cri_, *bus_, ro);
  relist_->start();
  active_ = Mode::kRelist;
  spdlog::info("running in relist mode (every {} ms)", opts_.relist_period.count());
  return {};
}

void Daemon::stop() {
  if (stopped_.exchange(true)) return;
  if (cri_endpoint_) cri_endpoint_->stop();
  if (event_feed_) event_feed_->stop();
  // Calls in flight end now (a full list may have a minute left): the threads below that wait
  // for them stop at once. Then what reads the kernel's state (the reconcile checks coverage
  // against the BPF map) stops before the kernel source goes.
  if (cri_) cri_->cancel_calls();
  if (runtime_events_) runtime_events_->stop();
  if (reconciler_) reconciler_->stop();
  if (tracker_) tracker_->set_removal_hints(nullptr);  // the program goes with the kernel source
  removal_dirs_.reset();  // its thread calls into the tracker
  if (kernel_) kernel_->stop();
  if (tracker_) tracker_->stop();
  if (relist_) relist_->stop();
  if (bus_) bus_->close("kplegd shutting down");
}

api::StateSnapshot Daemon::snapshot() {
  api::StateSnapshot snap;
  std::map<std::string, api::PodRecord> pods;
  if (tracker_) {
    auto [seq, containers] = tracker_->containers_at([this] { return bus_->last_seq(); });
    snap.seq = seq;
    for (const auto& tc : containers) {
      auto& pod = pods[tc.identity.pod_uid];
      pod.uid = tc.identity.pod_uid;
      if (!tc.identity.pod_name.empty()) pod.name = tc.identity.pod_name;
      if (!tc.identity.pod_namespace.empty()) pod.pod_namespace = tc.identity.pod_namespace;
      api::ContainerRecord cr;
      cr.id = tc.identity.id;
      cr.name = tc.identity.name;
      cr.sandbox = tc.identity.sandbox;
      cr.status = tc.status;
      cr.status.state = tc.identity.state;
      if (tc.oom_killed && cr.status.reason.empty()) cr.status.reason = "OOMKilled";
      pod.containers.push_back(std::move(cr));
    }
  } else if (relist_) {
    // Relist mode: the records of the last relist, with the sequence number of the last event
    // published for them.
    auto [seq, pods_now] = relist_->pods_at([this] { return bus_->last_seq(); });
    snap.seq = seq;
    for (const auto& pr : pods_now) {
      auto& pod = pods[pr.uid];
      pod.uid = pr.uid;
      pod.name = pr.name;
      pod.pod_namespace = pr.namespace_;
      for (const auto* list : {&pr.sandboxes, &pr.containers}) {
        for (const auto& c : *list) {
          api::ContainerRecord cr;
          cr.id = c.id;
          cr.name = c.name;
          cr.sandbox = c.sandbox;
          cr.status = c.status;
          cr.status.state = c.state;
          pod.containers.push_back(std::move(cr));
        }
      }
    }
  }
  for (auto& [_, p] : pods) snap.pods.push_back(std::move(p));
  return snap;
}

api::HealthReport Daemon::health() {
  api::HealthReport r;
  r.healthy = true;
  auto fail = [&r](std::string why) {
    r.healthy = false;
    r.reasons.push_back(std::move(why));
  };
  if (!cri_->connected()) {
    fail("container runtime unreachable at " + opts_.runtime_endpoint + " (" +
         std::string(cri::connection_state_name(cri_->state())) + ")");
  }
  if (active_ == Mode::kEbpf) {
    auto ks = kernel_->stats();
    if (!ks.attached) fail("kernel event source not attached");
    if (!ks.consuming) fail("kernel event source stopped consuming the ring buffer");
    auto rs = reconciler_->stats();
    auto threshold = 2 * opts_.reconcile_period + std::chrono::seconds(60);
    if (!rs.last_success_mono) {
      fail("no successful reconcile yet" + (rs.last_error.empty() ? "" : ": " + rs.last_error));
    } else if (auto age = std::chrono::steady_clock::now() - *rs.last_success_mono;
               age <= threshold) {
      // Healthy until the last success grows too old (each reconcile announces itself).
      r.recheck_in = std::chrono::duration_cast<std::chrono::milliseconds>(threshold - age) +
                     std::chrono::milliseconds(1);
    } else {
      fail("last successful reconcile " +
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(age).count()) +
           " s ago" + (rs.last_error.empty() ? "" : ": " + rs.last_error));
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
        r.reasons.push_back(
            std::to_string(lost) + " kernel records lost since start, the last " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(since).count()) +
            " s ago (ring buffer full); a reconcile recovered their events each time; raise "
            "--ringbuf-kib if this recurs");
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
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(opts_.reconcile_period).count()) +
            " s)");
      }
    }
    // A pod whose runtime calls fail is named, but does not make the node's events unhealthy:
    // every other pod is confirmed by other workers.
    for (const auto& t : tracker_->troubled_pods()) {
      r.reasons.push_back(
          "pod " + t.pod_uid + ": " + std::to_string(t.failures) +
          " container runtime calls failed in the last " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(t.failing_for).count()) +
          " s: " + t.last_error);
    }
  } else if (relist_) {
    auto h = relist_->health();
    if (!h.healthy) fail(h.reason);
    for (const auto& p : h.pending_inspections) {
      r.reasons.push_back("pod " + p.pod_namespace + "/" + p.pod_name + " (" + p.pod_uid +
                          ") failed inspection " + std::to_string(p.attempts) + " times: " + p.error);
    }
    if (!fallback_reason_.empty()) r.reasons.push_back("relist mode because: " + fallback_reason_);
    // Relist mode polls the runtime anyway: its health follows the relist period.
    r.recheck_in = opts_.relist_period;
  }
  report_stuck_calls(r);
  return r;
}

void Daemon::check_coverage(const std::vector<pleg::RuntimeContainer>& view) {
  // A running container is covered when its cgroup is indexed and tracked in the kernel. One
  // that is not either lives under a root the BPF programs do not track (--cgroup-root), or
  // has no cgroup of its own on this host (a VM-based or user-space kernel runtime: kata,
  // gVisor), so no exec or exit of it will ever be seen.
  size_t uncovered = 0;
  std::string example;
  for (const auto& rc : view) {
    if (rc.state != pleg::ContainerState::kRunning) continue;
    auto cgroup = index_->find_container(rc.id);
    if (cgroup && kernel_->program()->is_tracked(*cgroup)) continue;
    if (uncovered++ > 0) continue;
    example = std::string(rc.sandbox ? "sandbox " : "container ") + rc.pod_namespace + "/" +
              rc.pod_name + (rc.sandbox ? "" : "/" + rc.name) + " (" + rc.id.substr(0, 12) + "): " +
              (cgroup ? "its cgroup is not below a tracked root (--cgroup-root)"
                      : "no cgroup of it on this host matches the kubelet's layout");
  }
  metrics_.uncovered_containers.set(double(uncovered));
  size_t before;
  {
    std::lock_guard lk(coverage_mu_);
    before = std::exchange(uncovered_, uncovered);
    uncovered_example_ = example;
  }
  if (uncovered > 0 && before == 0) {
    spdlog::warn("{} running containers and sandboxes are not seen by the kernel path, e.g. {}; "
                 "their events come only from the reconcile",
                 uncovered, example);
  } else if (uncovered == 0 && before > 0) {
    spdlog::info("every running container is seen by the kernel path again");
  }
  if ((uncovered > 0) != (before > 0)) health_changed();
}

void Daemon::resync_kernel() {
  if (!kernel_ || !kernel_->live()) return;
  const auto ks = kernel_->stats();
  if (ks.untracked_cgroups > 0) {
    // The hook reported no mkdir below an untracked cgroup: the index learns those from the
    // tree, before the kernel starts reporting their execs and exits.
    if (auto st = index_->seed(ks.cgroup2_mount); !st)
      spdlog::warn("resync: re-reading the cgroup tree: {}", st.error().message);
  }
  auto r = kernel_->resync_tracked();
  if (!r) {
    spdlog::warn("resync of the tracked-cgroup map failed: {}", r.error().message);
    return;
  }
  if (r->added > 0 || r->stale > 0) {
    spdlog::info("resync of the tracked-cgroup map: {} cgroups tracked that were missing, {} "
                 "entries of vanished cgroups removed",
                 r->added, r->stale);
  }
  if (!r->walk_complete)
    spdlog::warn("resync: part of the cgroup tree could not be read; stale entries kept");
  metrics_.stale_tracked_removed.inc(double(r->stale));
  if (r->still_full == 0 && untracked_reported_.exchange(false)) {
    spdlog::info("every cgroup under a tracked root is tracked again");
    health_changed();
  } else if (r->still_full > 0 && !untracked_reported_.exchange(true)) {
    health_changed();
  }
}

void Daemon::mirror_kernel_metrics() {
  auto ks = kernel_->stats();
  const auto& b = ks.bpf;
  metrics_.bpf_emitted.set(double(b.emitted));
  metrics_.bpf_filtered.set(double(b.filtered));
  for (size_t t = 0; t < kernel::kKernelEventKinds; ++t)
    metrics_.bpf_ringbuf_drops.with({kernel::kKernelEventKindNames[t]}).set(double(b.drops_by_type[t]));
  if (b.helper_failures > 0) {  // one map read per scrape only once something failed
    if (auto* p = kernel_->program()) {
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
  if (auto* p = kernel_->program()) metrics_.bpf_tracked_cgroups.set(double(p->tracked_count()));
  metrics_.bpf_tracked_cgroups_capacity.set(double(ks.map_capacity));
  metrics_.untracked_cgroups.set(double(ks.untracked_cgroups));
}

void Daemon::set_health_listener(std::function<void()> fn) {
  std::lock_guard lk(health_listener_mu_);
  health_listener_ = std::move(fn);
}

void Daemon::health_changed() {
  std::lock_guard lk(health_listener_mu_);
  if (health_listener_) health_listener_();
}

api::DaemonStats Daemon::stats() {
  api::DaemonStats s;
  s.mode = active_ == Mode::kEbpf ? "ebpf" : "relist";
  s.start_time_ns = start_time_ns_;
  auto snap = snapshot();
  s.pods = snap.pods.size();
  for (const auto& p : snap.pods) s.containers += p.containers.size();
  if (kernel_) {
    auto ks = kernel_->stats();
    s.kernel_events = ks.received;
    s.lost_kernel_events = ks.bpf.ringbuf_drops;
  }
  if (tracker_) {
    const auto ts = tracker_->stats();
    s.corrections = ts.corrections_total();
    s.confirm_retries = ts.confirm_retries;
  }
  const cri::CallStats& calls = cri_->call_stats();
  s.cri_calls = calls.total();
  for (size_t m = 0; m < cri::kCriMethodCount; ++m) {
    const auto method = static_cast<cri::CriMethod>(m);
    if (const uint64_t n = calls.total(method); n > 0)
      s.cri_calls_by_method.emplace(cri::cri_method_name(method), n);
  }
  if (reconciler_) {
    auto rs = reconciler_->stats();
    s.relists = rs.runs;
    if (rs.last_success) {
      s.last_reconcile_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                rs.last_success->time_since_epoch())
                                .count();
    }
  }
  if (relist_) {
    auto rs = relist_->stats();
    s.relists = rs.relists;
    s.last_reconcile_ns = rs.last_success_ns;
  }
  return s;
}

}  // namespace kpleg::daemon
