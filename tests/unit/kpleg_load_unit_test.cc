// kpleg-load's kubelet-shaped configs and its command splitting.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "kpleg-load/kubelet_pod.h"

namespace kpleg::load {
namespace {

TEST(KubeletPod, CgroupParentPerQosClass) {
  const std::string uid = "0f4c9bd2-9f55-4b34-9a3c-3e5f4e0e8d11";
  EXPECT_EQ(pod_cgroup_parent(QosClass::kGuaranteed, uid), "/kubepods/pod" + uid);
  EXPECT_EQ(pod_cgroup_parent(QosClass::kBurstable, uid), "/kubepods/burstable/pod" + uid);
  EXPECT_EQ(pod_cgroup_parent(QosClass::kBestEffort, uid), "/kubepods/besteffort/pod" + uid);
}

TEST(KubeletPod, ParsesQosClassNames) {
  EXPECT_EQ(*parse_qos_class("Guaranteed"), QosClass::kGuaranteed);
  EXPECT_EQ(*parse_qos_class("burstable"), QosClass::kBurstable);
  EXPECT_EQ(*parse_qos_class("BestEffort"), QosClass::kBestEffort);
  auto bad = parse_qos_class("gold");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("gold"), std::string::npos);
}

TEST(KubeletPod, PodUidsAreDistinctVersion4Uuids) {
  const std::regex uuid4("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto uid = new_pod_uid();
    EXPECT_TRUE(std::regex_match(uid, uuid4)) << uid;
    seen.insert(uid);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SplitCommand, SplitsLikeAShell) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*split_command("sleep 1000"), (V{"sleep", "1000"}));
  EXPECT_EQ(*split_command("  sh   -c 'echo a  b; exit 3' "), (V{"sh", "-c", "echo a  b; exit 3"}));
  EXPECT_EQ(*split_command(R"(sh -c "echo \"x\" \$HOME")"), (V{"sh", "-c", R"(echo "x" $HOME)"}));
  EXPECT_EQ(*split_command(R"(a\ b c'd'"e")"), (V{"a b", "cde"}));
  EXPECT_EQ(*split_command("x ''"), (V{"x", ""}));
}

TEST(SplitCommand, RejectsUnbalancedQuotesAndEmptyCommands) {
  EXPECT_FALSE(split_command("sh -c 'oops").ok());
  EXPECT_FALSE(split_command("sh -c \"oops").ok());
  EXPECT_FALSE(split_command("trailing\\").ok());
  EXPECT_FALSE(split_command("   ").ok());
}

PodSpec test_pod() {
  PodSpec p;
  p.name = "web-0";
  p.namespace_ = "shop";
  p.uid = "0f4c9bd2-9f55-4b34-9a3c-3e5f4e0e8d11";
  p.qos = QosClass::kBurstable;
  p.log_directory = pod_log_directory("/tmp/logs", p);
  return p;
}

TEST(KubeletPod, SandboxConfigCarriesTheKubeletsMetadataLabelsAndCgroupParent) {
  auto pod = test_pod();
  EXPECT_EQ(pod.log_directory, "/tmp/logs/shop_web-0_0f4c9bd2-9f55-4b34-9a3c-3e5f4e0e8d11");
  auto c = sandbox_config(pod);
  EXPECT_EQ(c.metadata().name(), "web-0");
  EXPECT_EQ(c.metadata().namespace_(), "shop");
  EXPECT_EQ(c.metadata().uid(), pod.uid);
  EXPECT_EQ(c.metadata().attempt(), 0u);
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.name"), "web-0");
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.namespace"), "shop");
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.uid"), pod.uid);
  EXPECT_EQ(c.labels().at("kpleg.io/load"), "true");
  EXPECT_EQ(c.annotations().at("kubernetes.io/config.source"), "api");
  EXPECT_EQ(c.annotations().at("kpleg.io/log-directory"), pod.log_directory);
  EXPECT_EQ(c.log_directory(), pod.log_directory);
  EXPECT_EQ(c.linux().cgroup_parent(), "/kubepods/burstable/pod" + pod.uid);
  EXPECT_EQ(c.linux().security_context().namespace_options().network(), runtime::v1::NODE);
  EXPECT_EQ(c.linux().security_context().namespace_options().pid(), runtime::v1::CONTAINER);
  EXPECT_TRUE(c.hostname().empty());

  pod.host_network = false;
  auto pod_net = sandbox_config(pod);
  EXPECT_EQ(pod_net.linux().security_context().namespace_options().network(), runtime::v1::POD);
  EXPECT_EQ(pod_net.hostname(), "web-0");
}

TEST(KubeletPod, ContainerConfigCarriesTheKubeletsLabelsAnnotationsAndLimits) {
  auto pod = test_pod();
  ContainerSpec spec;
  spec.name = "app";
  spec.attempt = 3;
  spec.command = {"sh", "-c", "exit 0"};
  spec.memory_limit_bytes = 64 << 20;
  auto c = container_config(pod, spec);
  EXPECT_EQ(c.metadata().name(), "app");
  EXPECT_EQ(c.metadata().attempt(), 3u);
  EXPECT_EQ(c.image().image(), "localhost/kpleg/busybox:1");
  ASSERT_EQ(c.command_size(), 3);
  EXPECT_EQ(c.command(2), "exit 0");
  EXPECT_EQ(c.log_path(), "app/3.log");
  EXPECT_EQ(c.labels().at("io.kubernetes.container.name"), "app");
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.uid"), pod.uid);
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.name"), "web-0");
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.namespace"), "shop");
  EXPECT_EQ(c.annotations().at("io.kubernetes.container.restartCount"), "3");
  EXPECT_EQ(c.annotations().at("io.kubernetes.container.terminationMessagePolicy"), "File");
  EXPECT_FALSE(c.annotations().at("io.kubernetes.container.hash").empty());
  EXPECT_EQ(c.linux().resources().memory_limit_in_bytes(), 64 << 20);
  EXPECT_EQ(c.linux().resources().oom_score_adj(), 999);

  spec.memory_limit_bytes = 0;
  EXPECT_EQ(container_config(pod, spec).linux().resources().memory_limit_in_bytes(), 0);
}

}  // namespace
}  // namespace kpleg::load
