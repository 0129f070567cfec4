// A cgroup the kernel refused to track because its pod is over its budget (--max-cgroups-per-pod,
// --max-cgroup-mkdirs-per-pod; reported at most once a second per pod by the kernel source): the
// pod named in the log, once per 30 s per pod, with how many of its cgroups went untracked. The
// count itself is a metric, read from the BPF program at scrape time.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cgroup/cgroup_index.h"
#include "kernel/kernel_source.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

class OverBudgetLog {
 public:
  // What names the pod: the index and the tracker; the program's budgets; the limits logged.
  OverBudgetLog(const cgroup::CgroupIndex& index, const pleg::Tracker& tracker,
                kernel::BpfKernelSource& kernel, const kernel::BpfOptions& limits)
      : index_(index), tracker_(tracker), kernel_(kernel), limits_(limits) {}

  // KernelSink::on_over_budget, on the kernel source's thread.
  void on_over_budget(const kernel::CgroupMkdir& mk);

 private:
  // The pod's uid: from the refused cgroup's parent (tracked, so the pod's or below it), else
  // from the path's own prefixes; "" when neither names one.
  std::string pod_uid_of(const kernel::CgroupMkdir& mk) const;
  // Whether `key` (a pod uid, or the path) was not logged in the last 30 s; notes it.
  bool due(const std::string& key);

  const cgroup::CgroupIndex& index_;
  const pleg::Tracker& tracker_;
  kernel::BpfKernelSource& kernel_;
  const kernel::BpfOptions& limits_;
  std::mutex mu_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> logged_;  // under mu_
};

}  // namespace kpleg::daemon
