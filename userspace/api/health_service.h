// grpc.health.v1.Health, served by the sync server's own threads. gRPC's built-in health
// service (EnableDefaultHealthCheckService) uses the callback API, which starts gRPC's
// "nexting" threads; those poll the process-wide epoll set, so they woke an idle daemon about
// four times a second and, under churn, took over reading the CRI client's responses, a thread
// hand-off per call. This one has no thread of its own: Check answers from the last status, and
// a Watch waits for a change on its handler's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace kpleg::api {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // `watch_poll`: how often an unchanged Watch looks whether its client went away.
  explicit HealthService(std::chrono::milliseconds watch_poll) : watch_poll_(watch_poll) {}

  // Sets the status of `service` ("" is the server as a whole); Watches see the change.
  void set(const std::string& service, bool serving);
  // Ends every Watch, and any that starts later.
  void stop();

  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status status_of(const std::string& service) const;  // caller holds mu_

  const std::chrono::milliseconds watch_poll_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, bool> serving_;
  uint64_t version_ = 0;  // bumped on every change
  bool stopping_ = false;
};

}  // namespace kpleg::api
