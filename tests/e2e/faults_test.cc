// Faults: the runtime dies and comes back, the kernel path cannot load, bad flags.
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>

#include "cri/grpc_cri_client.h"
#include "e2e/e2e_support.h"
#include "support/eventually.h"
#include "support/scratch_cgroup.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

class FaultsTest : public CriTestBedTest {};

TEST_F(FaultsTest, ContainerdKilledAndRestartedNothingMissed) {
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed()) << "needs the test bed's own containerd";
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;

  // Looked up first: the kill must come within the container's lifetime.
  auto pid = TestBed::instance().containerd_pid();
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  auto before = launch_pod(endpoint_, namespace_, "before", 1, "sleep 1000000");
  auto dies_while_down = launch_pod(endpoint_, namespace_, "whiledown", 1, "sh -c 'sleep 5; exit 4'");
  ASSERT_TRUE(before.ok() && dies_while_down.ok());
  ASSERT_TRUE(wait_types(kplegd, dies_while_down->container_ids[0], {"ContainerStarted"}));
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  EXPECT_TRUE(kplegd.wait_for_log("connection lost", 10s)) << kplegd.log();
  // The container exits (5 s after its start) while the runtime is down: wait until its cgroup
  // has no process left.
  const std::string procs = "/sys/fs/cgroup/unified/kubepods/besteffort/pod" + dies_while_down->uid +
                            "/" + dies_while_down->container_ids[0] + "/cgroup.procs";
  const bool exited = eventually(
      [&] {
        std::ifstream in(procs);
        std::string pid;
        return in.good() && !(in >> pid);
      },
      15s, 50ms);
  EXPECT_TRUE(exited) << "the container did not exit while containerd was down (" << procs << ")";
  auto up = TestBed::instance().up();
  ASSERT_TRUE(up.ok()) << up.error().message;

  // No permanent fallback: it reconciles after the reconnect and stays in ebpf mode.
  EXPECT_TRUE(kplegd.wait_for_log("reconcile (runtime reconnect)", 30s)) << kplegd.log();
  EXPECT_EQ(kplegd.log().find("running in relist mode"), std::string::npos);
  // Nothing missed: the death during the outage is reported.
  EXPECT_TRUE(wait_types(kplegd, dies_while_down->container_ids[0],
                         {"ContainerStarted", "ContainerDied"}, 30s));
  // With the runtime's word on how it ended: containerd 1.6 keeps the exit code (4); containerd
  // 2.x deletes the task of a shim it finds with no process left at its restart and reports
  // 255, reason Unknown. kplegd reports what the runtime says either way.
  auto cri = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(cri.ok()) << cri.error().message;
  auto status = (*cri)->container_status(dies_while_down->container_ids[0]);
  ASSERT_TRUE(status.ok()) << status.error().message;
  if (TestBed::instance().runtime() == "containerd-1.6") EXPECT_EQ(status->exit_code(), 4);
  for (const auto& e : kplegd.events()) {
    if (e["container_id"] == dies_while_down->container_ids[0] && e["type"] == "ContainerDied") {
      EXPECT_EQ(e["exit_code"], status->exit_code()) << e.dump();
      EXPECT_EQ(e["reason"], status->reason()) << e.dump();
    }
  }
  // Events resume for new work.
  auto after = launch_pod(endpoint_, namespace_, "after", 1, "sh -c 'sleep 1; exit 0'");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_TRUE(wait_types(kplegd, after->container_ids[0], {"ContainerStarted", "ContainerDied"}));
  EXPECT_TRUE(wait_types(kplegd, before->container_ids[0], {"ContainerStarted"}));
  EXPECT_EQ(kplegd.stop(), 0);
}

