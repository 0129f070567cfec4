// The cri component owns kpleg's conversation with the node's container runtime over the CRI
// (runtime.v1): the CriClient interface every other component calls, its gRPC implementation
// (grpc_cri_client.h) with deadlines, bounded concurrency and reconnects, and the call counters
// exported as metrics. It is the only place that knows gRPC stubs of the runtime exist.
//
// Results are the CRI's own proto messages; a failed call is an Error whose code is the
// grpc::StatusCode and whose message names the CRI method and carries the runtime's message.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/status_code_enum.h>

#include "common/result.h"
#include "cri/api.pb.h"

namespace kpleg::cri {

namespace v1 = ::runtime::v1;

class Reactor;  // reactor.h

// The read-only status looks made without blocking, on an event loop: each answer (or failure,
// within the client's call deadline) is handed to `done` on the loop's thread.
class AsyncStatusCalls {
 public:
  template <typename T>
  using Done = std::function<void(Result<T>)>;
  virtual ~AsyncStatusCalls() = default;
  virtual void container_status(const std::string& container_id,
                                Done<v1::ContainerStatus> done) = 0;
  virtual void pod_sandbox_status(const std::string& pod_sandbox_id,
                                  Done<v1::PodSandboxStatus> done) = 0;
  // The ids the runtime lists (ListContainers, or ListPodSandbox when `sandboxes`; unfiltered),
  // with only the ids decoded. False: not served this way (`done` is not called; the caller
  // lists with the blocking client).
  virtual bool list_ids(bool sandboxes, Done<std::vector<std::string>> done) {
    (void)sandboxes;
    (void)done;
    return false;
  }
  // The runtime's GetContainerEvents stream on the loop (as GrpcCriClient::container_events):
  // each event to `on_event`, then how it ended to `on_end` (once). The stream ends, without
  // on_end, when the handle returned is destroyed. nullptr: not served this way.
  class Stream {
   public:
    virtual ~Stream() = default;
    // Reads nothing until `until` (what comes waits, and is handed on together), or until
    // resume(); on the loop, also from `on_event`. A stream that cannot does nothing.
    virtual void hold(std::chrono::steady_clock::time_point until) { (void)until; }
    virtual void resume() {}
    // Hands on now what has come, held or not (on the loop, not from `on_event`).
    virtual void read_queued() {}
  };
  virtual std::unique_ptr<Stream> container_events(
      std::function<void(v1::ContainerEventResponse&)> on_event,
      std::function<void(Status)> on_end) {
    (void)on_event;
    (void)on_end;
    return nullptr;
  }
};

class CriClient {
 public:
  virtual ~CriClient() = default;

  // Runtime identity; also the cheapest "is the runtime answering" probe.
  virtual Result<v1::VersionResponse> version() = 0;
  // RuntimeReady / NetworkReady conditions.
  virtual Result<v1::RuntimeStatus> status() = 0;
  // Status with verbose=true: the runtime's own information, by key (containerd: "config", a
  // JSON document with its "rootDir" and "stateDir"). Runtimes may answer with nothing.
  virtual Result<std::map<std::string, std::string>> status_info() {
    return Error{grpc::StatusCode::UNIMPLEMENTED, "Status(verbose): not implemented"};
  }

  // The status looks on `reactor`'s loop, used on its thread only, for as long as the loop
  // runs (destroyed before it, or after it stopped). nullptr: this client has none (the caller
  // makes the blocking calls off its loop).
  virtual std::unique_ptr<AsyncStatusCalls> async_status_calls(Reactor& reactor) {
    (void)reactor;
    return nullptr;
  }

  // Pass a default-constructed filter to list everything.
  virtual Result<std::vector<v1::PodSandbox>> list_pod_sandboxes(
      const v1::PodSandboxFilter& filter) = 0;
  virtual Result<v1::PodSandboxStatus> pod_sandbox_status(const std::string& pod_sandbox_id) = 0;
  virtual Result<std::vector<v1::Container>> list_containers(const v1::ContainerFilter& filter) = 0;
  // A missing container is an Error with code grpc::StatusCode::NOT_FOUND.
  virtual Result<v1::ContainerStatus> container_status(const std::string& container_id) = 0;

  // Workload calls, as the kubelet makes them. kplegd never calls these; kpleg-load and the
  // tests do. Each returns the id the runtime assigned.
  // `runtime_handler`: the runtime configuration to run it with (RuntimeClass); "" the default.
  virtual Result<std::string> run_pod_sandbox(const v1::PodSandboxConfig& config,
                                              const std::string& runtime_handler = {}) = 0;
  virtual Status stop_pod_sandbox(const std::string& pod_sandbox_id) = 0;
  virtual Status remove_pod_sandbox(const std::string& pod_sandbox_id) = 0;
  virtual Result<std::string> create_container(const std::string& pod_sandbox_id,
                                               const v1::ContainerConfig& config,
                                               const v1::PodSandboxConfig& sandbox_config) = 0;
  virtual Status start_container(const std::string& container_id) = 0;
  // grace_period_s: seconds between the stop signal and SIGKILL; 0 kills at once.
  virtual Status stop_container(const std::string& container_id, int64_t grace_period_s) = 0;
  virtual Status remove_container(const std::string& container_id) = 0;
};

}  // namespace kpleg::cri
