// Lifecycle scenarios through the real daemon, the real containerd and (in ebpf mode) the real
// kernel: each asserts the exact per-container event sequence in both modes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "cri/grpc_cri_client.h"
#include "e2e/e2e_support.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;

class LifecycleTest : public CriTestBedTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    CriTestBedTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    auto d = start_kplegd(endpoint_, GetParam(), {"--relist-period", "1s"});
    ASSERT_TRUE(d.ok()) << d.error().message;
    kplegd_ = std::move(*d);
  }
  void TearDown() override {
    if (kplegd_) {
      // A failure prints its log and events (KplegdProcess).
      EXPECT_EQ(kplegd_->stop(), 0) << "kplegd did not shut down cleanly";
    }
    CriTestBedTest::TearDown();
  }
  bool ebpf() const { return GetParam() == "ebpf"; }

  LaunchedPod launch(const std::string& name, int containers, const std::string& command,
                     const std::vector<std::string>& extra = {}) {
    auto p = launch_pod(endpoint_, namespace_, name, containers, command, extra);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? *p : LaunchedPod{};
  }

  std::unique_ptr<KplegdProcess> kplegd_;
};

TEST_P(LifecycleTest, LongRunningContainer) {
  auto pod = launch("long", 1, "sleep 1000000");
  ASSERT_TRUE(wait_types(*kplegd_, pod.sandbox_id, kStarted));
  ASSERT_TRUE(wait_types(*kplegd_, pod.container_ids[0], kStarted));
  for (const auto& e : kplegd_->events()) {
    if (e["container_id"] == pod.container_ids[0]) {
      EXPECT_EQ(e["pod_uid"], pod.uid);
      EXPECT_EQ(e["pod_name"], pod.name);
      EXPECT_EQ(e["pod_namespace"], namespace_);
      EXPECT_EQ(e["container_name"], "c0");
      EXPECT_EQ(e["sandbox"], false);
      EXPECT_EQ(e["source"], ebpf() ? "kernel" : "relist");
      if (ebpf()) EXPECT_GT(e["kernel_ts_ns"].get<uint64_t>(), 0u);
    }
    if (e["container_id"] == pod.sandbox_id) EXPECT_EQ(e["sandbox"], true);
  }
}

TEST_P(LifecycleTest, ContainersRunningBeforeTheDaemonAreInItsPrintedStartUpSync) {
  auto pod = launch("early", 1, "sleep 1000000");
  // A second daemon, started after the pod: its start-up sync reports the pod, and
  // --print-events prints that sync too, not only what happens after "ready".
  auto late = start_kplegd(endpoint_, GetParam(), {"--relist-period", "1s"});
  ASSERT_TRUE(late.ok()) << late.error().message;
  ASSERT_TRUE(wait_types(**late, pod.sandbox_id, kStarted));
  ASSERT_TRUE(wait_types(**late, pod.container_ids[0], kStarted));
  for (const auto& e : (*late)->events()) {
    if (e["pod_uid"] != pod.uid) continue;
    EXPECT_EQ(e["source"], ebpf() ? "reconcile" : "relist") << e.dump();
    EXPECT_EQ(e["correction"], false) << "the start-up sync is no correction: " << e.dump();
  }
  EXPECT_EQ((*late)->stop(), 0);
}

TEST_P(LifecycleTest, ThreadsCarryNamesForTopAndPerf) {
  std::set<std::string> names;
  const std::string tasks = "/proc/" + std::to_string(kplegd_->pid()) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream in(t.path() / "comm");
    std::string name;
    std::getline(in, name);
    names.insert(name);
  }
  std::vector<std::string> want = {"kpleg-cri-watch", "kpleg-http", "kpleg-health", "kpleg-print"};
  if (ebpf()) {
    // The tracker's event loop reads the ring buffer and makes the looks: no thread of its own
    // for either (pleg/event_loop.h).
    for (const char* n : {"kpleg-loop", "kpleg-reconcile"}) want.push_back(n);
  } else {
    want.push_back("kpleg-relist");
  }
  for (const auto& n : want)
    EXPECT_TRUE(names.count(n)) << n << " in " << ::testing::PrintToString(names);
  EXPECT_FALSE(names.count("kpleg-ringbuf")) << ::testing::PrintToString(names);
  // The removal hint's inotify watch (attached where the runtime's directories are there at the
  // start, as on containerd 1.6's test bed) is read on the loop too: no thread of its own
  // (kernel/dir_removal_watch.h).
  EXPECT_FALSE(names.count("kpleg-rmdirs")) << ::testing::PrintToString(names);
  // gRPC's callback-API threads poll the process-wide epoll set: they wake an idle daemon and
  // take CRI responses away from the thread that made the call. Nothing may start them.
  EXPECT_FALSE(names.count("nexting_thread")) << ::testing::PrintToString(names);
}

