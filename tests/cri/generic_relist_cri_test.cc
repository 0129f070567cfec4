// GenericRelist against the test bed's containerd over the real CRI socket: kubelet-shaped pods
// made by kpleg-load must produce exactly the events the kubelet's generic PLEG would produce.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cri/grpc_cri_client.h"
#include "cri/testbed.h"
#include "pleg/generic_relist.h"
#include "support/eventually.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using pleg::ContainerState;
using pleg::EventType;
using pleg::PodLifecycleEvent;
using Clock = std::chrono::steady_clock;
namespace v1 = runtime::v1;

// Keeps the events of one pod namespace (other tests share the runtime).
class NamespaceSink final : public pleg::EventSink {
 public:
  explicit NamespaceSink(std::string ns) : ns_(std::move(ns)) {}
  void publish(PodLifecycleEvent ev) override {
    if (ev.pod_namespace != ns_) return;
    std::lock_guard lock(mu_);
    events_.push_back(std::move(ev));
  }
  std::vector<PodLifecycleEvent> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::vector<PodLifecycleEvent> of(const std::string& container_id) const {
    std::vector<PodLifecycleEvent> out;
    for (auto& e : events())
      if (e.container_id == container_id) out.push_back(e);
    return out;
  }
  std::vector<EventType> types_of(const std::string& container_id) const {
    std::vector<EventType> out;
    for (auto& e : of(container_id)) out.push_back(e.type);
    return out;
  }

 private:
  const std::string ns_;
  mutable std::mutex mu_;
  std::vector<PodLifecycleEvent> events_;
};

std::string describe(const std::vector<EventType>& types) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < types.size(); ++i) s << (i ? ", " : "") << pleg::to_string(types[i]);
  s << "]";
  return s.str();
}

struct LoadedPod {
  std::string uid, name, sandbox_id;
  std::vector<std::pair<std::string, std::string>> containers;  // name, id
};

std::vector<LoadedPod> parse_run(const std::string& out) {
  std::vector<LoadedPod> pods;
  for (const auto& line : lines_of(out)) {
    auto j = json::parse(line);
    LoadedPod p{j["pod_uid"], j["pod_name"], j["sandbox_id"], {}};
    for (const auto& c : j["containers"]) p.containers.emplace_back(c["name"], c["container_id"]);
    pods.push_back(std::move(p));
  }
  return pods;
}

// Relists every 200 ms until `done` holds or the deadline passes, the way the kubelet's loop
// would meet the runtime (only faster: a 1 s period would also do, but slow the test down).
bool relist_until(pleg::GenericRelist& relist, const std::function<bool()>& done,
                  std::chrono::seconds within) {
  return eventually(
      [&] {
        (void)relist.relist_once();  // a failed relist (the runtime restarted by another test) retries
        return done();
      },
      within, 200ms);
}

// One successful relist (a relist can fail while another test restarts the runtime).
bool relist_succeeds(pleg::GenericRelist& relist) {
  return eventually([&] { return relist.relist_once().ok(); }, 30s, 200ms);
}

int64_t now_ns() { return static_cast<int64_t>(pleg::realtime_now_ns()); }

using GenericRelistCri = CriTestBedTest;

