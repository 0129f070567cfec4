// ContainerEventFeed: kpleg's confirmed lifecycle events as the CRI's GetContainerEvents stream,
// for the kubelet's Evented PLEG, whether the runtime streams events of its own or not
// (containerd 1.6 does not). Fed from kplegd's event bus (kplegd --cri-listen) or by post()
// (kpleg-cri-relay, from kplegd's API); the statuses are built the same way for both.
//
// Every event carries what a kubelet requires of one (pkg/kubelet/pleg/evented.go):
//   - a non-nil pod_sandbox_status with metadata and the pod uid, even for a pod that is gone
//     (its last known status, else one built from the event: NOTREADY);
//   - created_at in nanoseconds, strictly increasing per pod (the kubelet's pod cache ignores
//     a status older than the one it holds);
//   - containers_statuses: the complete, current list of the pod's containers, as the runtime
//     reports them (the kubelet up to 1.36 replaces its cache of the pod with it: a container
//     left out would vanish from the kubelet's view);
//   - STARTED for ContainerStarted, STOPPED for ContainerDied, DELETED for ContainerRemoved;
//     for a sandbox, container_id is the sandbox id. Nothing else is sent (CREATED gives the
//     kubelet no event).
// Building one costs the calls the kubelet's own relist makes for a changed pod (ListPodSandbox
// and ListContainers of the pod, PodSandboxStatus, ContainerStatus of each container), made
// only while somebody subscribes. They run per pod in order on a small pool (PodWorkQueue), so
// a pod whose calls hang delays its own events only, and strictly in order within a pod: an
// event whose build is retried holds the pod's later events behind it (a STOPPED never goes
// out before its STARTED). Events waiting for their build are bounded (max_queued): past it
// an event is dropped and counted, and the kubelet's own relist catches up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "bus/event_bus.h"
#include "common/result.h"
#include "cri/cri_client.h"
#include "pleg/event.h"
#include "pleg/pod_work_queue.h"

namespace kpleg::criendpoint {

namespace v1 = ::runtime::v1;

// One subscriber: gets each serialized ContainerEventResponse, in order. deliver() must not
// block; it is called from the feed's workers.
class EventReceiver {
 public:
  virtual ~EventReceiver() = default;
  virtual void deliver(std::shared_ptr<const std::string> message) = 0;
};

// What the feed remembers of a pod between its events.
struct PodMemory {
  v1::PodSandboxStatus sandbox;  // the last sandbox status read (empty id: none yet)
  int64_t last_created_at = 0;
  // When its sandbox was removed (realtime ns; 0: not yet). The memory outlives the sandbox a
  // while: its containers' removals are often reported after it.
  int64_t sandbox_removed_at = 0;
  bool in_use = false;  // a task is building with it (guarded by the feed's lock)
};

// Builds the CRI event for one lifecycle event (see above); `memory` is the pod's. Returns
// nothing for events the CRI stream does not carry. Errors are CRI call failures other than
// NOT_FOUND (a container or sandbox removed meanwhile is simply not listed).
Result<std::optional<v1::ContainerEventResponse>> build_container_event(
    cri::CriClient& cri, const pleg::PodLifecycleEvent& ev, PodMemory& memory, int64_t now_ns);

// The same event as a hint, with no CRI call: the sandbox status carries only what kpleg's event
// knows (the pod's metadata, the sandbox id for a sandbox's own events, NOTREADY once the
// sandbox died), and no container statuses. Enough for a kubelet 1.37, which only takes STOPPED
// with the pod uid as a cue to relist the pod; a kubelet 1.36 needs the full event.
std::optional<v1::ContainerEventResponse> hint_container_event(const pleg::PodLifecycleEvent& ev,
                                                               PodMemory& memory, int64_t now_ns);

struct ContainerEventFeedOptions {
  // false: hints only (hint_container_event), no CRI call per event.
  bool full_statuses = true;
  size_t workers = 4;
  // A failed build is retried this often, this far apart, before the event is dropped (and
  // counted): the kubelet's own relist (every 300 s in evented mode) then catches it up.
  int attempts = 3;
  std::chrono::milliseconds retry_after{500};
  // Events waiting for their build, all pods together.
  size_t max_queued = 4096;
};

struct ContainerEventFeedStats {
  uint64_t subscribers = 0;
  uint64_t sent = 0;        // events built and handed to the subscribers
  uint64_t dropped = 0;     // events that could not be built after every attempt
  uint64_t overflowed = 0;  // events dropped because max_queued were waiting
  uint64_t queued = 0;      // waiting now
};

class ContainerEventFeed {
 public:
  // Fed by post() only.
  explicit ContainerEventFeed(cri::CriClient& cri, ContainerEventFeedOptions options = {});
  // Also follows `bus` from start() on.
  ContainerEventFeed(cri::CriClient& cri, bus::EventBus& bus,
                     ContainerEventFeedOptions options = {});
  ~ContainerEventFeed();
  ContainerEventFeed(const ContainerEventFeed&) = delete;
  ContainerEventFeed& operator=(const ContainerEventFeed&) = delete;

  void start();
  void stop();

  // One lifecycle event, in the pod's order; events the CRI stream does not carry, and every
  // event while nobody subscribes, are ignored. Never blocks.
  void post(bus::EventPtr ev);

  // Events published after this call go to `receiver` until remove() returns.
  uint64_t add(std::shared_ptr<EventReceiver> receiver);
  void remove(uint64_t id);

  ContainerEventFeedStats stats() const;

 private:
  void follow_bus();
  void drain(const std::string& pod_uid, int attempt);
  // false: try again later.
  bool build_and_send(const bus::EventPtr& ev, int attempt);

  cri::CriClient& cri_;
  bus::EventBus* bus_;
  ContainerEventFeedOptions options_;
  pleg::PodWorkQueue queue_;
  std::thread follower_;
  std::shared_ptr<bus::Subscription> sub_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<EventReceiver>> receivers_;
  std::map<std::string, PodMemory> pods_;  // by pod uid; entries touched only by the pod's tasks
  // Events waiting, by pod uid; the front one is being built (one drain task per pod).
  std::map<std::string, std::deque<bus::EventPtr>> waiting_;
  size_t queued_ = 0;
  uint64_t built_ = 0;  // guarded by mu_; sweeps pods_ every so often
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> overflowed_{0};
};

}  // namespace kpleg::criendpoint
