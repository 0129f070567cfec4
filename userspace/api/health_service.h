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

#include "grpc/health/v1/health.grpc.pb.h"

namespace kpleg::api {

// A bound on the API's long-lived streams (Watch and grpc.health Watch): each holds a sync server
// thread for as long as it is open, so an unbounded number would be unbounded threads.
//
// A stream whose client cancelled it keeps its slot until its handler notices, and an idle
// handler looks only once a minute (so that an idle daemon does not wake up). Without more,
// a client that opens and cancels streams (a consumer reconnecting, kplegctl runs) would have the
// next stream refused RESOURCE_EXHAUSTED for up to a minute although none of its streams is open
// any more. So when no slot is free, take() first has the open streams look at their clients
// now (the reclaim hook) and waits a moment for the ones that went away to give theirs back.
class StreamSlots {
 public:
  explicit StreamSlots(size_t limit) : limit_(limit) {}
  // `reclaim` asks every open stream to check at once whether its client went away; set before
  // the server serves.
  void set_reclaim(std::function<void()> reclaim) { reclaim_ = std::move(reclaim); }
  // Takes a slot: at once when one is free; otherwise after the reclaim hook freed one, waiting
  // at most `wait`. False: every slot is held by a stream whose client is still there.
  bool take(std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    std::unique_lock l(mu_);
    for (;;) {
      if (used_ < limit_) {
        ++used_;
        return true;
      }
      if (!reclaim_ || std::chrono::steady_clock::now() >= deadline) return false;
      // Asked again every few milliseconds: a cancellation still on its way to the server when
      // the streams looked is seen at the next round.
      l.unlock();
      reclaim_();
      l.lock();
      freed_.wait_until(l, std::min(deadline, std::chrono::steady_clock::now() + kReclaimRound),
                        [&] { return used_ < limit_; });
    }
  }
  void give() {
    {
      std::lock_guard l(mu_);
      --used_;
    }
    freed_.notify_one();
  }
  size_t limit() const { return limit_; }
  size_t used() const {
    std::lock_guard l(mu_);
    return used_;
  }

  // How long a stream waits for a slot to come back from a cancelled stream before it is refused.
  static constexpr std::chrono::milliseconds kReclaimWait{200};

 private:
  static constexpr std::chrono::milliseconds kReclaimRound{5};
  const size_t limit_;
  std::function<void()> reclaim_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  size_t used_ = 0;
};

// Holds one slot for a scope (taken: whether it got one).
class StreamSlot {
 public:
  explicit StreamSlot(StreamSlots* slots)
      : slots_(slots), taken_(slots == nullptr || slots->take(StreamSlots::kReclaimWait)) {}
  ~StreamSlot() { release(); }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  bool taken() const { return taken_; }
  // Gives the slot back before the scope ends (a cut-off Watch still unwinding); idempotent,
  // safe from another thread.
  void release() {
    if (slots_ != nullptr && taken_ && !released_.exchange(true)) slots_->give();
  }

 private:
  StreamSlots* slots_;
  bool taken_;
  std::atomic<bool> released_{false};
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
  // A Check of `service` calls `serving` (quick, thread-safe) instead of answering the last
  // status set: a liveness probe must not pass on a status a stuck thread set long ago. Watches
  // still follow set(). Set before the server serves.
  void set_evaluated(const std::string& service, std::function<bool()> serving);
  // Ends every Watch, and any that starts later.
  void stop();
  // Has every open Watch check now whether its client went away (StreamSlots' reclaim hook).
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
  std::map<std::string, std::function<bool()>> evaluated_;
  uint64_t version_ = 0;  // bumped on every change
  uint64_t wakes_ = 0;    // bumped by wake_watches()
  bool stopping_ = false;
};

}  // namespace kpleg::api
