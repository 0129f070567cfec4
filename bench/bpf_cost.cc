// kpleg-bench-bpf: what kpleg's BPF programs cost the rest of the node.
//
// 1. Per-program cost from the kernel's own BPF statistics (run_time_ns / run_cnt), with
//    kernel.bpf_stats_enabled=1 for the measurement and its previous value restored after, in
//    three workloads: an exec storm outside any container (the filtered path every process on
//    the node pays), container-like lifecycles in a private tracked cgroup root (the path that
//    emits records), and one OOM kill (the oom:mark_victim program).
// 2. An exec storm outside containers (fork + execve /bin/true + exit + wait) with the programs
//    attached versus not, in short alternating blocks of the same run so that drift and the
//    neighbours on a shared machine hit both sides alike. The object is loaded once and only its
//    links are created and destroyed between blocks (cheap and symmetric; reloading the object
//    for every attached block would leave its teardown to the next, detached, block), with a
//    short untimed pause after each switch. Statistics stay at their previous setting (off on a
//    normal node) during the storm: their own bookkeeping would inflate the attached side.
// 3. A syscall storm (getppid in a loop, the cheapest syscall) in alternating blocks: nothing
//    attached, the programs kplegd attaches by default, and those plus the removal hint's
//    syscall tracepoints (--removal-hints kernel). A syscall tracepoint costs every syscall of every
//    process on the node, whatever its program does: while one is attached, the kernel sends
//    every syscall through its traced entry path.
//
// One JSON document on stdout (or --json-out); progress on stderr.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cgroup/cgroup2_mount.h"
#include "common/logging.h"
#include "kernel/kernel_source.h"
#include "kpleg_bpf.skel.h"
#include "support/scratch_cgroup.h"

namespace {

using json = nlohmann::json;
using kpleg::Error;
using kpleg::Result;
using kpleg::Status;
namespace kk = kpleg::kernel;

constexpr const char* kStatsSysctl = "/proc/sys/kernel/bpf_stats_enabled";

void progress(const std::string& s) { std::cerr << "kpleg-bench-bpf: " << s << std::endl; }

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Result<std::string> read_sysctl(const char* path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v)) return Error{errno ? errno : EIO, std::string("reading ") + path};
  return v;
}

Status write_sysctl(const char* path, const std::string& v) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno(errno, std::string("open ") + path);
  ssize_t n = write(fd, v.data(), v.size());
  int err = errno;
  close(fd);
  if (n != ssize_t(v.size())) return Error::from_errno(err, std::string("write ") + path);
  return {};
}

// The value to put back if the run is interrupted while statistics are on.
char g_stats_restore[16] = {};

void restore_stats_and_exit(int sig) {
  if (g_stats_restore[0] != '\0') {
    int fd = open(kStatsSysctl, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)!write(fd, g_stats_restore, strlen(g_stats_restore));
      close(fd);
    }
  }
  _exit(128 + sig);  // closing the BPF link fds detaches the programs
}

// Sets kernel.bpf_stats_enabled for its lifetime and restores the previous value, also when
// the run is interrupted (restore_stats_and_exit).
class BpfStatsEnabled {
 public:
  static Result<BpfStatsEnabled> enable() {
    auto prev = read_sysctl(kStatsSysctl);
    if (!prev) return prev.error();
    snprintf(g_stats_restore, sizeof g_stats_restore, "%s", prev->c_str());
    if (auto s = write_sysctl(kStatsSysctl, "1"); !s) {
      g_stats_restore[0] = '\0';
      return s.error();
    }
    return BpfStatsEnabled(*prev);
  }
  BpfStatsEnabled(BpfStatsEnabled&& o) noexcept : prev_(std::move(o.prev_)) { o.prev_.reset(); }
  BpfStatsEnabled(const BpfStatsEnabled&) = delete;
  ~BpfStatsEnabled() {
    if (prev_) {
      (void)write_sysctl(kStatsSysctl, *prev_);
      g_stats_restore[0] = '\0';
    }
  }
  const std::string& previous() const { return *prev_; }

 private:
  explicit BpfStatsEnabled(std::string prev) : prev_(std::move(prev)) {}
  std::optional<std::string> prev_;
};

