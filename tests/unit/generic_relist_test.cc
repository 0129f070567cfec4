// GenericRelist over the in-memory runtime: each generic-PLEG rule, re-inspection after a failed
// inspection, failed lists, timing and health, and the relist loop's thread.
#include "pleg/generic_relist.h"

#include <grpcpp/support/status_code_enum.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "support/eventually.h"
#include "support/fake_cri_client.h"

namespace kpleg::pleg {
namespace {

using cri::CriMethod;
using cri::FakeCriClient;
using ET = EventType;
using namespace std::chrono_literals;
using kpleg::testing::eventually;

class CollectingSink final : public EventSink {
 public:
  void publish(PodLifecycleEvent ev) override {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(ev));
  }
  std::vector<PodLifecycleEvent> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  // Events since the last call.
  std::vector<PodLifecycleEvent> take() {
    std::lock_guard lock(mu_);
    std::vector<PodLifecycleEvent> out(events_.begin() + taken_, events_.end());
    taken_ = events_.size();
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PodLifecycleEvent> events_;
  size_t taken_ = 0;
};

// A clock the test moves by hand.
struct ManualClock {
  std::atomic<int64_t> mono{1'000'000'000};
  std::atomic<int64_t> real{1'800'000'000'000'000'000};
  void advance(std::chrono::nanoseconds d) {
    mono += d.count();
    real += d.count();
  }
};

// Forwards to the fake runtime and lets a test act just before a call (a slow runtime, a change
// that lands between the list and the inspection).
class InterposingCri final : public cri::CriClient {
 public:
  explicit InterposingCri(FakeCriClient& fake) : f_(fake) {}
  std::function<void(CriMethod)> before;

  Result<v1::VersionResponse> version() override { return f_.version(); }
  Result<v1::RuntimeStatus> status() override { return f_.status(); }
  Result<std::vector<v1::PodSandbox>> list_pod_sandboxes(const v1::PodSandboxFilter& f) override {
    hook(CriMethod::kListPodSandbox);
    return f_.list_pod_sandboxes(f);
  }
  Result<v1::PodSandboxStatus> pod_sandbox_status(const std::string& id) override {
    hook(CriMethod::kPodSandboxStatus);
    return f_.pod_sandbox_status(id);
  }
  Result<std::vector<v1::Container>> list_containers(const v1::ContainerFilter& f) override {
    hook(CriMethod::kListContainers);
    return f_.list_containers(f);
  }
  Result<v1::ContainerStatus> container_status(const std::string& id) override {
    hook(CriMethod::kContainerStatus);
    return f_.container_status(id);
  }
  Result<std::string> run_pod_sandbox(const v1::PodSandboxConfig& c,
                                      const std::string& handler = {}) override {
    return f_.run_pod_sandbox(c, handler);
  }
  Status stop_pod_sandbox(const std::string& id) override { return f_.stop_pod_sandbox(id); }
  Status remove_pod_sandbox(const std::string& id) override { return f_.remove_pod_sandbox(id); }
  Result<std::string> create_container(const std::string& sandbox, const v1::ContainerConfig& c,
                                       const v1::PodSandboxConfig& sc) override {
    return f_.create_container(sandbox, c, sc);
  }
  Status start_container(const std::string& id) override { return f_.start_container(id); }
  Status stop_container(const std::string& id, int64_t grace) override {
    return f_.stop_container(id, grace);
  }
  Status remove_container(const std::string& id) override { return f_.remove_container(id); }

 private:
  void hook(CriMethod m) {
    if (before) before(m);
  }
  FakeCriClient& f_;
};

struct Pod {
  std::string uid;
  std::string sandbox_id;
  v1::PodSandboxConfig config;
};

v1::PodSandboxConfig pod_config(const std::string& name, bool labelled = true) {
  v1::PodSandboxConfig c;
  c.mutable_metadata()->set_name(name);
  c.mutable_metadata()->set_namespace_("prod");
  c.mutable_metadata()->set_uid("uid-" + name);
  if (labelled) {
    (*c.mutable_labels())[kPodUidLabel] = "uid-" + name;
    (*c.mutable_labels())[kPodNameLabel] = name;
    (*c.mutable_labels())[kPodNamespaceLabel] = "prod";
  }
  return c;
}

class GenericRelistTest : public ::testing::Test {
 protected:
  GenericRelistOptions options() {
    GenericRelistOptions o;
    o.realtime_ns = [this] { return clock_.real.load(); };
    o.monotonic_ns = [this] { return clock_.mono.load(); };
    return o;
  }