// Hole: containerd reloads a container whose checkpoint it cannot read as CONTAINER_UNKNOWN. It
// drops out of a list of exited containers but still exists: the removal sweep must not report
// it removed, and reports it when it really goes.
TEST_F(FaultsTest, AnExitedContainerReloadedAsUnknownAfterARestartIsNotRemoved) {
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed()) << "needs the test bed's own containerd";
  // Logs at debug level (the sweeps); with the kernel's removal hint, whose sweeps the test
  // brings by an rmdir of its own.
  auto d = start_kplegd(endpoint_, "ebpf", {"--removal-hints", "kernel"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto pod = launch_pod(endpoint_, namespace_, "unknown", 1, "sh -c 'exit 0'");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kDied));

  auto pid = TestBed::instance().containerd_pid();
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  // Asked while containerd runs: each runtime of the test bed has a root of its own.
  auto root = TestBed::instance().root_dir();
  ASSERT_TRUE(root.ok()) << root.error().message;
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  EXPECT_TRUE(kplegd.wait_for_log("connection lost", 10s)) << kplegd.log();
  const std::string status = *root + "/io.containerd.grpc.v1.cri/containers/" + id + "/status";
  {
    std::ofstream out(status, std::ios::trunc);
    ASSERT_TRUE(out.good()) << status;
    out << "not a checkpoint";
  }
  auto up = TestBed::instance().up();
  ASSERT_TRUE(up.ok()) << up.error().message;
  EXPECT_TRUE(kplegd.wait_for_log("reconcile (runtime reconnect)", 30s)) << kplegd.log();

  // The premise: the runtime lists it, as UNKNOWN.
  auto cri = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(cri.ok()) << cri.error().message;
  auto listed = (*cri)->list_containers({});
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  bool unknown = false;
  for (const auto& c : *listed)
    if (c.id() == id) unknown = c.state() == runtime::v1::CONTAINER_UNKNOWN;
  ASSERT_TRUE(unknown) << "containerd did not reload " << id << " as CONTAINER_UNKNOWN";

  // Two removal sweeps after the reconcile: still no ContainerRemoved. On a runtime whose
  // removal hints are trusted no sweep runs for an exited container until a hint: one comes
  // from an rmdir of a directory named by the id, as it would from the runtime's own.
  size_t sweeps = 0;
  for (size_t at = 0; (at = kplegd.log().find("removal sweep:", at)) != std::string::npos; ++at)
    ++sweeps;
  char tmpl[] = "/tmp/kpleg-e2e-hint-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string hinted = std::string(tmpl) + "/" + id;
  ASSERT_EQ(mkdir(hinted.c_str(), 0755), 0);
  ASSERT_EQ(rmdir(hinted.c_str()), 0);
  ASSERT_EQ(rmdir(tmpl), 0);
  EXPECT_TRUE(kplegd.wait_for_log("removal sweep:", 40s, sweeps + 2)) << kplegd.log();
  EXPECT_EQ(kplegd.types_for(id), kDied);

  // Removed for real: reported.
  ASSERT_TRUE(load_op(endpoint_, "remove-container", id).ok());
  EXPECT_TRUE(wait_types(kplegd, id, kRemoved, 30s));
  EXPECT_EQ(kplegd.stop(), 0);
}

// The shim of a pod whose cmdline names its sandbox id, or 0.
pid_t shim_of(const std::string& sandbox_id) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("containerd-shim") != std::string::npos &&
        cmdline.find("-id " + sandbox_id + " ") != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// Hole: a death the runtime records only long after the kernel saw it (here its shim is
