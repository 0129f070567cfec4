// A slow runtime: one pod's CRI calls hang (a wedged shim, a CNI plugin stuck in its status
// call) while the runtime answers everything else. kplegd talks to the real containerd through
// CriProxy, which holds exactly that pod's calls until kplegd's 2 s deadline; the pods are made
// and changed by kpleg-load against the real endpoint, so the workload itself is never slowed.
//
// What must hold: the other pods' events keep their usual latency (ebpf) or relist latency
// (relist), kplegd reports the stuck pod, the stuck pod's transitions are not emitted while the
// runtime cannot confirm them, and once the stall clears they arrive, once each.
#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cri/grpc_cri_client.h"
#include "e2e/e2e_support.h"
#include "kpleg-cri-proxy/cri_proxy.h"
#include "support/eventually.h"

#ifndef KPLEGCTL_BIN
#error "KPLEGCTL_BIN must name the kplegctl binary"
#endif

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
// Short enough that ebpf mode's periodic reconcile falls inside the test's patience: after a
// confirmation has failed for its whole budget, the periodic reconcile is what retries it.
constexpr auto kReconcilePeriod = 10s;

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

double ms(uint64_t ns) { return double(ns) / 1e6; }

// Seconds since midnight of a kplegd text log line ("2026-11-21T15:45:07.822650 debug ...").
std::optional<double> log_time(const std::string& line) {
  int h, m;
  double s;
  auto t = line.find('T');
  if (t == std::string::npos || std::sscanf(line.c_str() + t + 1, "%d:%d:%lf", &h, &m, &s) != 3)
    return std::nullopt;
  return h * 3600.0 + m * 60.0 + s;
}

// One event of `events` (the first of that type for that container), if any.
std::optional<nlohmann::json> event_of(const std::vector<nlohmann::json>& events,
                                       const std::string& id, const std::string& type) {
  for (const auto& e : events)
    if (e.value("container_id", "") == id && e.value("type", "") == type) return e;
  return std::nullopt;
}

