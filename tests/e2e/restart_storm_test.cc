// kplegd restarted 20 times during a minute of container churn (kpleg-load churn, 10
// transitions/s; each instance serves about 3 s, from start-up sync to SIGTERM) against the real containerd: every instance reports each container or sandbox
// that was alive while it ran exactly once as Started (from its start-up sync or from the
// kernel), never twice, and never reports a death or a removal before the workload stopped or
// removed that container (checked against kpleg-load's log of its CRI calls, same clock).
#include <gtest/gtest.h>

#include <cstdio>
#include <future>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "e2e/e2e_support.h"
#include "pleg/event.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// What the workload did to one container or sandbox, in CLOCK_REALTIME ns.
struct Life {
  int64_t running_from = kNever;  // StartContainer returned (a sandbox: its pod was made)
  int64_t stop_begin = kNever;    // StopContainer was called
  int64_t remove_begin = kNever;  // RemoveContainer was called
};

// One kplegd instance: when it served (after its start-up sync, until SIGTERM) and its events.
struct Instance {
  int64_t from = 0, to = 0;
  std::vector<json> events;
  std::string log;  // its stderr, for a failure's message
};

// The lines of a log that name an id, with the instance's first lines (its start-up).
std::string lines_mentioning(const std::string& log, const std::string& id) {
  std::string out;
  int n = 0;
  for (const auto& line : lines_of(log)) {
    if (line.find("libbpf:") != std::string::npos) continue;
    if (n++ < 15 || line.find(id) != std::string::npos) out += line + "\n";
  }
  return out;
}

class RestartStormTest : public CriTestBedTest {};

TEST_F(RestartStormTest, TwentyRestartsUnderChurnNeverReportAContainerWronglyOrTwice) {
  constexpr auto kStorm = 60s;
  constexpr int kRestarts = 20;
  // The churn outlasts the storm: its teardown (pods removed with their containers, not by
  // logged calls) must not fall into any instance's life.
  auto churn = std::async(std::launch::async, [&] {
    return run_kpleg_load({"churn", "--rate", "10", "--duration", "70", "--namespace", namespace_,
                           "--name-prefix", "storm"},
                          140s);
  });

  std::vector<Instance> instances;
  const auto storm_end = std::chrono::steady_clock::now() + kStorm;
  for (int i = 0; i < kRestarts && std::chrono::steady_clock::now() < storm_end; ++i) {
    auto d = start_kplegd(endpoint_, "ebpf");
    ASSERT_TRUE(d.ok()) << "restart " << i << ": " << d.error().message;
    Instance inst;
    inst.from = int64_t(pleg::realtime_now_ns());
    // An equal share of what is left of the storm, so that a slow start-up shortens the lives
    // rather than the number of restarts.
    const auto now = std::chrono::steady_clock::now();
    const auto live_until = now + (storm_end - now) / (kRestarts - i);
    (*d)->wait_for_log("\x01never", std::chrono::duration_cast<std::chrono::milliseconds>(
                                         live_until - std::chrono::steady_clock::now()));
    inst.to = int64_t(pleg::realtime_now_ns());
    EXPECT_EQ((*d)->stop(), 0) << "restart " << i;
    inst.events = (*d)->events();
    inst.log = (*d)->log();
    instances.push_back(std::move(inst));
  }
  auto result = churn.get();
  ASSERT_TRUE(result.ok()) << result.error().message;
  ASSERT_EQ(result->exit_code, 0) << result->err;
  EXPECT_GE(instances.size(), size_t(kRestarts - 2)) << "restarts took longer than expected";

  std::map<std::string, Life> lives;
  for (const auto& line : lines_of(result->out)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.value("op", "") == "pod") {
      lives[j["sandbox_id"]].running_from = 0;  // made before any instance started
      continue;
    }
    if (!j.contains("call") || !j.value("ok", false) || !j.contains("container_id")) continue;
    auto& life = lives[j["container_id"].get<std::string>()];
    const std::string call = j["call"];
    if (call == "StartContainer") life.running_from = j["t_end_ns"].get<int64_t>();
    if (call == "StopContainer") life.stop_begin = j["t_begin_ns"].get<int64_t>();
    if (call == "RemoveContainer") life.remove_begin = j["t_begin_ns"].get<int64_t>();
  }
  ASSERT_GT(lives.size(), 50u) << "the churn made too few containers";

  size_t checked_starts = 0;
  for (size_t n = 0; n < instances.size(); ++n) {
    const auto& inst = instances[n];
    std::map<std::string, int> started;
    for (const auto& e : inst.events) {
      const std::string id = e.value("container_id", "");
      auto it = lives.find(id);
      if (it == lives.end()) continue;  // not the churn's
      const std::string type = e["type"];
      const int64_t at = e["emit_ts_ns"].get<int64_t>();
      if (type == "ContainerStarted") ++started[id];
      if (type == "ContainerDied")
        EXPECT_GE(at, it->second.stop_begin) << "instance " << n << " reported a death early: " << e.dump();
      if (type == "ContainerRemoved")
        EXPECT_GE(at, it->second.remove_begin) << "instance " << n << " reported a removal early: " << e.dump();
    }
    for (const auto& [id, life] : lives) {
      // Alive while the instance served, with a second's margin before its SIGTERM for events
      // still on their way.
      const bool alive = life.running_from < inst.to - 1'000'000'000 && life.stop_begin > inst.from;
      const int count = started.count(id) ? started[id] : 0;
      EXPECT_LE(count, 1) << "instance " << n << " reported " << id << " started " << count << " times";
      if (alive) {
        EXPECT_EQ(count, 1) << "instance " << n << " did not report " << id << " started; its log of it:\n"
                            << lines_mentioning(inst.log, id.substr(0, 12));
        ++checked_starts;
      }
    }
  }
  EXPECT_GT(checked_starts, instances.size() * 3) << "too few containers alive during instances";
  std::printf("restart storm: %zu kplegd instances, %zu containers and sandboxes, %zu alive during "
              "an instance and reported started by it exactly once\n",
              instances.size(), lives.size(), checked_starts);
}

}  // namespace
}  // namespace kpleg::testing
