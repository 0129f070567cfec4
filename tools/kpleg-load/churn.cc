#include "kpleg-load/churn.h"

#include <chrono>
#include <deque>
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
  std::deque<Live> running, exited;
  std::vector<uint32_t> attempts(pods.size(), 0);
  uint64_t transitions = 0, errors = 0, consecutive_errors = 0;
  size_t next_pod = 0;
  auto base = [&](size_t pod) {
    return json{{"pod_uid", pods[pod].spec.uid}, {"sandbox_id", pods[pod].sandbox_id}};
  };

  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(1.0 / c.rate));
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(c.duration_s));
  constexpr uint64_t kMaxConsecutiveErrors = 10;
  bool gave_up = false;
  for (uint64_t tick = 0;; ++tick) {
    const auto at = t0 + tick * interval;
    if (at >= end) break;
    std::this_thread::sleep_until(at);  // pacing of the load, not synchronisation
    bool ok = true;
    if (!exited.empty()) {
      Live l = exited.front();
      exited.pop_front();
      int64_t b = realtime_ns();
      auto s = cri.remove_container(l.id);
      Load::emit_call(base(l.pod), "RemoveContainer", "removed", b, realtime_ns(), l.id, s);
      ok = s.ok();
    } else if (running.size() >= static_cast<size_t>(c.max_live)) {
      Live l = running.front();
      running.pop_front();
      int64_t b = realtime_ns();
      auto s = cri.stop_container(l.id, c.grace);
      Load::emit_call(base(l.pod), "StopContainer", "died", b, realtime_ns(), l.id, s);
      ok = s.ok();
      exited.push_back(l);  // removed on a later tick even if the stop failed
    } else {
      size_t p = next_pod++ % pods.size();
      ContainerSpec spec;
      spec.name = "churn";
      spec.attempt = attempts[p]++;
      spec.image = o.image;
      spec.command = *command;
      spec.memory_limit_bytes = o.memory_limit;
      json trace = base(p);
      auto id = load.start_container(pods[p], spec, &trace);
      ok = id.ok();
      if (ok) running.push_back(Live{p, *id});
    }
    if (ok) {
      ++transitions;
      consecutive_errors = 0;
    } else {
      ++errors;
      if (++consecutive_errors >= kMaxConsecutiveErrors) {
        gave_up = true;
        break;
      }
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Tear down: the containers go with their pods.
  int teardown_failures = teardown_pods();
  emit(json{{"op", "churn"},
            {"transitions", transitions},
            {"errors", errors},
            {"elapsed_s", elapsed},
            {"rate", c.rate},
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
