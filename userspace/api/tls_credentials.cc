#include "api/tls_credentials.h"

#include "api/client_identity.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace kpleg::api {
namespace {

Result<std::string> read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::from_errno(errno, fmt::format("{} {}: cannot read", flag, path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return Error{EINVAL, fmt::format("{} {}: file is empty", flag, path)};
  return ss.str();
}

// --tls-client-allow: a verified client certificate must also name an allowed identity, of the
// allowed kind (client_identity.h). Runs for every call (the health service's too), before the
// handler.
class ClientIdentityCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit ClientIdentityCheck(std::vector<AllowedIdentity> allowed)
      : allowed_(std::move(allowed)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    const PresentedIdentity peer = presented_by(*context);
    if (identity_allowed(allowed_, peer)) return grpc::Status::OK;
    return {grpc::StatusCode::UNAUTHENTICATED,
            "client certificate (" + describe(peer) + ") is not among --tls-client-allow"};
  }

 private:
  std::vector<AllowedIdentity> allowed_;
};

}  // namespace

Result<std::shared_ptr<grpc::ServerCredentials>> tcp_credentials(const ApiServerOptions& options) {
  if (options.insecure_tcp) return grpc::InsecureServerCredentials();
  // Read once here for a clear error at start; from then on gRPC re-reads the files
  // every --tls-reload-interval, so rotated certificates need no restart.
  if (auto cert = read_file(options.tls_cert_file, "--tls-cert"); !cert) return cert.error();
  if (auto key = read_file(options.tls_key_file, "--tls-key"); !key) return key.error();
  if (!options.tls_client_ca_file.empty()) {
    if (auto ca = read_file(options.tls_client_ca_file, "--tls-client-ca"); !ca)
      return ca.error();
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.tls_key_file, options.tls_cert_file, options.tls_client_ca_file,
      static_cast<unsigned>(options.tls_reload_interval.count()));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!options.tls_client_ca_file.empty()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::experimental::TlsServerCredentials(tls);
  if (!options.tls_client_allow.empty()) {
    std::vector<AllowedIdentity> allowed;
    for (const auto& name : options.tls_client_allow) {
      auto id = AllowedIdentity::parse(name);
      if (!id) return id.error();
      allowed.push_back(std::move(*id));
    }
    creds->SetAuthMetadataProcessor(std::make_shared<ClientIdentityCheck>(std::move(allowed)));
  }
  return creds;
}

}  // namespace kpleg::api
