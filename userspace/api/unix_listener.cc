#include "api/unix_listener.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/thread_name.h"

namespace kpleg::api {

Result<std::unique_ptr<UnixListener>> UnixListener::bind(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return Error{ENAMETOOLONG, "--socket " + path + ": path too long for a unix socket"};
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno(errno, "--socket " + path + ": socket");
  // The socket is born owner-only: no window in which another user could connect before
  // secure_socket() sets its mode. umask is process-wide, but nothing else creates files while
  // the API server starts.
  const mode_t old_umask = umask(0177);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  umask(old_umask);
  if (rc != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = rc != 0 ? bind_errno : errno;
    close(fd);
    return Error::from_errno(err, "--socket " + path + (rc != 0 ? ": bind" : ": listen"));
  }
  return std::unique_ptr<UnixListener>(new UnixListener(fd));
}

UnixListener::~UnixListener() {
  stop();
  if (fd_ >= 0) close(fd_);
}

void UnixListener::serve(Handler handler) {
  handler_ = std::move(handler);
  thread_ = named_thread("kpleg-api-accept", [this] { accept_loop(); });
}

void UnixListener::stop() {
  // Wakes accept() (it then fails with EINVAL) without closing the fd under it.
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void UnixListener::accept_loop() {
  for (;;) {
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the connection waits in the backlog; look again soon
        // instead of spinning.
        spdlog::warn("api: unix socket accept: {}; retrying in 100 ms", std::strerror(errno));
        poll(nullptr, 0, 100);
        continue;
      }
      return;  // shut down by stop()
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) cred = ucred{0, 0, 0};
    handler_(conn, cred);  // owns conn from here
  }
}

}  // namespace kpleg::api
