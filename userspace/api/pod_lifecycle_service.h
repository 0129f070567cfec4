// kpleg.v1.PodLifecycle's handlers: List, Stats and InflightCalls answer from the daemon's
// providers (pod_lifecycle_service.cc); Watch streams the EventBus, one subscription per stream
// on a server thread of its own, bounded by the stream slots (watch.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "api/cut_off_reaper.h"
#include "api/health_service.h"
#include "api/providers.h"
#include "api/snapshot_cache.h"
#include "bus/event_bus.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace kpleg::api {

class PodLifecycleService final : public v1::PodLifecycle::Service {
 public:
  PodLifecycleService(bus::EventBus& bus, StateProvider& state, HealthProvider& health,
                      StatsProvider& stats, StreamSlots& streams,
                      std::chrono::milliseconds cut_off_grace)
      : bus_(bus),
        snapshots_(state, bus),
        health_(health),
        stats_(stats),
        streams_(streams),
        cut_off_grace_(cut_off_grace) {}

  uint64_t cut_off_watches_cancelled() const { return reaper_.cancelled(); }
  // Snapshots List has taken from the StateProvider.
  uint64_t snapshots_built() const { return snapshots_.built(); }
  size_t open_watches();
  // Has every open Watch check now whether its client went away (StreamSlots' reclaim hook):
  // an idle one otherwise looks only every kWatchPoll.
  void wake_watches();
  // Ends every open Watch at once, and any Watch that starts later.
  void stop();

  grpc::Status List(grpc::ServerContext*, const v1::ListRequest* req,
                    v1::ListResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override;
  grpc::Status InflightCalls(grpc::ServerContext*, const v1::InflightCallsRequest* req,
                             v1::InflightCallsResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::Event>* writer) override;

 private:
  struct OpenWatch;

  bus::EventBus& bus_;
  SnapshotCache snapshots_;  // List's view of the StateProvider
  HealthProvider& health_;
  StatsProvider& stats_;
  StreamSlots& streams_;
  const std::chrono::milliseconds cut_off_grace_;
  CutOffReaper reaper_;
  std::atomic<bool> stopping_{false};
  std::mutex open_mu_;
  std::unordered_set<bus::Subscription*> open_;
};

// The filters' bounds: a pod UID is 36 characters, a namespace a DNS label of at most 63, an
// instance id 32 hex digits. A longer one is a client's mistake, said as such.
grpc::Status check_filters(const std::string& pod_uid, const std::string& pod_namespace,
                           const std::string* instance_id = nullptr);

// Where a Watch starts in the bus of instance `instance_id` (watch.cc): from_seq read with the
// request's instance id, as docs/api.md says.
uint64_t watch_position(const v1::WatchRequest& req, const std::string& instance_id);
// RESOURCE_EXHAUSTED, saying which bound, for a Watch that got no stream slot; else OK.
grpc::Status watch_slot_refusal(const StreamSlot& slot, const StreamSlots& slots);

}  // namespace kpleg::api
