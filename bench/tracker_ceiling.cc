// kpleg-bench-ceiling: the capacity of kplegd's kernel-driven path apart from the runtime and
// the kernel. The Tracker (with its CgroupIndex, pod work queue, confirmations and removal
// sweep) is fed the kernel events of container lifecycles (cgroup mkdir, first exec, init
// exit, cgroup rmdir) as fast as it takes them, against an in-process runtime that answers at
// once (FakeCriClient). Lifecycles run in waves of --in-flight containers: all start, then all
// die, then all are removed. Prints one JSON object: transitions per second sustained, process
// CPU per transition, CRI calls per lifecycle, and how many events were missed or duplicated.
//
// The process CPU includes the in-process runtime and the feeding thread; run it under
// `valgrind --tool=callgrind` for an instruction count that does not depend on how busy the
// machine is (bench/run.sh --ceiling does both).
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cgroup/cgroup_index.h"
#include "common/logging.h"
#include "pleg/tracker.h"
#include "support/fake_cri_client.h"

namespace {

using namespace std::chrono_literals;
using kpleg::pleg::EventType;
namespace v1 = ::runtime::v1;

class CountingSink : public kpleg::pleg::EventSink {
 public:
  void publish(kpleg::pleg::PodLifecycleEvent ev) override {
    std::lock_guard lk(mu_);
    ++by_type_[ev.type];
    ++seen_[{ev.container_id, ev.type}];
    cv_.notify_all();
  }
  // Waits until `n` events of `type` were published in all; false after `timeout`.
  bool wait(EventType type, size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return by_type_[type] >= n; });
  }
  size_t count(EventType type) {
    std::lock_guard lk(mu_);
    return by_type_[type];
  }
  size_t duplicates() {
    std::lock_guard lk(mu_);
    size_t d = 0;
    for (const auto& [_, n] : seen_) d += n > 1 ? n - 1 : 0;
    return d;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<EventType, size_t> by_type_;
  std::map<std::pair<std::string, EventType>, size_t> seen_;
};

