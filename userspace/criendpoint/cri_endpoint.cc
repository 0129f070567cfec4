#include "criendpoint/cri_endpoint.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <deque>
#include <mutex>
#include <set>

#include "cri/endpoint.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/request_subject.h"

namespace kpleg::criendpoint {
namespace {

// How long stop() lets forwarded calls finish before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(1);

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Request metadata that belongs to the hop, not to the call: never copied upstream.
bool hop_header(std::string_view key) {
  return key.empty() || key.front() == ':' || key.starts_with("grpc-") || key == "user-agent" ||
         key == "content-type" || key == "te" || key == "authority";
}

}  // namespace

class CriEndpoint::Impl final : public grpc::CallbackGenericService {
 public:
  Impl(CriEndpointOptions options, std::string listen_target, std::string upstream_target,
       ContainerEventFeed* feed)
      : options_(std::move(options)),
        listen_target_(std::move(listen_target)),
        upstream_target_(std::move(upstream_target)),
        feed_(feed) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    // A connection of its own: the kubelet's calls never queue behind kplegd's.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = grpc::CreateCustomChannel(upstream_target_, grpc::InsecureChannelCredentials(), args);
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  Status serve() {
    const std::string path = cri::socket_path_of(listen_target_);
    if (auto st = cri::prepare_listen_socket(path, "CRI endpoint"); !st) return st;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(listen_target_, grpc::InsecureServerCredentials());
    builder.RegisterCallbackGenericService(this);
    builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
    builder.SetMaxSendMessageSize(options_.max_message_bytes);
    server_ = builder.BuildAndStart();
    if (!server_) {
      return Error{EADDRNOTAVAIL, "CRI endpoint: cannot listen on " + listen_target_ +
                                      " (is the directory there and writable?)"};
    }
    // As powerful as the runtime socket it fronts: owner only.
    if (chmod(path.c_str(), 0600) != 0) {
      auto err = Error::from_errno(errno, "CRI endpoint: chmod " + path);
      stop();
      return err;
    }
    spdlog::info("CRI endpoint: listening on {}, forwarding to {}; GetContainerEvents {}",
                 listen_target_, upstream_target_,
                 options_.serve_container_events ? "answered by kplegd" : "forwarded");
    return {};
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  void stop();

  void record(const std::string& method, int code) {
    std::lock_guard lk(mu_);
    ++calls_[{method, code}];
  }

  grpc::GenericStub& stub() { return *stub_; }
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
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  std::map<std::pair<std::string, int>, uint64_t> calls_;
  std::set<std::shared_ptr<EventMailbox>> streams_;
  uint64_t streams_total_ = 0;
  uint64_t streams_cut_off_ = 0;
};

namespace {

// One forwarded call: the caller's stream and the upstream one, joined. Messages flow in two
// chains, each one operation at a time: caller read -> upstream write -> caller read ..., and
// upstream read -> caller write -> upstream read .... The upstream call holds two holds, one
// per chain, released when its chain ends, so the upstream's OnDone comes only once neither
// chain can start anything more; it finishes the caller's call with the upstream's status, and
// the caller's OnDone (always after that) deletes the pair.
class ForwardedCall final : public grpc::ServerGenericBidiReactor {
 public:
  ForwardedCall(CriEndpoint::Impl* ep, grpc::GenericCallbackServerContext* ctx)
      : ep_(ep), method_(ctx->method()), upstream_(this) {
    upstream_ctx_.set_deadline(ctx->deadline());
    for (const auto& [k, v] : ctx->client_metadata()) {
      std::string_view key(k.data(), k.size());
      if (hop_header(key)) continue;
      upstream_ctx_.AddMetadata(std::string(key), std::string(v.data(), v.size()));
    }
    ep_->stub().PrepareBidiStreamingCall(&upstream_ctx_, method_, grpc::StubOptions(), &upstream_);
    upstream_.AddMultipleHolds(2);  // the write chain and the read chain
    upstream_.StartRead(&response_);
    upstream_.StartCall();
    StartRead(&request_);
  }

  // Caller's message (or its half-close).
  void OnReadDone(bool ok) override {
    if (!ok) {
      upstream_.StartWritesDone();
      upstream_.RemoveHold();  // write chain ends
      return;
    }
    if (!ticket_started_) {
      ticket_started_ = true;
      ticket_ = ep_->options().inflight->begin(short_method(method_), cri::CallOrigin::kEndpoint,
                                               request_subject(method_, flatten(request_)));
    }
    upstream_.StartWrite(&request_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      upstream_.StartRead(&response_);
      return;
    }
    upstream_ctx_.TryCancel();  // the caller is gone
    upstream_.RemoveHold();     // read chain ends
  }
  void OnCancel() override { upstream_ctx_.TryCancel(); }
  void OnDone() override { delete this; }

 private:
  class Upstream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(ForwardedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override {
      if (ok) {
        call_->StartWrite(&call_->response_);
      } else {
        RemoveHold();  // read chain ends: the upstream sent all it will
      }
    }
    void OnWriteDone(bool ok) override {
      if (ok) {
        call_->StartRead(&call_->request_);
      } else {
        RemoveHold();  // write chain ends: the upstream takes no more
      }
    }
    void OnDone(const grpc::Status& status) override { call_->upstream_done(status); }

   private:
    ForwardedCall* call_;
  };

  void upstream_done(const grpc::Status& status) {
    ticket_.end();
    ep_->record(std::string(short_method(method_)), status.error_code());
    Finish(status);  // last: the caller's OnDone may delete this at once
  }

  CriEndpoint::Impl* ep_;
  std::string method_;
  grpc::ClientContext upstream_ctx_;
  Upstream upstream_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  bool ticket_started_ = false;
  cri::InflightCalls::Ticket ticket_;
};

}  // namespace

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

grpc::ServerGenericBidiReactor* CriEndpoint::Impl::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  if (options_.serve_container_events && feed_ != nullptr && ctx->method() == kGetContainerEventsPath) {
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
  return new ForwardedCall(this, ctx);
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
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    server_->Wait();
  }
  unlink(cri::socket_path_of(listen_target_).c_str());
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
