// One noisy pod against the test bed: a workload with a writable cgroupfs (a privileged pod,
// docker-in-docker, systemd in a container) makes cgroups below its container's own, fills what
// its budget allows and loops mkdir/rmdir. The cost stays with that pod: kplegd relists the node
// at most once a second, another pod's death is reported within 2 s, and the noisy pod's
// overflow is counted and named.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "e2e/e2e_support.h"
#include "support/scratch_cgroup.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;

class FloodTest : public CriTestBedTest {};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string container_cgroup(const LaunchedPod& pod, size_t i) {
  return "/sys/fs/cgroup/unified/kubepods/besteffort/pod" + pod.uid + "/" + pod.container_ids[i];
}

TEST_F(FloodTest, ANoisyPodsCgroupStormCostsOnlyThatPod) {
  auto d = start_kplegd(endpoint_, "ebpf",
                        {"--max-tracked-cgroups", "64", "--max-cgroups-per-pod", "16",
                         "--max-cgroup-mkdirs-per-pod", "20"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  auto quiet = launch_pod(endpoint_, namespace_, "quiet", 1, "sleep 1000000");
  ASSERT_TRUE(quiet.ok()) << quiet.error().message;
  auto noisy = launch_pod(endpoint_, namespace_, "noisy", 1, "sleep 1000000");
  ASSERT_TRUE(noisy.ok()) << noisy.error().message;
  ASSERT_TRUE(wait_types(kplegd, quiet->container_ids[0], kStarted));
  ASSERT_TRUE(wait_types(kplegd, noisy->container_ids[0], kStarted));
  const std::string noisy_ctr = container_cgroup(*noisy, 0);

  const size_t reconciles_before = count(kplegd.log(), "containers and sandboxes");
  // Fill: more cgroups below the container than the whole map holds.
  std::vector<ScratchCgroup> filled;
  for (int i = 0; i < 80; ++i) {
    auto c = ScratchCgroup::create(noisy_ctr + "/fill" + std::to_string(i));
    ASSERT_TRUE(c.ok()) << c.error().message;
    filled.push_back(std::move(*c));
  }
  // Then loop mkdir/rmdir for 10 s; 5 s in, the quiet pod's container dies.
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> killed_at, died_at;
  auto quiet_died = [&](const std::vector<nlohmann::json>& evs) {
    return types_of(evs, quiet->container_ids[0]).size() >= 2;
  };
  size_t loops = 0;
  while (std::chrono::steady_clock::now() - t0 < 10s) {
    auto c = ScratchCgroup::create(noisy_ctr + "/loop");
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_TRUE(c->remove().ok());
    ++loops;
    if (!killed_at && std::chrono::steady_clock::now() - t0 >= 5s) {
      std::ifstream procs(container_cgroup(*quiet, 0) + "/cgroup.procs");
      pid_t pid = 0;
      ASSERT_TRUE(procs >> pid) << "no process in the quiet container";
      ASSERT_EQ(kill(pid, SIGKILL), 0);
      killed_at = std::chrono::steady_clock::now();
    } else if (killed_at && !died_at && kplegd.wait_for(quiet_died, 0ms)) {
      died_at = std::chrono::steady_clock::now();
    }
  }
  const auto storm = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(killed_at.has_value());
  if (!died_at && kplegd.wait_for(quiet_died, 2s)) died_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(died_at.has_value()) << "the quiet pod's death was not reported";
  EXPECT_LE(*died_at - *killed_at, 2s) << "the quiet pod's death was reported late";
  EXPECT_EQ(types_of(kplegd.events(), quiet->container_ids[0]), kDied);

  const std::string log = kplegd.log();
  const size_t reconciles = count(log, "containers and sandboxes") - reconciles_before;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(storm).count();
  EXPECT_LE(reconciles, size_t(seconds) + 2) << loops << " mkdir/rmdir loops in " << seconds << " s";
  std::printf("flood: %zu mkdir/rmdir loops in %lld s, %zu reconciles, death reported after %lld ms\n",
              loops, (long long)seconds, reconciles,
              (long long)std::chrono::duration_cast<std::chrono::milliseconds>(*died_at - *killed_at).count());
  // Counted and named.
  EXPECT_NE(log.find("is over its cgroup budget"), std::string::npos) << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  EXPECT_NE(log.find("uid " + noisy->uid), std::string::npos) << "the noisy pod is not named";
  EXPECT_EQ(log.find("tracked-cgroup map (capacity 64) is full"), std::string::npos)
      << "the noisy pod filled the shared map";
  for (auto it = filled.rbegin(); it != filled.rend(); ++it) ASSERT_TRUE(it->remove().ok());
  EXPECT_EQ(kplegd.stop(), 0);
}

}  // namespace
}  // namespace kpleg::testing
