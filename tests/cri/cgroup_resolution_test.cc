// The cgroup2 id of every container the runtime starts (the inode of its cgroup2 directory,
// what BPF reports) resolves through CgroupIndex to the right pod uid and container id, for
// each QoS class's cgroup parent.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "cgroup/cgroup2_mount.h"
#include "cgroup/cgroup_index.h"
#include "cri/testbed.h"

namespace kpleg::testing {
namespace {

using json = nlohmann::json;

using CgroupResolution = CriTestBedTest;

TEST_F(CgroupResolution, EveryContainerAndSandboxResolvesToItsPod) {
  auto mount = cgroup::find_cgroup2_mount();
  KPLEG_REQUIRE_OR_SKIP(mount.ok(),
                        "no cgroup2 hierarchy: " + (mount.ok() ? "" : mount.error().message));

  struct Case {
    const char* qos;
    cgroup::QosClass expected;
  };
  std::vector<json> pods;
  for (Case c : {Case{"guaranteed", cgroup::QosClass::kGuaranteed},
                 Case{"burstable", cgroup::QosClass::kBurstable},
                 Case{"besteffort", cgroup::QosClass::kBestEffort}}) {
    auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "2", "--qos", c.qos,
                               "--namespace", namespace_, "--name-prefix", c.qos});
    ASSERT_TRUE(run.ok()) << run.error().message;
    ASSERT_EQ(run->exit_code, 0) << run->err;
    auto pod = json::parse(lines_of(run->out).at(0));
    pod["expected_qos"] = static_cast<int>(c.expected);
    pods.push_back(pod);
  }

  cgroup::CgroupIndex index;
  ASSERT_TRUE(index.seed(*mount).ok());

  for (const auto& pod : pods) {
    const std::string uid = pod["pod_uid"];
    const std::string parent = pod["cgroup_parent"];
    std::vector<std::string> ids{pod["sandbox_id"].get<std::string>()};
    for (const auto& c : pod["containers"]) ids.push_back(c["container_id"]);
    for (const auto& id : ids) {
      const std::string dir = *mount + parent + "/" + id;
      struct stat st;
      ASSERT_EQ(stat(dir.c_str(), &st), 0) << dir << ": " << strerror(errno);
      const uint64_t cgroup_id = st.st_ino;

      auto entry = index.lookup(cgroup_id);
      ASSERT_TRUE(entry.has_value()) << dir << " (id " << cgroup_id << ") is not indexed";
      EXPECT_EQ(entry->identity.kind, cgroup::Kind::kContainerOrSandbox) << dir;
      EXPECT_EQ(entry->identity.pod_uid, uid) << dir;
      EXPECT_EQ(entry->identity.container_id, id) << dir;
      EXPECT_EQ(static_cast<int>(entry->identity.qos), pod["expected_qos"].get<int>()) << dir;
      EXPECT_EQ(entry->path, parent + "/" + id);
      EXPECT_EQ(index.find_container(id), cgroup_id);
    }
    struct stat pod_st;
    ASSERT_EQ(stat((*mount + parent).c_str(), &pod_st), 0);
    auto pod_entry = index.lookup(pod_st.st_ino);
    ASSERT_TRUE(pod_entry.has_value());
    EXPECT_EQ(pod_entry->identity.kind, cgroup::Kind::kPod);
    EXPECT_EQ(pod_entry->identity.pod_uid, uid);
  }
}

}  // namespace
}  // namespace kpleg::testing
