// The selective decoder of GetContainerEvents messages says what the generated parser says, for
// every field kpleg reads: observation_of() of both is the same for each kind of event, with
// fields in any order, unknown fields anywhere, and the container among others of its pod.
// Malformed input is refused exactly where the generated parser refuses it.
#include <gtest/gtest.h>

#include <random>

#include "cri/event_decoder.h"
#include "pleg/runtime_looks.h"

namespace kpleg::cri {
namespace {

namespace v1 = ::runtime::v1;

v1::PodSandboxStatus sandbox(const std::string& id) {
  v1::PodSandboxStatus s;
  s.set_id(id);
  s.mutable_metadata()->set_name("web-0");
  s.mutable_metadata()->set_uid("3f1c9a2e-0000-4000-8000-000000000001");
  s.mutable_metadata()->set_namespace_("shop");
  s.mutable_metadata()->set_attempt(2);
  s.set_state(v1::SANDBOX_NOTREADY);
  s.set_created_at(1'700'000'000'000'000'001);
  s.mutable_network()->set_ip("10.0.0.7");
  s.mutable_network()->add_additional_ips()->set_ip("fd00::7");
  (*s.mutable_labels())["io.kubernetes.pod.name"] = "web-0";
  (*s.mutable_labels())["io.kubernetes.pod.namespace"] = "shop";
  (*s.mutable_labels())["io.kubernetes.pod.uid"] = "3f1c9a2e-0000-4000-8000-000000000001";
  (*s.mutable_annotations())["kubernetes.io/config.seen"] = "2026-11-24T03:00:00Z";
  s.set_runtime_handler("runc");
  return s;
}

v1::ContainerStatus container(const std::string& id, const std::string& name, int exit_code) {
  v1::ContainerStatus c;
  c.set_id(id);
  c.mutable_metadata()->set_name(name);
  c.mutable_metadata()->set_attempt(3);
  c.set_state(v1::CONTAINER_EXITED);
  c.set_created_at(1'700'000'000'100'000'000);
  c.set_started_at(1'700'000'000'200'000'000);
  c.set_finished_at(1'700'000'000'300'000'000);
  c.set_exit_code(exit_code);
  c.mutable_image()->set_image("localhost/kpleg/busybox:1");
  c.set_image_ref("sha256:abc");
  c.set_reason(exit_code == 137 ? "OOMKilled" : "Error");
  c.set_message("it ended");
  (*c.mutable_labels())["io.kubernetes.container.name"] = name;
  (*c.mutable_labels())["io.kubernetes.pod.name"] = "web-0";
  (*c.mutable_labels())["io.kubernetes.pod.namespace"] = "shop";
  (*c.mutable_labels())["io.kubernetes.pod.uid"] = "3f1c9a2e-0000-4000-8000-000000000001";
  (*c.mutable_annotations())["io.kubernetes.container.restartCount"] = "3";
  auto* m = c.add_mounts();
  m->set_container_path("/data");
  m->set_host_path("/var/lib/data");
  c.set_log_path("/var/log/pods/x.log");
  return c;
}

v1::ContainerEventResponse event(v1::ContainerEventType type, const std::string& id) {
  v1::ContainerEventResponse ev;
  ev.set_container_id(id);
  ev.set_container_event_type(type);
  ev.set_created_at(1'700'000'000'400'000'000);
  *ev.mutable_pod_sandbox_status() = sandbox("sb1");
  *ev.add_containers_statuses() = container("c0", "init", 0);
  *ev.add_containers_statuses() = container("c1", "app", 137);
  *ev.add_containers_statuses() = container("c2", "sidecar", -1);
  return ev;
}

void expect_same_observation(const v1::ContainerEventResponse& full, std::string_view wire) {
  v1::ContainerEventResponse decoded;
  ASSERT_TRUE(decode_container_event(wire, decoded));
  auto a = pleg::observation_of(full);
  auto b = pleg::observation_of(decoded);
  ASSERT_EQ(a.has_value(), b.has_value()) << full.ShortDebugString();
  if (!a) return;
  const auto& x = *a;
  const auto& y = *b;
  EXPECT_EQ(x.id, y.id);
  EXPECT_EQ(x.state, y.state);
  EXPECT_EQ(x.sandbox, y.sandbox);
  EXPECT_EQ(x.pod.uid, y.pod.uid);
  EXPECT_EQ(x.pod.name, y.pod.name);
  EXPECT_EQ(x.pod.namespace_, y.pod.namespace_);
  EXPECT_EQ(x.name, y.name);
  EXPECT_EQ(x.snapshot.state, y.snapshot.state);
  EXPECT_EQ(x.snapshot.created_at_ns, y.snapshot.created_at_ns);
  EXPECT_EQ(x.snapshot.started_at_ns, y.snapshot.started_at_ns);
  EXPECT_EQ(x.snapshot.finished_at_ns, y.snapshot.finished_at_ns);
  EXPECT_EQ(x.snapshot.exit_code, y.snapshot.exit_code);
  EXPECT_EQ(x.snapshot.reason, y.snapshot.reason);
  EXPECT_EQ(x.snapshot.message, y.snapshot.message);
  // When the runtime sent it: what the learned lags count to (Confirmer::learn_from_report).
  EXPECT_EQ(x.reported_at_ns, full.created_at());
  EXPECT_EQ(y.reported_at_ns, full.created_at());
}

TEST(EventDecoderTest, EveryKindOfEventSaysWhatTheGeneratedParserSays) {
  for (auto type : {v1::CONTAINER_CREATED_EVENT, v1::CONTAINER_STARTED_EVENT,
                    v1::CONTAINER_STOPPED_EVENT, v1::CONTAINER_DELETED_EVENT}) {
    for (const char* id : {"c0", "c1", "c2", "sb1", "unknown"}) {
      SCOPED_TRACE(std::string(id) + " " + v1::ContainerEventType_Name(type));
      auto full = event(type, id);
      expect_same_observation(full, full.SerializeAsString());
    }
  }
}

TEST(EventDecoderTest, OnlyTheNamedContainersStatusIsKeptWithTheFieldsKplegReads) {
  auto full = event(v1::CONTAINER_STOPPED_EVENT, "c1");
  v1::ContainerEventResponse d;
  ASSERT_TRUE(decode_container_event(full.SerializeAsString(), d));
  EXPECT_EQ(d.container_id(), "c1");
  EXPECT_EQ(d.created_at(), full.created_at());
  ASSERT_EQ(d.containers_statuses_size(), 1);
  const auto& c = d.containers_statuses(0);
  EXPECT_EQ(c.id(), "c1");
  EXPECT_EQ(c.exit_code(), 137);
  EXPECT_EQ(c.metadata().attempt(), 3u);
  EXPECT_EQ(c.labels().size(), 4u);
  EXPECT_TRUE(c.annotations().empty());
  EXPECT_EQ(c.mounts_size(), 0);
  EXPECT_FALSE(c.has_image());
  EXPECT_EQ(d.pod_sandbox_status().metadata().uid(), full.pod_sandbox_status().metadata().uid());
  EXPECT_EQ(d.pod_sandbox_status().state(), v1::SANDBOX_NOTREADY);
  EXPECT_FALSE(d.pod_sandbox_status().has_network());
  // A negative exit code (a varint of ten bytes) survives.
  ASSERT_TRUE(decode_container_event(event(v1::CONTAINER_STOPPED_EVENT, "c2").SerializeAsString(), d));
  EXPECT_EQ(d.containers_statuses(0).exit_code(), -1);
}

TEST(EventDecoderTest, FieldsInAnyOrderAndUnknownFieldsAnywhere) {
  auto full = event(v1::CONTAINER_STOPPED_EVENT, "c1");
  // Concatenated messages merge: the statuses first, the id and type after them.
  v1::ContainerEventResponse statuses_only = full;
  statuses_only.clear_container_id();
  statuses_only.clear_container_event_type();
  v1::ContainerEventResponse head;
  head.set_container_id("c1");
  head.set_container_event_type(v1::CONTAINER_STOPPED_EVENT);
  // Unknown fields: 99 (bytes) at the top, and 98 (varint) inside the container's status.
  const std::string unknown_top = std::string("\x9a\x06\x03", 3) + "abc";
  std::string status = full.containers_statuses(1).SerializeAsString() + std::string("\x90\x06\x07", 3);
  // Field 5, length-delimited, with its length as a varint.
  std::string len;
  for (size_t n = status.size(); ; n >>= 7) {
    if (n < 0x80) { len.push_back(char(n)); break; }
    len.push_back(char(0x80 | (n & 0x7f)));
  }
  const std::string extra_status = std::string("\x2a", 1) + len + status;
  statuses_only.mutable_containers_statuses()->DeleteSubrange(1, 1);
  const std::string wire =
      statuses_only.SerializeAsString() + unknown_top + extra_status + head.SerializeAsString();
  v1::ContainerEventResponse reference;
  ASSERT_TRUE(reference.ParseFromString(wire));
  expect_same_observation(reference, wire);
  v1::ContainerEventResponse d;
  ASSERT_TRUE(decode_container_event(wire, d));
  ASSERT_EQ(d.containers_statuses_size(), 1);
  EXPECT_EQ(d.containers_statuses(0).exit_code(), 137);
}

TEST(EventDecoderTest, MalformedInputIsRefusedWhereTheGeneratedParserRefusesIt) {
  const std::string wire = event(v1::CONTAINER_STOPPED_EVENT, "c1").SerializeAsString();
  v1::ContainerEventResponse d, reference;
  for (size_t cut = 0; cut < wire.size(); ++cut) {
    const std::string_view prefix(wire.data(), cut);
    EXPECT_EQ(decode_container_event(prefix, d), reference.ParseFromArray(prefix.data(), int(cut)))
        << "cut at " << cut;
  }
  // Random bytes: refused or decoded, never a crash or a read past the end.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 300, '\0');
    for (auto& ch : junk) ch = char(rng());
    (void)decode_container_event(junk, d);
  }
}

// The removal sweep reads only the ids of a full list: the same ids, in the same order, as the
// generated parser's, from a list with everything a kubelet's containers carry; a truncated
// answer is refused.
TEST(ListedIdsTest, TheIdsOfAFullListInItsOrder) {
  v1::ListContainersResponse containers;
  for (int i = 0; i < 50; ++i) {
    auto* c = containers.add_containers();
    c->set_id("c" + std::to_string(i));
    c->set_pod_sandbox_id("s" + std::to_string(i / 5));
    c->mutable_metadata()->set_name("app");
    c->mutable_image()->set_image("registry.local/app:1");
    c->set_state(i % 2 ? v1::CONTAINER_EXITED : v1::CONTAINER_RUNNING);
    c->set_created_at(1'700'000'000'000'000'000 + i);
    (*c->mutable_labels())["io.kubernetes.pod.uid"] = "uid";
    (*c->mutable_annotations())["io.kubernetes.container.hash"] = "abc";
  }
  std::vector<std::string> ids;
  ASSERT_TRUE(decode_listed_ids(containers.SerializeAsString(), ids));
  ASSERT_EQ(ids.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ids[size_t(i)], containers.containers(i).id());

  v1::ListPodSandboxResponse sandboxes;
  sandboxes.add_items()->set_id("s0");
  sandboxes.add_items()->set_id("s1");
  ASSERT_TRUE(decode_listed_ids(sandboxes.SerializeAsString(), ids));
  EXPECT_EQ(ids, (std::vector<std::string>{"s0", "s1"}));

  ASSERT_TRUE(decode_listed_ids("", ids));
  EXPECT_TRUE(ids.empty()) << "an empty list";
  const std::string wire = containers.SerializeAsString();
  EXPECT_FALSE(decode_listed_ids(std::string_view(wire.data(), wire.size() - 3), ids));
}

}  // namespace
}  // namespace kpleg::cri
