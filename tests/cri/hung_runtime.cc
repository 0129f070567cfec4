#include "cri/hung_runtime.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kpleg::testing {

HungRuntime::HungRuntime() {
  char tmpl[] = "/tmp/kpleg-hung-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    error_ = std::string("mkdtemp: ") + std::strerror(errno);
    return;
  }
  dir_ = tmpl;
  socket_path_ = dir_ + "/cri.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error_ = std::string("socket: ") + std::strerror(errno);
    return;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 16) != 0) {
    error_ = std::string("bind/listen ") + socket_path_ + ": " + std::strerror(errno);
    close(fd);
    return;
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { accept_loop(); });
}

HungRuntime::~HungRuntime() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int c : connections_) close(c);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

void HungRuntime::accept_loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;  // wakes up to notice stop_
    int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      connections_.push_back(c);
      ++accepted_;
    }
  }
}

}  // namespace kpleg::testing