// fork + execve(/bin/true) + exit + waitpid, `n` times. Returns the wall time per iteration.
struct StormResult {
  int64_t wall_ns = 0;
  int64_t children_cpu_ns = 0;  // utime + stime of the reaped children
  int iterations = 0;
  int failures = 0;
};

int64_t children_cpu_ns() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  auto tv = [](const timeval& t) { return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_usec * 1000; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

StormResult exec_storm(int n) {
  static char arg0[] = "/bin/true";
  static char* argv[] = {arg0, nullptr};
  static char* envp[] = {nullptr};
  StormResult r;
  int64_t cpu0 = children_cpu_ns();
  int64_t t0 = monotonic_ns();
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      execve(arg0, argv, envp);
      _exit(127);
    }
    if (pid < 0) {
      ++r.failures;
      continue;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++r.failures;
  }
  r.wall_ns = monotonic_ns() - t0;
  r.children_cpu_ns = children_cpu_ns() - cpu0;
  r.iterations = n;
  return r;
}

// `n` getppid() syscalls in a loop; the wall time per syscall.
StormResult syscall_storm(int n) {
  StormResult r;
  int64_t t0 = monotonic_ns();
  for (int i = 0; i < n; ++i) (void)syscall(SYS_getppid);
  r.wall_ns = monotonic_ns() - t0;
  r.iterations = n;
  return r;
}

enum class Storm : int { kExec, kSyscall };
struct StormJob {
  Storm kind;
  int n;
};

// The storm runs in a worker process forked before any BPF object exists, as on a real node
// where the workload is another process than kplegd: a fork of the process that holds the ring
// buffer mapping, the skeleton and the consumer threads costs far more than the programs do.
class StormWorker {
 public:
  static Result<StormWorker> start() {
    int to_worker[2], from_worker[2];
    if (pipe2(to_worker, O_CLOEXEC) != 0 || pipe2(from_worker, O_CLOEXEC) != 0) {
      return Error::from_errno(errno, "pipe");
    }
    pid_t pid = fork();
    if (pid < 0) return Error::from_errno(errno, "fork");
    if (pid == 0) {
      close(to_worker[1]);
      close(from_worker[0]);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      StormJob job{};
      while (read(to_worker[0], &job, sizeof job) == sizeof job) {
        StormResult r = job.kind == Storm::kExec ? exec_storm(job.n) : syscall_storm(job.n);
        if (write(from_worker[1], &r, sizeof r) != sizeof r) _exit(1);
      }
      _exit(0);
    }
    close(to_worker[0]);
    close(from_worker[1]);
    return StormWorker(pid, to_worker[1], from_worker[0]);
  }
  StormWorker(StormWorker&& o) noexcept : pid_(o.pid_), to_(o.to_), from_(o.from_) { o.pid_ = -1; }
  StormWorker(const StormWorker&) = delete;
  ~StormWorker() {
    if (pid_ < 0) return;
    close(to_);  // EOF ends the worker's loop
    close(from_);
    waitpid(pid_, nullptr, 0);
  }
  Result<StormResult> run(int n, Storm kind = Storm::kExec) {
    StormResult r;
    const StormJob job{kind, n};
    if (write(to_, &job, sizeof job) != sizeof job) return Error::from_errno(errno, "storm worker write");
    if (read(from_, &r, sizeof r) != sizeof r) return Error{EPIPE, "storm worker died"};
    return r;
  }

 private:
  StormWorker(pid_t pid, int to, int from) : pid_(pid), to_(to), from_(from) {}
  pid_t pid_;
  int to_, from_;
};

kk::KernelSourceOptions source_options(const std::vector<std::string>& extra_roots) {
  kk::KernelSourceOptions o;
  for (const auto& r : extra_roots) o.bpf.root_names.push_back(r);
  o.bpf.removal_hint = true;  // measured too (kplegd --removal-hints kernel)
  // The lifecycles run back to back in one pod, faster than a pod's default mkdirs a second:
  // measured is the cost of the emitting paths, so the pod's budget must not refuse them.
  o.bpf.max_mkdirs_per_pod_per_sec = 0;
  o.bpf.max_cgroups_per_pod = 0;
  return o;
}

