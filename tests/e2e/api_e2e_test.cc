// The consumer side of the running daemon: kplegctl and gRPC health against kplegd with the
// runtime going away and coming back, promtool on the live /metrics, and the README's main
// command run as a new user would.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <set>

#include "api/client.h"
#include "api/health_names.h"
#include "e2e/e2e_support.h"
#include "e2e/node_probes.h"
#include "kpleg/v1/pleg.grpc.pb.h"
#include "support/eventually.h"
#include "support/thread_wakeups.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using grpc::health::v1::HealthCheckResponse;

class ApiE2eTest : public CriTestBedTest {
 protected:
  // kplegd's /metrics text, empty when the scrape failed.
  std::string scrape(int port) {
    auto r = run_process({"curl", "-sf", "http://127.0.0.1:" + std::to_string(port) + "/metrics"}, 10s);
    return r.ok() && r->exit_code == 0 ? r->out : std::string();
  }
  // The sum of kpleg_cri_calls_total over methods and codes.
  double cri_calls(int port) {
    double sum = 0;
    std::istringstream in(scrape(port));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("kpleg_cri_calls_total{", 0) == 0) sum += std::stod(line.substr(line.rfind(' ') + 1));
    return sum;
  }
  // The value of one series in a scrape, -1 when it is missing. The series is written with its
  // labels sorted by name, as prometheus-cpp writes them.
  static double value(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
  }
  Result<ProcessResult> kplegctl(const std::string& socket, std::vector<std::string> args) {
    args.insert(args.begin(), {KPLEGCTL_BIN, "--socket", socket});
    return run_process(args, 20s);
  }
  HealthCheckResponse::ServingStatus grpc_health(const std::string& socket) {
    auto ch = grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(ch);
    grpc::health::v1::HealthCheckRequest req;
    HealthCheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    if (!stub->Check(&ctx, req, &resp).ok()) return HealthCheckResponse::UNKNOWN;
    return resp.status();
  }
  // Whether no thread of kplegd is scheduled in for `span` within `within`; else `woke` names
  // the threads of the last wakeups. A kplegd built without grpcidle (KPLEG_GRPCIDLE, see
  // userspace/grpcidle/CMakeLists.txt) has gRPC's timer threads wake about once a second by
  // design: they are left out of the sample then, and every other thread must still sleep.
  bool quiet_span(const KplegdProcess& kplegd, std::chrono::seconds span,
                  std::chrono::seconds within, std::string& woke) {
    auto sample = [&] {
      auto s = scheduled_in(std::to_string(kplegd.pid()));
      if (!KPLEG_GRPCIDLE_BUILT)
        std::erase_if(s, [](const auto& thread) {
          return thread.first.starts_with("grpc_global_tim/") ||
                 thread.first.starts_with("timer_manager/");
        });
      return s;
    };
    auto last = sample();
    auto quiet_since = std::chrono::steady_clock::now();
    // Sampling a process's counters every 500 ms: there is no event to wait on.
    return testing::eventually(
        [&] {
          auto now = sample();
          if (now == last) return std::chrono::steady_clock::now() - quiet_since >= span;
          woke.clear();
          for (const auto& [thread, n] : now)
            if (n != last[thread]) woke += " " + thread + " +" + std::to_string(n - last[thread]);
          last = std::move(now);
          quiet_since = std::chrono::steady_clock::now();
          return false;
        },
        within, 500ms);
  }
  template <typename F>
  bool eventually(F f, std::chrono::milliseconds timeout) {
    // Polling a process's exit status or a scrape: no event to wait on.
    return testing::eventually(f, timeout, 200ms);
  }
};

