// The forwarder's listening socket: bound by the forwarder with its mode set before it has a
// name (no window in which the ambient umask or a chmod leaves it open wider), or handed over by
// systemd (socket activation, sd_listen_fds(3): LISTEN_PID, LISTEN_FDS, fds from 3); and removed
// on stop only while the path still names the socket this process bound (a successor that
// bound the path meanwhile keeps its own).
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace grpc {
class Server;
}

#include "common/result.h"

namespace kpleg::criforward {

class ListenSocket {
 public:
  // Binds and listens on `path` with `mode` (a stale socket file is replaced, a live one an
  // error). The file is never wider than `mode`, at any moment.
  static Result<ListenSocket> bind(const std::string& path, mode_t mode, std::string_view who);
  // The first socket systemd passed (LISTEN_PID is this process, LISTEN_FDS >= 1), checked to be
  // a listening unix stream socket; none when the process was not socket-activated. The
  // variables are unset so that children do not take the socket for theirs. systemd owns the
  // file: it is never removed here.
  static Result<std::optional<ListenSocket>> from_systemd(std::string_view who);

  ListenSocket(ListenSocket&& o) noexcept;
  ListenSocket& operator=(ListenSocket&& o) noexcept;
  ListenSocket(const ListenSocket&) = delete;
  ListenSocket& operator=(const ListenSocket&) = delete;
  // Closes the descriptor; removes the file when this process bound it and it is still its own.
  ~ListenSocket();

  int fd() const { return fd_; }
  bool activated() const { return activated_; }
  const std::string& path() const { return path_; }

 private:
  ListenSocket() = default;
  void close_and_unlink();

  int fd_ = -1;
  bool activated_ = false;
  std::string path_;  // empty when activated (systemd names it)
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Hands each connection of a listening socket to a gRPC server that has no port of its own
// (grpc::AddInsecureChannelFromFd), on a thread asleep in poll() between connections.
class Acceptor {
 public:
  // `server` must outlive stop().
  static Result<std::unique_ptr<Acceptor>> start(int listen_fd, grpc::Server* server,
                                                 std::string who);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  // Takes no more connections (they wait in the socket's backlog); idempotent.
  void stop();

 private:
  Acceptor(int listen_fd, int wake_fd, grpc::Server* server, std::string who);
  void run();

  int listen_fd_;
  int wake_fd_;
  grpc::Server* server_;
  std::string who_;
  std::mutex mu_;
  std::thread thread_;
};

}  // namespace kpleg::criforward
