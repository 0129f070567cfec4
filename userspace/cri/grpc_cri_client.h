// CriClient over gRPC to the runtime's unix socket (containerd, CRI-O, cri-dockerd).
//
// Every call carries a deadline (default 2 s). The kubelet gives its CRI calls 2 minutes, and
// that long timeout is what lets one hung call (a stuck CNI plugin, a wedged shim) stall its
// whole PLEG relist; kpleg instead fails the one call quickly and lets the caller retry or
// reconcile later. Calls beyond max_in_flight wait for a slot, but only until their own
// deadline.
//
// Calls are made without wait_for_ready: while the runtime is down they fail at once with
// UNAVAILABLE instead of queueing until their deadline, so a caller learns of the outage in
// microseconds and the daemon can report "runtime unreachable" in its health. Meanwhile gRPC
// keeps reconnecting with jittered exponential backoff (initial .. max backoff below, never
// giving up), and a watcher thread keeps a connection of its own to the runtime (one that
// carries no calls, so that it sleeps while they run) connecting, reports its state as the
// runtime's (state()), and each return to READY through on_reconnect, which is the daemon's
// cue to relist. The calls' connection reconnects on the next call.
#pragma once

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <thread>

#include "common/result.h"
#include <grpcpp/completion_queue.h>

#include "cri/api.grpc.pb.h"
#include "cri/call_slots.h"
#include "cri/call_stats.h"
#include "cri/cancel_token.h"
#include "cri/cri_client.h"
#include "cri/h2_unary.h"
#include "cri/inflight_calls.h"

namespace kpleg::cri {

struct GrpcCriClientOptions {
  // Deadline of every call (StopContainer gets its grace period on top).
  std::chrono::milliseconds call_timeout{2000};
  // Deadline of a full list (ListContainers or ListPodSandbox naming no id, sandbox or pod),
  // at least call_timeout. A node with thousands of containers, or a loaded runtime, takes
  // seconds to list them all: with the short per-call deadline the reconcile (and the relist)
  // would fail on every try and the daemon would never be healthy there.
  std::chrono::milliseconds list_timeout{60000};
  // Calls in flight at once; further calls wait for a slot until their deadline.
  size_t max_in_flight = 8;
  // Reconnect backoff: gRPC starts at initial, multiplies by 1.6 with +-20% jitter per failed
  // attempt up to max, and gives each attempt at least min_connect_timeout to complete.
  std::chrono::milliseconds initial_reconnect_backoff{100};
  std::chrono::milliseconds max_reconnect_backoff{5000};
  std::chrono::milliseconds min_connect_timeout{1000};
  // Large nodes list thousands of containers; the kubelet allows 16 MiB too.
  int max_receive_message_bytes = 16 * 1024 * 1024;
  // Called on the watcher thread each time the channel is READY again after having lost a
  // READY connection (not on the first connection). Keep it short and do not destroy the
  // client from inside it.
  std::function<void()> on_reconnect;
  // Called on the watcher thread after every change of the channel's state (state() then
  // reports the new one); same rules as on_reconnect.
  std::function<void()> on_state_change;
  // Where every call registers while in flight (the stuck-call watchdog); none: not tracked.
  std::shared_ptr<InflightCalls> inflight;
  // The read-only calls (Version, Status, ListPodSandbox, PodSandboxStatus, ListContainers,
  // ContainerStatus: all that kplegd itself makes) over kpleg's own HTTP/2 connections
  // (h2_unary.h) instead of grpc++: a fraction of the CPU per call, and a kplegd whose calls
  // leave grpc++'s calls channel unused needs no gRPC backup poller (see kplegd's main.cc). Same
  // deadlines, slots, statistics, in-flight registry and cancellation as every other call.
  bool h2_read_calls = true;
};

// The gRPC channel's connectivity state.
enum class ConnectionState { kIdle, kConnecting, kReady, kTransientFailure, kShutdown };
std::string_view connection_state_name(ConnectionState state);

class GrpcCriClient final : public CriClient {
 public:
  // Validates the endpoint (unix:///path or /path) and starts connecting in the background;
  // it does not wait for the runtime, which may come up later.
  static Result<std::unique_ptr<GrpcCriClient>> create(std::string_view endpoint,
                                                       GrpcCriClientOptions options = {});
  ~GrpcCriClient() override;
  GrpcCriClient(const GrpcCriClient&) = delete;
  GrpcCriClient& operator=(const GrpcCriClient&) = delete;

  Result<v1::VersionResponse> version() override;
  Result<v1::RuntimeStatus> status() override;
  Result<std::map<std::string, std::string>> status_info() override;
  Result<std::vector<v1::PodSandbox>> list_pod_sandboxes(
      const v1::PodSandboxFilter& filter) override;
  Result<v1::PodSandboxStatus> pod_sandbox_status(const std::string& pod_sandbox_id) override;
  Result<std::vector<v1::Container>> list_containers(const v1::ContainerFilter& filter) override;
  Result<v1::ContainerStatus> container_status(const std::string& container_id) override;
  // With h2_read_calls: the status looks over one HTTP/2 connection of their own on the loop
  // (h2_unary_mux.h), counted in call_stats() and registered in flight like every call.
  std::unique_ptr<AsyncStatusCalls> async_status_calls(Reactor& reactor) override;

