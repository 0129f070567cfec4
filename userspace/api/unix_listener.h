// The API's unix socket, accepted by kplegd itself so that each connection's peer credentials
// (SO_PEERCRED) are known: gRPC's own unix listener names every peer "unix:", and the per-client
// bound on streams (stream_slots.h) has to tell local consumers apart. Each accepted connection
// is handed to the gRPC server (AddInsecureChannelFromFd), which names its calls' peer "fd:N";
// credentials_of() maps that back. One thread, asleep in accept() while nobody connects.
#pragma once

#include <sys/socket.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/result.h"

namespace grpc {
class Server;
}

namespace kpleg::api {

class UnixListener {
 public:
  // Binds `path` (prepared by prepare_socket_path) owner-only, with no moment at which another
  // user could connect, and listens.
  static Result<std::unique_ptr<UnixListener>> bind(const std::string& path);
  ~UnixListener();  // stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting; every connection goes to `server` (started, outliving stop()).
  void serve(grpc::Server* server);
  // Stops accepting; connections already handed over stay the server's. Idempotent.
  void stop();

  // The credentials of the process that opened the connection a call came on (`grpc_peer`:
  // its ServerContext::peer()); none for a call that did not come through this listener.
  std::optional<ucred> credentials_of(std::string_view grpc_peer) const;

 private:
  explicit UnixListener(int fd) : fd_(fd) {}
  void accept_loop(grpc::Server* server);

  int fd_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::unordered_map<int, ucred> peers_;  // by connection fd; a reused fd is overwritten
};

}  // namespace kpleg::api