// httplib's timeout is per read: 40 clients that each send a header byte every 200 ms held all
// 32 workers for as long as they liked, and /healthz (the probes, before they went through the
// API socket) was not answered at all. Each request now has a deadline for the whole of it: the
// trickling clients are cut off and the probes answered.
TEST_F(ApiE2eTest, ClientsTricklingHeaderBytesDoNotStarveTheHealthEndpoints) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  const int port = metrics_port(**d);
  ASSERT_GT(port, 0) << (*d)->log();
  ASSERT_EQ(http_status(port, "/healthz", 5s), 200) << (*d)->log();

  constexpr int kTricklers = 40;
  HeaderTricklers tricklers(port, kTricklers);
  ASSERT_TRUE(eventually([&] { return tricklers.connections() >= kTricklers; }, 10s));

  // Probed back to back while they trickle: every answer within the bound (one request deadline
  // to wait for a worker, one to be served, and slack for a loaded machine).
  constexpr auto kBound = 3s;
  // Until every trickling client has been cut off at least once, and at least 8 rounds.
  std::chrono::milliseconds slowest{0};
  int answered = 0, asked = 0;
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (int i = 0; (i < 8 || tricklers.cut_off() < kTricklers) && std::chrono::steady_clock::now() < until; ++i) {
    for (const char* path : {"/healthz", "/livez", "/readyz"}) {
      ++asked;
      const auto t0 = std::chrono::steady_clock::now();
      const int code = http_status(port, path, kBound);
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
      slowest = std::max(slowest, took);
      EXPECT_EQ(code, 200) << path << " not answered within " << kBound.count() << " s (try " << i
                           << ", took " << took.count() << " ms)";
      if (code == 200) ++answered;
    }
  }
  tricklers.stop();
  EXPECT_EQ(answered, asked) << "slowest " << slowest.count() << " ms";
  EXPECT_GE(tricklers.cut_off(), kTricklers) << "every trickling client is cut off at least once";
  std::printf("health endpoints under %d trickling clients: %d of %d answered, slowest %lld ms; "
              "%d trickling connections, %d cut off\n",
              kTricklers, answered, asked, static_cast<long long>(slowest.count()),
              tricklers.connections(), tricklers.cut_off());
  EXPECT_EQ((*d)->stop(), 0);
}

// Liveness means kplegd itself is stuck, readiness that its events cannot be trusted: with the
// runtime frozen (SIGSTOP: connected, answering nothing) readiness fails and liveness holds, so
// the kubelet takes kplegd out of service instead of restarting it in a loop; when the runtime
// thaws, readiness comes back without a restart.
TEST_F(ApiE2eTest, AFrozenRuntimeFailsReadinessButNotLiveness) {
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed()) << "needs the test bed's own containerd";
  auto d = start_kplegd(endpoint_, "ebpf", {"--reconcile-period", "1s", "--cri-list-timeout", "2s"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const int port = metrics_port(kplegd);
  const auto socket = socket_of(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  auto probe = [&](const char* kind) {
    auto r = kplegctl(socket, {"--timeout", "4", "probe", kind});
    return r.ok() ? r->exit_code : -1;
  };
  auto grpc_check = [&](const char* service) {
    auto ch = grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    HealthCheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    auto st = grpc::health::v1::Health::NewStub(ch)->Check(&ctx, req, &resp);
    return st.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
  };
  ASSERT_TRUE(eventually([&] { return http_status(port, "/readyz", 5s) == 200; }, 20s)) << kplegd.log();
  EXPECT_EQ(probe("ready"), 0);
  EXPECT_EQ(probe("live"), 0);
  EXPECT_EQ(probe("startup"), 0);
  EXPECT_EQ(http_status(port, "/livez", 5s), 200);

  auto pid = TestBed::instance().containerd_pid();
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  ASSERT_EQ(kill(*pid, SIGSTOP), 0);
  struct Thaw {
    pid_t pid;
    ~Thaw() { kill(pid, SIGCONT); }
  } thaw{*pid};

  // Liveness is read at every step while readiness goes down, and for a while after.
  int live_checks = 0, live_failures = 0;
  auto live_holds = [&] {
    ++live_checks;
    if (http_status(port, "/livez", 5s) != 200) ++live_failures;
    if (grpc_check(api::kLivenessService) != HealthCheckResponse::SERVING) ++live_failures;
  };
  Result<ProcessResult> ready = Error{0, ""};
  EXPECT_TRUE(eventually([&] {
    live_holds();
    ready = kplegctl(socket, {"--timeout", "4", "probe", "ready"});
    return ready.ok() && ready->exit_code == 1 && http_status(port, "/readyz", 5s) == 503;
  }, 30s)) << kplegd.log();
  ASSERT_TRUE(ready.ok());
  EXPECT_NE(ready->out.find("reconcile failed"), std::string::npos) << ready->out;
  EXPECT_EQ(grpc_check(api::kReadinessService), HealthCheckResponse::NOT_SERVING);
  // Several reconciles fail while it stays frozen (each ends at its list's 2 s deadline).
  const auto frozen_until = std::chrono::steady_clock::now() + 8s;
  while (std::chrono::steady_clock::now() < frozen_until) {
    live_holds();
    EXPECT_EQ(probe("live"), 0);
  }
  EXPECT_EQ(live_failures, 0) << "of " << live_checks << " liveness checks";
  EXPECT_FALSE(kplegd.wait_exit(0ms).has_value()) << "kplegd must keep running";

  kill(*pid, SIGCONT);
  EXPECT_TRUE(eventually([&] { return http_status(port, "/readyz", 5s) == 200; }, 30s)) << kplegd.log();
  EXPECT_EQ(probe("ready"), 0);
  EXPECT_EQ(kplegd.stop(), 0);
}


TEST_F(ApiE2eTest, HealthFollowsTheRuntimeWithoutARestart) {
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed());
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto socket = socket_of(**d);
  ASSERT_FALSE(socket.empty()) << (*d)->log();
  ASSERT_TRUE(eventually([&] {
    auto r = kplegctl(socket, {"health"});
    return r.ok() && r->exit_code == 0;
  }, 10s));
  EXPECT_EQ(grpc_health(socket), HealthCheckResponse::SERVING);

  auto pid = TestBed::instance().containerd_pid();
  ASSERT_TRUE(pid.ok());
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  Result<ProcessResult> r = Error{0, ""};
  EXPECT_TRUE(eventually([&] {
    r = kplegctl(socket, {"health"});
    return r.ok() && r->exit_code == 1;
  }, 15s));
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->out.find("container runtime unreachable"), std::string::npos) << r->out;
  EXPECT_TRUE(eventually([&] { return grpc_health(socket) == HealthCheckResponse::NOT_SERVING; }, 10s));

  ASSERT_TRUE(TestBed::instance().up().ok());
  EXPECT_TRUE(eventually([&] {
    auto h = kplegctl(socket, {"health"});
    return h.ok() && h->exit_code == 0;
  }, 30s));
  EXPECT_TRUE(eventually([&] { return grpc_health(socket) == HealthCheckResponse::SERVING; }, 10s));
  EXPECT_EQ((*d)->stop(), 0);
}

