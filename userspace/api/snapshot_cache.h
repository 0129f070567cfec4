// The node's state as List answers it. Building a snapshot takes the pipeline's state lock and
// copies every container, so List loops on several connections would each contend with the event
// path. Here one List builds at a time and the others wait for it and share the result; a snapshot
// is answered again while no event was published since it was taken and it is at most `max_age`
// old. The age bound is for the changes that publish no event (a pod's name learnt late, a
// removed container forgotten after its retention): they show within `max_age`, as they would
// not on the Watch stream at all. So the pipeline sees at most one snapshot per event or per
// `max_age`, however many consumers List.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "api/providers.h"
#include "bus/event_bus.h"

namespace kpleg::api {

class SnapshotCache {
 public:
  using Clock = std::chrono::steady_clock;
  SnapshotCache(StateProvider& state, bus::EventBus& bus,
                std::chrono::milliseconds max_age = std::chrono::milliseconds(100))
      : state_(state), bus_(bus), max_age_(max_age) {}

  std::shared_ptr<const StateSnapshot> get() {
    std::lock_guard l(mu_);
    const auto now = Clock::now();
    if (!last_ || last_->seq != bus_.last_seq() || now - taken_at_ > max_age_) {
      last_ = std::make_shared<const StateSnapshot>(state_.snapshot());
      taken_at_ = now;
      built_.fetch_add(1, std::memory_order_relaxed);
    }
    return last_;
  }
  // Snapshots taken from the provider so far.
  uint64_t built() const { return built_.load(std::memory_order_relaxed); }

 private:
  StateProvider& state_;
  bus::EventBus& bus_;
  const std::chrono::milliseconds max_age_;
  std::mutex mu_;  // never taken by the event path
  std::shared_ptr<const StateSnapshot> last_;
  Clock::time_point taken_at_;
  std::atomic<uint64_t> built_{0};
};

}  // namespace kpleg::api
