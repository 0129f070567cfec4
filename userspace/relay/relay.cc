#include "relay/relay.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>

#include "cri/endpoint.h"
#include "cri/grpc_cri_client.h"
#include "cri/inflight_calls.h"
#include "criendpoint/call_watch.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/event_stream.h"
#include "criendpoint/request_subject.h"
#include "criforward/forwarder.h"
#include "criforward/listen_socket.h"
#include "kpleg/v1/pleg.grpc.pb.h"
#include "relay/kplegd_follower.h"

namespace kpleg::relay {
namespace {

constexpr const char* kWho = "kpleg-cri-relay";

// kplegd's InflightCalls RPC, answered with the relay's calls: what `kplegctl stuck` reads.
class StatusService final : public kpleg::v1::PodLifecycle::Service {
 public:
  explicit StatusService(cri::InflightCalls& inflight) : inflight_(inflight) {}
  grpc::Status InflightCalls(grpc::ServerContext*, const kpleg::v1::InflightCallsRequest* req,
                             kpleg::v1::InflightCallsResponse* resp) override {
    const auto min_age =
        std::chrono::milliseconds(std::min<uint64_t>(req->min_age_ms(), uint64_t(INT64_MAX)));
    for (const auto& c : inflight_.older_than(min_age)) {
      auto* out = resp->add_calls();
      out->set_method(c.method);
      out->set_origin(c.origin == cri::CallOrigin::kEndpoint ? "endpoint" : kWho);
      out->set_pod_uid(c.subject.pod.uid);
      out->set_pod_name(c.subject.pod.name);
      out->set_pod_namespace(c.subject.pod.namespace_);
      out->set_id(c.subject.id);
      out->set_container_name(c.subject.container_name);
      out->set_age_ms(uint64_t(c.age.count()));
      out->set_description(cri::describe(c));
    }
    return grpc::Status::OK;
  }

 private:
  cri::InflightCalls& inflight_;
};

}  // namespace

class Relay::Impl final : public criforward::Hooks {
 public:
  explicit Impl(RelayOptions options)
      : options_(std::move(options)),
        inflight_(std::make_shared<cri::InflightCalls>()),
        watch_(inflight_, options_.max_calls, /*log_failures=*/true) {}

  Status start() {
    auto listen = options_.listen_fd >= 0
                      ? Result<std::string>(std::string("unix:(socket-activated)"))
                      : cri::grpc_target_for_endpoint(options_.listen_endpoint);
    if (!listen) return Error{listen.error().code, "--listen: " + listen.error().message};
    auto upstream = cri::grpc_target_for_endpoint(options_.runtime_endpoint);
    if (!upstream)
      return Error{upstream.error().code, "--runtime-endpoint: " + upstream.error().message};
    if (*listen == *upstream)
      return Error{EINVAL, "--listen is the runtime's own socket: the relay would call itself"};

    cri::GrpcCriClientOptions co;
    co.inflight = inflight_;
    auto cri = cri::GrpcCriClient::create(options_.runtime_endpoint, co);
    if (!cri) return cri.error();
    cri_ = std::move(*cri);
    criendpoint::ContainerEventFeedOptions fo;
    fo.full_statuses = options_.full_statuses;
    fo.max_queued = options_.max_feed_queue;
    feed_ = std::make_unique<criendpoint::ContainerEventFeed>(*cri_, fo);
    streams_ = std::make_unique<criendpoint::EventStreams>(*feed_, kWho, options_.max_queued_events,
                                                           options_.max_event_streams);
    follower_ =
        std::make_unique<KplegdFollower>(KplegdFollowerOptions{options_.kplegd_socket},
                                         [this](bus::EventPtr ev) { feed_->post(std::move(ev)); });
    inflight_->set_resolver(
        [f = follower_.get()](const cri::CallSubject& s) { return f->identify(s); });

    if (!options_.status_socket.empty()) {
      auto sock = criforward::ListenSocket::bind(options_.status_socket, 0600, kWho);
      if (!sock) return Error{sock.error().code, "--status-socket: " + sock.error().message};
      status_socket_.emplace(std::move(*sock));
      status_service_ = std::make_unique<StatusService>(*inflight_);
      grpc::ServerBuilder b;
      b.RegisterService(status_service_.get());
      status_server_ = b.BuildAndStart();
      if (!status_server_) return Error{EINVAL, "--status-socket: cannot start its server"};
      auto acc = criforward::Acceptor::start(status_socket_->fd(), status_server_.get(), kWho);
      if (!acc) return acc.error();
      status_acceptor_ = std::move(*acc);
    }

    criforward::ForwarderOptions fw;
    fw.who = kWho;
    fw.listen_target = *listen;
    fw.listen_fd = options_.listen_fd;
    fw.upstream_target = *upstream;
    fw.dedicated_connection = true;
    fw.shutdown_grace = options_.stop_timeout;
    auto fwd = criforward::Forwarder::start(std::move(fw), this);
    if (!fwd) return fwd.error();
    forwarder_ = std::move(*fwd);
    follower_->start();
    spdlog::info(
        "{}: serving on {}, forwarding to {}; GetContainerEvents from kplegd at {}{}", kWho,
        options_.listen_fd >= 0 ? "the socket systemd passed" : *listen, *upstream,
        options_.kplegd_socket,
        options_.status_socket.empty() ? "" : "; calls in flight on " + options_.status_socket);
    return {};
  }

