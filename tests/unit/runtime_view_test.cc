// The runtime view's rules, one by one, against the kubelet's (generic.go, GetPods).
#include "pleg/runtime_view.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace kpleg::pleg {
namespace {

using CS = ContainerState;
using ET = EventType;

v1::PodSandbox sandbox(const std::string& id, const std::string& uid, v1::PodSandboxState state,
                       bool labelled = true) {
  v1::PodSandbox s;
  s.set_id(id);
  s.set_state(state);
  s.set_created_at(1'700'000'000'000'000'000);
  s.mutable_metadata()->set_uid(uid);
  s.mutable_metadata()->set_name("meta-" + uid);
  s.mutable_metadata()->set_namespace_("meta-ns");
  if (labelled) {
    (*s.mutable_labels())[kPodUidLabel] = uid;
    (*s.mutable_labels())[kPodNameLabel] = "web-" + uid;
    (*s.mutable_labels())[kPodNamespaceLabel] = "prod";
  }
  return s;
}

v1::Container container(const std::string& id, const std::string& sandbox_id,
                        const std::string& uid, const std::string& name, v1::ContainerState state,
                        bool labelled = true) {
  v1::Container c;
  c.set_id(id);
  c.set_pod_sandbox_id(sandbox_id);
  c.set_state(state);
  c.set_created_at(1'700'000'000'500'000'000);
  c.mutable_metadata()->set_name("meta-" + name);
  if (labelled) {
    (*c.mutable_labels())[kPodUidLabel] = uid;
    (*c.mutable_labels())[kPodNameLabel] = "web-" + uid;
    (*c.mutable_labels())[kPodNamespaceLabel] = "prod";
    (*c.mutable_labels())[kContainerNameLabel] = name;
  }
  return c;
}

std::vector<ET> types(const std::vector<PodLifecycleEvent>& events) {
  std::vector<ET> out;
  for (const auto& e : events) out.push_back(e.type);
  return out;
}

TEST(RuntimeView, StateMappingIsTheGenericPlegs) {
  EXPECT_EQ(runtime_state(v1::CONTAINER_CREATED), CS::kCreated);
  EXPECT_EQ(runtime_state(v1::CONTAINER_RUNNING), CS::kRunning);
  EXPECT_EQ(runtime_state(v1::CONTAINER_EXITED), CS::kExited);
  EXPECT_EQ(runtime_state(v1::CONTAINER_UNKNOWN), CS::kUnknown);
  EXPECT_EQ(runtime_state(v1::SANDBOX_READY), CS::kRunning);
  EXPECT_EQ(runtime_state(v1::SANDBOX_NOTREADY), CS::kExited);

  EXPECT_EQ(pleg_state(CS::kCreated), CS::kUnknown) << "the kubelet does not use 'created'";
  EXPECT_EQ(pleg_state(CS::kUnknown), CS::kUnknown);
  EXPECT_EQ(pleg_state(CS::kRunning), CS::kRunning);
  EXPECT_EQ(pleg_state(CS::kExited), CS::kExited);
  EXPECT_EQ(pleg_state(CS::kNonExistent), CS::kNonExistent);
}

TEST(RuntimeView, SnapshotKeepsTheRuntimesNanosecondsExitCodeReasonAndMessage) {
  v1::ContainerStatus st;
  st.set_state(v1::CONTAINER_EXITED);
  st.set_created_at(1'700'000'000'123'456'789);
  st.set_started_at(1'700'000'001'000'000'001);
  st.set_finished_at(1'700'000'002'999'999'999);
  st.set_exit_code(137);
  st.set_reason("OOMKilled");
  st.set_message("memory limit");
  ContainerSnapshot s = from_status(st);
  EXPECT_EQ(s.state, CS::kExited);
  EXPECT_EQ(s.created_at_ns, 1'700'000'000'123'456'789);
  EXPECT_EQ(s.started_at_ns, 1'700'000'001'000'000'001);
  EXPECT_EQ(s.finished_at_ns, 1'700'000'002'999'999'999);
  EXPECT_EQ(s.exit_code, 137);
  EXPECT_EQ(s.reason, "OOMKilled");
  EXPECT_EQ(s.message, "memory limit");

  st.set_state(v1::CONTAINER_CREATED);
  EXPECT_EQ(from_status(st).state, CS::kCreated) << "a snapshot reports the runtime's own state";

  v1::PodSandboxStatus sb;
  sb.set_state(v1::SANDBOX_NOTREADY);
  sb.set_created_at(1'700'000'000'000'000'007);
  ContainerSnapshot ss = from_status(sb);
  EXPECT_EQ(ss.state, CS::kExited);
  EXPECT_EQ(ss.created_at_ns, 1'700'000'000'000'000'007);
  EXPECT_EQ(ss.exit_code, 0);
  EXPECT_TRUE(ss.reason.empty());
}

TEST(RuntimeView, PodIdentityFromLabelsElseSandboxMetadata) {
  auto labelled = pod_identity(sandbox("s1", "u1", v1::SANDBOX_READY));
  EXPECT_EQ(labelled.uid, "u1");
  EXPECT_EQ(labelled.name, "web-u1");
  EXPECT_EQ(labelled.namespace_, "prod");
  EXPECT_TRUE(labelled.labelled);

  auto bare = pod_identity(sandbox("s2", "u2", v1::SANDBOX_READY, /*labelled=*/false));
  EXPECT_EQ(bare.uid, "u2");
  EXPECT_EQ(bare.name, "meta-u2");
  EXPECT_EQ(bare.namespace_, "meta-ns");
  EXPECT_FALSE(bare.labelled);

  auto c = container("c1", "s1", "u1", "app", v1::CONTAINER_RUNNING);
  EXPECT_EQ(pod_identity(c, nullptr).uid, "u1");
  EXPECT_EQ(container_name(c), "app");

  auto unlabelled = container("c2", "s2", "", "app", v1::CONTAINER_RUNNING, /*labelled=*/false);
  auto from_sandbox = pod_identity(unlabelled, &bare);
  EXPECT_EQ(from_sandbox.uid, "u2");
  EXPECT_EQ(from_sandbox.name, "meta-u2");
  EXPECT_EQ(container_name(unlabelled), "meta-app");
  EXPECT_TRUE(pod_identity(unlabelled, nullptr).uid.empty());

  v1::ContainerStatus st;
  *st.mutable_labels() = c.labels();
  *st.mutable_metadata() = c.metadata();
  EXPECT_EQ(pod_identity(st, nullptr).uid, "u1");
  EXPECT_EQ(container_name(st), "app");
}

TEST(RuntimeView, SnapshotGroupsSandboxesAndContainersIntoPodsLikeGetPods) {
  std::vector<v1::PodSandbox> sandboxes = {
      sandbox("s1", "u1", v1::SANDBOX_READY),
      sandbox("s0", "u1", v1::SANDBOX_NOTREADY),  // an older sandbox of the same pod
      sandbox("s2", "u2", v1::SANDBOX_READY, /*labelled=*/false),
      sandbox("", "u9", v1::SANDBOX_READY),  // no id: skipped
  };
  auto no_metadata = container("c9", "s1", "u1", "x", v1::CONTAINER_RUNNING);
  no_metadata.clear_metadata();
  std::vector<v1::Container> containers = {
      container("c1", "s1", "u1", "app", v1::CONTAINER_RUNNING),
      container("c0", "s0", "u1", "app", v1::CONTAINER_EXITED),
      container("c2", "s2", "", "side", v1::CONTAINER_CREATED, /*labelled=*/false),
      container("c3", "gone", "u3", "orphan", v1::CONTAINER_EXITED),  // its sandbox is gone
      no_metadata,
  };
  RuntimeSnapshot snap = build_snapshot(sandboxes, containers);
  ASSERT_EQ(snap.pods.size(), 3u);
  EXPECT_EQ(snap.container_count(), 7u);

  const PodRecord& p1 = snap.pods.at("u1");
  EXPECT_EQ(p1.name, "web-u1");
  EXPECT_EQ(p1.namespace_, "prod");
  // Its sandboxes first, then its containers, each in list order.
  ASSERT_EQ(p1.containers.size(), 4u);
  EXPECT_EQ(p1.containers[0].id, "s1");
  EXPECT_TRUE(p1.containers[0].sandbox);
  EXPECT_EQ(p1.containers[0].state, CS::kRunning);
  EXPECT_TRUE(p1.containers[0].name.empty());
  EXPECT_EQ(p1.containers[1].id, "s0");
  EXPECT_EQ(p1.containers[1].state, CS::kExited);
  EXPECT_EQ(p1.containers[2].id, "c1");
  EXPECT_EQ(p1.containers[2].name, "app");
  EXPECT_EQ(p1.containers[2].status.created_at_ns, 1'700'000'000'500'000'000);
  EXPECT_FALSE(p1.containers[2].sandbox);
  EXPECT_EQ(p1.containers[3].id, "c0");
  EXPECT_EQ(pleg_state_of(p1, "c0"), CS::kExited);
  EXPECT_EQ(pleg_state_of(p1, "s0"), CS::kExited) << "sandboxes are containers of their pod";
  EXPECT_EQ(pleg_state_of(p1, "c9"), CS::kNonExistent);

  const PodRecord& p2 = snap.pods.at("u2");
  EXPECT_FALSE(p2.labelled);
  EXPECT_EQ(p2.name, "meta-u2");
  ASSERT_EQ(p2.containers.size(), 2u);
  EXPECT_EQ(p2.containers[1].state, CS::kCreated);
  EXPECT_EQ(pleg_state_of(p2, "c2"), CS::kUnknown);

  const PodRecord& p3 = snap.pods.at("u3");
  ASSERT_EQ(p3.containers.size(), 1u);
  EXPECT_FALSE(p3.containers[0].sandbox) << "a container whose sandbox is gone";
}

TEST(RuntimeView, ContainersOfOldAndNewPodInTheKubeletsOrderEachOnce) {
  auto old_snap = build_snapshot({sandbox("s1", "u", v1::SANDBOX_READY)},
                                 {container("a", "s1", "u", "a", v1::CONTAINER_RUNNING),
                                  container("b", "s1", "u", "b", v1::CONTAINER_RUNNING)});
  auto new_snap = build_snapshot({sandbox("s1", "u", v1::SANDBOX_READY)},
                                 {container("b", "s1", "u", "b", v1::CONTAINER_EXITED),
                                  container("c", "s1", "u", "c", v1::CONTAINER_RUNNING)});
  const PodRecord& o = old_snap.pods.at("u");
  const PodRecord& n = new_snap.pods.at("u");
  std::vector<std::string> ids;
  for (const auto* c : containers_of(&o, &n)) ids.push_back(c->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "s1", "c"}));
  ids.clear();
  for (const auto* c : containers_of(nullptr, &n)) ids.push_back(c->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"b", "c", "s1"}));
  EXPECT_TRUE(containers_of(nullptr, nullptr).empty());
}