  Pod run_pod(const std::string& name, bool labelled = true) {
    Pod p;
    p.config = pod_config(name, labelled);
    p.uid = p.config.metadata().uid();
    auto id = fake_.run_pod_sandbox(p.config);
    EXPECT_TRUE(id.ok()) << id.error().message;
    p.sandbox_id = *id;
    return p;
  }
  std::string create(const Pod& pod, const std::string& name, bool labelled = true) {
    v1::ContainerConfig c;
    c.mutable_metadata()->set_name(name);
    if (labelled) {
      c.mutable_labels()->insert(pod.config.labels().begin(), pod.config.labels().end());
      (*c.mutable_labels())[kContainerNameLabel] = name;
    }
    auto id = fake_.create_container(pod.sandbox_id, c, pod.config);
    EXPECT_TRUE(id.ok()) << id.error().message;
    return *id;
  }
  std::string start(const Pod& pod, const std::string& name, bool labelled = true) {
    std::string id = create(pod, name, labelled);
    EXPECT_TRUE(fake_.start_container(id).ok());
    return id;
  }
  void relist(GenericRelist& r) {
    auto s = r.relist_once();
    ASSERT_TRUE(s.ok()) << s.error().message;
  }

  ManualClock clock_;
  FakeCriClient fake_;
  CollectingSink sink_;
};

// "Started(app)" style summaries, in order, keyed by container id.
std::vector<std::pair<std::string, ET>> summary(const std::vector<PodLifecycleEvent>& events) {
  std::vector<std::pair<std::string, ET>> out;
  for (const auto& e : events) out.emplace_back(e.container_id, e.type);
  return out;
}

TEST_F(GenericRelistTest, NewPodGivesSandboxAndContainerStartedOnceWithTheInspectedStatus) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);

  auto events = sink_.take();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(summary(events),
            (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerStarted},
                                                     {pod.sandbox_id, ET::kContainerStarted}}));
  auto app_status = *fake_.container_status(app);
  for (const auto& e : events) {
    EXPECT_EQ(e.pod_uid, "uid-web");
    EXPECT_EQ(e.pod_name, "web");
    EXPECT_EQ(e.pod_namespace, "prod");
    EXPECT_EQ(e.source, EventSource::kRelist);
    EXPECT_EQ(e.emit_ts_ns, static_cast<uint64_t>(clock_.real.load()));
    EXPECT_EQ(e.seq, 0u) << "sequence numbers are the bus's to assign";
    EXPECT_EQ(e.status.state, ContainerState::kRunning);
  }
  EXPECT_EQ(events[0].container_name, "app");
  EXPECT_FALSE(events[0].sandbox);
  EXPECT_EQ(events[0].status.started_at_ns, app_status.started_at());
  EXPECT_EQ(events[0].status.created_at_ns, app_status.created_at());
  EXPECT_TRUE(events[1].sandbox);
  EXPECT_TRUE(events[1].container_name.empty());

  for (int i = 0; i < 3; ++i) relist(r);
  EXPECT_TRUE(sink_.take().empty()) << "no event twice across relists";
}

// List's snapshot (records + sequence number) must never be ahead of the events published:
// a Watch from its sequence number would then replay an event the snapshot already shows.
TEST_F(GenericRelistTest, ASnapshotTakenWhileEventsArePublishedMatchesItsSequenceNumber) {
  struct SnapshottingSink final : public EventSink {
    GenericRelist* relist = nullptr;
    std::atomic<uint64_t> seq{0};
    std::vector<std::future<std::pair<uint64_t, size_t>>> snapshots;  // (seq, containers)
    void publish(PodLifecycleEvent) override {
      // Another thread takes List's snapshot while this event is being published; it gets up
      // to 100 ms before the publication completes (it may have to wait for it instead).
      snapshots.push_back(std::async(std::launch::async, [this] {
        auto [s, pods] = relist->pods_at([&] { return seq.load(); });
        size_t n = 0;
        for (const auto& p : pods) n += p.containers.size();
        return std::pair<uint64_t, size_t>{s, n};
      }));
      snapshots.back().wait_for(100ms);
      ++seq;
    }
  } sink;
  Pod pod = run_pod("web");
  start(pod, "app");
  GenericRelist r(fake_, sink, options());
  sink.relist = &r;
  relist(r);
  ASSERT_EQ(sink.snapshots.size(), 2u);  // the sandbox's and the app's ContainerStarted
  for (auto& f : sink.snapshots) {
    auto [s, n] = f.get();
    // The pod's record (2 containers) comes with both of its events, never before them.
    EXPECT_TRUE((s == 2 && n == 2) || (s == 0 && n == 0)) << "seq " << s << " with " << n;
  }
}

