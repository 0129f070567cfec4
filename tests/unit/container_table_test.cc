// The kubelet's transition table, driven directly on the pure ContainerTable: every forward
// step yields exactly generic.go's events, nothing goes back, and a container nobody reported
// disappears without a word.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pleg/container_table.h"

namespace kpleg::pleg {
namespace {

using Clock = std::chrono::steady_clock;

class ContainerTableTest : public ::testing::Test {
 protected:
  Record& known(const std::string& id) {
    Record& rec = table_.at(id, "uid-1");
    RuntimeContainer rc{id, false, "app", {"uid-1", "web", "shop"}, ContainerState::kCreated};
    table_.adopt_listed(rec, rc);
    return rec;
  }
  // Advances and returns the event types, in order.
  std::vector<std::string> step(Record& rec, ContainerState to, ContainerSnapshot snap = {},
                                EventSource source = EventSource::kKernel) {
    snap.state = to;
    out_.clear();
    table_.advance(rec, to, snap, source, false, now_, 42, out_);
    std::vector<std::string> types;
    for (const auto& ev : out_) types.push_back(to_string(ev.type));
    return types;
  }

  ContainerTable table_;
  Events out_;
  Clock::time_point now_ = Clock::time_point(std::chrono::seconds(100));
};

using V = std::vector<std::string>;

TEST_F(ContainerTableTest, EachForwardStepYieldsTheKubeletsEvents) {
  Record& rec = known("c1");
  EXPECT_EQ(step(rec, ContainerState::kCreated), V{});
  EXPECT_EQ(step(rec, ContainerState::kRunning), V{"ContainerStarted"});
  EXPECT_EQ(step(rec, ContainerState::kExited), V{"ContainerDied"});
  EXPECT_EQ(step(rec, ContainerState::kNonExistent), V{"ContainerRemoved"});
  EXPECT_EQ(rec.removed_at, now_);
}

TEST_F(ContainerTableTest, NothingGoesBackOrRepeats) {
  Record& rec = known("c1");
  step(rec, ContainerState::kExited);
  EXPECT_EQ(step(rec, ContainerState::kRunning), V{});
  EXPECT_EQ(step(rec, ContainerState::kExited), V{});
  EXPECT_EQ(rec.reported, ContainerState::kExited);
}

TEST_F(ContainerTableTest, ARunningContainerThatVanishesDiesThenIsRemoved) {
  Record& rec = known("c1");
  step(rec, ContainerState::kRunning);
  EXPECT_EQ(step(rec, ContainerState::kNonExistent), (V{"ContainerDied", "ContainerRemoved"}));
}

TEST_F(ContainerTableTest, AStartOnlyTheKernelSawIsReportedBeforeTheDeath) {
  Record& seen = known("c1");
  seen.kernel_exec_seen = true;
  ContainerSnapshot snap;
  snap.started_at_ns = 5;
  EXPECT_EQ(step(seen, ContainerState::kExited, snap), (V{"ContainerStarted", "ContainerDied"}));
  // Without the kernel's exec (or without the runtime's started_at) there is no start to report.
  Record& unseen = known("c2");
  EXPECT_EQ(step(unseen, ContainerState::kExited, snap), V{"ContainerDied"});
  Record& never_started = known("c3");
  never_started.kernel_exec_seen = true;
  EXPECT_EQ(step(never_started, ContainerState::kExited), V{"ContainerDied"});
}

TEST_F(ContainerTableTest, AContainerTheRuntimeNeverReportedGoesWithoutAnEvent) {
  Record& rec = table_.at("ghost", "uid-1");
  EXPECT_EQ(step(rec, ContainerState::kNonExistent), V{});
  EXPECT_EQ(rec.reported, ContainerState::kNonExistent);
}

TEST_F(ContainerTableTest, DiedCarriesTheRuntimesStatusAndTheKernelsTimestamp) {
  Record& rec = known("c1");
  rec.kernel_start_ts = 11;
  rec.kernel_exit_ts = 22;
  rec.oom_killed = true;
  step(rec, ContainerState::kRunning);
  ASSERT_EQ(out_.size(), 1u);
  EXPECT_EQ(out_[0].kernel_ts_ns, 11u);
  ContainerSnapshot snap;
  snap.exit_code = 137;
  step(rec, ContainerState::kExited, snap);
  ASSERT_EQ(out_.size(), 1u);
  const auto& died = out_[0];
  EXPECT_EQ(died.exit_code, 137);
  EXPECT_EQ(died.reason, "OOMKilled");  // the kernel's OOM kill, the runtime said nothing
  EXPECT_EQ(died.kernel_ts_ns, 22u);
  EXPECT_EQ(died.emit_ts_ns, 42u);
  EXPECT_EQ(died.pod_name, "web");
  EXPECT_EQ(died.container_name, "app");
  // A runtime that has not seen the cgroup's OOM event yet says Error: the kernel's OOM kill
  // stands, in the event and in List's snapshot; the runtime's status is passed on as it came.
  Record& late = known("c3");
  late.oom_killed = true;
  snap.reason = "Error";
  step(late, ContainerState::kExited, snap);
  EXPECT_EQ(out_[0].reason, "OOMKilled");
  EXPECT_EQ(out_[0].status.reason, "Error");
  // Any other reason of the runtime's wins; a reconcile's event has no kernel timestamp.
  Record& other = known("c2");
  other.oom_killed = true;
  other.kernel_exit_ts = 33;
  snap.reason = "ContainerCannotRun";
  step(other, ContainerState::kExited, snap, EventSource::kReconcile);
  EXPECT_EQ(out_[0].reason, "ContainerCannotRun");
  EXPECT_EQ(out_[0].kernel_ts_ns, 0u);
  // Without the kernel's OOM kill, the runtime's Error stands.
  Record& plain = known("c4");
  snap.reason = "Error";
  step(plain, ContainerState::kExited, snap);
  EXPECT_EQ(out_[0].reason, "Error");
  for (const auto& c : table_.confirmed()) {
    if (c.id == "c3") EXPECT_EQ(c.snapshot.reason, "OOMKilled");
    if (c.id == "c2") EXPECT_EQ(c.snapshot.reason, "ContainerCannotRun");
    if (c.id == "c4") EXPECT_EQ(c.snapshot.reason, "Error");
  }
}

TEST_F(ContainerTableTest, TheLatestSandboxOfAPodDecidesTheLikelyKindOfANewId) {
  Record& fresh = table_.at("x", "uid-1");
  EXPECT_TRUE(table_.likely_sandbox(fresh));  // no sandbox yet: the first id is the sandbox
  Record& sb = table_.at("sb", "uid-1");
  table_.adopt_listed(sb, {"sb", true, "", {"uid-1", "web", "shop"}, ContainerState::kRunning});
  step(sb, ContainerState::kRunning);
  EXPECT_FALSE(table_.likely_sandbox(fresh));
  step(sb, ContainerState::kExited);
  EXPECT_TRUE(table_.likely_sandbox(fresh));  // a new sandbox of a pod whose old one died
}

TEST_F(ContainerTableTest, RemovedRecordsAreForgottenAfterTheRetentionOnly) {
  Record& rec = known("c1");
  step(rec, ContainerState::kNonExistent);
  table_.forget_removed(now_ + std::chrono::seconds(59), std::chrono::seconds(60));
  EXPECT_NE(table_.find("c1"), nullptr);
  table_.forget_removed(now_ + std::chrono::seconds(60), std::chrono::seconds(60));
  EXPECT_EQ(table_.find("c1"), nullptr);
}

TEST_F(ContainerTableTest, ListShowsOnlyWhatTheRuntimeConfirmed) {
  known("created");
  Record& running = known("running");
  step(running, ContainerState::kRunning);
  Record& gone = known("gone");
  step(gone, ContainerState::kNonExistent);
  auto list = table_.confirmed();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "running");
  EXPECT_EQ(list[0].state, ContainerState::kRunning);
}

}  // namespace
}  // namespace kpleg::pleg
