#include "support/event_collector.h"

#include <algorithm>

namespace kpleg::testing {

using kernel::KernelEvent;

kernel::KernelSink EventCollector::sink() {
  kernel::KernelSink s;
  s.on_event = [this](const KernelEvent& ev) {
    {
      std::lock_guard lk(mu_);
      events_.push_back(ev);
    }
    cv_.notify_all();
  };
  s.on_loss = [this](uint64_t n) {
    {
      std::lock_guard lk(mu_);
      lost_ += n;
    }
    cv_.notify_all();
  };
  return s;
}

bool EventCollector::wait_for(const std::function<bool(const std::vector<KernelEvent>&)>& pred,
                              std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return pred(events_); });
}

bool EventCollector::wait_accounted(uint64_t n, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return events_.size() + lost_ >= n; });
}

std::vector<KernelEvent> EventCollector::events() const {
  std::lock_guard lk(mu_);
  return events_;
}

std::vector<KernelEvent> filter_cgroups(const std::vector<KernelEvent>& evs,
                                        const std::vector<uint64_t>& ids) {
  std::vector<KernelEvent> out;
  for (const auto& ev : evs) {
    if (std::find(ids.begin(), ids.end(), ev.cgroup_id()) != ids.end()) out.push_back(ev);
  }
  return out;
}

std::vector<KernelEvent> EventCollector::for_cgroups(const std::vector<uint64_t>& ids) const {
  std::lock_guard lk(mu_);
  return filter_cgroups(events_, ids);
}

uint64_t EventCollector::lost() const {
  std::lock_guard lk(mu_);
  return lost_;
}

size_t count_kind(const std::vector<KernelEvent>& evs, const std::string& kind) {
  return std::count_if(evs.begin(), evs.end(), [&](const auto& e) { return kind == e.kind(); });
}

}  // namespace kpleg::testing
