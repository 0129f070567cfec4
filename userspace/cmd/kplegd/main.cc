// kplegd: kpleg's node daemon. main() only parses flags and wires components together.
#include <absl/synchronization/mutex.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <pthread.h>

#include <thread>

#include "api/api_server.h"
#include "api/options.h"
#include "common/duration.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "daemon/daemon.h"
#include "grpcidle/grpc_idle.h"
#include "kernel/kernel_source.h"
#include "metrics/http_server.h"
#include "selftest/self_test.h"

namespace {

// What grpcidle::install() said ("" when it did its work), logged once logging is set up.
std::string g_grpc_idle_note;

using namespace kpleg;

int wait_for_termination(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

void write_line(const std::string& s) {
  std::string line = s + "\n";
  fwrite(line.data(), 1, line.size(), stdout);
  fflush(stdout);
}

nlohmann::json counters_json(const kernel::KernelSourceStats& s) {
  return {{"emitted", s.bpf.emitted},
          {"filtered", s.bpf.filtered},
          {"ringbuf_drops", s.bpf.ringbuf_drops},
          {"helper_failures", s.bpf.helper_failures},
          {"exec_repeated", s.bpf.exec_repeated},
          {"exit_ignored", s.bpf.exit_ignored},
          {"track_full", s.bpf.track_full},
          {"exec_reexec", s.bpf.exec_reexec},
          {"exec_hook", s.bpf.exec_hook},
          {"received", s.received},
          {"decode_errors", s.decode_errors},
          {"lost", s.lost_reported},
          {"seeded_cgroups", s.seeded_cgroups}};
}

int trace_kernel(const kernel::KernelSourceOptions& opts, const sigset_t& sigs) {
  kernel::BpfKernelSource source(opts);
  kernel::KernelSink sink;
  sink.on_event = [](const kernel::KernelEvent& ev) { write_line(kernel::to_json_line(ev)); };
  sink.on_loss = [](uint64_t n) {
    write_line(nlohmann::json{{"kind", "lost"}, {"count", n}}.dump());
  };
  if (auto st = source.start(sink); !st) {
    spdlog::error("{}", st.error().message);
    return 1;
  }
  int sig = wait_for_termination(sigs);
  spdlog::info("received {}, stopping", strsignal(sig));
  auto stats = source.stats();
  source.stop();
  write_line(nlohmann::json{{"kind", "counters"}, {"counters", counters_json(stats)}}.dump());
  return 0;
}

int self_test(const kernel::BpfOptions& bpf, const std::string& cgroup_base) {
  auto r = selftest::run(bpf, cgroup_base);
  for (const auto& f : r.failures) std::cout << "kpleg self-test: FAILED check: " << f << "\n";
  std::cout << "kpleg self-test: kernel " << r.kernel_release << ": "
            << (r.passed ? "PASS" : "FAIL") << std::endl;
  return r.passed ? 0 : 1;
}

int run_daemon(const daemon::DaemonOptions& opts, const api::ApiServerOptions& api_opts,
               const metrics::MetricsServerOptions& metrics_opts, bool print_events,
               const sigset_t& sigs) {
  if (!g_grpc_idle_note.empty())
    spdlog::warn("gRPC's timer threads wake every second while idle: {}", g_grpc_idle_note);
  auto d = daemon::Daemon::start(opts);
  if (!d) {
    spdlog::error("{}", d.error().message);
    return 1;
  }
  auto& daemon = **d;
  std::unique_ptr<api::ApiServer> api_server;
  if (!api_opts.socket_path.empty() || !api_opts.listen_address.empty()) {
    api_server = std::make_unique<api::ApiServer>(api_opts, daemon.bus(), daemon, daemon, daemon);
    if (auto st = api_server->start(); !st) {
      spdlog::error("consumer API: {}", st.error().message);
      return 1;
    }
  }
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (!metrics_opts.address.empty()) {
    metrics_server =
        std::make_unique<metrics::MetricsServer>(metrics_opts, daemon.registry(), daemon);
    if (auto st = metrics_server->start(); !st) {
      spdlog::error("metrics endpoint: {}", st.error().message);
      return 1;
    }
  }
  std::thread printer;
  std::shared_ptr<bus::Subscription> print_sub;
  if (print_events) {
    // The whole history, so the start-up sync's events are printed too, and subscribed before
    // "ready" is logged, so nothing published after it can be missed. The printer sleeps until
    // an event comes or the subscription is cancelled at shutdown: no periodic wakeup.
    print_sub = std::make_shared<bus::Subscription>(
        daemon.bus().subscribe(bus::kOldestRetained, {}, 1 << 20));
    printer = named_thread("kpleg-print", [sub = print_sub] {
      while (true) {
        auto n = sub->next(std::chrono::hours(24));
        if (n.status == bus::Subscription::Status::kEvent) {
          write_line(pleg::to_json_line(*n.event));
        } else if (n.status == bus::Subscription::Status::kClosed) {
          if (sub->cut_off()) spdlog::error("event printer: {}", sub->close_reason());
          break;
        }
      }
    });
  }
  spdlog::info("kplegd ready: {} mode", daemon::to_string(daemon.active_mode()));
  int sig = wait_for_termination(sigs);
  spdlog::info("received {}, shutting down", strsignal(sig));
  if (print_sub) print_sub->cancel();
  if (printer.joinable()) printer.join();
  if (api_server) api_server->stop();
  if (metrics_server) metrics_server->stop();
  daemon.stop();
  return 0;
}

// Whether the command line gives `flag` (as "--flag value" or "--flag=value"), before CLI11
// parses it.
bool names_flag(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == flag || (arg.starts_with(flag) && arg.size() > flag.size() && arg[flag.size()] == '='))
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // gRPC locks absl mutexes, and Debian's absl checks every lock for deadlock cycles (a graph
  // lookup per lock: 2.8 % of the daemon's perf samples under a 10/s churn). kplegd does not
  // need it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // gRPC's poll engine instead of its default epoll1, unless the environment picks one: with
  // epoll1 every thread that waits on gRPC (the API's server threads, the runtime connection's
  // watcher) takes turns reading every connection, so a runtime response or event is read by
  // one thread and handed to the one waiting for it, a second wakeup each time. With poll, the
  // thread that waits for a response reads it.
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  // gRPC's "backup poller" (a timer every 5 s: what still woke an idle daemon, 0.7 times a
  // second with its timer threads) reads, with the poll engine, a client connection that no
  // thread waits on. kplegd's own calls to the runtime all go over its own HTTP/2 connections
  // (GrpcCriClientOptions::h2_read_calls), and the one grpc++ connection it uses (the runtime
  // connection's watcher) is waited on by its thread all the time, so it needs none. The CRI
  // endpoint's forwarding channel (--cri-listen) does: a call the kubelet makes while that
  // channel is in backoff fails at once, and without the poller nothing would read the
  // reconnection's SETTINGS frame. The environment can still choose. Set here, before
  // grpcidle::install() (gRPC's settings are read from then on), so the command line is only
  // looked through for the flag, not parsed yet.
  if (!names_flag(argc, argv, "--cri-listen"))
    setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", /*overwrite=*/0);
  // Before any gRPC object exists: gRPC's timer threads then sleep until a timer is due instead
  // of waking every second (see grpcidle/grpc_idle.h; a build without it says so in the log).
  g_grpc_idle_note = grpcidle::install();
  CLI::App app{"kplegd: kernel-driven Pod Lifecycle Event Generator"};
  app.set_version_flag("--version", "kplegd 0.1.0");

  daemon::DaemonOptions opts;
  api::ApiServerOptions api_opts;
  metrics::MetricsServerOptions metrics_opts;
  bool trace = false;
  bool run_self_test = false;
  std::vector<std::string> roots;
  uint32_t ringbuf_kib = 4096;
  std::string mode = "auto";
  std::string reconcile_period = "300s", relist_period = "1s", cri_timeout = "2s",
              cri_list_timeout = "60s";
  std::string print_events;
  std::string runtime_events = "auto";
  std::string removal_hints = "auto";
  std::string cri_events = "kpleg";
  std::string stuck_call_threshold = "60s";
  std::string log_level = "info";
  std::string log_format = "text";

  app.add_option("--runtime-endpoint", opts.runtime_endpoint,
                 "CRI endpoint of the container runtime (unix:///path)")
      ->capture_default_str();
  app.add_option("--mode", mode,
                 "auto: kernel events, relist when BPF cannot load; ebpf: kernel events only; "
                 "relist: poll like the kubelet's generic PLEG")
      ->check(CLI::IsMember({"auto", "ebpf", "relist"}))
      ->capture_default_str();
  app.add_option("--reconcile-period", reconcile_period, "Full relist period in ebpf mode")
      ->capture_default_str();
  app.add_option("--relist-period", relist_period, "Relist period in relist mode")
      ->capture_default_str();
  app.add_option("--cri-timeout", cri_timeout, "Deadline of every CRI call but full lists")
      ->capture_default_str();
  app.add_option("--cri-list-timeout", cri_list_timeout,
                 "Deadline of a full ListContainers/ListPodSandbox (the reconcile, the relist, "
                 "the removal sweep), at least --cri-timeout: a large or loaded node takes "
                 "seconds to list everything")
      ->capture_default_str();
  app.add_option("--runtime-events", runtime_events,
                 "ebpf mode: auto: confirm the kernel's signals by the runtime's "
                 "GetContainerEvents stream where it is served (containerd >= 1.7), by targeted "
                 "looks otherwise; off: by targeted looks only")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  app.add_option("--removal-hints", removal_hints,
                 "ebpf mode: what brings the removal sweep for exited containers, which otherwise "
                 "runs every 1-10 s while any exist. auto: the removal of the runtime's directory "
                 "named by the container's id, seen by inotify in the directories of "
                 "--removal-hint-dir, or containerd's own (`containers/` and `sandboxes/` under "
                 "the rootDir its Status names); none found: the periodic sweep. kernel: any rmdir "
                 "of a directory named by the id, seen by BPF syscall tracepoints, at a cost to "
                 "every syscall on the node (docs/design.md). off: the periodic sweep only. "
                 "Hints are trusted from the start on containerd and CRI-O")
      ->check(CLI::IsMember({"auto", "kernel", "off"}))
      ->capture_default_str();
  app.add_option("--removal-hint-dir", opts.removal_hint_dirs,
                 "With --removal-hints auto: a directory where the runtime keeps one "
                 "subdirectory per container or sandbox, named by its id, and removes it with the "
                 "container (CRI-O: its storage root's overlay-containers); repeatable. Absolute "
                 "paths as kplegd sees them")
      ->check([](const std::string& d) {
        return d.size() > 1 && d.front() == '/' && d.back() != '/'
                   ? std::string()
                   : "must be an absolute path of a directory below / (no trailing slash)";
      });
  app.add_option("--cri-listen", opts.cri_listen,
                 "Serve the CRI (RuntimeService, ImageService) on this unix socket for the "
                 "kubelet (--container-runtime-endpoint), forwarding every call to "
                 "--runtime-endpoint, tracking each in the stuck-call watchdog, and answering "
                 "GetContainerEvents from kpleg's events (see --cri-events)");
  app.add_option("--cri-events", cri_events,
                 "With --cri-listen: kpleg: answer GetContainerEvents from kpleg's confirmed "
                 "events, with the pod's full status (what a kubelet up to 1.36 needs; works "
                 "with runtimes that have no event stream); hints: the same events without "
                 "statuses, at no CRI call (enough for a kubelet from 1.37); runtime: forward it "
                 "to the runtime like any call")
      ->check(CLI::IsMember({"kpleg", "hints", "runtime"}))
      ->capture_default_str();
  app.add_option("--stuck-call-threshold", stuck_call_threshold,
                 "A CRI call in flight this long (kplegd's own, or the kubelet's through "
                 "--cri-listen) is named in health and by kplegctl stuck")
      ->capture_default_str();
  app.add_option("--print-events", print_events, "Print every event on stdout (json)")
      ->check(CLI::IsMember({"json"}));
  app.add_flag(
      "--trace-kernel", trace,
      "Print each decoded kernel event as a JSON line until SIGINT/SIGTERM, then the counters");
  app.add_flag(
      "--self-test", run_self_test,
      "Load the BPF programs, exercise a private tracked cgroup, verify the kernel events");
  app.add_option("--cgroup-root", roots,
                 "Name of a tracked cgroup root (repeatable; default: kubepods, kubepods.slice)");
  app.add_option("--ringbuf-kib", ringbuf_kib, "Ring buffer size in KiB (power of two)")
      ->check(CLI::Range(4u, 1u << 20))
      ->capture_default_str();
  app.add_option("--max-tracked-cgroups", opts.kernel.bpf.max_tracked_cgroups,
                 "Capacity of the kernel's map of tracked cgroups (roots, QoS levels, pods, "
                 "containers and the cgroups they nest); when full, new cgroups go unseen "
                 "until a reconcile finds room, and health says so")
      ->check(CLI::Range(kernel::kMinTrackedCgroups, kernel::kMaxTrackedCgroups))
      ->capture_default_str();
  app.add_option("--max-cgroups-per-pod", opts.kernel.bpf.max_cgroups_per_pod,
                 "A pod's budget of tracked cgroups below its pod cgroup (what its containers "
                 "nest: DinD, systemd in a container); a cgroup over it is not tracked, counted "
                 "and the pod named in the log, so that one pod cannot fill the map (0: none)")
      ->capture_default_str();
  app.add_option("--max-cgroup-mkdirs-per-pod", opts.kernel.bpf.max_mkdirs_per_pod_per_sec,
                 "A pod's budget of cgroups made per second below its pod cgroup; one over it "
                 "is not tracked, counted and the pod named (0: none)")
      ->capture_default_str();
  app.add_option("--kernel-btf", opts.kernel.bpf.btf_path,
                 "BTF file of the running kernel (default: /sys/kernel/btf/vmlinux)");
  app.add_option("--cgroup-fs", opts.kernel.cgroup_base,
                 "Where the host's cgroup filesystem is mounted")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  app.add_option("--log-format", log_format, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  api::add_api_flags(app, api_opts, opts.bus);
  metrics::add_metrics_flags(app, metrics_opts);

  CLI11_PARSE(app, argc, argv);

  if (auto st =
          setup_logging(log_level, log_format == "json" ? LogFormat::kJson : LogFormat::kText);
      !st) {
    std::cerr << "kplegd: " << st.error().message << std::endl;
    return 2;
  }
  struct {
    const char* flag;
    std::string& text;
    std::chrono::milliseconds& out;
  } durations[] = {{"--reconcile-period", reconcile_period, opts.reconcile_period},
                   {"--relist-period", relist_period, opts.relist_period},
                   {"--cri-timeout", cri_timeout, opts.cri_timeout},
                   {"--cri-list-timeout", cri_list_timeout, opts.cri_list_timeout},
                   {"--stuck-call-threshold", stuck_call_threshold, opts.stuck_call_threshold}};
  for (auto& d : durations) {
    auto v = parse_duration(d.text);
    if (!v) {
      std::cerr << "kplegd: " << d.flag << ": " << v.error().message << std::endl;
      return 2;
    }
    d.out = *v;
  }
  opts.mode = mode == "ebpf"     ? daemon::Mode::kEbpf
              : mode == "relist" ? daemon::Mode::kRelist
                                 : daemon::Mode::kAuto;
  opts.runtime_events = runtime_events == "auto";
  opts.removal_hints = removal_hints == "auto"     ? daemon::RemovalHintSource::kAuto
                       : removal_hints == "kernel" ? daemon::RemovalHintSource::kKernel
                                                   : daemon::RemovalHintSource::kOff;
  if (!opts.removal_hint_dirs.empty() && opts.removal_hints != daemon::RemovalHintSource::kAuto) {
    std::cerr << "kplegd: --removal-hint-dir needs --removal-hints auto (it is " << removal_hints
              << ")" << std::endl;
    return 2;
  }
  opts.cri_serve_events = cri_events != "runtime";
  opts.cri_event_statuses = cri_events == "kpleg";
  if (opts.cri_timeout <= std::chrono::milliseconds::zero() ||
      opts.cri_list_timeout <= std::chrono::milliseconds::zero()) {
    std::cerr << "kplegd: --cri-timeout and --cri-list-timeout must be positive" << std::endl;
    return 2;
  }
  if (opts.cri_list_timeout < opts.cri_timeout) {
    std::cerr << "kplegd: --cri-list-timeout (" << cri_list_timeout
              << ") is shorter than --cri-timeout (" << cri_timeout
              << "): a full list is the longest call" << std::endl;
    return 2;
  }
  if (opts.stuck_call_threshold <= std::chrono::milliseconds::zero()) {
    std::cerr << "kplegd: --stuck-call-threshold must be positive" << std::endl;
    return 2;
  }
  if (!roots.empty()) opts.kernel.bpf.root_names = roots;
  opts.kernel.bpf.ringbuf_bytes = ringbuf_kib * 1024;
  if (auto st = kernel::validate(opts.kernel.bpf); !st) {
    std::cerr << "kplegd: " << st.error().message << std::endl;
    return 2;
  }

  if (auto st = api_opts.validate(); !st) {
    std::cerr << "kplegd: " << st.error().message << std::endl;
    return 2;
  }

  if (run_self_test) return self_test(opts.kernel.bpf, opts.kernel.cgroup_base);

  // Signals are taken synchronously by the main thread; every other thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  if (trace) return trace_kernel(opts.kernel, sigs);
  return run_daemon(opts, api_opts, metrics_opts, !print_events.empty(), sigs);
}
