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
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"

namespace kpleg::api {

// A bound on the API's long-lived streams (Watch and grpc.health Watch): each holds a sync server
// thread for as long as it is open, so an unbounded number would be unbounded threads.
// A stream whose client went away keeps its slot until its handler notices, which (without an
// event to write) is at its next look, up to a minute later: so a stream that finds every slot
// taken first has the open streams look at once (`reclaim`), and waits briefly for a slot.
class StreamSlots {
 public:
  explicit StreamSlots(size_t limit) : limit_(limit) {}
  bool try_take() {
    if (used_.fetch_add(1) >= limit_) {
      used_.fetch_sub(1);
      return false;
    }
    return true;
  }
  // Set before the server starts: wakes every open stream to look whether its client is gone.
  void set_reclaim(std::function<void()> fn) { reclaim_ = std::move(fn); }
  // try_take(), and when every slot is taken, reclaim and retry for up to `patience`.
  bool take(std::chrono::milliseconds patience = std::chrono::milliseconds(1000)) {
    if (try_take()) return true;
    if (!reclaim_) return false;
    reclaim_();
    const auto until = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (try_take()) return true;
    }
    return false;
  }
  void give() { used_.fetch_sub(1); }
  size_t limit() const { return limit_; }
  size_t used() const { return used_.load(); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
  std::function<void()> reclaim_;
};

// Holds one slot for a scope (taken: whether it got one).
class StreamSlot {
 public:
  explicit StreamSlot(StreamSlots* slots) : slots_(slots), taken_(slots == nullptr || slots->take()) {}
  ~StreamSlot() {
    if (slots_ != nullptr && taken_) slots_->give();
  }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  bool taken() const { return taken_; }

 private:
  StreamSlots* slots_;
  bool taken_;
};

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // `watch_poll`: how often an unchanged Watch looks whether its client went away.
  // `streams`: the slots every long-lived stream of the API takes one of (each holds a server
  // thread); null: unlimited.
  HealthService(std::chrono::milliseconds watch_poll, StreamSlots* streams = nullptr)
      : watch_poll_(watch_poll), streams_(streams) {}

  // Sets the status of `service` ("" is the server as a whole); Watches see the change.
  void set(const std::string& service, bool serving);
  // Ends every Watch, and any that starts later.
  void stop();
  // Has every Watch look now whether its client went away.
  void wake_watches();

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
  uint64_t version_ = 0;  // bumped on every change
  uint64_t wakes_ = 0;    // bumped by wake_watches()
  bool stopping_ = false;
};

}  // namespace kpleg::api
