#include "cri/endpoint.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kpleg::cri {

Result<std::string> grpc_target_for_endpoint(std::string_view endpoint) {
  std::string_view path = endpoint;
  if (path.starts_with("unix://")) {
    path.remove_prefix(7);
  } else if (path.starts_with("unix:")) {
    path.remove_prefix(5);
  } else if (auto scheme = path.find("://"); scheme != std::string_view::npos) {
    return Error{EINVAL, "runtime endpoint '" + std::string(endpoint) +
                             "': only unix sockets are supported (unix:///path/to/socket)"};
  }
  if (path.empty()) {
    return Error{EINVAL, "runtime endpoint '" + std::string(endpoint) + "' names no socket path"};
  }
  if (path.front() != '/') {
    return Error{EINVAL, "runtime endpoint '" + std::string(endpoint) +
                             "': the socket path must be absolute"};
  }
  return "unix://" + std::string(path);
}

std::string socket_path_of(std::string_view grpc_target) {
  if (grpc_target.starts_with("unix://")) grpc_target.remove_prefix(7);
  return std::string(grpc_target);
}

// A stale socket file (its server died) is replaced; a live one or a non-socket is an error.
Status prepare_listen_socket(const std::string& path, std::string_view who) {
  const std::string w(who);
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Error{ENAMETOOLONG, w + ": socket path " + path + " is longer than " +
                                   std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes"};
  }
  struct stat st {};
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty() && stat(dir.c_str(), &st) != 0) {
    return Error::from_errno(errno, w + ": directory " + dir + " of the listening socket");
  }
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Error::from_errno(errno, w + ": stat " + path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Error{EEXIST, w + ": " + path + " exists and is not a socket"};
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno(errno, w + ": socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  if (live) return Error{EADDRINUSE, w + ": something already listens on " + path};
  if (unlink(path.c_str()) != 0) return Error::from_errno(errno, w + ": removing stale " + path);
  return {};
}


}  // namespace kpleg::cri
