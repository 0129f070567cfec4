// The fake runtime other components' unit tests rely on: it must behave like the CRI of a real
// runtime where those tests look (state transitions, timestamps, filters, errors).
#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include "support/fake_cri_client.h"

namespace kpleg::cri {
namespace {

v1::PodSandboxConfig pod_config(const std::string& name, const std::string& ns) {
  v1::PodSandboxConfig c;
  c.mutable_metadata()->set_name(name);
  c.mutable_metadata()->set_namespace_(ns);
  c.mutable_metadata()->set_uid(name + "-uid");
  (*c.mutable_labels())["io.kubernetes.pod.namespace"] = ns;
  return c;
}

v1::ContainerConfig container_config(const std::string& name) {
  v1::ContainerConfig c;
  c.mutable_metadata()->set_name(name);
  (*c.mutable_labels())["io.kubernetes.container.name"] = name;
  return c;
}

TEST(FakeCriClient, ContainerLifecycleLikeARuntime) {
  FakeCriClient cri;
  auto pc = pod_config("a", "ns1");
  auto pod = cri.run_pod_sandbox(pc);
  ASSERT_TRUE(pod.ok());
  auto id = cri.create_container(*pod, container_config("app"), pc);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(cri.container_status(*id)->state(), v1::CONTAINER_CREATED);
  ASSERT_TRUE(cri.start_container(*id).ok());
  auto running = cri.container_status(*id);
  EXPECT_EQ(running->state(), v1::CONTAINER_RUNNING);
  EXPECT_GT(running->started_at(), running->created_at());
  EXPECT_FALSE(cri.start_container(*id).ok()) << "a running container cannot be started again";

  ASSERT_TRUE(cri.exit_container(*id, 3, "Error").ok());
  auto exited = cri.container_status(*id);
  EXPECT_EQ(exited->state(), v1::CONTAINER_EXITED);
  EXPECT_EQ(exited->exit_code(), 3);
  EXPECT_GT(exited->finished_at(), exited->started_at());

  ASSERT_TRUE(cri.remove_container(*id).ok());
  auto gone = cri.container_status(*id);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(cri.remove_container(*id).ok()) << "removal is idempotent";
  EXPECT_EQ(cri.call_stats().count(CriMethod::kContainerStatus, grpc::StatusCode::NOT_FOUND), 1u);
  EXPECT_EQ(cri.call_stats().count(CriMethod::kContainerStatus, grpc::StatusCode::OK), 3u);
}

TEST(FakeCriClient, StopPodKillsItsContainersAndRemovePodRemovesThem) {
  FakeCriClient cri;
  auto pc = pod_config("a", "ns1");
  auto pod = *cri.run_pod_sandbox(pc);
  auto id = *cri.create_container(pod, container_config("app"), pc);
  ASSERT_TRUE(cri.start_container(id).ok());
  ASSERT_TRUE(cri.stop_pod_sandbox(pod).ok());
  EXPECT_EQ(cri.pod_sandbox_status(pod)->state(), v1::SANDBOX_NOTREADY);
  EXPECT_EQ(cri.container_status(id)->state(), v1::CONTAINER_EXITED);
  EXPECT_EQ(cri.container_status(id)->exit_code(), 137);
  ASSERT_TRUE(cri.remove_pod_sandbox(pod).ok());
  EXPECT_TRUE(cri.list_containers({})->empty());
  EXPECT_TRUE(cri.list_pod_sandboxes({})->empty());
}

TEST(FakeCriClient, FiltersAreAndedLikeTheCris) {
  FakeCriClient cri;
  auto p1c = pod_config("a", "ns1"), p2c = pod_config("b", "ns2");
  auto p1 = *cri.run_pod_sandbox(p1c);
  auto p2 = *cri.run_pod_sandbox(p2c);
  auto c1 = *cri.create_container(p1, container_config("x"), p1c);
  auto c2 = *cri.create_container(p2, container_config("x"), p2c);
  ASSERT_TRUE(cri.start_container(c2).ok());

  v1::PodSandboxFilter pf;
  (*pf.mutable_label_selector())["io.kubernetes.pod.namespace"] = "ns2";
  auto pods = *cri.list_pod_sandboxes(pf);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id(), p2);

  v1::ContainerFilter cf;
  cf.mutable_state()->set_state(v1::CONTAINER_RUNNING);
  auto running = *cri.list_containers(cf);
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].id(), c2);

  v1::ContainerFilter by_pod;
  by_pod.set_pod_sandbox_id(p1);
  (*by_pod.mutable_label_selector())["io.kubernetes.container.name"] = "x";
  auto in_p1 = *cri.list_containers(by_pod);
  ASSERT_EQ(in_p1.size(), 1u);
  EXPECT_EQ(in_p1[0].id(), c1);
  EXPECT_EQ(in_p1[0].pod_sandbox_id(), p1);
}

TEST(FakeCriClient, InjectedFailuresAreReturnedAndCounted) {
  FakeCriClient cri;
  cri.fail_next(CriMethod::kListContainers, Error{grpc::StatusCode::DEADLINE_EXCEEDED, "slow"});
  auto first = cri.list_containers({});
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.error().code, grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(cri.list_containers({}).ok()) << "fail_next fails one call only";

  cri.fail_always(CriMethod::kVersion, Error{grpc::StatusCode::UNAVAILABLE, "down"});
  EXPECT_FALSE(cri.version().ok());
  EXPECT_FALSE(cri.version().ok());
  cri.fail_always(CriMethod::kVersion, std::nullopt);
  EXPECT_TRUE(cri.version().ok());
  EXPECT_EQ(cri.call_stats().count(CriMethod::kVersion, grpc::StatusCode::UNAVAILABLE), 2u);
  EXPECT_EQ(cri.calls(CriMethod::kVersion), 3u);
}

TEST(FakeCriClient, TimestampsComeFromTheInjectedClock) {
  FakeCriClient cri;
  int64_t now = 5'000;
  cri.set_clock([&] { return now; });
  auto pc = pod_config("a", "ns1");
  auto pod = *cri.run_pod_sandbox(pc);
  EXPECT_EQ(cri.pod_sandbox_status(pod)->created_at(), 5'000);
  auto id = *cri.create_container(pod, container_config("x"), pc);
  now = 7'000;
  ASSERT_TRUE(cri.start_container(id).ok());
  EXPECT_EQ(cri.container_status(id)->started_at(), 7'000);
}

}  // namespace
}  // namespace kpleg::cri