  Result<std::string> run_pod_sandbox(const v1::PodSandboxConfig& config,
                                      const std::string& runtime_handler = {}) override;
  Status stop_pod_sandbox(const std::string& pod_sandbox_id) override;
  Status remove_pod_sandbox(const std::string& pod_sandbox_id) override;
  Result<std::string> create_container(const std::string& pod_sandbox_id,
                                       const v1::ContainerConfig& config,
                                       const v1::PodSandboxConfig& sandbox_config) override;
  Status start_container(const std::string& container_id) override;
  Status stop_container(const std::string& container_id, int64_t grace_period_s) override;
  Status remove_container(const std::string& container_id) override;

  // Subscribes to the runtime's GetContainerEvents stream (containerd 1.7 and later) and hands
  // each event to `on_event`, on the caller's thread, until the stream ends, fails or `cancel`
  // is cancelled (from another thread); returns how it ended: UNIMPLEMENTED when the runtime
  // has no event stream (containerd 1.6), CANCELLED after cancel(). No deadline: the stream is
  // meant to stay open. Read on its own connection with nghttp2 (h2_stream.h), not grpc++.
  // Counted in call_stats() once, when it ends, with that status.
  Status container_events(CancelToken& cancel,
                          const std::function<void(v1::ContainerEventResponse&)>& on_event);

  // Ends every call in flight (CANCELLED) and makes every later call fail at once: a daemon
  // that shuts down must not wait for a full list's long deadline. The event stream is ended
  // by its own CancelToken. Irreversible.
  void cancel_calls();

  // Current channel state; never triggers a connection attempt itself.
  ConnectionState state() const;
  bool connected() const { return state() == ConnectionState::kReady; }
  // Returns to READY after a lost connection, as reported to on_reconnect.
  uint64_t reconnects() const { return reconnects_.load(std::memory_order_relaxed); }
  const CallStats& call_stats() const { return stats_; }
  // Calls made over kpleg's own HTTP/2 connections (h2_read_calls).
  uint64_t h2_calls() const { return h2_calls_.load(std::memory_order_relaxed); }
  size_t calls_in_flight() const { return slots_.in_use(); }
  // The gRPC target, "unix:///path".
  const std::string& target() const { return target_; }
  const GrpcCriClientOptions& options() const { return options_; }

 private:
  GrpcCriClient(std::string target, GrpcCriClientOptions options);
  void watch_connectivity();
  std::chrono::milliseconds list_timeout() const {
    return std::max(options_.list_timeout, options_.call_timeout);
  }
  // Counts the failed call and says what failed: "CRI <method> failed: <CODE>: <what>".
  Error failed(CriMethod method, int code, std::string_view what);
  template <typename Response, typename Body>
  Result<Response> guarded(CriMethod method, std::chrono::milliseconds timeout,
                           CallSubject subject, Body&& body);
  // One of the stub's unary calls, e.g. &Stub::ListContainers.
  template <typename Request, typename Response>
  using StubCall = grpc::Status (runtime::v1::RuntimeService::Stub::*)(grpc::ClientContext*,
                                                                        const Request&, Response*);
  // A call through the stub.
  template <typename Request, typename Response>
  Result<Response> invoke(CriMethod method, StubCall<Request, Response> rpc, const Request& request,
                          std::chrono::milliseconds timeout, CallSubject subject);
  // A call over h2_ (h2_unary.h).
  template <typename Response>
  Result<Response> invoke_h2(CriMethod method, const google::protobuf::MessageLite& request,
                             std::chrono::milliseconds timeout, CallSubject subject);
  // A read-only call: over h2_ with h2_read_calls, else through the stub.
  template <typename Request, typename Response>
  Result<Response> read(CriMethod method, StubCall<Request, Response> rpc, const Request& request,
                        std::chrono::milliseconds timeout, CallSubject subject);

  const std::string target_;
  const GrpcCriClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;        // the calls'
  std::shared_ptr<grpc::Channel> watch_channel_;  // the watcher's: a connection with no calls
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub_;
  CallSlots slots_;
  CallStats stats_;
  std::atomic<uint64_t> reconnects_{0};
  std::mutex calls_mu_;
  std::unordered_set<grpc::ClientContext*> calls_;  // in flight, under calls_mu_
  bool cancelled_ = false;                          // under calls_mu_
  std::unique_ptr<H2UnaryPool> h2_;  // with h2_read_calls
  std::atomic<uint64_t> h2_calls_{0};
  CancelToken h2_cancel_;            // cancel_calls() ends the calls over h2_
  std::mutex watch_mu_;  // the watcher's use of channel_ against its destruction
  bool stopping_ = false;  // guarded by watch_mu_
  grpc::CompletionQueue watch_cq_;
  std::thread watcher_;
};

}  // namespace kpleg::cri
