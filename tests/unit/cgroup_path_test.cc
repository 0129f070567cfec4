#include "cgroup/cgroup_path.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kpleg::cgroup {
namespace {

const std::string kId = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kId2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const std::string kUid = "3f1c2b9e-7a44-4d0b-9c1e-5a6b7c8d9e0f";
const std::string kUidSystemd = "3f1c2b9e_7a44_4d0b_9c1e_5a6b7c8d9e0f";
// A static pod without metadata.uid: the kubelet uses the hex md5 of its manifest.
const std::string kStaticUid = "6a3b1f9c0d2e4f5a8b7c6d5e4f3a2b1c";

CgroupIdentity container(std::string uid, std::string id, Runtime runtime, QosClass qos) {
  return CgroupIdentity{std::move(uid), std::move(id), runtime, qos, Kind::kContainerOrSandbox};
}

CgroupIdentity pod(std::string uid, QosClass qos) {
  return CgroupIdentity{std::move(uid), "", Runtime::kUnknown, qos, Kind::kPod};
}

void expect_parses(const std::string& path, const CgroupIdentity& want) {
  SCOPED_TRACE(path);
  auto got = parse_cgroup_path(path);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->pod_uid, want.pod_uid);
  EXPECT_EQ(got->container_id, want.container_id);
  EXPECT_EQ(to_string(got->runtime), to_string(want.runtime));
  EXPECT_EQ(to_string(got->qos), to_string(want.qos));
  EXPECT_EQ(to_string(got->kind), to_string(want.kind));
}

// --- cgroupfs driver -----------------------------------------------------------------------

TEST(CgroupPathCgroupfs, BurstableAndBestEffortContainers) {
  expect_parses("/kubepods/burstable/pod" + kUid + "/" + kId,
                container(kUid, kId, Runtime::kUnknown, QosClass::kBurstable));
  expect_parses("/kubepods/besteffort/pod" + kUid + "/" + kId,
                container(kUid, kId, Runtime::kUnknown, QosClass::kBestEffort));
}

TEST(CgroupPathCgroupfs, GuaranteedPodSitsDirectlyUnderKubepods) {
  expect_parses("/kubepods/pod" + kUid + "/" + kId,
                container(kUid, kId, Runtime::kUnknown, QosClass::kGuaranteed));
  expect_parses("/kubepods/pod" + kUid, pod(kUid, QosClass::kGuaranteed));
}

TEST(CgroupPathCgroupfs, PodQosAndRootLevels) {
  expect_parses("/kubepods/burstable/pod" + kUid, pod(kUid, QosClass::kBurstable));
  expect_parses("/kubepods/besteffort/pod" + kUid, pod(kUid, QosClass::kBestEffort));
  expect_parses("/kubepods/burstable",
                CgroupIdentity{"", "", Runtime::kUnknown, QosClass::kBurstable, Kind::kQos});
  expect_parses("/kubepods/besteffort",
                CgroupIdentity{"", "", Runtime::kUnknown, QosClass::kBestEffort, Kind::kQos});
  expect_parses("/kubepods",
                CgroupIdentity{"", "", Runtime::kUnknown, QosClass::kUnknown, Kind::kRoot});
}

TEST(CgroupPathCgroupfs, CrioContainerAndIgnoredConmon) {
  expect_parses("/kubepods/burstable/pod" + kUid + "/crio-" + kId,
                container(kUid, kId, Runtime::kCrio, QosClass::kBurstable));
  expect_parses("/kubepods/burstable/pod" + kUid + "/crio-conmon-" + kId,
                CgroupIdentity{kUid, kId, Runtime::kCrio, QosClass::kBurstable, Kind::kIgnored});
}

TEST(CgroupPathCgroupfs, StaticPodHashUid) {
  expect_parses("/kubepods/burstable/pod" + kStaticUid + "/" + kId,
                container(kStaticUid, kId, Runtime::kUnknown, QosClass::kBurstable));
}

// --- systemd driver ------------------------------------------------------------------------

TEST(CgroupPathSystemd, ContainerdBurstableUnescapesUid) {
  expect_parses("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd +
                    ".slice/cri-containerd-" + kId + ".scope",
                container(kUid, kId, Runtime::kContainerd, QosClass::kBurstable));
}