// The test bed's containerd behind a CriProxy that listens in a fresh temporary directory.
class ProxiedTestBedTest : public CriTestBedTest {
 protected:
  void SetUp() override {
    CriTestBedTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    char tmpl[] = "/tmp/kpleg-cri-proxy-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << "mkdtemp: " << strerror(errno);
    dir_ = tmpl;
    cri::CriProxyOptions po;
    po.listen_endpoint = "unix://" + dir_ + "/cri.sock";
    po.upstream_endpoint = endpoint_;
    auto p = cri::CriProxy::start(po);
    ASSERT_TRUE(p.ok()) << p.error().message;
    proxy_ = std::move(*p);
  }
  void TearDown() override {
    proxy_.reset();
    CriTestBedTest::TearDown();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<cri::CriProxy> proxy_;
};

class SlowRuntimeTest : public ProxiedTestBedTest,
                        public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    ProxiedTestBedTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    // kplegd also serves its CRI endpoint, as for a kubelet, with a short stuck-call threshold.
    cri_socket_ = dir_ + "/kplegd-cri.sock";
    auto d = start_kplegd(proxy_->endpoint(), GetParam(),
                          {"--cri-timeout", "2s", "--relist-period", "1s", "--reconcile-period",
                           std::to_string(kReconcilePeriod.count()) + "s", "--cri-listen",
                           cri_socket_, "--stuck-call-threshold",
                           std::to_string(kStuckThreshold.count()) + "ms"});
    ASSERT_TRUE(d.ok()) << d.error().message;
    kplegd_ = std::move(*d);
  }
  void TearDown() override {
    if (proxy_) proxy_->clear_stall();  // releases held calls: kplegd stops at once
    if (kplegd_) {
      EXPECT_EQ(kplegd_->stop(), 0) << "kplegd did not shut down cleanly";
    }
    ProxiedTestBedTest::TearDown();
  }
  bool ebpf() const { return GetParam() == "ebpf"; }
  // The API socket start_kplegd gave this daemon, as kplegd announces it.
  std::string api_socket() const {
    const std::string mark = "api: serving kpleg.v1.PodLifecycle on unix:";
    auto log = kplegd_->log();
    auto at = log.find(mark);
    if (at == std::string::npos) return "";
    at += mark.size();
    return log.substr(at, log.find(' ', at) - at);
  }

  LaunchedPod launch(const std::string& name, int containers, const std::string& command) {
    auto p = launch_pod(endpoint_, namespace_, name, containers, command);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? *p : LaunchedPod{};
  }
  // The runtime kills at once: the transition happens now, not after a grace period.
  void kill_container(const std::string& id) {
    auto r = run_kpleg_load({"stop-container", "--grace-period", "0", id});
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->exit_code, 0) << r->err;
  }
  bool all_started(const LaunchedPod& p) {
    bool ok = wait_types(*kplegd_, p.sandbox_id, kStarted);
    for (const auto& id : p.container_ids) ok = wait_types(*kplegd_, id, kStarted) && ok;
    return ok;
  }

  // kplegd's health reasons, read the way an operator would: kplegctl over the API socket.
  // (kplegctl health prints the reasons only when unhealthy; a pod stuck in a runtime call
  // is a reason that does not make the node unhealthy, so read the Stats answer.)
  Result<std::vector<std::string>> health_reasons() {
    auto r = run_process({KPLEGCTL_BIN, "--socket", api_socket(), "stats", "-o", "json"}, 10s);
    if (!r) return r.error();
    if (r->exit_code != 0) return Error{r->exit_code, "kplegctl stats: " + r->err};
    auto j = nlohmann::json::parse(r->out, nullptr, false);
    if (j.is_discarded() || !j.contains("health_reasons"))
      return Error{EINVAL, "kplegctl stats printed no health: " + r->out};
    return j["health_reasons"].get<std::vector<std::string>>();
  }
  bool health_names(const std::string& uid, std::chrono::milliseconds timeout,
                    std::vector<std::string>* last = nullptr) {
    return testing::eventually(
        [&] {
          auto reasons = health_reasons();
          if (!reasons.ok()) {
            if (last) *last = {reasons.error().message};
            return false;
          }
          if (last) *last = *reasons;
          return std::any_of(reasons->begin(), reasons->end(),
                             [&](const std::string& r) { return r.find(uid) != std::string::npos; });
        },
        timeout, 250ms);
  }

  // Polls a condition over kplegd's log (KplegdProcess::wait_for holds the lock log() takes).
  bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    return testing::eventually(pred, timeout, 50ms);
  }
  size_t log_count(const std::string& needle) const {
    auto log = kplegd_->log();
    size_t n = 0;
    for (size_t pos = 0; (pos = log.find(needle, pos)) != std::string::npos; pos += needle.size()) ++n;
    return n;
  }

  // Every container's event types, with no type twice for one container.
  void expect_no_duplicates(const std::vector<LaunchedPod>& pods) {
    for (const auto& p : pods) {
      std::vector<std::string> ids = p.container_ids;
      ids.push_back(p.sandbox_id);
      for (const auto& id : ids) {
        auto types = kplegd_->types_for(id);
        std::set<std::string> unique(types.begin(), types.end());
        EXPECT_EQ(unique.size(), types.size()) << p.name << " " << id.substr(0, 12);
      }
    }
  }

  // `kplegctl stuck --older-than <threshold> -o json`, parsed; exit 1 means calls were found.
  Result<std::vector<nlohmann::json>> stuck_calls() {
    auto r = run_process({KPLEGCTL_BIN, "--socket", api_socket(), "stuck", "--older-than",
                          std::to_string(kStuckThreshold.count()) + "ms", "-o", "json"},
                         10s);
    if (!r) return r.error();
    if (r->exit_code != 0 && r->exit_code != 1)
      return Error{r->exit_code, "kplegctl stuck: " + r->err};
    std::vector<nlohmann::json> calls;
    std::istringstream lines(r->out);
    for (std::string line; std::getline(lines, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) return Error{EINVAL, "kplegctl stuck printed: " + r->out};
      calls.push_back(std::move(j));
    }
    if ((r->exit_code == 1) != !calls.empty())
      return Error{EINVAL, "kplegctl stuck exit " + std::to_string(r->exit_code) + " with " +
                               std::to_string(calls.size()) + " calls"};
    return calls;
  }
  // The first stuck call matching `pred`, polled for up to `timeout`.
  std::optional<nlohmann::json> wait_stuck(const std::function<bool(const nlohmann::json&)>& pred,
                                           std::chrono::milliseconds timeout,
                                           std::string* last = nullptr) {
    std::optional<nlohmann::json> found;
    eventually(
        [&] {
          auto calls = stuck_calls();
          if (!calls) {
            if (last) *last = calls.error().message;
            return false;
          }
          if (last) *last = nlohmann::json(*calls).dump();
          for (const auto& c : *calls)
            if (pred(c)) found = c;
          return found.has_value();
        },
        timeout);
    return found;
  }

  static constexpr auto kStuckThreshold = 1000ms;
  std::string cri_socket_;
  std::unique_ptr<KplegdProcess> kplegd_;
};

