// Cgroups and processes made for a test: a cgroup2 directory removed (with any children) when
// it goes away, and a child process started inside a cgroup. The BPF tests, the fault tests
// and the BPF cost benchmark make their container-like cgroups with these.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cgroup/cgroup_process.h"
#include "common/result.h"

namespace kpleg::testing {

// A cgroup2 directory made for the test and removed (with any children) when it goes away.
class ScratchCgroup {
 public:
  static Result<ScratchCgroup> create(const std::string& path);
  ScratchCgroup(ScratchCgroup&& o) noexcept : path_(std::move(o.path_)), id_(o.id_) { o.path_.clear(); }
  ScratchCgroup& operator=(ScratchCgroup&&) = delete;
  ScratchCgroup(const ScratchCgroup&) = delete;
  ~ScratchCgroup();

  const std::string& path() const { return path_; }
  uint64_t id() const { return id_; }
  Status remove();  // rmdir now (it must be empty of processes)

 private:
  ScratchCgroup(std::string path, uint64_t id) : path_(std::move(path)), id_(id) {}
  std::string path_;
  uint64_t id_;
};

// Running a program inside a cgroup (userspace/cgroup/cgroup_process.h), under the names the
// tests know.
using cgroup::run_in_cgroup;
using cgroup::spawn_in_cgroup;
using cgroup::wait_child;

}  // namespace kpleg::testing
