// kplegd's HTTP endpoint: GET /metrics (Prometheus text format), /livez (kplegd itself
// progresses), /readyz (its events can be trusted) and /healthz (the same as /readyz, kept for
// the clients that read it), each 200, or 503 with the reasons. One request per connection, each
// with a deadline for the whole of it, so that slow clients cannot hold the workers. Loopback by default: it serves no secrets, but
// exposing it beyond the node is a deployment decision (--metrics-address 0.0.0.0:10262).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "api/providers.h"
#include "common/result.h"
#include "metrics/registry.h"

namespace CLI {
class App;
}
namespace httplib {
class Server;
}

namespace kpleg::metrics {

// Next to the kubelet's ports (10248 healthz, 10250, 10255) but used by no Kubernetes
// component (10249 kube-proxy, 10256-10259 control plane).
inline constexpr const char* kDefaultMetricsAddress = "127.0.0.1:10262";

struct MetricsServerOptions {
  std::string address = kDefaultMetricsAddress;  // host:port, [v6]:port; port 0 picks one
};

// --metrics-address.
void add_metrics_flags(CLI::App& app, MetricsServerOptions& options);

class MetricsServer {
 public:
  // The registry and the health provider must outlive the server.
  MetricsServer(MetricsServerOptions options, Registry& registry, api::HealthProvider& health);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds (an error names the address and the cause) and serves on a thread.
  Status start();
  void stop();
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  MetricsServerOptions options_;
  Registry& registry_;
  api::HealthProvider& health_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

// Splits "host:port" / "[v6]:port". Exposed for tests.
Result<std::pair<std::string, int>> parse_host_port(const std::string& address);

}  // namespace kpleg::metrics
