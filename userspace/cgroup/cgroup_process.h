// Running a program inside a cgroup from its first instruction: the child joins the cgroup
// (writes "0" to its cgroup.procs) before it execs, so its exec and exit happen there. Used by
// `kplegd --self-test` and by the tests that make container-like cgroups of their own.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"

namespace kpleg::cgroup {

// Forks a child that moves itself into `cgroup_dir` and execs argv[0] (a path) with argv.
// Returns its pid; the child exits 126 if it could not join the cgroup, 127 if exec failed.
Result<pid_t> spawn_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv);
// Waits for a child (retrying on EINTR) and returns its wait status.
Result<int> wait_child(pid_t pid);
// spawn_in_cgroup, then wait_child.
Result<int> run_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv);

}  // namespace kpleg::cgroup
