// kpleg-cri-relay: the kubelet's CRI endpoint, in front of the runtime, in a process of its own
// (relay/relay.h). Runs as a host service before the kubelet, socket-activated or not:
//
//   kpleg-cri-relay --listen /run/kpleg/cri.sock \
//       --runtime-endpoint unix:///run/containerd/containerd.sock
//
// with the kubelet's --container-runtime-endpoint unix:///run/kpleg/cri.sock. Under systemd
// (deploy/systemd/) the socket comes from the .socket unit (LISTEN_FDS) and --listen only
// names it. SIGTERM or SIGINT stop it gracefully: the calls in flight finish first.
#include <absl/synchronization/mutex.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "api/options.h"
#include "common/duration.h"
#include "common/logging.h"
#include "criforward/listen_socket.h"
#include "grpcidle/grpc_idle.h"
#include "relay/relay.h"

using namespace kpleg;

int main(int argc, char** argv) {
  // As kplegd (cmd/kplegd/main.cc): no absl deadlock detection on every lock, gRPC's poll engine
  // (the thread that waits for a response reads it), timer threads asleep while idle. The
  // backup poller stays: the forwarding channel needs it to read a reconnection's SETTINGS.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  const std::string idle_note = grpcidle::install();

  CLI::App app{
      "kpleg-cri-relay: the kubelet's CRI endpoint, kplegd's events without kplegd in "
      "the kubelet's path"};
  app.set_version_flag("--version", "kpleg-cri-relay 0.1.0");
  relay::RelayOptions o;
  o.kplegd_socket = api::kDefaultSocketPath;
  std::string log_level = "info", stop_timeout = "150s";
  bool hints_only = false;
  app.add_option("--listen", o.listen_endpoint,
                 "Socket the kubelet connects to (unix:///path or /path); with socket activation "
                 "the one systemd passes is served instead")
      ->required();
  app.add_option("--runtime-endpoint", o.runtime_endpoint, "The runtime's CRI socket")->required();
  app.add_option("--kplegd-socket", o.kplegd_socket, "kplegd's API socket (its events)")
      ->capture_default_str();
  app.add_option("--status-socket", o.status_socket,
                 "Socket serving the calls in flight (kplegctl --socket <it> stuck); empty: none")
      ->capture_default_str();
  app.add_option("--max-calls", o.max_calls, "Forwarded calls in flight at once; more are refused")
      ->capture_default_str();
  app.add_option("--max-event-streams", o.max_event_streams,
                 "GetContainerEvents streams open at once")
      ->capture_default_str();
  app.add_option("--max-feed-queue", o.max_feed_queue,
                 "Events waiting for their statuses from the runtime; more are dropped (the "
                 "kubelet's relist catches them up)")
      ->capture_default_str();
  app.add_flag("--hints-only", hints_only,
               "GetContainerEvents carry no container statuses (no runtime call per event; "
               "enough for a kubelet 1.37)");
  app.add_option("--stop-timeout", stop_timeout,
                 "On SIGTERM, how long calls in flight may finish (longer than the kubelet's "
                 "2 min deadlines: none is cut short)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.full_statuses = !hints_only;
  if (auto st = setup_logging(log_level, LogFormat::kText); !st) {
    std::cerr << "kpleg-cri-relay: " << st.error().message << std::endl;
    return 2;
  }
  if (!idle_note.empty()) spdlog::info("{}", idle_note);
  auto timeout = parse_duration(stop_timeout);
  if (!timeout) {
    std::cerr << "kpleg-cri-relay: --stop-timeout: " << timeout.error().message << std::endl;
    return 2;
  }
  o.stop_timeout = *timeout;

  // Every thread started from here on inherits the mask: the signals reach sigwait only.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto activated = criforward::ListenSocket::from_systemd("kpleg-cri-relay");
  if (!activated) {
    spdlog::error("{}", activated.error().message);
    return 1;
  }
  if (*activated) o.listen_fd = (*activated)->fd();
  auto r = relay::Relay::start(o);
  if (!r) {
    spdlog::error("{}", r.error().message);
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("kpleg-cri-relay: signal {}: stopping", sig);
  (*r)->stop();
  return 0;
}
