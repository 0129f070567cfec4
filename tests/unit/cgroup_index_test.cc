#include "cgroup/cgroup_index.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cgroup/cgroup2_mount.h"

namespace kpleg::cgroup {
namespace {

namespace fs = std::filesystem;

const std::string kId = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kId2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const std::string kId3 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const std::string kUid = "3f1c2b9e-7a44-4d0b-9c1e-5a6b7c8d9e0f";
const std::string kUid2 = "11111111-2222-4333-8444-555555555555";

std::string hex_id(unsigned n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016x", n);
  return std::string(buf) + std::string(48, 'c');
}

// A plain directory tree standing in for a cgroup2 mount: seeding is a directory walk keyed by
// inode numbers, which any filesystem provides.
class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kpleg-cgroup-index-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Creates `rel` (and its parents) and returns its inode number: the cgroup id.
  std::uint64_t mkdir(const std::string& rel) {
    fs::create_directories(root_ + rel);
    return ino(rel);
  }
  std::uint64_t ino(const std::string& rel) const {
    struct stat st {};
    EXPECT_EQ(::stat((root_ + rel).c_str(), &st), 0) << rel << ": " << std::strerror(errno);
    return st.st_ino;
  }

  std::string root_;
};

TEST_F(CgroupTree, SeedRecordsEveryDirectoryWhosePathParses) {
  const std::string burstable_pod = "/kubepods/burstable/pod" + kUid;
  const std::string guaranteed_pod = "/kubepods/pod" + kUid2;
  const auto root_id = mkdir("/kubepods");
  const auto qos_id = mkdir("/kubepods/burstable");
  mkdir("/kubepods/besteffort");
  const auto pod_id = mkdir(burstable_pod);
  const auto container_id = mkdir(burstable_pod + "/" + kId);
  const auto conmon_id = mkdir(burstable_pod + "/crio-conmon-" + kId3);
  const auto guaranteed_container = mkdir(guaranteed_pod + "/" + kId2);
  // Nested in the container: cgroups a container made for itself, however deep.
  const auto inside_container = mkdir(burstable_pod + "/" + kId + "/sub");
  const auto deeper = mkdir(burstable_pod + "/" + kId + "/sub/kubepods/pod" + kUid2);
  // Not indexed: unrelated trees, a bogus pod dir.
  const auto unrelated = mkdir("/system.slice/containerd.service");
  mkdir("/kubepods/burstable/podnotauid");
  ASSERT_TRUE(fs::exists(root_ + "/kubepods/burstable/podnotauid"));

  CgroupIndex index;
  auto status = index.seed(root_);
  ASSERT_TRUE(status.ok()) << status.error().message;

  // kubepods, burstable, besteffort, 2 pods, 2 containers, conmon, 3 nested.
  EXPECT_EQ(index.size(), 11u);

  auto root = index.lookup(root_id);
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->path, "/kubepods");
  EXPECT_EQ(root->identity.kind, Kind::kRoot);

  auto qos = index.lookup(qos_id);
  ASSERT_TRUE(qos.has_value());
  EXPECT_EQ(qos->identity.kind, Kind::kQos);
  EXPECT_EQ(qos->identity.qos, QosClass::kBurstable);

  auto pod = index.lookup(pod_id);
  ASSERT_TRUE(pod.has_value());
  EXPECT_EQ(pod->identity.kind, Kind::kPod);
  EXPECT_EQ(pod->identity.pod_uid, kUid);

  auto container = index.lookup(container_id);
  ASSERT_TRUE(container.has_value());
  EXPECT_EQ(container->path, burstable_pod + "/" + kId);
  EXPECT_EQ(container->identity.kind, Kind::kContainerOrSandbox);
  EXPECT_EQ(container->identity.pod_uid, kUid);
  EXPECT_EQ(container->identity.container_id, kId);

  auto guaranteed = index.lookup(guaranteed_container);
  ASSERT_TRUE(guaranteed.has_value());
  EXPECT_EQ(guaranteed->identity.qos, QosClass::kGuaranteed);
  EXPECT_EQ(guaranteed->identity.pod_uid, kUid2);

