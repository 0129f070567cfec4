#include "criendpoint/cri_endpoint.h"

#include <spdlog/spdlog.h>

#include <deque>
#include <mutex>
#include <set>

#include "cri/endpoint.h"
#include "criendpoint/container_event_feed.h"
#include "criforward/forwarder.h"
#include "criendpoint/request_subject.h"

namespace kpleg::criendpoint {

class CriEndpoint::Impl final : public criforward::Hooks {
 public:
  Impl(CriEndpointOptions options, std::string listen_target, std::string upstream_target,
       ContainerEventFeed* feed)
      : options_(std::move(options)),
        listen_target_(std::move(listen_target)),
        upstream_target_(std::move(upstream_target)),
        feed_(feed) {}

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
                 listen_target_, upstream_target_,
                 options_.serve_container_events ? "answered by kplegd" : "forwarded");
    return {};
  }

  grpc::ServerGenericBidiReactor* serve_locally(grpc::GenericCallbackServerContext& ctx) override;
  std::unique_ptr<criforward::CallHooks> call_hooks(
      const grpc::GenericCallbackServerContext& ctx) override;

  void stop();

  void record(std::string_view method, int code) {
    std::lock_guard lk(mu_);
    ++calls_[{std::string(method), code}];
  }

  const CriEndpointOptions& options() const { return options_; }
  ContainerEventFeed* feed() { return feed_; }
  const std::string& endpoint() const { return listen_target_; }

  CriEndpointStats stats() const {
    std::lock_guard lk(mu_);
    CriEndpointStats s;
    s.calls = calls_;
    s.event_streams = streams_.size();
    s.event_streams_total = streams_total_;
    s.event_streams_cut_off = streams_cut_off_;
    return s;
  }

  class EventMailbox;
  void stream_opened(const std::shared_ptr<EventMailbox>& m) {
    std::lock_guard lk(mu_);
    streams_.insert(m);
    ++streams_total_;
  }
  void stream_closed(const std::shared_ptr<EventMailbox>& m, bool cut_off) {
    std::lock_guard lk(mu_);
    streams_.erase(m);
    if (cut_off) ++streams_cut_off_;
  }

 private:
  CriEndpointOptions options_;
  std::string listen_target_;
  std::string upstream_target_;
  ContainerEventFeed* feed_;
  std::unique_ptr<criforward::Forwarder> forwarder_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  std::map<std::pair<std::string, int>, uint64_t> calls_;
  std::set<std::shared_ptr<EventMailbox>> streams_;
  uint64_t streams_total_ = 0;
  uint64_t streams_cut_off_ = 0;
};

namespace {

// A forwarded call in the stuck-call watchdog from its request on, and counted by its status.
class WatchedCall final : public criforward::CallHooks {
 public:
  WatchedCall(CriEndpoint::Impl* ep, std::string method) : ep_(ep), method_(std::move(method)) {}
  void before_forward(grpc::ByteBuffer& request, criforward::Gate gate) override {
    ticket_ = ep_->options().inflight->begin(short_method(method_), cri::CallOrigin::kEndpoint,
                                             request_subject(method_, criforward::flatten(request)));
    gate.open();
  }
  void on_done(const grpc::Status& status) override {
    ticket_.end();
    ep_->record(short_method(method_), status.error_code());
  }

 private:
  CriEndpoint::Impl* ep_;
  std::string method_;
  cri::InflightCalls::Ticket ticket_;
};

}  // namespace

std::unique_ptr<criforward::CallHooks> CriEndpoint::Impl::call_hooks(
    const grpc::GenericCallbackServerContext& ctx) {
  return std::make_unique<WatchedCall>(this, ctx.method());
}

// The state of one GetContainerEvents stream, shared by its reactor and the feed: it outlives
// the reactor, so a delivery racing the stream's end finds it closed instead of a dangling
// reactor. The lock is recursive because gRPC may run a reaction inline within StartWrite or
// Finish on the same thread.
class CriEndpoint::Impl::EventMailbox final : public EventReceiver {
 public:
  EventMailbox(grpc::ServerGenericBidiReactor* reactor, size_t max_queued)
      : reactor_(reactor), max_queued_(max_queued) {}

