// kpleg-cri-relay's catch-up after kplegd came back as a new instance: what changed in the gap
// (the new instance's List against what the relay knew from the old one's events) becomes
// events, and nothing else does.
#include <gtest/gtest.h>

#include "relay/kplegd_follower.h"

namespace kpleg::relay {
namespace {

namespace v1 = ::kpleg::v1;

void add_container(v1::Pod* pod, const std::string& id, const std::string& name, bool sandbox,
                   v1::ContainerState state) {
  auto* c = pod->add_containers();
  c->set_id(id);
  c->set_name(name);
  c->set_sandbox(sandbox);
  c->mutable_status()->set_state(state);
}

pleg::PodLifecycleEvent started(const std::string& uid, const std::string& id, bool sandbox) {
  pleg::PodLifecycleEvent ev;
  ev.type = pleg::EventType::kContainerStarted;
  ev.pod_uid = uid;
  ev.pod_name = "web";
  ev.pod_namespace = "default";
  ev.container_id = id;
  ev.container_name = sandbox ? "" : "app";
  ev.sandbox = sandbox;
  return ev;
}

TEST(RelayCatchUp, ThePodsThatChangedInTheGapAndOnlyThoseBecomeEvents) {
  KplegdFollower::Known known;
  // Before the gap: pod A (sandbox + app running), pod B (sandbox + app running), pod C.
  for (const char* uid : {"A", "B", "C"}) {
    KplegdFollower::apply(known, started(uid, std::string(uid) + "-sb", true));
    KplegdFollower::apply(known, started(uid, std::string(uid) + "-app", false));
  }
  // After it: A unchanged; B's app died and was replaced by a new one, running; C gone; D new.
  v1::ListResponse list;
  auto* a = list.add_pods();
  a->set_uid("A");
  add_container(a, "A-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(a, "A-app", "app", false, v1::CONTAINER_STATE_RUNNING);
  auto* b = list.add_pods();
  b->set_uid("B");
  add_container(b, "B-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(b, "B-app", "app", false, v1::CONTAINER_STATE_EXITED);
  add_container(b, "B-app2", "app", false, v1::CONTAINER_STATE_RUNNING);
  auto* d = list.add_pods();
  d->set_uid("D");
  add_container(d, "D-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(d, "D-init", "init", false, v1::CONTAINER_STATE_CREATED);

  auto events = KplegdFollower::catch_up(known, list);
  std::vector<std::string> got;
  for (const auto& ev : events) {
    got.push_back(std::string(pleg::to_string(ev.type)) + " " + ev.container_id);
    EXPECT_TRUE(ev.correction);
    EXPECT_EQ(ev.source, pleg::EventSource::kReconcile);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"ContainerDied B-app", "ContainerStarted B-app2",
                                           "ContainerStarted D-sb", "ContainerRemoved C-app",
                                           "ContainerRemoved C-sb"}));
  // The List is what is known now: the same List again changes nothing.
  EXPECT_TRUE(KplegdFollower::catch_up(known, list).empty());
}

TEST(RelayCatchUp, ARemovedContainerIsForgottenAndItsPodWithTheLast) {
  KplegdFollower::Known known;
  KplegdFollower::apply(known, started("A", "A-sb", true));
  auto removed = started("A", "A-sb", true);
  removed.type = pleg::EventType::kContainerRemoved;
  KplegdFollower::apply(known, removed);
  EXPECT_TRUE(known.empty());
}

}  // namespace
}  // namespace kpleg::relay