  auto conmon = index.lookup(conmon_id);
  ASSERT_TRUE(conmon.has_value());
  EXPECT_EQ(conmon->identity.kind, Kind::kIgnored);

  EXPECT_FALSE(index.lookup(unrelated).has_value());
  for (auto id : {inside_container, deeper}) {
    auto nested = index.lookup(id);
    ASSERT_TRUE(nested.has_value());
    EXPECT_EQ(nested->identity.kind, Kind::kNested);
    EXPECT_EQ(nested->identity.container_id, kId) << "nested in the outer container, always";
    EXPECT_EQ(nested->identity.pod_uid, kUid);
  }

  EXPECT_EQ(index.find_container(kId), container_id);
  EXPECT_EQ(index.find_container(kId2), guaranteed_container);
  // conmon's cgroup is not the container it monitors.
  EXPECT_FALSE(index.find_container(kId3).has_value());
  EXPECT_FALSE(index.find_container("nope").has_value());
}

TEST_F(CgroupTree, SeedFindsTreesNestedUnderOtherDirectories) {
  const auto nested =
      mkdir("/system.slice/docker-" + kId3 + ".scope/kubepods/burstable/pod" + kUid + "/" + kId);
  const auto systemd = mkdir("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" +
                             std::string("11111111_2222_4333_8444_555555555555") +
                             ".slice/cri-containerd-" + kId2 + ".scope");
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());
  EXPECT_EQ(index.find_container(kId), nested);
  EXPECT_EQ(index.find_container(kId2), systemd);
  auto entry = index.lookup(systemd);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->identity.pod_uid, kUid2);
  EXPECT_EQ(entry->identity.runtime, Runtime::kContainerd);
}

TEST_F(CgroupTree, MkdirAndRmdirEventsKeepTheIndexCurrent) {
  mkdir("/kubepods/burstable/pod" + kUid);
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());
  const std::size_t seeded = index.size();

  const std::string path = "/kubepods/burstable/pod" + kUid + "/" + kId;
  const auto id = mkdir(path);
  EXPECT_FALSE(index.lookup(id).has_value());
  EXPECT_TRUE(index.on_mkdir(id, path));
  EXPECT_EQ(index.size(), seeded + 1);
  auto entry = index.lookup(id);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->path, path);
  EXPECT_EQ(entry->identity.container_id, kId);
  EXPECT_EQ(index.find_container(kId), id);

  index.on_rmdir(id);
  EXPECT_FALSE(index.lookup(id).has_value());
  EXPECT_FALSE(index.find_container(kId).has_value());
  EXPECT_EQ(index.size(), seeded);

  index.on_rmdir(id);  // a repeated or unknown rmdir is harmless
  index.on_rmdir(123456789);
  EXPECT_EQ(index.size(), seeded);
}

// A lost mkdir record: the kernel knows the cgroup (and its parent), the index does not. It is
// found by listing the directories between it and the nearest ancestor the index knows, and
// nowhere else.
TEST_F(CgroupTree, ACgroupWhoseMkdirWasMissedIsResolvedFromItsParentsDirectory) {
  const std::string pod = "/kubepods/burstable/pod" + kUid;
  const auto pod_id = mkdir(pod);
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());
  // Made after the seed, its mkdir never reported: a container and a cgroup nested in it.
  const auto ctr = mkdir(pod + "/" + kId);
  const auto nested = mkdir(pod + "/" + kId + "/init.scope");
  mkdir("/kubepods/burstable/pod" + kUid2 + "/" + kId2);  // elsewhere: must not be listed
  ASSERT_FALSE(index.lookup(nested).has_value());
  std::map<std::uint64_t, std::uint64_t> parents{{nested, ctr}, {ctr, pod_id}};
  int asked = 0;
  auto parent_of = [&](std::uint64_t id) -> std::optional<std::uint64_t> {
    ++asked;
    auto it = parents.find(id);
    if (it == parents.end()) return std::nullopt;
    return it->second;
  };
  auto entry = index.resolve(nested, parent_of);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->identity.kind, Kind::kNested);
  EXPECT_EQ(entry->identity.container_id, kId);
  EXPECT_EQ(entry->path, pod + "/" + kId + "/init.scope");
  // The container on the way is indexed too, as its mkdir would have.
  EXPECT_EQ(index.find_container(kId), ctr);
  EXPECT_FALSE(index.find_container(kId2).has_value()) << "the resolve walked the tree";
  EXPECT_LE(asked, 3);

  // Not resolvable: no known ancestor, or gone.
  EXPECT_FALSE(index.resolve(987654321, parent_of).has_value());
  const auto gone = mkdir(pod + "/" + kId3);
  fs::remove(root_ + pod + "/" + kId3);
  parents[gone] = pod_id;
  EXPECT_FALSE(index.resolve(gone, parent_of).has_value());
}

