// Runtime endpoints as the kubelet's --container-runtime-endpoint spells them.
#pragma once

#include <string>
#include <string_view>

#include "common/result.h"

namespace kpleg::cri {

// The usual containerd socket, the kubelet's default since 1.27.
inline constexpr std::string_view kDefaultRuntimeEndpoint =
    "unix:///run/containerd/containerd.sock";

// Turns "unix:///path", "unix:/path" or a bare "/path" into the gRPC target "unix:///path".
// Relative paths, empty paths and other schemes (tcp://, npipe://) are errors: a node agent only
// ever talks to its runtime over a local socket.
Result<std::string> grpc_target_for_endpoint(std::string_view endpoint);

// The filesystem path of the socket a target names ("unix:///a/b" -> "/a/b").
std::string socket_path_of(std::string_view grpc_target);

// Readies `path` for a server to listen on: a stale socket file (its server died) is removed;
// a live socket, a non-socket, a missing directory or a path too long for a unix socket is an
// error naming `who` ("CRI endpoint") and the cause.
Status prepare_listen_socket(const std::string& path, std::string_view who);

}  // namespace kpleg::cri
