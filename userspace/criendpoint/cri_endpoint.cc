#include "criendpoint/cri_endpoint.h"

#include <spdlog/spdlog.h>

#include "cri/endpoint.h"
#include "criendpoint/call_watch.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/event_stream.h"
#include "criendpoint/request_subject.h"
#include "criforward/forwarder.h"

namespace kpleg::criendpoint {

class CriEndpoint::Impl final : public criforward::Hooks {
 public:
  Impl(CriEndpointOptions options, std::string listen_target, std::string upstream_target,
       ContainerEventFeed* feed)
      : options_(std::move(options)),
        listen_target_(std::move(listen_target)),
        upstream_target_(std::move(upstream_target)),
        watch_(options_.inflight, options_.max_calls) {
    if (feed != nullptr && options_.serve_container_events) {
      streams_ = std::make_unique<EventStreams>(*feed, "kplegd", options_.max_queued_events,
                                                options_.max_event_streams);
    }
  }

  Status serve() {
    criforward::ForwarderOptions fo;
    fo.who = "CRI endpoint";
    fo.listen_target = listen_target_;
    fo.upstream_target = upstream_target_;
    fo.max_message_bytes = options_.max_message_bytes;
    fo.dedicated_connection = true;  // the kubelet's calls never queue behind kplegd's
    auto fwd = criforward::Forwarder::start(std::move(fo), this);
    if (!fwd) return fwd.error();
    forwarder_ = std::move(*fwd);
    spdlog::info("CRI endpoint: listening on {}, forwarding to {}; GetContainerEvents {}",
                 listen_target_, upstream_target_, streams_ ? "answered by kplegd" : "forwarded");
    return {};
  }

  grpc::ServerGenericBidiReactor* serve_locally(grpc::GenericCallbackServerContext& ctx) override {
    if (streams_ && ctx.method() == kGetContainerEventsPath) return streams_->open();
    return watch_.admit("kplegd");
  }
  std::unique_ptr<criforward::CallHooks> call_hooks(
      const grpc::GenericCallbackServerContext& ctx) override {
    return watch_.hooks(ctx.method());
  }
  void stopping() override {
    if (streams_) streams_->end_all();
  }

  void stop() {
    if (forwarder_) forwarder_->stop();
  }
  const std::string& endpoint() const { return listen_target_; }

  CriEndpointStats stats() const {
    CriEndpointStats s;
    s.calls = watch_.calls();
    if (streams_) {
      auto es = streams_->stats();
      s.event_streams = es.open;
      s.event_streams_total = es.total;
      s.event_streams_cut_off = es.cut_off;
    }
    return s;
  }

 private:
  CriEndpointOptions options_;
  std::string listen_target_;
  std::string upstream_target_;
  CallWatch watch_;
  std::unique_ptr<EventStreams> streams_;
  std::unique_ptr<criforward::Forwarder> forwarder_;
};

Result<std::unique_ptr<CriEndpoint>> CriEndpoint::start(CriEndpointOptions options,
                                                        ContainerEventFeed* feed) {
  if (!options.inflight) return Error{EINVAL, "CRI endpoint: no in-flight call registry"};
  auto listen = cri::grpc_target_for_endpoint(options.listen_endpoint);
  if (!listen) return Error{listen.error().code, "--cri-listen: " + listen.error().message};
  auto upstream = cri::grpc_target_for_endpoint(options.upstream_endpoint);
  if (!upstream) return upstream.error();
  if (*listen == *upstream) {
    return Error{EINVAL, "--cri-listen " + options.listen_endpoint +
                             " is the runtime's own socket: kplegd would forward to itself"};
  }
  if (options.serve_container_events && feed == nullptr) {
    return Error{EINVAL, "CRI endpoint: GetContainerEvents served without an event feed"};
  }
  auto impl =
      std::make_unique<Impl>(std::move(options), std::move(*listen), std::move(*upstream), feed);
  if (auto st = impl->serve(); !st) return st.error();
  return std::unique_ptr<CriEndpoint>(new CriEndpoint(std::move(impl)));
}

CriEndpoint::CriEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriEndpoint::~CriEndpoint() { stop(); }
const std::string& CriEndpoint::endpoint() const { return impl_->endpoint(); }
CriEndpointStats CriEndpoint::stats() const { return impl_->stats(); }
void CriEndpoint::stop() { impl_->stop(); }

}  // namespace kpleg::criendpoint