  grpc::ServerGenericBidiReactor* serve_locally(grpc::GenericCallbackServerContext& ctx) override {
    if (ctx.method() == criendpoint::kGetContainerEventsPath) return streams_->open();
    return watch_.admit(kWho);
  }
  std::unique_ptr<criforward::CallHooks> call_hooks(
      const grpc::GenericCallbackServerContext& ctx) override {
    return watch_.hooks(ctx.method());
  }
  void stopping() override {
    spdlog::info("{}: stopping: no new connection; {} calls in flight finish first", kWho,
                 watch_.in_flight());
    streams_->end_all();
  }

  void stop() {
    if (stopped_.exchange(true)) return;
    const auto t0 = std::chrono::steady_clock::now();
    if (forwarder_) forwarder_->stop();
    if (follower_) follower_->stop();
    if (feed_) feed_->stop();
    if (status_acceptor_) status_acceptor_->stop();
    if (status_server_) status_server_->Shutdown(std::chrono::system_clock::now());
    status_socket_.reset();
    const auto s = stats();
    uint64_t total = 0;
    for (const auto& [k, n] : s.calls) total += n;
    spdlog::info(
        "{}: stopped after {} ms; {} calls forwarded", kWho,
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count(),
        total);
    for (const auto& [k, n] : s.calls)
      if (k.second != 0)
        spdlog::info("{}: calls {} ended with code {}: {}", kWho, k.first, k.second, n);
  }

  RelayStats stats() const {
    RelayStats s;
    s.calls = watch_.calls();
    s.calls_in_flight = watch_.in_flight();
    s.calls_refused = watch_.refused();
    if (streams_) s.event_streams = streams_->stats().open;
    if (feed_) s.events_sent = feed_->stats().sent;
    if (follower_) {
      auto f = follower_->stats();
      s.kplegd_events = f.events;
      s.catch_up_events = f.catch_up_events;
      s.kplegd_disconnects = f.disconnects;
      s.kplegd_connected = f.connected;
    }
    return s;
  }

 private:
  RelayOptions options_;
  std::shared_ptr<cri::InflightCalls> inflight_;
  criendpoint::CallWatch watch_;
  std::unique_ptr<cri::GrpcCriClient> cri_;
  std::unique_ptr<criendpoint::ContainerEventFeed> feed_;
  std::unique_ptr<criendpoint::EventStreams> streams_;
  std::unique_ptr<KplegdFollower> follower_;
  std::optional<criforward::ListenSocket> status_socket_;
  std::unique_ptr<StatusService> status_service_;
  std::unique_ptr<grpc::Server> status_server_;
  std::unique_ptr<criforward::Acceptor> status_acceptor_;
  std::unique_ptr<criforward::Forwarder> forwarder_;
  std::atomic<bool> stopped_{false};
};

Result<std::unique_ptr<Relay>> Relay::start(RelayOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (auto st = impl->start(); !st) return st.error();
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() { stop(); }
void Relay::stop() { impl_->stop(); }
RelayStats Relay::stats() const { return impl_->stats(); }

}  // namespace kpleg::relay
