#include "kpleg-load/churn.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::load {

int cmd_churn(cri::CriClient& cri, const PodOptions& o, const ChurnOptions& c) {
  if (auto s = require_pod_network(cri, o); !s) return fail(s.error().message);
  auto qos = effective_qos(o);
  if (!qos) return fail(qos.error().message);
  auto command = split_command(o.command);
  if (!command) return fail("--command: " + command.error().message);

  Load load(cri);
  std::vector<CreatedPod> pods;
  auto teardown_pods = [&] {
    int failures = 0;
    for (const auto& p : pods) {
      if (!load.remove_pod(p.sandbox_id, p.spec.uid, p.spec.log_directory)) ++failures;
    }
    return failures;
  };
  for (int i = 0; i < c.pods; ++i) {
    auto pod = load.create_pod(o, i, *qos);
    if (!pod) {
      teardown_pods();
      return fail("creating pod " + std::to_string(i) + ": " + pod.error().message);
    }
    emit(json{{"op", "pod"},
              {"pod_uid", pod->spec.uid},
              {"sandbox_id", pod->sandbox_id},
              {"cgroup_parent", pod->config.linux().cgroup_parent()}});
    pods.push_back(std::move(*pod));
  }

  struct Live {
    size_t pod;
    std::string id;
  };
  // The churn's state, under `mu` (open-loop ticks run on threads of their own).
  std::mutex mu;
  std::deque<Live> running, exited;
  size_t starting = 0, in_flight = 0, max_in_flight = 0;
  std::vector<uint32_t> attempts(pods.size(), 0);
  uint64_t transitions = 0, errors = 0, consecutive_errors = 0, late_ticks = 0, skipped_ticks = 0;
  size_t next_pod = 0;
  auto base = [&](size_t pod) {
    return json{{"pod_uid", pods[pod].spec.uid}, {"sandbox_id", pods[pod].sandbox_id}};
  };
  auto done = [&](bool ok) {
    std::lock_guard lk(mu);
    --in_flight;
    if (ok) {
      ++transitions;
      consecutive_errors = 0;
    } else {
      ++errors;
      ++consecutive_errors;
    }
  };
  // One tick: its transition is chosen under the lock, its CRI call made outside it.
  auto tick_once = [&] {
    std::unique_lock lk(mu);
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    if (!exited.empty()) {
      Live l = exited.front();
      exited.pop_front();
      lk.unlock();
      int64_t b = realtime_ns();
      auto s = cri.remove_container(l.id);
      Load::emit_call(base(l.pod), "RemoveContainer", "removed", b, realtime_ns(), l.id, s);
      done(s.ok());
    } else if (running.size() >= static_cast<size_t>(c.max_live) ||
               (c.open_loop && !running.empty() &&
                running.size() + starting >= static_cast<size_t>(c.max_live))) {
      Live l = running.front();
      running.pop_front();
      lk.unlock();
      int64_t b = realtime_ns();
      auto s = cri.stop_container(l.id, c.grace);
      Load::emit_call(base(l.pod), "StopContainer", "died", b, realtime_ns(), l.id, s);
      {
        std::lock_guard lk2(mu);
        exited.push_back(l);  // removed on a later tick even if the stop failed
      }
      done(s.ok());
    } else if (c.open_loop && starting >= static_cast<size_t>(c.max_live)) {
      // Every live slot is taken by a start still in flight: the runtime is behind the
      // schedule. The tick is dropped (counted), not queued: the load stays bounded.
      ++skipped_ticks;
      --in_flight;
    } else {
      size_t p = next_pod++ % pods.size();
      ContainerSpec spec;
      spec.name = "churn";
      spec.attempt = attempts[p]++;
      ++starting;
      lk.unlock();
      spec.image = o.image;
      spec.command = *command;
      spec.memory_limit_bytes = o.memory_limit;
      json trace = base(p);
      auto id = load.start_container(pods[p], spec, &trace);
      {
        std::lock_guard lk2(mu);
        --starting;
        if (id.ok()) running.push_back(Live{p, *id});
      }
      done(id.ok());
    }
  };

  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(1.0 / c.rate));
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(c.duration_s));
  constexpr uint64_t kMaxConsecutiveErrors = 10;
  bool gave_up = false;
  std::vector<std::thread> ticks;
  uint64_t scheduled = 0;
  for (uint64_t tick = 0;; ++tick) {
    const auto at = t0 + tick * interval;
    if (at >= end) break;
    std::this_thread::sleep_until(at);  // pacing of the load, not synchronisation
    ++scheduled;
    if (std::chrono::steady_clock::now() - at > interval) ++late_ticks;
    if (c.open_loop) {
      // Open loop: the tick starts on its schedule whatever the calls before it still wait for.
      ticks.emplace_back(tick_once);
    } else {
      tick_once();
    }
    std::lock_guard lk(mu);
    if (consecutive_errors >= kMaxConsecutiveErrors) {
      gave_up = true;
      break;
    }
  }
  const double scheduled_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& t : ticks) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Tear down: the containers go with their pods.
  int teardown_failures = teardown_pods();
  emit(json{
      {"op", "churn"},
      {"transitions", transitions},
      {"errors", errors},
      {"elapsed_s", elapsed},
      {"rate", c.rate},
      {"open_loop", c.open_loop},
      {"scheduled", scheduled},
      {"late_ticks", late_ticks},
      {"skipped_ticks", skipped_ticks},
      {"max_in_flight", max_in_flight},
      // Transitions made over the time their ticks were scheduled in.
      {"achieved_rate", scheduled_s > 0 ? static_cast<double>(transitions) / scheduled_s : 0.0},
      {"pods", pods.size()},
      {"teardown_failures", teardown_failures}});
  if (gave_up)
    return fail("gave up after " + std::to_string(kMaxConsecutiveErrors) +
                " failed CRI calls in a row");
  if (teardown_failures > 0)
    return fail(std::to_string(teardown_failures) + " pod(s) could not be removed");
  return errors == 0 ? 0 : 1;
}

}  // namespace kpleg::load