// A lost rmdir record: without a look at the tree the entry stays forever.
TEST_F(CgroupTree, EntriesOfCgroupsThatNoLongerExistAreDropped) {
  const std::string pod = "/kubepods/burstable/pod" + kUid;
  mkdir(pod);
  const auto kept = mkdir(pod + "/" + kId);
  const auto gone = mkdir(pod + "/" + kId2);
  const auto reused = mkdir(pod + "/" + kId3);
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());
  const std::size_t seeded = index.size();
  ASSERT_EQ(index.find_container(kId2), gone);
  fs::remove(root_ + pod + "/" + kId2);  // no on_rmdir: its record was lost
  // The same path made again is another cgroup (another inode): the old entry is stale too.
  const std::string tmp = pod + "/placeholder";
  mkdir(tmp);  // keeps the old inode number from being reused at once
  fs::remove(root_ + pod + "/" + kId3);
  // (A filesystem may hand the freed inode number straight back: then it is the same id.)
  const bool replaced = mkdir(pod + "/" + kId3) != reused;
  EXPECT_EQ(index.size(), seeded) << "nothing drops them on its own";

  const std::size_t stale = replaced ? 2u : 1u;
  EXPECT_EQ(index.drop_vanished(), stale);
  EXPECT_FALSE(index.lookup(gone).has_value());
  EXPECT_FALSE(index.find_container(kId2).has_value());
  EXPECT_EQ(index.lookup(reused).has_value(), !replaced);
  EXPECT_EQ(index.find_container(kId), kept);
  EXPECT_EQ(index.size(), seeded - stale);
  EXPECT_EQ(index.drop_vanished(), 0u);
}

TEST_F(CgroupTree, MkdirOfAPathThatDoesNotParseIsNotIndexedAndDropsAStaleEntry) {
  CgroupIndex index;
  EXPECT_FALSE(index.on_mkdir(7, "/system.slice/foo.service"));
  EXPECT_EQ(index.size(), 0u);

  ASSERT_TRUE(index.on_mkdir(7, "/k8s.io/" + kId));
  EXPECT_EQ(index.find_container(kId), 7u);
  // The same id now names something else: the old attribution must not survive.
  EXPECT_FALSE(index.on_mkdir(7, "/k8s.io/" + kId + "/nested"));
  EXPECT_FALSE(index.lookup(7).has_value());
  EXPECT_FALSE(index.find_container(kId).has_value());
}

// Found by tests/fuzz/kernel_events_fuzz.cc: two cgroups claiming one container id (a look-alike
// path a workload made in a delegated subtree, or a stale entry after a missed rmdir). Removing
// one must leave the other findable, not orphan it.
TEST_F(CgroupTree, TwoCgroupsClaimingOneContainerIdStayFindableAsEitherGoes) {
  CgroupIndex index;
  ASSERT_TRUE(index.on_mkdir(9, "/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/" + kId));
  ASSERT_TRUE(index.on_mkdir(7, "/k8s.io/" + kId));
  EXPECT_EQ(index.find_container(kId), 7u);  // the oldest (smallest id) answers, whatever the order
  index.on_rmdir(7);
  EXPECT_EQ(index.find_container(kId), 9u);
  ASSERT_TRUE(index.on_mkdir(7, "/k8s.io/" + kId));
  index.on_rmdir(9);
  EXPECT_EQ(index.find_container(kId), 7u);
  index.on_rmdir(7);
  ASSERT_TRUE(index.on_mkdir(9, "/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/" + kId));
  index.on_rmdir(9);
  EXPECT_FALSE(index.find_container(kId).has_value());
}

