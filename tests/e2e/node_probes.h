// What the e2e tests ask a running kplegd from outside, as a kubelet's probes, a scraper or an
// attacker on the node would: its API socket and metrics port (from its log), an HTTP GET with a
// deadline for the whole answer, and clients that trickle header bytes to hold HTTP workers.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "e2e/kplegd_process.h"

namespace kpleg::testing {

// The API socket start_kplegd gave it ("" when its log does not say).
std::string socket_of(const KplegdProcess& d);
// The metrics port it serves on (0 when its log does not say).
int metrics_port(const KplegdProcess& d);
// An HTTP GET on 127.0.0.1:`port` with a deadline for the whole answer: its status code, or -1
// when none came in time.
int http_status(int port, const std::string& path, std::chrono::milliseconds timeout);

// `n` clients that each open a connection to 127.0.0.1:`port`, send the start of a request and
// then a header byte every 200 ms, reconnecting as soon as the server cuts them off.
class HeaderTricklers {
 public:
  HeaderTricklers(int port, int n);
  ~HeaderTricklers();  // stop()
  void stop();
  int connections() const { return connections_.load(); }
  int cut_off() const { return cut_off_.load(); }

 private:
  void trickle(int port);
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0}, cut_off_{0};
  std::vector<std::thread> threads_;
};

}  // namespace kpleg::testing
