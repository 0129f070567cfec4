// A soak: what one node's worst neighbours do, all at once, for KPLEG_SOAK_SECONDS (120 by
// default, the short version CI runs; docs/design.md, Trust, gives the long one's result):
// - container churn at 10 transitions/s spread over 5 pods (kpleg-load churn, the quiet pods);
// - a noisy pod beside them: an exec storm in its container (about a hundred a second) and a
//   cgroup storm below it (mkdir/rmdir, about a thousand a second: both paced to leave the
//   machine's two cores to the rest);
// - 50 Watch consumers (kplegctl watch): 30 that keep up, 10 that stop reading (SIGSTOP) and are
//   cut off, 10 that are killed and reconnect every few seconds;
// - 40 clients trickling header bytes at the HTTP port;
// - the runtime frozen (SIGSTOP) twice, for a sixth of the run each (40 s in the long one).
// Asserted: every container of the churn that lived reported Started exactly once, every one
// stopped Died exactly once and nothing reported twice; liveness (/livez, as the DaemonSet's
// probe would ask it) never failed three times in a row, so the kubelet would never have
// restarted kplegd; its RSS flat (the last third's peak within 1.3x + 16 MiB of the first
// sample after warm-up, printed every 10 s).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "e2e/e2e_support.h"
#include "e2e/node_probes.h"
#include "pleg/event.h"
#include "support/scratch_cgroup.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

class SoakTest : public CriTestBedTest {};

long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

std::vector<std::string> watch_argv(const std::string& socket) {
  return {KPLEGCTL_BIN, "--socket", socket, "watch", "-o", "json"};
}

