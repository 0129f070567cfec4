#include "support/scratch_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace kpleg::testing {

namespace fs = std::filesystem;

Result<ScratchCgroup> ScratchCgroup::create(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::from_errno(errno, "mkdir " + path);
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "stat " + path);
  return ScratchCgroup(path, st.st_ino);
}

Status ScratchCgroup::remove() {
  if (path_.empty()) return {};
  // Children first (deepest paths first).
  std::vector<std::string> dirs;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(path_, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (ec) break;
    if (it->is_directory(ec)) dirs.push_back(it->path());
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const auto& d : dirs) rmdir(d.c_str());
  if (rmdir(path_.c_str()) != 0 && errno != ENOENT) return Error::from_errno(errno, "rmdir " + path_);
  path_.clear();
  return {};
}

ScratchCgroup::~ScratchCgroup() { (void)remove(); }

}  // namespace kpleg::testing
