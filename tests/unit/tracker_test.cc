// The tracker's state machine against an in-memory runtime: kernel signals become events only
// once the runtime confirms them, with the kubelet's rules, no duplicates, no Died before Started.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>
#include <filesystem>
#include <sys/stat.h>
#include <cstdlib>

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "pleg/reconciler.h"
#include "pleg/tracker.h"
#include "support/eventually.h"
#include "support/fake_cri_client.h"

namespace kpleg::pleg {
namespace {

using namespace std::chrono_literals;
using kpleg::testing::eventually;
namespace v1 = ::runtime::v1;

class CollectingSink : public EventSink {
 public:
  void publish(PodLifecycleEvent ev) override {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(ev));
    cv_.notify_all();
  }
  bool wait_count(size_t n, std::chrono::milliseconds t = 5s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, t, [&] { return events_.size() >= n; });
  }
  std::vector<PodLifecycleEvent> events() {
    std::lock_guard lk(mu_);
    return events_;
  }
  std::vector<std::string> types_for(const std::string& id) {
    std::lock_guard lk(mu_);
    std::vector<std::string> out;
    for (const auto& e : events_) {
      if (e.container_id == id) out.push_back(to_string(e.type));
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PodLifecycleEvent> events_;
};

const std::string kUid = "5f1e2d3c-4b5a-4968-8776-655443322110";

class TrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TrackerOptions o;
    o.removal_sweep_first = 20ms;
    o.removal_sweep_period = 40ms;
    o.removal_sweep_idle_max = 40ms;
    o.correction_grace = 20ms;
    tracker_ = std::make_unique<Tracker>(cri_, index_, sink_, o);
    v1::PodSandboxConfig cfg;
    cfg.mutable_metadata()->set_name("web");
    cfg.mutable_metadata()->set_namespace_("shop");
    cfg.mutable_metadata()->set_uid(kUid);
    (*cfg.mutable_labels())["io.kubernetes.pod.uid"] = kUid;
    (*cfg.mutable_labels())["io.kubernetes.pod.name"] = "web";
    (*cfg.mutable_labels())["io.kubernetes.pod.namespace"] = "shop";
    sandbox_cfg_ = cfg;
    sandbox_ = *cri_.run_pod_sandbox(cfg);
    index_.on_mkdir(cgroup_of(sandbox_), path_of(sandbox_));
  }
  void TearDown() override { tracker_->stop(); }

  static uint64_t cgroup_of(const std::string& id) { return std::hash<std::string>{}(id) | 1; }
  // A kubelet's cgroup path, or with flat_paths_ containerd's own (/k8s.io/<id>: no pod uid, so
  // the runtime's first answer tells the container's pod).
  std::string path_of(const std::string& id) const {
    return flat_paths_ ? "/k8s.io/" + id : "/kubepods/burstable/pod" + kUid + "/" + id;
  }
  bool flat_paths_ = false;
  void rmdir_takes_over_the_looks_for_a_death();

  std::string create(const std::string& name) {
    v1::ContainerConfig c;
    c.mutable_metadata()->set_name(name);
    (*c.mutable_labels())["io.kubernetes.pod.uid"] = kUid;
    (*c.mutable_labels())["io.kubernetes.pod.name"] = "web";
    (*c.mutable_labels())["io.kubernetes.pod.namespace"] = "shop";
    (*c.mutable_labels())["io.kubernetes.container.name"] = name;
    auto id = *cri_.create_container(sandbox_, c, sandbox_cfg_);
    index_.on_mkdir(cgroup_of(id), path_of(id));
    return id;
  }

  void kernel_exec(const std::string& id) {
    kernel::KernelEvent ev;
    ev.ktime_ns = 1;
    ev.body = kernel::ProcessExec{cgroup_of(id), 100, 100, 1, "sh", "/bin/sh"};
    tracker_->on_kernel_event(ev);
  }
  void kernel_exit(const std::string& id, uint32_t code, bool oom_killed = false,
                   uint64_t ktime_ns = 2) {
    kernel::KernelEvent ev;
    ev.ktime_ns = ktime_ns;
    ev.body = kernel::ProcessExit{cgroup_of(id), 100, code, oom_killed ? 9u : 0u, false, oom_killed};
    tracker_->on_kernel_event(ev);
  }
  void kernel_rmdir(uint64_t cgroup) {
    kernel::KernelEvent ev;
    ev.body = kernel::CgroupRmdir{cgroup};
    tracker_->on_kernel_event(ev);
  }
  void kernel_oom(const std::string& id) {
    kernel::KernelEvent ev;
    ev.body = kernel::OomKill{cgroup_of(id), 100};
    tracker_->on_kernel_event(ev);
  }

  // A container of the pod that starts through the kernel path; returns once it was reported.
  std::string started(const std::string& name) {
    auto id = create(name);
    EXPECT_TRUE(cri_.start_container(id).ok());
    kernel_exec(id);
    EXPECT_TRUE(wait_types(id, {"ContainerStarted"}));
    return id;
  }
  // A container of the pod that starts and exits with `code`, both through the kernel path;
  // returns once the tracker reported both.
  std::string started_and_exited(const std::string& name, uint32_t code = 0) {
    auto id = started(name);
    EXPECT_TRUE(cri_.exit_container(id, code).ok());
    kernel_exit(id, code);
    EXPECT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
    return id;
  }

  // Waits until `id` has as many events as `want`; whether they are `want`.
  bool wait_types(const std::string& id, const std::vector<std::string>& want,
                  std::chrono::milliseconds within = 5s) {
    return eventually([&] { return sink_.types_for(id).size() >= want.size(); }, within) &&
           sink_.types_for(id) == want;
  }

  // Replaces the tracker with one built with `o`; counts its inconsistencies.
  void restart_tracker(const TrackerOptions& o) {
    tracker_->stop();
    tracker_ = std::make_unique<Tracker>(cri_, index_, sink_, o);
    tracker_->set_inconsistency_handler([this](const std::string&) { ++inconsistencies_; });
  }
  // restart_tracker(), then the start-up sync (the sandbox).
  void restart_and_sync(const TrackerOptions& o) {
    restart_tracker(o);
    auto view = list_runtime(cri_);
    ASSERT_TRUE(view.ok());
    tracker_->reconcile(*view, /*initial=*/true);
  }
  // restart_and_sync() with removal sweeps in milliseconds.
  void restart_with_fast_removal(TrackerOptions o) {
    o.removal_sweep_first = 10ms;
    o.removal_sweep_period = 20ms;
    o.removal_sweep_idle_max = 20ms;
    restart_and_sync(o);
  }
  // A container-shaped cgroup of this pod that the runtime does not know.
  std::string unknown_container(char c) {
    std::string id(64, c);
    index_.on_mkdir(cgroup_of(id), path_of(id));
    return id;
  }

  std::atomic<int> inconsistencies_{0};
  cri::FakeCriClient cri_;
  cgroup::CgroupIndex index_;
  CollectingSink sink_;
  std::unique_ptr<Tracker> tracker_;
  v1::PodSandboxConfig sandbox_cfg_;
  std::string sandbox_;
};

TEST_F(TrackerTest, StartDieRemoveConfirmedByTheRuntime) {
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel_exec(id);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  ASSERT_TRUE(cri_.exit_container(id, 3).ok());
  kernel_exit(id, 3);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  ASSERT_TRUE(cri_.remove_container(id).ok());
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));

  auto evs = sink_.events();
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[0].pod_name, "web");
  EXPECT_EQ(evs[0].pod_namespace, "shop");
  EXPECT_EQ(evs[0].pod_uid, kUid);
  EXPECT_EQ(evs[0].container_name, "app");
  EXPECT_EQ(evs[0].source, EventSource::kKernel);
  EXPECT_GT(evs[0].status.started_at_ns, 0);
  EXPECT_EQ(evs[1].exit_code, 3);
  EXPECT_EQ(evs[1].status.state, ContainerState::kExited);
  EXPECT_FALSE(evs[1].correction);
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

TEST_F(TrackerTest, WaitsForTheRuntimeToReportTheStart) {
  auto id = create("slow");
  kernel_exec(id);  // the kernel is ahead: the runtime still says CREATED
  EXPECT_FALSE(sink_.wait_count(1, 100ms)) << "an event for a state the runtime does not report";
  ASSERT_TRUE(cri_.start_container(id).ok());
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_GT(tracker_->stats().confirm_retries, 0u);
}

TEST_F(TrackerTest, DuplicateSignalsGiveOneEvent) {
  auto id = create("dup");
  ASSERT_TRUE(cri_.start_container(id).ok());
  for (int i = 0; i < 5; ++i) kernel_exec(id);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  ASSERT_TRUE(cri_.exit_container(id, 0).ok());
  for (int i = 0; i < 5; ++i) kernel_exit(id, 0);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  // Give stray duplicates every chance to show up before checking there are none.
  EXPECT_FALSE(sink_.wait_count(3, 200ms));
  EXPECT_EQ(sink_.types_for(id), (std::vector<std::string>{"ContainerStarted", "ContainerDied"}));
}

TEST_F(TrackerTest, ShortLivedContainerReportsStartThenDeath) {
  auto id = create("crash");
  ASSERT_TRUE(cri_.start_container(id).ok());
  ASSERT_TRUE(cri_.exit_container(id, 1).ok());  // died before kpleg confirmed the start
  kernel_exec(id);
  kernel_exit(id, 1);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
}

TEST_F(TrackerTest, OomKillNamesTheReason) {
  auto id = create("hog");
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel_exec(id);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  ASSERT_TRUE(cri_.exit_container(id, 137, "").ok());
  kernel_oom(id);
  kernel_exit(id, 0, /*oom_killed=*/true);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(sink_.events().back().reason, "OOMKilled");
}

// oom:mark_victim names the cgroup of the task whose allocation failed: another container of
// the pod under a pod-level limit, or a child of this one whose death does not end it. Only
// the init's own exit says whether the OOM killer ended the container.
TEST_F(TrackerTest, AnOomKillInTheCgroupThatDidNotKillTheInitDoesNotNameTheDeath) {
  auto id = started("survivor");
  kernel_oom(id);  // a child was OOM-killed; the container lives on
  ASSERT_TRUE(cri_.exit_container(id, 3, "").ok());
  kernel_exit(id, 3);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(sink_.events().back().reason, "");
  EXPECT_EQ(sink_.events().back().exit_code, 3);
}

TEST_F(TrackerTest, SandboxIsConfirmedThroughPodSandboxStatus) {
  kernel_exec(sandbox_);
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted"}));
  EXPECT_TRUE(sink_.events()[0].sandbox);
  ASSERT_TRUE(cri_.stop_pod_sandbox(sandbox_).ok());
  kernel_exit(sandbox_, 0);
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied"}));
  ASSERT_TRUE(cri_.remove_pod_sandbox(sandbox_).ok());
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
}

