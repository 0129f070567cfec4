#include "pleg/generic_relist.h"

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>

namespace kpleg::pleg {
namespace {

int64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool not_found(const Error& e) { return e.code == grpc::StatusCode::NOT_FOUND; }

std::string pod_ref(const PodRecord& pod) {
  return pod.namespace_ + "/" + pod.name + " (" + pod.uid + ")";
}

Error inspection_error(const PodRecord& pod, const Error& e) {
  return Error{e.code, "inspecting pod " + pod_ref(pod) + ": " + e.message};
}

}  // namespace

GenericRelist::GenericRelist(cri::CriClient& cri, EventSink& sink, GenericRelistOptions options)
    : cri_(cri), sink_(sink), options_(std::move(options)) {
  if (!options_.realtime_ns) options_.realtime_ns = [] { return clock_ns(CLOCK_REALTIME); };
  if (!options_.monotonic_ns) options_.monotonic_ns = [] { return clock_ns(CLOCK_MONOTONIC); };
}

GenericRelist::~GenericRelist() { stop(); }

Result<GenericRelist::Inspection> GenericRelist::inspect(const PodRecord& pod) {
  Inspection out;

  // GetPodStatus selects the pod's sandboxes and containers by the kubelet's pod uid label. A
  // pod without that label (not made by a kubelet) can only be found through its sandboxes.
  std::vector<std::string> sandbox_ids;
  if (pod.labelled) {
    v1::PodSandboxFilter filter;
    (*filter.mutable_label_selector())[kPodUidLabel] = pod.uid;
    auto sandboxes = cri_.list_pod_sandboxes(filter);
    if (!sandboxes) return inspection_error(pod, sandboxes.error());
    // Newest first, as getSandboxIDByPodUID orders them.
    std::stable_sort(sandboxes->begin(), sandboxes->end(),
                     [](const auto& a, const auto& b) { return a.created_at() > b.created_at(); });
    for (const auto& s : *sandboxes) sandbox_ids.push_back(s.id());
  } else {
    for (const auto& s : pod.containers)
      if (s.sandbox) sandbox_ids.push_back(s.id);
  }
  for (const auto& id : sandbox_ids) {
    auto status = cri_.pod_sandbox_status(id);
    // Removed between the list and the status call: normal, and not a failure (the kubelet's
    // rule too); the next relist sees it gone.
    if (!status && not_found(status.error())) continue;
    if (!status) return inspection_error(pod, status.error());
    out[id] = from_status(*status);
  }

  std::vector<v1::Container> containers;
  if (pod.labelled) {
    v1::ContainerFilter filter;
    (*filter.mutable_label_selector())[kPodUidLabel] = pod.uid;
    auto listed = cri_.list_containers(filter);
    if (!listed) return inspection_error(pod, listed.error());
    containers = std::move(*listed);
  } else {
    for (const auto& id : sandbox_ids) {
      v1::ContainerFilter filter;
      filter.set_pod_sandbox_id(id);
      auto listed = cri_.list_containers(filter);
      if (!listed) return inspection_error(pod, listed.error());
      for (auto& c : *listed) containers.push_back(std::move(c));
    }
  }
  for (const auto& c : containers) {
    auto status = cri_.container_status(c.id());
    if (!status && not_found(status.error())) continue;
    if (!status) return inspection_error(pod, status.error());
    out[c.id()] = from_status(*status);
  }
  return out;
}

Status GenericRelist::relist_once() {
  std::lock_guard relist_lock(relist_mu_);
  const int64_t start_mono = options_.monotonic_ns();
  const int64_t start_rt = options_.realtime_ns();
  {
    std::lock_guard lock(state_mu_);
    ++stats_.relists;
    stats_.last_start_ns = start_rt;
    if (succeeded_once_) stats_.last_interval_ns = start_mono - last_success_mono_;
  }

  auto sandboxes = cri_.list_pod_sandboxes(v1::PodSandboxFilter{});
  if (!sandboxes)
    return finish_relist(start_mono,
                         Error{sandboxes.error().code, "relist: " + sandboxes.error().message});
  auto containers = cri_.list_containers(v1::ContainerFilter{});
  if (!containers)
    return finish_relist(start_mono,
                         Error{containers.error().code, "relist: " + containers.error().message});
  RuntimeSnapshot snapshot = build_snapshot(*sandboxes, *containers);
  {
    std::lock_guard lock(state_mu_);
    succeeded_once_ = true;
    last_success_mono_ = start_mono;
    stats_.last_success_ns = start_rt;
    stats_.pods = snapshot.pods.size();
    stats_.containers = snapshot.container_count();
  }

  // The kubelet's podRecords.setCurrent.
  for (auto& [uid, record] : records_) record.current.reset();
  for (auto& [uid, pod] : snapshot.pods) records_[uid].current = std::move(pod);

  std::map<std::string, PendingInspection> still_pending;
  uint64_t inspections = 0, failed_inspections = 0, published = 0;
  std::string last_inspection_error;
  for (auto it = records_.begin(); it != records_.end();) {
    const std::string& uid = it->first;
    Record& record = it->second;
    const PodRecord* old_pod = record.old.get();
    const PodRecord* pod = record.current ? &*record.current : nullptr;
    if (old_pod == nullptr && pod == nullptr) {  // never confirmed, and now gone
      it = records_.erase(it);
      continue;
    }
    const PodRecord& identity = pod != nullptr ? *pod : *old_pod;

    std::vector<PodLifecycleEvent> events;
    for (const ContainerRecord* c : containers_of(old_pod, pod)) {
      ContainerState old_state =
          old_pod != nullptr ? pleg_state_of(*old_pod, c->id) : ContainerState::kNonExistent;
      ContainerState new_state =
          pod != nullptr ? pleg_state_of(*pod, c->id) : ContainerState::kNonExistent;
      for (auto& ev : generate_events(identity, *c, old_state, new_state))
        events.push_back(std::move(ev));
    }
    auto pending = pending_.find(uid);
    const bool reinspect = pending != pending_.end();
    if (events.empty() && !reinspect) {
      ++it;
      continue;
    }

    Inspection inspection;
    if (pod != nullptr) {
      ++inspections;
      auto inspected = inspect(*pod);
      if (!inspected) {
        // The record stays as it was, so this relist's diff comes back next time.
        ++failed_inspections;
        last_inspection_error = inspected.error().message;
        PendingInspection p{*pod, inspected.error().message, 1, start_rt};
        if (reinspect) {
          p.attempts = pending->second.attempts + 1;
          p.first_failed_ns = pending->second.first_failed_ns;
        }
        spdlog::log(p.attempts == 1 ? spdlog::level::warn : spdlog::level::debug,
                    "relist: ignoring events of pod {} until it can be inspected: {}",
                    pod_ref(*pod), p.error);
        still_pending.emplace(uid, std::move(p));
        ++it;
        continue;
      }
      inspection = std::move(*inspected);
    }

    // Each event carries what the inspection said about its container; a container the
    // inspection no longer found (removed) gets its listed state.
    const int64_t emit_ts = options_.realtime_ns();
    for (auto& ev : events) {
      if (auto s = inspection.find(ev.container_id); s != inspection.end()) {
        ev.status = s->second;
      } else if (const ContainerRecord* c = pod != nullptr ? pod->find(ev.container_id) : nullptr) {
        ev.status = c->status;
      } else {
        ev.status = ContainerSnapshot{};
        ev.status.state = ContainerState::kNonExistent;
      }
      if (ev.type == EventType::kContainerDied) {
        ev.exit_code = ev.status.exit_code;
        ev.reason = ev.status.reason;
      }
      ev.source = options_.source;
      ev.emit_ts_ns = static_cast<uint64_t>(emit_ts);
    }

    // The kubelet's podRecords.update, before the events go out: a consumer that reacts to an
    // event by listing sees the state the event announced.
    std::shared_ptr<const PodRecord> confirmed;
    if (pod != nullptr) {
      auto updated = std::make_shared<PodRecord>(std::move(*record.current));
      for (auto& c : updated->containers)
        if (auto s = inspection.find(c.id); s != inspection.end()) c.status = s->second;
      confirmed = updated;
      record.old = confirmed;
      record.current.reset();
    }
    {
      // The record and its events under one lock: pods_at() reads the records with the
      // sequence number of the last event published, so List's snapshot is exactly the state
      // after the events up to its sequence number, and a Watch from there replays none.
      std::lock_guard lock(state_mu_);
      if (confirmed) {
        confirmed_[uid] = confirmed;
      } else {
        confirmed_.erase(uid);
      }
      for (auto& ev : events) {
        if (!is_sent(ev.type)) continue;
        sink_.publish(std::move(ev));
        ++published;
      }
    }
    it = confirmed ? std::next(it) : records_.erase(it);
  }

  {
    std::lock_guard lock(state_mu_);
    pending_ = std::move(still_pending);
    stats_.inspections += inspections;
    stats_.failed_inspections += failed_inspections;
    stats_.events_published += published;
    if (!last_inspection_error.empty()) stats_.last_error = last_inspection_error;
  }
  return finish_relist(start_mono, Status{});
}

}  // namespace kpleg::pleg