TEST_F(GenericRelistCri, KubeletShapedPodsGiveTheGenericPlegsEventsFromStartToRemoval) {
  auto client = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(client.ok()) << client.error().message;
  NamespaceSink sink(namespace_);
  std::vector<int64_t> durations;
  pleg::GenericRelistOptions options;
  options.on_relist = [&](const pleg::RelistStats& s) { durations.push_back(s.last_duration_ns); };
  pleg::GenericRelist relist(**client, sink, options);
  ASSERT_TRUE(relist_succeeds(relist)) << relist.stats().last_error;

  // Two containers per pod run the same command; the first to create the directory in the
  // pod's shared /dev/shm keeps running, the other exits 3 after a second.
  const auto t_run = Clock::now();
  auto run = std::async(std::launch::async, [&] {
    return run_kpleg_load({"run", "--pods", "2", "--containers", "2", "--namespace", namespace_,
                           "--command",
                           "sh -c 'if mkdir /dev/shm/kpleg-long 2>/dev/null; then exec sleep "
                           "100000; fi; sleep 1; exit 3'"});
  });
  // Relist while kpleg-load works, so no container can start and die unseen.
  std::vector<LoadedPod> pods;
  auto died_count = [&] {
    int n = 0;
    for (const auto& e : sink.events()) n += e.type == EventType::kContainerDied;
    return n;
  };
  ASSERT_TRUE(relist_until(
      relist,
      [&] {
        if (pods.empty() && run.wait_for(0s) == std::future_status::ready) {
          auto r = run.get();
          EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.error().message);
          if (r.ok()) pods = parse_run(r->out);
          if (pods.empty()) return true;  // fail below
        }
        return !pods.empty() && died_count() >= 2;
      },
      30s))
      << "events so far: " << sink.events().size();
  const auto t_settled = Clock::now();
  ASSERT_EQ(pods.size(), 2u);

  // A few more relists: nothing more may come while the pods are left alone.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(relist_succeeds(relist));
  std::map<std::string, std::string> long_running;  // pod uid -> container id
  for (const auto& pod : pods) {
    SCOPED_TRACE("pod " + pod.name);
    EXPECT_EQ(sink.types_of(pod.sandbox_id), std::vector<EventType>{EventType::kContainerStarted})
        << describe(sink.types_of(pod.sandbox_id));
    ASSERT_EQ(pod.containers.size(), 2u);
    std::vector<std::string> short_lived;
    for (const auto& [name, id] : pod.containers) {
      auto types = sink.types_of(id);
      if (types == std::vector<EventType>{EventType::kContainerStarted}) {
        long_running[pod.uid] = id;
      } else {
        EXPECT_EQ(types,
                  (std::vector<EventType>{EventType::kContainerStarted, EventType::kContainerDied}))
            << name << ": " << describe(types);
        short_lived.push_back(id);
      }
      for (const auto& e : sink.of(id)) {
        EXPECT_EQ(e.pod_uid, pod.uid);
        EXPECT_EQ(e.pod_name, pod.name);
        EXPECT_EQ(e.pod_namespace, namespace_);
        EXPECT_EQ(e.container_name, name);
        EXPECT_FALSE(e.sandbox);
        EXPECT_EQ(e.source, pleg::EventSource::kRelist);
        // The runtime's timestamps, in nanoseconds of this century's wall clock.
        EXPECT_GT(e.status.created_at_ns, now_ns() - int64_t(600e9));
        EXPECT_LE(e.status.created_at_ns, e.status.started_at_ns);
        EXPECT_GE(static_cast<int64_t>(e.emit_ts_ns), e.status.started_at_ns);
      }
    }
    ASSERT_EQ(short_lived.size(), 1u) << "exactly one container of the pod exits";
    ASSERT_TRUE(long_running.count(pod.uid));
    auto died = sink.of(short_lived[0]).back();
    EXPECT_EQ(died.exit_code, 3);
    EXPECT_EQ(died.status.state, ContainerState::kExited);
    EXPECT_EQ(died.status.exit_code, 3);
    EXPECT_FALSE(died.reason.empty());
    const int64_t lived = died.status.finished_at_ns - died.status.started_at_ns;
    EXPECT_GE(lived, int64_t(900'000'000)) << "sleep 1 then exit: about a second";
    EXPECT_LT(lived, int64_t(10'000'000'000));
    EXPECT_GE(static_cast<int64_t>(died.emit_ts_ns), died.status.finished_at_ns);

    auto sandbox_started = sink.of(pod.sandbox_id).at(0);
    EXPECT_TRUE(sandbox_started.sandbox);
    EXPECT_EQ(sandbox_started.status.state, ContainerState::kRunning);
    EXPECT_GT(sandbox_started.status.created_at_ns, now_ns() - int64_t(600e9));
  }

  // The confirmed view agrees with the runtime.
  auto confirmed = relist.pods();
  for (const auto& pod : pods) {
    auto it = std::find_if(confirmed.begin(), confirmed.end(),
                           [&](const pleg::PodRecord& p) { return p.uid == pod.uid; });
    ASSERT_NE(it, confirmed.end());
    EXPECT_EQ(it->name, pod.name);
    EXPECT_EQ(it->namespace_, namespace_);
    // Its sandbox first, then its two containers.
    ASSERT_EQ(it->containers.size(), 3u);
    ASSERT_TRUE(it->containers[0].sandbox);
    EXPECT_EQ(it->containers[0].state, ContainerState::kRunning);
    for (const auto& c : it->containers) {
      if (c.sandbox) continue;
      auto status = (*client)->container_status(c.id);
      ASSERT_TRUE(status.ok()) << status.error().message;
      EXPECT_EQ(c.state, pleg::runtime_state(status->state()));
      EXPECT_EQ(c.state,
                c.id == long_running[pod.uid] ? ContainerState::kRunning : ContainerState::kExited);
    }
  }

  // Removal the kubelet's way (StopPodSandbox kills what still runs, RemovePodSandbox removes
  // everything), while relisting.
  auto removal = std::async(std::launch::async, [&] {
    std::vector<Result<ProcessResult>> results;
    for (const auto& pod : pods) results.push_back(run_kpleg_load({"remove-pod", pod.sandbox_id}));
    return results;
  });
  auto all_removed = [&] {
    for (const auto& pod : pods) {
      auto t = sink.types_of(pod.sandbox_id);
      if (t.empty() || t.back() != EventType::kContainerRemoved) return false;
      for (const auto& [name, id] : pod.containers) {
        auto ct = sink.types_of(id);
        if (ct.empty() || ct.back() != EventType::kContainerRemoved) return false;
      }
    }
    return true;
  };
  ASSERT_TRUE(relist_until(relist, all_removed, 60s));
  for (auto& r : removal.get()) {
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->exit_code, 0) << r->err;
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(relist_succeeds(relist));

  const std::vector<EventType> lifecycle = {EventType::kContainerStarted, EventType::kContainerDied,
                                            EventType::kContainerRemoved};
  int killed_seen_exited = 0;
  for (const auto& pod : pods) {
    SCOPED_TRACE("pod " + pod.name);
    EXPECT_EQ(sink.types_of(pod.sandbox_id), lifecycle) << describe(sink.types_of(pod.sandbox_id));
    for (const auto& [name, id] : pod.containers) {
      EXPECT_EQ(sink.types_of(id), lifecycle) << name << ": " << describe(sink.types_of(id));
    }
    // The long-running container died at StopPodSandbox: either seen exited (SIGKILL) or, when
    // stop and removal fell within one relist, seen gone.
    // (Seen exited in the list but removed before its status call: the event carries the
    // list's record, without exit code or finish time.)
    auto died = sink.of(long_running[pod.uid]).at(1);
    if (died.status.state == ContainerState::kExited && died.status.finished_at_ns != 0) {
      ++killed_seen_exited;
      EXPECT_EQ(died.exit_code, 137);
    } else if (died.status.state != ContainerState::kExited) {
      EXPECT_EQ(died.status.state, ContainerState::kNonExistent);
    }
    const auto remaining = relist.pods();  // a copy: iterate one vector, not two
    EXPECT_TRUE(std::ranges::none_of(remaining,
                                     [&](const pleg::PodRecord& p) { return p.uid == pod.uid; }));
  }

  auto stats = relist.stats();
  EXPECT_TRUE(relist.health().healthy) << relist.health().reason;
  EXPECT_TRUE(relist.health().pending_inspections.empty());
  std::sort(durations.begin(), durations.end());
  const auto ms = [](int64_t ns) { return double(ns) / 1e6; };
  std::cout << "relist against the test bed: " << stats.relists << " relists ("
            << stats.failed_relists << " failed), " << stats.inspections << " pod inspections, "
            << stats.events_published << " events; duration min/median/max "
            << ms(durations.front()) << "/" << ms(durations[durations.size() / 2]) << "/"
            << ms(durations.back()) << " ms; pods settled "
            << std::chrono::duration_cast<std::chrono::milliseconds>(t_settled - t_run).count()
            << " ms after kpleg-load run began; " << killed_seen_exited
            << " of 2 killed containers seen exited before removal\n";
}

// The relist loop on its own thread, against the real runtime: start, see a pod, stop promptly.
TEST_F(GenericRelistCri, RelistLoopSeesAPodAndStopsPromptly) {
  auto client = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(client.ok()) << client.error().message;
  NamespaceSink sink(namespace_);
  pleg::GenericRelistOptions options;
  options.period = 100ms;
  pleg::GenericRelist relist(**client, sink, options);
  relist.start();

  auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "1", "--namespace", namespace_,
                             "--command", "sleep 100000"});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;
  auto pods = parse_run(run->out);
  ASSERT_EQ(pods.size(), 1u);
  const std::string container = pods[0].containers.at(0).second;

  (void)eventually([&] { return !sink.types_of(container).empty(); }, 20s, 20ms);  // checked next
  EXPECT_EQ(sink.types_of(container), std::vector<EventType>{EventType::kContainerStarted});
  EXPECT_EQ(sink.types_of(pods[0].sandbox_id),
            std::vector<EventType>{EventType::kContainerStarted});

  const auto t0 = Clock::now();
  relist.stop();
  EXPECT_LT(Clock::now() - t0, 2s) << "stop waits at most for one relist in progress";
  EXPECT_FALSE(relist.running());
  EXPECT_GT(relist.stats().relists, 1u);
  EXPECT_TRUE(relist.health().healthy) << relist.health().reason;
}

}  // namespace
}  // namespace kpleg::testing