// The programs as kplegd runs them with --removal-hints kernel: loaded, attached, tracked cgroups
// seeded from the host's tree, the ring buffer consumed. Records are dropped on the floor here.
Result<std::unique_ptr<kk::BpfKernelSource>> attach_programs(const std::vector<std::string>& extra_roots) {
  auto src = std::make_unique<kk::BpfKernelSource>(source_options(extra_roots));
  kk::KernelSink sink;
  sink.on_event = [](const kk::KernelEvent&) {};
  sink.on_loss = [](uint64_t) {};
  if (auto s = src->start(sink); !s) return s.error();
  return src;
}

// kpleg's BPF object, loaded once, whose programs are attached and detached on demand. Its
// tracked-cgroup map stays empty: every process of the storm takes the filtered path, as host
// processes do under kplegd.
class ToggledPrograms {
 public:
  static Result<std::unique_ptr<ToggledPrograms>> load() {
    kpleg_bpf* skel = kpleg_bpf__open();
    if (!skel) return Error::from_errno(errno, "opening the BPF object");
    auto owner = std::unique_ptr<ToggledPrograms>(new ToggledPrograms(skel));
    // The programs with the wake timer are measured (kernels 5.15+), not their twins.
    bpf_program__set_autoload(skel->progs.sched_process_exec_untimed, false);
    bpf_program__set_autoload(skel->progs.cgroup_rmdir_untimed, false);
    if (int err = kpleg_bpf__load(skel); err) return Error::from_errno(-err, "loading the BPF object");
    return owner;
  }
  ~ToggledPrograms() {
    detach();
    kpleg_bpf__destroy(skel_);
  }
  ToggledPrograms(const ToggledPrograms&) = delete;
  ToggledPrograms& operator=(const ToggledPrograms&) = delete;

  // The OOM hook needs tracefs; the others must attach.
  Result<int> attach() {
    int n = 0;
    for (bpf_program* p : {skel_->progs.cgroup_mkdir, skel_->progs.cgroup_rmdir, skel_->progs.sched_process_exec,
                           skel_->progs.sched_process_exit, skel_->progs.oom_mark_victim}) {
      bpf_link* l = bpf_program__attach(p);
      if (!l) {
        if (p == skel_->progs.oom_mark_victim) continue;
        int err = errno;
        detach();
        return Error::from_errno(err, std::string("attaching ") + bpf_program__name(p));
      }
      links_.push_back(l);
      ++n;
    }
    return n;
  }
  // The removal hint's two syscall tracepoints (needs tracefs).
  Status attach_hint() {
    for (bpf_program* p : {skel_->progs.removal_hint_unlinkat, skel_->progs.removal_hint_rmdir}) {
      bpf_link* l = bpf_program__attach(p);
      if (!l) {
        int err = errno;
        detach_hint();
        return Error::from_errno(err, std::string("attaching ") + bpf_program__name(p));
      }
      hint_links_.push_back(l);
    }
    return {};
  }
  void detach() {
    detach_hint();
    for (bpf_link* l : links_) bpf_link__destroy(l);
    links_.clear();
  }
  void detach_hint() {
    for (bpf_link* l : hint_links_) bpf_link__destroy(l);
    hint_links_.clear();
  }
  bool attached() const { return !links_.empty(); }
  bool hint_attached() const { return !hint_links_.empty(); }

 private:
  explicit ToggledPrograms(kpleg_bpf* skel) : skel_(skel) {}
  kpleg_bpf* skel_;
  std::vector<bpf_link*> links_;
  std::vector<bpf_link*> hint_links_;
};

using StatsMap = std::map<std::string, kk::ProgramStats>;

StatsMap stats_of(kk::BpfKernelSource& src) {
  StatsMap m;
  for (auto& s : src.program()->program_stats()) m[s.name] = s;
  return m;
}

