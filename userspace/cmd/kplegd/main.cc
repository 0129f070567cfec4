// kplegd: kpleg's node daemon. main() only parses flags and wires components together.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "kernel/kernel_source.h"
#include "kernel/self_test.h"

namespace {

using namespace kpleg;

// Blocks SIGINT/SIGTERM in every thread and returns the signal that arrives.
int wait_for_termination(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

nlohmann::json counters_json(const kernel::KernelSourceStats& s) {
  return {{"emitted", s.bpf.emitted},
          {"filtered", s.bpf.filtered},
          {"ringbuf_drops", s.bpf.ringbuf_drops},
          {"helper_failures", s.bpf.helper_failures},
          {"exec_repeated", s.bpf.exec_repeated},
          {"exit_ignored", s.bpf.exit_ignored},
          {"track_full", s.bpf.track_full},
          {"received", s.received},
          {"decode_errors", s.decode_errors},
          {"lost", s.lost_reported},
          {"seeded_cgroups", s.seeded_cgroups}};
}

int trace_kernel(const kernel::KernelSourceOptions& opts, const sigset_t& sigs) {
  kernel::BpfKernelSource source(opts);
  kernel::KernelSink sink;
  sink.on_event = [](const kernel::KernelEvent& ev) {
    std::string line = kernel::to_json_line(ev);
    line.push_back('\n');
    fwrite(line.data(), 1, line.size(), stdout);
    fflush(stdout);
  };
  sink.on_loss = [](uint64_t n) {
    std::string line = nlohmann::json{{"kind", "lost"}, {"count", n}}.dump() + "\n";
    fwrite(line.data(), 1, line.size(), stdout);
    fflush(stdout);
  };
  if (auto st = source.start(sink); !st) {
    spdlog::error("{}", st.error().message);
    return 1;
  }
  int sig = wait_for_termination(sigs);
  spdlog::info("received {}, stopping", strsignal(sig));
  auto stats = source.stats();
  source.stop();
  std::cout << nlohmann::json{{"kind", "counters"}, {"counters", counters_json(stats)}}.dump()
            << std::endl;
  return 0;
}

int self_test(const kernel::BpfOptions& bpf, const std::string& cgroup_base) {
  auto r = kernel::run_self_test(bpf, cgroup_base);
  for (const auto& f : r.failures) std::cout << "kpleg self-test: FAILED check: " << f << "\n";
  std::cout << "kpleg self-test: kernel " << r.kernel_release << ": "
            << (r.passed ? "PASS" : "FAIL") << std::endl;
  return r.passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kplegd: kernel-driven Pod Lifecycle Event Generator"};
  app.set_version_flag("--version", "kplegd 0.1.0");

  bool trace = false;
  bool run_self_test = false;
  std::vector<std::string> roots;
  uint32_t ringbuf_kib = 4096;
  std::string btf_path;
  std::string cgroup_base = "/sys/fs/cgroup";
  std::string log_level = "info";
  std::string log_format = "text";

  app.add_flag("--trace-kernel", trace,
               "Print each decoded kernel event as a JSON line until SIGINT/SIGTERM, then the counters");
  app.add_flag("--self-test", run_self_test,
               "Load the BPF programs, exercise a private tracked cgroup, verify the kernel events");
  app.add_option("--cgroup-root", roots,
                 "Name of a tracked cgroup root (repeatable; default: kubepods, kubepods.slice)");
  app.add_option("--ringbuf-kib", ringbuf_kib, "Ring buffer size in KiB (power of two)")
      ->check(CLI::Range(4u, 1u << 20));
  app.add_option("--kernel-btf", btf_path,
                 "BTF file of the running kernel (default: /sys/kernel/btf/vmlinux)");
  app.add_option("--cgroup-fs", cgroup_base, "Where the host's cgroup filesystem is mounted")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.add_option("--log-format", log_format, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  if (auto st = setup_logging(log_level, log_format == "json" ? LogFormat::kJson : LogFormat::kText);
      !st) {
    std::cerr << "kplegd: " << st.error().message << std::endl;
    return 2;
  }

  kernel::KernelSourceOptions opts;
  if (!roots.empty()) opts.bpf.root_names = roots;
  opts.bpf.ringbuf_bytes = ringbuf_kib * 1024;
  opts.bpf.btf_path = btf_path;
  opts.cgroup_base = cgroup_base;
  if (auto st = kernel::validate(opts.bpf); !st) {
    std::cerr << "kplegd: " << st.error().message << std::endl;
    return 2;
  }

  if (run_self_test) return self_test(opts.bpf, cgroup_base);

  // Signals are taken synchronously by the main thread; every other thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  if (trace) return trace_kernel(opts, sigs);

  std::cerr << "kplegd: nothing to do yet: pass --trace-kernel or --self-test" << std::endl;
  return 2;
}
