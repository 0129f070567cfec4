#include "api/unix_socket.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace kpleg::api {

Status prepare_socket_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return Error{ENAMETOOLONG, fmt::format("--socket {}: longer than the {} bytes a unix socket "
                                           "path may have",
                                           path, sizeof(sockaddr_un::sun_path) - 1)};
  fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      return Error{ec.value(), fmt::format("--socket {}: cannot create {}: {}", path, dir.string(),
                                           ec.message())};
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Error::from_errno(errno, "--socket " + path);
  }
  if (!S_ISSOCK(st.st_mode))
    return Error{EEXIST, fmt::format("--socket {}: exists and is not a socket; refusing to "
                                     "replace it",
                                     path)};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno(errno, "socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0)
    return Error{EADDRINUSE, fmt::format("--socket {}: another server answers on it (is kplegd "
                                         "already running?)",
                                         path)};
  if (err != ECONNREFUSED) return Error::from_errno(err, "--socket " + path + ": checking it");
  // Nobody listens: a socket left behind by a daemon that did not shut down cleanly.
  if (unlink(path.c_str()) != 0 && errno != ENOENT)
    return Error::from_errno(errno, "--socket " + path + ": removing the stale socket");
  spdlog::info("api: removed stale socket {}", path);
  return {};
}

Result<gid_t> socket_group_id(const std::string& group) {
  std::vector<char> buf(16384);
  struct group gr {};
  struct group* found = nullptr;
  int err = getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &found);
  if (found == nullptr)
    return err != 0 ? Error::from_errno(err, "--socket-group " + group)
                    : Error{ENOENT, "--socket-group " + group + ": no such group"};
  return found->gr_gid;
}

Result<ino_t> secure_socket(const std::string& path, gid_t gid) {
  if (gid != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0)
    return Error::from_errno(errno, "--socket-group: chown " + path);
  mode_t mode = gid != static_cast<gid_t>(-1) ? 0660 : 0600;
  if (chmod(path.c_str(), mode) != 0) return Error::from_errno(errno, "chmod " + path);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "stat " + path);
  return st.st_ino;
}

void remove_socket_if_ours(const std::string& path, ino_t ino) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && st.st_ino == ino) unlink(path.c_str());
}

}  // namespace kpleg::api
