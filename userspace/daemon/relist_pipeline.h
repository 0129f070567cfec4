// Relist mode's pipeline: the generic relist (pleg/generic_relist.h), the kubelet's generic
// PLEG, polling the runtime every --relist-period. --mode=relist, and auto's fallback where the
// kernel path cannot start.
#pragma once

#include <memory>
#include <string>

#include "daemon/pipeline.h"

namespace kpleg::daemon {

// `fallback_reason`: why auto mode runs it ("" when relist mode was asked for), named in health.
std::unique_ptr<Pipeline> start_relist_pipeline(const PipelineContext& ctx,
                                                std::string fallback_reason);

}  // namespace kpleg::daemon
