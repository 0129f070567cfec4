#include "api/tls_credentials.h"

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

// --tls-client-allow: a verified client certificate must also name an allowed identity. Runs
// for every call (the health service's too), before the handler.
class ClientIdentityCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit ClientIdentityCheck(std::vector<std::string> allowed) : allowed_(std::move(allowed)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    std::string seen;
    for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
      for (const auto& value : context->FindPropertyValues(property)) {
        const std::string name(value.data(), value.size());
        if (std::find(allowed_.begin(), allowed_.end(), name) != allowed_.end())
          return grpc::Status::OK;
        seen += (seen.empty() ? "" : ", ") + name;
      }
    }
    return {grpc::StatusCode::UNAUTHENTICATED,
            "client certificate (" + (seen.empty() ? std::string("no names") : seen) +
                ") is not among --tls-client-allow"};
  }

 private:
  std::vector<std::string> allowed_;
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
  if (!options.tls_client_allow.empty())
    creds->SetAuthMetadataProcessor(
        std::make_shared<ClientIdentityCheck>(options.tls_client_allow));
  return creds;
}

}  // namespace kpleg::api
