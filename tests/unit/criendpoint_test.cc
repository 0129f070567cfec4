// The CRI endpoint's logic without sockets: what a request is about (the watchdog's subject),
// and the GetContainerEvents events built from kpleg's lifecycle events, against the in-memory
// runtime. The endpoint itself, forwarding to the real containerd, is tested in
// tests/kubelet/cri_endpoint_test.cc.
#include <gtest/gtest.h>

#include <condition_variable>

#include "cri/api.pb.h"
#include "criendpoint/container_event_feed.h"
#include "criendpoint/request_subject.h"
#include "support/eventually.h"
#include "support/fake_cri_client.h"

namespace kpleg::criendpoint {
namespace {

constexpr const char* kUidLabel = "io.kubernetes.pod.uid";

TEST(RequestSubject, RunPodSandboxNamesItsPod) {
  v1::RunPodSandboxRequest req;
  auto* md = req.mutable_config()->mutable_metadata();
  md->set_name("web-0");
  md->set_namespace_("shop");
  md->set_uid("u-1");
  auto s = request_subject("/runtime.v1.RuntimeService/RunPodSandbox", req.SerializeAsString());
  EXPECT_EQ(s.pod.uid, "u-1");
  EXPECT_EQ(s.pod.name, "web-0");
  EXPECT_EQ(s.pod.namespace_, "shop");
  EXPECT_TRUE(s.id.empty());
}

TEST(RequestSubject, CreateContainerNamesPodSandboxAndContainer) {
  v1::CreateContainerRequest req;
  req.set_pod_sandbox_id("sb-9");
  req.mutable_config()->mutable_metadata()->set_name("app");
  req.mutable_sandbox_config()->mutable_metadata()->set_uid("u-2");
  req.mutable_sandbox_config()->mutable_metadata()->set_name("api");
  auto s = request_subject("/runtime.v1.RuntimeService/CreateContainer", req.SerializeAsString());
  EXPECT_EQ(s.id, "sb-9");
  EXPECT_EQ(s.pod.uid, "u-2");
  EXPECT_EQ(s.pod.name, "api");
  EXPECT_EQ(s.container_name, "app");
}

TEST(RequestSubject, IdMethodsNameTheirFirstField) {
  v1::StopPodSandboxRequest stop;
  stop.set_pod_sandbox_id("sb-1");
  EXPECT_EQ(request_subject("/runtime.v1.RuntimeService/StopPodSandbox", stop.SerializeAsString()).id,
            "sb-1");
  v1::ContainerStatusRequest cs;
  cs.set_container_id("c-1");
  EXPECT_EQ(request_subject("/runtime.v1.RuntimeService/ContainerStatus", cs.SerializeAsString()).id,
            "c-1");
  // ExecSync is not in kpleg's copy of the API; its field 1 is the container id all the same.
  v1::ContainerStatusRequest exec_like;
  exec_like.set_container_id("c-2");
  EXPECT_EQ(request_subject("/runtime.v1.RuntimeService/ExecSync", exec_like.SerializeAsString()).id,
            "c-2");
}

// Found by cri_request_subject_fuzz: a field given twice is its last value to the runtime.
TEST(RequestSubject, AnIdGivenTwiceIsTheLastOneAsTheRuntimeReadsIt) {
  v1::StopContainerRequest first, second;
  first.set_container_id("decoy");
  second.set_container_id("c-real");
  const std::string both = first.SerializeAsString() + second.SerializeAsString();
  v1::StopContainerRequest as_parsed;
  ASSERT_TRUE(as_parsed.ParseFromString(both));
  ASSERT_EQ(as_parsed.container_id(), "c-real");
  EXPECT_EQ(request_subject("/runtime.v1.RuntimeService/StopContainer", both).id, "c-real");
}

TEST(RequestSubject, ListsByPodUidLabelNameThePod) {
  v1::ListContainersRequest lc;
  (*lc.mutable_filter()->mutable_label_selector())["io.kubernetes.pod.uid"] = "u-7";
  EXPECT_EQ(
      request_subject("/runtime.v1.RuntimeService/ListContainers", lc.SerializeAsString()).pod.uid,
      "u-7");
  v1::ListPodSandboxRequest lp;
  (*lp.mutable_filter()->mutable_label_selector())["io.kubernetes.pod.uid"] = "u-8";
  EXPECT_EQ(
      request_subject("/runtime.v1.RuntimeService/ListPodSandbox", lp.SerializeAsString()).pod.uid,
      "u-8");
}

TEST(RequestSubject, UnknownMethodsAndGarbageHaveNoSubject) {
  v1::ContainerStatusRequest cs;
  cs.set_container_id("c-1");
  EXPECT_TRUE(request_subject("/runtime.v1.RuntimeService/SomethingNew", cs.SerializeAsString()).id.empty());
  EXPECT_TRUE(request_subject("/runtime.v1.ImageService/PullImage", cs.SerializeAsString()).id.empty());
  auto s = request_subject("/runtime.v1.RuntimeService/StopPodSandbox", std::string("\xff\xff\xff", 3));
  EXPECT_TRUE(s.id.empty());
  EXPECT_EQ(short_method("/runtime.v1.ImageService/PullImage"), "PullImage");
  EXPECT_EQ(short_method("/other.Service/Call"), "/other.Service/Call");
}

class ContainerEventBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::PodSandboxConfig pc;
    pc.mutable_metadata()->set_name("web");
    pc.mutable_metadata()->set_namespace_("default");
    pc.mutable_metadata()->set_uid("uid-1");
    (*pc.mutable_labels())[kUidLabel] = "uid-1";
    sandbox_config = pc;
    sandbox = *cri.run_pod_sandbox(pc);
    for (const char* name : {"app", "sidecar"}) {
      v1::ContainerConfig cc;
      cc.mutable_metadata()->set_name(name);
      (*cc.mutable_labels())[kUidLabel] = "uid-1";
      auto id = *cri.create_container(sandbox, cc, pc);
      ASSERT_TRUE(cri.start_container(id));
      containers.push_back(id);
    }
  }
  pleg::PodLifecycleEvent event(pleg::EventType type, const std::string& id, bool is_sandbox) {
    pleg::PodLifecycleEvent ev;
    ev.type = type;
    ev.pod_uid = "uid-1";
    ev.pod_name = "web";
    ev.pod_namespace = "default";
    ev.container_id = id;
    ev.sandbox = is_sandbox;
    return ev;
  }
  cri::FakeCriClient cri;
  v1::PodSandboxConfig sandbox_config;
  std::string sandbox;
  std::vector<std::string> containers;
  PodMemory memory;
};

