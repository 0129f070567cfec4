// Where the cgroup2 hierarchy is mounted. The cgroup ids kpleg tracks (bpf_get_current_cgroup_id,
// the cgroup_mkdir tracepoint's id on the cgroup2 root) are inode numbers of that hierarchy's
// directories, so both the kernel source and the CgroupIndex need its mount point.
#pragma once

#include <string>

#include "common/result.h"

namespace kpleg::cgroup {

// True when `path` is the root or a directory of a cgroup2 filesystem (statfs magic).
Result<bool> is_cgroup2(const std::string& path);

// `cgroup_base` itself when it is cgroup2 (unified hosts), else `<cgroup_base>/unified`
// (hybrid hosts: v1 controllers beside a cgroup2 tree without controllers). An Error with
// code ENOENT that names both paths when neither is cgroup2 (pure cgroup v1 hosts). The base
// is a parameter for daemons that see the host's tree under another mount point.
Result<std::string> find_cgroup2_mount(const std::string& cgroup_base = "/sys/fs/cgroup");

}  // namespace kpleg::cgroup
