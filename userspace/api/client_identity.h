#pragma once
// Who a client of the API is: for --tls-client-allow, which verified client certificates may use
// the API, and for the per-client bound on streams (stream_slots.h), which calls come from one
// client.
//
// An allowed identity is typed the way a certificate types its names, so that a name of one
// kind never matches a name of another kind:
//   DNS:name    a subjectAltName DNS entry (case-insensitive; a certificate's "*.x" covers
//               exactly one leftmost label, as in Go's crypto/x509 VerifyHostname)
//   IP:addr     a subjectAltName IP entry (compared as addresses: "::1" == "0:0:0:0:0:0:0:1")
//   URI:uri     a subjectAltName URI entry (exact; e.g. a SPIFFE ID)
//   email:addr  a subjectAltName email entry (case-insensitive)
//   CN:name     the subject common name, whatever SANs the certificate has (how the Kubernetes
//               API server's --requestheader-allowed-names names its clients)
//   name        untyped: matched as a Kubernetes client verifies a server name (Go's
//               VerifyHostname): an IP literal against IP entries, anything else against DNS
//               entries; never against the common name.
#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/result.h"

namespace grpc {
class AuthContext;
class ServerContext;
}  // namespace grpc

namespace kpleg::api {

enum class IdentityKind { kDns, kIp, kUri, kEmail, kCommonName };

struct AllowedIdentity {
  IdentityKind kind;
  std::string value;  // IP entries in canonical form
  std::string spelled;  // as given on the command line, for messages

  // Parses one --tls-client-allow value; a clear error for an unknown type, an empty name or
  // an IP entry that is not an address.
  static Result<AllowedIdentity> parse(const std::string& flag_value);
};

// The names a verified certificate presents, by kind (gRPC's peer_dns, peer_ip, peer_uri,
// peer_email and x509_common_name properties).
struct PresentedIdentity {
  std::vector<std::string> dns, ip, uri, email;
  std::string common_name;
};

PresentedIdentity presented_by(const grpc::AuthContext& auth);

bool identity_allowed(const std::vector<AllowedIdentity>& allowed, const PresentedIdentity& peer);

// "DNS:a, IP:10.0.0.1, CN:b" (or "no names"), for the refusal message.
std::string describe(const PresentedIdentity& peer);

// The client a call on TCP comes from: the names of its certificate when it presented one; else
// its peer's address (whatever the port: a host's connections are one client); else gRPC's peer
// string.
std::string client_of(const grpc::ServerContext& ctx);
// The same from a peer string and a certificate's names, for tests.
std::string client_of(const std::string& grpc_peer, const PresentedIdentity* certificate);
// The client of a unix socket connection: the process that opened it ("pid 123, uid 0").
std::string client_of(const ucred& peer);

}  // namespace kpleg::api
