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

Result<pid_t> spawn_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv) {
  std::string procs = cgroup_dir + "/cgroup.procs";
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno(errno, "open " + procs);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(fd);
    return Error::from_errno(err, "fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    if (write(fd, "0", 1) != 1) _exit(126);  // "0" moves the writing process
    close(fd);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

Result<int> wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Error::from_errno(errno, "waitpid");
  }
  return status;
}

Result<int> run_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv) {
  auto pid = spawn_in_cgroup(cgroup_dir, argv);
  if (!pid) return pid.error();
  return wait_child(*pid);
}

}  // namespace kpleg::testing