TEST_F(GenericRelistTest, DiedCarriesExitCodeAndReasonFromContainerStatus) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  std::string oom = start(pod, "hog");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();

  ASSERT_TRUE(fake_.exit_container(app, 3, "Error").ok());
  ASSERT_TRUE(fake_.exit_container(oom, 137, "OOMKilled").ok());
  relist(r);
  auto events = sink_.take();
  ASSERT_EQ(summary(events), (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerDied},
                                                                      {oom, ET::kContainerDied}}));
  EXPECT_EQ(events[0].exit_code, 3);
  EXPECT_EQ(events[0].reason, "Error");
  EXPECT_EQ(events[0].status.state, ContainerState::kExited);
  EXPECT_EQ(events[0].status.finished_at_ns, fake_.container_status(app)->finished_at());
  EXPECT_EQ(events[1].exit_code, 137);
  EXPECT_EQ(events[1].reason, "OOMKilled");

  relist(r);
  EXPECT_TRUE(sink_.take().empty());
}

TEST_F(GenericRelistTest, RemovedAfterExitIsOnlyContainerRemoved) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  ASSERT_TRUE(fake_.exit_container(app, 0, "Completed").ok());
  relist(r);
  sink_.take();

  ASSERT_TRUE(fake_.remove_container(app).ok());
  relist(r);
  auto events = sink_.take();
  ASSERT_EQ(summary(events),
            (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerRemoved}}));
  EXPECT_EQ(events[0].status.state, ContainerState::kNonExistent);
  EXPECT_EQ(events[0].container_name, "app");
}

TEST_F(GenericRelistTest, RunningContainerThatVanishesIsDiedThenRemoved) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();

  ASSERT_TRUE(fake_.remove_container(app).ok());  // died and removed within one period
  relist(r);
  auto events = sink_.take();
  ASSERT_EQ(summary(events), (std::vector<std::pair<std::string, ET>>{
                                 {app, ET::kContainerDied}, {app, ET::kContainerRemoved}}));
  EXPECT_EQ(events[0].status.state, ContainerState::kNonExistent)
      << "the runtime no longer knows the container; the event says so";
  EXPECT_EQ(events[0].exit_code, 0);
}

TEST_F(GenericRelistTest, CreatedContainerSendsNothingUntilItRuns) {
  Pod pod = run_pod("web");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();

  std::string app = create(pod, "app");
  const uint64_t status_calls = fake_.calls(CriMethod::kContainerStatus);
  relist(r);
  EXPECT_TRUE(sink_.take().empty()) << "ContainerChanged is generated, never sent";
  EXPECT_GT(fake_.calls(CriMethod::kContainerStatus), status_calls)
      << "the change still makes the pod be inspected, as in the kubelet";

  relist(r);
  EXPECT_TRUE(sink_.take().empty());

  ASSERT_TRUE(fake_.start_container(app).ok());
  relist(r);
  EXPECT_EQ(summary(sink_.take()),
            (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerStarted}}));
}