TEST_F(SoakTest, ChurnBesideANoisyPodManyConsumersTrickledProbesAndAFrozenRuntime) {
  const char* env = std::getenv("KPLEG_SOAK_SECONDS");
  const int seconds = env != nullptr ? std::max(60, std::atoi(env)) : 120;
  const auto run_for = std::chrono::seconds(seconds);
  ASSERT_TRUE(TestBed::instance().endpoint_is_test_bed()) << "needs the test bed's own containerd";

  auto d = start_kplegd(endpoint_, "ebpf",
                        {"--max-watchers", "80", "--watch-queue", "200", "--max-cgroups-per-pod",
                         "64", "--max-cgroup-mkdirs-per-pod", "50"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  auto& kplegd = **d;
  const std::string socket = socket_of(kplegd);
  const int port = metrics_port(kplegd);
  ASSERT_FALSE(socket.empty());
  ASSERT_GT(port, 0);

  // The noisy pod: an exec storm in its container, a cgroup storm below it.
  auto noisy = launch_pod(endpoint_, namespace_, "noisy", 1, "sh -c 'while :; do /bin/true; /bin/true; sleep 0.02; done'");
  ASSERT_TRUE(noisy.ok()) << noisy.error().message;
  ASSERT_TRUE(wait_types(kplegd, noisy->container_ids[0], kStarted));
  const std::string noisy_cgroup = "/sys/fs/cgroup/unified/kubepods/besteffort/pod" + noisy->uid +
                                   "/" + noisy->container_ids[0];
  std::atomic<bool> stop{false};
  std::atomic<long> cgroup_loops{0};
  std::thread cgroup_storm([&] {
    while (!stop) {
      auto c = ScratchCgroup::create(noisy_cgroup + "/storm");
      if (!c.ok()) break;  // the container went away
      (void)c->remove();
      ++cgroup_loops;
      std::this_thread::sleep_for(1ms);  // pacing, see above
    }
  });

  // 50 consumers.
  std::vector<pid_t> steady, slow, reconnecting;
  for (int i = 0; i < 30; ++i) steady.push_back(spawn_with(watch_argv(socket), -1, -1));
  for (int i = 0; i < 10; ++i) slow.push_back(spawn_with(watch_argv(socket), -1, -1));
  for (int i = 0; i < 10; ++i) reconnecting.push_back(spawn_with(watch_argv(socket), -1, -1));
  HeaderTricklers tricklers(port, 40);

  // The churn of the quiet pods, open for the whole run.
  auto churn = std::async(std::launch::async, [&] {
    return run_kpleg_load({"churn", "--rate", "10", "--duration", std::to_string(seconds - 10),
                           "--pods", "5", "--namespace", namespace_, "--name-prefix", "soak"},
                          run_for + 180s);
  });

  // Liveness as the DaemonSet's probe asks it: every 2 s, 3 failures in a row restart.
  int live_asked = 0, live_failed = 0, worst_run = 0, run_of_failures = 0;
  std::vector<long> rss;
  const auto t0 = Clock::now();
  auto next_rss = t0, next_reconnect = t0 + 5s;
  const std::vector<std::pair<Clock::duration, Clock::duration>> freezes = {
      {run_for / 4, run_for / 6}, {run_for * 3 / 5, run_for / 6}};
  size_t freeze = 0;
  std::optional<Clock::time_point> thaw_at;
  std::vector<std::pair<int64_t, int64_t>> frozen;  // CLOCK_REALTIME ns, as kpleg-load logs
  auto containerd = TestBed::instance().containerd_pid();
  ASSERT_TRUE(containerd.ok()) << containerd.error().message;
  struct Thaw {
    pid_t pid;
    ~Thaw() { kill(pid, SIGCONT); }
  } thaw{*containerd};
  bool slow_stopped = false;

  while (Clock::now() - t0 < run_for) {
    const auto now = Clock::now();
    if (!slow_stopped && now - t0 > 5s) {
      for (pid_t p : slow) kill(p, SIGSTOP);  // stop reading: cut off once 200 events behind
      slow_stopped = true;
    }
    if (freeze < freezes.size() && !thaw_at && now - t0 >= freezes[freeze].first) {
      ASSERT_EQ(kill(*containerd, SIGSTOP), 0);
      thaw_at = now + freezes[freeze].second;
      frozen.push_back({int64_t(pleg::realtime_now_ns()), 0});
      std::printf("soak: runtime frozen at %lld s\n",
                  (long long)std::chrono::duration_cast<std::chrono::seconds>(now - t0).count());
    }
    if (thaw_at && now >= *thaw_at) {
      kill(*containerd, SIGCONT);
      frozen.back().second = int64_t(pleg::realtime_now_ns());
      thaw_at.reset();
      ++freeze;
    }
    if (now >= next_reconnect) {
      for (pid_t& p : reconnecting) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = spawn_with(watch_argv(socket), -1, -1);
      }
      next_reconnect = now + 5s;
    }
    if (now >= next_rss) {
      rss.push_back(rss_kib(kplegd.pid()));
      std::printf("soak: %3lld s  kplegd RSS %ld KiB  cgroup storm %ld loops\n",
                  (long long)std::chrono::duration_cast<std::chrono::seconds>(now - t0).count(),
                  rss.back(), cgroup_loops.load());
      next_rss = now + 10s;
    }
    ++live_asked;
    if (http_status(port, "/livez", 1s) != 200) {
      ++live_failed;
      worst_run = std::max(worst_run, ++run_of_failures);
    } else {
      run_of_failures = 0;
    }
    // The probe's period; nothing to wait on.
    std::this_thread::sleep_for(2s);
  }
  kill(*containerd, SIGCONT);
  auto result = churn.get();
  stop = true;
  cgroup_storm.join();
  tricklers.stop();
  for (auto* group : {&steady, &slow, &reconnecting}) {
    for (pid_t p : *group) {
      kill(p, SIGKILL);
      kill(p, SIGCONT);
      waitpid(p, nullptr, 0);
    }
  }
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_LE(result->exit_code, 1) << result->err.substr(0, 2000);
  EXPECT_EQ(kill(kplegd.pid(), 0), 0) << "kplegd died";

  // What the churn did, from its log of CRI calls. Its calls fail while the runtime is frozen
  // (their deadline passes), and only then: it exits 1 for those, never gives up.
  std::map<std::string, std::pair<bool, bool>> lives;  // id -> (started, stopped)
  int failed_calls = 0;
  for (const auto& line : lines_of(result->out)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.value("op", "") == "churn") EXPECT_EQ(j.value("teardown_failures", -1), 0) << line;
    if (j.contains("call") && !j.value("ok", true)) {
      ++failed_calls;
      const int64_t end = j.value("t_end_ns", int64_t(0));
      const bool in_freeze = std::any_of(frozen.begin(), frozen.end(), [&](const auto& f) {
        return end >= f.first && end <= f.second + 5'000'000'000;
      });
      EXPECT_TRUE(in_freeze) << "a CRI call failed outside the runtime's freezes: " << line;
      continue;
    }
    if (!j.contains("call") || !j.contains("container_id")) continue;
    auto& life = lives[j["container_id"].get<std::string>()];
    if (j["call"] == "StartContainer") life.first = true;
    if (j["call"] == "StopContainer") life.second = true;
  }
  // Events still on their way when the churn ended: a few seconds after the last call.
  std::vector<std::string> no_death;
  const bool all_died = kplegd.wait_for(
      [&](const std::vector<json>& evs) {
        std::map<std::string, int> died;
        for (const auto& e : evs)
          if (e.value("type", "") == "ContainerDied") ++died[e.value("container_id", "")];
        no_death.clear();
        for (const auto& [id, life] : lives)
          if (life.second && died[id] == 0) no_death.push_back(id);
        return no_death.empty();
      },
      30s);
  if (!all_died) {
    std::string calls;
    for (const auto& line : lines_of(result->out))
      for (const auto& id : no_death)
        if (line.find(id) != std::string::npos) calls += line + "\n";
    FAIL() << "a stopped container's death was never reported: " << no_death.size()
           << ", e.g. " << no_death.front() << "; the churn's calls for them:\n" << calls;
  }
  std::map<std::string, std::map<std::string, int>> seen;
  for (const auto& e : kplegd.events()) ++seen[e.value("container_id", "")][e.value("type", "")];
  int missed = 0, duplicated = 0, checked = 0;
  for (const auto& [id, life] : lives) {
    if (!life.first) continue;
    ++checked;
    auto& types = seen[id];
    if (types["ContainerStarted"] == 0) ++missed;
    if (life.second && types["ContainerDied"] == 0) ++missed;
    for (const auto& [type, n] : types)
      if (n > 1) ++duplicated;
  }
  EXPECT_GT(checked, seconds / 2) << "the churn made too few containers";
  EXPECT_EQ(missed, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_LT(worst_run, 3) << live_failed << " of " << live_asked
                          << " liveness probes failed: the kubelet would have restarted kplegd";
  ASSERT_GE(rss.size(), 3u);
  const long base = rss[std::min<size_t>(1, rss.size() - 1)];
  long late_peak = 0;
  for (size_t i = rss.size() * 2 / 3; i < rss.size(); ++i) late_peak = std::max(late_peak, rss[i]);
  EXPECT_LE(late_peak, base * 13 / 10 + 16 * 1024) << "RSS grew from " << base << " to "
                                                   << late_peak << " KiB";
  std::printf("soak: %d s, %d churn containers (%d CRI calls failed while frozen): %d missed, %d duplicated; liveness %d/%d answered "
              "(worst run of failures %d); RSS %ld -> %ld KiB (last third's peak); %ld cgroup "
              "storm loops; %d trickling connections cut off\n",
              seconds, checked, failed_calls, missed, duplicated, live_asked - live_failed, live_asked, worst_run,
              base, late_peak, cgroup_loops.load(), tricklers.cut_off());
  EXPECT_EQ(kplegd.stop(), 0);
}

}  // namespace
}  // namespace kpleg::testing
