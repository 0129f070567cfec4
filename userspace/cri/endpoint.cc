#include "cri/endpoint.h"

#include <cerrno>

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

}  // namespace kpleg::cri