TEST_F(GenericRelistTest, SandboxTransitionsAreEventsOfTheSandbox) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();

  ASSERT_TRUE(fake_.stop_pod_sandbox(pod.sandbox_id).ok());
  relist(r);
  auto died = sink_.take();
  ASSERT_EQ(summary(died), (std::vector<std::pair<std::string, ET>>{
                               {app, ET::kContainerDied}, {pod.sandbox_id, ET::kContainerDied}}));
  EXPECT_EQ(died[0].exit_code, 137);
  EXPECT_TRUE(died[1].sandbox);
  EXPECT_EQ(died[1].status.state, ContainerState::kExited);

  ASSERT_TRUE(fake_.remove_pod_sandbox(pod.sandbox_id).ok());
  const uint64_t list_calls = fake_.calls(CriMethod::kListPodSandbox);
  relist(r);
  EXPECT_EQ(summary(sink_.take()),
            (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerRemoved},
                                                     {pod.sandbox_id, ET::kContainerRemoved}}));
  EXPECT_EQ(fake_.calls(CriMethod::kListPodSandbox), list_calls + 1)
      << "a pod that is gone is not inspected";
  EXPECT_TRUE(r.pods().empty());
  relist(r);
  EXPECT_TRUE(sink_.take().empty());
}

TEST_F(GenericRelistTest, FailedInspectionIsRetriedNextRelistAndItsEventsComeOnce) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  Pod other = run_pod("db");
  std::string db = start(other, "db");
  GenericRelist r(fake_, sink_, options());

  // The first ContainerStatus of the relist fails: that pod's inspection fails, the other's
  // does not.
  fake_.fail_next(CriMethod::kContainerStatus,
                  Error{grpc::StatusCode::DEADLINE_EXCEEDED, "CRI ContainerStatus: deadline"});
  relist(r);
  auto first = sink_.take();
  ASSERT_EQ(first.size(), 2u) << "the other pod's events are not held back";
  const std::string failed_uid = first[0].pod_uid == "uid-web" ? "uid-db" : "uid-web";
  for (const auto& e : first) EXPECT_NE(e.pod_uid, failed_uid);

  auto h = r.health();
  EXPECT_TRUE(h.healthy) << "a failed inspection is not a failed relist";
  ASSERT_EQ(h.pending_inspections.size(), 1u);
  EXPECT_EQ(h.pending_inspections[0].pod.uid, failed_uid);
  EXPECT_EQ(h.pending_inspections[0].attempts, 1u);
  EXPECT_NE(h.pending_inspections[0].error.find("deadline"), std::string::npos);
  EXPECT_EQ(r.stats().failed_inspections, 1u);
  EXPECT_EQ(r.pods().size(), 1u) << "the failed pod's record was not updated";

  relist(r);
  auto second = sink_.take();
  ASSERT_EQ(second.size(), 2u);
  for (const auto& e : second) {
    EXPECT_EQ(e.pod_uid, failed_uid);
    EXPECT_EQ(e.type, ET::kContainerStarted);
  }
  EXPECT_TRUE(r.health().pending_inspections.empty());
  EXPECT_EQ(r.pods().size(), 2u);

  relist(r);
  EXPECT_TRUE(sink_.take().empty());

  std::map<std::string, int> per_container;
  for (const auto& e : sink_.events()) ++per_container[e.container_id + to_string(e.type)];
  for (const auto& [k, n] : per_container) EXPECT_EQ(n, 1) << k;
  EXPECT_EQ(per_container.size(), 4u);
  (void)app;
  (void)db;
}

TEST_F(GenericRelistTest, ChangeDuringFailedInspectionsIsReportedAsTheKubeletWould) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();

  ASSERT_TRUE(fake_.exit_container(app, 2, "Error").ok());
  fake_.fail_always(CriMethod::kPodSandboxStatus,
                    Error{grpc::StatusCode::UNAVAILABLE, "CRI PodSandboxStatus: unavailable"});
  for (int i = 0; i < 3; ++i) relist(r);
  EXPECT_TRUE(sink_.take().empty());
  auto h = r.health();
  ASSERT_EQ(h.pending_inspections.size(), 1u);
  EXPECT_EQ(h.pending_inspections[0].attempts, 3u);
  EXPECT_EQ(h.pending_inspections[0].pod.name, "web");
  ASSERT_EQ(r.pods().size(), 1u);
  EXPECT_EQ(r.pods()[0].find(app)->state, ContainerState::kRunning)
      << "the confirmed view keeps the last inspected state";

  fake_.fail_always(CriMethod::kPodSandboxStatus, std::nullopt);
  relist(r);
  auto events = sink_.take();
  ASSERT_EQ(summary(events), (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerDied}}));
  EXPECT_EQ(events[0].exit_code, 2);
  EXPECT_TRUE(r.health().pending_inspections.empty());
  relist(r);
  EXPECT_TRUE(sink_.take().empty());
}

