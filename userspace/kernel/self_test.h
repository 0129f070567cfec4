// Exercising the kernel source against the real kernel: scratch cgroups, processes started
// inside them, and an event collector to wait on. Used by `kplegd --self-test` (the guest check
// of the VM kernel matrix) and by the BPF tests, so both assert the same behaviour.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "kernel/kernel_source.h"

namespace kpleg::kernel {

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

// Forks a child that moves itself into `cgroup_dir` and execs argv. Returns its pid.
Result<pid_t> spawn_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv);
// Waits for a child and returns its wait status.
Result<int> wait_child(pid_t pid);
// spawn + wait.
Result<int> run_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv);

// Collects kernel events from a KernelSource sink; tests wait on it with a deadline.
class EventCollector {
 public:
  KernelSink sink();
  // Waits until `pred` holds over the collected events or the deadline passes.
  bool wait_for(const std::function<bool(const std::vector<KernelEvent>&)>& pred,
                std::chrono::milliseconds timeout);
  // Waits until received events plus reported losses reach `n`.
  bool wait_accounted(uint64_t n, std::chrono::milliseconds timeout);
  std::vector<KernelEvent> events() const;
  // Events whose cgroup id is in `ids`, in arrival order.
  std::vector<KernelEvent> for_cgroups(const std::vector<uint64_t>& ids) const;
  uint64_t lost() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<KernelEvent> events_;
  uint64_t lost_ = 0;
};

// Counts events of one kind (e.g. "exec") among `evs`.
size_t count_kind(const std::vector<KernelEvent>& evs, const std::string& kind);
// The events of `evs` whose cgroup id is in `ids`, in order.
std::vector<KernelEvent> filter_cgroups(const std::vector<KernelEvent>& evs,
                                        const std::vector<uint64_t>& ids);

struct SelfTestResult {
  bool passed = false;
  std::string kernel_release;
  std::vector<std::string> failures;  // one line per failed check, naming the check
};

// Loads and attaches the programs under a private tracked root, makes a container-like cgroup,
// runs a process in it that execs again and exits with a known code, removes the cgroup, and
// checks the exact kernel events and counters.
SelfTestResult run_self_test(const BpfOptions& base, const std::string& cgroup_base);

}  // namespace kpleg::kernel
