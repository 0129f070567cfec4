#include "pleg/tracker_core.h"

#include <spdlog/spdlog.h>

#include <string_view>

namespace kpleg::pleg {

uint64_t TrackerStats::corrections_total() const {
  uint64_t n = 0;
  for (const auto& [_, v] : corrections) n += v;
  return n;
}

TrackerCore::TrackerCore(cri::CriClient& cri, EventSink& sink, TrackerOptions opts)
    : cri(cri), opts(opts), queue(opts.workers), sink_(sink) {}

Result<Observation> TrackerCore::look(const std::string& id, bool kind_known, bool sandbox) {
  auto obs = pleg::look(cri, id, kind_known, sandbox);
  note_call(id, obs.ok() ? nullptr : &obs.error());
  // Checked first: the arguments would cost a copy or two per look even with tracing off.
  if (spdlog::should_log(spdlog::level::trace)) {
    spdlog::trace("tracker: look at {} ({}{}): {}", std::string_view(id).substr(0, 12),
                  sandbox ? "sandbox" : "container", kind_known ? "" : ", kind guessed",
                  obs.ok() ? std::string_view(to_string(obs->state))
                           : std::string_view(obs.error().message));
  }
  return obs;
}

int TrackerCore::advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
                         EventSource source, bool correction, Events& out) {
  const size_t first = out.size();
  const int n =
      table.advance(rec, target, snap, source, correction, Clock::now(), realtime_now_ns(), out);
  if (correction) {
    for (size_t i = first; i < out.size(); ++i) ++stats.corrections[to_string(out[i].type)];
  }
  if (n > 0 && target == ContainerState::kExited && on_exited) on_exited(rec);
  return n;
}

void TrackerCore::publish(Lock& lk, Events& out) {
  if (out.empty()) {
    lk.unlock();
    return;
  }
  std::lock_guard pub(publish_mu_);
  lk.unlock();
  for (auto& ev : out) sink_.publish(std::move(ev));
  out.clear();
}

PodWorkTicket TrackerCore::post(const std::string& pod_uid, const std::string& id,
                           PodWorkQueue::Task task, Clock::time_point at) {
  return queue.post(pod_uid.empty() ? id : pod_uid, std::move(task), at);
}

void TrackerCore::set_inconsistency_handler(std::function<void(const std::string&)> fn) {
  std::lock_guard lk(mu);
  on_inconsistency_ = std::move(fn);
}

void TrackerCore::inconsistent(const std::string& reason) {
  std::function<void(const std::string&)> fn;
  {
    std::lock_guard lk(mu);
    fn = on_inconsistency_;
  }
  uint64_t left_out = 0;
  if (inconsistency_log_.allow(left_out)) {
    if (left_out > 0) {
      spdlog::warn("tracker: {}; reconciling ({} more like it since the last such line)", reason,
                   left_out);
    } else {
      spdlog::warn("tracker: {}; reconciling", reason);
    }
  }
  if (fn) fn(reason);
}

void TrackerCore::note_call(const std::string& id, const Error* error) {
  std::lock_guard lk(mu);
  const Record* rec = table.find(id);
  const std::string& pod = rec == nullptr || rec->identity.pod_uid.empty() ? id
                                                                           : rec->identity.pod_uid;
  if (!error) {
    if (!troubles_.empty()) troubles_.erase(pod);
    return;
  }
  auto [t, fresh] = troubles_.try_emplace(pod);
  if (fresh) t->second.since = Clock::now();
  ++t->second.failures;
  t->second.last_error = error->message;
}

std::vector<PodTrouble> TrackerCore::troubled_pods() const {
  std::lock_guard lk(mu);
  std::vector<PodTrouble> out;
  auto now = Clock::now();
  for (const auto& [pod, t] : troubles_)
    out.push_back({pod, t.failures, now - t.since, t.last_error});
  return out;
}

}  // namespace kpleg::pleg
