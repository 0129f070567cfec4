// grpc.health.v1.Health, served by the sync server's own threads. gRPC's built-in health
// service (EnableDefaultHealthCheckService) uses the callback API, which starts gRPC's
// "nexting" threads; those poll the process-wide epoll set, so they woke an idle daemon about
// four times a second and, under churn, took over reading the CRI client's responses, a thread
// hand-off per call. This one has no thread of its own: Check answers from the last status, and
// a Watch waits for a change on its handler's thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "api/stream_slots.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kpleg::api {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // `watch_poll`: how often an unchanged Watch looks whether its client went away.
  // `streams`: the slots every long-lived stream of the API takes one of (each holds a server
  // thread); null: unlimited.
  HealthService(std::chrono::milliseconds watch_poll, StreamSlots* streams = nullptr)
      : watch_poll_(watch_poll), streams_(streams) {}

  // Sets the status of `service` ("" is the server as a whole); Watches see the change.
  void set(const std::string& service, bool serving);
  // A Check of `service` calls `serving` (quick, thread-safe) instead of answering the last
  // status set: a liveness probe must not pass on a status a stuck thread set long ago. Watches
  // still follow set(). Set before the server serves.
  void set_evaluated(const std::string& service, std::function<bool()> serving);
  // Ends every Watch, and any that starts later.
  void stop();
  // Has every open Watch check now whether its client went away (StreamSlots' reclaim hook).
  void wake_watches();

  // The status a Watch of `service` reports now: SERVICE_UNKNOWN for one never set.
  grpc::health::v1::HealthCheckResponse::ServingStatus current(const std::string& service) const;

  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status status_of(const std::string& service) const;  // caller holds mu_

  const std::chrono::milliseconds watch_poll_;
  StreamSlots* streams_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, bool> serving_;
  std::map<std::string, std::function<bool()>> evaluated_;
  uint64_t version_ = 0;  // bumped on every change
  uint64_t wakes_ = 0;    // bumped by wake_watches()
  bool stopping_ = false;
};

// RESOURCE_EXHAUSTED, saying which bound, for a health Watch that got no stream slot; else OK.
grpc::Status health_watch_slot_refusal(const StreamSlot& slot, const StreamSlots& slots);

}  // namespace kpleg::api