TEST_F(CgroupTree, MkdirBelowAContainersCgroupIsNestedInThatContainer) {
  CgroupIndex index;
  const std::string ctr = "/kubepods/pod" + kUid + "/" + kId;
  ASSERT_TRUE(index.on_mkdir(1, ctr, 100));
  ASSERT_TRUE(index.on_mkdir(2, ctr + "/init.scope", 1));
  // A kubepods tree inside a container (a node in a pod) belongs to the outer container too.
  ASSERT_TRUE(index.on_mkdir(3, ctr + "/init.scope/kubepods/pod" + kUid2 + "/" + kId2, 2));
  for (std::uint64_t id : {2u, 3u}) {
    auto e = index.lookup(id);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->identity.kind, Kind::kNested);
    EXPECT_EQ(e->identity.container_id, kId);
    EXPECT_EQ(e->identity.pod_uid, kUid);
  }
  EXPECT_EQ(index.find_container(kId), 1u) << "a nested cgroup is not the container's own";
  EXPECT_FALSE(index.find_container(kId2).has_value());
  index.on_rmdir(3);
  index.on_rmdir(2);
  EXPECT_EQ(index.size(), 1u);
}

// A container id is given out once and its cgroup made once, by the runtime, before the id is
// known to anybody else: a second cgroup claiming it later is a look-alike, and the older one
// stays the container's.
TEST_F(CgroupTree, ReverseLookupKeepsTheOldestCgroupOfAContainer) {
  CgroupIndex index;
  ASSERT_TRUE(index.on_mkdir(1, "/kubepods/pod" + kUid + "/" + kId));
  ASSERT_TRUE(index.on_mkdir(2, "/k8s.io/" + kId));
  EXPECT_EQ(index.find_container(kId), 1u);
  index.on_rmdir(1);  // removing the older cgroup must not unlink the newer one
  EXPECT_EQ(index.find_container(kId), 2u);
  index.on_rmdir(2);
  EXPECT_FALSE(index.find_container(kId).has_value());
}

TEST_F(CgroupTree, SeedReplacesWhatTheTreeNoLongerHas) {
  CgroupIndex index;
  ASSERT_TRUE(index.on_mkdir(999999, "/k8s.io/" + kId));
  const auto id = mkdir("/k8s.io/" + kId2);
  ASSERT_TRUE(index.seed(root_).ok());
  EXPECT_FALSE(index.lookup(999999).has_value());
  EXPECT_FALSE(index.find_container(kId).has_value());
  EXPECT_EQ(index.find_container(kId2), id);
  EXPECT_EQ(index.size(), 2u);  // /k8s.io and its container
}

TEST_F(CgroupTree, SnapshotHasEveryEntry) {
  const auto a = mkdir("/k8s.io/" + kId);
  const auto b = mkdir("/k8s.io/" + kId2);
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());
  std::map<std::uint64_t, std::string> got;
  for (const auto& [id, entry] : index.snapshot()) got[id] = entry.path;
  EXPECT_EQ(got, (std::map<std::uint64_t, std::string>{
                     {ino("/k8s.io"), "/k8s.io"}, {a, "/k8s.io/" + kId}, {b, "/k8s.io/" + kId2}}));
}

TEST_F(CgroupTree, SeedOfAMissingMountFailsWithThePath) {
  CgroupIndex index;
  auto status = index.seed(root_ + "/does-not-exist");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ENOENT);
  EXPECT_NE(status.error().message.find(root_ + "/does-not-exist"), std::string::npos);
}