TEST_F(TrackerTest, InitialSyncThenCorrectionsAreCounted) {
  auto running = create("running");
  auto missed = create("missed");
  ASSERT_TRUE(cri_.start_container(running).ok());
  ASSERT_TRUE(cri_.start_container(missed).ok());
  Reconciler rec(cri_, *tracker_, 1h);
  ASSERT_TRUE(rec.start().ok());
  ASSERT_TRUE(wait_types(running, {"ContainerStarted"}));
  ASSERT_TRUE(wait_types(missed, {"ContainerStarted"}));
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u) << "the start-up sync is no correction";

  // A reconcile with nothing missed corrects nothing.
  rec.request("test");
  ASSERT_TRUE(eventually([&] { return rec.stats().runs >= 2; }));
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);

  // An exit the kernel path never reported: the next reconcile corrects it, marked as such.
  ASSERT_TRUE(cri_.exit_container(missed, 2).ok());
  rec.request("test");
  ASSERT_TRUE(wait_types(missed, {"ContainerStarted", "ContainerDied"}));
  auto evs = sink_.events();
  EXPECT_TRUE(evs.back().correction);
  EXPECT_EQ(evs.back().source, EventSource::kReconcile);
  EXPECT_EQ(evs.back().exit_code, 2);
  EXPECT_EQ(tracker_->stats().corrections.at("ContainerDied"), 1u);
  rec.stop();
}

TEST_F(TrackerTest, RunningContainerThatVanishesGivesDiedThenRemoved) {
  auto id = started("gone");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.stop_container(id, 0).ok());
  ASSERT_TRUE(cri_.remove_container(id).ok());
  kernel_exit(id, 0);  // by the time the exit is confirmed, the container is gone
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
}

TEST_F(TrackerTest, FailingCallsNameThePodUntilItAnswersAgain) {
  auto id = create("stuck");
  ASSERT_TRUE(cri_.start_container(id).ok());
  cri_.fail_always(cri::CriMethod::kContainerStatus,
                   Error{grpc::StatusCode::DEADLINE_EXCEEDED, "CRI ContainerStatus failed: DEADLINE_EXCEEDED"});
  kernel_exec(id);
  ASSERT_TRUE(eventually([&] { return !tracker_->troubled_pods().empty(); }));
  auto troubles = tracker_->troubled_pods();
  ASSERT_EQ(troubles.size(), 1u);
  EXPECT_EQ(troubles[0].pod_uid, kUid);
  EXPECT_NE(troubles[0].last_error.find("DEADLINE_EXCEEDED"), std::string::npos);
  EXPECT_TRUE(sink_.events().empty()) << "nothing the runtime did not confirm";

  cri_.fail_always(cri::CriMethod::kContainerStatus, std::nullopt);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_TRUE(tracker_->troubled_pods().empty());
}

TEST_F(TrackerTest, UnknownCgroupAsksForAReconcile) {
  std::string reason;
  tracker_->set_inconsistency_handler([&](const std::string& r) { reason = r; });
  kernel::KernelEvent ev;
  ev.body = kernel::ProcessExec{424242, 1, 1, 1, "x", "/x"};
  tracker_->on_kernel_event(ev);
  // Taken on the tracker's loop; stats() is answered there after it.
  EXPECT_EQ(tracker_->stats().unresolved_signals, 1u);
  EXPECT_NE(reason.find("unknown cgroup"), std::string::npos);
}

// A workload can make such signals frequent (execs in a cgroup no pod owns): they are all
// counted and each still asks for a reconcile, but the warning, written on the tracker's loop,
// is one line, not one per signal.
TEST_F(TrackerTest, AStormOfSignalsForUnknownCgroupsWritesOneWarning) {
  auto lines = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*lines);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  int requests = 0;
  tracker_->set_inconsistency_handler([&](const std::string&) { ++requests; });
  for (int i = 0; i < 1000; ++i) {
    kernel::KernelEvent ev;
    ev.body = kernel::ProcessExec{uint64_t(500000 + i), 1, 1, 1, "x", "/x"};
    tracker_->on_kernel_event(ev);
  }
  const auto st = tracker_->stats();  // answered on the loop once the signals were taken
  spdlog::set_default_logger(previous);
  EXPECT_EQ(requests, 1000);
  EXPECT_EQ(st.unresolved_signals, 1000u);
  const std::string text = lines->str();
  size_t warnings = 0;
  for (size_t at = 0; (at = text.find("unknown cgroup", at)) != std::string::npos; ++at) ++warnings;
  EXPECT_EQ(warnings, 1u) << text;
}

// Every later exec or exit in a cgroup the index cannot resolve is a signal for an unknown
// cgroup: one reconcile for it, not one per signal (a workload's exec loop there).
TEST_F(TrackerTest, RepeatedSignalsOfOneUnknownCgroupAskForOneReconcile) {
  int requests = 0;
  tracker_->set_inconsistency_handler([&](const std::string&) { ++requests; });
  for (int i = 0; i < 1000; ++i) {
    kernel::KernelEvent ev;
    ev.body = kernel::ProcessExec{777001, uint32_t(1000 + i), 1, 1, "x", "/x"};
    tracker_->on_kernel_event(ev);
  }
  // Taken on the tracker's loop; stats() is answered there after them.
  EXPECT_EQ(tracker_->stats().unresolved_signals, 1000u);
  EXPECT_EQ(tracker_->stats().unresolved_repeats, 999u);
  EXPECT_EQ(requests, 1);
  // Its rmdir forgets it: a new cgroup that reuses the id asks again.
  kernel_rmdir(777001);
  kernel::KernelEvent ev;
  ev.body = kernel::ProcessExec{777001, 1, 1, 1, "x", "/x"};
  tracker_->on_kernel_event(ev);
  EXPECT_EQ(tracker_->stats().unresolved_signals, 1001u);
  EXPECT_EQ(requests, 2);
}

// A lost mkdir record: the kernel tracks the container's cgroup, the index never heard of it.
// Its exec is resolved from its parent (the kernel's record) and is the container's start: no
// reconcile, no lost start.
TEST_F(TrackerTest, TheExecOfACgroupWhoseMkdirWasLostIsResolvedAndCostsNoReconcile) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "kpleg-tracker-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string pod = "/kubepods/burstable/pod" + kUid;
  fs::create_directories(tmpl + pod);
  ASSERT_TRUE(index_.seed(tmpl).ok());
  auto ino = [&](const std::string& rel) {
    struct stat st {};
    EXPECT_EQ(::stat((tmpl + rel).c_str(), &st), 0);
    return uint64_t(st.st_ino);
  };
  // The container, made and started in the runtime; its cgroup's mkdir record was lost.
  v1::ContainerConfig c;
  c.mutable_metadata()->set_name("lost");
  (*c.mutable_labels())["io.kubernetes.pod.uid"] = kUid;
  (*c.mutable_labels())["io.kubernetes.container.name"] = "lost";
  auto id = *cri_.create_container(sandbox_, c, sandbox_cfg_);
  ASSERT_TRUE(cri_.start_container(id).ok());
  fs::create_directories(tmpl + pod + "/" + id);
  const uint64_t cgroup = ino(pod + "/" + id);
  const uint64_t pod_cgroup = ino(pod);
  tracker_->set_cgroup_parents([&](uint64_t child) -> std::optional<uint64_t> {
    if (child == cgroup) return pod_cgroup;
    return std::nullopt;
  });
  int requests = 0;
  tracker_->set_inconsistency_handler([&](const std::string&) { ++requests; });
  kernel::KernelEvent ev;
  ev.ktime_ns = 1;
  ev.body = kernel::ProcessExec{cgroup, 100, 100, 1, "sh", "/bin/sh"};
  tracker_->on_kernel_event(ev);
  EXPECT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_EQ(requests, 0);
  EXPECT_EQ(tracker_->stats().resolved_cgroups, 1u);
  EXPECT_EQ(index_.find_container(id), cgroup);
  std::error_code ec;
  fs::remove_all(tmpl, ec);
}

// Requests for a reconcile are coalesced and spaced: a storm of them (a workload's cgroup
// loop, repeated losses) relists the node at most once per spacing, not back to back.
TEST_F(TrackerTest, ReconcileRequestsAreSpacedAndCoalesced) {
  Reconciler rec(cri_, *tracker_, 1h, 200ms);
  ASSERT_TRUE(rec.start().ok());
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t asked = 0;
  while (std::chrono::steady_clock::now() - t0 < 1s) {
    rec.request("storm");
    ++asked;
    std::this_thread::sleep_for(1ms);
  }
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(eventually([&] { return rec.stats().requested == asked; }));
  const auto runs = rec.stats().runs;
  rec.stop();
  // The start-up run, then one per 200 ms of the storm (and the one still due at its end).
  const auto spaced = uint64_t(elapsed / 200ms) + 2;
  EXPECT_LE(runs, spaced + 1) << asked << " requests";
  EXPECT_GE(runs, 3u) << "requests must still be served";
  EXPECT_GE(rec.stats().coalesced + runs + 1, asked);
}

// Polls f until it holds or 5 s pass.
TEST_F(TrackerTest, AContainerTheRuntimeDoesNotKnowIsForeignNotAnInconsistency) {
  TrackerOptions o;
  o.foreign_after = 100ms;
  restart_tracker(o);
  const std::string foreign = unknown_container('f');  // another runtime made it
  kernel_exec(foreign);
  ASSERT_TRUE(eventually([&] { return tracker_->stats().foreign_containers == 1; }))
      << "the unknown container was never given up on";
  EXPECT_EQ(inconsistencies_.load(), 0) << "a foreign container must not cost a full relist";
  EXPECT_EQ(tracker_->stats().confirm_failures, 0u);

  // Its later signals cost no CRI call and give no event.
  const auto calls = cri_.calls(cri::CriMethod::kContainerStatus);
  kernel_exit(foreign, 0);
  kernel_rmdir(cgroup_of(foreign));
  EXPECT_EQ(tracker_->stats().foreign_signals, 2u);
  // A confirmation would be queued, not made at once: give it the time it would take.
  EXPECT_FALSE(eventually(
      [&] { return cri_.calls(cri::CriMethod::kContainerStatus) != calls; }, 300ms))
      << "a foreign container's signal cost a status call";
  EXPECT_TRUE(tracker_->containers().empty());

  // This pod's own containers are unaffected.
  started("app");
  EXPECT_FALSE(HasFailure());
  EXPECT_EQ(inconsistencies_.load(), 0);
}

// Hole: the foreign rule counted its time from the kernel's signal, so a runtime unreachable for
// longer than foreign_after had every container it was still making (a sandbox whose network
// was being set up) called another runtime's at its first answer. It counts from that answer.
TEST_F(TrackerTest, TheForeignRuleCountsFromTheRuntimesFirstAnswerNotFromTheSignal) {
  TrackerOptions o;
  o.foreign_after = 300ms;
  restart_tracker(o);
  const Error down{grpc::StatusCode::UNAVAILABLE, "connection refused"};
  cri_.fail_always(cri::CriMethod::kContainerStatus, down);
  cri_.fail_always(cri::CriMethod::kPodSandboxStatus, down);
  const std::string unknown = unknown_container('c');
  kernel_exec(unknown);
  // Past foreign_after without an answer: nothing is judged yet.
  EXPECT_FALSE(eventually([&] { return tracker_->stats().foreign_containers > 0; }, 500ms));
  const auto answering = std::chrono::steady_clock::now();
  cri_.fail_always(cri::CriMethod::kContainerStatus, std::nullopt);
  cri_.fail_always(cri::CriMethod::kPodSandboxStatus, std::nullopt);
  ASSERT_TRUE(eventually([&] { return tracker_->stats().foreign_containers == 1; }, 5s))
      << "never given up on";
  EXPECT_GE(std::chrono::steady_clock::now() - answering, o.foreign_after)
      << "called foreign at the runtime's first answer";
}

