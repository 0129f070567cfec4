#include "pleg/tracker_core.h"

#include <spdlog/spdlog.h>

#include <string_view>

namespace kpleg::pleg {

uint64_t TrackerStats::corrections_total() const {
  uint64_t n = 0;
  for (const auto& [_, v] : corrections) n += v;
  return n;
}

TrackerCore::TrackerCore(cri::CriClient& cri, EventSink& sink, TrackerOptions opts,
                         EventLoop& loop)
    : cri_(cri),
      opts_(opts),
      loop_(loop),
      async_looks_(cri.async_status_calls(loop)),
      offload_(async_looks_ ? 1 : opts.workers),
      sink_(sink) {}

void TrackerCore::stop() {
  loop_.call([this] {
    stopping_ = true;  // no more looks: what the cancelled ones retry is dropped
    async_looks_.reset();
  });
  offload_.stop();
}

void TrackerCore::trace_look(const std::string& id, bool kind_known, bool sandbox,
                             const Result<Observation>& obs) {
  // Checked first: the arguments would cost a copy or two per look even with tracing off.
  if (!spdlog::should_log(spdlog::level::trace)) return;
  spdlog::trace("tracker: look at {} ({}{}): {}", std::string_view(id).substr(0, 12),
                sandbox ? "sandbox" : "container", kind_known ? "" : ", kind guessed",
                obs.ok() ? std::string_view(to_string(obs->state))
                         : std::string_view(obs.error().message));
}

void TrackerCore::look(const std::string& pod_uid, const std::string& id, bool kind_known,
                       bool sandbox, OnLook done) {
  if (stopping_) return;
  if (async_looks_) {
    look_async(*async_looks_, id, kind_known, sandbox,
               [this, id, kind_known, sandbox, done = std::move(done)](Result<Observation> obs) {
                 trace_look(id, kind_known, sandbox, obs);
                 note_call(id, obs.ok() ? nullptr : &obs.error());
                 done(std::move(obs));
               });
    return;
  }
  offload_.run(pod_uid.empty() ? id : pod_uid, [this, id, kind_known, sandbox,
                                                done = std::move(done)]() mutable {
    auto obs = pleg::look(cri_, id, kind_known, sandbox);
    trace_look(id, kind_known, sandbox, obs);
    loop_.post([this, id, obs = std::move(obs), done = std::move(done)]() mutable {
      note_call(id, obs.ok() ? nullptr : &obs.error());
      done(std::move(obs));
    });
  });
}

int TrackerCore::advance(Record& rec, ContainerState target, const ContainerSnapshot& snap,
                         EventSource source, bool correction, Events& out) {
  const size_t first = out.size();
  const int n =
      table_.advance(rec, target, snap, source, correction, Clock::now(), realtime_now_ns(), out);
  if (correction) {
    for (size_t i = first; i < out.size(); ++i) ++stats_.corrections[to_string(out[i].type)];
  }
  if (n > 0 && target == ContainerState::kExited && hooks_.exited) hooks_.exited(rec);
  return n;
}

void TrackerCore::publish(Events& out) {
  for (auto& ev : out) sink_.publish(std::move(ev));
  out.clear();
}

void TrackerCore::inconsistent(const std::string& reason) {
  uint64_t left_out = 0;
  if (inconsistency_log_.allow(left_out)) {
    if (left_out > 0) {
      spdlog::warn("tracker: {}; reconciling ({} more like it since the last such line)", reason,
                   left_out);
    } else {
      spdlog::warn("tracker: {}; reconciling", reason);
    }
  }
  if (on_inconsistency_) on_inconsistency_(reason);
}

void TrackerCore::note_call(const std::string& id, const Error* error) {
  const Record* rec = table_.find(id);
  const std::string& pod =
      rec == nullptr || rec->identity.pod.uid.empty() ? id : rec->identity.pod.uid;
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
  std::vector<PodTrouble> out;
  auto now = Clock::now();
  for (const auto& [pod, t] : troubles_)
    out.push_back({pod, t.failures, now - t.since, t.last_error});
  return out;
}

}  // namespace kpleg::pleg