json stats_delta(const StatsMap& before, const StatsMap& after) {
  json out = json::object();
  for (const auto& [name, a] : after) {
    auto it = before.find(name);
    uint64_t t = a.run_time_ns - (it == before.end() ? 0 : it->second.run_time_ns);
    uint64_t c = a.run_cnt - (it == before.end() ? 0 : it->second.run_cnt);
    out[name] = {{"run_time_ns", t},
                 {"run_cnt", c},
                 {"ns_per_run", c ? double(t) / double(c) : 0.0}};
  }
  return out;
}

// Container-like lifecycles under a private tracked root: mkdir pod and container cgroups, a
// process that execs twice (the second exec is the in-kernel "repeated exec" filter) and exits,
// rmdir. Every program except the OOM hook takes its emitting path.
Status container_lifecycles(const std::string& root_dir, int n) {
  auto root = kpleg::testing::ScratchCgroup::create(root_dir);
  if (!root) return root.error();
  auto pod = kpleg::testing::ScratchCgroup::create(root->path() + "/pod0b1d3c1e-0000-4000-8000-00000000be0c");
  if (!pod) return pod.error();
  for (int i = 0; i < n; ++i) {
    char id[65];
    snprintf(id, sizeof id, "%064x", i + 1);
    auto ctr = kpleg::testing::ScratchCgroup::create(pod->path() + "/" + id);
    if (!ctr) return ctr.error();
    auto st = kpleg::testing::run_in_cgroup(ctr->path(), {"/bin/sh", "-c", "exec /bin/true"});
    if (!st) return st.error();
    if (auto s = ctr->remove(); !s) return s;
  }
  return {};
}

