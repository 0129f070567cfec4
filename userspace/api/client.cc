#include "api/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

namespace kpleg::api {
namespace {

Result<std::string> read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error{EINVAL, fmt::format("{} {}: cannot read: {}", flag, path, std::strerror(errno))};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Connects once with a plain socket to tell "not running" and "no permission" apart.
Status probe_socket(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return Error{EINVAL, "socket path too long: " + path};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno(errno, "socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0) return {};
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return Error{ENOENT, fmt::format("kplegd is not running: no socket at {}", path)};
    case ECONNREFUSED:
      return Error{ECONNREFUSED,
                   fmt::format("kplegd is not running: connection refused on {}", path)};
    case EACCES:
    case EPERM:
      return Error{EACCES, fmt::format("permission denied on {}: the socket is owner-only (run as "
                                       "its owner, or ask for kplegd --socket-group)",
                                       path)};
    default:
      return Error{err, fmt::format("cannot connect to {}: {}", path, std::strerror(err))};
  }
}

}  // namespace

bool is_unreachable(const Error& error) {
  return error.code == ENOENT || error.code == ECONNREFUSED || error.code == EACCES;
}

void set_channel_arguments(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

Result<std::shared_ptr<grpc::Channel>> connect_channel(const ClientOptions& o) {
  grpc::ChannelArguments args;
  set_channel_arguments(args);
  if (o.address.empty()) {
    if (o.socket_path.empty()) return Error{EINVAL, "give --socket or --address"};
    if (auto st = probe_socket(o.socket_path); !st) return st.error();
    return grpc::CreateCustomChannel("unix:" + o.socket_path, grpc::InsecureChannelCredentials(),
                                     args);
  }
  if (o.insecure_tcp) {
    if (!o.tls_ca_file.empty() || !o.tls_cert_file.empty() || !o.tls_key_file.empty())
      return Error{EINVAL, "--insecure-tcp contradicts the TLS flags: choose one"};
    return grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args);
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty())
    return Error{EINVAL, "--tls-cert and --tls-key go together"};
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca_file.empty()) {
    auto ca = read_file(o.tls_ca_file, "--tls-ca");
    if (!ca) return ca.error();
    ssl.pem_root_certs = *ca;
  }
  if (!o.tls_cert_file.empty()) {
    auto cert = read_file(o.tls_cert_file, "--tls-cert");
    if (!cert) return cert.error();
    auto key = read_file(o.tls_key_file, "--tls-key");
    if (!key) return key.error();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  return grpc::CreateCustomChannel(o.address, grpc::SslCredentials(ssl), args);
}

}  // namespace kpleg::api
