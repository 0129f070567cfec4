// The consumer API's List answer (api::StateSnapshot: pods, each with its sandboxes and
// containers) from either pipeline's records: the tracker's containers (ebpf mode) or the
// relist's pod records (relist mode). The one place where kpleg's records become the API's.
#pragma once

#include <cstdint>
#include <vector>

#include "api/providers.h"
#include "pleg/containers.h"

namespace kpleg::daemon {

api::StateSnapshot snapshot_of(uint64_t seq, const std::vector<pleg::Observation>& containers);
api::StateSnapshot snapshot_of(uint64_t seq, std::vector<pleg::PodRecord> pods);

}  // namespace kpleg::daemon