TEST_P(LifecycleTest, ExitZeroAndExitThree) {
  auto ok = launch("exit0", 1, "sh -c 'sleep 2; exit 0'");
  auto bad = launch("exit3", 1, "sh -c 'sleep 2; exit 3'");
  ASSERT_TRUE(wait_types(*kplegd_, ok.container_ids[0], kDied));
  ASSERT_TRUE(wait_types(*kplegd_, bad.container_ids[0], kDied));
  for (const auto& e : kplegd_->events()) {
    if (e["type"] != "ContainerDied") continue;
    if (e["container_id"] == ok.container_ids[0]) EXPECT_EQ(e["exit_code"], 0);
    if (e["container_id"] == bad.container_ids[0]) EXPECT_EQ(e["exit_code"], 3);
  }
  // The sandboxes keep running.
  EXPECT_EQ(kplegd_->types_for(ok.sandbox_id), kStarted);
}

TEST_P(LifecycleTest, KilledBySignal) {
  // The container's init is PID 1 of its namespace, which cannot be SIGKILLed from inside: the
  // runtime kills it from outside (StopContainer with no grace period).
  auto pod = launch("signal", 1, "sleep 1000000");
  ASSERT_TRUE(wait_types(*kplegd_, pod.container_ids[0], kStarted));
  auto r = run_kpleg_load({"stop-container", "--grace-period", "0", pod.container_ids[0]});
  ASSERT_TRUE(r.ok() && r->exit_code == 0);
  ASSERT_TRUE(wait_types(*kplegd_, pod.container_ids[0], kDied));
  for (const auto& e : kplegd_->events()) {
    if (e["container_id"] == pod.container_ids[0] && e["type"] == "ContainerDied") {
      EXPECT_EQ(e["exit_code"], 137) << "128 + SIGKILL, as the runtime reports it";
    }
  }
}

TEST_P(LifecycleTest, OomKilledThroughItsMemoryLimit) {
  auto pod = launch("oom", 1, "sh -c 'sleep 2; dd if=/dev/zero of=/dev/null bs=256M count=1'",
                    {"--memory-limit", std::to_string(32 << 20)});
  ASSERT_TRUE(wait_types(*kplegd_, pod.container_ids[0], kDied));
  for (const auto& e : kplegd_->events()) {
    if (e["container_id"] == pod.container_ids[0] && e["type"] == "ContainerDied") {
      EXPECT_EQ(e["exit_code"], 137);
      if (ebpf()) EXPECT_EQ(e["reason"], "OOMKilled");
    }
  }
}

TEST_P(LifecycleTest, FourContainersStartedTogether) {
  auto pod = launch("four", 4, "sleep 1000000");
  ASSERT_EQ(pod.container_ids.size(), 4u);
  ASSERT_TRUE(wait_types(*kplegd_, pod.sandbox_id, kStarted));
  for (const auto& id : pod.container_ids) EXPECT_TRUE(wait_types(*kplegd_, id, kStarted)) << id;
}

TEST_P(LifecycleTest, CrashWithin100ms) {
  auto pod = launch("crash", 1, "sh -c 'exit 5'");
  const auto& id = pod.container_ids[0];
  kplegd_->wait_for(
      [&](const auto& evs) {
        auto t = types_of(evs, id);
        return !t.empty() && t.back() == "ContainerDied";
      },
      20s);
  auto types = kplegd_->types_for(id);
  if (ebpf()) {
    EXPECT_EQ(types, kDied) << "the kernel saw the start a relist cannot";
  } else {
    ASSERT_FALSE(types.empty());
    EXPECT_EQ(types.back(), "ContainerDied");
  }
  for (const auto& e : kplegd_->events()) {
    if (e["container_id"] == id && e["type"] == "ContainerDied") EXPECT_EQ(e["exit_code"], 5);
  }
}

TEST_P(LifecycleTest, StopAndRemoveAContainerThenThePod) {
  auto pod = launch("stop", 2, "sleep 1000000");
  const auto& c0 = pod.container_ids[0];
  const auto& c1 = pod.container_ids[1];
  ASSERT_TRUE(wait_types(*kplegd_, c0, kStarted));
  ASSERT_TRUE(wait_types(*kplegd_, c1, kStarted));
  ASSERT_TRUE(load_op(endpoint_, "stop-container", c0).ok());
  ASSERT_TRUE(wait_types(*kplegd_, c0, kDied));
  ASSERT_TRUE(load_op(endpoint_, "remove-container", c0).ok());
  ASSERT_TRUE(wait_types(*kplegd_, c0, kRemoved));
  EXPECT_EQ(kplegd_->types_for(c1), kStarted);

  ASSERT_TRUE(load_op(endpoint_, "remove-pod", pod.sandbox_id).ok());
  EXPECT_TRUE(wait_types(*kplegd_, c1, kRemoved));
  EXPECT_TRUE(wait_types(*kplegd_, pod.sandbox_id, kRemoved));
}

TEST_P(LifecycleTest, ExecsInsideTheContainerAreNoStarts) {
  auto pod = launch("probe", 1,
                    "sh -c 'i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done; "
                    "touch /tmp/done; sleep 1000000'");
  ASSERT_TRUE(wait_types(*kplegd_, pod.container_ids[0], kStarted));
  // A later transition of another container is a barrier: events of the probe container that
  // were going to come would have come by then.
  auto barrier = launch("barrier", 1, "sh -c 'sleep 3; exit 0'");  // relist sees it run
  ASSERT_TRUE(wait_types(*kplegd_, barrier.container_ids[0], kDied));
  EXPECT_EQ(kplegd_->types_for(pod.container_ids[0]), kStarted);
}