// A container the kernel path cannot see (here: its cgroup is below a root kplegd was told not
// to track) is named in health and counted in kpleg_uncovered_containers, instead of silently
// getting its events at reconcile speed only; the same pod seen by a kplegd with the default
// roots is covered.
TEST_F(ApiE2eTest, ContainersTheKernelPathCannotSeeAreNamedAndCounted) {
  auto pod = launch_pod(endpoint_, namespace_, "unseen", 1, "sleep 600");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  auto uncovered = [&](KplegdProcess& d) {
    return value(scrape(metrics_port(d)), "kpleg_uncovered_containers");
  };

  auto blind = start_kplegd(endpoint_, "ebpf", {"--cgroup-root", "not-kubepods"});
  ASSERT_TRUE(blind.ok()) << blind.error().message;
  // The start-up sync has run (start_kplegd waits for it): the pod's sandbox and container.
  EXPECT_EQ(uncovered(**blind), 2) << (*blind)->log();
  auto health = kplegctl(socket_of(**blind), {"health"});
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->exit_code, 0) << "degraded, not failing: " << health->out;
  EXPECT_NE(health->out.find("2 running containers and sandboxes are not seen by the kernel path"),
            std::string::npos)
      << health->out;
  EXPECT_NE(health->out.find("/" + pod->name), std::string::npos) << "names one: " << health->out;
  EXPECT_NE((*blind)->log().find("not seen by the kernel path"), std::string::npos);
  EXPECT_EQ((*blind)->stop(), 0);

  auto seeing = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(seeing.ok()) << seeing.error().message;
  EXPECT_EQ(uncovered(**seeing), 0) << (*seeing)->log();
  health = kplegctl(socket_of(**seeing), {"health"});
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->out, "healthy\n");
  EXPECT_EQ((*seeing)->stop(), 0);
}

