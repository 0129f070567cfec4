#include "daemon/daemon.h"

#include <spdlog/spdlog.h>

#include <functional>
#include <utility>

#include <map>

namespace kpleg::daemon {

const char* to_string(Mode m) {
  switch (m) {
    case Mode::kAuto: return "auto";
    case Mode::kEbpf: return "ebpf";
    case Mode::kRelist: return "relist";
  }
  return "?";
}

Daemon::Daemon(const DaemonOptions& opts)
    : opts_(opts),
      health_policy_({opts.runtime_endpoint, opts.reconcile_period, opts.relist_period,
                      opts.stuck_call_threshold, opts.cri_list_timeout}) {}

Daemon::~Daemon() { stop(); }

Result<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& opts) {
  auto d = std::unique_ptr<Daemon>(new Daemon(opts));
  d->start_time_ns_ = pleg::realtime_now_ns();
  Daemon* self = d.get();
  bus::EventBusOptions bo = opts.bus;
  bo.on_publish = [self](const pleg::PodLifecycleEvent& ev) { self->metrics_.on_published(ev); };
  d->bus_ = std::make_unique<bus::EventBus>(bo);
  d->metrics_.mirror_bus(*d->bus_);

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

  d->metrics_.mirror_at_scrape([self] {
    return MetricsMirror::Sources{self->inflight_.get(), self->cri_endpoint_.get(),
                                  self->event_feed_.get(), self->active_ == Mode::kEbpf,
                                  self->tracker_.get(), self->runtime_events_.get(),
                                  self->kernel_.get()};
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

void Daemon::start_removal_hints() {
  auto attached = attach_removal_hints({
      .source = opts_.removal_hints,
      .program = kernel_->program(),
      .dirs = opts_.removal_hint_dirs,
      .cri = cri_.get(),
      .runtime_name = runtime_name_,
      .on_removed =
          [this](const std::string& id) {
            kernel::KernelEvent ev;
            ev.body = kernel::RemovalHint{id};
            on_kernel_event(ev);
          },
  });
  removal_dirs_ = std::move(attached.dir_watch);
  removal_hints_ = std::move(attached.hints);
  if (removal_hints_)
    tracker_->set_removal_hints(removal_hints_.get(), attached.trusted, attached.after_removal);
}

void Daemon::on_kernel_event(const kernel::KernelEvent& ev) {
  metrics_.on_kernel_event(ev);
  tracker_->on_kernel_event(ev);
}

Status Daemon::start_ebpf() {
  index_ = std::make_unique<cgroup::CgroupIndex>();
  tracker_ = std::make_unique<pleg::Tracker>(*cri_, *index_, *bus_);
  reconciler_ = std::make_unique<pleg::Reconciler>(*cri_, *tracker_, opts_.reconcile_period);
  // In ebpf mode the reconcile is kpleg's relist: the kubelet's relist metrics describe it.
  reconciler_->set_on_run([this](const pleg::ReconcilerStats& rs, bool ok) {
    metrics_.on_reconcile(rs, ok);
    health_changed();
  });
  reconciler_->set_on_view([this](const std::vector<pleg::RuntimeContainer>& view) {
    resync_kernel();
    check_coverage(view);
  });
  tracker_->set_inconsistency_handler(
      [this](const std::string& why) { reconciler_->request("tracker: " + why); });
  // A signal for a cgroup the index missed is resolved from the kernel's record of its parent
  // before it costs a reconcile.
  tracker_->set_cgroup_parents([this](uint64_t id) { return kernel_->tracked_parent(id); });

  kernel::KernelSourceOptions ko = opts_.kernel;
  ko.bpf.removal_hint = opts_.removal_hints == RemovalHintSource::kKernel;
  ko.own_thread = false;  // the ring buffer is read on the tracker's loop (below)
  kernel_ = std::make_unique<kernel::BpfKernelSource>(ko);
  kernel::KernelSink sink;
  sink.on_event = [this](const kernel::KernelEvent& ev) { on_kernel_event(ev); };
  sink.on_loss = [this](uint64_t n) {
    metrics_.on_records_lost(n);
    const bool reason_appears = health_policy_.note_records_lost(n);
    reconciler_->request("kernel events lost: " + std::to_string(n));
    if (reason_appears) health_changed();
  };
  sink.on_untracked = [this](const std::string& path) {
    // Whatever happens in that cgroup is unseen: the reconcile finds its containers now, and
    // the resync that follows tracks it as soon as there is room.
    reconciler_->request("cgroup " + path + " not tracked: the tracked-cgroup map is full");
    if (health_policy_.note_untracked(true)) health_changed();
  };
  sink.on_over_budget = [this](const kernel::CgroupMkdir& mk) { on_over_budget(mk); };
  sink.on_stopped = [this] { health_changed(); };
  if (auto st = kernel_->start(sink); !st) return st;
  // The index is seeded after the kernel source attached, so that no mkdir falls between.
  if (auto st = index_->seed(kernel_->stats().cgroup2_mount); !st) return st;
  tracker_->watch(kernel_->ring_fd(), [k = kernel_.get()] { k->consume(); });
  // Nothing fails after this (no fallback leaves it behind), and before the initial sync, so
  // that the exited containers it finds are armed.
  start_removal_hints();
  if (auto st = reconciler_->start(opts_.cri_timeout); !st) {
    spdlog::warn("initial sync failed ({}); going on in the background", st.error().message);
  }
  if (opts_.runtime_events) {
    // After the initial sync: the stream's backlog then finds the records it may confirm.
    // Read on the tracker's loop where the client can; else on a thread of its own.
    runtime_events_ = tracker_->runtime_events();
    if (!runtime_events_) runtime_events_ = std::make_unique<pleg::RuntimeEvents>(
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
  ro.on_relist = [this](const pleg::RelistStats& rs) { metrics_.on_relist(rs); };
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
  if (tracker_) tracker_->stop();  // its loop reads the kernel source's ring buffer
  if (kernel_) kernel_->stop();
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

HealthPolicy::Components Daemon::health_components() {
  return {.cri = *cri_,
          .inflight = *inflight_,
          .ebpf = active_ == Mode::kEbpf,
          .kernel = kernel_.get(),
          .reconciler = reconciler_.get(),
          .tracker = tracker_.get(),
          .relist = relist_.get(),
          .fallback_reason = fallback_reason_};
}

api::HealthReport Daemon::health() { return health_policy_.health(health_components()); }

api::HealthReport Daemon::liveness() { return health_policy_.liveness(health_components()); }

void Daemon::on_over_budget(const kernel::CgroupMkdir& mk) {
  // The pod: from the refused cgroup's parent (tracked, so the pod's or below it), else from
  // the path's own prefixes.
  std::string pod_uid;
  if (auto parent = index_->lookup(mk.parent_cgroup_id)) pod_uid = parent->identity.pod_uid;
  for (std::string p = mk.path; pod_uid.empty() && !p.empty();) {
    if (auto id = cgroup::parse_cgroup_path(p); id && !id->pod_uid.empty()) pod_uid = id->pod_uid;
    const auto slash = p.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    p.resize(slash);
  }
  const std::string key = pod_uid.empty() ? mk.path : pod_uid;
  const auto now = std::chrono::steady_clock::now();
  {
    // One line per pod per 30 s: a pod stays over its budget as long as its loop runs.
    std::lock_guard lk(over_budget_mu_);
    if (over_budget_logged_.size() > 1024) over_budget_logged_.clear();
    auto [it, fresh] = over_budget_logged_.try_emplace(key, now);
    if (!fresh) {
      if (now - it->second < std::chrono::seconds(30)) return;
      it->second = now;
    }
  }
  std::string name;
  if (tracker_ && !pod_uid.empty()) {
    for (const auto& tc : tracker_->containers()) {
      if (tc.identity.pod_uid != pod_uid) continue;
      name = tc.identity.pod_namespace + "/" + tc.identity.pod_name + " ";
      break;
    }
  }
  uint64_t refused = 0;
  if (auto parent = kernel_->program()->tracked_entry(mk.parent_cgroup_id)) {
    for (const auto& [pod, budget] : kernel_->program()->pod_budgets())
      if (pod == parent->pod_id) refused = budget.refused;
  }
  const auto& b = opts_.kernel.bpf;
  spdlog::warn("pod {}({}) is over its cgroup budget ({} cgroups tracked below it, {} mkdirs a "
               "second): {} of its cgroups not tracked so far, e.g. {}; what runs in them is "
               "not seen, every other pod is",
               name, pod_uid.empty() ? "pod uid not found" : "uid " + pod_uid,
               b.max_cgroups_per_pod, b.max_mkdirs_per_pod_per_sec, refused, mk.path);
}

void Daemon::check_coverage(const std::vector<pleg::RuntimeContainer>& view) {
  // A running container is covered when its cgroup is indexed and tracked in the kernel. One
  // that is not either lives under a root the BPF programs do not track (--cgroup-root), or
  // has no cgroup of its own on this host (a VM-based or user-space kernel runtime: kata,
  // gVisor), so no exec or exit of it will ever be seen; or the map had no room for it, or
  // its pod was over its budget when it was made.
  size_t uncovered = 0;
  std::string example;
  const auto ks = kernel_->stats();
  for (const auto& rc : view) {
    if (rc.state != pleg::ContainerState::kRunning) continue;
    auto cgroup = index_->find_container(rc.id);
    if (cgroup && kernel_->program()->is_tracked(*cgroup)) continue;
    if (uncovered++ > 0) continue;
    std::string why;
    if (!cgroup) {
      why = "no cgroup of it on this host matches the kubelet's layout";
    } else {
      // Below a tracked root? Then the map was full or its pod over budget when it was made.
      bool below_root = false;
      if (auto entry = index_->lookup(*cgroup)) {
        const std::string& p = entry->path;
        for (const auto& root : opts_.kernel.bpf.root_names) {
          for (size_t at = p.find("/" + root); at != std::string::npos;
               at = p.find("/" + root, at + 1)) {
            const size_t end = at + 1 + root.size();
            if (end == p.size() || p[end] == '/') below_root = true;
          }
        }
      }
      if (!below_root)
        why = "its cgroup is not below a tracked root (--cgroup-root)";
      else if (ks.untracked_cgroups > 0)
        why = "the tracked-cgroup map was full when its cgroup was made (--max-tracked-cgroups)";
      else if (ks.bpf.over_budget > 0)
        why = "its cgroup was made while its pod was over its budget (--max-cgroups-per-pod)";
      else
        why = "its cgroup is below a tracked root but not tracked";
    }
    example = std::string(rc.sandbox ? "sandbox " : "container ") + rc.pod_namespace + "/" +
              rc.pod_name + (rc.sandbox ? "" : "/" + rc.name) + " (" + rc.id.substr(0, 12) + "): " +
              why;
  }
  metrics_.on_coverage(uncovered);
  const size_t before = health_policy_.note_uncovered(uncovered, example);
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
  const bool lost = ks.lost_reported != lost_at_last_resync_;
  lost_at_last_resync_ = ks.lost_reported;
  if (ks.untracked_cgroups > 0 || lost) {
    // The hook reported no mkdir below an untracked cgroup, and a lost record may have been
    // any mkdir or rmdir: the index learns those from the tree, before the kernel starts
    // reporting their execs and exits. One walk per reconcile, and reconciles are spaced.
    if (auto st = index_->seed(ks.cgroup2_mount); !st)
      spdlog::warn("resync: re-reading the cgroup tree: {}", st.error().message);
  } else if (const size_t dropped = index_->drop_vanished(); dropped > 0) {
    // Their rmdir records never came (lost, or the cgroup was not tracked then).
    spdlog::info("resync: {} cgroup index entries of cgroups that no longer exist dropped",
                 dropped);
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
  metrics_.on_stale_tracked_removed(r->stale);
  if (health_policy_.note_untracked(r->still_full > 0)) {
    if (r->still_full == 0) spdlog::info("every cgroup under a tracked root is tracked again");
    health_changed();
  }
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