TEST_F(ContainerEventBuild, ADeathCarriesTheSandboxAndEveryContainerOfThePod) {
  ASSERT_TRUE(cri.exit_container(containers[0], 3));
  auto built = build_container_event(cri, event(pleg::EventType::kContainerDied, containers[0], false),
                                     memory, 5000);
  ASSERT_TRUE(built) << built.error().message;
  ASSERT_TRUE(built->has_value());
  const auto& ev = **built;
  EXPECT_EQ(ev.container_id(), containers[0]);
  EXPECT_EQ(ev.container_event_type(), v1::CONTAINER_STOPPED_EVENT);
  EXPECT_EQ(ev.created_at(), 5000);
  EXPECT_EQ(ev.pod_sandbox_status().id(), sandbox);
  EXPECT_EQ(ev.pod_sandbox_status().metadata().uid(), "uid-1");
  EXPECT_EQ(ev.pod_sandbox_status().state(), v1::SANDBOX_READY);
  ASSERT_EQ(ev.containers_statuses_size(), 2);
  for (const auto& cs : ev.containers_statuses()) {
    if (cs.id() == containers[0]) {
      EXPECT_EQ(cs.state(), v1::CONTAINER_EXITED);
      EXPECT_EQ(cs.exit_code(), 3);
    } else {
      EXPECT_EQ(cs.state(), v1::CONTAINER_RUNNING);
    }
  }
}

// The runtime still says Error for an OOM kill the event knows of (its cgroup's OOM event not
// in yet): the status the kubelet gets says what the runtime comes to. An event that says
// Error leaves it, and so does the runtime's status of a container the event is not about.
TEST_F(ContainerEventBuild, ADeathTheKernelSawAsAnOomKillSaysOOMKilledWhereTheRuntimeSaysError) {
  ASSERT_TRUE(cri.exit_container(containers[0], 137, "Error"));
  ASSERT_TRUE(cri.exit_container(containers[1], 137, "Error"));
  auto died = event(pleg::EventType::kContainerDied, containers[0], false);
  died.reason = "OOMKilled";
  auto built = build_container_event(cri, died, memory, 1);
  ASSERT_TRUE(built && built->has_value());
  for (const auto& cs : (**built).containers_statuses()) {
    // The other container's death is not this event's: its status is the runtime's.
    EXPECT_EQ(cs.reason(), cs.id() == containers[0] ? "OOMKilled" : "Error") << cs.id();
  }
  died.reason = "Error";
  built = build_container_event(cri, died, memory, 2);
  ASSERT_TRUE(built && built->has_value());
  for (const auto& cs : (**built).containers_statuses()) EXPECT_EQ(cs.reason(), "Error");
}

