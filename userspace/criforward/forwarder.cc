#include "criforward/forwarder.h"

#include <spdlog/spdlog.h>

#include <climits>
#include <deque>
#include <thread>

#include "cri/endpoint.h"

namespace kpleg::criforward {
namespace {

// Request metadata that belongs to the hop, not to the call: never copied upstream.
bool hop_header(std::string_view key) {
  return key.empty() || key.front() == ':' || key.starts_with("grpc-") || key == "user-agent" ||
         key == "content-type" || key == "te" || key == "authority";
}

enum class GateKind { kForward, kAnswer };

}  // namespace

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer to_buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

class Forwarder::Service final : public grpc::CallbackGenericService {
 public:
  Service(Forwarder* fwd, Hooks* hooks) : fwd_(fwd), hooks_(hooks) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;
  grpc::GenericStub& stub() { return *fwd_->stub_; }
  const ForwarderOptions& options() const { return fwd_->options_; }

 private:
  Forwarder* fwd_;
  Hooks* hooks_;
};

namespace {

class ForwardedCall;

}  // namespace

struct Gate::State {
  State(std::weak_ptr<ForwardedCall> c, GateKind k) : call(std::move(c)), kind(k) {}
  std::mutex mu;
  std::weak_ptr<ForwardedCall> call;  // reset once resolved
  GateKind kind;
};

namespace {

// One forwarded call: the caller's stream and the upstream one, joined. Messages flow in two
// chains, each one operation at a time: caller read -> upstream write -> caller read ..., and
// upstream read -> caller write(s) -> upstream read .... The upstream call holds two holds, one
// per chain, released when its chain ends, so the upstream's OnDone comes only once neither
// chain can start anything more; it finishes the caller's call with the upstream's status.
//
// A call with hooks starts its upstream call only once the first request has passed the forward
// gate, and sends the caller nothing before the answer gate opened. While a gate is held the
// call has no operation on either side but the caller's pending read, so the caller's
// cancellation (which a passed deadline is too) ends it at once. The object is shared with
// the gates (weakly): the caller's OnDone drops the reactor's own reference.
class ForwardedCall final : public grpc::ServerGenericBidiReactor,
                            public std::enable_shared_from_this<ForwardedCall> {
 public:
  ForwardedCall(Forwarder::Service* svc, grpc::GenericCallbackServerContext* ctx,
                std::unique_ptr<CallHooks> hooks)
      : svc_(svc), method_(ctx->method()), hooks_(std::move(hooks)), upstream_(this) {
    deadline_ = ctx->deadline();
    const auto cap = svc_->options().max_call_time;
    if (cap.count() > 0) deadline_ = std::min(deadline_, std::chrono::system_clock::now() + cap);
    upstream_ctx_.set_deadline(deadline_);
    for (const auto& [k, v] : ctx->client_metadata()) {
      std::string_view key(k.data(), k.size());
      if (hop_header(key)) continue;
      upstream_ctx_.AddMetadata(std::string(key), std::string(v.data(), v.size()));
    }
  }

  void begin(std::shared_ptr<ForwardedCall> self) {
    self_ = std::move(self);
    if (!hooks_) {
      // Plain forwarding: the upstream call starts at once, the request follows.
      stage_ = Stage::kForwarding;
      start_upstream(Write::kNone);
    }
    StartRead(&request_);
  }

  // Caller's message (or its half-close).
  void OnReadDone(bool ok) override {
    std::unique_lock lk(mu_);
    if (stage_ == Stage::kFirstRead) {
      if (!ok || cancelled_) {
        if (cancelled_) {
          lk.unlock();
          finish(cancel_status());
          return;
        }
        stage_ = Stage::kForwarding;  // a stream without a request: nothing to gate
        lk.unlock();
        start_upstream(Write::kWritesDone);
        return;
      }
      in_hook_ = true;
      lk.unlock();
      hooks_->before_forward(
          request_, Gate(std::make_shared<Gate::State>(weak_from_this(), GateKind::kForward)));
      lk.lock();
      in_hook_ = false;
      if (cancelled_) {
        lk.unlock();
        finish(cancel_status());
      } else if (decided_) {
        auto answer = std::move(*decided_);
        decided_.reset();
        lk.unlock();
        pass_forward_gate(std::move(answer));
      } else {
        stage_ = Stage::kForwardHeld;
      }
      return;
    }
    lk.unlock();
    if (!ok) {
      upstream_.StartWritesDone();
      upstream_.RemoveHold();  // write chain ends
      return;
    }
    upstream_.StartWrite(&request_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      write_next();
      return;
    }
    upstream_ctx_.TryCancel();  // the caller is gone
    upstream_.RemoveHold();     // read chain ends
  }
  void OnCancel() override {
    std::unique_lock lk(mu_);
    cancelled_ = true;
    if (in_hook_ || finished_) return;  // the hook's return sees it
    if (stage_ == Stage::kForwardHeld) {
      lk.unlock();
      finish(cancel_status());
      return;
    }
    if (stage_ != Stage::kForwarding) return;  // the pending first read ends
    const auto answer = answer_;
    if (answer == Answer::kHeldOnMessage) answer_ = Answer::kAbandoned;
    lk.unlock();
    upstream_ctx_.TryCancel();
    if (answer == Answer::kHeldOnMessage) {
      upstream_.RemoveHold();  // read chain ends; the upstream's OnDone finishes
    } else if (answer == Answer::kHeldOnStatus) {
      finish(cancel_status());
    }
  }
  void OnDone() override {
    auto last = std::move(self_);  // may delete this on return
  }

  // A gate's holder ended it.
  void gate_resolved(GateKind kind, std::optional<grpc::Status> answer) {
    std::unique_lock lk(mu_);
    if (finished_ || cancelled_) return;
    if (in_hook_) {
      decided_ = std::move(answer);
      return;
    }
    if (kind == GateKind::kForward) {
      if (stage_ != Stage::kForwardHeld) return;
      lk.unlock();
      pass_forward_gate(std::move(answer));
      return;
    }
    const auto held = answer_;
    if (held != Answer::kHeldOnMessage && held != Answer::kHeldOnStatus) return;
    answer_ = Answer::kPassed;
    lk.unlock();
    pass_answer_gate(held, std::move(answer));
  }

 private:
  enum class Stage { kFirstRead, kForwardHeld, kForwarding };
  enum class Answer { kNotYet, kHeldOnMessage, kHeldOnStatus, kPassed, kAbandoned };
  enum class Write { kNone, kRequest, kWritesDone };

  class Upstream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(ForwardedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override {
      if (ok) {
        call_->upstream_message();
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

  void start_upstream(Write first) {
    svc_->stub().PrepareBidiStreamingCall(&upstream_ctx_, method_, grpc::StubOptions(), &upstream_);
    upstream_.AddMultipleHolds(2);  // the write chain and the read chain
    upstream_.StartRead(&response_);
    if (first == Write::kRequest) {
      upstream_.StartWrite(&request_);
    } else if (first == Write::kWritesDone) {
      upstream_.StartWritesDone();
      upstream_.RemoveHold();
    }
    upstream_.StartCall();
  }

  void pass_forward_gate(std::optional<grpc::Status> answer) {
    if (answer) {
      finish(std::move(*answer));  // never reaches the runtime
      return;
    }
    {
      std::lock_guard lk(mu_);
      stage_ = Stage::kForwarding;
    }
    start_upstream(Write::kRequest);
  }

  // Runs the answer gate; true when the caller may be answered now.
  bool hold_answer(Answer held) {
    if (!hooks_) return true;
    std::unique_lock lk(mu_);
    if (answer_ != Answer::kNotYet) return true;
    in_hook_ = true;
    lk.unlock();
    hooks_->before_answer(Gate(std::make_shared<Gate::State>(weak_from_this(), GateKind::kAnswer)));
    lk.lock();
    in_hook_ = false;
    if (decided_) {
      answer_ = Answer::kPassed;
      replacement_ = std::move(*decided_);
      decided_.reset();
    } else if (cancelled_) {
      answer_ = Answer::kPassed;
      replacement_ = cancel_status();
    } else {
      answer_ = held;
      return false;
    }
    lk.unlock();
    if (!replacement_) return true;
    // Replaced: the upstream's answer is dropped.
    if (held == Answer::kHeldOnMessage) {
      upstream_ctx_.TryCancel();
      upstream_.RemoveHold();
    } else {
      finish(*replacement_);
    }
    return false;
  }

  void pass_answer_gate(Answer held, std::optional<grpc::Status> answer) {
    if (held == Answer::kHeldOnStatus) {
      finish(answer ? std::move(*answer) : *upstream_status_);
      return;
    }
    if (answer) {
      {
        std::lock_guard lk(mu_);
        replacement_ = std::move(answer);
      }
      upstream_ctx_.TryCancel();
      upstream_.RemoveHold();
      return;
    }
    deliver();
  }

  void upstream_message() {
    if (hold_answer(Answer::kHeldOnMessage)) deliver();
  }

  // The upstream's message in response_ through the filter to the caller.
  void deliver() {
    if (!hooks_) {
      StartWrite(&response_);
      return;
    }
    std::vector<grpc::ByteBuffer> out;
    hooks_->on_response(response_, out);
    for (auto& m : out) outq_.push_back(std::move(m));
    write_next();
  }
  void write_next() {
    if (!hooks_ || outq_.empty()) {
      upstream_.StartRead(&response_);
      return;
    }
    writing_ = std::move(outq_.front());
    outq_.pop_front();
    StartWrite(&writing_);
  }

  void upstream_done(const grpc::Status& status) {
    auto keep = shared_from_this();  // Finish may run OnDone at once
    std::optional<grpc::Status> replaced;
    {
      std::lock_guard lk(mu_);
      upstream_status_ = status;
      replaced = replacement_;
    }
    if (replaced) {
      finish(std::move(*replaced));
      return;
    }
    if (!hold_answer(Answer::kHeldOnStatus)) return;
    finish(status);
  }

  grpc::Status cancel_status() const {
    // The server's deadline timer runs on another clock and may fire a little before the wall
    // clock reaches the deadline: a cancellation that close to it is the deadline's.
    constexpr auto kSlack = std::chrono::milliseconds(100);
    if (std::chrono::system_clock::now() + kSlack >= deadline_) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          svc_->options().who + ": deadline passed while the call was held");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        svc_->options().who + ": caller cancelled a held call");
  }

  void finish(grpc::Status status) {
    {
      std::lock_guard lk(mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (hooks_) hooks_->on_done(status);
    Finish(status);  // last: OnDone may drop the last reference at once
  }

  Forwarder::Service* svc_;
  std::string method_;
  std::unique_ptr<CallHooks> hooks_;
  std::chrono::system_clock::time_point deadline_;
  grpc::ClientContext upstream_ctx_;
  Upstream upstream_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::deque<grpc::ByteBuffer> outq_;  // read chain only
  grpc::ByteBuffer writing_;
  std::shared_ptr<ForwardedCall> self_;

  std::mutex mu_;  // never held across a gRPC operation or a hook
  Stage stage_ = Stage::kFirstRead;
  Answer answer_ = Answer::kNotYet;
  bool in_hook_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
  std::optional<std::optional<grpc::Status>> decided_;  // a gate ended within its hook
  std::optional<grpc::Status> replacement_;             // the answer gate's answer
  std::optional<grpc::Status> upstream_status_;
};

}  // namespace

void Gate::resolve(std::optional<grpc::Status> answer) const {
  if (!state_) return;
  std::shared_ptr<ForwardedCall> call;
  {
    std::lock_guard lk(state_->mu);
    call = state_->call.lock();
    state_->call.reset();
  }
  if (call) call->gate_resolved(state_->kind, std::move(answer));
}

grpc::ServerGenericBidiReactor* Forwarder::Service::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  if (hooks_ != nullptr) {
    if (auto* local = hooks_->serve_locally(*ctx)) return local;
  }
  auto call =
      std::make_shared<ForwardedCall>(this, ctx, hooks_ ? hooks_->call_hooks(*ctx) : nullptr);
  auto* reactor = call.get();
  reactor->begin(std::move(call));
  return reactor;
}

Forwarder::Forwarder(ForwarderOptions options, Hooks* hooks)
    : options_(std::move(options)), hooks_(hooks) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  if (options_.dedicated_connection) {
    args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  }
  channel_ =
      grpc::CreateCustomChannel(options_.upstream_target, grpc::InsecureChannelCredentials(), args);
  stub_ = std::make_unique<grpc::GenericStub>(channel_);
  service_ = std::make_unique<Service>(this, hooks);
}

Status Forwarder::serve() {
  int listen_fd = options_.listen_fd;
  if (listen_fd < 0) {
    auto bound = ListenSocket::bind(cri::socket_path_of(options_.listen_target),
                                    options_.socket_mode, options_.who);
    if (!bound) return bound.error();
    bound_.emplace(std::move(*bound));
    listen_fd = bound_->fd();
  }
  // The server has no port of its own: it gets each connection the acceptor takes, so that the
  // socket may be bound by the forwarder or come from systemd alike.
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  server_ = builder.BuildAndStart();
  if (!server_) return Error{EINVAL, options_.who + ": cannot start the gRPC server"};
  auto acceptor = Acceptor::start(listen_fd, server_.get(), options_.who);
  if (!acceptor) return acceptor.error();
  acceptor_ = std::move(*acceptor);
  return {};
}

Result<std::unique_ptr<Forwarder>> Forwarder::start(ForwarderOptions options, Hooks* hooks) {
  std::unique_ptr<Forwarder> fwd(new Forwarder(std::move(options), hooks));
  if (auto st = fwd->serve(); !st) return st.error();
  return fwd;
}

Forwarder::~Forwarder() { stop(); }

void Forwarder::stop_accepting() {
  if (acceptor_) acceptor_->stop();
}

void Forwarder::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_accepting();
  if (server_) {
    // GOAWAY first: a client's next call then goes to a new connection (the backlog, and the
    // next process) instead of this server, which refuses it; gRPC retries a call refused so
    // on its own. The streams the user serves end only after that (a kubelet reopens its
    // event stream at once: on the old connection it would be refused, and count as an error),
    // with a moment for the GOAWAY to reach the clients.
    std::thread shutdown(
        [this] { server_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace); });
    if (hooks_ != nullptr) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      hooks_->stopping();
    }
    shutdown.join();
    server_->Wait();
  } else if (hooks_ != nullptr) {
    hooks_->stopping();
  }
  bound_.reset();  // removes the socket file if it is still this forwarder's
}

namespace {

class Refuse final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refuse(grpc::Status st) { Finish(std::move(st)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* refuse_call(grpc::Status status) {
  return new Refuse(std::move(status));
}

}  // namespace kpleg::criforward
