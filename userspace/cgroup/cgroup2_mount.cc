#include "cgroup/cgroup2_mount.h"

#include <linux/magic.h>
#include <sys/vfs.h>

#include <cerrno>

namespace kpleg::cgroup {

Result<bool> is_cgroup2(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) {
    return Error::from_errno(errno, "statfs " + path);
  }
  return static_cast<unsigned long>(fs.f_type) == CGROUP2_SUPER_MAGIC;
}

Result<std::string> find_cgroup2_mount(const std::string& cgroup_base) {
  const std::string unified = cgroup_base + "/unified";
  std::string why;
  for (const std::string& candidate : {cgroup_base, unified}) {
    auto cgroup2 = is_cgroup2(candidate);
    if (cgroup2.ok() && *cgroup2) return candidate;
    why += why.empty() ? "" : "; ";
    why += cgroup2.ok() ? candidate + " is not cgroup2" : cgroup2.error().message;
  }
  return Error{ENOENT, "no cgroup2 hierarchy is mounted (" + why +
                           "): kpleg needs cgroup2 (unified or hybrid) for its kernel path"};
}

}  // namespace kpleg::cgroup