TEST_F(TrackerTest, AnUnknownContainerThatAlreadyDiedEndsItsStartConfirmationQuietly) {
  TrackerOptions o;
  o.confirm_budget = 300ms;  // without the fix, the start's confirmation gives up after this
  o.foreign_after = 10s;
  restart_tracker(o);
  const std::string gone = unknown_container('d');
  kernel_exec(gone);
  kernel_exit(gone, 0);  // the death is confirmed (not found: gone before it was ever known)
  // Without the fix the start's confirmation retries every few ms until its budget runs out
  // and then asks for a reconcile: wait past the budget for that.
  EXPECT_FALSE(eventually([&] { return inconsistencies_.load() > 0; }, o.confirm_budget * 3));
  EXPECT_LE(tracker_->stats().confirm_retries, 3u) << "the start's confirmation kept retrying";
  EXPECT_TRUE(sink_.events().empty());
}

TEST_F(TrackerTest, RemovedContainersAreForgottenAfterTheRetentionButAStaleListCannotRevive) {
  auto initial = list_runtime(cri_);
  ASSERT_TRUE(initial.ok());
  tracker_->reconcile(*initial, /*initial=*/true);  // the sandbox
  auto id = started_and_exited("app");
  auto stale = list_runtime(cri_);  // taken while the container still exists
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(cri_.remove_container(id).ok());
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  const size_t events = sink_.events().size();

  // Within the retention, a list from before the removal changes nothing.
  tracker_->reconcile(*stale, /*initial=*/false);
  EXPECT_FALSE(sink_.wait_count(events + 1, 200ms)) << "a stale list revived a removed container";
  EXPECT_EQ(tracker_->stats().records, 2u) << "the sandbox and the removed container";

  // With a zero retention, the next reconcile forgets the removed container: memory follows
  // the live containers, not every container ever seen.
  TrackerOptions o;
  o.removed_retention = 0ms;
  restart_with_fast_removal(o);
  auto id2 = started_and_exited("app2");
  ASSERT_TRUE(cri_.remove_container(id2).ok());
  ASSERT_TRUE(wait_types(id2, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_EQ(tracker_->stats().records, 2u) << "the sandbox and the removed container";
  auto view = list_runtime(cri_);
  ASSERT_TRUE(view.ok());
  tracker_->reconcile(*view, /*initial=*/false);
  EXPECT_EQ(tracker_->stats().records, 1u) << "only the sandbox is left";
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

TEST_F(TrackerTest, AReconcileThatSeesAnExitedContainerGoneIsNoCorrection) {
  // Removal sweeps far off: only the reconcile can bring the removal to light in this test.
  TrackerOptions o;
  o.removal_sweep_first = 1h;
  o.removal_sweep_period = 1h;
  o.correction_grace = 10ms;
  restart_and_sync(o);
  auto id = started_and_exited("job");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(id).ok());
  const auto status_calls = cri_.calls(cri::CriMethod::kContainerStatus);

  auto view = list_runtime(cri_);
  ASSERT_TRUE(view.ok());
  tracker_->reconcile(*view, /*initial=*/false);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  auto removed = sink_.events().back();
  EXPECT_FALSE(removed.correction);
  EXPECT_EQ(removed.source, EventSource::kKernel);
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
  EXPECT_EQ(cri_.calls(cri::CriMethod::kContainerStatus), status_calls + 1) << "one look";
  EXPECT_EQ(inconsistencies_.load(), 0);

  // A running container that vanished is still a correction (the kernel path owed its death).
  auto lost = started("lost");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.stop_container(lost, 0).ok());
  ASSERT_TRUE(cri_.remove_container(lost).ok());
  view = list_runtime(cri_);
  ASSERT_TRUE(view.ok());
  tracker_->reconcile(*view, /*initial=*/false);
  ASSERT_TRUE(wait_types(lost, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_TRUE(sink_.events().back().correction);
  EXPECT_EQ(tracker_->stats().corrections.at("ContainerRemoved"), 1u);
}

TEST_F(TrackerTest, LongExitedContainersAreWatchedByOneListCallNotACallEach) {
  TrackerOptions o;
  o.removal_sweep_first = 10ms;
  o.removal_sweep_period = 20ms;
  o.removal_sweep_idle_max = 30ms;
  restart_and_sync(o);

  constexpr int kExited = 20;
  std::vector<std::string> ids;
  for (int i = 0; i < kExited; ++i) {
    auto id = create("init-" + std::to_string(i));
    ASSERT_TRUE(cri_.start_container(id).ok());
    kernel_exec(id);
    ASSERT_TRUE(cri_.exit_container(id, 0).ok());
    kernel_exit(id, 0);
    ids.push_back(id);
  }
  for (const auto& id : ids) ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  ASSERT_TRUE(eventually([&] { return tracker_->stats().removal_sweeps >= 2; }));
  EXPECT_EQ(tracker_->stats().removal_checks, 0u) << "a removal look per container";

  // While they stay exited: the sweep's list calls, no call per container.
  const auto status_calls = cri_.calls(cri::CriMethod::kContainerStatus);
  const auto lists = cri_.calls(cri::CriMethod::kListContainers);
  const auto sweeps = tracker_->stats().removal_sweeps;
  ASSERT_TRUE(eventually([&] { return tracker_->stats().removal_sweeps >= sweeps + 5; }));
  EXPECT_EQ(cri_.calls(cri::CriMethod::kContainerStatus), status_calls);
  EXPECT_GE(cri_.calls(cri::CriMethod::kListContainers), lists + 5);

  // A removal is seen by the next sweep; the others stay.
  ASSERT_TRUE(cri_.remove_container(ids[3]).ok());
  ASSERT_TRUE(wait_types(ids[3], {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_EQ(sink_.types_for(ids[4]).size(), 2u);

  // The sandbox too, through ListPodSandbox.
  ASSERT_TRUE(cri_.stop_pod_sandbox(sandbox_).ok());
  kernel_exit(sandbox_, 0);
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied"}));
  ASSERT_TRUE(eventually([&] { return cri_.calls(cri::CriMethod::kListPodSandbox) >= 3; }));
  for (const auto& id : ids) (void)cri_.remove_container(id);
  ASSERT_TRUE(cri_.remove_pod_sandbox(sandbox_).ok());
  for (const auto& id : ids)
    EXPECT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"})) << id;
  EXPECT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));

  // Nothing left to watch: the sweep stops.
  const auto final_sweeps = tracker_->stats().removal_sweeps;
  EXPECT_FALSE(eventually([&] { return tracker_->stats().removal_sweeps > final_sweeps + 1; },
                          300ms));
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
  EXPECT_EQ(inconsistencies_.load(), 0);
}

// Hole: the kernel source runs before the start-up sync, so a container can be created and
// confirmed after the sync's list was taken; missing from that list, it must not be declared
// dead and removed.
TEST_F(TrackerTest, AStartUpListTakenBeforeAContainerWasMadeDoesNotKillIt) {
  restart_tracker({});
  auto before = list_runtime(cri_);  // the sync's list, taken first
  ASSERT_TRUE(before.ok());
  auto id = started("late");  // made, started and confirmed through the kernel path meanwhile
  ASSERT_FALSE(HasFailure());
  const auto looks = cri_.calls(cri::CriMethod::kContainerStatus);
  tracker_->reconcile(*before, /*initial=*/true);
  // The miss makes a targeted look; the runtime says running: nothing to emit.
  ASSERT_TRUE(eventually([&] { return cri_.calls(cri::CriMethod::kContainerStatus) > looks; }));
  EXPECT_FALSE(sink_.wait_count(sink_.events().size() + 1, 200ms));
  EXPECT_EQ(sink_.types_for(id), std::vector<std::string>{"ContainerStarted"});
  ASSERT_EQ(tracker_->containers().size(), 2u);  // the sandbox and the container, running
  EXPECT_EQ(inconsistencies_.load(), 0);
}

// Hole: containers found exited at start-up got Died with exit code 0 and no timestamps.
TEST_F(TrackerTest, TheStartUpSyncCarriesTheRuntimesStatusOfExitedContainers) {
  auto id = create("done");
  ASSERT_TRUE(cri_.start_container(id).ok());
  ASSERT_TRUE(cri_.exit_container(id, 3, "Error").ok());
  restart_tracker({});
  auto view = list_runtime(cri_);
  ASSERT_TRUE(view.ok());
  tracker_->reconcile(*view, /*initial=*/true);
  ASSERT_TRUE(wait_types(id, {"ContainerDied"}));
  auto died = sink_.events().back();
  EXPECT_EQ(died.exit_code, 3);
  EXPECT_EQ(died.reason, "Error");
  EXPECT_GT(died.status.started_at_ns, 0);
  EXPECT_GT(died.status.finished_at_ns, 0);
  EXPECT_EQ(died.source, EventSource::kReconcile);
  EXPECT_FALSE(died.correction);
  bool listed = false;
  for (const auto& c : tracker_->containers()) {
    if (c.id != id) continue;
    listed = true;
    EXPECT_EQ(c.snapshot.exit_code, 3) << "List shows the runtime's exit code";
  }
  EXPECT_TRUE(listed);
}

// Hole: containerd reloads a container whose status it cannot read as CONTAINER_UNKNOWN; it
// drops out of a list filtered by EXITED, but it still exists.
TEST_F(TrackerTest, AnExitedContainerTheRuntimeReloadsAsUnknownIsNotRemoved) {
  auto id = started_and_exited("job");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.set_unknown(id).ok());
  const auto sweeps = tracker_->stats().removal_sweeps;
  ASSERT_TRUE(eventually([&] { return tracker_->stats().removal_sweeps >= sweeps + 3; }));
  EXPECT_EQ(sink_.types_for(id), (std::vector<std::string>{"ContainerStarted", "ContainerDied"}))
      << "a sweep took a container that still exists for removed";
  // Removed for real: seen.
  ASSERT_TRUE(cri_.remove_container(id).ok());
  EXPECT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
}

// A runtime that answered nothing for a while (a frozen containerd) recovers with a backlog: a
// container it then starts, stops and removes within a second or two was gone before its
// chain's next try (backing off up to 10 s), and a container the runtime never reported is
// reported to no one. The runtime's first answer after the silence sends the waiting looks.
TEST_F(TrackerTest, LooksThatGotNoAnswerGoAtOnceWhenTheRuntimeAnswersAgain) {
  TrackerOptions o;
  o.confirm_budget = 50ms;
  restart_tracker(o);
  auto stuck = create("stuck");
  ASSERT_TRUE(cri_.start_container(stuck).ok());
  cri_.fail_always(cri::CriMethod::kContainerStatus,
                   Error{grpc::StatusCode::DEADLINE_EXCEEDED, "CRI ContainerStatus failed: DEADLINE_EXCEEDED"});
  kernel_exec(stuck);
  // Past its budget its looks back off: 0.5, 1, 2 s ... apart. After the third of those the next
  // is 2 s or more away.
  ASSERT_TRUE(eventually([&] { return tracker_->stats().confirm_retries >= 8; }, 10s));
  cri_.fail_always(cri::CriMethod::kContainerStatus, std::nullopt);
  auto fresh = create("fresh");
  ASSERT_TRUE(cri_.start_container(fresh).ok());
  kernel_exec(fresh);
  ASSERT_TRUE(wait_types(fresh, {"ContainerStarted"}));
  EXPECT_TRUE(wait_types(stuck, {"ContainerStarted"}, 500ms))
      << "the waiting look did not go when the runtime answered again";
}

// Hole: a confirmation still unsettled after its budget was dropped (a slow StartContainer, a
// stalled shim); nothing looked again before the next reconcile.
TEST_F(TrackerTest, AConfirmationPastItsBudgetKeepsLooking) {
  TrackerOptions o;
  o.confirm_budget = 50ms;
  restart_tracker(o);
  auto id = create("slow-start");
  kernel_exec(id);  // the runtime says CREATED for longer than the budget
  ASSERT_TRUE(eventually([&] { return tracker_->stats().confirm_failures == 1; }));
  ASSERT_TRUE(cri_.start_container(id).ok());
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_EQ(sink_.events().back().source, EventSource::kKernel);
  EXPECT_EQ(inconsistencies_.load(), 0) << "it kept looking instead of asking for a relist";
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

// Hole: kplegd seeded a container's cgroup while runc was still setting it up, took one of
// runc's setup processes for the init, and saw it exit; the real init's exec was then no news to
// the kernel program. The exit's looks found the container running and waited for a death only:
// its start was never reported.
TEST_F(TrackerTest, AnExitsLookThatFindsTheContainerRunningReportsItsStart) {
  auto id = create("seeded-while-set-up");
  kernel_exit(id, 0);  // a setup process taken for the init; the runtime says CREATED
  EXPECT_FALSE(sink_.wait_count(1, 50ms)) << "an event for a state the runtime does not report";
  ASSERT_TRUE(cri_.start_container(id).ok());  // no exec signal follows
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_EQ(sink_.events().back().source, EventSource::kKernel);
  // Its death still comes, from the cgroup's rmdir.
  ASSERT_TRUE(cri_.exit_container(id, 2).ok());
  kernel_rmdir(cgroup_of(id));
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(sink_.events().back().exit_code, 2);
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

// The same for a sandbox: its setup process exits before RunPodSandbox put it in the runtime's
// store (containerd 1.6 adds it last). Not found is not yet, not gone: it was reported dead
// before it was known, so its start never was.
TEST_F(TrackerTest, AnExitOfASandboxNotMadeYetWaitsForItAndReportsItsStart) {
  const grpc::StatusCode kNotFound = grpc::StatusCode::NOT_FOUND;
  cri_.fail_next(cri::CriMethod::kPodSandboxStatus, Error{kNotFound, "not found"});
  cri_.fail_next(cri::CriMethod::kContainerStatus, Error{kNotFound, "not found"});
  kernel_exit(sandbox_, 0);  // no exec: the real init's exec was no news to the program
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted"}));
  EXPECT_TRUE(sink_.events()[0].sandbox);
  EXPECT_EQ(tracker_->stats().foreign_containers, 0u);
}

// ... and a cgroup rmdir (the init is gone for sure) makes an overdue exit confirmation look now.
TEST_F(TrackerTest, ACgroupRmdirConfirmsAnOverdueDeathAtOnce) {
  TrackerOptions o;
  o.confirm_budget = 20ms;
  restart_tracker(o);
  auto id = started("stalled-shim");
  ASSERT_FALSE(HasFailure());
  kernel_exit(id, 0);  // the runtime keeps saying RUNNING (its shim is stopped)
  // Past the budget and a few backed-off looks: the next one is seconds away.
  ASSERT_TRUE(eventually([&] { return tracker_->stats().confirm_failures == 1; }));
  const auto retries = tracker_->stats().confirm_retries;
  // Looks after the budget wait 0.5, 1, 2 s: after the third, the next is 2 s away.
  ASSERT_TRUE(eventually([&] { return tracker_->stats().confirm_retries >= retries + 3; }));
  ASSERT_TRUE(cri_.exit_container(id, 0).ok());
  const auto t0 = std::chrono::steady_clock::now();
  kernel_rmdir(cgroup_of(id));
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "the rmdir did not make it look now";
}

// The runtime records a death after it removed the container's cgroup (runc delete), at a
// steadier time after the rmdir than after the exit: the rmdir starts the death's looks anew
// instead of leaving them to the exit's chain, whatever step that chain is at.
void TrackerTest::rmdir_takes_over_the_looks_for_a_death() {
  TrackerOptions o;
  o.confirm_retry_first = 3s;  // a missed look waits long: the rmdir must not wait for it
  restart_tracker(o);
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel_exec(id);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  kernel_exit(id, 0);  // the runtime still says RUNNING: the exit's first look misses
  ASSERT_TRUE(eventually([&] { return tracker_->stats().confirm_retries == 1; }));
  const auto calls = cri_.calls(cri::CriMethod::kContainerStatus);
  ASSERT_TRUE(cri_.exit_container(id, 0).ok());
  const auto t0 = std::chrono::steady_clock::now();
  kernel_rmdir(cgroup_of(id));
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "the rmdir waited for the exit's retry";
  EXPECT_EQ(cri_.calls(cri::CriMethod::kContainerStatus), calls + 1);
  // The exit's queued retry, pointless now, was dropped rather than left to wake a worker.
  EXPECT_EQ(tracker_->stats().looks_dropped, 1u);
}

TEST_F(TrackerTest, TheCgroupRmdirTakesOverTheLooksForADeath) {
  rmdir_takes_over_the_looks_for_a_death();
}

// The same where the cgroup path names no pod: the exit's first look was queued under the
// container's id and its retry under the pod the runtime named; the rmdir drops it all the same.
TEST_F(TrackerTest, TheCgroupRmdirTakesOverTheLooksForADeathOfAContainerOfNoKnownPod) {
  flat_paths_ = true;
  rmdir_takes_over_the_looks_for_a_death();
}

// A pod's first exec is its sandbox's: looked up with PodSandboxStatus at once, not after a
// ContainerStatus that answers NOT_FOUND.
TEST_F(TrackerTest, ASandboxStartCostsOneCall) {
  restart_tracker({});
  kernel_exec(sandbox_);
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted"}));
  EXPECT_EQ(cri_.calls(cri::CriMethod::kContainerStatus), 0u);
  EXPECT_EQ(cri_.calls(cri::CriMethod::kPodSandboxStatus), 1u);
  // With the sandbox known running, the pod's next id is looked up as a container first.
  auto id = started("app");
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(cri_.calls(cri::CriMethod::kPodSandboxStatus), 1u);
}

// Hole: a cgroup nested in a container's (docker-in-docker, systemd in a container) made every
// first exec or exit in it a full reconcile. It belongs to its container and costs nothing; the
// container's own death is still seen when its init moved into the child (the rmdir).
TEST_F(TrackerTest, NestedCgroupsCostNothingAndTheContainersDeathIsStillSeen) {
  restart_tracker({});
  auto id = started("dind");
  ASSERT_FALSE(HasFailure());
  auto total_calls = [&] { return cri_.call_stats().total(); };
  const auto calls = total_calls();
  std::vector<uint64_t> nested;
  for (int i = 0; i < 100; ++i) {
    const uint64_t child = 7'000'000 + i;
    kernel::KernelEvent mk;
    mk.body = kernel::CgroupMkdir{child, i == 0 ? cgroup_of(id) : nested.back(), 0,
                                  path_of(id) + "/sub" + std::to_string(i)};
    tracker_->on_kernel_event(mk);
    nested.push_back(child);
    kernel::KernelEvent ex;
    ex.body = kernel::ProcessExec{child, 200, 200, 100, "sh", "/bin/sh"};
    tracker_->on_kernel_event(ex);
    kernel::KernelEvent xt;
    xt.body = kernel::ProcessExit{child, 200, 0, 0, false};
    tracker_->on_kernel_event(xt);
  }
  EXPECT_EQ(inconsistencies_.load(), 0) << "a nested cgroup asked for a full reconcile";
  EXPECT_EQ(tracker_->stats().unresolved_signals, 0u);
  EXPECT_FALSE(eventually([&] { return total_calls() != calls; }, 300ms))
      << "a nested cgroup's exec or exit cost a runtime call";
  EXPECT_EQ(sink_.types_for(id), std::vector<std::string>{"ContainerStarted"});

  // The init had moved into a child: its exit is not the container cgroup's. The container's
  // rmdir, after its children's, confirms the death.
  ASSERT_TRUE(cri_.exit_container(id, 1).ok());
  for (auto it = nested.rbegin(); it != nested.rend(); ++it) {
    kernel_rmdir(*it);
  }
  kernel_rmdir(cgroup_of(id));
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(sink_.events().back().exit_code, 1);
  EXPECT_EQ(inconsistencies_.load(), 0);
}

// A look-alike of a real container's cgroup (.../kubepods/pod<uid>/<id> made later in a user's
// delegated subtree): its execs and exits cost no runtime call and no reconcile, and the real
// container's death is still reported from its own cgroup.
TEST_F(TrackerTest, ALookAlikeCgroupOfARealContainerIsIgnoredForFree) {
  restart_tracker({});
  auto id = started("app");
  ASSERT_FALSE(HasFailure());
  const uint64_t spoof = ~uint64_t(0) - 7;  // made later: a larger cgroup id
  ASSERT_GT(spoof, cgroup_of(id));
  index_.on_mkdir(spoof, "/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod" +
                             kUid + "/" + id);
  auto total_calls = [&] { return cri_.call_stats().total(); };
  const auto calls = total_calls();
  for (int i = 0; i < 50; ++i) {
    kernel::KernelEvent ex;
    ex.body = kernel::ProcessExec{spoof, 300, 300, 1, "sh", "/bin/sh"};
    tracker_->on_kernel_event(ex);
    kernel::KernelEvent xt;
    xt.body = kernel::ProcessExit{spoof, 300, 1, 0, false};
    tracker_->on_kernel_event(xt);
  }
  EXPECT_FALSE(eventually([&] { return total_calls() != calls; }, 300ms))
      << "a look-alike's signal cost a runtime call";
  EXPECT_EQ(inconsistencies_.load(), 0);
  EXPECT_EQ(tracker_->stats().lookalike_signals, 100u);
  EXPECT_EQ(sink_.types_for(id), std::vector<std::string>{"ContainerStarted"});
  // The real one dies: reported, from its own cgroup.
  ASSERT_TRUE(cri_.exit_container(id, 2).ok());
  kernel_exit(id, 2);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  kernel_rmdir(spoof);
}

// Long-exited containers only (nothing dies, nothing goes): the sweep backs off to its idle
// maximum instead of listing every period forever; a new death brings it back.
TEST_F(TrackerTest, QuietRemovalSweepsBackOffAndADeathBringsThemBack) {
  TrackerOptions o;
  o.removal_sweep_first = 10ms;
  o.removal_sweep_period = 10ms;
  o.removal_sweep_idle_max = 400ms;
  restart_tracker(o);
  started_and_exited("init");
  ASSERT_FALSE(HasFailure());
  // 10, 20, 40, ... 320, 400 ms: the seventh quiet sweep is about 1.3 s in.
  ASSERT_TRUE(eventually([&] { return tracker_->stats().removal_sweeps >= 7; }));
  const auto quiet = tracker_->stats().removal_sweeps;
  EXPECT_FALSE(eventually([&] { return tracker_->stats().removal_sweeps > quiet + 3; }, 1s))
      << "a quiet sweep kept its period (100 a second) instead of backing off";
  // A death: the next sweep within the period, and it sees the removal.
  auto job = started_and_exited("job");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(job).ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_types(job, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 300ms);
}

// --- the kernel's removal hint ---------------------------------------------------------------

// The BPF map of armed ids, in memory.
class FakeRemovalHints : public RemovalHints {
 public:
  Arm watch(const std::string& id) override {
    std::lock_guard lk(mu_);
    ++watches_[id];
    if (gone_on_watch_) return Arm::kGone;
    armed_.insert(id);
    return Arm::kArmed;
  }
  // From now on every id armed has been removed already (its directory went unarmed).
  void gone_on_watch() {
    std::lock_guard lk(mu_);
    gone_on_watch_ = true;
  }
  void unwatch(const std::string& id) override {
    std::lock_guard lk(mu_);
    armed_.erase(id);
    ++unwatches_[id];
  }
  int unwatches(const std::string& id) const {
    std::lock_guard lk(mu_);
    auto it = unwatches_.find(id);
    return it == unwatches_.end() ? 0 : it->second;
  }
  bool armed(const std::string& id) const {
    std::lock_guard lk(mu_);
    return armed_.count(id) > 0;
  }
  // The source sees `id` removed: true (and disarmed) when armed, as inotify's watch hints it.
  bool fire(const std::string& id) {
    std::lock_guard lk(mu_);
    return armed_.erase(id) > 0;
  }
  int watches(const std::string& id) const {
    std::lock_guard lk(mu_);
    auto it = watches_.find(id);
    return it == watches_.end() ? 0 : it->second;
  }
  void set_paused(bool paused) override {
    std::lock_guard lk(mu_);
    paused_ = paused;
  }
  bool paused() const {
    std::lock_guard lk(mu_);
    return paused_;
  }

 private:
  mutable std::mutex mu_;
  bool paused_ = false;
  std::set<std::string> armed_;
  std::map<std::string, int> watches_, unwatches_;
  bool gone_on_watch_ = false;
};

class RemovalHintTrackerTest : public TrackerTest {
 protected:
  // Sweeps every 20 ms while hints are not trusted, every `with_hints` once they are.
  void restart_with_hints(std::chrono::milliseconds with_hints, bool trusted = false,
                          bool after_removal = false) {
    TrackerOptions o;
    o.removal_sweep_first = 10ms;
    o.removal_sweep_period = sweep_period_;
    o.removal_sweep_idle_max = sweep_period_;
    o.removal_hint_delay = hint_delay_;
    o.removal_dir_hint_delay = dir_hint_delay_;
    o.removal_sweep_with_hints = with_hints;
    o.removal_event_grace = 100ms;
    restart_tracker(o);
    tracker_->set_removal_hints(&hints_, trusted, after_removal);
    auto view = list_runtime(cri_);
    ASSERT_TRUE(view.ok());
    tracker_->reconcile(*view, /*initial=*/true);
  }
  void kernel_hint(const std::string& id) {
    kernel::KernelEvent ev;
    ev.body = kernel::RemovalHint{id};
    tracker_->on_kernel_event(ev);
  }
  // An exited container removed by the runtime with the kernel's hint; returns once reported.
  void removed_with_hint(const std::string& id) {
    ASSERT_TRUE(cri_.remove_container(id).ok());
    kernel_hint(id);
    ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  }
  size_t sweeps() const { return tracker_->stats().removal_sweeps; }

  FakeRemovalHints hints_;
  std::chrono::milliseconds hint_delay_ = 20ms;
  std::chrono::milliseconds dir_hint_delay_ = 20ms;
  std::chrono::milliseconds sweep_period_ = 20ms;
};

// inotify's hint comes once the runtime's directory is gone: its sweep goes
// removal_dir_hint_delay after it, not removal_hint_delay (for the kernel's hint, which comes
// at the rmdir's entry); a hinted container the runtime still lists is looked for again
// removal_hint_delay later.
TEST_F(RemovalHintTrackerTest, AHintThatComesAfterTheRemovalIsSweptForSooner) {
  hint_delay_ = 1500ms;
  dir_hint_delay_ = 20ms;
  restart_with_hints(1h, /*trusted=*/true, /*after_removal=*/true);
  auto gone = started_and_exited("gone");
  ASSERT_FALSE(HasFailure());
  const auto quiet = sweeps();
  const auto t0 = std::chrono::steady_clock::now();
  removed_with_hint(gone);
  ASSERT_FALSE(HasFailure());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "swept for removal_hint_delay after";
  EXPECT_EQ(sweeps(), quiet + 1);

  // Hinted while the runtime still lists it (it removes the directory, then forgets the id):
  // the first sweep finds it, the next one, removal_hint_delay later, reports its removal.
  auto late = started_and_exited("late");
  ASSERT_FALSE(HasFailure());
  const auto before = sweeps();
  kernel_hint(late);
  ASSERT_TRUE(eventually([&] { return sweeps() == before + 1; }, 1s));
  EXPECT_TRUE(hints_.armed(late)) << "armed again when still there";
  ASSERT_TRUE(cri_.remove_container(late).ok());
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_types(late, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_GE(std::chrono::steady_clock::now() - t1, 1000ms) << "looked for again too soon";
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

// The runtime may remove a container's directory before its death is confirmed (a
// RemoveContainer right after StopContainer): the hint came before the id was armed, and arming
// says so. That is its hint: swept for soon, and the hints stay trusted.
TEST_F(RemovalHintTrackerTest, ARemovalSeenBeforeItsIdWasArmedIsItsHint) {
  dir_hint_delay_ = 200ms;
  restart_with_hints(1h, /*trusted=*/true, /*after_removal=*/true);
  hints_.gone_on_watch();
  auto early = started_and_exited("early");
  ASSERT_FALSE(HasFailure());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(cri_.remove_container(early).ok());
  ASSERT_TRUE(wait_types(early, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 3s))
      << "no sweep came for a removal seen before its id was armed";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  const auto st = tracker_->stats();
  EXPECT_EQ(st.removal_hints, 1u);
  EXPECT_EQ(st.removal_hints_missed, 0u);
  EXPECT_TRUE(st.removal_hints_trusted);
  EXPECT_EQ(st.corrections_total(), 0u);
}

// inotify's watch holds hints back for a while after a read: a sweep brought by one hint may
// find another removal first. That id stays armed at the source until its hint comes (or its
// grace is over), so the hint still comes and counts: the hints stay trusted.
TEST_F(RemovalHintTrackerTest, ARemovalSweptForBeforeItsHeldBackHintStaysArmedForIt) {
  restart_with_hints(1h, /*trusted=*/true, /*after_removal=*/true);
  auto a = started_and_exited("a");
  auto b = started_and_exited("b");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(a).ok());
  ASSERT_TRUE(cri_.remove_container(b).ok());
  ASSERT_TRUE(hints_.fire(a));
  kernel_hint(a);  // b's hint is held back
  ASSERT_TRUE(wait_types(a, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 3s));
  ASSERT_TRUE(wait_types(b, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 3s));
  EXPECT_TRUE(hints_.armed(b)) << "disarmed while its hint may still come";
  EXPECT_EQ(hints_.unwatches(b), 0);
  ASSERT_TRUE(hints_.fire(b));
  kernel_hint(b);
  // Then disarmed at the source (the kernel's map keeps a fired entry until then).
  EXPECT_TRUE(eventually([&] { return hints_.unwatches(b) == 1; }, 1s));
  // Judged a grace (100 ms here) after the sweep that found it: not a miss.
  EXPECT_FALSE(eventually([&] { return tracker_->stats().removal_hints_missed > 0; }, 500ms));
  EXPECT_TRUE(tracker_->stats().removal_hints_trusted);
  EXPECT_EQ(tracker_->stats().removal_hints, 2u);
}

// Under churn hints come one after another: they share sweeps, one a removal_sweep_period at
// most, as the sweep runs without hints while containers die and go.
TEST_F(RemovalHintTrackerTest, HintsThatComeOneAfterAnotherShareASweepAPeriod) {
  dir_hint_delay_ = 20ms;
  sweep_period_ = 800ms;
  restart_with_hints(1h, /*trusted=*/true, /*after_removal=*/true);
  auto a = started_and_exited("a");
  auto b = started_and_exited("b");
  ASSERT_FALSE(HasFailure());
  const auto quiet = sweeps();
  removed_with_hint(a);  // swept for at once: no sweep for a while
  ASSERT_FALSE(HasFailure());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(sweeps(), quiet + 1);
  removed_with_hint(b);  // the next sweep a period after the last
  ASSERT_FALSE(HasFailure());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 600ms) << "a sweep per hint";
  EXPECT_EQ(sweeps(), quiet + 2);
}

TEST_F(RemovalHintTrackerTest, OnceAHintedRemovalIsFoundTheHintStandsForThePeriodicSweep) {
  restart_with_hints(1h);
  auto first = started_and_exited("first");
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(hints_.armed(first)) << "an exited container is armed in the kernel";
  // Not trusted yet: swept for as without hints.
  const auto before = sweeps();
  ASSERT_TRUE(eventually([&] { return sweeps() >= before + 3; }, 2s));
  EXPECT_FALSE(tracker_->stats().removal_hints_trusted);

  removed_with_hint(first);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(tracker_->stats().removal_hints_trusted);
  EXPECT_FALSE(hints_.armed(first)) << "a removed container is forgotten in the kernel";
  EXPECT_EQ(tracker_->stats().removal_hints, 1u);

  // Trusted: a long-exited container costs no sweep while nothing is hinted...
  auto second = started_and_exited("second");
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(hints_.armed(second));
  const auto quiet = sweeps();
  EXPECT_FALSE(eventually([&] { return sweeps() > quiet; }, 500ms))
      << "a hinted removal is swept for without its hint";
  // ...and its hint brings one.
  const auto t0 = std::chrono::steady_clock::now();
  removed_with_hint(second);
  ASSERT_FALSE(HasFailure());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(sweeps(), quiet + 1);
  EXPECT_EQ(tracker_->stats().removal_hints_missed, 0u);
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

// containerd and CRI-O keep a directory per container: their hints stand for the sweep from
// the start, so a daemon started on a quiet node with exited containers sweeps for none.
TEST_F(RemovalHintTrackerTest, HintsTrustedFromTheStartCostNoSweepBeforeTheFirstRemoval) {
  restart_with_hints(1h, /*trusted=*/true);
  ASSERT_TRUE(tracker_->stats().removal_hints_trusted);
  auto kept = started_and_exited("kept");
  ASSERT_FALSE(HasFailure());
  const auto quiet = sweeps();
  EXPECT_FALSE(eventually([&] { return sweeps() > quiet; }, 500ms));
  removed_with_hint(kept);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(sweeps(), quiet + 1);
}

TEST_F(RemovalHintTrackerTest, ARemovalTheKernelDidNotHintMakesTheSweepRunAsWithoutIt) {
  restart_with_hints(300ms);
  auto first = started_and_exited("first");
  ASSERT_FALSE(HasFailure());
  removed_with_hint(first);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(tracker_->stats().removal_hints_trusted);

  // Removed without a hint (a runtime that keeps no directory by that name): the sweep kept
  // behind the hint finds it, and the hints are not trusted any more.
  auto second = started_and_exited("second");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(second).ok());
  ASSERT_TRUE(wait_types(second, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 3s));
  ASSERT_TRUE(eventually([&] { return !tracker_->stats().removal_hints_trusted; }, 2s));
  EXPECT_EQ(tracker_->stats().removal_hints_missed, 1u);
  EXPECT_FALSE(hints_.armed(second)) << "disarmed at the source once its hint is given up";

  // The next exited container is swept for every period again.
  auto third = started_and_exited("third");
  ASSERT_FALSE(HasFailure());
  const auto before = sweeps();
  EXPECT_TRUE(eventually([&] { return sweeps() >= before + 3; }, 250ms));
}

// containerd removes a container's directories before it forgets the container: a sweep right
// after the hint still lists it. The id is armed again and looked for again soon, and its
// removal, found without a second hint, counts as hinted.
TEST_F(RemovalHintTrackerTest, AHintBeforeTheRuntimeForgetsTheContainerIsLookedAtAgainSoon) {
  restart_with_hints(1h);
  auto first = started_and_exited("first");
  ASSERT_FALSE(HasFailure());
  removed_with_hint(first);
  ASSERT_FALSE(HasFailure());

  auto second = started_and_exited("second");
  ASSERT_FALSE(HasFailure());
  const auto before = sweeps();
  kernel_hint(second);  // still there
  ASSERT_TRUE(eventually([&] { return sweeps() > before; }, 2s));
  ASSERT_TRUE(eventually([&] { return hints_.watches(second) == 2; }, 2s)) << "not armed again";
  EXPECT_EQ(sink_.types_for(second).size(), 2u);
  ASSERT_TRUE(cri_.remove_container(second).ok());
  ASSERT_TRUE(wait_types(second, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 1s))
      << "the removal waited for the sweep kept behind the hint";
  EXPECT_TRUE(tracker_->stats().removal_hints_trusted);
  EXPECT_EQ(tracker_->stats().removal_hints_missed, 0u);

  // A hint for a container that stays (its directory went for another reason): a few looks,
  // then no more, and it is armed again.
  auto third = started_and_exited("third");
  ASSERT_FALSE(HasFailure());
  const auto quiet = sweeps();
  kernel_hint(third);
  ASSERT_TRUE(eventually([&] { return sweeps() >= quiet + 3; }, 2s));
  const auto after = sweeps();
  EXPECT_FALSE(eventually([&] { return sweeps() > after; }, 300ms))
      << "a container that stays after its hint is swept for again and again";
  EXPECT_EQ(sweeps(), quiet + 3);
  EXPECT_TRUE(hints_.armed(third));
  EXPECT_EQ(sink_.types_for(third).size(), 2u);

  // A hint for an id the tracker does not watch is forgotten in the kernel.
  hints_.watch(std::string(64, 'e'));
  kernel_hint(std::string(64, 'e'));
  (void)tracker_->stats();  // the hint is taken on the tracker's loop before this is answered
  EXPECT_FALSE(hints_.armed(std::string(64, 'e')));
}

// --- the runtime's event stream (GetContainerEvents) as the confirmation ---------------------

class RuntimeEventsTrackerTest : public TrackerTest {
 protected:
  // A tracker whose looks, while the stream is live, wait `grace` for the runtime's event.
  void restart_with_events(std::chrono::milliseconds grace, TrackerOptions o = {}) {
    o.runtime_event_grace = grace;
    o.runtime_event_check = 10ms;
    o.removal_sweep_first = 20ms;
    o.removal_sweep_period = 20ms;
    o.removal_sweep_idle_max = 20ms;
    restart_and_sync(o);
    // Any event makes the stream live: here the sandbox's, which the sync already reported.
    tracker_->on_runtime_event(event(sandbox_, v1::CONTAINER_STARTED_EVENT));
    ASSERT_TRUE(tracker_->stats().runtime_events_live);
  }
  // The same, for the removal sweep's trust in the stream's DELETED events: the sweep kept for
  // a lost event runs every `sweep`, and a removal it finds waits `grace` for its DELETED.
  void restart_for_removals(std::chrono::milliseconds sweep, std::chrono::milliseconds grace) {
    TrackerOptions o;
    o.removal_sweep_with_events = sweep;
    o.removal_event_grace = grace;
    restart_with_events(5s, o);
  }
  // The event containerd 2.x sends for `id`: the pod's sandbox status and the container's
  // current status (read from the fake runtime now, before a test counts calls).
  v1::ContainerEventResponse event(const std::string& id, v1::ContainerEventType type) {
    v1::ContainerEventResponse ev;
    ev.set_container_id(id);
    ev.set_container_event_type(type);
    *ev.mutable_pod_sandbox_status() = *cri_.pod_sandbox_status(sandbox_);
    ++own_calls_;
    if (id != sandbox_ && type != v1::CONTAINER_DELETED_EVENT) {
      *ev.add_containers_statuses() = *cri_.container_status(id);
      ++own_calls_;
    }
    return ev;
  }
  // A container started and exited with the runtime's events confirming both (no look).
  std::string died_with_events(const std::string& name) {
    auto id = create(name);
    EXPECT_TRUE(cri_.start_container(id).ok());
    auto started_ev = event(id, v1::CONTAINER_STARTED_EVENT);
    kernel_exec(id);
    tracker_->on_runtime_event(started_ev);
    EXPECT_TRUE(cri_.exit_container(id, 0).ok());
    auto stopped_ev = event(id, v1::CONTAINER_STOPPED_EVENT);
    kernel_exit(id, 0);
    kernel_rmdir(cgroup_of(id));
    tracker_->on_runtime_event(stopped_ev);
    EXPECT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
    return id;
  }
  // The pod's sandbox stopped, its STOPPED event confirming the death.
  void sandbox_died_with_event() {
    ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted"}));
    ASSERT_TRUE(cri_.stop_pod_sandbox(sandbox_).ok());
    auto stopped_ev = event(sandbox_, v1::CONTAINER_STOPPED_EVENT);
    kernel_exit(sandbox_, 0);
    tracker_->on_runtime_event(stopped_ev);
    ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied"}));
  }
  // Another sandbox of the pod starts, dies and goes, the runtime's events reporting each: the
  // stream has then reported a sandbox's removal (with trusted hints set, they pause).
  void another_sandbox_comes_and_goes() {
    const std::string other = *cri_.run_pod_sandbox(sandbox_cfg_);
    index_.on_mkdir(cgroup_of(other), path_of(other));
    auto sandbox_event = [&](v1::ContainerEventType type) {
      v1::ContainerEventResponse ev;
      ev.set_container_id(other);
      ev.set_container_event_type(type);
      *ev.mutable_pod_sandbox_status() = *cri_.pod_sandbox_status(other);
      return ev;
    };
    auto started_ev = sandbox_event(v1::CONTAINER_STARTED_EVENT);
    kernel_exec(other);
    tracker_->on_runtime_event(started_ev);
    ASSERT_TRUE(wait_types(other, {"ContainerStarted"}));
    ASSERT_TRUE(cri_.stop_pod_sandbox(other).ok());
    auto stopped_ev = sandbox_event(v1::CONTAINER_STOPPED_EVENT);
    kernel_exit(other, 0);
    tracker_->on_runtime_event(stopped_ev);
    ASSERT_TRUE(wait_types(other, {"ContainerStarted", "ContainerDied"}));
    auto deleted_ev = sandbox_event(v1::CONTAINER_DELETED_EVENT);
    ASSERT_TRUE(cri_.remove_pod_sandbox(other).ok());
    tracker_->on_runtime_event(deleted_ev);
    ASSERT_TRUE(wait_types(other, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  }
  // A container whose start the runtime's STARTED event confirmed; `before`: the tracker's
  // calls before its exec.
  std::string started_with_event(const std::string& name, uint64_t& before) {
    auto id = create(name);
    EXPECT_TRUE(cri_.start_container(id).ok());
    auto started_ev = event(id, v1::CONTAINER_STARTED_EVENT);
    before = calls();
    kernel_exec(id);
    tracker_->on_runtime_event(started_ev);
    EXPECT_TRUE(wait_types(id, {"ContainerStarted"}));
    return id;
  }
  // The tracker's calls (not event()'s).
  uint64_t calls() {
    return cri_.calls(cri::CriMethod::kContainerStatus) +
           cri_.calls(cri::CriMethod::kPodSandboxStatus) +
           cri_.calls(cri::CriMethod::kListContainers) +
           cri_.calls(cri::CriMethod::kListPodSandbox) - own_calls_;
  }
  uint64_t own_calls_ = 0;
};

// The check for overdue events (a look for a signal whose event is late) is a timer of the
// loop; once the events settled every signal that waited, it would wake the loop for nothing.
TEST_F(RuntimeEventsTrackerTest, AnEventThatSettlesTheLastAwaitedSignalSparesTheLoopItsCheck) {
  restart_with_events(200ms);
  uint64_t before = 0;
  auto id = started_with_event("app", before);
  ASSERT_FALSE(HasFailure());
  (void)tracker_->stats();  // on the loop: what the event left behind is set by now
  const auto wakeups = tracker_->loop_wakeups();
  // Past the check's due time (the learned first look + the 200 ms grace).
  EXPECT_FALSE(eventually([&] { return tracker_->loop_wakeups() != wakeups; }, 600ms))
      << "the loop woke for a check with nothing to check";
  EXPECT_EQ(calls(), before) << "a look for a signal its event had settled";
}

// The lags the records wait for (set_wake_after) are learned from when the runtime sent its
// events, not from when they were read: read later (the stream held, a record that waited for
// its wake timer), they would teach a longer wait, and that wait a longer one still. An rmdir
// wakes the loop at once while the stream is live.
TEST_F(RuntimeEventsTrackerTest, TheLagsAreLearnedFromWhenTheRuntimeSentItsEvents) {
  restart_with_events(5s);
  std::mutex mu;
  std::pair<std::chrono::milliseconds, std::chrono::milliseconds> last{-1ms, -1ms};
  tracker_->set_wake_after([&](std::chrono::milliseconds exec, std::chrono::milliseconds rmdir) {
    std::lock_guard lk(mu);
    last = {exec, rmdir};
  });
  auto realtime_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  };
  for (int i = 0; i < 12; ++i) {
    auto id = create("app-" + std::to_string(i));
    ASSERT_TRUE(cri_.start_container(id).ok());
    kernel_exec(id);
    // Sent 1 ms after the exec, read 60 ms after it.
    auto started_ev = event(id, v1::CONTAINER_STARTED_EVENT);
    started_ev.set_created_at(realtime_ns() + 1'000'000);
    std::this_thread::sleep_for(60ms);  // the reading's delay under test, not a synchronisation
    tracker_->on_runtime_event(started_ev);
    ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
    ASSERT_TRUE(cri_.exit_container(id, 0).ok());
    kernel_exit(id, 0);
    kernel_rmdir(cgroup_of(id));
    auto stopped_ev = event(id, v1::CONTAINER_STOPPED_EVENT);
    stopped_ev.set_created_at(realtime_ns() + 1'000'000);
    std::this_thread::sleep_for(60ms);
    tracker_->on_runtime_event(stopped_ev);
    ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  }
  std::lock_guard lk(mu);
  EXPECT_LE(last.first, 10ms) << "the exec's lag learned from the reading";
  EXPECT_EQ(last.second, 0ms) << "an rmdir waits while the stream is live (it ends its hold)";
}

// With the stream live, a container's whole lifecycle (start, death, removal) is confirmed by
// the runtime's events: no CRI call, and the events carry what a look would have said.
TEST_F(RuntimeEventsTrackerTest, ALifecycleConfirmedByTheRuntimesEventsCostsNoCall) {
  restart_with_events(5s);
  uint64_t before = 0;
  auto id = started_with_event("app", before);
  ASSERT_FALSE(HasFailure());

  ASSERT_TRUE(cri_.exit_container(id, 3).ok());
  auto stopped_ev = event(id, v1::CONTAINER_STOPPED_EVENT);
  ASSERT_TRUE(cri_.remove_container(id).ok());
  auto deleted_ev = event(id, v1::CONTAINER_DELETED_EVENT);
  kernel_exit(id, 3);
  kernel_rmdir(cgroup_of(id));
  tracker_->on_runtime_event(stopped_ev);
  tracker_->on_runtime_event(deleted_ev);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));

  EXPECT_EQ(calls(), before) << "an event confirmed by a look or a sweep";
  auto evs = sink_.events();
  ASSERT_GE(evs.size(), 3u);
  const auto& died = evs[evs.size() - 2];
  EXPECT_EQ(died.exit_code, 3);
  EXPECT_EQ(died.pod_name, "web");
  EXPECT_EQ(died.container_name, "app");
  EXPECT_EQ(died.source, EventSource::kKernel);
  EXPECT_EQ(tracker_->stats().runtime_event_confirmations, 3u);
  EXPECT_EQ(tracker_->stats().runtime_events_late, 0u);
}

// While the stream's DELETED events report removals, a removal hint (inotify's, armed for every
// exited container) brings no sweep: the event reports the removal; a sweep per second of
// churn was one more wakeup of the loop, and a list call, for nothing.
TEST_F(RuntimeEventsTrackerTest, AHintBringsNoSweepWhileTheStreamReportsRemovals) {
  restart_for_removals(10s, 100ms);
  FakeRemovalHints hints;
  tracker_->set_removal_hints(&hints, /*trusted=*/true, /*after_removal=*/true);
  auto id = died_with_events("app");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(eventually([&] { return hints.armed(id); }));
  const auto lists = cri_.calls(cri::CriMethod::kListContainers);
  ASSERT_TRUE(cri_.remove_container(id).ok());
  auto deleted_ev = event(id, v1::CONTAINER_DELETED_EVENT);
  tracker_->on_removal_hint(id);
  // The hint's sweep would go 100 ms after it.
  EXPECT_FALSE(eventually([&] { return cri_.calls(cri::CriMethod::kListContainers) > lists; },
                          400ms))
      << "the hint brought a sweep";
  tracker_->on_runtime_event(deleted_ev);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_EQ(tracker_->stats().removal_hints, 1u);
  tracker_->set_removal_hints(nullptr);
}

// While the stream reports the removals of containers and of sandboxes, the removal hints'
// source is paused (under churn its reads woke the loop for nothing); it reads again once the
// stream stops.
TEST_F(RuntimeEventsTrackerTest, TheHintsArePausedWhileTheStreamReportsEveryRemoval) {
  restart_for_removals(10s, 100ms);
  FakeRemovalHints hints;
  tracker_->set_removal_hints(&hints, /*trusted=*/true, /*after_removal=*/true);
  EXPECT_FALSE(eventually([&] { return hints.paused(); }, 200ms))
      << "paused before the stream reported a sandbox's removal";
  sandbox_died_with_event();
  ASSERT_FALSE(HasFailure());
  auto deleted_ev = event(sandbox_, v1::CONTAINER_DELETED_EVENT);  // its status, while it is there
  ASSERT_TRUE(cri_.remove_pod_sandbox(sandbox_).ok());
  tracker_->on_runtime_event(deleted_ev);
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  EXPECT_TRUE(eventually([&] { return hints.paused(); }))
      << "read on while the stream reports every removal";
  tracker_->runtime_events_stopped();
  EXPECT_TRUE(eventually([&] { return !hints.paused(); })) << "still paused after the stream stopped";
  tracker_->set_removal_hints(nullptr);
}

// The hints paused for the stream come back when the stream turns out to leave a removal out:
// from then on it stands for no removal, and the hints are read at once again.
TEST_F(RuntimeEventsTrackerTest, TheHintsResumeWhenTheStreamLeavesARemovalOut) {
  restart_for_removals(3s, 100ms);
  FakeRemovalHints hints;
  tracker_->set_removal_hints(&hints, /*trusted=*/true, /*after_removal=*/true);
  auto left_out = died_with_events("left-out");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(left_out).ok());  // and no DELETED event
  another_sandbox_comes_and_goes();
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(eventually([&] { return hints.paused(); })) << "not paused for the stream";
  // The sweep kept for a lost event finds the container's removal; no DELETED comes.
  ASSERT_TRUE(wait_types(left_out, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 10s));
  ASSERT_TRUE(eventually([&] { return tracker_->stats().runtime_events_missed_removals == 1; }, 2s));
  EXPECT_TRUE(eventually([&] { return !hints.paused(); }, 2s))
      << "still paused after the stream left a removal out";
  tracker_->set_removal_hints(nullptr);
}

// Hole: with the hints trusted, an exited container's sweep waits removal_sweep_with_hints (5
// minutes by default) for its hint; paused, the hints cannot come, and a DELETED the stream lost
// was found only that late. While paused, its sweep is the one kept for a lost event.
TEST_F(RuntimeEventsTrackerTest, WhileTheHintsArePausedAnExitedContainersSweepIsTheOneForALostEvent) {
  restart_for_removals(2s, 100ms);
  FakeRemovalHints hints;
  tracker_->set_removal_hints(&hints, /*trusted=*/true, /*after_removal=*/true);
  auto exited = died_with_events("exited");
  ASSERT_FALSE(HasFailure());
  another_sandbox_comes_and_goes();  // the hints pause
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(eventually([&] { return hints.paused(); })) << "not paused for the stream";
  // A sweep while the container is still there; then it goes, and its DELETED is lost.
  const auto sweeps = tracker_->stats().removal_sweeps;
  ASSERT_TRUE(eventually([&] { return tracker_->stats().removal_sweeps > sweeps; }, 5s))
      << "no sweep for the exited container within the one kept for a lost event";
  ASSERT_TRUE(cri_.remove_container(exited).ok());
  EXPECT_TRUE(wait_types(exited, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 5s))
      << "its sweep waited as for a hint that cannot come";
  tracker_->set_removal_hints(nullptr);
}

// Hole: a runtime whose stream leaves removals out (CRI-O sends no DELETED for the containers a
// RemovePodSandbox takes with it) had every such removal reported only by the rare sweep kept for
// a lost event (30 s by default). The first one such a sweep finds, with no DELETED after it,
// makes the sweep run as without the stream: the next removal is found within its period.
TEST_F(RuntimeEventsTrackerTest, AStreamThatLeavesRemovalsOutIsFoundOutAndSweptForAsWithoutIt) {
  restart_for_removals(3s, 100ms);
  auto first = died_with_events("first");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(first).ok());  // and no DELETED event
  ASSERT_TRUE(wait_types(first, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 10s))
      << "the sweep kept for a lost event did not find the removal";
  ASSERT_TRUE(eventually([&] { return !tracker_->stats().runtime_events_cover_removals; }, 2s))
      << "a removal the stream never reported did not count against it";
  EXPECT_EQ(tracker_->stats().runtime_events_missed_removals, 1u);
  EXPECT_TRUE(tracker_->stats().runtime_events_live) << "the stream still confirms the rest";

  auto second = died_with_events("second");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(second).ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_types(second, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms)
      << "the second removal waited for the sweep kept for a lost event (3 s)";

  // A new stream is trusted anew.
  tracker_->runtime_events_stopped();
  tracker_->on_runtime_event(event(sandbox_, v1::CONTAINER_STARTED_EVENT));
  EXPECT_TRUE(tracker_->stats().runtime_events_cover_removals);
}

// Hole: CRI-O reports no sandbox's removal at all. With sandbox removals trusted to the stream
// like containers', the first pod removed on such a runtime waited for the sweep kept for a lost
// event (30 s by default) before it could even count as a miss. Until the stream has reported a
// sandbox's removal, sandboxes are swept for as without it; that is no miss of the stream.
TEST_F(RuntimeEventsTrackerTest, ASandboxsRemovalIsSweptForUntilTheStreamHasReportedOne) {
  restart_for_removals(3s, 100ms);
  sandbox_died_with_event();
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_pod_sandbox(sandbox_).ok());  // and no DELETED event
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_types(sandbox_, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms)
      << "the sandbox's removal waited for the sweep kept for a lost event (3 s)";
  EXPECT_FALSE(eventually([&] { return tracker_->stats().runtime_events_missed_removals > 0; },
                          500ms))
      << "a sandbox removal the stream was not trusted with counted as its miss";
  EXPECT_TRUE(tracker_->stats().runtime_events_cover_removals);
}

// A DELETED that comes just after the sweep found the removal (the sweep's list raced the event)
// is no miss: the stream keeps standing for the sweep.
TEST_F(RuntimeEventsTrackerTest, ADeletedEventJustAfterTheSweepFoundTheRemovalIsNoMiss) {
  restart_for_removals(100ms, 300ms);
  auto id = died_with_events("app");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(cri_.remove_container(id).ok());
  auto deleted_ev = event(id, v1::CONTAINER_DELETED_EVENT);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  tracker_->on_runtime_event(deleted_ev);  // late, within the grace
  EXPECT_FALSE(eventually([&] { return tracker_->stats().runtime_events_missed_removals > 0; }, 1s))
      << "a DELETED that came after the sweep counted as a miss";
  EXPECT_TRUE(tracker_->stats().runtime_events_cover_removals);
}

// The stream and the kernel's records are read on different threads: a container's STARTED
// event can be taken before the exec signal that makes its record. It is kept for that
// signal, which it then confirms at once: no look, and no wait for the grace.
TEST_F(RuntimeEventsTrackerTest, AnEventTakenBeforeTheSignalThatMakesTheRecordConfirmsIt) {
  restart_with_events(60s);
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  auto started_ev = event(id, v1::CONTAINER_STARTED_EVENT);
  const auto before = calls();
  const auto unmatched = tracker_->stats().runtime_events_unmatched;
  tracker_->on_runtime_event(started_ev);
  EXPECT_EQ(tracker_->stats().runtime_events_unmatched, unmatched + 1);
  EXPECT_TRUE(sink_.types_for(id).empty()) << "an event alone made the container";
  kernel_exec(id);
  // Within wait_types' 5 s: with a 60 s grace, anything but the early event takes a minute.
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_EQ(calls(), before);
  EXPECT_EQ(tracker_->stats().runtime_events_early, 1u);
  const auto evs = sink_.events();
  EXPECT_EQ(evs.back().container_name, "app");
  EXPECT_EQ(evs.back().source, EventSource::kKernel);

  // Its death, with the STOPPED event before the exit signal, goes as before: the record is
  // there now.
  ASSERT_TRUE(cri_.exit_container(id, 7).ok());
  tracker_->on_runtime_event(event(id, v1::CONTAINER_STOPPED_EVENT));
  kernel_exit(id, 7);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  EXPECT_EQ(sink_.events().back().exit_code, 7);
  EXPECT_EQ(calls(), before);
  EXPECT_EQ(tracker_->stats().runtime_events_early, 1u);
}

// An early event that does not settle the signal's chain (the sandbox's DELETED for a
// container it never started, say) changes nothing: the signal waits for its event as usual.
TEST_F(RuntimeEventsTrackerTest, AnEarlyEventThatSaysNothingNewIsNotTaken) {
  restart_with_events(60s);
  auto id = create("app");
  tracker_->on_runtime_event(event(id, v1::CONTAINER_CREATED_EVENT));
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel_exec(id);
  EXPECT_FALSE(eventually([&] { return !sink_.types_for(id).empty(); }, 200ms))
      << "a CREATED event started the container";
  EXPECT_EQ(tracker_->stats().runtime_events_early, 0u);
  tracker_->on_runtime_event(event(id, v1::CONTAINER_STARTED_EVENT));
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
}

// An event that does not come (lost, or later than the grace) is covered by the look the
// signal would have had; the stream is not trusted again until its next event, and the late
// event changes nothing.
TEST_F(RuntimeEventsTrackerTest, ALateEventIsCoveredByALook) {
  restart_with_events(30ms);
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  auto late = event(id, v1::CONTAINER_STARTED_EVENT);
  const auto before = calls();
  kernel_exec(id);
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_GT(calls(), before);
  EXPECT_EQ(tracker_->stats().runtime_events_late, 1u);
  EXPECT_FALSE(tracker_->stats().runtime_events_live);
  tracker_->on_runtime_event(late);
  EXPECT_TRUE(tracker_->stats().runtime_events_live);
  EXPECT_FALSE(eventually([&] { return sink_.types_for(id).size() > 1; }, 200ms));
}

// When the stream ends, a signal that waits for its event is looked at at once, not after the
// grace.
TEST_F(RuntimeEventsTrackerTest, WhenTheStreamStopsTheAwaitedSignalsAreLookedAt) {
  restart_with_events(60s);
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel_exec(id);
  EXPECT_FALSE(eventually([&] { return !sink_.types_for(id).empty(); }, 200ms))
      << "looked before the event's grace";
  tracker_->runtime_events_stopped();
  ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
  EXPECT_FALSE(tracker_->stats().runtime_events_live);
}

// The stream begins with a backlog of old events, and names containers the kernel path never
// signalled: they make no event (a removed container's STARTED must not start it again).
TEST_F(RuntimeEventsTrackerTest, EventsForContainersTheKernelNeverSignalledMakeNoEvent) {
  restart_with_events(5s);
  auto id = create("elsewhere");
  ASSERT_TRUE(cri_.start_container(id).ok());
  auto started_ev = event(id, v1::CONTAINER_STARTED_EVENT);
  ASSERT_TRUE(cri_.exit_container(id, 0).ok());
  auto stopped_ev = event(id, v1::CONTAINER_STOPPED_EVENT);
  const auto events_before = sink_.events().size();
  tracker_->on_runtime_event(started_ev);
  tracker_->on_runtime_event(stopped_ev);
  tracker_->on_runtime_event(event(id, v1::CONTAINER_DELETED_EVENT));
  EXPECT_EQ(sink_.events().size(), events_before);
  EXPECT_GE(tracker_->stats().runtime_events_unmatched, 3u);

  // A removed container's old STARTED, from the backlog, does not bring it back.
  auto gone = create("gone");
  ASSERT_TRUE(cri_.start_container(gone).ok());
  kernel_exec(gone);
  tracker_->on_runtime_event(event(gone, v1::CONTAINER_STARTED_EVENT));
  ASSERT_TRUE(cri_.exit_container(gone, 0).ok());
  kernel_exit(gone, 0);
  tracker_->on_runtime_event(event(gone, v1::CONTAINER_STOPPED_EVENT));
  ASSERT_TRUE(cri_.remove_container(gone).ok());
  tracker_->on_runtime_event(event(gone, v1::CONTAINER_DELETED_EVENT));
  ASSERT_TRUE(wait_types(gone, {"ContainerStarted", "ContainerDied", "ContainerRemoved"}));
  v1::ContainerEventResponse old;
  old.set_container_id(gone);
  old.set_container_event_type(v1::CONTAINER_STARTED_EVENT);
  *old.mutable_pod_sandbox_status() = *cri_.pod_sandbox_status(sandbox_);
  auto* st = old.add_containers_statuses();
  st->set_id(gone);
  st->set_state(v1::CONTAINER_RUNNING);
  tracker_->on_runtime_event(old);
  EXPECT_FALSE(eventually([&] { return sink_.types_for(gone).size() > 3; }, 100ms));
}

}  // namespace
// A death brings the init's exit and, on containerd, the cgroup's rmdir before the runtime
// records it. Once the rmdirs keep coming while their exit's chain still waits for a look, the
// tracker switches the exit's wakeup off (the BPF program's exit_wakes); an exit read late but
// with its rmdir keeps it off; the first exit whose own look goes switches it on again.
TEST_F(TrackerTest, ExitsStopWakingOnceTheRmdirAlwaysComesFirstAndWakeAgainWhenOneComesAlone) {
  restart_tracker({});
  std::mutex mu;
  std::vector<bool> switched;
  tracker_->set_exit_wakeup([&](bool wake) {
    std::lock_guard lk(mu);
    switched.push_back(wake);
  });
  auto switches = [&] {
    std::lock_guard lk(mu);
    return switched;
  };
  auto now_ktime = [] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
  };
  // The runtime records each death 20 ms after the rmdir (containerd deletes the task first):
  // the exit's learned first look comes after the rmdir, which takes the death over.
  auto death_with_rmdir = [&](const std::string& name, uint64_t ktime) {
    auto id = started(name);
    kernel_exit(id, 0, false, ktime);
    kernel_rmdir(cgroup_of(id));
    std::this_thread::sleep_for(20ms);  // the runtime's lag, not a synchronisation
    ASSERT_TRUE(cri_.exit_container(id, 0).ok());
    ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  };
  int i = 0;
  for (; i < 60 && tracker_->stats().exit_wakes; ++i) {
    death_with_rmdir("app-" + std::to_string(i), now_ktime());
    ASSERT_FALSE(HasFailure());
  }
  EXPECT_FALSE(tracker_->stats().exit_wakes) << "still waking after " << i << " deaths";
  EXPECT_GE(i, ExitWakeup::kWindow);
  EXPECT_EQ(switches(), std::vector<bool>{false});
  EXPECT_EQ(tracker_->stats().exit_wakeups_off, 1u);

  // An exit read 5 s after it happened, with its rmdir (a slow delete): still no look of its own.
  death_with_rmdir("slow", now_ktime() - 5'000'000'000u);
  EXPECT_FALSE(tracker_->stats().exit_wakes);

  // An exit without its rmdir: its own first look goes, and exits wake again.
  auto alone = started("alone");
  ASSERT_TRUE(cri_.exit_container(alone, 0).ok());
  kernel_exit(alone, 0, false, now_ktime());
  ASSERT_TRUE(wait_types(alone, {"ContainerStarted", "ContainerDied"}));
  EXPECT_TRUE(tracker_->stats().exit_wakes);
  EXPECT_EQ(switches(), (std::vector<bool>{false, true}));
  EXPECT_EQ(tracker_->stats().exit_wakeups_restored, 1u);
  EXPECT_EQ(tracker_->stats().corrections_total(), 0u);
}