// A node with more cgroups than the kernel's tracked-cgroup map holds: a pod made while it is
// full is flagged by the kernel, reconciled at once (its start is not left to the 300 s
// reconcile), named in health and counted; once there is room, the resync at the next
// reconcile tracks it and its death comes from the kernel path again.
TEST_F(ApiE2eTest, AFullTrackedCgroupMapIsNamedCountedAndReconciledUntilThereIsRoom) {
  // Fillers: the map is sized to exactly the cgroups that exist when kplegd starts.
  std::vector<LaunchedPod> fillers;
  for (const char* name : {"filler-a", "filler-b"}) {
    auto f = launch_pod(endpoint_, namespace_, name, 1, "sleep 600");
    ASSERT_TRUE(f.ok()) << f.error().message;
    fillers.push_back(*f);
  }
  double existing = 0;
  {
    auto probe = start_kplegd(endpoint_, "ebpf");
    ASSERT_TRUE(probe.ok()) << probe.error().message;
    existing = value(scrape(metrics_port(**probe)), "kpleg_bpf_tracked_cgroups");
    EXPECT_EQ((*probe)->stop(), 0);
  }
  ASSERT_GE(existing, 8) << "two pods make six cgroups under kubepods";
  const std::string capacity = std::to_string(int(existing));
  auto d = start_kplegd(endpoint_, "ebpf",
                        {"--max-tracked-cgroups", capacity, "--reconcile-period", "3s"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const int port = metrics_port(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  EXPECT_EQ(value(scrape(port), "kpleg_bpf_tracked_cgroups_capacity"), existing);

  auto pod = launch_pod(endpoint_, namespace_, "unmapped", 1, "sleep 1000000");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  // Its start still comes, from the reconcile the flagged mkdir asked for.
  ASSERT_TRUE(wait_types(kplegd, id, kStarted)) << kplegd.log();
  EXPECT_TRUE(kplegd.wait_for_log("not tracked: the tracked-cgroup map is full", 5s)) << kplegd.log();
  auto text = scrape(port);
  EXPECT_GE(value(text, "kpleg_bpf_track_full_total"), 1) << text;
  EXPECT_GE(value(text, "kpleg_untracked_cgroups"), 1) << text;
  // The refused map update, by program and errno (E2BIG = 7).
  EXPECT_GE(value(text, "kpleg_bpf_helper_failures_total{errno=\"7\",program=\"cgroup_mkdir\"}"), 1)
      << text;
  auto health = kplegctl(socket_of(kplegd), {"health"});
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->exit_code, 0) << "degraded, not failing: " << health->out;
  EXPECT_NE(health->out.find("tracked-cgroup map is full (--max-tracked-cgroups=" + capacity),
            std::string::npos)
      << health->out;

  // Room again: the fillers go. The next reconcile's resync tracks the pod's cgroups.
  for (const auto& f : fillers) {
    ASSERT_TRUE(load_op(endpoint_, "stop-pod", f.sandbox_id).ok());
    ASSERT_TRUE(load_op(endpoint_, "remove-pod", f.sandbox_id).ok());
  }
  EXPECT_TRUE(eventually([&] { return value(scrape(port), "kpleg_untracked_cgroups") == 0; }, 20s))
      << kplegd.log();
  EXPECT_TRUE(eventually(
      [&] {
        auto h = kplegctl(socket_of(kplegd), {"health"});
        return h.ok() && h->out == "healthy\n";
      },
      10s));
  // Seen by the kernel again: its death is the kernel path's, not a reconcile's.
  ASSERT_TRUE(load_op(endpoint_, "stop-container", id).ok());
  ASSERT_TRUE(wait_types(kplegd, id, kDied)) << kplegd.log();
  for (const auto& e : kplegd.events()) {
    if (e["container_id"] == id && e["type"] == "ContainerDied") EXPECT_EQ(e["source"], "kernel") << e.dump();
  }
  EXPECT_EQ(kplegd.stop(), 0);
}

// Hole: cgroups nested in a container's (docker-in-docker, systemd in a container, any
// privileged pod that makes child cgroups). The kernel tracks them as the container's
// descendants; their execs and exits belong to the container and cost no CRI call and no
// reconcile, and the container's death is still seen when its init moved into a child.
TEST_F(ApiE2eTest, CgroupsNestedInAContainerCostNothingAndItsDeathIsStillSeen) {
  // The 100 nested cgroups are made as fast as the machine goes: more than the default budget
  // of mkdirs a second per pod on a fast one (what is over it is not tracked: FloodTest).
  auto d = start_kplegd(endpoint_, "ebpf", {"--max-cgroup-mkdirs-per-pod", "1000"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto pod = launch_pod(endpoint_, namespace_, "nested", 1, "sleep 1000000");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kStarted));
  const int port = metrics_port(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  auto calls = [&] { return cri_calls(port); };
  auto reconciles = [&] {
    size_t n = 0;
    const std::string log = kplegd.log();
    for (size_t at = 0; (at = log.find("reconcile (", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  const double calls_before = calls();
  const size_t reconciles_before = reconciles();
  const size_t execs_before = size_t(value(scrape(port), "kpleg_kernel_events_total{kind=\"exec\"}"));

  const std::string dir =
      "/sys/fs/cgroup/unified/kubepods/besteffort/pod" + pod->uid + "/" + id;
  std::string init;
  std::getline(std::ifstream(dir + "/cgroup.procs"), init);
  ASSERT_FALSE(init.empty()) << dir;
  constexpr int kChildren = 100;
  for (int i = 0; i < kChildren; ++i) {
    const std::string child = dir + "/nested-" + std::to_string(i);
    ASSERT_EQ(mkdir(child.c_str(), 0755), 0) << child << ": " << strerror(errno);
    // A process that moves itself into the child and execs there, then exits.
    auto r = run_process({"sh", "-c", "echo $$ > " + child + "/cgroup.procs && exec /bin/true"}, 10s);
    ASSERT_TRUE(r.ok() && r->exit_code == 0) << child;
  }
  // The container's init moves into the first child, as an init system in a container does.
  {
    std::ofstream procs(dir + "/nested-0/cgroup.procs");
    procs << init;
  }
  // The kernel path saw the nested execs (so the check below is not vacuous) ...
  EXPECT_TRUE(eventually([&] {
    return size_t(value(scrape(port), "kpleg_kernel_events_total{kind=\"exec\"}")) >=
           execs_before + kChildren;
  }, 10s));
  // ... and they cost nothing.
  EXPECT_EQ(calls(), calls_before) << scrape(port);
  EXPECT_EQ(reconciles(), reconciles_before) << kplegd.log();
  EXPECT_EQ(kplegd.types_for(id), kStarted);

  ASSERT_TRUE(load_op(endpoint_, "stop-container", id).ok());
  ASSERT_TRUE(wait_types(kplegd, id, kDied));
  for (const auto& e : kplegd.events())
    if (e["container_id"] == id) EXPECT_EQ(e["source"], "kernel") << e.dump();
  EXPECT_EQ(kplegd.stop(), 0);
}

// Where the runtime serves GetContainerEvents (containerd 2.x), its events confirm what the
// kernel signalled: a container's whole lifecycle (start, death with its exit code, removal)
// costs no CRI call. containerd 1.6 does not serve it: the targeted looks confirm instead.
// A quiet runtime sends nothing on its event stream, not even the response headers (grpc-go
// sends them with the first message): the stream must stay open. A first kplegd takes the
// runtime's backlog of events, so the second one subscribes to a silent stream; the stream was
// once given up after 10 s of silence and subscribed again, over and over. Without the stream
// (containerd 1.6) the runtime is asked once.
TEST_F(ApiE2eTest, AQuietRuntimesEventStreamStaysOpen) {
  {
    auto drain = start_kplegd(endpoint_, "ebpf");
    ASSERT_TRUE(drain.ok()) << drain.error().message;
    EXPECT_EQ((*drain)->stop(), 0);
  }
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  EXPECT_FALSE(kplegd.wait_for_log("runtime events: CRI GetContainerEvents failed", 12s))
      << kplegd.log();
  if (TestBed::instance().runtime() == "containerd-1.6") {
    const std::string log = kplegd.log();
    const std::string once = "does not serve GetContainerEvents";
    const auto first = log.find(once);
    EXPECT_NE(first, std::string::npos) << log;
    EXPECT_EQ(log.find(once, first + 1), std::string::npos) << "asked again: " << log;
  }
  EXPECT_EQ(kplegd.stop(), 0);
}

TEST_F(ApiE2eTest, TheRuntimesEventStreamConfirmsWhereItIsServed) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const int port = metrics_port(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  const bool served = TestBed::instance().runtime() != "containerd-1.6";
  // A first pod: its events (and the stream's backlog) show whether the stream is there.
  auto warm = launch_pod(endpoint_, namespace_, "warm", 1, "sleep 1000000");
  ASSERT_TRUE(warm.ok()) << warm.error().message;
  ASSERT_TRUE(wait_types(kplegd, warm->container_ids[0], kStarted));
  if (served) {
    ASSERT_TRUE(eventually([&] { return value(scrape(port), "kpleg_runtime_events_live") == 1; }, 10s))
        << kplegd.log();
  } else {
    EXPECT_EQ(value(scrape(port), "kpleg_runtime_events_live"), 0);
    EXPECT_NE(kplegd.log().find("does not serve GetContainerEvents"), std::string::npos)
        << kplegd.log();
  }

  const double calls_before = cri_calls(port);
  auto pod = launch_pod(endpoint_, namespace_, "evented", 1, "sh -c 'sleep 0.5; exit 3'");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kDied));
  ASSERT_TRUE(load_op(endpoint_, "remove-container", id).ok());
  ASSERT_TRUE(wait_types(kplegd, id, kRemoved));
  for (const auto& e : kplegd.events()) {
    if (e["container_id"] != id) continue;
    EXPECT_EQ(e["source"], "kernel") << e.dump();
    if (e["type"] == "ContainerDied") EXPECT_EQ(e["exit_code"], 3) << e.dump();
  }
  if (served) {
    EXPECT_EQ(cri_calls(port), calls_before) << kplegd.log();
    EXPECT_GT(value(scrape(port), "kpleg_runtime_events_total"), 0);
  } else {
    EXPECT_GT(cri_calls(port), calls_before);
  }
  // Stats tells the same calls by method: its methods add up to its total, the start-up sync
  // listed the containers, and without a stream the looks were ContainerStatus calls.
  auto st = kplegctl(socket_of(kplegd), {"stats", "-o", "json"});
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(st->exit_code, 0) << st->err;
  const auto stats = nlohmann::json::parse(st->out);
  const auto& by_method = stats.at("cri_calls_by_method");
  uint64_t sum = 0;
  for (const auto& [method, n] : by_method.items()) sum += n.get<uint64_t>();
  EXPECT_EQ(sum, stats.at("cri_calls").get<uint64_t>()) << st->out;
  EXPECT_GT(by_method.value("ListContainers", uint64_t{0}), 0u) << st->out;
  if (!served) EXPECT_GT(by_method.value("ContainerStatus", uint64_t{0}), 0u) << st->out;
  EXPECT_EQ(kplegd.stop(), 0);
}

TEST_F(ApiE2eTest, PromtoolAcceptsLiveMetricsAndCountersMove) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  int port = metrics_port(**d);
  ASSERT_GT(port, 0) << (*d)->log();
  const std::string started = "kpleg_events_total{source=\"kernel\",type=\"ContainerStarted\"}";
  const std::string execs = "kpleg_kernel_events_total{kind=\"exec\"}";
  auto before = scrape(port);
  ASSERT_FALSE(before.empty());
  auto pod = launch_pod(endpoint_, namespace_, "metrics", 2, "sh -c 'sleep 1; exit 0'");
  ASSERT_TRUE(pod.ok());
  ASSERT_TRUE(wait_types(**d, pod->container_ids[1], {"ContainerStarted", "ContainerDied"}));
  auto after = scrape(port);
  EXPECT_GE(value(after, started) - value(before, started), 3) << "sandbox + 2 containers";
  EXPECT_GE(value(after, execs) - value(before, execs), 3);
  EXPECT_GT(value(after, "kpleg_detection_latency_seconds_count"),
            value(before, "kpleg_detection_latency_seconds_count"));
  EXPECT_EQ(value(after, "kpleg_mode{mode=\"ebpf\"}"), 1);
  // The kernel path is live at every scrape, not only at the start-up reconcile (the pod above
  // took more than a second).
  EXPECT_GE(value(after, "kubelet_pleg_last_seen_seconds") -
                value(before, "kubelet_pleg_last_seen_seconds"),
            1.0);

  char path[] = "/tmp/kpleg-metrics-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, after.data(), after.size()), ssize_t(after.size()));
  close(fd);
  auto check = run_process({"sh", "-c", std::string("promtool check metrics < ") + path + " 2>&1"}, 20s);
  unlink(path);
  ASSERT_TRUE(check.ok());
  // Exit 1 is a parse error. Exit 3 is a lint finding; the one accepted is the kubelet's own
  // counter name (kept so that kubelet dashboards work).
  std::string rest = check->out;
  const std::string allowed = "kubelet_pleg_discard_events counter metrics should have \"_total\" suffix\n";
  if (auto at = rest.find(allowed); at != std::string::npos) rest.erase(at, allowed.size());
  EXPECT_TRUE(check->exit_code == 0 || check->exit_code == 3) << check->out;
  EXPECT_EQ(rest, "") << check->out;
  EXPECT_EQ((*d)->stop(), 0);
}

// An idle node costs an idle kplegd nothing: with one Watch consumer and no container changing,
// there is a 12 s span in which no thread of the daemon, gRPC's included, is scheduled in
// (within 45 s, so that the start's last work and a stray exec on the machine are let pass).
// The span is longer than two of gRPC's 5 s backup polls, which kplegd turns off (every call to
// the runtime goes over its own connections); with them the daemon woke about 0.7 times a
// second.
TEST_F(ApiE2eTest, AnIdleDaemonWithAConsumerWakesNoThread) {
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const std::string socket = socket_of(kplegd);
  ASSERT_FALSE(socket.empty()) << kplegd.log();
  auto stub = v1::PodLifecycle::NewStub(
      grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Watch(&ctx, v1::WatchRequest{});
  stream->WaitForInitialMetadata();  // the subscription is in place

  std::string woke;
  const bool quiet = quiet_span(kplegd, 12s, 45s, woke);
  EXPECT_TRUE(quiet) << "no 12 s without a wakeup in 45 s; the last ones:" << woke;
  ctx.TryCancel();
  v1::Event ev;
  while (stream->Read(&ev)) {
  }
  stream->Finish();
  EXPECT_EQ(kplegd.stop(), 0);
}

// On a real node exited containers stay (the dead instance the kubelet keeps, finished init
// containers and jobs): without a hint their removal is swept for every 10 s, for ever. With
// the default hint (the removal of the runtime's directory named by the id, seen by inotify;
// containerd's found from its Status, CRI-O's storage named by --removal-hint-dir), an idle
// daemon with exited containers wakes nobody, and a removal is still reported at once.
TEST_F(ApiE2eTest, ExitedContainersCostAnIdleDaemonNoWakeupOnceTheirRemovalIsHinted) {
  // Without the runtime's event stream, whose DELETED events would report the removals too.
  std::vector<std::string> args = {"--runtime-events", "off"};
  if (TestBed::instance().runtime() == "crio") {
    auto root = TestBed::instance().root_dir();
    ASSERT_TRUE(root.ok()) << root.error().message;
    args.insert(args.end(), {"--removal-hint-dir", *root + "/overlay-containers"});
  }
  auto d = start_kplegd(endpoint_, "ebpf", args);
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const int port = metrics_port(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  ASSERT_NE(kplegd.log().find("removal hint attached: exited containers' removals are announced "
                              "by the removal of their directory in /"),
            std::string::npos)
      << kplegd.log();

  // A first removal, hinted: the hints are trusted.
  auto job = launch_pod(endpoint_, namespace_, "hinted", 1, "sh -c 'exit 0'");
  ASSERT_TRUE(job.ok()) << job.error().message;
  ASSERT_TRUE(wait_types(kplegd, job->container_ids[0], kDied));
  ASSERT_TRUE(load_op(endpoint_, "remove-container", job->container_ids[0]).ok());
  ASSERT_TRUE(wait_types(kplegd, job->container_ids[0], kRemoved));
  ASSERT_TRUE(eventually([&] { return value(scrape(port), "kpleg_removal_hints_trusted") == 1; },
                         20s))
      << scrape(port) << kplegd.log();
  EXPECT_GE(value(scrape(port), "kpleg_removal_hints_total"), 1);

  // An exited container that stays.
  auto kept = launch_pod(endpoint_, namespace_, "kept", 1, "sh -c 'exit 2'");
  ASSERT_TRUE(kept.ok()) << kept.error().message;
  const std::string id = kept->container_ids[0];
  ASSERT_TRUE(wait_types(kplegd, id, kDied));

  // 12 s without a wakeup of any thread (a sweep backing off 1, 2, 4, 8, 10 s never allows it).
  std::string woke;
  const bool quiet = quiet_span(kplegd, 12s, 45s, woke);
  EXPECT_TRUE(quiet) << "no 12 s without a wakeup in 45 s; the last ones:" << woke;

  // Its removal is hinted and reported within seconds, not at the next reconcile.
  const double hints_before = value(scrape(port), "kpleg_removal_hints_total");
  ASSERT_TRUE(load_op(endpoint_, "remove-container", id).ok());
  EXPECT_TRUE(wait_types(kplegd, id, kRemoved, 5s)) << kplegd.log();
  EXPECT_GT(value(scrape(port), "kpleg_removal_hints_total"), hints_before);
  EXPECT_EQ(value(scrape(port), "kpleg_removal_hints_missed_total"), 0);
  EXPECT_EQ(kplegd.log().find("hinting all"), std::string::npos) << kplegd.log();
  EXPECT_EQ(kplegd.stop(), 0);
}

// containerd deletes a dead container's task, and runc its cgroup, before it records the exit:
// after a few deaths kplegd has learned that the rmdir comes before the exit's look would go,
// and the exit stops waking it (kpleg_exit_wakes 0). Every death is still reported. CRI-O keeps
// the cgroup until the container is removed: there the exit keeps waking.
TEST_F(ApiE2eTest, OnContainerdAnExitStopsWakingKplegdAndEveryDeathIsStillReported) {
  auto d = start_kplegd(endpoint_, "ebpf", {"--runtime-events", "off"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const int port = metrics_port(kplegd);
  ASSERT_GT(port, 0) << kplegd.log();
  EXPECT_EQ(value(scrape(port), "kpleg_exit_wakes"), 1) << "on at the start";
  auto churn = run_kpleg_load({"churn", "--rate", "20", "--duration", "8", "--open-loop",
                               "--namespace", namespace_, "--name-prefix", "exits"},
                              90s);
  ASSERT_TRUE(churn.ok()) << churn.error().message;
  ASSERT_EQ(churn->exit_code, 0) << churn->err;
  std::set<std::string> stopped;
  for (const auto& line : lines_of(churn->out)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("call", "") == "StopContainer" && j.value("ok", false))
      stopped.insert(j.value("container_id", ""));
  }
  ASSERT_GE(stopped.size(), 30u) << "the churn made too few deaths";
  // The churn removes what it stopped.
  for (const auto& id : stopped) EXPECT_TRUE(wait_types(kplegd, id, kRemoved)) << id;
  const std::string metrics = scrape(port);
  if (TestBed::instance().runtime() != "crio") {
    EXPECT_EQ(value(metrics, "kpleg_exit_wakes"), 0) << metrics << kplegd.log();
    EXPECT_NE(kplegd.log().find("an exit now wakes nobody"), std::string::npos) << kplegd.log();
  }
  std::printf("exit wakes: %g, restored %g, after %zu deaths\n", value(metrics, "kpleg_exit_wakes"),
              value(metrics, "kpleg_exit_wakeups_restored_total"), stopped.size());
  // What woke the loop: the ring buffer's records, and (no runtime events here) the runtime's
  // answers to the looks. With the BPF wake timer, an exec's and an rmdir's record wake kplegd
  // when their learned look is due (the runtime records a death after it removed the cgroup),
  // and the look goes with that wakeup instead of a timer's of its own. Without it a start and a
  // death each cost a look's wakeup (about 2 a lifecycle, bench/REPORT.md); with it, only the
  // looks before the lags are learned, a sandbox's (its own lag) and the repeated ones: under 1.
  EXPECT_GT(value(metrics, "kpleg_loop_wakeups_total{cause=\"ring buffer\"}"), 0) << metrics;
  EXPECT_GT(value(metrics, "kpleg_loop_wakeups_total{cause=\"runtime calls\"}"), 0) << metrics;
  const double looks = value(metrics, "kpleg_loop_wakeups_total{cause=\"look\"}");
  if (metrics.find("kpleg_bpf_wake_after_seconds{record=\"rmdir\"}") != std::string::npos) {
    EXPECT_GT(value(metrics, "kpleg_bpf_wake_after_seconds{record=\"rmdir\"}"), 0) << metrics;
    EXPECT_LT(looks, double(stopped.size())) << "a look's own wakeup for most transitions";
  } else {
    EXPECT_GT(looks, 0) << metrics;
  }
  std::printf("looks that woke kplegd: %g for %zu deaths\n", looks, stopped.size());
  EXPECT_EQ(kplegd.stop(), 0);
}

TEST_F(ApiE2eTest, ReadmeMainCommandShowsEventsWithinAMinute) {
  // The README's main command, as a new user runs it; it stops by itself after 30 s here, when
  // its first round (a started, a crashed, an OOM-killed and a removed pod, about 12 s) is over.
  auto r = run_process({"env", "KPLEG_DEMO_SECONDS=30", "KPLEG_DEMO_OUTPUT=json",
                        "KPLEG_BUILD_DIR=" KPLEG_BUILD_DIR, "bash", KPLEG_SOURCE_DIR "/scripts/demo.sh"},
                       std::chrono::seconds(240));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->exit_code, 0) << r->err;
  std::set<std::string> seen;
  for (const auto& line : lines_of(r->out)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("type")) seen.insert(j["type"].get<std::string>() + ":" + j.value("reason", ""));
  }
  EXPECT_TRUE(seen.count("ContainerStarted:")) << r->out;
  EXPECT_TRUE(seen.count("ContainerDied:Error")) << "the crashing pod: " << r->out;
  EXPECT_TRUE(seen.count("ContainerDied:OOMKilled")) << "the OOM-killed pod: " << r->out;
  EXPECT_TRUE(seen.count("ContainerRemoved:")) << r->out;
}

}  // namespace
}  // namespace kpleg::testing
