#include "kpleg-load/pod_cgroups.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

namespace kpleg::load {

Result<std::vector<std::string>> remove_pod_cgroups(std::string_view pod_uid,
                                                    std::chrono::milliseconds wait,
                                                    const std::string& cgroup_root) {
  namespace fs = std::filesystem;
  std::vector<std::string> hierarchies{cgroup_root};  // a pure cgroup2 host mounts it here
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cgroup_root, ec)) {
    // cpu -> cpu,cpuacct and friends are symlinks to hierarchies already listed.
    if (entry.is_directory(ec) && !entry.is_symlink(ec)) hierarchies.push_back(entry.path());
  }
  std::vector<std::string> candidates;
  const std::string pod_dir = "pod" + std::string(pod_uid);
  for (const auto& h : hierarchies) {
    for (const char* parent : {"/kubepods/", "/kubepods/burstable/", "/kubepods/besteffort/"}) {
      std::string path = h + parent + pod_dir;
      if (fs::is_directory(path, ec)) candidates.push_back(std::move(path));
    }
  }

  std::vector<std::string> removed;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (const auto& path : candidates) {
    for (;;) {
      if (::rmdir(path.c_str()) == 0 || errno == ENOENT) {
        removed.push_back(path);
        break;
      }
      int err = errno;
      if (err != EBUSY || std::chrono::steady_clock::now() >= deadline) {
        return Error::from_errno(err, "removing pod cgroup " + path);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // retry pacing, not sync
    }
  }
  return removed;
}

}  // namespace kpleg::load