TEST(CgroupPathSystemd, ContainerdBestEffortAndGuaranteed) {
  expect_parses("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kUidSystemd +
                    ".slice/cri-containerd-" + kId + ".scope",
                container(kUid, kId, Runtime::kContainerd, QosClass::kBestEffort));
  expect_parses(
      "/kubepods.slice/kubepods-pod" + kUidSystemd + ".slice/cri-containerd-" + kId + ".scope",
      container(kUid, kId, Runtime::kContainerd, QosClass::kGuaranteed));
}

TEST(CgroupPathSystemd, PodQosAndRootLevels) {
  expect_parses(
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd + ".slice",
      pod(kUid, QosClass::kBurstable));
  expect_parses("/kubepods.slice/kubepods-pod" + kUidSystemd + ".slice",
                pod(kUid, QosClass::kGuaranteed));
  expect_parses("/kubepods.slice/kubepods-besteffort.slice",
                CgroupIdentity{"", "", Runtime::kUnknown, QosClass::kBestEffort, Kind::kQos});
  expect_parses("/kubepods.slice",
                CgroupIdentity{"", "", Runtime::kUnknown, QosClass::kUnknown, Kind::kRoot});
}

TEST(CgroupPathSystemd, CrioScopeAndIgnoredConmonScope) {
  const std::string pod_slice =
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd + ".slice";
  expect_parses(pod_slice + "/crio-" + kId + ".scope",
                container(kUid, kId, Runtime::kCrio, QosClass::kBurstable));
  expect_parses(pod_slice + "/crio-conmon-" + kId + ".scope",
                CgroupIdentity{kUid, kId, Runtime::kCrio, QosClass::kBurstable, Kind::kIgnored});
}

TEST(CgroupPathSystemd, CriDockerdScope) {
  expect_parses("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kUidSystemd +
                    ".slice/docker-" + kId + ".scope",
                container(kUid, kId, Runtime::kDocker, QosClass::kBestEffort));
}

TEST(CgroupPathSystemd, StaticPodHashUid) {
  expect_parses("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kStaticUid +
                    ".slice/cri-containerd-" + kId + ".scope",
                container(kStaticUid, kId, Runtime::kContainerd, QosClass::kBurstable));
}

TEST(CgroupPathSystemd, CustomCgroupRootPrefixesEverySliceName) {
  // kubelet --cgroup-root=/kubelet (kind does this): systemd nests slices by name prefix.
  expect_parses(
      "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
      "kubelet-kubepods-burstable-pod" +
          kUidSystemd + ".slice/cri-containerd-" + kId + ".scope",
      container(kUid, kId, Runtime::kContainerd, QosClass::kBurstable));
  expect_parses(
      "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + kUidSystemd + ".slice",
      pod(kUid, QosClass::kGuaranteed));
}

// --- containerd without a systemd cgroup driver ----------------------------------------------

TEST(CgroupPathContainerd, NoCgroupParentUsesNamespaceDir) {
  expect_parses("/k8s.io/" + kId, container("", kId, Runtime::kContainerd, QosClass::kUnknown));
  expect_parses("/k8s.io",
                CgroupIdentity{"", "", Runtime::kContainerd, QosClass::kUnknown, Kind::kRoot});
}

TEST(CgroupPathContainerd, SystemdParentWithCgroupfsDriverIsOneDirectory) {
  expect_parses("/kubepods-burstable-pod" + kUidSystemd + ".slice:cri-containerd:" + kId,
                container(kUid, kId, Runtime::kContainerd, QosClass::kBurstable));
  expect_parses("/kubepods-besteffort-pod" + kUidSystemd + ".slice:cri-containerd:" + kId,
                container(kUid, kId, Runtime::kContainerd, QosClass::kBestEffort));
  expect_parses("/kubepods-pod" + kUidSystemd + ".slice:cri-containerd:" + kId,
                container(kUid, kId, Runtime::kContainerd, QosClass::kGuaranteed));
  // runc joins a relative cgroupsPath to containerd's own cgroup.
  expect_parses("/system.slice/containerd.service/kubepods-burstable-pod" + kUidSystemd +
                    ".slice:cri-containerd:" + kId,
                container(kUid, kId, Runtime::kContainerd, QosClass::kBurstable));
  expect_parses("/kubelet-kubepods-besteffort-pod" + kUidSystemd + ".slice:cri-containerd:" + kId,
                container(kUid, kId, Runtime::kContainerd, QosClass::kBestEffort));
}

// --- nesting -------------------------------------------------------------------------------