// stopped for longer than the confirmation budget) is not dropped: kplegd keeps looking and
// reports it, through the kernel path, once the runtime has it.
TEST_F(FaultsTest, ADeathTheRuntimeRecordsLateIsStillReportedByTheKernelPath) {
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed()) << "needs the test bed's own containerd";
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto pod = launch_pod(endpoint_, namespace_, "stalled", 1, "sleep 1000000");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kStarted));
  const pid_t shim = shim_of(pod->sandbox_id);
  ASSERT_GT(shim, 0) << "no shim for " << pod->sandbox_id;
  std::string init;
  std::getline(std::ifstream("/sys/fs/cgroup/unified/kubepods/besteffort/pod" + pod->uid + "/" +
                             id + "/cgroup.procs"),
               init);
  ASSERT_FALSE(init.empty());

  ASSERT_EQ(kill(shim, SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{shim};
  ASSERT_EQ(kill(static_cast<pid_t>(std::stol(init)), SIGKILL), 0);
  // Past the 5 s budget the runtime still says RUNNING: logged once, and it keeps looking.
  EXPECT_TRUE(kplegd.wait_for_log("after a kernel exit; looking again, less often", 20s))
      << kplegd.log();
  EXPECT_EQ(kplegd.types_for(id), kStarted);
  ASSERT_EQ(kill(shim, SIGCONT), 0);
  ASSERT_TRUE(wait_types(kplegd, id, kDied, 30s));
  for (const auto& e : kplegd.events()) {
    if (e["container_id"] != id || e["type"] != "ContainerDied") continue;
    EXPECT_EQ(e["source"], "kernel") << e.dump();
    EXPECT_EQ(e["correction"], false) << e.dump();
    EXPECT_EQ(e["exit_code"], 137) << e.dump();
  }
  EXPECT_EQ(kplegd.stop(), 0);
}

// Another runtime's container under the same kubepods root: kplegd sees it start through the
// kernel, cannot confirm it with its runtime, and lets it be, without a full relist and without
// an event. (A real node's kubepods can hold containers that kplegd's runtime did not make.)
TEST_F(FaultsTest, AnotherRuntimesContainerIsIgnoredWithoutARelist) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;

  char uid[40];
  snprintf(uid, sizeof(uid), "f0e1d2c3-0000-4000-8000-%012x", unsigned(getpid()));
  const std::string pod_dir = std::string("/sys/fs/cgroup/unified/kubepods/besteffort/pod") + uid;
  auto pod = ScratchCgroup::create(pod_dir);
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id(64, 'e');
  auto ctr = ScratchCgroup::create(pod_dir + "/" + id);
  ASSERT_TRUE(ctr.ok()) << ctr.error().message;
  auto pid = spawn_in_cgroup(ctr->path(), {"/bin/sleep", "60"});
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  const bool given_up = kplegd.wait_for_log("the runtime does not know it", 20s);
  kill(*pid, SIGKILL);
  auto status = wait_child(*pid);
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_TRUE(given_up);
  EXPECT_EQ(kplegd.log().find("reconcile (tracker"), std::string::npos)
      << "a foreign container cost a full relist";
  for (const auto& e : kplegd.events()) EXPECT_NE(e["container_id"], id) << e.dump();

  // kplegd's own pods keep working.
  auto own = launch_pod(endpoint_, namespace_, "own", 1, "sh -c 'exit 0'");
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_TRUE(wait_types(kplegd, own->container_ids[0], {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(kplegd.stop(), 0);
}

// A look-alike of a running container's cgroup, made where a user with a delegated cgroup subtree
// could make it (.../kubepods/<qos>/pod<uid>/<the container's id>, any depth): what runs and dies
// there costs no runtime call and no relist, and makes no event for the real container, whose
// own death is still reported.
TEST_F(FaultsTest, ALookAlikeCgroupOfARunningContainerIsIgnored) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto real = launch_pod(endpoint_, namespace_, "real", 1, "sleep 1000000");
  ASSERT_TRUE(real.ok()) << real.error().message;
  const std::string id = real->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kStarted));

  const std::string base = "/sys/fs/cgroup/unified/kpleg-delegated-" + std::to_string(getpid());
  std::vector<ScratchCgroup> dirs;
  dirs.reserve(5);
  for (const std::string& part : std::vector<std::string>{"", "/kubepods", "/kubepods/burstable",
                                 "/kubepods/burstable/pod" + real->uid,
                                 "/kubepods/burstable/pod" + real->uid + "/" + id}) {
    auto c = ScratchCgroup::create(base + part);
    ASSERT_TRUE(c.ok()) << c.error().message;
    dirs.push_back(std::move(*c));
  }
  // Starts and dies in the look-alike: an exec, then an init exit with code 3.
  auto pid = spawn_in_cgroup(dirs.back().path(), {"/bin/sh", "-c", "exit 3"});
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  auto status = wait_child(*pid);
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_TRUE(kplegd.wait_for_log("claims container " + id.substr(0, 12), 20s))
      << "the look-alike was not recognised";
  // No look was made for it, no relist asked for, no event made.
  EXPECT_EQ(kplegd.log().find("reconcile (tracker"), std::string::npos)
      << "a look-alike cost a full relist";
  EXPECT_EQ(kplegd.types_for(id), kStarted);
  while (!dirs.empty()) dirs.pop_back();  // deepest first

  // The real container's death still counts.
  ASSERT_TRUE(load_op(endpoint_, "stop-container", id).ok());
  EXPECT_TRUE(wait_types(kplegd, id, kDied));
  EXPECT_EQ(kplegd.stop(), 0);
}

