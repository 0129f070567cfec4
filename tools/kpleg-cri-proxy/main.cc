// kpleg-cri-proxy: serves the CRI RuntimeService on --listen, forwards every call to the real
// runtime at --upstream, and stalls the calls that concern one pod (see cri_proxy.h): what a
// node with one pod stuck behind a wedged shim or a hung CNI plugin looks like to a PLEG.
//
//   kpleg-cri-proxy --listen unix:///run/slow.sock --upstream unix:///run/containerd/containerd.sock
//       --stall-pod 5e224138-1d6d-4f96-8e16-c4aaebe4cdce --stall-hang
//
// Live control without a restart (the clients' connections stay up):
//   SIGUSR1  clears the stall;
//   SIGHUP   re-reads --control-file, one line: "hang <pod uid>", "delay <pod uid> <duration>"
//            or "clear" (an empty file clears too). A control file present at start is read
//            then too, after the --stall-* flags.
// Exit status: 0 after SIGTERM/SIGINT; 1 when it cannot listen or the upstream does not answer
// at start; 2 for bad flags.
#include <signal.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "common/duration.h"
#include "common/logging.h"
#include "cri/endpoint.h"
#include "kpleg-cri-proxy/cri_proxy.h"

namespace {

using namespace kpleg;

// "hang UID", "delay UID 5s", "late UID 5s", "clear" or nothing: the stall to apply, or nullopt
// to clear.
Result<std::optional<cri::PodStall>> parse_control(const std::string& text) {
  std::istringstream in(text);
  std::string verb, uid, delay, extra;
  in >> verb >> uid >> delay >> extra;
  if (verb.empty() || verb == "clear") {
    if (!uid.empty()) return Error{EINVAL, "'clear' takes no arguments"};
    return std::optional<cri::PodStall>{};
  }
  cri::PodStall stall;
  stall.pod_uid = uid;
  if (verb == "hang" && !uid.empty() && delay.empty()) {
    stall.mode = cri::StallMode::kHang;
    return std::optional<cri::PodStall>{stall};
  }
  if ((verb == "delay" || verb == "late") && !uid.empty() && !delay.empty() && extra.empty()) {
    auto d = parse_duration(delay);
    if (!d) return d.error();
    stall.mode = verb == "delay" ? cri::StallMode::kDelay : cri::StallMode::kLateAnswer;
    stall.delay = *d;
    return std::optional<cri::PodStall>{stall};
  }
  return Error{EINVAL, "expected 'hang <pod uid>', 'delay <pod uid> <duration>', 'late <pod uid> "
                       "<duration>' or 'clear', got '" +
                           text + "'"};
}

void reload(cri::CriProxy& proxy, const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    spdlog::error("control file {}: cannot read it; stall unchanged", path);
    return;
  }
  std::string line;
  std::getline(f, line);
  auto c = parse_control(line);
  if (!c) {
    spdlog::error("control file {}: {}; stall unchanged", path, c.error().message);
  } else if (*c) {
    proxy.set_stalled_pod(**c);
  } else {
    proxy.clear_stall();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-cri-proxy: a CRI proxy that can stall one pod's runtime calls"};
  cri::CriProxyOptions opts;
  opts.upstream_endpoint = std::string(cri::kDefaultRuntimeEndpoint);
  std::string stall_pod, stall_delay, stall_late, control_file, upstream_timeout = "10s",
      full_list_delay;
  bool stall_hang = false;
  std::string log_level = "info", log_format = "text";

  app.add_option("--listen", opts.listen_endpoint, "Socket to serve the CRI on (unix:///path)")
      ->required();
  app.add_option("--upstream", opts.upstream_endpoint, "CRI endpoint of the real runtime")
      ->capture_default_str();
  auto* pod = app.add_option("--stall-pod", stall_pod, "Uid of the pod whose calls to stall");
  auto* delay = app.add_option("--stall-delay", stall_delay,
                               "Answer the pod's calls this much later (e.g. 5s)");
  auto* late = app.add_option("--stall-late", stall_late,
                              "Forward the pod's calls at once and give their answers this much "
                              "later (e.g. 1500ms): the state they tell is that old");
  auto* hang = app.add_flag("--stall-hang", stall_hang,
                            "Never answer the pod's calls before the caller's deadline (default "
                            "with --stall-pod)");
  delay->excludes(hang)->excludes(late)->needs(pod);
  late->excludes(hang)->needs(pod);
  hang->needs(pod);
  app.add_option("--full-list-delay", full_list_delay,
                 "Answer every unfiltered ListContainers/ListPodSandbox this much later (e.g. "
                 "3s), as a node with thousands of containers would");
  app.add_option("--control-file", control_file,
                 "File re-read on SIGHUP: 'hang <uid>', 'delay <uid> <duration>' (the call waits), "
                 "'late <uid> <duration>' (the answer waits) or 'clear'");
  app.add_option("--upstream-timeout", upstream_timeout,
                 "How long to wait for the upstream to answer at start")
      ->capture_default_str();
  app.add_option("--max-threads", opts.max_threads, "Accepted for compatibility: held calls take no thread")
      ->check(CLI::Range(4, 100000))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.add_option("--log-format", log_format, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a success
  }

  if (auto st = setup_logging(log_level, log_format == "json" ? LogFormat::kJson : LogFormat::kText);
      !st) {
    std::cerr << "kpleg-cri-proxy: " << st.error().message << std::endl;
    return 2;
  }
  std::optional<cri::PodStall> stall;
  if (!stall_pod.empty()) {
    stall = cri::PodStall{stall_pod, cri::StallMode::kHang, {}};
    const bool delayed = !stall_delay.empty();
    if (delayed || !stall_late.empty()) {
      auto d = parse_duration(delayed ? stall_delay : stall_late);
      if (!d) {
        std::cerr << "kpleg-cri-proxy: " << (delayed ? "--stall-delay" : "--stall-late") << ": "
                  << d.error().message << std::endl;
        return 2;
      }
      stall->mode = delayed ? cri::StallMode::kDelay : cri::StallMode::kLateAnswer;
      stall->delay = *d;
    }
  }
  std::chrono::milliseconds list_delay{0};
  if (!full_list_delay.empty()) {
    auto d = parse_duration(full_list_delay);
    if (!d) {
      std::cerr << "kpleg-cri-proxy: --full-list-delay: " << d.error().message << std::endl;
      return 2;
    }
    list_delay = *d;
  }
  auto wait_upstream = parse_duration(upstream_timeout);
  if (!wait_upstream) {
    std::cerr << "kpleg-cri-proxy: --upstream-timeout: " << wait_upstream.error().message
              << std::endl;
    return 2;
  }

  // Signals are taken by the main thread only; the server's threads inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto proxy = cri::CriProxy::start(opts);
  if (!proxy) {
    std::cerr << "kpleg-cri-proxy: " << proxy.error().message << std::endl;
    return 1;
  }
  auto version = (*proxy)->upstream_version(*wait_upstream);
  if (!version) {
    std::cerr << "kpleg-cri-proxy: " << version.error().message << std::endl;
    return 1;
  }
  spdlog::info("upstream runtime: {}", *version);
  if (stall) (*proxy)->set_stalled_pod(*stall);
  if (list_delay.count() > 0) (*proxy)->set_full_list_delay(list_delay);
  // A control file already there at start wins over the flags; one written later is read on
  // SIGHUP.
  if (!control_file.empty() && access(control_file.c_str(), F_OK) == 0) reload(**proxy, control_file);

  while (true) {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) {
      (*proxy)->clear_stall();
    } else if (sig == SIGHUP) {
      if (control_file.empty()) {
        spdlog::warn("SIGHUP without --control-file: nothing to re-read");
      } else {
        reload(**proxy, control_file);
      }
    } else {
      spdlog::info("received {}, shutting down", strsignal(sig));
      break;
    }
  }
  auto s = (*proxy)->stats();
  spdlog::info("forwarded {} calls, stalled {} ({} answered at the caller's deadline)", s.forwarded,
               s.stalled, s.gave_up);
  (*proxy)->shutdown();
  return 0;
}