// Containers come and go while seeds run. However the walk and the events interleave, once
// both stop the index must equal a fresh walk of the final tree: a cgroup removed during a
// walk must not be resurrected by it, one created during it must not be lost.
TEST_F(CgroupTree, SeedRacingWithEventsConvergesToTheTree) {
  const std::string pod = "/kubepods/besteffort/pod" + kUid;
  mkdir(pod);
  CgroupIndex index;
  ASSERT_TRUE(index.seed(root_).ok());

  std::atomic<bool> churn_done{false};
  std::thread churn([&] {
    std::vector<std::pair<std::string, std::uint64_t>> live;
    for (unsigned i = 0; i < 3000; ++i) {
      const std::string path = pod + "/" + hex_id(i);
      const auto id = mkdir(path);
      index.on_mkdir(id, path);
      live.emplace_back(path, id);
      // Remove two of every three so the tree keeps changing shape.
      if (i % 3 != 0) {
        const auto victim = live.front();
        live.erase(live.begin());
        fs::remove(root_ + victim.first);
        index.on_rmdir(victim.second);
      }
    }
    churn_done = true;
  });
  do {  // at least once, even when the churn is over before this thread looks
    ASSERT_TRUE(index.seed(root_).ok());
  } while (!churn_done.load());
  churn.join();

  CgroupIndex fresh;
  ASSERT_TRUE(fresh.seed(root_).ok());
  std::map<std::uint64_t, std::string> want, got;
  for (const auto& [id, entry] : fresh.snapshot()) want[id] = entry.path;
  for (const auto& [id, entry] : index.snapshot()) got[id] = entry.path;
  EXPECT_EQ(got, want);
  EXPECT_GT(want.size(), 1000u);
}

TEST_F(CgroupTree, ConcurrentReadersSeeWholeEntries) {
  CgroupIndex index;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (unsigned i = 0; i < 20000; ++i) {
      index.on_mkdir(i % 64, "/k8s.io/" + hex_id(i));
      if (i % 2) index.on_rmdir((i + 32) % 64);
    }
    done = true;
  });
  bool last_pass = false;
  do {  // passes while the writer works, and one over its final state
    last_pass = done.load();
    for (std::uint64_t id = 0; id < 64; ++id) {
      if (auto entry = index.lookup(id)) {
        ASSERT_EQ(entry->path, "/k8s.io/" + entry->identity.container_id);
        auto back = index.find_container(entry->identity.container_id);
        // The entry may be replaced between the two calls, but never by a wrong mapping.
        if (back) {
          ASSERT_EQ(*back, id);
        }
      }
    }
  } while (!last_pass);
  writer.join();
}

// --- cgroup2 mount ---------------------------------------------------------------------------

TEST_F(CgroupTree, FindCgroup2MountNamesBothCandidatesWhenThereIsNone) {
  auto found = find_cgroup2_mount(root_);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().code, ENOENT);
  EXPECT_NE(found.error().message.find("no cgroup2"), std::string::npos);
  EXPECT_NE(found.error().message.find(root_ + " is not cgroup2"), std::string::npos);
  EXPECT_NE(found.error().message.find(root_ + "/unified"), std::string::npos);
}

TEST(Cgroup2Mount, HostMountIsCgroup2AndSeeds) {
  auto found = find_cgroup2_mount();
  if (!found.ok()) GTEST_SKIP() << "host has no cgroup2: " << found.error().message;
  auto cgroup2 = is_cgroup2(*found);
  ASSERT_TRUE(cgroup2.ok());
  EXPECT_TRUE(*cgroup2);
  EXPECT_TRUE(*found == "/sys/fs/cgroup" || *found == "/sys/fs/cgroup/unified") << *found;

  CgroupIndex index;
  auto status = index.seed(*found);
  ASSERT_TRUE(status.ok()) << status.error().message;
  for (const auto& [id, entry] : index.snapshot()) {
    struct stat st {};
    ASSERT_EQ(::stat((*found + entry.path).c_str(), &st), 0) << entry.path;
    EXPECT_EQ(st.st_ino, id) << entry.path;
  }
}

}  // namespace
}  // namespace kpleg::cgroup
