// The API's unix socket: binds it owner-only and accepts its connections, each handed with its
// peer's credentials (SO_PEERCRED: the per-client bound on streams, stream_slots.h, tells local
// consumers apart by process) to the server that serves it (h2_server.h). One thread, asleep in
// accept() while nobody connects.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/result.h"

namespace kpleg::api {

class UnixListener {
 public:
  // Binds `path` (prepared by prepare_socket_path) owner-only, with no moment at which another
  // user could connect, and listens.
  static Result<std::unique_ptr<UnixListener>> bind(const std::string& path);
  ~UnixListener();  // stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Takes an accepted connection (non-blocking) and its peer's credentials.
  using Handler = std::function<void(int fd, const ucred& peer)>;
  // Starts accepting; every connection goes to `handler` (which must outlive stop()).
  void serve(Handler handler);
  // Stops accepting; connections already handed over stay the handler's. Idempotent.
  void stop();

 private:
  explicit UnixListener(int fd) : fd_(fd) {}
  void accept_loop();

  int fd_;
  Handler handler_;
  std::thread thread_;
};

}  // namespace kpleg::api