TEST_F(ContainerEventBuild, CreatedAtIncreasesPerPodEvenWhenTheClockDoesNot) {
  auto a = build_container_event(cri, event(pleg::EventType::kContainerStarted, containers[0], false),
                                 memory, 7000);
  auto b = build_container_event(cri, event(pleg::EventType::kContainerStarted, containers[1], false),
                                 memory, 7000);
  auto c = build_container_event(cri, event(pleg::EventType::kContainerStarted, containers[1], false),
                                 memory, 6000);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ((*a)->created_at(), 7000);
  EXPECT_EQ((*b)->created_at(), 7001);
  EXPECT_EQ((*c)->created_at(), 7002);
}

TEST_F(ContainerEventBuild, ARemovedSandboxIsReportedWithItsLastStatusNotReady) {
  ASSERT_TRUE(build_container_event(cri, event(pleg::EventType::kContainerStarted, sandbox, true),
                                    memory, 100));
  for (const auto& id : containers) {
    ASSERT_TRUE(cri.stop_container(id, 0));
    ASSERT_TRUE(cri.remove_container(id));
  }
  ASSERT_TRUE(cri.stop_pod_sandbox(sandbox));
  ASSERT_TRUE(cri.remove_pod_sandbox(sandbox));
  auto built = build_container_event(cri, event(pleg::EventType::kContainerRemoved, sandbox, true),
                                     memory, 200);
  ASSERT_TRUE(built) << built.error().message;
  const auto& ev = **built;
  EXPECT_EQ(ev.container_event_type(), v1::CONTAINER_DELETED_EVENT);
  EXPECT_EQ(ev.container_id(), sandbox);
  EXPECT_EQ(ev.pod_sandbox_status().id(), sandbox);
  EXPECT_EQ(ev.pod_sandbox_status().metadata().name(), "web");
  EXPECT_EQ(ev.pod_sandbox_status().metadata().uid(), "uid-1");
  EXPECT_EQ(ev.pod_sandbox_status().state(), v1::SANDBOX_NOTREADY);
  EXPECT_EQ(ev.containers_statuses_size(), 0);
}

TEST_F(ContainerEventBuild, APodNeverSeenStillGetsASandboxStatusWithItsUid) {
  auto ev = event(pleg::EventType::kContainerRemoved, "gone", false);
  ev.pod_uid = "uid-never";
  auto built = build_container_event(cri, ev, memory, 1);
  ASSERT_TRUE(built) << built.error().message;
  EXPECT_EQ((**built).pod_sandbox_status().metadata().uid(), "uid-never");
  EXPECT_EQ((**built).pod_sandbox_status().metadata().name(), "web");
}

TEST_F(ContainerEventBuild, EventsTheCriStreamDoesNotCarryBuildNothing) {
  for (auto t : {pleg::EventType::kPodSync, pleg::EventType::kContainerChanged,
                 pleg::EventType::kResync}) {
    auto built = build_container_event(cri, event(t, containers[0], false), memory, 1);
    ASSERT_TRUE(built);
    EXPECT_FALSE(built->has_value());
  }
}

TEST_F(ContainerEventBuild, AHintCostsNoCallAndCarriesThePodUid) {
  const uint64_t before = cri.call_stats().total();
  auto died = hint_container_event(event(pleg::EventType::kContainerDied, containers[0], false),
                                   memory, 50);
  auto gone = hint_container_event(event(pleg::EventType::kContainerRemoved, sandbox, true), memory, 50);
  const uint64_t after = cri.call_stats().total();
  EXPECT_EQ(after, before);
  ASSERT_TRUE(died && gone);
  EXPECT_EQ(died->container_event_type(), v1::CONTAINER_STOPPED_EVENT);
  EXPECT_EQ(died->pod_sandbox_status().metadata().uid(), "uid-1");
  EXPECT_EQ(died->pod_sandbox_status().metadata().name(), "web");
  EXPECT_EQ(died->containers_statuses_size(), 0);
  EXPECT_EQ(gone->pod_sandbox_status().id(), sandbox);
  EXPECT_EQ(gone->pod_sandbox_status().state(), v1::SANDBOX_NOTREADY);
  EXPECT_GT(gone->created_at(), died->created_at());
  EXPECT_FALSE(hint_container_event(event(pleg::EventType::kPodSync, sandbox, true), memory, 60));
}

