// ebpf mode's pipeline, the kernel-driven PLEG: the kernel event source (BPF programs and the
// ring buffer's consumer), the cgroup index, the tracker that confirms the kernel's signals with
// the runtime (by looks, or by the runtime's event stream), the reconciler with the kernel path's
// upkeep after each of its runs (kernel_upkeep.h), the removal hints, and the over-budget log.
#pragma once

#include <memory>

#include "common/result.h"
#include "daemon/pipeline.h"

namespace kpleg::daemon {

// Fails when the kernel path cannot start here (BPF cannot load or attach, no cgroup2 tree):
// nothing of it is left running then.
Result<std::unique_ptr<Pipeline>> start_ebpf_pipeline(const PipelineContext& ctx);

}  // namespace kpleg::daemon
