// The API's unix socket file (--socket, --socket-group): its directory made, a stale socket
// left by a daemon that did not shut down cleanly removed (one a live server answers on
// refused), its group and mode set once bound, and at stop removed only if it is still ours.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/result.h"

namespace kpleg::api {

// Before binding: the path fits a sockaddr_un, its directory exists, and nothing but a stale
// socket is in the way.
Status prepare_socket_path(const std::string& path);
// --socket-group's id.
Result<gid_t> socket_group_id(const std::string& group);
// Once bound: chowned to `gid` (unless -1) and made 0660, else 0600. Returns the socket's inode,
// for remove_socket_if_ours.
Result<ino_t> secure_socket(const std::string& path, gid_t gid);
// Another instance may have replaced the socket meanwhile; removes only the one with `ino`.
void remove_socket_if_ours(const std::string& path, ino_t ino);

}  // namespace kpleg::api