TEST_F(GenericRelistTest, ContainerRemovedBetweenListAndStatusIsNotAFailedInspection) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  InterposingCri cri(fake_);
  GenericRelist r(cri, sink_, options());
  bool removed = false;
  cri.before = [&](CriMethod m) {
    if (m == CriMethod::kContainerStatus && !removed) {
      removed = true;
      ASSERT_TRUE(fake_.remove_container(app).ok());
    }
  };
  relist(r);
  EXPECT_TRUE(r.health().pending_inspections.empty());
  auto events = sink_.take();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].container_id, app);
  EXPECT_EQ(events[0].type, ET::kContainerStarted);
  EXPECT_EQ(events[0].status.state, ContainerState::kRunning) << "as listed: nothing newer";
  relist(r);
  EXPECT_EQ(summary(sink_.take()), (std::vector<std::pair<std::string, ET>>{
                                       {app, ET::kContainerDied}, {app, ET::kContainerRemoved}}));
}

TEST_F(GenericRelistTest, FailedListChangesNothing) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  relist(r);
  sink_.take();
  const auto before = r.stats();
  ASSERT_TRUE(fake_.exit_container(app, 1, "Error").ok());

  for (CriMethod m : {CriMethod::kListPodSandbox, CriMethod::kListContainers}) {
    fake_.fail_next(m, Error{grpc::StatusCode::UNAVAILABLE, "CRI list: connection refused"});
    const uint64_t status_calls = fake_.calls(CriMethod::kContainerStatus);
    clock_.advance(1s);
    auto s = r.relist_once();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("connection refused"), std::string::npos);
    EXPECT_EQ(s.error().code, grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(sink_.take().empty());
    EXPECT_EQ(fake_.calls(CriMethod::kContainerStatus), status_calls) << "nothing inspected";
    EXPECT_EQ(r.pods()[0].find(app)->state, ContainerState::kRunning);
  }
  auto st = r.stats();
  EXPECT_EQ(st.failed_relists, 2u);
  EXPECT_EQ(st.consecutive_failures, 2u);
  EXPECT_EQ(st.last_success_ns, before.last_success_ns);
  EXPECT_NE(st.last_error.find("connection refused"), std::string::npos);

  clock_.advance(1s);
  relist(r);
  EXPECT_EQ(summary(sink_.take()),
            (std::vector<std::pair<std::string, ET>>{{app, ET::kContainerDied}}));
  EXPECT_EQ(r.stats().consecutive_failures, 0u);
  EXPECT_EQ(r.stats().last_success_ns, clock_.real.load());
}

TEST_F(GenericRelistTest, UnlabelledPodIsKnownByItsSandboxMetadataAndInspectedBySandbox) {
  Pod pod = run_pod("bare", /*labelled=*/false);
  std::string app = start(pod, "app", /*labelled=*/false);
  GenericRelist r(fake_, sink_, options());
  relist(r);
  auto events = sink_.take();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].pod_uid, "uid-bare");
  EXPECT_EQ(events[0].pod_name, "bare");
  EXPECT_EQ(events[0].container_name, "app");
  EXPECT_GT(events[0].status.started_at_ns, 0) << "inspected, though not selectable by label";
  ASSERT_TRUE(fake_.exit_container(app, 5).ok());
  relist(r);
  auto died = sink_.take();
  ASSERT_EQ(died.size(), 1u);
  EXPECT_EQ(died[0].exit_code, 5);
}

TEST_F(GenericRelistTest, InspectionIsTheKubeletsGetPodStatus) {
  Pod pod = run_pod("web");
  start(pod, "a");
  start(pod, "b");
  run_pod("quiet");
  std::vector<CriMethod> calls;
  InterposingCri cri(fake_);
  cri.before = [&](CriMethod m) { calls.push_back(m); };
  GenericRelist r2(cri, sink_, options());
  relist(r2);
  calls.clear();
  ASSERT_TRUE(fake_.exit_container(fake_.list_containers({})->at(1).id(), 1).ok());
  relist(r2);
  // One changed pod: the two lists, then ListPodSandbox by uid, PodSandboxStatus, ListContainers
  // by uid, a ContainerStatus per container. The quiet pod costs nothing.
  EXPECT_EQ(calls, (std::vector<CriMethod>{CriMethod::kListPodSandbox, CriMethod::kListContainers,
                                           CriMethod::kListPodSandbox, CriMethod::kPodSandboxStatus,
                                           CriMethod::kListContainers, CriMethod::kContainerStatus,
                                           CriMethod::kContainerStatus}));
}

