#include "api/options.h"

#include <CLI/CLI.hpp>

#include "api/client_identity.h"

namespace kpleg::api {

Status ApiServerOptions::validate() const {
  if (socket_path.empty() && listen_address.empty())
    return Error{EINVAL, "nothing to serve on: give --socket and/or --listen"};
  if (!socket_group.empty() && socket_path.empty())
    return Error{EINVAL, "--socket-group needs --socket"};
  if (max_watchers == 0) return Error{EINVAL, "--max-watchers must be at least 1"};
  if (max_watchers_per_client == 0)
    return Error{EINVAL, "--max-watchers-per-client must be at least 1"};

  const bool tls = !tls_cert_file.empty() || !tls_key_file.empty();
  if (listen_address.empty()) {
    if (tls || !tls_client_ca_file.empty() || insecure_tcp || tls_no_client_auth)
      return Error{EINVAL,
                   "--tls-cert, --tls-key, --tls-client-ca, --tls-no-client-auth and "
                   "--insecure-tcp apply to --listen, which is not given"};
    return {};
  }
  auto colon = listen_address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen_address.size())
    return Error{EINVAL, "--listen " + listen_address + ": expected host:port"};
  if (tls && (tls_cert_file.empty() || tls_key_file.empty()))
    return Error{EINVAL, "--tls-cert and --tls-key go together"};
  if (tls && insecure_tcp)
    return Error{EINVAL, "--insecure-tcp contradicts --tls-cert/--tls-key: choose one"};
  if (!tls_client_ca_file.empty() && !tls)
    return Error{EINVAL, "--tls-client-ca needs --tls-cert and --tls-key"};
  if (tls_no_client_auth && !tls)
    return Error{EINVAL, "--tls-no-client-auth needs --tls-cert and --tls-key"};
  if (tls_no_client_auth && !tls_client_ca_file.empty())
    return Error{EINVAL, "--tls-no-client-auth contradicts --tls-client-ca: choose one"};
  if (!tls_client_allow.empty() && tls_client_ca_file.empty())
    return Error{EINVAL, "--tls-client-allow needs --tls-client-ca: without client "
                         "certificates there is no identity to check"};
  for (const auto& name : tls_client_allow)
    if (auto id = AllowedIdentity::parse(name); !id) return id.error();
  if (tls_reload_interval.count() < 1)
    return Error{EINVAL, "--tls-reload-interval must be at least 1s"};
  if (tls && tls_client_ca_file.empty() && !tls_no_client_auth)
    return Error{EINVAL, "refusing TLS without client certificates on " + listen_address +
                             ": anyone who can reach the port could read the node's events; give "
                             "--tls-client-ca to require client certificates, or "
                             "--tls-no-client-auth to accept that"};
  if (!tls && !insecure_tcp)
    return Error{EINVAL, "refusing plain TCP on " + listen_address +
                             ": anyone who can reach the port could read the node's events; give "
                             "--tls-cert and --tls-key (and --tls-client-ca to require client "
                             "certificates), or --insecure-tcp to accept that"};
  return {};
}

void add_api_flags(CLI::App& app, ApiServerOptions& o, bus::EventBusOptions& b) {
  app.add_option("--socket", o.socket_path,
                 "Unix socket of the consumer API (owner-only); empty to disable")
      ->capture_default_str();
  app.add_option("--socket-group", o.socket_group,
                 "Group allowed to use the socket (it becomes 0660)");
  app.add_option("--listen", o.listen_address,
                 "Also serve on TCP host:port (needs --tls-cert/--tls-key or --insecure-tcp)");
  app.add_option("--tls-cert", o.tls_cert_file, "Server certificate (PEM) for --listen");
  app.add_option("--tls-key", o.tls_key_file, "Server private key (PEM) for --listen");
  app.add_option("--tls-client-ca", o.tls_client_ca_file,
                 "Require client certificates signed by this CA (PEM)");
  app.add_option("--tls-client-allow", o.tls_client_allow,
                 "With --tls-client-ca: accept only client certificates that name this identity: "
                 "DNS:name, IP:addr, URI:uri, email:addr (subjectAltName entries) or CN:name "
                 "(subject common name); untyped, a DNS name or an IP address; repeatable");
  app.add_option_function<unsigned>(
         "--tls-reload-interval",
         [&o](unsigned s) { o.tls_reload_interval = std::chrono::seconds(s); },
         "Seconds between re-reads of the TLS certificate, key and client CA files (rotated "
         "files take effect for new connections)")
      ->default_str("60");
  app.add_flag("--tls-no-client-auth", o.tls_no_client_auth,
               "Allow --listen with TLS but without --tls-client-ca: encrypted, but any client "
               "that reaches the port is served");
  app.add_flag("--insecure-tcp", o.insecure_tcp,
               "Allow --listen without TLS: unauthenticated and unencrypted");
  app.add_option("--max-watchers", o.max_watchers, "Concurrent Watch streams")
      ->capture_default_str();
  app.add_option("--max-watchers-per-client", o.max_watchers_per_client,
                 "Of --max-watchers, the most one client holds (a client certificate, a TCP "
                 "peer address, a process on the unix socket)")
      ->capture_default_str();
  app.add_option("--event-history", b.history_capacity,
                 "Events kept for consumers that resume a Watch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--watch-queue", b.default_queue_capacity,
                 "Events a Watch consumer may fall behind before it is cut off")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

}  // namespace kpleg::api