// The calls the tracker makes (the benchmark's own create/start/remove are not counted).
uint64_t tracker_calls(const kpleg::cri::FakeCriClient& cri) {
  using M = kpleg::cri::CriMethod;
  uint64_t n = 0;
  for (M m : {M::kContainerStatus, M::kPodSandboxStatus, M::kListContainers, M::kListPodSandbox})
    n += cri.calls(m);
  return n;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-ceiling: the kernel-driven path's own capacity, with a runtime "
               "that answers at once"};
  int lifecycles = 20000, pods = 50, in_flight = 200, sweep_ms = 1;
  app.add_option("--lifecycles", lifecycles, "Container lifecycles (start, death, removal)")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  app.add_option("--pods", pods, "Pods the containers are spread over")
      ->check(CLI::Range(1, 10'000))
      ->capture_default_str();
  app.add_option("--in-flight", in_flight, "Containers per wave")
      ->check(CLI::Range(1, 100'000))
      ->capture_default_str();
  app.add_option("--sweep-period-ms", sweep_ms,
                 "Removal sweep period; a long one makes one sweep per wave, so that an instruction "
                 "count does not depend on how fast the waves went")
      ->check(CLI::Range(1, 10'000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  (void)kpleg::setup_logging("warn", kpleg::LogFormat::kText);

  kpleg::cri::FakeCriClient cri;
  kpleg::cgroup::CgroupIndex index;
  CountingSink sink;
  kpleg::pleg::TrackerOptions opts;
  // Sweeps soon after a wave's deaths: the sweep is part of what is measured.
  opts.removal_sweep_first = std::chrono::milliseconds(sweep_ms);
  opts.removal_sweep_period = std::chrono::milliseconds(sweep_ms);
  opts.removal_sweep_idle_max = std::chrono::milliseconds(sweep_ms * 10);
  kpleg::pleg::Tracker tracker(cri, index, sink, opts);

  std::vector<std::pair<std::string, v1::PodSandboxConfig>> sandboxes;
  std::vector<std::string> uids;
  uint64_t next_cgroup = 1000;
  auto mkdir = [&](uint64_t cgroup, const std::string& path) {
    kpleg::kernel::KernelEvent ev;
    ev.body = kpleg::kernel::CgroupMkdir{cgroup, 0, 0, path, false};
    tracker.on_kernel_event(ev);
  };
  auto signal = [&](auto body) {
    kpleg::kernel::KernelEvent ev;
    ev.ktime_ns = 1;
    ev.body = std::move(body);
    tracker.on_kernel_event(ev);
  };
  for (int p = 0; p < pods; ++p) {
    const std::string uid = "00000000-0000-4000-8000-" + std::to_string(100000000000 + p);
    v1::PodSandboxConfig cfg;
    cfg.mutable_metadata()->set_name("pod-" + std::to_string(p));
    cfg.mutable_metadata()->set_namespace_("ceiling");
    cfg.mutable_metadata()->set_uid(uid);
    (*cfg.mutable_labels())["io.kubernetes.pod.uid"] = uid;
    (*cfg.mutable_labels())["io.kubernetes.pod.name"] = "pod-" + std::to_string(p);
    (*cfg.mutable_labels())["io.kubernetes.pod.namespace"] = "ceiling";
    auto sb = cri.run_pod_sandbox(cfg);
    if (!sb) {
      std::fprintf(stderr, "kpleg-bench-ceiling: %s\n", sb.error().message.c_str());
      return 1;
    }
    const uint64_t cg = next_cgroup++;
    mkdir(cg, "/kubepods/burstable/pod" + uid + "/" + *sb);
    signal(kpleg::kernel::ProcessExec{cg, 1, 1, 0, "pause", "/pause"});
    sandboxes.emplace_back(*sb, cfg);
    uids.push_back(uid);
  }
  if (!sink.wait(EventType::kContainerStarted, size_t(pods), 30s)) {
    std::fprintf(stderr, "kpleg-bench-ceiling: the sandboxes were not confirmed\n");
    return 1;
  }
  const uint64_t calls0 = tracker_calls(cri);

  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  bool timed_out = false;
  int done = 0;
  while (done < lifecycles && !timed_out) {
    const int wave = std::min(in_flight, lifecycles - done);
    struct C {
      std::string id;
      uint64_t cgroup;
    };
    std::vector<C> cs;
    for (int i = 0; i < wave; ++i) {
      const int p = (done + i) % pods;
      v1::ContainerConfig c;
      c.mutable_metadata()->set_name("c" + std::to_string(done + i));
      for (const auto& [k, v] : sandboxes[p].second.labels()) (*c.mutable_labels())[k] = v;
      (*c.mutable_labels())["io.kubernetes.container.name"] = c.metadata().name();
      auto id = cri.create_container(sandboxes[p].first, c, sandboxes[p].second);
      if (!id) {
        std::fprintf(stderr, "kpleg-bench-ceiling: %s\n", id.error().message.c_str());
        return 1;
      }
      const uint64_t cg = next_cgroup++;
      mkdir(cg, "/kubepods/burstable/pod" + uids[p] + "/" + *id);
      (void)cri.start_container(*id);
      signal(kpleg::kernel::ProcessExec{cg, 2, 2, 1, "app", "/app"});
      cs.push_back({*id, cg});
    }
    const size_t target = size_t(pods) + size_t(done + wave);
    timed_out |= !sink.wait(EventType::kContainerStarted, target, 60s);
    for (const auto& c : cs) {
      (void)cri.exit_container(c.id, 0);
      signal(kpleg::kernel::ProcessExit{c.cgroup, 2, 0, 0, false, false});
      signal(kpleg::kernel::CgroupRmdir{c.cgroup, 0, 0, "", false});
    }
    timed_out |= !sink.wait(EventType::kContainerDied, size_t(done + wave), 60s);
    for (const auto& c : cs) (void)cri.remove_container(c.id);
    timed_out |= !sink.wait(EventType::kContainerRemoved, size_t(done + wave), 60s);
    done += wave;
  }
  const double cpu = cpu_seconds() - cpu0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t calls = tracker_calls(cri) - calls0;
  tracker.stop();

  const size_t transitions = size_t(done) * 3;
  const size_t seen = sink.count(EventType::kContainerStarted) - size_t(pods) +
                      sink.count(EventType::kContainerDied) +
                      sink.count(EventType::kContainerRemoved);
  nlohmann::json out{{"lifecycles", done},
                     {"pods", pods},
                     {"in_flight", in_flight},
                     {"seconds", secs},
                     {"transitions", transitions},
                     {"transitions_per_s", double(transitions) / secs},
                     {"cpu_s", cpu},
                     {"cpu_us_per_transition", cpu * 1e6 / double(transitions)},
                     {"cri_calls", calls},
                     {"cri_calls_per_lifecycle", double(calls) / double(done)},
                     {"missed", transitions > seen ? transitions - seen : 0},
                     {"duplicates", sink.duplicates()},
                     {"timed_out", timed_out}};
  std::printf("%s\n", out.dump().c_str());
  return timed_out || transitions != seen || sink.duplicates() != 0 ? 1 : 0;
}