TEST_F(GenericRelistTest, PodsIsTheConfirmedViewWithInspectedStatus) {
  Pod pod = run_pod("web");
  std::string app = start(pod, "app");
  GenericRelist r(fake_, sink_, options());
  EXPECT_TRUE(r.pods().empty());
  relist(r);
  ASSERT_TRUE(fake_.exit_container(app, 7, "Error").ok());
  relist(r);
  auto pods = r.pods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].uid, "uid-web");
  ASSERT_EQ(pods[0].containers.size(), 2u);
  ASSERT_TRUE(pods[0].containers[0].sandbox);
  EXPECT_EQ(pods[0].containers[0].state, ContainerState::kRunning);
  const ContainerRecord* c = pods[0].find(app);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->state, ContainerState::kExited);
  EXPECT_EQ(c->status.exit_code, 7);
  EXPECT_EQ(c->status.finished_at_ns, fake_.container_status(app)->finished_at());
}

TEST_F(GenericRelistTest, StatsFollowTheKubeletsMetricMeanings) {
  run_pod("web");
  InterposingCri cri(fake_);
  // The runtime takes 30 ms to list containers.
  cri.before = [&](CriMethod m) {
    if (m == CriMethod::kListContainers) clock_.advance(30ms);
  };
  GenericRelist r(cri, sink_, options());
  const int64_t t0 = clock_.real.load();
  relist(r);
  auto s = r.stats();
  EXPECT_EQ(s.relists, 1u);
  EXPECT_EQ(s.last_start_ns, t0);
  EXPECT_EQ(s.last_success_ns, t0) << "last seen is the start of the last good relist";
  // Two ListContainers: the relist's and the new pod's inspection.
  EXPECT_EQ(s.last_duration_ns, std::chrono::nanoseconds(60ms).count());
  EXPECT_EQ(s.last_end_ns, t0 + std::chrono::nanoseconds(60ms).count());
  EXPECT_EQ(s.last_interval_ns, 0) << "no previous relist";
  EXPECT_EQ(s.pods, 1u);
  EXPECT_EQ(s.containers, 1u);
  EXPECT_EQ(s.inspections, 1u);
  EXPECT_EQ(s.events_published, 1u);

  clock_.advance(1s);
  relist(r);
  s = r.stats();
  EXPECT_EQ(s.last_interval_ns, std::chrono::nanoseconds(1s + 60ms).count())
      << "from the previous successful relist's start";
  EXPECT_EQ(s.last_duration_ns, std::chrono::nanoseconds(30ms).count()) << "nothing to inspect";

  fake_.fail_next(CriMethod::kListPodSandbox, Error{grpc::StatusCode::UNAVAILABLE, "down"});
  clock_.advance(1s);
  EXPECT_FALSE(r.relist_once().ok());
  fake_.fail_next(CriMethod::kListPodSandbox, Error{grpc::StatusCode::UNAVAILABLE, "down"});
  clock_.advance(1s);
  EXPECT_FALSE(r.relist_once().ok());
  s = r.stats();
  EXPECT_EQ(s.last_interval_ns, std::chrono::nanoseconds(2s + 30ms).count())
      << "measured from the last successful relist, as the kubelet's relistTime";
  EXPECT_EQ(s.failed_relists, 2u);
  EXPECT_EQ(s.relists, 4u);
}

TEST_F(GenericRelistTest, OnRelistSeesEveryRelist) {
  run_pod("web");
  std::vector<RelistStats> seen;
  auto o = options();
  o.on_relist = [&](const RelistStats& s) { seen.push_back(s); };
  GenericRelist r(fake_, sink_, o);
  relist(r);
  fake_.fail_next(CriMethod::kListContainers, Error{grpc::StatusCode::UNAVAILABLE, "down"});
  EXPECT_FALSE(r.relist_once().ok());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].consecutive_failures, 0u);
  EXPECT_EQ(seen[1].consecutive_failures, 1u);
  EXPECT_EQ(seen[1].relists, 2u);
}