TEST_F(ContainerEventBuild, AFailedCallIsAnErrorNotAnIncompleteList) {
  cri.fail_next(cri::CriMethod::kContainerStatus,
                Error{4 /* DEADLINE_EXCEEDED */, "CRI ContainerStatus failed: DEADLINE_EXCEEDED"});
  auto built = build_container_event(cri, event(pleg::EventType::kContainerStarted, containers[0], false),
                                     memory, 1);
  EXPECT_FALSE(built);
}

// Collects what the feed delivers, in order.
class Collector final : public EventReceiver {
 public:
  void deliver(std::shared_ptr<const std::string> message) override {
    v1::ContainerEventResponse ev;
    ASSERT_TRUE(ev.ParseFromString(*message));
    std::lock_guard lk(mu);
    got.push_back(ev);
    cv.notify_all();
  }
  bool wait_for(size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(5), [&] { return got.size() >= n; });
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<v1::ContainerEventResponse> got;
};

TEST_F(ContainerEventBuild, ARetriedStartedGoesOutBeforeTheStoppedThatFollowsIt) {
  ContainerEventFeedOptions o;
  o.retry_after = std::chrono::milliseconds(50);
  ContainerEventFeed feed(cri, o);
  auto sink = std::make_shared<Collector>();
  feed.add(sink);
  // The STARTED's first build fails; the STOPPED that follows must wait for its retry.
  cri.fail_next(cri::CriMethod::kListPodSandbox, Error{14 /* UNAVAILABLE */, "busy"});
  feed.post(std::make_shared<pleg::PodLifecycleEvent>(
      event(pleg::EventType::kContainerStarted, containers[0], false)));
  ASSERT_TRUE(cri.exit_container(containers[0], 1));
  feed.post(std::make_shared<pleg::PodLifecycleEvent>(
      event(pleg::EventType::kContainerDied, containers[0], false)));
  ASSERT_TRUE(sink->wait_for(2));
  {
    std::lock_guard lk(sink->mu);
    EXPECT_EQ(sink->got[0].container_event_type(), v1::CONTAINER_STARTED_EVENT);
    EXPECT_EQ(sink->got[1].container_event_type(), v1::CONTAINER_STOPPED_EVENT);
    EXPECT_LT(sink->got[0].created_at(), sink->got[1].created_at());
  }
  // The feed counts an event out of its queue after handing it over: the count follows.
  EXPECT_TRUE(kpleg::testing::eventually([&] { return feed.stats().queued == 0; }));
}

TEST_F(ContainerEventBuild, EventsWaitingForTheRuntimeAreBounded) {
  ContainerEventFeedOptions o;
  o.max_queued = 2;
  o.attempts = 1000;
  o.retry_after = std::chrono::hours(1);
  ContainerEventFeed feed(cri, o);
  feed.add(std::make_shared<Collector>());
  cri.fail_always(cri::CriMethod::kListPodSandbox, Error{14 /* UNAVAILABLE */, "down"});
  for (int i = 0; i < 5; ++i) {
    feed.post(std::make_shared<pleg::PodLifecycleEvent>(
        event(pleg::EventType::kContainerDied, containers[i % 2], false)));
  }
  auto st = feed.stats();
  EXPECT_EQ(st.queued, 2u);
  EXPECT_EQ(st.overflowed, 3u);
  feed.stop();  // drops what waits
}

TEST_F(ContainerEventBuild, NothingIsQueuedWhileNobodySubscribes) {
  ContainerEventFeed feed(cri);
  feed.post(std::make_shared<pleg::PodLifecycleEvent>(
      event(pleg::EventType::kContainerDied, containers[0], false)));
  EXPECT_EQ(feed.stats().queued, 0u);
  EXPECT_EQ(cri.calls(cri::CriMethod::kListPodSandbox), 0u);
}

}  // namespace
}  // namespace kpleg::criendpoint
