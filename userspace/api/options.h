// Where and how kplegd serves its consumer API, and the command-line flags that set it (so
// that kplegd, its docs and kplegctl spell them the same way).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "bus/event_bus.h"
#include "common/result.h"

namespace CLI {
class App;
}

namespace kpleg::api {

inline constexpr const char* kDefaultSocketPath = "/run/kpleg/kpleg.sock";

struct ApiServerOptions {
  // Unix socket, owner-only (0600); empty: no unix socket.
  std::string socket_path = kDefaultSocketPath;
  // When set, the socket is chowned to this group and made 0660.
  std::string socket_group;

  // Optional TCP listener, "host:port" (port 0 picks a free one). Needs TLS unless
  // insecure_tcp is set.
  std::string listen_address;
  std::string tls_cert_file;
  std::string tls_key_file;
  // When set, clients must present a certificate signed by this CA.
  std::string tls_client_ca_file;
  // When non-empty, a client certificate must also name one of these (typed DNS:, IP:, URI:,
  // email:, CN:, see client_identity.h); others are refused UNAUTHENTICATED.
  std::vector<std::string> tls_client_allow;
  // The certificate, key and client CA files are re-read this often, so rotated certificates
  // take effect without a restart (new connections get them).
  std::chrono::seconds tls_reload_interval{60};
  bool insecure_tcp = false;
  // TLS without client certificates: any peer that reaches the port reads every event. Refused
  // unless this says so (--tls-no-client-auth).
  bool tls_no_client_auth = false;

  // Concurrent Watch streams (grpc.health Watches too); on TCP each holds one server thread.
  size_t max_watchers = 64;
  // Of those, the most one client may hold (client_of: a certificate, a TCP peer address, a unix
  // socket peer process), so that one client cannot lock the others out.
  size_t max_watchers_per_client = 16;
  // A Watch cut off for being too slow gives its place back to --max-watchers at once; if its
  // consumer still reads nothing this long afterwards (what is in flight waits on the consumer's
  // flow control), the stream is reset, on TCP so that its thread comes back too. A
  // consumer that reads again within it gets the cut-off's RESOURCE_EXHAUSTED and its reason.
  std::chrono::milliseconds cut_off_grace{std::chrono::seconds(10)};
  // The grpc.health.v1 status is re-read from the HealthProvider when the provider announces a
  // change, when its report's recheck_in passes, and on ApiServer::refresh_health(); a positive
  // interval adds a periodic re-read (0: none, the health thread sleeps until then).
  std::chrono::milliseconds health_refresh_interval{0};

  // Refuses contradictory or unsafe settings (plain TCP without --insecure-tcp, TLS without
  // client certificates without --tls-no-client-auth, half a TLS key pair, nothing to listen
  // on) with a message naming the flags.
  Status validate() const;
};

// --socket, --socket-group, --listen, --tls-cert, --tls-key, --tls-client-ca,
// --tls-no-client-auth, --insecure-tcp,
// --max-watchers, and the event stream's --event-history and --watch-queue.
void add_api_flags(CLI::App& app, ApiServerOptions& options, bus::EventBusOptions& bus_options);

}  // namespace kpleg::api