// The stuck-call watchdog: the kubelet's StopPodSandbox of one pod hangs in the runtime (a CNI
// teardown that never returns). kplegd, between the kubelet and the runtime, names that call
// with its pod as soon as it is older than the threshold, long before the kubelet's 2-minute
// call deadline and 3-minute PLEG threshold; other pods' events keep their latency; and a
// change in the stuck pod makes kplegd's own calls for it hang too (its relist in relist mode,
// its confirmation in ebpf mode), which the watchdog names as well.
TEST_P(SlowRuntimeTest, AHungStopPodSandboxIsNamedWithItsPodBeforeTheKubeletWouldGiveUp) {
  auto stuck = launch("stuck", 1, "sleep 1000000");
  auto other = launch("other", 1, "sleep 1000000");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(all_started(stuck));
  ASSERT_TRUE(all_started(other));
  proxy_->set_stalled_pod({stuck.uid, cri::StallMode::kHang, {}});

  // The kubelet's call, through kplegd's CRI endpoint, with the kubelet's 2-minute deadline.
  cri::GrpcCriClientOptions co;
  co.call_timeout = 120s;
  auto kubelet = cri::GrpcCriClient::create("unix://" + cri_socket_, co);
  ASSERT_TRUE(kubelet.ok()) << kubelet.error().message;
  const auto call_start = std::chrono::steady_clock::now();
  auto stop_call = std::async(std::launch::async, [&] {
    return (*kubelet)->stop_pod_sandbox(stuck.sandbox_id);
  });
  // Whatever fails below, the held call is released before its future is waited for.
  struct ClearStall {
    cri::CriProxy* proxy;
    ~ClearStall() { proxy->clear_stall(); }
  } clear_stall_at_exit{proxy_.get()};

  std::string last;
  auto named = wait_stuck(
      [&](const nlohmann::json& c) {
        return c.value("method", "") == "StopPodSandbox" && c.value("origin", "") == "endpoint";
      },
      20s, &last);
  const auto named_after = std::chrono::steady_clock::now() - call_start;
  ASSERT_TRUE(named.has_value()) << "kplegctl stuck never listed the StopPodSandbox: " << last;
  EXPECT_EQ((*named)["pod_uid"], stuck.uid);
  EXPECT_EQ((*named)["pod_name"], stuck.name);
  EXPECT_EQ((*named)["pod_namespace"], namespace_);
  EXPECT_EQ((*named)["id"], stuck.sandbox_id);
  EXPECT_GE((*named)["age_ms"].get<uint64_t>(), uint64_t(kStuckThreshold.count()));
  // Named within a few polls of crossing the threshold: seconds, not minutes.
  EXPECT_LT(named_after, kStuckThreshold + 10s);
  std::vector<std::string> reasons;
  EXPECT_TRUE(health_names("StopPodSandbox for " + namespace_ + "/" + stuck.name + " (uid " + stuck.uid, 10s,
                           &reasons))
      << ::testing::PrintToString(reasons);
  EXPECT_EQ(stop_call.wait_for(0s), std::future_status::timeout) << "the call was not held";

  // Other pods go on: a new pod's whole life is reported, at the usual latency.
  const uint64_t during_ns = realtime_ns();
  auto fresh = launch("fresh", 1, "sh -c 'sleep 2; exit 0'");
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(wait_types(*kplegd_, fresh.container_ids[0], kDied, 20s));
  if (ebpf()) {
    for (const auto& e : kplegd_->events()) {
      if (e.value("pod_uid", "") != fresh.uid || e.value("emit_ts_ns", uint64_t(0)) < during_ns)
        continue;
      const uint64_t k = e.value("kernel_ts_ns", uint64_t(0)), emit = e.value("emit_ts_ns", uint64_t(0));
      if (k != 0 && emit >= k)
        EXPECT_LT(emit - k, 1'500'000'000u) << e.value("type", "") << " took " << ms(emit - k) << " ms";
    }
  }

  // A change in the stuck pod: kplegd's own calls for it hang behind the same runtime.
  kill_container(stuck.container_ids[0]);
  auto own = wait_stuck(
      [&](const nlohmann::json& c) {
        return c.value("origin", "") == "kplegd" && c.value("pod_uid", "") == stuck.uid;
      },
      30s, &last);
  ASSERT_TRUE(own.has_value()) << "kplegd's own hung call for the pod was never listed: " << last;
  std::cout << GetParam() << " mode: StopPodSandbox named after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(named_after).count()
            << " ms; kplegd's own: " << (*own)["description"].get<std::string>() << std::endl;

  // The stall clears: the held StopPodSandbox goes through and nothing is listed any more.
  proxy_->clear_stall();
  auto st = stop_call.get();
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(eventually([&] {
    auto calls = stuck_calls();
    return calls.ok() && calls->empty();
  }, 20s));
}

TEST_P(SlowRuntimeTest, OnePodsHungStatusCallsDoNotHoldUpOtherPods) {
  auto stalled = launch("stalled", 2, "sleep 1000000");
  auto steady = launch("steady", 1, "sleep 1000000");
  // Exits on its own, after the stall below has begun.
  auto exits = launch("exits", 1, "sh -c 'sleep 8; exit 0'");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(all_started(stalled));
  ASSERT_TRUE(all_started(steady));
  ASSERT_TRUE(all_started(exits));

  const uint64_t stall_ns = realtime_ns();
  proxy_->set_stalled_pod({stalled.uid, cri::StallMode::kHang, {}});

  // A transition in the stalled pod, then in the others, while its calls hang.
  kill_container(stalled.container_ids[0]);
  const uint64_t kill_steady_ns = realtime_ns();
  kill_container(steady.container_ids[0]);
  // A pod born during the stall; it lives longer than a stalled relist takes (2 s call
  // timeout + 1 s period), so relist mode sees it running too.
  auto quick = launch("quick", 1, "sh -c 'sleep 5; exit 0'");
  ASSERT_FALSE(HasFailure());

  EXPECT_TRUE(wait_types(*kplegd_, steady.container_ids[0], kDied, 20s));
  EXPECT_TRUE(wait_types(*kplegd_, quick.sandbox_id, kStarted, 20s));
  EXPECT_TRUE(wait_types(*kplegd_, quick.container_ids[0], kDied, 20s));
  EXPECT_TRUE(wait_types(*kplegd_, exits.container_ids[0], kDied, 20s));

  // kplegd noticed the stuck pod: the stalled calls really were made, and timed out.
  if (ebpf()) {
    EXPECT_TRUE(kplegd_->wait_for_log(
        "no answer from the runtime for " + stalled.container_ids[0].substr(0, 12), 20s));
  } else {
    EXPECT_TRUE(kplegd_->wait_for_log(
        "relist: ignoring events of pod " + namespace_ + "/" + stalled.name, 20s));
  }
  auto ps = proxy_->stats();
  EXPECT_GT(ps.gave_up, 0u) << "no call of the stalled pod hit its deadline";

  // Nothing is emitted for the stalled pod that the runtime did not confirm.
  EXPECT_EQ(kplegd_->types_for(stalled.container_ids[0]), kStarted);
  EXPECT_EQ(kplegd_->types_for(stalled.container_ids[1]), kStarted);

  // The other pods' events, and how late they were.
  const auto events = kplegd_->events();
  std::ostringstream report;
  report << GetParam() << " mode, other pods during the stall:";
  const std::set<std::string> others{steady.uid, exits.uid, quick.uid};
  uint64_t worst_started_ns = 0, worst_ns = 0;
  int kernel_events = 0;
  for (const auto& e : events) {
    if (!others.count(e.value("pod_uid", "")) || e.value("emit_ts_ns", uint64_t(0)) < stall_ns)
      continue;
    const auto type = e.value("type", "");
    const auto name = e.value("pod_name", "") + "/" +
                      (e.value("sandbox", false) ? std::string("sandbox") : e.value("container_name", ""));
    if (ebpf()) {
      EXPECT_EQ(e.value("source", ""), "kernel") << name << " " << type;
      const uint64_t k = e.value("kernel_ts_ns", uint64_t(0)), emit = e.value("emit_ts_ns", uint64_t(0));
      if (k == 0 || emit < k) continue;
      ++kernel_events;
      const uint64_t lat = emit - k;
      worst_ns = std::max(worst_ns, lat);
      if (type == "ContainerStarted") worst_started_ns = std::max(worst_started_ns, lat);
      report << "\n  " << name << " " << type << ": kernel->emit " << ms(lat) << " ms";
    } else {
      report << "\n  " << name << " " << type << " emitted";
    }
  }
  if (ebpf()) {
    EXPECT_GE(kernel_events, 5) << "quick: sandbox+start+death, steady: death, exits: death";
    EXPECT_LT(worst_started_ns, 1'500'000'000u) << "a Started took " << ms(worst_started_ns) << " ms";
    EXPECT_LT(worst_ns, 1'500'000'000u) << "an event took " << ms(worst_ns) << " ms";
    // The premise: this container died while the stall was on.
    if (auto d = event_of(events, exits.container_ids[0], "ContainerDied"))
      EXPECT_GT((*d)["kernel_ts_ns"].get<uint64_t>(), stall_ns);
  }
  if (auto d = event_of(events, steady.container_ids[0], "ContainerDied")) {
    const uint64_t lat = (*d)["emit_ts_ns"].get<uint64_t>() - kill_steady_ns;
    report << "\n  steady/c0 StopContainer (kpleg-load) -> ContainerDied emitted: " << ms(lat) << " ms";
    // Relist mode: every relist now spends the 2 s deadline on the stalled pod, 1 s apart.
    EXPECT_LT(lat, ebpf() ? 3'000'000'000u : 10'000'000'000u);
  }

  if (!ebpf()) {
    // The generic PLEG inspects pods one after another, so each relist now waits out the
    // stalled pod's deadline: relists start >= 2 s (deadline) apart instead of 1 s.
    const std::string failed_inspection = "ignoring events of pod " + namespace_ + "/" + stalled.name;
    ASSERT_TRUE(eventually([&] { return log_count(failed_inspection) >= 4; }, 30s))
        << "the stalled pod is not re-inspected each relist";
    std::vector<double> starts;
    std::istringstream log(kplegd_->log());
    for (std::string line; std::getline(log, line);) {
      if (line.find("ignoring events of pod " + namespace_ + "/" + stalled.name) == std::string::npos)
        continue;
      if (auto t = log_time(line)) starts.push_back(*t);
    }
    report << "\n  failed inspections of the stalled pod, interval between them:";
    for (size_t i = 1; i < starts.size(); ++i) {
      const double gap = starts[i] - starts[i - 1];
      report << " " << gap << " s";
      if (gap >= 0) EXPECT_GE(gap, 2.0) << "relists can no longer be 1 s apart";
    }
  }

  // The stall ends between two of kplegd's attempts (clearing it during one would simply
  // answer that attempt): the stalled pod's transition has to come from a later retry, once.
  EXPECT_TRUE(eventually([&] { return proxy_->stats().stalled_in_flight == 0; }, 10s));
  const uint64_t clear_ns = realtime_ns();
  proxy_->clear_stall();
  EXPECT_TRUE(wait_types(*kplegd_, stalled.container_ids[0], kDied, kReconcilePeriod + 20s))
      << ::testing::PrintToString(kplegd_->types_for(stalled.container_ids[0]));
  if (auto d = event_of(kplegd_->events(), stalled.container_ids[0], "ContainerDied")) {
    report << "\n  stalled/c0 ContainerDied after the stall cleared: "
           << ms((*d)["emit_ts_ns"].get<uint64_t>() - clear_ns) << " ms (source "
           << (*d)["source"].get<std::string>() << ", correction " << (*d)["correction"] << ")";
    EXPECT_EQ((*d)["exit_code"], 137);
  }
  // Let one more full pass over the runtime happen (a periodic reconcile / a few relists), then
  // nothing may have been emitted twice.
  auto barrier = launch("barrier", 1, "sh -c 'sleep 3; exit 0'");  // relist sees it run
  EXPECT_TRUE(wait_types(*kplegd_, barrier.container_ids[0], kDied, 20s));
  if (ebpf()) {
    const size_t before = log_count("reconcile (period)");
    EXPECT_TRUE(eventually([&] { return log_count("reconcile (period)") > before; },
                           kReconcilePeriod + 5s));
  }
  EXPECT_EQ(kplegd_->types_for(stalled.container_ids[0]), kDied);
  EXPECT_EQ(kplegd_->types_for(stalled.container_ids[1]), kStarted);
  EXPECT_EQ(kplegd_->types_for(stalled.sandbox_id), kStarted);
  EXPECT_EQ(kplegd_->types_for(steady.container_ids[0]), kDied);
  EXPECT_EQ(kplegd_->types_for(exits.container_ids[0]), kDied);
  EXPECT_EQ(kplegd_->types_for(quick.container_ids[0]), kDied);
  expect_no_duplicates({stalled, steady, exits, quick, barrier});
  std::cout << report.str() << std::endl;
  RecordProperty("measurements", report.str());
}

// An operator asking kplegd's API during the stall is told which pod is stuck.
TEST_P(SlowRuntimeTest, HealthNamesTheStalledPod) {
  auto stalled = launch("stalled", 1, "sleep 1000000");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(all_started(stalled));
  proxy_->set_stalled_pod({stalled.uid, cri::StallMode::kHang, {}});
  kill_container(stalled.container_ids[0]);

  std::vector<std::string> reasons;
  EXPECT_TRUE(health_names(stalled.uid, 20s, &reasons))
      << "health reasons: " << ::testing::PrintToString(reasons)
      << "\nCRI proxy: " << proxy_->stats().stalled << " calls held, " << proxy_->stats().gave_up
      << " ran into their deadline";

  proxy_->clear_stall();
  EXPECT_TRUE(wait_types(*kplegd_, stalled.container_ids[0], kDied, kReconcilePeriod + 20s));
  EXPECT_FALSE(health_names(stalled.uid, 0s)) << "the pod is no longer stuck";
}

INSTANTIATE_TEST_SUITE_P(Modes, SlowRuntimeTest, ::testing::Values("ebpf", "relist"),
                         [](const auto& info) { return info.param; });

// A large (or loaded) node: every full list takes longer than --cri-timeout. The reconcile
// (ebpf) and the relist (relist mode) list everything; with the per-call deadline they would
// fail on every try and the daemon would never be healthy there. Full lists have their own
// deadline (--cri-list-timeout): the daemon is healthy, stays so, and reports containers.
class SlowFullListTest : public ProxiedTestBedTest,
                         public ::testing::WithParamInterface<std::string> {
 protected:
  static constexpr auto kListDelay = 2500ms;

  std::unique_ptr<KplegdProcess> start(const std::vector<std::string>& extra) {
    std::vector<std::string> args{"--cri-timeout", "1s", "--relist-period", "1s",
                                  "--reconcile-period", "4s"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = start_kplegd(proxy_->endpoint(), GetParam(), args);
    EXPECT_TRUE(d.ok()) << d.error().message;
    return d.ok() ? std::move(*d) : nullptr;
  }
  static std::string api_socket(KplegdProcess& d) {
    const std::string mark = "api: serving kpleg.v1.PodLifecycle on unix:";
    auto log = d.log();
    auto at = log.find(mark);
    if (at == std::string::npos) return "";
    at += mark.size();
    return log.substr(at, log.find(' ', at) - at);
  }
  static Result<nlohmann::json> stats(KplegdProcess& d) {
    auto r = run_process({KPLEGCTL_BIN, "--socket", api_socket(d), "stats", "-o", "json"}, 10s);
    if (!r) return r.error();
    if (r->exit_code != 0) return Error{r->exit_code, "kplegctl stats: " + r->err};
    auto j = nlohmann::json::parse(r->out, nullptr, false);
    if (j.is_discarded()) return Error{EINVAL, "kplegctl stats: not JSON: " + r->out};
    return j;
  }
};

TEST_P(SlowFullListTest, ListsSlowerThanTheCallDeadlineKeepTheDaemonHealthy) {
  proxy_->set_full_list_delay(kListDelay);

  // Before full lists had their own deadline, they had --cri-timeout: this daemon shows what
  // that meant (no list ever succeeds, never healthy).
  auto short_lists = start({"--cri-list-timeout", "1s"});
  ASSERT_TRUE(short_lists);
  std::string reasons;
  EXPECT_TRUE(eventually(
      [&] {
        auto j = stats(*short_lists);
        if (!j.ok()) return false;
        reasons = j->dump();
        return !(*j)["healthy"].get<bool>() && reasons.find("DEADLINE_EXCEEDED") != std::string::npos;
      },
      20s, 250ms))
      << reasons;
  EXPECT_EQ(short_lists->stop(), 0);

  auto d = start({});  // the default --cri-list-timeout
  ASSERT_TRUE(d);
  ASSERT_TRUE(eventually(
      [&] {
        auto j = stats(*d);
        if (!j.ok()) return false;
        reasons = j->dump();
        return (*j)["healthy"].get<bool>() && (*j)["last_reconcile_ns"].get<uint64_t>() > 0;
      },
      20s, 250ms))
      << reasons;
  const uint64_t lists_before = proxy_->stats().full_lists_delayed;

  // A container started meanwhile is reported (ebpf at once, relist by its slow relist).
  auto pod = launch_pod(endpoint_, namespace_, "slowlists", 1, "sleep 1000000");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_TRUE(wait_types(*d, pod->container_ids[0], kStarted, 20s));

  // Healthy at every look over at least two more reconciles (relists), which all succeed.
  const auto until = std::chrono::steady_clock::now() + 10s;
  int looks = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto j = stats(*d);
    ASSERT_TRUE(j.ok()) << j.error().message;
    EXPECT_TRUE((*j)["healthy"].get<bool>()) << j->dump();
    ++looks;
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_GE(looks, 10);
  EXPECT_GE(proxy_->stats().full_lists_delayed, lists_before + 2);
  EXPECT_EQ(d->log().find("DEADLINE_EXCEEDED"), std::string::npos) << d->log();

  // Stopped while a full list is in flight: the list is cancelled, not waited for (with its
  // minute-long deadline a shutdown could otherwise outlast the pod's grace period).
  ASSERT_TRUE(eventually([&] { return proxy_->stats().full_lists_in_flight > 0; }, 15s, 20ms));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d->stop(), 0) << d->log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kListDelay)
      << "kplegd waited for the list in flight to finish";
}

// A slow first sync (a big node, a loaded runtime): kplegd is not ready until it ends, but live
// all along. When liveness was the full health, "no successful reconcile yet" failed it, and the
// kubelet restarted kplegd in the middle of the sync, which then started over.
TEST_P(SlowFullListTest, ASlowFirstSyncIsLiveButNotReadyUntilItEnds) {
  proxy_->set_full_list_delay(6s);  // the first sync's two lists: 12 s
  auto d = start({"--cri-list-timeout", "20s"});
  ASSERT_TRUE(d);
  const auto socket = api_socket(*d);
  ASSERT_FALSE(socket.empty()) << d->log();
  auto probe = [&](const char* kind) {
    auto r = run_process({KPLEGCTL_BIN, "--socket", socket, "--timeout", "4", "probe", kind}, 10s);
    return r.ok() ? r->exit_code : -1;
  };
  ASSERT_TRUE(eventually([&] { return proxy_->stats().full_lists_in_flight > 0; }, 10s, 20ms));
  EXPECT_EQ(probe("startup"), 0);
  EXPECT_EQ(probe("live"), 0);
  auto ready = run_process({KPLEGCTL_BIN, "--socket", socket, "--timeout", "4", "probe", "ready"}, 10s);
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->exit_code, 1) << ready->out;
  // Not ready because the first sync has not ended (ebpf: the reconcile; relist: the relist).
  EXPECT_TRUE(ready->out.find("no successful reconcile yet") != std::string::npos ||
              ready->out.find("relist has yet to succeed") != std::string::npos)
      << ready->out;
  EXPECT_TRUE(eventually([&] { return probe("ready") == 0; }, 40s, 500ms)) << d->log();
  EXPECT_EQ(probe("live"), 0);
  EXPECT_EQ(d->stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, SlowFullListTest, ::testing::Values("ebpf", "relist"),
                         [](const auto& info) { return info.param; });

// A runtime whose answers come late, and a client that removes a container right after it
// stopped it (a controller, an operator, kpleg-load): the answer that confirms the death comes
// after the container's directory was removed. The removal hint's watch saw that removal before
// the id was armed; it must still count as the id's hint. Were it dropped, the ContainerRemoved
// would wait for the sweep, which runs every 300 s once containerd's hints are trusted.
TEST_F(ProxiedTestBedTest, AContainerRemovedBeforeItsDeathWasConfirmedIsReportedRemovedSoon) {
  // Without the runtime's event stream (containerd 2.x has one), so that looks confirm.
  auto d = start_kplegd(proxy_->endpoint(), "ebpf", {"--runtime-events", "off"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  ASSERT_TRUE(kplegd.wait_for_log("removal hint attached", 5s)) << kplegd.log();
  ASSERT_NE(kplegd.log().find("(trusted for containerd)"), std::string::npos) << kplegd.log();

  // The race is the runtime's: the death's confirming look has to be asked after containerd
  // recorded the exit and answered after the removal. A few containers, until one made it.
  constexpr auto kLate = 1500ms;
  int raced = 0;
  for (int i = 0; i < 4 && raced == 0; ++i) {
    auto pod = launch_pod(endpoint_, namespace_, "late-" + std::to_string(i), 1, "sleep 1000000");
    ASSERT_TRUE(pod.ok()) << pod.error().message;
    const std::string id = pod->container_ids[0];
    ASSERT_TRUE(wait_types(kplegd, id, kStarted));
    proxy_->set_stalled_pod({pod->uid, cri::StallMode::kLateAnswer, kLate});
    ASSERT_TRUE(load_op(endpoint_, "stop-container", id).ok());
    // The exit is recorded now: a look asked from now on answers EXITED, kLate later. Wait
    // for one (one asked earlier answers RUNNING, and its retry is asked after it); without
    // one, this container may not make the race, and the next one tries again.
    const uint64_t asked = proxy_->stats().stalled;
    (void)eventually([&] { return proxy_->stats().stalled > asked; }, 3 * kLate, 5ms);
    ASSERT_TRUE(load_op(endpoint_, "remove-container", id).ok());
    const auto removed_at = std::chrono::steady_clock::now();
    EXPECT_TRUE(wait_types(kplegd, id, kRemoved, 15s))
        << "no ContainerRemoved within 15 s of the removal";
    std::cout << "container " << i << ": ContainerRemoved "
              << std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - removed_at).count()
              << " ms after its removal" << std::endl;
    proxy_->clear_stall();
    if (kplegd.log().find(id.substr(0, 12) + " was removed before its death was confirmed") !=
        std::string::npos)
      ++raced;
  }
  EXPECT_GT(raced, 0) << "no container's death was confirmed after its removal: the race was "
                         "not made";
  EXPECT_EQ(kplegd.stop(), 0);
}

// The proxy alone, in front of the real containerd: a stalled pod's calls wait, others do not.
class CriProxyContainerdTest : public ProxiedTestBedTest {
 protected:
  std::unique_ptr<cri::GrpcCriClient> client(const std::string& endpoint,
                                             std::chrono::milliseconds timeout,
                                             size_t in_flight = 8) {
    cri::GrpcCriClientOptions o;
    o.call_timeout = timeout;
    o.max_in_flight = in_flight;
    auto c = cri::GrpcCriClient::create(endpoint, o);
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(*c) : nullptr;
  }
};

TEST_F(CriProxyContainerdTest, StalledPodWaitsOtherPodsDoNot) {
  auto a = launch_pod(endpoint_, namespace_, "held", 1, "sleep 1000000");
  auto b = launch_pod(endpoint_, namespace_, "free", 1, "sleep 1000000");
  ASSERT_TRUE(a.ok() && b.ok());
  auto direct = client(endpoint_, 2s);
  auto via = client(proxy_->endpoint(), 1s, 64);
  ASSERT_TRUE(direct && via);

  // Transparent: the same answer as the runtime's own.
  auto d = direct->container_status(a->container_ids[0]);
  auto v = via->container_status(a->container_ids[0]);
  ASSERT_TRUE(d.ok() && v.ok()) << (d.ok() ? v.error().message : d.error().message);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*v, *d))
      << v->DebugString() << "\nversus\n" << d->DebugString();
  auto missing = via->container_status(std::string(64, '0'));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, grpc::StatusCode::NOT_FOUND);

  // Hang: the pod's calls run into the caller's 1 s deadline; 16 of them held at once.
  proxy_->set_stalled_pod({a->uid, cri::StallMode::kHang, {}});
  std::vector<std::thread> held;
  std::atomic<int> deadline_exceeded{0};
  for (int i = 0; i < 16; ++i) {
    held.emplace_back([&, i] {
      int code = 0;
      if (i % 2) {
        auto r = via->pod_sandbox_status(a->sandbox_id);
        code = r.ok() ? 0 : r.error().code;
      } else {
        auto r = via->container_status(a->container_ids[0]);
        code = r.ok() ? 0 : r.error().code;
      }
      if (code == grpc::StatusCode::DEADLINE_EXCEEDED) ++deadline_exceeded;
    });
  }
  // Meanwhile, the other pod's calls are answered as usual.
  std::vector<double> other_ms;
  for (int i = 0; i < 10; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto st = via->container_status(b->container_ids[0]);
    other_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->state(), runtime::v1::CONTAINER_RUNNING);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (auto& t : held) t.join();
  EXPECT_EQ(deadline_exceeded.load(), 16);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  auto worst = *std::max_element(other_ms.begin(), other_ms.end());
  EXPECT_LT(worst, 1000.0) << "held calls are 2 s; the other pod's must not queue behind them";
  std::cout << "other pod's ContainerStatus through the proxy while 16 calls were held: worst "
            << worst << " ms" << std::endl;
  // Held threads are released when their callers give up.
  EXPECT_TRUE(eventually([&] { return proxy_->stats().stalled_in_flight == 0; }, 5s))
      << proxy_->stats().stalled_in_flight << " still held";

  // Delay: the call is answered, late.
  proxy_->set_stalled_pod({a->uid, cri::StallMode::kDelay, 1500ms});
  auto patient = client(proxy_->endpoint(), 5s);
  t0 = std::chrono::steady_clock::now();
  auto late = patient->container_status(a->container_ids[0]);
  EXPECT_TRUE(late.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1500ms);
  proxy_->clear_stall();
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(patient->container_status(a->container_ids[0]).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms) << "not delayed 1.5 s any more";
}

}  // namespace
}  // namespace kpleg::testing
