// Forwarder: a CRI socket that forwards every call to a runtime, generically — by method name
// and raw bytes, so unary and streaming methods, methods of newer CRI versions and of other
// services pass through without the forwarder knowing them. The caller's deadline, cancellation
// and custom metadata go upstream with the request; the runtime's messages and status (code,
// message, details) come back as sent. No thread is held by a call: a call the runtime never
// answers (or a hook holds) costs a map entry, not a server thread.
//
// It owns the listening socket (listen_socket.h: a stale file replaced, a live one an error,
// owner-only mode from the start, removed only while still its own; or one systemd passed) and
// accepts connections itself, the upstream connection and the forwarding itself. What its users add
// goes through a few explicit hooks (Hooks, CallHooks): serve a method here instead of forwarding
// it, look at or rewrite a call's request, hold a call before it goes upstream or before it is
// answered (Gate), filter the upstream's response messages, and see each call's end. Users:
// criendpoint (kplegd's --cri-listen), the slow-runtime CRI proxy
// (tools/kpleg-cri-proxy/cri_proxy.h) and the benchmark's cgroup-prefix proxy.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "criforward/listen_socket.h"

namespace kpleg::criforward {

// One hold on a forwarded call, handed to a CallHooks gate. The holder ends it once, from any
// thread: open() lets the call go on, answer() ends it with that status instead. Both are
// no-ops after the first, and after the call ended (its caller cancelled or its deadline
// passed, which ends a held call at once with CANCELLED or DEADLINE_EXCEEDED). Copyable.
class Gate {
 public:
  void open() const { resolve(std::nullopt); }
  void answer(grpc::Status status) const { resolve(std::move(status)); }

  struct State;
  explicit Gate(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  void resolve(std::optional<grpc::Status> answer) const;
  std::shared_ptr<State> state_;
};

// What a user adds to one forwarded call. Every hook runs on a gRPC thread and must not block;
// the hooks of one call never run concurrently with each other.
class CallHooks {
 public:
  virtual ~CallHooks() = default;
  // The caller's first request message, before anything goes upstream (the upstream call is
  // started only after the gate opens). May rewrite `request`. Must end `gate`, now or later;
  // an answer() here means the call never reaches the runtime.
  virtual void before_forward(grpc::ByteBuffer& /*request*/, Gate gate) { gate.open(); }
  // Before the caller gets anything back: the upstream's first message, or its status when it
  // sends none. Must end `gate`, now or later; answer() replaces the upstream's answer.
  virtual void before_answer(Gate gate) { gate.open(); }
  // Each upstream message, in order: appends what to send the caller now (default: the
  // message itself). Appending nothing holds or drops it; appending several sends them in order.
  virtual void on_response(grpc::ByteBuffer& message, std::vector<grpc::ByteBuffer>& out) {
    out.push_back(std::move(message));
  }
  // The status the caller is answered with; the last hook of a call.
  virtual void on_done(const grpc::Status& /*status*/) {}
};

// What a user adds to the server. Called on gRPC threads, concurrently.
class Hooks {
 public:
  virtual ~Hooks() = default;
  // A method answered here instead of forwarded: its reactor (which deletes itself in OnDone),
  // or nullptr to forward the call.
  virtual grpc::ServerGenericBidiReactor* serve_locally(
      grpc::GenericCallbackServerContext& /*ctx*/) {
    return nullptr;
  }
  // The hooks of one forwarded call; nullptr forwards it untouched.
  virtual std::unique_ptr<CallHooks> call_hooks(const grpc::GenericCallbackServerContext& /*ctx*/) {
    return nullptr;
  }
  // stop() accepts no more connections and is about to wait for the calls in flight: end the
  // calls served here that never end by themselves (event streams), or stop() waits its grace.
  virtual void stopping() {}
};

struct ForwarderOptions {
  std::string who;            // names the forwarder in logs and errors: "CRI endpoint"
  std::string listen_target;  // gRPC targets, "unix:///path" (cri::grpc_target_for_endpoint)
  std::string upstream_target;
  // A listening socket to serve instead of binding listen_target (socket activation): the
  // forwarder accepts on it and never removes its file. Its owner keeps it open until stop().
  int listen_fd = -1;
  mode_t socket_mode = 0600;  // as powerful as the runtime socket it fronts: owner only
  int max_message_bytes = 16 * 1024 * 1024;  // either way; the kubelet allows 16 MiB
  // A connection of its own that never idles or pings: a long-lived forwarder's calls never
  // queue behind another client's in the same process, and an idle node wakes nobody.
  bool dedicated_connection = false;
  // Upstream calls end by this long at the latest even when their caller set no deadline
  // (zero: the caller's deadline only).
  std::chrono::milliseconds max_call_time{0};
  // How long stop() lets forwarded calls finish before gRPC cancels them.
  std::chrono::milliseconds shutdown_grace{1000};
};

class Forwarder {
 public:
  // Readies the socket, starts serving, makes it owner-only. `hooks` (may be null) must outlive
  // the forwarder. The upstream may come up later: calls get its UNAVAILABLE meanwhile.
  static Result<std::unique_ptr<Forwarder>> start(ForwarderOptions options, Hooks* hooks);
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  const std::string& endpoint() const { return options_.listen_target; }
  // The upstream connection, for a user's own calls to the runtime.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // Accepts no more connections (with socket activation, new ones wait in the backlog for the
  // next process); calls on open connections go on. Idempotent.
  void stop_accepting();
  // Stops accepting, tells every client to go away (HTTP/2 GOAWAY: no new call on its
  // connection), then has its user end what it serves itself (Hooks::stopping), lets the calls
  // in flight finish for up to shutdown_grace, cancels what is left, and removes the socket if
  // still its own; idempotent.
  void stop();

  class Service;

 private:
  explicit Forwarder(ForwarderOptions options, Hooks* hooks);
  Status serve();

  ForwarderOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  Hooks* hooks_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::optional<ListenSocket> bound_;  // when the forwarder bound its own socket
  std::unique_ptr<Acceptor> acceptor_;
  std::mutex mu_;
  bool stopped_ = false;
};

// The caller's first request as one string (for parsing it).
std::string flatten(const grpc::ByteBuffer& buffer);
// A message as a ByteBuffer (for sending it).
grpc::ByteBuffer to_buffer(const std::string& bytes);
// A reactor that ends its call at once with `status` (a call refused before it is forwarded);
// it deletes itself when done.
grpc::ServerGenericBidiReactor* refuse_call(grpc::Status status);

}  // namespace kpleg::criforward