TEST_F(GenericRelistTest, HealthIsTheKubeletsHealthyWithReasons) {
  auto o = options();
  o.health_threshold = 3min;
  GenericRelist r(fake_, sink_, o);
  auto h = r.health();
  EXPECT_FALSE(h.healthy);
  EXPECT_EQ(h.reason, "relist has yet to succeed");

  fake_.fail_next(CriMethod::kListPodSandbox,
                  Error{grpc::StatusCode::UNAVAILABLE, "CRI ListPodSandbox: connection refused"});
  EXPECT_FALSE(r.relist_once().ok());
  h = r.health();
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.reason.find("yet to succeed"), std::string::npos);
  EXPECT_NE(h.reason.find("connection refused"), std::string::npos);

  const int64_t t0 = clock_.mono.load();
  relist(r);
  EXPECT_TRUE(r.health(t0 + std::chrono::nanoseconds(2min).count()).healthy);
  EXPECT_TRUE(r.health(t0 + std::chrono::nanoseconds(3min).count()).healthy);
  h = r.health(t0 + std::chrono::nanoseconds(3min + 12500ms).count());
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.reason.find("last successful 3m12.5s ago; threshold is 3m0s"), std::string::npos)
      << h.reason;

  // Failing relists do not count as seen.
  fake_.fail_always(CriMethod::kListContainers, Error{grpc::StatusCode::UNAVAILABLE, "down"});
  clock_.advance(4min);
  EXPECT_FALSE(r.relist_once().ok());
  h = r.health();
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.reason.find("4m0s ago"), std::string::npos) << h.reason;
  fake_.fail_always(CriMethod::kListContainers, std::nullopt);
  relist(r);
  EXPECT_TRUE(r.health().healthy);
  EXPECT_TRUE(r.health().reason.empty());
}

// Relists the way the real loop would meet them: many changes, one relist after each, some
// inspections failing. Every container's events must be in lifecycle order with none twice, and
// no death or removal may be lost. (A Started can be missed, exactly as in the kubelet, when the
// container exited before its pod could be inspected.)
TEST_F(GenericRelistTest, NoEventTwiceAcrossManyRelists) {
  GenericRelist r(fake_, sink_, options());
  std::vector<Pod> pods;
  std::vector<std::string> live, exited, removed;
  std::map<std::string, int> exit_code;
  for (int i = 0; i < 3; ++i) pods.push_back(run_pod("p" + std::to_string(i)));
  for (int step = 0; step < 60; ++step) {
    switch (step % 3) {
      case 0:
        live.push_back(start(pods[step % pods.size()], "c" + std::to_string(step)));
        break;
      case 1:
        ASSERT_TRUE(fake_.exit_container(live.front(), step).ok());
        exit_code[live.front()] = step;
        exited.push_back(live.front());
        live.erase(live.begin());
        break;
      case 2:
        if (exited.size() > 2) {
          ASSERT_TRUE(fake_.remove_container(exited.front()).ok());
          removed.push_back(exited.front());
          exited.erase(exited.begin());
        }
        break;
    }
    if (step % 7 == 3)
      fake_.fail_next(CriMethod::kContainerStatus, Error{grpc::StatusCode::UNAVAILABLE, "blip"});
    relist(r);
  }
  for (int i = 0; i < 2; ++i) relist(r);  // let pending inspections through
  EXPECT_GT(r.stats().failed_inspections, 0u);
  EXPECT_TRUE(r.health().pending_inspections.empty());

  std::map<std::string, std::vector<ET>> per_container;
  std::map<std::string, int> died_exit_code;
  for (const auto& e : sink_.events()) {
    if (e.sandbox) continue;
    per_container[e.container_id].push_back(e.type);
    if (e.type == ET::kContainerDied) died_exit_code[e.container_id] = e.exit_code;
  }
  EXPECT_EQ(per_container.size(), 20u);
  for (const auto& [id, seq] : per_container) {
    for (size_t i = 1; i < seq.size(); ++i)
      EXPECT_LT(static_cast<int>(seq[i - 1]), static_cast<int>(seq[i])) << id;  // order, once
  }
  auto has = [&](const std::string& id, ET t) {
    const auto& seq = per_container[id];
    return std::find(seq.begin(), seq.end(), t) != seq.end();
  };
  for (const auto& id : exited) {
    EXPECT_TRUE(has(id, ET::kContainerDied)) << id;
    EXPECT_FALSE(has(id, ET::kContainerRemoved)) << id;
  }
  for (const auto& id : removed) {
    EXPECT_TRUE(has(id, ET::kContainerDied)) << id;
    EXPECT_TRUE(has(id, ET::kContainerRemoved)) << id;
  }
  for (const auto& [id, code] : died_exit_code) EXPECT_EQ(code, exit_code.at(id)) << id;
  EXPECT_FALSE(removed.empty());
}

