#include "cgroup/cgroup_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace kpleg::cgroup {

Result<pid_t> spawn_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv) {
  const std::string procs = cgroup_dir + "/cgroup.procs";
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

}  // namespace kpleg::cgroup
