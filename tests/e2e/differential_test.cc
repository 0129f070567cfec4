// Both modes at once against one workload: per container, what kpleg reports from kernel events
// must contain what the kubelet-style relist reports, in the same order, end in the same state,
// and need no correction.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "e2e/e2e_support.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;

bool is_subsequence(const std::vector<std::string>& small, const std::vector<std::string>& big) {
  size_t i = 0;
  for (const auto& x : big) {
    if (i < small.size() && small[i] == x) ++i;
  }
  return i == small.size();
}

class DifferentialTest : public CriTestBedTest {};

TEST_F(DifferentialTest, EbpfContainsRelistAndNeedsNoCorrection) {
  auto ebpf = start_kplegd(endpoint_, "ebpf");
  ASSERT_TRUE(ebpf.ok()) << ebpf.error().message;
  auto relist = start_kplegd(endpoint_, "relist", {"--relist-period", "1s"});
  ASSERT_TRUE(relist.ok()) << relist.error().message;

  std::vector<std::string> ids;
  std::map<std::string, std::vector<std::string>> want_final;  // id -> expected last type
  auto add = [&](const LaunchedPod& p) {
    ids.push_back(p.sandbox_id);
    for (const auto& c : p.container_ids) ids.push_back(c);
  };
  // 3 long-running pods x 2, 2 pods whose containers exit (0 and 7), one crash-looping-style
  // fast exit; then stop one container, remove one container, remove two pods.
  std::vector<LaunchedPod> pods;
  for (int i = 0; i < 3; ++i) {
    auto p = launch_pod(endpoint_, namespace_, "long" + std::to_string(i), 2, "sleep 1000000");
    ASSERT_TRUE(p.ok()) << p.error().message;
    pods.push_back(*p);
    add(*p);
  }
  auto exit0 = launch_pod(endpoint_, namespace_, "exit0", 2, "sh -c 'sleep 3; exit 0'");
  auto exit7 = launch_pod(endpoint_, namespace_, "exit7", 1, "sh -c 'sleep 3; exit 7'");
  auto fast = launch_pod(endpoint_, namespace_, "fast", 1, "sh -c 'exit 1'");
  ASSERT_TRUE(exit0.ok() && exit7.ok() && fast.ok());
  add(*exit0);
  add(*exit7);
  add(*fast);

  // Both daemons must have seen the long-running pods run before they are stopped: a relist
  // (1 s apart) never sees a container that lived between two of its looks, and the whole
  // launch can take less than that.
  for (int i = 0; i < 3; ++i) {
    for (const auto& id :
         {pods[i].sandbox_id, pods[i].container_ids[0], pods[i].container_ids[1]}) {
      ASSERT_TRUE(wait_types(**ebpf, id, kStarted)) << id;
      ASSERT_TRUE(wait_types(**relist, id, kStarted)) << id;
    }
  }
  ASSERT_TRUE(load_op(endpoint_, "stop-container", pods[0].container_ids[0]).ok());
  ASSERT_TRUE(load_op(endpoint_, "remove-container", pods[0].container_ids[0]).ok());
  ASSERT_TRUE(load_op(endpoint_, "stop-container", pods[1].container_ids[1]).ok());
  ASSERT_TRUE(load_op(endpoint_, "remove-pod", pods[2].sandbox_id).ok());
  // Wait for exit7's exit, in both daemons (a relist can be seconds late on a busy machine),
  // before removing it.
  ASSERT_TRUE(wait_types(**ebpf, exit7->container_ids[0], kDied));
  ASSERT_TRUE((*relist)->wait_for(
      [&](const auto& evs) {
        auto t = types_of(evs, exit7->container_ids[0]);
        return !t.empty() && t.back() == "ContainerDied";
      },
      30s))
      << "relist mode did not report exit7's exit";
  ASSERT_TRUE(load_op(endpoint_, "remove-pod", exit7->sandbox_id).ok());

  // Expected final states, from what the workload did.
  auto final_type = [&](const std::string& id) -> std::string {
    if (id == pods[0].container_ids[0]) return "ContainerRemoved";
    if (id == pods[1].container_ids[1]) return "ContainerDied";
    if (id == pods[2].sandbox_id || id == pods[2].container_ids[0] ||
        id == pods[2].container_ids[1])
      return "ContainerRemoved";
    if (id == exit7->sandbox_id || id == exit7->container_ids[0]) return "ContainerRemoved";
    if (id == exit0->container_ids[0] || id == exit0->container_ids[1]) return "ContainerDied";
    if (id == fast->container_ids[0]) return "ContainerDied";
    return "ContainerStarted";
  };
  auto settled = [&](const std::vector<nlohmann::json>& evs) {
    for (const auto& id : ids) {
      auto t = types_of(evs, id);
      if (t.empty() || t.back() != final_type(id)) return false;
    }
    return true;
  };
  EXPECT_TRUE((*ebpf)->wait_for(settled, 30s)) << "ebpf mode did not reach the final states";
  EXPECT_TRUE((*relist)->wait_for(settled, 30s)) << "relist mode did not reach the final states";

  // Counted on the kernel side: a relist misses what lived between two of its looks.
  size_t transitions = 0;
  for (const auto& id : ids) {
    auto e = (*ebpf)->types_for(id);
    auto r = (*relist)->types_for(id);
    transitions += e.size();
    EXPECT_TRUE(is_subsequence(r, e)) << id << ": relist " << ::testing::PrintToString(r)
                                      << " not contained in ebpf " << ::testing::PrintToString(e);
    ASSERT_FALSE(e.empty());
    ASSERT_FALSE(r.empty());
    EXPECT_EQ(e.back(), r.back()) << id;
  }
  EXPECT_GE(transitions, 30u) << "the workload should make 30+ transitions";
  for (const auto& ev : (*ebpf)->events()) {
    if (std::find(ids.begin(), ids.end(), ev.value("container_id", "")) == ids.end()) continue;
    EXPECT_FALSE(ev.value("correction", false)) << ev.dump();
    EXPECT_EQ(ev.value("source", ""), "kernel") << ev.dump();
  }
  EXPECT_EQ((*ebpf)->stop(), 0);
  EXPECT_EQ((*relist)->stop(), 0);
}

}  // namespace
}  // namespace kpleg::testing
