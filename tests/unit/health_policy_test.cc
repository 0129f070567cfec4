// HealthPolicy's liveness: kplegd's own loops, not the runtime's problems (but a runtime socket
// that a restart alone can reach again).
#include "daemon/health_policy.h"

#include <gtest/gtest.h>

namespace kpleg::daemon {
namespace {

using namespace std::chrono_literals;

HealthPolicy policy() {
  return HealthPolicy({.runtime_endpoint = "unix:///run/containerd/containerd.sock",
                       .reconcile_period = 300s,
                       .relist_period = 1s,
                       .stuck_call_threshold = 60s,
                       .cri_list_timeout = 60s});
}

TEST(HealthPolicyLiveness, ASlowFirstSyncIsLiveWithinItsCallsDeadlines) {
  auto p = policy();
  const auto now = std::chrono::steady_clock::now();
  // The start-up sync of a big node (or one whose runtime hangs) has run for 170 s: its two
  // lists may take 60 s each; no reconcile ever succeeded, which fails readiness, not liveness.
  auto r = p.liveness(
      {.ebpf = true, .kernel_consuming = true, .reconcile_running_since = now - 170s, .now = now});
  EXPECT_TRUE(r.healthy);
  EXPECT_TRUE(r.reasons.empty());
  // It is looked at again when it would become stuck.
  ASSERT_TRUE(r.recheck_in.has_value());
  EXPECT_LE(*r.recheck_in, 11s);
  EXPECT_EQ(p.stuck_reconcile_after(), 180s);
}

TEST(HealthPolicyLiveness, AReconcileOutlastingItsCallsDeadlinesIsStuck) {
  auto p = policy();
  const auto now = std::chrono::steady_clock::now();
  auto r = p.liveness(
      {.ebpf = true, .kernel_consuming = true, .reconcile_running_since = now - 181s, .now = now});
  EXPECT_FALSE(r.healthy);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_NE(r.reasons[0].find("a reconcile has been running for 181 s"), std::string::npos)
      << r.reasons[0];
}

TEST(HealthPolicyLiveness, TheKernelConsumerEndingIsNotLive) {
  auto p = policy();
  const auto now = std::chrono::steady_clock::now();
  auto r = p.liveness({.ebpf = true, .kernel_consuming = false, .now = now});
  EXPECT_FALSE(r.healthy);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_NE(r.reasons[0].find("stopped consuming"), std::string::npos);
  // Between reconciles, with the consumer running: live, nothing to look at later.
  r = p.liveness({.ebpf = true, .kernel_consuming = true, .now = now});
  EXPECT_TRUE(r.healthy);
  EXPECT_FALSE(r.recheck_in.has_value());
}

TEST(HealthPolicyLiveness, ARuntimeSocketRefusingConnectionsForAMinuteAsksForARestart) {
  auto p = policy();
  const auto now = std::chrono::steady_clock::now();
  // A short outage (the runtime restarting): live, looked at again when it would last too long.
  auto r =
      p.liveness({.ebpf = true, .kernel_consuming = true, .runtime_refused_for = 20s, .now = now});
  EXPECT_TRUE(r.healthy);
  ASSERT_TRUE(r.recheck_in.has_value());
  EXPECT_LE(*r.recheck_in, 41s);
  // A runtime restarted on the host listens on a new socket, which a container that mounts the
  // old one alone never reaches: only a restart mounts the new one.
  r = p.liveness({.ebpf = false, .runtime_refused_for = 61s, .now = now});
  EXPECT_FALSE(r.healthy);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_NE(r.reasons[0].find("refused connections for 61 s"), std::string::npos) << r.reasons[0];
}

TEST(HealthPolicyLiveness, RelistModeIsLive) {
  auto p = policy();
  EXPECT_TRUE(p.liveness({.ebpf = false, .now = std::chrono::steady_clock::now()}).healthy);
}

}  // namespace
}  // namespace kpleg::daemon