TEST(CgroupPathNesting, KubepodsRootAtAnyDepth) {
  const auto want = container(kUid, kId, Runtime::kUnknown, QosClass::kBurstable);
  const std::string tail = "/kubepods/burstable/pod" + kUid + "/" + kId;
  expect_parses("/kubelet" + tail, want);  // cgroupfs with --cgroup-root=/kubelet
  expect_parses("/system.slice/docker-" + kId2 + ".scope" + tail, want);  // kind node
  expect_parses("/something" + tail, want);
  expect_parses("/a/b/c/d/e" + tail, want);
}

TEST(CgroupPathNesting, PrefixDoesNotChangeTheIdentity) {
  const std::vector<std::string> paths = {
      "/kubepods/pod" + kUid + "/" + kId,
      "/kubepods.slice/kubepods-pod" + kUidSystemd + ".slice/crio-" + kId + ".scope",
      "/k8s.io/" + kId,
      "/kubepods-pod" + kUidSystemd + ".slice:cri-containerd:" + kId,
  };
  for (const auto& path : paths) {
    SCOPED_TRACE(path);
    auto plain = parse_cgroup_path(path);
    auto nested = parse_cgroup_path("/outer.slice/node" + path);
    ASSERT_TRUE(plain.has_value());
    ASSERT_TRUE(nested.has_value());
    EXPECT_EQ(*plain, *nested);
  }
}

TEST(CgroupPathNesting, KubepodsInsideAPodIsRejected) {
  // A node running inside a pod's container: the first kubepods root decides, and what follows
  // it is not a valid layout, so the inner pod is not attributed.
  const std::string outer = "/kubepods/burstable/pod" + kUid + "/" + kId;
  const std::string uid2 = "11111111-2222-4333-8444-555555555555";
  EXPECT_FALSE(parse_cgroup_path(outer + "/kubepods/besteffort/pod" + uid2 + "/" + kId2));
  EXPECT_FALSE(parse_cgroup_path(outer + "/kubepods"));
  EXPECT_FALSE(parse_cgroup_path("/kubepods/burstable/pod" + kUid + "/kubepods/burstable/pod" +
                                 uid2 + "/" + kId2));
  EXPECT_FALSE(parse_cgroup_path("/kubepods/kubepods/burstable/pod" + kUid + "/" + kId));
  EXPECT_FALSE(parse_cgroup_path("/kubepods.slice/kubepods/burstable/pod" + kUid + "/" + kId));
  EXPECT_FALSE(parse_cgroup_path("/k8s.io/" + kId + "/kubepods/burstable/pod" + kUid + "/" + kId));
}

// --- hostile input -------------------------------------------------------------------------

struct HostileCase {
  std::string why;
  std::string path;
};

