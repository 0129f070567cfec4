#include "daemon/daemon.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace kpleg::daemon {

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
  if (auto st = d->connect_runtime(); !st) return st.error();

  auto pipeline = start_pipeline({.opts = d->opts_,
                                  .cri = *d->cri_,
                                  .bus = *d->bus_,
                                  .metrics = d->metrics_,
                                  .health = d->health_policy_,
                                  .health_changed = [self] { self->health_changed(); },
                                  .runtime_name = d->runtime_name_});
  if (!pipeline) return pipeline.error();
  d->pipeline_ = std::move(*pipeline);
  d->running_ = d->pipeline_.get();
  d->metrics_.set_mode(to_string(d->pipeline_->mode()));
  d->metrics_.mirror_at_scrape([self] {
    MetricsMirror::Sources s{.inflight = self->inflight_.get(),
                             .cri_endpoint = self->cri_endpoint_.get(),
                             .event_feed = self->event_feed_.get()};
    self->pipeline_->describe(s);
    return s;
  });
  if (auto es = d->start_cri_endpoint(); !es) return es.error();
  return d;
}

Status Daemon::connect_runtime() {
  cri::GrpcCriClientOptions co;
  co.call_timeout = opts_.cri_timeout;
  co.list_timeout = opts_.cri_list_timeout;
  co.on_state_change = [this] { health_changed(); };
  co.inflight = inflight_;
  inflight_->set_resolver([this](const cri::CallSubject& s) { return identify(s); });
  co.on_reconnect = [this] {
    spdlog::info("container runtime reachable again");
    if (auto* p = running_.load()) p->runtime_reconnected();
  };
  auto cri = cri::GrpcCriClient::create(opts_.runtime_endpoint, co);
  if (!cri) return Error{cri.error().code, "bad --runtime-endpoint: " + cri.error().message};
  cri_ = std::move(*cri);
  metrics_.mirror_cri_calls(cri_->call_stats());
  auto v = cri_->version();
  if (!v) {
    return Error{v.error().code, "cannot reach the container runtime at " + opts_.runtime_endpoint +
                                     ": " + v.error().message};
  }
  spdlog::info("container runtime {} {} (CRI {}) at {}", v->runtime_name(), v->runtime_version(),
               v->runtime_api_version(), opts_.runtime_endpoint);
  runtime_name_ = v->runtime_name();
  return {};
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

std::optional<cri::CallSubject> Daemon::identify(const cri::CallSubject& subject) {
  auto* pipeline = running_.load();
  if (pipeline == nullptr || stopped_) return std::nullopt;
  for (const auto& pod : pipeline->snapshot().pods) {
    if (subject.id.empty()) {
      if (pod.uid == subject.pod.uid) return cri::CallSubject{subject.id, pod, ""};
      continue;
    }
    for (const auto& c : pod.containers) {
      if (c.id != subject.id) continue;
      return cri::CallSubject{subject.id, pod, c.sandbox ? "" : c.name};
    }
  }
  return std::nullopt;
}

std::vector<api::InflightCallRecord> Daemon::inflight_calls(std::chrono::milliseconds min_age) {
  std::vector<api::InflightCallRecord> out;
  for (const auto& c : inflight_->older_than(min_age)) {
    const auto& s = c.subject;
    out.push_back(api::InflightCallRecord{c.method, cri::to_string(c.origin), s.pod, s.id,
                                          s.container_name, c.age, cri::describe(c)});
  }
  return out;
}

void Daemon::stop() {
  if (stopped_.exchange(true)) return;
  if (cri_endpoint_) cri_endpoint_->stop();
  if (event_feed_) event_feed_->stop();
  // Calls in flight end now (a full list may have a minute left): the pipeline's threads that
  // wait for them stop at once.
  if (cri_) cri_->cancel_calls();
  running_ = nullptr;
  if (pipeline_) pipeline_->stop();
  if (bus_) bus_->close("kplegd shutting down");
}

HealthPolicy::Components Daemon::health_components() {
  HealthPolicy::Components c{.cri = *cri_, .inflight = *inflight_};
  pipeline_->describe(c);
  return c;
}

api::HealthReport Daemon::health() { return health_policy_.health(health_components()); }

api::HealthReport Daemon::liveness() { return health_policy_.liveness(health_components()); }

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
  s.mode = to_string(pipeline_->mode());
  s.start_time_ns = start_time_ns_;
  auto snap = pipeline_->snapshot();
  s.pods = snap.pods.size();
  for (const auto& p : snap.pods) s.containers += p.containers.size();
  const cri::CallStats& calls = cri_->call_stats();
  s.cri_calls = calls.total();
  for (size_t m = 0; m < cri::kCriMethodCount; ++m) {
    const auto method = static_cast<cri::CriMethod>(m);
    if (const uint64_t n = calls.total(method); n > 0)
      s.cri_calls_by_method.emplace(cri::cri_method_name(method), n);
  }
  pipeline_->add_stats(s);
  return s;
}

}  // namespace kpleg::daemon