  void deliver(std::shared_ptr<const std::string> message) override {
    std::lock_guard lk(mu_);
    if (finishing_ || reactor_ == nullptr) return;
    if (queue_.size() >= max_queued_) {
      spdlog::warn("CRI endpoint: a GetContainerEvents subscriber is {} events behind; ending "
                   "its stream",
                   queue_.size());
      cut_off_ = true;
      finish_locked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "kplegd: subscriber too slow: " + std::to_string(max_queued_) +
                                     " container events queued"));
      return;
    }
    queue_.push_back(std::move(message));
    if (!writing_) write_front_locked();
  }

  void write_done(bool ok) {
    std::lock_guard lk(mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      finish_locked(grpc::Status::CANCELLED);
      return;
    }
    if (pending_finish_) {
      auto st = *pending_finish_;
      pending_finish_.reset();
      finish_locked(st);
      return;
    }
    if (!queue_.empty() && !finishing_) write_front_locked();
  }

  // Cancelled by the caller, or the endpoint stops (OK).
  void end(const grpc::Status& status) {
    std::lock_guard lk(mu_);
    finish_locked(status);
  }

  void reactor_done() {
    std::lock_guard lk(mu_);
    reactor_ = nullptr;
  }
  bool cut_off() const {
    std::lock_guard lk(mu_);
    return cut_off_;
  }

 private:
  void write_front_locked() {
    const std::string& m = *queue_.front();
    grpc::Slice slice(m.data(), m.size());
    buffer_ = grpc::ByteBuffer(&slice, 1);
    writing_ = true;
    reactor_->StartWrite(&buffer_);
  }
  void finish_locked(const grpc::Status& status) {
    if (finished_ || reactor_ == nullptr) return;
    finishing_ = true;
    if (writing_) {  // after the write in progress
      if (!pending_finish_) pending_finish_ = status;
      return;
    }
    finished_ = true;
    reactor_->Finish(status);
  }

  mutable std::recursive_mutex mu_;
  grpc::ServerGenericBidiReactor* reactor_;
  size_t max_queued_;
  std::deque<std::shared_ptr<const std::string>> queue_;
  grpc::ByteBuffer buffer_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  bool cut_off_ = false;
  std::optional<grpc::Status> pending_finish_;
};

namespace {

// GetContainerEvents answered by kplegd: every event the feed builds from now on, until the
// caller cancels or kplegd stops. Headers go out at once, so clients that wait for them before
// the first event do not hang on a quiet node.
class EventStream final : public grpc::ServerGenericBidiReactor {
 public:
  EventStream(CriEndpoint::Impl* ep) : ep_(ep) {
    mailbox_ = std::make_shared<CriEndpoint::Impl::EventMailbox>(this, ep->options().max_queued_events);
    ep_->stream_opened(mailbox_);
    feed_id_ = ep_->feed()->add(mailbox_);
    StartSendInitialMetadata();
    StartRead(&request_);
  }
  void OnReadDone(bool) override {}  // the request carries nothing; the stream ends by cancel
  void OnWriteDone(bool ok) override { mailbox_->write_done(ok); }
  void OnCancel() override { mailbox_->end(grpc::Status::CANCELLED); }
  void OnDone() override {
    ep_->feed()->remove(feed_id_);
    mailbox_->reactor_done();
    ep_->stream_closed(mailbox_, mailbox_->cut_off());
    delete this;
  }

 private:
  CriEndpoint::Impl* ep_;
  std::shared_ptr<CriEndpoint::Impl::EventMailbox> mailbox_;
  uint64_t feed_id_ = 0;
  grpc::ByteBuffer request_;
};

}  // namespace

grpc::ServerGenericBidiReactor* CriEndpoint::Impl::serve_locally(
    grpc::GenericCallbackServerContext& ctx) {
  if (!options_.serve_container_events || feed_ == nullptr || ctx.method() != kGetContainerEventsPath) {
    return nullptr;
  }
  {
    std::lock_guard lk(mu_);
    if (stopped_) {
      class Refuse : public grpc::ServerGenericBidiReactor {
       public:
        Refuse() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kplegd is stopping")); }
        void OnDone() override { delete this; }
      };
      return new Refuse;
    }
  }
  return new EventStream(this);
}

void CriEndpoint::Impl::stop() {
  std::set<std::shared_ptr<EventMailbox>> streams;
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    stopped_ = true;
    streams = streams_;
  }
  for (const auto& m : streams) m->end(grpc::Status::OK);
  if (forwarder_) forwarder_->stop();
}

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
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*listen), std::move(*upstream),
                                     feed);
  if (auto st = impl->serve(); !st) return st.error();
  return std::unique_ptr<CriEndpoint>(new CriEndpoint(std::move(impl)));
}

CriEndpoint::CriEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriEndpoint::~CriEndpoint() { stop(); }
const std::string& CriEndpoint::endpoint() const { return impl_->endpoint(); }
CriEndpointStats CriEndpoint::stats() const { return impl_->stats(); }
void CriEndpoint::stop() { impl_->stop(); }

}  // namespace kpleg::criendpoint
