// The kernel path's upkeep after each reconcile (on the reconciler's thread, with the runtime's
// view the reconcile listed):
//  - resync: the cgroup index and the kernel's tracked-cgroup map catch up with the tree
//    (cgroups the map had no room for, entries of vanished cgroups, what lost records hid);
//  - coverage: the running containers the kernel path does not see (no cgroup of theirs on this
//    host, not below a tracked root, not tracked), counted in a metric, named in health and the
//    log when their number goes from none to some and back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cgroup/cgroup_index.h"
#include "daemon/pipeline.h"
#include "kernel/kernel_source.h"
#include "pleg/runtime_view.h"

namespace kpleg::daemon {

class KernelUpkeep {
 public:
  KernelUpkeep(const PipelineContext& ctx, kernel::BpfKernelSource& kernel,
               cgroup::CgroupIndex& index)
      : ctx_(ctx), kernel_(kernel), index_(index) {}

  void after_reconcile(const std::vector<pleg::RuntimeContainer>& view) {
    resync();
    check_coverage(view);
  }

 private:
  void resync();
  void check_coverage(const std::vector<pleg::RuntimeContainer>& view);
  // Why a running container's cgroup (indexed or not) is not tracked.
  std::string why_not_tracked(std::optional<uint64_t> cgroup, const kernel::KernelSourceStats& ks);

  const PipelineContext& ctx_;
  kernel::BpfKernelSource& kernel_;
  cgroup::CgroupIndex& index_;
  uint64_t lost_at_last_resync_ = 0;  // the reconciler's thread only
};

}  // namespace kpleg::daemon