std::vector<HostileCase> hostile_cases() {
  const std::string fs_pod = "/kubepods/burstable/pod" + kUid;
  const std::string sd_pod =
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd + ".slice";
  std::string upper_id = kId;
  upper_id[10] = 'A';
  std::string non_hex_id = kId;
  non_hex_id[63] = 'g';
  std::string upper_uid = kUid;
  upper_uid[0] = 'F';
  std::string dashless_uid = kUid;  // still 36 chars, separators replaced by hex
  for (std::size_t pos : {8, 13, 18, 23}) dashless_uid[pos] = 'a';
  std::string shifted_uid = kUid;  // dash moved one to the right
  std::swap(shifted_uid[8], shifted_uid[9]);
  std::string mixed_uid_systemd = kUidSystemd;
  mixed_uid_systemd[13] = '-';
  std::string upper_static = kStaticUid;
  upper_static[0] = 'A';
  return {
      {"empty", ""},
      {"root", "/"},
      {"relative", "kubepods/burstable/pod" + kUid + "/" + kId},
      {"no root marker", "/burstable/pod" + kUid + "/" + kId},
      {"unrelated tree", "/system.slice/containerd.service"},
      {"trailing slash", fs_pod + "/" + kId + "/"},
      {"doubled slash", "/kubepods//burstable/pod" + kUid + "/" + kId},
      {"doubled leading slash", "//kubepods/burstable/pod" + kUid + "/" + kId},
      {"dot-dot", "/kubepods/burstable/../burstable/pod" + kUid + "/" + kId},
      {"dot-dot in prefix", "/x/../kubepods/burstable/pod" + kUid + "/" + kId},
      {"dot", "/kubepods/./burstable/pod" + kUid + "/" + kId},
      {"NUL byte", fs_pod + "/" + kId + std::string(1, '\0')},
      {"NUL in prefix", std::string("/a\0b", 4) + fs_pod + "/" + kId},
      {"newline after id", fs_pod + "/" + kId + "\n"},
      {"id 63 chars", fs_pod + "/" + kId.substr(1)},
      {"id 65 chars", fs_pod + "/" + kId + "0"},
      {"uppercase id", fs_pod + "/" + upper_id},
      {"non-hex id", fs_pod + "/" + non_hex_id},
      {"uppercase id in scope", sd_pod + "/cri-containerd-" + upper_id + ".scope"},
      {"63-char id in scope", sd_pod + "/cri-containerd-" + kId.substr(1) + ".scope"},
      {"65-char id in scope", sd_pod + "/cri-containerd-" + kId + "0.scope"},
      {"uppercase id in k8s.io", "/k8s.io/" + upper_id},
      {"uid without dashes", "/kubepods/burstable/pod" + dashless_uid + "/" + kId},
      {"uid with dash moved", "/kubepods/burstable/pod" + shifted_uid + "/" + kId},
      {"uppercase uid", "/kubepods/burstable/pod" + upper_uid + "/" + kId},
      {"uppercase static uid", "/kubepods/burstable/pod" + upper_static + "/" + kId},
      {"uid 35 chars", "/kubepods/burstable/pod" + kUid.substr(1) + "/" + kId},
      {"uid 37 chars", "/kubepods/burstable/pod" + kUid + "0/" + kId},
      {"empty uid", "/kubepods/burstable/pod/" + kId},
      {"underscored uid in cgroupfs", "/kubepods/burstable/pod" + kUidSystemd + "/" + kId},
      {"dashed uid in systemd slice",
       "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUid +
           ".slice/cri-containerd-" + kId + ".scope"},
      {"mixed separators in systemd uid", "/kubepods.slice/kubepods-pod" + mixed_uid_systemd +
                                              ".slice/cri-containerd-" + kId + ".scope"},
      {"no pod prefix", "/kubepods/burstable/" + kUid + "/" + kId},
      {"unknown qos", "/kubepods/guaranteed/pod" + kUid + "/" + kId},
      {"qos twice", "/kubepods/burstable/burstable/pod" + kUid + "/" + kId},
      {"junk after container", fs_pod + "/" + kId + "/sub"},
      {"junk after scope", sd_pod + "/cri-containerd-" + kId + ".scope/init"},
      {"junk appended to scope", sd_pod + "/cri-containerd-" + kId + ".scope.bak"},
      {"junk appended to id", fs_pod + "/" + kId + "x"},
      {"scope without suffix", sd_pod + "/cri-containerd-" + kId},
      {"unknown scope prefix", sd_pod + "/runc-" + kId + ".scope"},
      {"bare id under systemd pod", sd_pod + "/" + kId},
      {"scope under cgroupfs pod", fs_pod + "/cri-containerd-" + kId + ".scope"},
      {"docker prefix under cgroupfs pod", fs_pod + "/docker-" + kId},
      {"conmon with short id", fs_pod + "/crio-conmon-" + kId.substr(2)},
      {"systemd qos mismatch", "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod" +
                                   kUidSystemd + ".slice/cri-containerd-" + kId + ".scope"},
      {"systemd stem mismatch",
       "/kubelet-kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSystemd +
           ".slice"},
      {"systemd guaranteed pod under qos slice",
       "/kubepods.slice/kubepods-burstable.slice/kubepods-pod" + kUidSystemd + ".slice"},
      {"systemd pod without slice suffix",
       "/kubepods.slice/kubepods-pod" + kUidSystemd + "/cri-containerd-" + kId + ".scope"},
      {"systemd root with empty stem prefix",
       "/-kubepods.slice/-kubepods-pod" + kUidSystemd + ".slice/cri-containerd-" + kId + ".scope"},
      {"cgroupfs names under systemd root", "/kubepods.slice/burstable/pod" + kUid + "/" + kId},
      {"k8s.io junk", "/k8s.io/" + kId + "/x"},
      {"k8s.io with pod level", "/k8s.io/pod" + kUid + "/" + kId},
      {"colon form with a child",
       "/kubepods-burstable-pod" + kUidSystemd + ".slice:cri-containerd:" + kId + "/x"},
      {"colon form without kubepods", "/system-pod" + kUidSystemd + ".slice:cri-containerd:" + kId},
      {"colon form with bad id",
       "/kubepods-pod" + kUidSystemd + ".slice:cri-containerd:" + upper_id},
      {"colon form with junk",
       "/kubepods-pod" + kUidSystemd + ".slice:cri-containerd:" + kId + ":x"},
      {"colon form without slice suffix", "/kubepods-pod" + kUidSystemd + ":cri-containerd:" + kId},
      {"colon form with unknown qos",
       "/kubepods-guaranteed-pod" + kUidSystemd + ".slice:cri-containerd:" + kId},
      {"colon form with dashed uid", "/kubepods-pod" + kUid + ".slice:cri-containerd:" + kId},
  };
}