// A free TCP port on loopback (bound and released; good enough for one test's daemon).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// The fault of a stalled log collector: kplegd's stderr is a pipe nobody reads, it logs at trace
// level (lines for every event), 64 watchers follow its stream and containers churn at 10 per
// second. No kernel record may be lost because a thread waited on stderr, and SIGTERM must end it
// cleanly within 5 s (a logging call blocked on the full pipe would hang shutdown for ever).
TEST_F(FaultsTest, SigtermUnderChurnWithWatchersAndAStalledStderrExitsCleanly) {
  int err_pipe[2];
  ASSERT_EQ(pipe2(err_pipe, O_CLOEXEC), 0);
  // The smallest pipe (a page), so that a few dozen lines fill it.
  const int capacity = fcntl(err_pipe[1], F_SETPIPE_SZ, 4096);
  ASSERT_GT(capacity, 0);
  const std::string sock = "/tmp/kpleg-stalled-" + std::to_string(getpid()) + ".sock";
  const int port = free_port();
  const pid_t kplegd = spawn_with({KPLEGD_BIN, "--runtime-endpoint", endpoint_, "--mode", "ebpf",
                                   "--log-level", "trace", "--socket", sock, "--metrics-address",
                                   "127.0.0.1:" + std::to_string(port), "--max-watchers", "80"},
                                  -1, err_pipe[1]);
  close(err_pipe[1]);
  ASSERT_GT(kplegd, 0);
  struct Reap {
    pid_t pid;
    int fd;
    ~Reap() {
      if (pid > 0 && kill(pid, 0) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      close(fd);
    }
  } reap{kplegd, err_pipe[0]};
  ASSERT_TRUE(eventually([&] {
    auto r = run_process({KPLEGCTL_BIN, "--socket", sock, "health"}, 5s);
    return r.ok() && r->exit_code == 0;
  }, 30s)) << "kplegd did not become healthy";

  std::vector<pid_t> watchers;
  for (int i = 0; i < 64; ++i)
    watchers.push_back(spawn_with({KPLEGCTL_BIN, "--socket", sock, "watch", "-o", "json"}, -1, -1));
  const pid_t churn = spawn_with({KPLEG_LOAD_BIN, "--runtime-endpoint", endpoint_, "churn", "--rate",
                                  "10", "--duration", "8", "--namespace", namespace_},
                                 -1, -1);
  ASSERT_GT(churn, 0);
  // Lines arrive in the pipe; at trace level (tens of KiB a second under churn) a one-page pipe
  // is full at once, and the churn goes on against it. (A page holds a write only whole, so
  // "full" can be well under the capacity in bytes.)
  int queued = 0;
  ASSERT_TRUE(eventually([&] { return ioctl(err_pipe[0], FIONREAD, &queued) == 0 && queued > 0; },
                         30s))
      << "kplegd wrote nothing to stderr";
  std::this_thread::sleep_for(4s);  // churn against the full pipe: the load, not a synchronisation
  ASSERT_EQ(ioctl(err_pipe[0], FIONREAD, &queued), 0);
  std::cout << "stderr pipe: " << queued << " bytes queued of " << capacity << std::endl;
  auto metrics = run_process({"curl", "-sf", "http://127.0.0.1:" + std::to_string(port) + "/metrics"}, 10s);
  ASSERT_TRUE(metrics.ok());
  ASSERT_EQ(metrics->exit_code, 0) << "no /metrics answer: the HTTP thread is blocked";
  auto value = [&](const std::string& series) {
    auto at = metrics->out.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(metrics->out.substr(at + series.size() + 2));
  };
  EXPECT_EQ(value("kpleg_lost_events_total"), 0) << "kernel records lost while stderr stalled";
  EXPECT_GT(value("kpleg_subscribers"), 60) << "the watchers are not all connected";

  kill(kplegd, SIGTERM);
  int status = 0;
  const bool exited = eventually([&] { return waitpid(kplegd, &status, WNOHANG) == kplegd; }, 5s, 20ms);
  reap.pid = exited ? -1 : kplegd;
  EXPECT_TRUE(exited) << "kplegd did not exit within 5 s of SIGTERM with its stderr stalled";
  if (exited) {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  for (pid_t w : watchers) {
    kill(w, SIGKILL);
    waitpid(w, nullptr, 0);
  }
  waitpid(churn, nullptr, 0);
}

// The wall clock steps by an hour, forward then back (NTP after a long drift, a VM resumed,
// an operator's date -s), while the monotonic clock runs on. kplegd's view of the wall clock
// is stepped with libfaketime (CLOCK_REALTIME only), so nothing else on the machine is
// disturbed. Health must not change (it measures ages on the monotonic clock: the last
// reconcile must not look an hour old), and events after each step carry timestamps of the
// new wall clock (the kernel's monotonic timestamps are converted with the clocks of the
// moment), not of the old one.
TEST_F(FaultsTest, AWallClockStepOfAnHourLeavesHealthAloneAndTimestampsFollowIt) {
  const char* kLib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
  KPLEG_REQUIRE_OR_SKIP(access(kLib, R_OK) == 0,
                        std::string("libfaketime is not installed (") + kLib + ")");
  char tmpl[] = "/tmp/kpleg-clockstep-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string offset_file = dir + "/offset";
  auto step_to = [&](const char* offset) {
    std::ofstream(offset_file, std::ios::trunc) << offset << "\n";
  };
  step_to("+0");
  // Only the daemon gets the fake clock: the environment is set around its fork.
  setenv("LD_PRELOAD", kLib, 1);
  setenv("FAKETIME_TIMESTAMP_FILE", offset_file.c_str(), 1);
  setenv("FAKETIME_NO_CACHE", "1", 1);
  setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
  // A short period keeps the reconcile's health threshold (2 periods + 60 s) well below the
  // step: with ages on the wall clock, the step alone would make the daemon unhealthy.
  auto d = start_kplegd(endpoint_, "ebpf", {"--reconcile-period", "5s"});
  for (const char* v : {"LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE", "FAKETIME_NO_CACHE",
                        "FAKETIME_DONT_FAKE_MONOTONIC"})
    unsetenv(v);
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;

  auto stats = [&]() -> nlohmann::json {
    const std::string mark = "api: serving kpleg.v1.PodLifecycle on unix:";
    auto log = kplegd.log();
    auto at = log.find(mark);
    if (at == std::string::npos) return {};
    at += mark.size();
    auto r = run_process({KPLEGCTL_BIN, "--socket", log.substr(at, log.find(' ', at) - at),
                          "stats", "-o", "json"},
                         10s);
    if (!r.ok() || r->exit_code != 0) return {};
    return nlohmann::json::parse(r->out, nullptr, false);
  };
  auto healthy = [&] {
    auto j = stats();
    return j.is_object() && j.value("healthy", false);
  };
  ASSERT_TRUE(eventually(healthy, 20s, 100ms)) << stats().dump();

  int n = 0;
  for (const auto& [offset, shift_s] : {std::pair{"+3600", 3600}, std::pair{"-3600", -3600}}) {
    SCOPED_TRACE(std::string("wall clock ") + offset + " s");
    step_to(offset);
    auto pod = launch_pod(endpoint_, namespace_, "clockstep" + std::to_string(n++), 1,
                          "sleep 1000000");
    ASSERT_TRUE(pod.ok()) << pod.error().message;
    ASSERT_TRUE(wait_types(kplegd, pod->container_ids[0], {"ContainerStarted"}));
    const int64_t expected_now = int64_t(realtime_ns()) + int64_t(shift_s) * 1'000'000'000;
    for (const auto& e : kplegd.events()) {
      if (e.value("container_id", "") != pod->container_ids[0]) continue;
      const int64_t kernel_ts = e.value("kernel_ts_ns", int64_t(0));
      const int64_t emit_ts = e.value("emit_ts_ns", int64_t(0));
      EXPECT_LT(std::llabs(kernel_ts - expected_now), int64_t(120) * 1'000'000'000)
          << "kernel timestamp " << kernel_ts << " is not of the stepped clock (" << expected_now
          << "): " << e.dump();
      EXPECT_LT(std::llabs(emit_ts - expected_now), int64_t(120) * 1'000'000'000) << e.dump();
      EXPECT_LE(kernel_ts, emit_ts) << e.dump();
    }
    // Healthy at every look across more than one reconcile period after the step.
    for (auto until = std::chrono::steady_clock::now() + 7s;
         std::chrono::steady_clock::now() < until;) {
      auto j = stats();
      ASSERT_TRUE(j.is_object()) << "kplegctl stats failed";
      EXPECT_TRUE(j.value("healthy", false)) << j.dump();
      kplegd.wait_for_log("\x01never", 250ms);  // the interval between looks
    }
  }
  EXPECT_EQ(kplegd.stop(), 0);
  std::filesystem::remove_all(dir);
}

TEST_F(FaultsTest, AutoFallsBackToRelistWhenBpfCannotLoad) {
  // A BTF file that does not exist: the kernel source cannot start, as on a kernel without BTF.
  auto d = start_kplegd(endpoint_, "auto", {"--kernel-btf", "/nonexistent/vmlinux"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto log = kplegd.log();
  EXPECT_NE(log.find("kernel event source unavailable"), std::string::npos) << log;
  EXPECT_NE(log.find("BTF"), std::string::npos) << "the reason names the cause: " << log;
  auto pod = launch_pod(endpoint_, namespace_, "fallback", 1, "sh -c 'sleep 2; exit 0'");
  ASSERT_TRUE(pod.ok());
  EXPECT_TRUE(wait_types(kplegd, pod->container_ids[0], {"ContainerStarted", "ContainerDied"}));
  for (const auto& e : kplegd.events()) EXPECT_EQ(e["source"], "relist");
  // Stats says relist mode, and health names why (a reason, not a failure).
  const std::string mark = "api: serving kpleg.v1.PodLifecycle on unix:";
  log = kplegd.log();
  auto at = log.find(mark);
  ASSERT_NE(at, std::string::npos) << log;
  at += mark.size();
  auto r = run_process({KPLEGCTL_BIN, "--socket", log.substr(at, log.find(' ', at) - at), "stats",
                        "-o", "json"},
                       10s);
  ASSERT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.error().message);
  auto stats = nlohmann::json::parse(r->out, nullptr, false);
  EXPECT_EQ(stats.value("mode", ""), "relist") << r->out;
  EXPECT_TRUE(stats.value("healthy", false)) << r->out;
  bool named = false;
  for (const auto& reason : stats.value("health_reasons", nlohmann::json::array()))
    named |= reason.get<std::string>().starts_with("relist mode because: ") &&
             reason.get<std::string>().find("BTF") != std::string::npos;
  EXPECT_TRUE(named) << r->out;
  EXPECT_EQ(kplegd.stop(), 0);
}

TEST_F(FaultsTest, EbpfModeRefusesToRunWithoutTheKernelPath) {
  auto p = KplegdProcess::start({"--runtime-endpoint", endpoint_, "--mode", "ebpf", "--kernel-btf",
                                 "/nonexistent/vmlinux"});
  ASSERT_TRUE(p.ok());
  auto status = (*p)->wait_exit(20s);
  ASSERT_TRUE(status.has_value()) << "kplegd --mode ebpf kept running without BPF";
  EXPECT_EQ(*status, 1);
  EXPECT_NE((*p)->log().find("relist mode (--mode=relist) is the fallback"), std::string::npos)
      << (*p)->log();
}

TEST(KplegdFlags, UnreachableRuntimeIsOneClearErrorAndNonZeroExit) {
  auto p = KplegdProcess::start({"--runtime-endpoint", "unix:///nonexistent/kpleg-test.sock"});
  ASSERT_TRUE(p.ok());
  auto status = (*p)->wait_exit(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 1);
  auto log = (*p)->log();
  EXPECT_NE(log.find("cannot reach the container runtime at unix:///nonexistent/kpleg-test.sock"),
            std::string::npos)
      << log;
}

TEST(KplegdFlags, BadFlagsAreRejected) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--mode", "bogus"},
           {"--reconcile-period", "soon"},
           {"--cri-timeout", "-1s"},
           {"--cgroup-root", "a/b"},
           {"--ringbuf-kib", "3"},
           {"--max-tracked-cgroups", "0"},
           {"--max-tracked-cgroups", "99999999"},
           {"--no-such-flag"}}) {
    auto p = KplegdProcess::start(args);
    ASSERT_TRUE(p.ok());
    auto status = (*p)->wait_exit(10s);
    ASSERT_TRUE(status.has_value()) << args[0];
    EXPECT_NE(*status, 0) << args[0];
    EXPECT_FALSE((*p)->log().empty()) << args[0] << ": no error message";
  }
}

}  // namespace
}  // namespace kpleg::testing
