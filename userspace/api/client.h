// Connecting to kplegd's consumer API as a client (kplegctl, tests, other node agents): over
// the unix socket by default, or TCP with TLS. For the socket, the common failures are told
// apart before any RPC, so the user reads "kplegd is not running" or "permission denied"
// instead of a generic UNAVAILABLE.
#pragma once

#include <memory>
#include <string>

#include "api/options.h"
#include "common/result.h"

namespace grpc {
class Channel;
class ChannelArguments;
}  // namespace grpc

namespace kpleg::api {

struct ClientOptions {
  std::string socket_path = kDefaultSocketPath;
  // host:port: use TCP instead of the socket.
  std::string address;
  std::string tls_ca_file;    // CA that signed the server's certificate (else system roots)
  std::string tls_cert_file;  // client certificate, for servers that require one
  std::string tls_key_file;
  std::string tls_server_name;  // name to verify in the server's certificate, if not the host
  bool insecure_tcp = false;    // plain TCP (the server must run with --insecure-tcp)
};

// Error codes: ENOENT / ECONNREFUSED when nothing serves on the socket (kplegd not running),
// EACCES when the socket is not accessible to this user, EINVAL for bad options or files.
Result<std::shared_ptr<grpc::Channel>> connect_channel(const ClientOptions& options);

// The settings connect_channel() gives every channel, whatever the transport. BDP probing is off:
// it grows a bulk transfer's receive window by PINGing the server as data arrives, and on the
// event stream's small messages it only made kplegd wake and answer a PING about every eighth
// event. The stream's default 64 KiB window holds hundreds of events.
void set_channel_arguments(grpc::ChannelArguments& args);

// Whether an Error from connect_channel() means kplegd could not be reached at all.
bool is_unreachable(const Error& error);

}  // namespace kpleg::api
