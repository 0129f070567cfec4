// KplegdFollower: kplegd's lifecycle events, read from its API (docs/api.md: List, then Watch
// from the List's seq) by kpleg-cri-relay, for the container event feed. kplegd may be down,
// restarting or slow to start: the follower then waits, asleep (gRPC's reconnect backoff, at
// most max_reconnect_backoff apart), and nothing else in the relay notices. When kplegd comes
// back it is listed again: the same instance resumes its stream from the last seq (a RESYNC if
// its history no longer holds it); for a new instance, or after a RESYNC, every container whose
// state differs from what the follower last knew (started, died or removed meanwhile) is posted
// as a catch-up event (source RECONCILE, correction), so the pods that changed in the gap reach
// the kubelet.
//
// What it knows of the node (pod -> container -> state, from the List and the events since)
// also names the pod of a container id for the stuck-call watchdog.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bus/event_bus.h"
#include "cri/inflight_calls.h"
#include "kpleg/v1/pleg.pb.h"

namespace kpleg::relay {

struct KplegdFollowerOptions {
  std::string socket_path;  // kplegd's API socket
  std::chrono::milliseconds max_reconnect_backoff{1000};
};

struct KplegdFollowerStats {
  bool connected = false;
  std::string instance_id;
  uint64_t events = 0;           // events from kplegd
  uint64_t catch_up_events = 0;  // posted after a RESYNC for what changed in the gap
  uint64_t resyncs = 0;
  uint64_t disconnects = 0;
};

class KplegdFollower {
 public:
  using Sink = std::function<void(bus::EventPtr)>;
  KplegdFollower(KplegdFollowerOptions options, Sink sink);
  ~KplegdFollower();
  KplegdFollower(const KplegdFollower&) = delete;
  KplegdFollower& operator=(const KplegdFollower&) = delete;

  void start();
  void stop();
  KplegdFollowerStats stats() const;
  // The pod a container or sandbox id belongs to, as far as the follower knows.
  std::optional<cri::CallSubject> identify(const cri::CallSubject& subject) const;

  // The catch-up for a new List: what differs from what was known, as events, in the pods' and
  // containers' order; `known` becomes the List. Exposed for tests.
  struct ContainerKnown {
    std::string name;
    bool sandbox = false;
    kpleg::v1::ContainerState state = kpleg::v1::CONTAINER_STATE_UNSPECIFIED;
  };
  struct PodKnown {
    std::string name, pod_namespace;
    std::map<std::string, ContainerKnown> containers;  // by id
  };
  using Known = std::map<std::string, PodKnown>;  // by pod uid
  static std::vector<pleg::PodLifecycleEvent> catch_up(Known& known,
                                                       const kpleg::v1::ListResponse& list);
  static void apply(Known& known, const pleg::PodLifecycleEvent& ev);

 private:
  void run();
  // false: stopping.
  bool list(kpleg::v1::ListResponse* out);
  void watch();

  KplegdFollowerOptions options_;
  Sink sink_;
  std::shared_ptr<grpc::Channel> channel_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  grpc::ClientContext* call_ = nullptr;  // the call in progress, for stop()
  Known known_;
  bool have_baseline_ = false;
  std::string instance_id_;
  uint64_t last_seq_ = 0;
  KplegdFollowerStats stats_;
};

}  // namespace kpleg::relay
