#include "criendpoint/container_event_feed.h"

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/thread_name.h"
#include "pleg/container_table.h"

namespace kpleg::criendpoint {
namespace {

constexpr const char* kPodUidLabel = "io.kubernetes.pod.uid";
// How long a pod is remembered after its sandbox was removed, and how often that is checked.
constexpr int64_t kForgetRemovedAfterNs = int64_t(10) * 60 * 1'000'000'000;
constexpr uint64_t kSweepEvery = 256;

bool not_found(const Error& e) { return e.code == grpc::StatusCode::NOT_FOUND; }

std::optional<v1::ContainerEventType> cri_type(pleg::EventType t) {
  switch (t) {
    case pleg::EventType::kContainerStarted:
      return v1::CONTAINER_STARTED_EVENT;
    case pleg::EventType::kContainerDied:
      return v1::CONTAINER_STOPPED_EVENT;
    case pleg::EventType::kContainerRemoved:
      return v1::CONTAINER_DELETED_EVENT;
    default:
      return std::nullopt;
  }
}

}  // namespace

Result<std::optional<v1::ContainerEventResponse>> build_container_event(
    cri::CriClient& cri, const pleg::PodLifecycleEvent& ev, PodMemory& memory, int64_t now_ns) {
  auto type = cri_type(ev.type);
  if (!type || ev.pod_uid.empty()) return std::optional<v1::ContainerEventResponse>();
  v1::ContainerEventResponse out;
  out.set_container_id(ev.container_id);
  out.set_container_event_type(*type);

  // The pod's sandbox: the event's own, else the newest the runtime lists for the pod.
  std::string sandbox_id = ev.sandbox ? ev.container_id : std::string();
  if (sandbox_id.empty()) {
    v1::PodSandboxFilter f;
    (*f.mutable_label_selector())[kPodUidLabel] = ev.pod_uid;
    auto sandboxes = cri.list_pod_sandboxes(f);
    if (!sandboxes) return sandboxes.error();
    const v1::PodSandbox* newest = nullptr;
    for (const auto& s : *sandboxes)
      if (newest == nullptr || s.created_at() > newest->created_at()) newest = &s;
    if (newest != nullptr) sandbox_id = newest->id();
  }
  if (sandbox_id.empty()) sandbox_id = memory.sandbox.id();
  bool have_status = false;
  if (!sandbox_id.empty()) {
    auto st = cri.pod_sandbox_status(sandbox_id);
    if (st) {
      memory.sandbox = std::move(*st);
      have_status = true;
    } else if (!not_found(st.error())) {
      return st.error();
    }
  }
  if (!have_status) {
    // Gone from the runtime (a removed sandbox): its last known status, not ready any more.
    if (memory.sandbox.id().empty() || (!sandbox_id.empty() && memory.sandbox.id() != sandbox_id)) {
      memory.sandbox.Clear();
      memory.sandbox.set_id(sandbox_id);
      auto* md = memory.sandbox.mutable_metadata();
      md->set_uid(ev.pod_uid);
      md->set_name(ev.pod_name);
      md->set_namespace_(ev.pod_namespace);
    }
    memory.sandbox.set_state(v1::SANDBOX_NOTREADY);
  }
  *out.mutable_pod_sandbox_status() = memory.sandbox;
  if (out.pod_sandbox_status().metadata().uid().empty())
    out.mutable_pod_sandbox_status()->mutable_metadata()->set_uid(ev.pod_uid);

  // Every container of the pod, in every sandbox it had, as the kubelet's GetPodStatus lists
  // them.
  v1::ContainerFilter cf;
  (*cf.mutable_label_selector())[kPodUidLabel] = ev.pod_uid;
  auto containers = cri.list_containers(cf);
  if (!containers) return containers.error();
  for (const auto& c : *containers) {
    auto cs = cri.container_status(c.id());
    if (cs) {
      // The death's reason by the event's rule (pleg::death_reason): a runtime that has not
      // seen the cgroup's OOM event yet says Error for an init the kernel saw the OOM killer
      // end, and OOMKilled once it has; a kubelet keeps what its event carried.
      if (c.id() == ev.container_id && ev.type == pleg::EventType::kContainerDied &&
          cs->state() == v1::CONTAINER_EXITED)
        cs->set_reason(pleg::death_reason(ev.reason == pleg::kOomKilledReason, cs->reason()));
      *out.add_containers_statuses() = std::move(*cs);
    } else if (!not_found(cs.error())) {
      return cs.error();
    }
  }
  memory.last_created_at = std::max(now_ns, memory.last_created_at + 1);
  out.set_created_at(memory.last_created_at);
  return std::optional<v1::ContainerEventResponse>(std::move(out));
}

std::optional<v1::ContainerEventResponse> hint_container_event(const pleg::PodLifecycleEvent& ev,
                                                               PodMemory& memory, int64_t now_ns) {
  auto type = cri_type(ev.type);
  if (!type || ev.pod_uid.empty()) return std::nullopt;
  v1::ContainerEventResponse out;
  out.set_container_id(ev.container_id);
  out.set_container_event_type(*type);
  auto* st = out.mutable_pod_sandbox_status();
  if (ev.sandbox) st->set_id(ev.container_id);
  auto* md = st->mutable_metadata();
  md->set_uid(ev.pod_uid);
  md->set_name(ev.pod_name);
  md->set_namespace_(ev.pod_namespace);
  st->set_state(ev.sandbox && ev.type != pleg::EventType::kContainerStarted ? v1::SANDBOX_NOTREADY
                                                                            : v1::SANDBOX_READY);
  memory.last_created_at = std::max(now_ns, memory.last_created_at + 1);
  out.set_created_at(memory.last_created_at);
  return out;
}

ContainerEventFeed::ContainerEventFeed(cri::CriClient& cri, ContainerEventFeedOptions options)
    : cri_(cri), bus_(nullptr), options_(options), queue_(std::max<size_t>(1, options.workers)) {}

ContainerEventFeed::ContainerEventFeed(cri::CriClient& cri, bus::EventBus& bus,
                                       ContainerEventFeedOptions options)
    : cri_(cri), bus_(&bus), options_(options), queue_(std::max<size_t>(1, options.workers)) {}

ContainerEventFeed::~ContainerEventFeed() { stop(); }

void ContainerEventFeed::start() {
  if (bus_ == nullptr) return;
  // Every event from now on, with room for long bursts: a cut-off is logged and followed by a
  // new subscription, and the kubelet's own relist catches up what fell between.
  sub_ = std::make_shared<bus::Subscription>(bus_->subscribe(0, {}, 1 << 16));
  follower_ = named_thread("kpleg-crievents", [this] { follow_bus(); });
}

void ContainerEventFeed::stop() {
  if (stopping_.exchange(true)) return;
  if (sub_) sub_->cancel();
  if (follower_.joinable()) follower_.join();
  queue_.stop();
  std::lock_guard lk(mu_);
  receivers_.clear();
  waiting_.clear();
  queued_ = 0;
}

void ContainerEventFeed::follow_bus() {
  while (!stopping_) {
    auto n = sub_->next(std::chrono::hours(24));
    if (n.status == bus::Subscription::Status::kTimeout) continue;
    if (n.status == bus::Subscription::Status::kClosed) {
      if (stopping_ || !sub_->cut_off()) break;
      spdlog::warn("CRI endpoint: container events fell behind ({}); following again",
                   sub_->close_reason());
      *sub_ = bus_->subscribe(0, {}, 1 << 16);
      continue;
    }
    post(n.event);
  }
}

void ContainerEventFeed::post(bus::EventPtr ev) {
  if (!ev || !cri_type(ev->type) || ev->pod_uid.empty()) return;
  std::string uid = ev->pod_uid;
  {
    std::lock_guard lk(mu_);
    if (receivers_.empty() || stopping_) return;  // nobody listens: no calls
    if (queued_ >= options_.max_queued) {
      if (overflowed_.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
        spdlog::warn(
            "container events: {} waiting for the runtime; dropping {} of pod {}/{} "
            "(the kubelet's relist catches it up)",
            queued_, pleg::to_string(ev->type), ev->pod_namespace, ev->pod_name);
      }
      return;
    }
    auto& waiting = waiting_[uid];
    waiting.push_back(std::move(ev));
    ++queued_;
    if (waiting.size() > 1) return;  // the pod's drain task takes it in turn
  }
  queue_.post(uid, [this, uid] { drain(uid, 1); });
}

void ContainerEventFeed::drain(const std::string& pod_uid, int attempt) {
  bus::EventPtr ev;
  {
    std::lock_guard lk(mu_);
    auto it = waiting_.find(pod_uid);
    if (it == waiting_.end() || it->second.empty()) return;
    ev = it->second.front();
  }
  if (!build_and_send(ev, attempt)) {
    queue_.post(
        pod_uid, [this, pod_uid, attempt] { drain(pod_uid, attempt + 1); },
        pleg::PodWorkQueue::Clock::now() + options_.retry_after);
    return;
  }
  {
    std::lock_guard lk(mu_);
    auto it = waiting_.find(pod_uid);
    if (it == waiting_.end() || it->second.empty()) return;
    it->second.pop_front();
    --queued_;
    if (it->second.empty()) {
      waiting_.erase(it);
      return;
    }
  }
  queue_.post(pod_uid, [this, pod_uid] { drain(pod_uid, 1); });
}

bool ContainerEventFeed::build_and_send(const bus::EventPtr& ev, int attempt) {
  PodMemory* memory;
  {
    std::lock_guard lk(mu_);
    if (receivers_.empty()) return true;
    memory = &pods_[ev->pod_uid];
    memory->in_use = true;
  }
  struct Release {
    std::mutex& mu;
    PodMemory* m;
    ~Release() {
      std::lock_guard lk(mu);
      m->in_use = false;
    }
  } release{mu_, memory};
  const int64_t now = int64_t(pleg::realtime_now_ns());
  Result<std::optional<v1::ContainerEventResponse>> built =
      options_.full_statuses ? build_container_event(cri_, *ev, *memory, now)
                             : Result<std::optional<v1::ContainerEventResponse>>(
                                   hint_container_event(*ev, *memory, now));
  if (!built) {
    if (attempt < options_.attempts && !stopping_) return false;
    dropped_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("container events: none for {} of pod {}/{} ({}): {}", pleg::to_string(ev->type),
                 ev->pod_namespace, ev->pod_name, ev->pod_uid, built.error().message);
    return true;
  }
  if (!*built) return true;
  auto message = std::make_shared<const std::string>((*built)->SerializeAsString());
  std::vector<std::shared_ptr<EventReceiver>> receivers;
  {
    std::lock_guard lk(mu_);
    for (const auto& [_, r] : receivers_) receivers.push_back(r);
    if (ev->sandbox && ev->type == pleg::EventType::kContainerRemoved)
      memory->sandbox_removed_at = now;
    if (++built_ % kSweepEvery == 0) {
      for (auto it = pods_.begin(); it != pods_.end();) {
        const int64_t removed = it->second.sandbox_removed_at;
        if (removed != 0 && now - removed > kForgetRemovedAfterNs && !it->second.in_use)
          it = pods_.erase(it);
        else
          ++it;
      }
    }
  }
  for (const auto& r : receivers) r->deliver(message);
  sent_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t ContainerEventFeed::add(std::shared_ptr<EventReceiver> receiver) {
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  receivers_.emplace(id, std::move(receiver));
  return id;
}

void ContainerEventFeed::remove(uint64_t id) {
  std::lock_guard lk(mu_);
  receivers_.erase(id);
}

ContainerEventFeedStats ContainerEventFeed::stats() const {
  ContainerEventFeedStats s;
  {
    std::lock_guard lk(mu_);
    s.subscribers = receivers_.size();
  }
  s.sent = sent_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.overflowed = overflowed_.load(std::memory_order_relaxed);
  {
    std::lock_guard lk(mu_);
    s.queued = queued_;
  }
  return s;
}

}  // namespace kpleg::criendpoint
