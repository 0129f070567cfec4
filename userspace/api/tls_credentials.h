// The TCP listener's credentials (--listen): TLS from files that gRPC re-reads every
// --tls-reload-interval, so rotated certificates need no restart; client certificates required
// with --tls-client-ca, and their names checked against --tls-client-allow; none with
// --insecure-tcp.
#pragma once

#include <memory>

#include "api/options.h"
#include "common/result.h"

namespace grpc {
class ServerCredentials;
}

namespace kpleg::api {

// Reads the files once, for a clear error at start.
Result<std::shared_ptr<grpc::ServerCredentials>> tcp_credentials(const ApiServerOptions& options);

}  // namespace kpleg::api