// One OOM kill: a child in a cgroup v1 memory cgroup limited to 16 MiB touches 256 MiB. Only
// possible where the memory controller is mounted (hybrid hosts have it under v1); the result
// says when it was skipped.
json oom_kill(const std::string& cgroup_fs) {
  std::string dir = cgroup_fs + "/memory/kpleg-bench-oom-" + std::to_string(getpid());
  struct stat st;
  if (stat((cgroup_fs + "/memory").c_str(), &st) != 0) {
    return {{"ran", false}, {"why", "no cgroup v1 memory controller at " + cgroup_fs + "/memory"}};
  }
  if (mkdir(dir.c_str(), 0755) != 0) {
    return {{"ran", false}, {"why", "mkdir " + dir + ": " + std::strerror(errno)}};
  }
  auto write_file = [](const std::string& p, const std::string& v) {
    std::ofstream f(p);
    f << v;
    f.flush();
    return bool(f);
  };
  json r;
  if (!write_file(dir + "/memory.limit_in_bytes", std::to_string(16 << 20))) {
    r = {{"ran", false}, {"why", "cannot set memory.limit_in_bytes"}};
  } else {
    pid_t pid = fork();
    if (pid == 0) {
      std::ofstream(dir + "/cgroup.procs") << "0";
      size_t sz = size_t(256) << 20;
      auto* p = static_cast<char*>(mmap(nullptr, sz, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (p == MAP_FAILED) _exit(3);
      for (size_t i = 0; i < sz; i += 4096) p[i] = 1;
      _exit(0);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    bool killed = pid > 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    r = {{"ran", true}, {"child_oom_killed", killed}};
  }
  rmdir(dir.c_str());
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-bpf: per-program BPF cost and exec-storm slowdown of kpleg's programs"};
  int execs = 5000, rounds = 5, lifecycles = 200, block_execs = 100, syscalls = 2000000;
  std::string json_out;
  bool quick = false;
  app.add_option("--execs", execs, "fork+exec+exit iterations per storm round")
      ->check(CLI::Range(10, 1000000))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Storm rounds with the programs attached (and as many without)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--block-execs", block_execs, "Execs per block; blocks alternate attached/detached")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--lifecycles", lifecycles, "Container-like cgroup lifecycles for the per-program cost")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--syscalls", syscalls, "getppid() syscalls per side per round of the syscall storm")
      ->check(CLI::Range(1000, 1000000000))
      ->capture_default_str();
  app.add_flag("--quick", quick,
               "Small run for smoke tests: 500 execs, 2 rounds, 20 lifecycles, 200000 syscalls");
  app.add_option("--json-out", json_out, "Write the result here instead of stdout");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    execs = 500;
    rounds = 2;
    lifecycles = 20;
    syscalls = 200000;
  }
  if (geteuid() != 0) {
    std::cerr << "kpleg-bench-bpf: needs root (loading BPF programs, kernel.bpf_stats_enabled)\n";
    return 77;
  }
  (void)kpleg::setup_logging("warn", kpleg::LogFormat::kText);
  kk::install_libbpf_logger();
  if (auto pf = kk::preflight(source_options({})); !pf) {
    std::cerr << "kpleg-bench-bpf: " << pf.error().message << "\n";
    return 77;
  }
  signal(SIGINT, restore_stats_and_exit);
  signal(SIGTERM, restore_stats_and_exit);

  auto worker = StormWorker::start();
  if (!worker) {
    std::cerr << "kpleg-bench-bpf: " << worker.error().message << "\n";
    return 1;
  }
  auto storm_in_worker_of = [&](int n, Storm kind) -> StormResult {
    auto r = worker->run(n, kind);
    if (!r) {
      std::cerr << "kpleg-bench-bpf: " << r.error().message << "\n";
      if (g_stats_restore[0] != '\0') (void)write_sysctl(kStatsSysctl, g_stats_restore);
      std::exit(1);
    }
    return *r;
  };
  auto storm_in_worker = [&](int n) { return storm_in_worker_of(n, Storm::kExec); };

  json result;
  result["config"] = {{"execs_per_round", execs}, {"rounds", rounds}, {"block_execs", block_execs},
                      {"lifecycles", lifecycles}, {"syscalls_per_side", syscalls},
                      {"quick", quick}};

  // --- 1. per-program cost -------------------------------------------------------------------
  {
    auto mount = kpleg::cgroup::find_cgroup2_mount("/sys/fs/cgroup");
    if (!mount) {
      std::cerr << "kpleg-bench-bpf: " << mount.error().message << "\n";
      return 1;
    }
    std::string root_name = "kpleg-bench-" + std::to_string(getpid());
    auto stats_guard = BpfStatsEnabled::enable();
    if (!stats_guard) {
      std::cerr << "kpleg-bench-bpf: kernel.bpf_stats_enabled: " << stats_guard.error().message << "\n";
      return 1;
    }
    result["bpf_stats_enabled_before"] = stats_guard->previous();
    auto src = attach_programs({root_name});
    if (!src) {
      std::cerr << "kpleg-bench-bpf: " << src.error().message << "\n";
      return 1;
    }
    progress("per-program cost: exec storm outside containers (" + std::to_string(execs) + ")");
    auto s0 = stats_of(**src);
    auto storm = storm_in_worker(execs);
    auto s1 = stats_of(**src);
    progress("per-program cost: " + std::to_string(lifecycles) + " container-like lifecycles");
    if (auto s = container_lifecycles(*mount + "/" + root_name, lifecycles); !s) {
      std::cerr << "kpleg-bench-bpf: container lifecycles: " << s.error().message << "\n";
      return 1;
    }
    auto s2 = stats_of(**src);
    progress("per-program cost: one OOM kill");
    json oom = oom_kill("/sys/fs/cgroup");
    auto s3 = stats_of(**src);
    auto counters = (*src)->stats().bpf;
    result["program_cost"] = {
        {"outside_containers", {{"storm_iterations", storm.iterations}, {"programs", stats_delta(s0, s1)}}},
        {"container_lifecycles", {{"lifecycles", lifecycles}, {"programs", stats_delta(s1, s2)}}},
        {"oom_kill", {{"oom", oom}, {"programs", stats_delta(s2, s3)}}},
        {"whole_phase", {{"programs", stats_delta(s0, s3)}}},
        {"bpf_counters",
         {{"emitted", counters.emitted},
          {"filtered", counters.filtered},
          {"ringbuf_drops", counters.ringbuf_drops},
          {"exec_repeated", counters.exec_repeated},
          {"exit_ignored", counters.exit_ignored}}}};
    (*src)->stop();
  }  // statistics back to their previous setting

  // --- 2. exec storm, attached vs detached, alternating --------------------------------------
  std::vector<double> ratios, cpu_ratios, attached_us, detached_us;
  json rounds_json = json::array();
  progress("exec storm warm-up");
  (void)storm_in_worker(std::max(100, execs / 10));
  // Each round runs its execs per side in blocks of `block_execs`, in ABBA order (off on on off
  // off on ...), mirrored every other round, so that bursts from neighbours on a shared machine
  // land on both sides alike.
  auto programs = ToggledPrograms::load();
  if (!programs) {
    std::cerr << "kpleg-bench-bpf: " << programs.error().message << "\n";
    return 1;
  }
  int attached_programs = 0;
  auto set_attached = [&](bool on) -> bool {
    if (on == (*programs)->attached()) return true;
    if (on) {
      auto n = (*programs)->attach();
      if (!n) {
        std::cerr << "kpleg-bench-bpf: " << n.error().message << "\n";
        return false;
      }
      attached_programs = *n;
    } else {
      (*programs)->detach();
    }
    // Untimed: whatever the switch left for the kernel to finish is done before the next block.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return true;
  };
  const int blocks = std::max(1, execs / block_execs);
  const int per_block = std::max(1, execs / blocks);
  for (int r = 0; r < rounds; ++r) {
    StormResult on, off;
    for (int b = 0; b < 2 * blocks; ++b) {
      bool side_on = ((b + 1) / 2) % 2 == 1;  // off on on off off on on ...
      if (r % 2 == 1) side_on = !side_on;     // and the mirror image every other round
      if (!set_attached(side_on)) return 1;
      StormResult x = storm_in_worker(per_block);
      StormResult& acc = side_on ? on : off;
      acc.wall_ns += x.wall_ns;
      acc.children_cpu_ns += x.children_cpu_ns;
      acc.iterations += x.iterations;
      acc.failures += x.failures;
    }
    if (!set_attached(false)) return 1;
    double on_us = on.wall_ns / 1e3 / on.iterations, off_us = off.wall_ns / 1e3 / off.iterations;
    double ratio = on_us / off_us;
    double cpu_ratio = (double(on.children_cpu_ns) / on.iterations) /
                       std::max(1.0, double(off.children_cpu_ns) / off.iterations);
    ratios.push_back(ratio);
    cpu_ratios.push_back(cpu_ratio);
    attached_us.push_back(on_us);
    detached_us.push_back(off_us);
    rounds_json.push_back({{"round", r},
                           {"execs_per_side", on.iterations},
                           {"attached_us_per_exec", on_us},
                           {"detached_us_per_exec", off_us},
                           {"wall_ratio", ratio},
                           {"children_cpu_ratio", cpu_ratio},
                           {"failures", on.failures + off.failures}});
    progress("round " + std::to_string(r) + ": attached " + std::to_string(on_us) +
             " us/exec, detached " + std::to_string(off_us) + " us/exec, ratio " +
             std::to_string(ratio));
  }
  auto [mn, mx] = std::minmax_element(ratios.begin(), ratios.end());
  double med = median(ratios);
  // The estimate from the kernel's statistics: what the exec and exit programs cost per
  // storm iteration (one exec, one thread exit), relative to one iteration's wall time.
  const auto& outside = result["program_cost"]["outside_containers"]["programs"];
  double bpf_ns_per_iter = 0;
  for (const char* p : {"sched_process_exec", "sched_process_exit"}) {
    if (outside.contains(p)) bpf_ns_per_iter += outside[p]["ns_per_run"].get<double>();
  }
  double iter_ns = median(detached_us) * 1e3;
  result["exec_storm"] = {
      {"rounds", rounds_json},
      {"median_wall_ratio", med},
      {"min_wall_ratio", *mn},
      {"max_wall_ratio", *mx},
      {"median_children_cpu_ratio", median(cpu_ratios)},
      {"median_attached_us_per_exec", median(attached_us)},
      {"median_detached_us_per_exec", median(detached_us)},
      {"median_slowdown_percent", (med - 1) * 100},
      // All rounds together: mean attached over mean detached time per exec.
      {"pooled_wall_ratio", std::accumulate(attached_us.begin(), attached_us.end(), 0.0) /
                                std::accumulate(detached_us.begin(), detached_us.end(), 0.0)},
      {"attached_programs", attached_programs},
      {"blocks_per_side_per_round", blocks},
      {"bpf_ns_per_iteration_from_stats", bpf_ns_per_iter},
      {"slowdown_percent_from_stats", iter_ns > 0 ? 100.0 * bpf_ns_per_iter / iter_ns : 0.0},
  };
  progress("median ratio " + std::to_string(med) + " (min " + std::to_string(*mn) + ", max " +
           std::to_string(*mx) + ")");

  // --- 3. syscall storm: nothing, kplegd's default programs, and the removal hint too --------
  // Each round runs the sides in blocks, in the order none default hint hint default none
  // (so that drift hits all three alike), five times: ten blocks per side.
  enum Side { kNone, kDefault, kHint };
  static constexpr const char* kSideNames[] = {"none", "default", "default_and_removal_hint"};
  // A side that cannot be set up (no tracefs for the hint) leaves this part out, not the run.
  std::string storm_error;
  auto set_side = [&](Side side) -> bool {
    if (!set_attached(side != kNone)) {
      storm_error = "attaching the programs";
      return false;
    }
    if ((side == kHint) != (*programs)->hint_attached()) {
      if (side == kHint) {
        if (auto st = (*programs)->attach_hint(); !st) {
          storm_error = st.error().message;
          return false;
        }
      } else {
        (*programs)->detach_hint();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  };
  progress("syscall storm: " + std::to_string(syscalls) + " getppid() per side per round");
  (void)storm_in_worker_of(syscalls / 10, Storm::kSyscall);  // warm-up
  constexpr int kSyscallBlocksPerSide = 10;
  const int per_syscall_block = std::max(1, syscalls / kSyscallBlocksPerSide);
  std::vector<double> side_ns[3];
  json syscall_rounds = json::array();
  for (int r = 0; r < rounds && storm_error.empty(); ++r) {
    int64_t wall[3] = {}, n[3] = {};
    for (int b = 0; b < 3 * kSyscallBlocksPerSide && storm_error.empty(); ++b) {
      static constexpr Side kOrder[] = {kNone, kDefault, kHint, kHint, kDefault, kNone};
      Side side = kOrder[b % 6];
      if (!set_side(side)) break;
      StormResult x = storm_in_worker_of(per_syscall_block, Storm::kSyscall);
      wall[side] += x.wall_ns;
      n[side] += x.iterations;
    }
    if (!storm_error.empty()) break;
    json round = {{"round", r}, {"syscalls_per_side", n[kNone]}};
    for (int side = kNone; side <= kHint; ++side) {
      double ns = double(wall[side]) / double(n[side]);
      side_ns[side].push_back(ns);
      round[std::string(kSideNames[side]) + "_ns_per_syscall"] = ns;
    }
    syscall_rounds.push_back(round);
    progress("syscall round " + std::to_string(r) + ": none " + std::to_string(side_ns[kNone].back()) +
             " ns, default " + std::to_string(side_ns[kDefault].back()) + " ns, with the removal hint " +
             std::to_string(side_ns[kHint].back()) + " ns per syscall");
  }
  (*programs)->detach();
  if (storm_error.empty()) {
    json syscall_json = {{"rounds", syscall_rounds}};
    for (int side = kNone; side <= kHint; ++side) {
      syscall_json[std::string("median_") + kSideNames[side] + "_ns_per_syscall"] = median(side_ns[side]);
    }
    // Each against nothing attached.
    syscall_json["median_default_extra_ns_per_syscall"] = median(side_ns[kDefault]) - median(side_ns[kNone]);
    syscall_json["median_removal_hint_extra_ns_per_syscall"] = median(side_ns[kHint]) - median(side_ns[kNone]);
    result["syscall_storm"] = syscall_json;
  } else {
    progress("syscall storm left out: " + storm_error);
    result["syscall_storm"] = {{"error", storm_error}};
  }
  std::string doc = result.dump(2);
  if (json_out.empty()) {
    std::cout << doc << std::endl;
  } else {
    std::ofstream f(json_out);
    f << doc << '\n';
    if (!f) {
      std::cerr << "kpleg-bench-bpf: writing " << json_out << " failed\n";
      return 1;
    }
  }
  return 0;
}