// The kernel side holds an exec's and an rmdir's record back until the loop would act on it
// (kpleg.bpf.c: the wake timer): the tracker hands it the lags it learned for their first looks,
// at once and whenever they change.
TEST_F(TrackerTest, TheLearnedLagsAreHandedOnAsTheRecordsWakeAfter) {
  restart_tracker({});
  std::mutex mu;
  std::vector<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> set;
  tracker_->set_wake_after([&](std::chrono::milliseconds exec, std::chrono::milliseconds rmdir) {
    std::lock_guard lk(mu);
    set.emplace_back(exec, rmdir);
  });
  auto last = [&] {
    std::lock_guard lk(mu);
    return set.empty() ? std::make_pair(-1ms, -1ms) : set.back();
  };
  EXPECT_EQ(last(), std::make_pair(0ms, 0ms)) << "nothing learned: at once";
  // The runtime reports each start 20 ms after the kernel's exec, and each death 20 ms after
  // the cgroup's rmdir.
  for (int i = 0; i < 10; ++i) {
    auto id = create("app-" + std::to_string(i));
    kernel_exec(id);
    std::this_thread::sleep_for(20ms);  // the runtime's lag, not a synchronisation
    ASSERT_TRUE(cri_.start_container(id).ok());
    ASSERT_TRUE(wait_types(id, {"ContainerStarted"}));
    kernel_exit(id, 0);
    kernel_rmdir(cgroup_of(id));
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(cri_.exit_container(id, 0).ok());
    ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  }
  const auto [exec, rmdir] = last();
  EXPECT_GE(exec, 10ms);
  EXPECT_LE(exec, 100ms);
  EXPECT_GE(rmdir, 10ms);
  EXPECT_LE(rmdir, 100ms);
  std::lock_guard lk(mu);
  for (size_t i = 1; i < set.size(); ++i)
    EXPECT_NE(set[i], set[i - 1]) << "handed on only when it changed";
}

