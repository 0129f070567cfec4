// A KernelSource sink that keeps every kernel event it is given, for tests to wait on and look
// through: the BPF tests assert on exact event sequences of the cgroups they made.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kernel/kernel_source.h"

namespace kpleg::testing {

class EventCollector {
 public:
  kernel::KernelSink sink();
  // Waits until `pred` holds over the collected events or the timeout passes (woken by each
  // event, not polled).
  bool wait_for(const std::function<bool(const std::vector<kernel::KernelEvent>&)>& pred,
                std::chrono::milliseconds timeout);
  // Waits until received events plus reported losses reach `n`.
  bool wait_accounted(uint64_t n, std::chrono::milliseconds timeout);
  std::vector<kernel::KernelEvent> events() const;
  // Events whose cgroup id is in `ids`, in arrival order.
  std::vector<kernel::KernelEvent> for_cgroups(const std::vector<uint64_t>& ids) const;
  uint64_t lost() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<kernel::KernelEvent> events_;
  uint64_t lost_ = 0;
};

// Counts events of one kind (e.g. "exec") among `evs`.
size_t count_kind(const std::vector<kernel::KernelEvent>& evs, const std::string& kind);
// The events of `evs` whose cgroup id is in `ids`, in order.
std::vector<kernel::KernelEvent> filter_cgroups(const std::vector<kernel::KernelEvent>& evs,
                                                const std::vector<uint64_t>& ids);

}  // namespace kpleg::testing
