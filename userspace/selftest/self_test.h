// `kplegd --self-test`: checks the kernel event source on this node's kernel, for an operator
// before deploying and as the guest check of the VM kernel matrix (docs/vmtests.md). It loads
// and attaches the BPF programs under a private tracked root, makes a container-like cgroup,
// runs a process in it that execs again and exits with a known code, removes the cgroup, and
// checks the exact kernel events and counters. It runs /bin/sh and /bin/true, nothing else.
#pragma once

#include <string>
#include <vector>

#include "kernel/bpf_program.h"

namespace kpleg::selftest {

struct Report {
  bool passed = false;
  std::string kernel_release;
  std::vector<std::string> failures;  // one line per failed check, naming the check
};

// `base` are the BPF options kplegd would run with (its tracked roots are replaced by a private
// one); cgroup2 is found at `cgroup_base` or <cgroup_base>/unified.
Report run(const kernel::BpfOptions& base, const std::string& cgroup_base);

}  // namespace kpleg::selftest