TEST(CgroupPathHostile, EveryMalformedPathIsRejected) {
  for (const auto& c : hostile_cases()) {
    EXPECT_FALSE(parse_cgroup_path(c.path).has_value()) << c.why << ": " << c.path;
  }
}

TEST(CgroupPathHostile, OverlongPathIsRejectedAtTheLimitNotBefore) {
  const std::string tail = "/kubepods/burstable/pod" + kUid + "/" + kId;
  // Pad with a prefix component so the path stays well formed apart from its length.
  std::string at_limit = "/" + std::string(kMaxCgroupPathLength - tail.size() - 1, 'p') + tail;
  ASSERT_EQ(at_limit.size(), kMaxCgroupPathLength);
  EXPECT_TRUE(parse_cgroup_path(at_limit).has_value());
  std::string over = "/p" + at_limit.substr(1);
  ASSERT_EQ(over.size(), kMaxCgroupPathLength + 1);
  EXPECT_FALSE(parse_cgroup_path(over).has_value());
  EXPECT_FALSE(parse_cgroup_path(std::string(1 << 20, '/')).has_value());
}

// --- may_contain_pod_cgroups (drives the tree walk) ------------------------------------------

TEST(CgroupPathWalkPruning, DescendsOnlyWhereSomethingCanStillParse) {
  EXPECT_TRUE(may_contain_pod_cgroups("/"));
  EXPECT_TRUE(may_contain_pod_cgroups("/system.slice"));
  EXPECT_TRUE(may_contain_pod_cgroups("/kubepods"));
  EXPECT_TRUE(may_contain_pod_cgroups("/kubepods/burstable"));
  EXPECT_TRUE(may_contain_pod_cgroups("/kubepods/burstable/pod" + kUid));
  EXPECT_TRUE(may_contain_pod_cgroups("/kubepods.slice/kubepods-pod" + kUidSystemd + ".slice"));
  EXPECT_TRUE(may_contain_pod_cgroups("/k8s.io"));

  EXPECT_FALSE(may_contain_pod_cgroups("/kubepods/burstable/pod" + kUid + "/" + kId));
  EXPECT_FALSE(may_contain_pod_cgroups("/kubepods/burstable/pod" + kUid + "/crio-conmon-" + kId));
  EXPECT_FALSE(may_contain_pod_cgroups("/kubepods/unrelated"));
  EXPECT_FALSE(may_contain_pod_cgroups("/k8s.io/" + kId));
  EXPECT_FALSE(
      may_contain_pod_cgroups("/kubepods-pod" + kUidSystemd + ".slice:cri-containerd:" + kId));
  EXPECT_FALSE(may_contain_pod_cgroups(""));
  EXPECT_FALSE(may_contain_pod_cgroups("/a//b"));
}

TEST(CgroupPathWalkPruning, AgreesWithTheParserOnEveryExtensionWeTry) {
  // If may_contain_pod_cgroups(p) is false, no child of p may parse: the walk would miss it.
  std::vector<std::string> parents = {"/kubepods/burstable/pod" + kUid + "/" + kId,
                                      "/kubepods/unrelated", "/k8s.io/" + kId,
                                      "/kubepods/burstable/pod" + kUid + "/crio-conmon-" + kId};
  for (const auto& c : hostile_cases()) parents.push_back(c.path);
  const std::vector<std::string> children = {kId,
                                             "pod" + kUid,
                                             "burstable",
                                             "kubepods",
                                             "kubepods.slice",
                                             "k8s.io",
                                             "cri-containerd-" + kId + ".scope"};
  for (const auto& parent : parents) {
    // "" + "/kubepods" is not a child of anything; only absolute parents have children.
    if (!parent.starts_with('/') || may_contain_pod_cgroups(parent)) continue;
    for (const auto& child : children) {
      EXPECT_FALSE(parse_cgroup_path(parent + "/" + child).has_value()) << parent << " + " << child;
    }
  }
}

}  // namespace
}  // namespace kpleg::cgroup
