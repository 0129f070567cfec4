#include "criforward/listen_socket.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/thread_name.h"
#include "cri/endpoint.h"

namespace kpleg::criforward {
namespace {

constexpr int kSdListenFdsStart = 3;  // sd_listen_fds(3)
constexpr int kBacklog = 1024;        // connections made while the server restarts wait here

}  // namespace

Result<ListenSocket> ListenSocket::bind(const std::string& path, mode_t mode,
                                        std::string_view who) {
  const std::string w(who);
  if (auto st = cri::prepare_listen_socket(path, who); !st) return st.error();
  ListenSocket s;
  s.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s.fd_ < 0) return Error::from_errno(errno, w + ": socket");
  // Linux gives the socket file the socket inode's mode (less the umask) at bind: set before
  // the name exists, it is never wider than `mode`.
  if (::fchmod(s.fd_, mode) != 0) return Error::from_errno(errno, w + ": fchmod");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(s.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return Error::from_errno(errno, w + ": bind " + path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error::from_errno(errno, w + ": stat " + path);
  s.path_ = path;
  s.dev_ = st.st_dev;
  s.ino_ = st.st_ino;
  // A umask narrower than `mode` took bits away: give them back (only ever narrower before).
  if ((st.st_mode & 07777) != mode && ::chmod(path.c_str(), mode) != 0)
    return Error::from_errno(errno, w + ": chmod " + path);
  if (::listen(s.fd_, kBacklog) != 0) return Error::from_errno(errno, w + ": listen " + path);
  return s;
}

Result<std::optional<ListenSocket>> ListenSocket::from_systemd(std::string_view who) {
  const std::string w(who);
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (pid == nullptr || fds == nullptr) return std::optional<ListenSocket>();
  const long listen_pid = std::strtol(pid, nullptr, 10);
  const long n = std::strtol(fds, nullptr, 10);
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (listen_pid != long(::getpid())) return std::optional<ListenSocket>();  // another's
  if (n < 1) return Error{EINVAL, w + ": LISTEN_FDS=" + fds + " passes no socket"};
  const int fd = kSdListenFdsStart;
  int type = 0, listening = 0, domain = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
    return Error::from_errno(errno, w + ": socket-activated fd 3");
  len = sizeof listening;
  ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
  len = sizeof domain;
  ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len);
  if (type != SOCK_STREAM || !listening || domain != AF_UNIX)
    return Error{EINVAL, w + ": socket-activated fd 3 is not a listening unix stream socket "
                             "(ListenStream=/path in the .socket unit)"};
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ListenSocket s;
  s.fd_ = fd;
  s.activated_ = true;
  return std::optional<ListenSocket>(std::move(s));
}

ListenSocket::ListenSocket(ListenSocket&& o) noexcept
    : fd_(o.fd_), activated_(o.activated_), path_(std::move(o.path_)), dev_(o.dev_), ino_(o.ino_) {
  o.fd_ = -1;
  o.path_.clear();
}

ListenSocket& ListenSocket::operator=(ListenSocket&& o) noexcept {
  if (this != &o) {
    close_and_unlink();
    fd_ = o.fd_;
    activated_ = o.activated_;
    path_ = std::move(o.path_);
    dev_ = o.dev_;
    ino_ = o.ino_;
    o.fd_ = -1;
    o.path_.clear();
  }
  return *this;
}

ListenSocket::~ListenSocket() { close_and_unlink(); }

void ListenSocket::close_and_unlink() {
  if (!path_.empty()) {
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
      ::unlink(path_.c_str());
    path_.clear();
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<std::unique_ptr<Acceptor>> Acceptor::start(int listen_fd, grpc::Server* server,
                                                  std::string who) {
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Error::from_errno(errno, who + ": eventfd");
  std::unique_ptr<Acceptor> a(new Acceptor(listen_fd, wake, server, std::move(who)));
  a->thread_ = named_thread("kpleg-cri-accept", [p = a.get()] { p->run(); });
  return a;
}

Acceptor::Acceptor(int listen_fd, int wake_fd, grpc::Server* server, std::string who)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), server_(server), who_(std::move(who)) {}

Acceptor::~Acceptor() {
  stop();
  ::close(wake_fd_);
}

void Acceptor::stop() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  std::lock_guard lk(mu_);
  if (thread_.joinable()) thread_.join();
}

void Acceptor::run() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll: {}", who_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the connection waits in the backlog; try again shortly
      // instead of spinning.
      spdlog::warn("{}: accept: {}", who_, std::strerror(errno));
      if (::poll(&fds[1], 1, 100) > 0) return;
      continue;
    }
    grpc::AddInsecureChannelFromFd(server_, conn);
  }
}

}  // namespace kpleg::criforward