// Every (old, new) pair of generic-PLEG states and the events generateEvents gives for it.
TEST(RuntimeView, GenerateEventsFollowsTheKubeletsTable) {
  PodRecord pod;
  pod.uid = "u";
  pod.name = "web";
  pod.namespace_ = "prod";
  ContainerRecord c;
  c.id = "cid";
  c.name = "app";

  const std::vector<std::tuple<CS, CS, std::vector<ET>>> table = {
      {CS::kNonExistent, CS::kRunning, {ET::kContainerStarted}},
      {CS::kUnknown, CS::kRunning, {ET::kContainerStarted}},
      {CS::kCreated, CS::kRunning, {ET::kContainerStarted}},
      {CS::kExited, CS::kRunning, {ET::kContainerStarted}},
      {CS::kNonExistent, CS::kExited, {ET::kContainerDied}},
      {CS::kRunning, CS::kExited, {ET::kContainerDied}},
      {CS::kUnknown, CS::kExited, {ET::kContainerDied}},
      {CS::kNonExistent, CS::kCreated, {ET::kContainerChanged}},
      {CS::kNonExistent, CS::kUnknown, {ET::kContainerChanged}},
      {CS::kRunning, CS::kUnknown, {ET::kContainerChanged}},
      {CS::kExited, CS::kNonExistent, {ET::kContainerRemoved}},
      {CS::kRunning, CS::kNonExistent, {ET::kContainerDied, ET::kContainerRemoved}},
      {CS::kUnknown, CS::kNonExistent, {ET::kContainerDied, ET::kContainerRemoved}},
      {CS::kCreated, CS::kNonExistent, {ET::kContainerDied, ET::kContainerRemoved}},
      {CS::kRunning, CS::kRunning, {}},
      {CS::kExited, CS::kExited, {}},
      {CS::kNonExistent, CS::kNonExistent, {}},
      {CS::kCreated, CS::kUnknown, {}},  // both "unknown" to the generic PLEG
      {CS::kUnknown, CS::kCreated, {}},
  };
  for (const auto& [from, to, want] : table) {
    auto events = generate_events(pod, c, from, to);
    EXPECT_EQ(types(events), want) << to_string(from) << " -> " << to_string(to);
    for (const auto& e : events) {
      EXPECT_EQ(e.pod_uid, "u");
      EXPECT_EQ(e.pod_name, "web");
      EXPECT_EQ(e.pod_namespace, "prod");
      EXPECT_EQ(e.container_id, "cid");
      EXPECT_EQ(e.container_name, "app");
      EXPECT_FALSE(e.sandbox);
    }
  }

  c.sandbox = true;
  auto sandbox_events = generate_events(pod, c, CS::kRunning, CS::kExited);
  ASSERT_EQ(sandbox_events.size(), 1u);
  EXPECT_TRUE(sandbox_events[0].sandbox);

  EXPECT_FALSE(is_sent(ET::kContainerChanged));
  EXPECT_TRUE(is_sent(ET::kContainerStarted));
  EXPECT_TRUE(is_sent(ET::kContainerDied));
  EXPECT_TRUE(is_sent(ET::kContainerRemoved));
}

}  // namespace
}  // namespace kpleg::pleg