// Hole 5: runc runs OCI hooks (here a createContainer and a startContainer hook, each a shell
// that sleeps 300 ms, from the test bed's "runc-hooked" handler) inside the container's cgroup
// before its entrypoint. Neither the hooks' execs nor their exits are the container's start or
// death: the events' kernel timestamps are the entrypoint's, as the runtime records them.
TEST_P(LifecycleTest, OciHooksBeforeTheEntrypointAreNeitherItsStartNorItsDeath) {
  auto pod = launch("hooked", 1, "sh -c 'sleep 2; exit 3'", {"--runtime-handler", "runc-hooked"});
  const std::string id = pod.container_ids.empty() ? "" : pod.container_ids[0];
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_types(*kplegd_, id, kDied, 30s));
  auto cri = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(cri.ok()) << cri.error().message;
  auto st = (*cri)->container_status(id);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(st->exit_code(), 3);
  for (const auto& e : kplegd_->events()) {
    if (e["container_id"] != id) continue;
    EXPECT_EQ(e["source"], ebpf() ? "kernel" : "relist") << e.dump();
    if (!ebpf()) continue;
    // The runtime's started_at/finished_at and the kernel's timestamps of the entrypoint's exec
    // and exit are milliseconds apart (tens on a busy machine); a hook's are 300 ms to 2 s off.
    const auto kernel_ts = int64_t(e["kernel_ts_ns"].get<uint64_t>());
    const int64_t runtime_ts = e["type"] == "ContainerStarted" ? st->started_at() : st->finished_at();
    EXPECT_LT(std::abs(kernel_ts - runtime_ts), 200'000'000) << e.dump();
    if (e["type"] == "ContainerDied") EXPECT_EQ(e["exit_code"], 3) << e.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, LifecycleTest, ::testing::Values("ebpf", "relist"),
                         [](const auto& info) { return info.param; });

// ebpf mode: a container that stays exited (an init container, a finished job) is watched by
// the tracker's removal sweep, one full ListContainers for all of them,
// against the real containerd: the sweep must not take an exited container for removed, and
// must see the removal when it comes.
class LongExitedTest : public CriTestBedTest {};

TEST_F(LongExitedTest, AContainerExitedForLongIsRemovedThroughTheSweep) {
  // At debug level; without the runtime's event stream, whose DELETED events would leave the
  // sweep for the rare lost one (containerd 2.x), and without a removal hint, which would leave
  // it for the hinted removal.
  auto d = start_kplegd(endpoint_, "ebpf", {"--runtime-events", "off", "--removal-hints", "off"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  EXPECT_EQ(kplegd.log().find("removal hint attached"), std::string::npos) << kplegd.log();
  auto pod = launch_pod(endpoint_, namespace_, "initlike", 2, "sh -c 'exit 0'");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  for (const auto& id : pod->container_ids) ASSERT_TRUE(wait_types(kplegd, id, kDied));

  // Both are watched by the removal sweep (1 s after the deaths, then backing off).
  ASSERT_TRUE(kplegd.wait_for_log("exited watched", 30s, 2)) << "two removal sweeps";
  for (const auto& id : pod->container_ids)
    EXPECT_EQ(kplegd.types_for(id), kDied) << "an exited container was taken for removed";

  ASSERT_TRUE(load_op(endpoint_, "remove-container", pod->container_ids[0]).ok());
  EXPECT_TRUE(wait_types(kplegd, pod->container_ids[0], kRemoved, 20s));
  EXPECT_EQ(kplegd.types_for(pod->container_ids[1]), kDied);
  EXPECT_EQ(kplegd.stop(), 0);
}

// Hole: a container created (runc init waiting in its cgroup) before kplegd starts, and started
// after. The start-up seed finds the waiting runc init; the StartContainer exec that follows is
// the container's start, reported by the kernel path, and its death follows it.
class StartUpTest : public CriTestBedTest {};

TEST_F(StartUpTest, AContainerCreatedBeforeTheDaemonAndStartedAfterIsStartedByTheKernel) {
  auto pod = launch_pod(endpoint_, namespace_, "created", 1, "sleep 1000000", {"--no-start"});
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string id = pod->container_ids[0];
  auto d = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  ASSERT_TRUE(load_op(endpoint_, "start-container", id).ok());
  ASSERT_TRUE(wait_types(kplegd, id, kStarted));
  ASSERT_TRUE(load_op(endpoint_, "stop-container", id).ok());
  ASSERT_TRUE(wait_types(kplegd, id, kDied));
  for (const auto& e : kplegd.events()) {
    if (e["container_id"] != id) continue;
    // The reconcile is minutes away: only the kernel path can have seen these in time.
    EXPECT_EQ(e["source"], "kernel") << e.dump();
    EXPECT_EQ(e["correction"], false) << e.dump();
  }
  EXPECT_EQ(kplegd.stop(), 0);
}

}  // namespace
}  // namespace kpleg::testing
