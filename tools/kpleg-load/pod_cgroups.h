// Pod-level cgroups are created by runc when the sandbox starts but never removed by the
// runtime: on a node the kubelet deletes them after RemovePodSandbox. kpleg-load stands in for
// the kubelet, so it deletes them too.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace kpleg::load {

// Removes /kubepods[/<qos>]/pod<uid> from every cgroup hierarchy under cgroup_root (each v1
// controller and the cgroup2 tree). Directories still busy (runc finishing a container's
// teardown) are retried until `wait` has passed. Returns the directories removed.
Result<std::vector<std::string>> remove_pod_cgroups(
    std::string_view pod_uid, std::chrono::milliseconds wait,
    const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace kpleg::load
