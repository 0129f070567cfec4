// InflightCalls: what the stuck-call watchdog knows of the calls in flight.
#include "cri/inflight_calls.h"

#include <gtest/gtest.h>

#include <thread>

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;

CallSubject id_subject(std::string id) {
  CallSubject s;
  s.id = std::move(id);
  return s;
}

TEST(InflightCalls, ACallIsListedWhileItRunsAndGoneWhenItsTicketEnds) {
  InflightCalls calls;
  {
    auto t = calls.begin("StopPodSandbox", CallOrigin::kEndpoint, id_subject("sb1"));
    auto listed = calls.older_than(0ms);
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].method, "StopPodSandbox");
    EXPECT_EQ(listed[0].origin, CallOrigin::kEndpoint);
    EXPECT_EQ(listed[0].subject.id, "sb1");
  }
  EXPECT_TRUE(calls.older_than(0ms).empty());
  EXPECT_EQ(calls.size(), 0u);
}

TEST(InflightCalls, OnlyCallsOldEnoughAreListedOldestFirst) {
  InflightCalls calls;
  auto old1 = calls.begin("RunPodSandbox", CallOrigin::kEndpoint, {});
  auto old2 = calls.begin("PodSandboxStatus", CallOrigin::kDaemon, id_subject("x"));
  std::this_thread::sleep_for(60ms);  // ages the calls; not a synchronisation
  auto young = calls.begin("ContainerStatus", CallOrigin::kDaemon, id_subject("y"));
  auto listed = calls.older_than(50ms);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].method, "RunPodSandbox");
  EXPECT_EQ(listed[1].method, "PodSandboxStatus");
  EXPECT_GE(listed[0].age, 50ms);
  EXPECT_EQ(calls.older_than(0ms).size(), 3u);
  auto left = calls.until_one_reaches(50ms);
  ASSERT_TRUE(left.has_value());
  EXPECT_LE(*left, 50ms);
  young.end();
  old1.end();
  old2.end();
  EXPECT_FALSE(calls.until_one_reaches(50ms).has_value());
}

TEST(InflightCalls, IdsAreResolvedToPodsOnlyWhenListed) {
  InflightCalls calls;
  int lookups = 0;
  calls.set_resolver([&](const CallSubject& s) -> std::optional<CallSubject> {
    ++lookups;
    if (s.id != "c1") return std::nullopt;
    return CallSubject{s.id, {"uid-1", "web", "default"}, "app"};
  });
  auto t1 = calls.begin("ContainerStatus", CallOrigin::kDaemon, id_subject("c1"));
  auto t2 = calls.begin("StopContainer", CallOrigin::kEndpoint, id_subject("unknown"));
  EXPECT_EQ(lookups, 0);
  auto listed = calls.older_than(0ms);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(lookups, 2);
  EXPECT_EQ(listed[0].subject.pod.uid, "uid-1");
  EXPECT_EQ(listed[0].subject.pod.namespace_, "default");
  EXPECT_EQ(listed[0].subject.container_name, "app");
  EXPECT_NE(describe(listed[0]).find("ContainerStatus for default/web (uid uid-1), container app"),
            std::string::npos)
      << describe(listed[0]);
  EXPECT_NE(describe(listed[1]).find("no pod known"), std::string::npos) << describe(listed[1]);
}

// Health, /metrics and Stats list the stuck calls at every read: while the runtime hangs, a
// lookup per stuck call per read (a full snapshot of kpleg's state each, under the tracker's
// locks) made health the more expensive the longer the hang. Each call is looked up once.
TEST(InflightCalls, AStuckCallIsResolvedOnceHoweverOftenItIsListed) {
  InflightCalls calls;
  int lookups = 0;
  calls.set_resolver([&](const CallSubject& s) -> std::optional<CallSubject> {
    ++lookups;
    if (s.id.rfind("known-", 0) != 0) return std::nullopt;
    return CallSubject{s.id, {"uid-" + s.id, "web", "default"}, "app"};
  });
  constexpr int kStuck = 50, kReads = 200;
  std::vector<InflightCalls::Ticket> tickets;
  for (int i = 0; i < kStuck; ++i) {
    tickets.push_back(calls.begin("ContainerStatus", CallOrigin::kDaemon,
                                  id_subject((i % 2 ? "known-" : "gone-") + std::to_string(i))));
  }
  for (int r = 0; r < kReads; ++r) {
    auto listed = calls.older_than(0ms);
    ASSERT_EQ(listed.size(), size_t(kStuck));
    EXPECT_EQ(listed[1].subject.pod.uid, "uid-known-1") << "a hit is kept on the call";
    EXPECT_TRUE(listed[0].subject.pod.uid.empty());
  }
  // Once per call: the known ones keep their pod, the unknown ones are asked again only after
  // a while (well beyond this loop).
  EXPECT_EQ(lookups, kStuck);
}

TEST(InflightCalls, ARequestThatNamesItsPodIsNotResolved) {
  InflightCalls calls;
  calls.set_resolver([](const CallSubject&) -> std::optional<CallSubject> {
    return CallSubject{"", {"wrong", "wrong", "wrong"}, ""};
  });
  CallSubject s;
  s.pod.uid = "uid-2";
  s.pod.name = "db";
  s.pod.namespace_ = "prod";
  auto t = calls.begin("RunPodSandbox", CallOrigin::kEndpoint, s);
  auto listed = calls.older_than(0ms);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].subject.pod.name, "db");
  std::string d = describe(listed[0]);
  EXPECT_EQ(d.rfind("RunPodSandbox for prod/db (uid uid-2) in flight for ", 0), 0u) << d;
  EXPECT_NE(d.find("through the CRI endpoint"), std::string::npos) << d;
}

TEST(InflightCalls, ABarePodUidIsResolvedToItsPod) {
  InflightCalls calls;
  calls.set_resolver([](const CallSubject& s) -> std::optional<CallSubject> {
    if (s.pod.uid != "uid-3") return std::nullopt;
    return CallSubject{"", {"uid-3", "cache", "infra"}, ""};
  });
  CallSubject s;
  s.pod.uid = "uid-3";  // ListContainers by the pod uid label
  auto t = calls.begin("ListContainers", CallOrigin::kDaemon, s);
  auto listed = calls.older_than(0ms);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].subject.pod.name, "cache");
  EXPECT_EQ(listed[0].subject.pod.namespace_, "infra");
}

TEST(InflightCalls, PerMethodCountsFallBackToZeroInsteadOfVanishing) {
  InflightCalls calls;
  auto a = calls.begin("ListContainers", CallOrigin::kDaemon, {});
  auto b = calls.begin("ListContainers", CallOrigin::kDaemon, {});
  auto m = calls.by_method();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].count, 2u);
  a.end();
  b.end();
  m = calls.by_method();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].method, "ListContainers");
  EXPECT_EQ(m[0].count, 0u);
  EXPECT_EQ(m[0].oldest, 0ms);
}

TEST(InflightCalls, AMovedTicketEndsTheCallOnce) {
  InflightCalls calls;
  InflightCalls::Ticket outer;
  {
    auto t = calls.begin("Version", CallOrigin::kDaemon, {});
    outer = std::move(t);
  }
  EXPECT_EQ(calls.size(), 1u);
  outer.end();
  outer.end();
  EXPECT_EQ(calls.size(), 0u);
}

}  // namespace
}  // namespace kpleg::cri