// --- the loop ------------------------------------------------------------------------------

TEST(GenericRelistLoop, RelistsEveryPeriodDeliversEventsAndStopsPromptly) {
  FakeCriClient fake;
  CollectingSink sink;
  GenericRelistOptions o;
  o.period = 10ms;
  GenericRelist r(fake, sink, o);
  EXPECT_FALSE(r.running());
  r.start();
  r.start();  // idempotent
  EXPECT_TRUE(r.running());
  ASSERT_TRUE(eventually([&] { return r.stats().relists >= 3; })) << r.stats().relists;

  auto pc = pod_config("web");
  auto sandbox = fake.run_pod_sandbox(pc);
  ASSERT_TRUE(sandbox.ok());
  ASSERT_TRUE(eventually([&] { return sink.events().size() == 1; }));
  EXPECT_EQ(sink.events()[0].container_id, *sandbox);
  EXPECT_TRUE(r.health().healthy);

  r.stop();
  EXPECT_FALSE(r.running());
  const uint64_t after_stop = r.stats().relists;
  r.stop();  // idempotent
  ASSERT_TRUE(fake.stop_pod_sandbox(*sandbox).ok());
  EXPECT_TRUE(r.relist_once().ok()) << "relist_once still works with the loop stopped";
  EXPECT_EQ(r.stats().relists, after_stop + 1) << "no relist from the stopped loop";

  r.start();  // restartable
  ASSERT_TRUE(eventually([&] { return r.stats().relists >= after_stop + 3; }));
  r.stop();
}

TEST(GenericRelistLoop, StopDoesNotWaitForThePeriod) {
  FakeCriClient fake;
  CollectingSink sink;
  GenericRelistOptions o;
  o.period = std::chrono::hours(1);
  GenericRelist r(fake, sink, o);
  r.start();
  ASSERT_TRUE(eventually([&] { return r.stats().relists == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  r.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(r.stats().relists, 1u);
}

TEST(GenericRelistLoop, NextRelistStartsAPeriodAfterThePreviousEnded) {
  FakeCriClient fake;
  CollectingSink sink;
  InterposingCri cri(fake);
  // A slow runtime: each list takes 40 ms (the time a relist costs, not synchronisation).
  cri.before = [](CriMethod m) {
    if (m == CriMethod::kListPodSandbox) std::this_thread::sleep_for(40ms);
  };
  GenericRelistOptions o;
  o.period = 50ms;
  std::mutex mu;
  std::vector<RelistStats> seen;
  o.on_relist = [&](const RelistStats& s) {
    std::lock_guard lock(mu);
    seen.push_back(s);
  };
  GenericRelist r(cri, sink, o);
  r.start();
  ASSERT_TRUE(eventually([&] { return r.stats().relists >= 4; }));
  r.stop();
  std::lock_guard lock(mu);
  for (size_t i = 1; i < seen.size(); ++i) {
    // A fixed-rate ticker would start every 50 ms; wait.Until waits 50 ms after each end.
    EXPECT_GE(seen[i].last_start_ns - seen[i - 1].last_end_ns,
              std::chrono::nanoseconds(50ms).count());
    EXPECT_GE(seen[i].last_interval_ns, std::chrono::nanoseconds(90ms).count());
    EXPECT_GE(seen[i].last_duration_ns, std::chrono::nanoseconds(40ms).count());
  }
}

}  // namespace
}  // namespace kpleg::pleg