// Without a switch (relist fallback, a kernel source that cannot), nothing is learned.
TEST_F(TrackerTest, ExitsAlwaysWakeWithoutASwitch) {
  restart_tracker({});
  for (int i = 0; i < 20; ++i) {
    auto id = started("app-" + std::to_string(i));
    kernel_exit(id, 0);
    kernel_rmdir(cgroup_of(id));
    ASSERT_TRUE(cri_.exit_container(id, 0).ok());
    ASSERT_TRUE(wait_types(id, {"ContainerStarted", "ContainerDied"}));
  }
  EXPECT_TRUE(tracker_->stats().exit_wakes);
  EXPECT_EQ(tracker_->stats().exit_wakeups_off, 0u);
}

}  // namespace kpleg::pleg

namespace kpleg::pleg {
namespace {

// A consumer that reads the tracker from inside publish() (an API server answering List as an
// event goes out): the events are published after the state lock is released, so it neither
// deadlocks nor sees a state behind the event it was handed.
class ReadingSink : public EventSink {
 public:
  Tracker* tracker = nullptr;
  void publish(PodLifecycleEvent ev) override {
    ContainerState listed = ContainerState::kNonExistent;
    for (const auto& c : tracker->containers())
      if (c.id == ev.container_id) listed = c.state;
    std::lock_guard lk(mu_);
    seen_.emplace_back(to_string(ev.type), listed);
    cv_.notify_all();
  }
  bool wait_count(size_t n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 5s, [&] { return seen_.size() >= n; });
  }
  std::vector<std::pair<std::string, ContainerState>> seen() {
    std::lock_guard lk(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, ContainerState>> seen_;
};

TEST_F(TrackerTest, ASinkCanReadTheTrackerWhileAnEventIsPublished) {
  ReadingSink reading;
  Tracker tracker(cri_, index_, reading);
  reading.tracker = &tracker;
  auto id = create("app");
  ASSERT_TRUE(cri_.start_container(id).ok());
  kernel::KernelEvent exec;
  exec.body = kernel::ProcessExec{cgroup_of(id), 100, 100, 1, "sh", "/bin/sh"};
  tracker.on_kernel_event(exec);
  ASSERT_TRUE(reading.wait_count(1));
  ASSERT_TRUE(cri_.exit_container(id, 0).ok());
  kernel::KernelEvent exit;
  exit.body = kernel::ProcessExit{cgroup_of(id), 100, 0, 0, false};
  tracker.on_kernel_event(exit);
  ASSERT_TRUE(reading.wait_count(2));
  tracker.stop();
  auto seen = reading.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(std::string("ContainerStarted"), ContainerState::kRunning));
  EXPECT_EQ(seen[1], std::make_pair(std::string("ContainerDied"), ContainerState::kExited));
}
}  // namespace
}  // namespace kpleg::pleg
