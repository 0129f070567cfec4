#include "relay/kplegd_follower.h"

#include <spdlog/spdlog.h>

#include <climits>

#include "api/client.h"
#include "api/convert.h"
#include "common/thread_name.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace kpleg::relay {
namespace {

namespace v1 = ::kpleg::v1;

pleg::PodLifecycleEvent catch_up_event(pleg::EventType type, const std::string& uid,
                                       const KplegdFollower::PodKnown& pod, const std::string& id,
                                       const KplegdFollower::ContainerKnown& c) {
  pleg::PodLifecycleEvent ev;
  ev.type = type;
  ev.pod_uid = uid;
  ev.pod_name = pod.name;
  ev.pod_namespace = pod.pod_namespace;
  ev.container_id = id;
  ev.container_name = c.name;
  ev.sandbox = c.sandbox;
  ev.source = pleg::EventSource::kReconcile;
  ev.correction = true;
  ev.emit_ts_ns = pleg::realtime_now_ns();
  return ev;
}

}  // namespace

std::vector<pleg::PodLifecycleEvent> KplegdFollower::catch_up(Known& known,
                                                              const v1::ListResponse& list) {
  std::vector<pleg::PodLifecycleEvent> out;
  Known now;
  for (const auto& p : list.pods()) {
    PodKnown& pod = now[p.uid()];
    pod.name = p.name();
    pod.pod_namespace = p.namespace_();
    for (const auto& c : p.containers())
      pod.containers[c.id()] = ContainerKnown{c.name(), c.sandbox(), c.status().state()};
  }
  for (const auto& [uid, pod] : now) {
    auto was = known.find(uid);
    for (const auto& [id, c] : pod.containers) {
      const ContainerKnown* before = nullptr;
      if (was != known.end()) {
        auto it = was->second.containers.find(id);
        if (it != was->second.containers.end()) before = &it->second;
      }
      const auto prev = before ? before->state : v1::CONTAINER_STATE_UNSPECIFIED;
      if (c.state == prev) continue;
      if (c.state == v1::CONTAINER_STATE_RUNNING) {
        out.push_back(catch_up_event(pleg::EventType::kContainerStarted, uid, pod, id, c));
      } else if (c.state == v1::CONTAINER_STATE_EXITED) {
        out.push_back(catch_up_event(pleg::EventType::kContainerDied, uid, pod, id, c));
      }
    }
    if (was == known.end()) continue;
    for (const auto& [id, c] : was->second.containers)
      if (!pod.containers.contains(id))
        out.push_back(catch_up_event(pleg::EventType::kContainerRemoved, uid, pod, id, c));
  }
  for (const auto& [uid, pod] : known) {
    if (now.contains(uid)) continue;
    for (const auto& [id, c] : pod.containers)
      out.push_back(catch_up_event(pleg::EventType::kContainerRemoved, uid, pod, id, c));
  }
  known = std::move(now);
  return out;
}

void KplegdFollower::apply(Known& known, const pleg::PodLifecycleEvent& ev) {
  if (ev.pod_uid.empty() || ev.container_id.empty()) return;
  switch (ev.type) {
    case pleg::EventType::kContainerStarted:
    case pleg::EventType::kContainerDied: {
      PodKnown& pod = known[ev.pod_uid];
      pod.name = ev.pod_name;
      pod.pod_namespace = ev.pod_namespace;
      auto& c = pod.containers[ev.container_id];
      c.name = ev.container_name;
      c.sandbox = ev.sandbox;
      c.state = ev.type == pleg::EventType::kContainerStarted ? v1::CONTAINER_STATE_RUNNING
                                                              : v1::CONTAINER_STATE_EXITED;
      break;
    }
    case pleg::EventType::kContainerRemoved: {
      auto it = known.find(ev.pod_uid);
      if (it == known.end()) break;
      it->second.containers.erase(ev.container_id);
      if (it->second.containers.empty()) known.erase(it);
      break;
    }
    default:
      break;
  }
}

KplegdFollower::KplegdFollower(KplegdFollowerOptions options, Sink sink)
    : options_(std::move(options)), sink_(std::move(sink)) {
  grpc::ChannelArguments args;
  api::set_channel_arguments(args);
  // kplegd restarting: try again soon, so the catch-up comes soon after it is back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, int(options_.max_reconnect_backoff.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  channel_ = grpc::CreateCustomChannel("unix:" + options_.socket_path,
                                       grpc::InsecureChannelCredentials(), args);
}

KplegdFollower::~KplegdFollower() { stop(); }

void KplegdFollower::start() {
  thread_ = named_thread("kpleg-follow", [this] { run(); });
}

void KplegdFollower::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lk(mu_);
    if (call_ != nullptr) call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

bool KplegdFollower::list(v1::ListResponse* out) {
  auto stub = v1::PodLifecycle::NewStub(channel_);
  while (!stopping_) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);  // asleep until kplegd is there
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
    {
      std::lock_guard lk(mu_);
      if (stopping_) return false;
      call_ = &ctx;
    }
    out->Clear();
    auto st = stub->List(&ctx, v1::ListRequest(), out);
    {
      std::lock_guard lk(mu_);
      call_ = nullptr;
    }
    if (st.ok()) return true;
    if (stopping_) return false;
    if (st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
      spdlog::warn("kplegd API: List failed: {}", st.error_message());
    // A refusal (not a missing kplegd) is not retried at once: wait out a backoff.
    std::this_thread::sleep_for(options_.max_reconnect_backoff);
  }
  return false;
}

void KplegdFollower::run() {
  while (!stopping_) {
    // A List at the start and after every lost stream: its instance id says whether kplegd
    // restarted meanwhile (a Watch from seq 0 of a new instance would start quietly, without
    // the RESYNC that tells it).
    v1::ListResponse resp;
    if (!list(&resp)) return;
    std::vector<pleg::PodLifecycleEvent> events;
    bool first = false, same = false;
    {
      std::lock_guard lk(mu_);
      first = !have_baseline_;
      same = !first && resp.instance_id() == instance_id_;
      if (!same) {
        events = catch_up(known_, resp);
        have_baseline_ = true;
        instance_id_ = resp.instance_id();
        last_seq_ = resp.seq();
        stats_.instance_id = instance_id_;
        if (!first) stats_.catch_up_events += events.size();
      }
    }
    if (first) {
      spdlog::info("kplegd API: following instance {} from seq {} ({} pods)", resp.instance_id(),
                   resp.seq(), resp.pods_size());
    } else if (same) {
      spdlog::info("kplegd API: instance {} again: resuming its stream", resp.instance_id());
    } else {
      spdlog::info("kplegd API: new instance {} from seq {}: {} catch-up events for the gap",
                   resp.instance_id(), resp.seq(), events.size());
      for (auto& ev : events) sink_(std::make_shared<const pleg::PodLifecycleEvent>(std::move(ev)));
    }
    // Returns on a RESYNC (the instance is forgotten: the List catches up) or a lost stream
    // (resumed from the last seq if the same instance still holds it, else the List catches up).
    watch();
  }
}

void KplegdFollower::watch() {
  auto stub = v1::PodLifecycle::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  v1::WatchRequest req;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    call_ = &ctx;
    req.set_from_seq(last_seq_);
    req.set_instance_id(instance_id_);
  }
  auto reader = stub->Watch(&ctx, req);
  v1::Event e;
  bool resync = false;
  while (reader->Read(&e)) {
    if (e.type() == v1::EVENT_TYPE_RESYNC) {
      spdlog::info("kplegd API: RESYNC ({}): listing again", e.reason());
      resync = true;
      ctx.TryCancel();
      break;
    }
    auto ev = std::make_shared<pleg::PodLifecycleEvent>(api::from_proto(e));
    {
      std::lock_guard lk(mu_);
      stats_.connected = true;
      apply(known_, *ev);
      last_seq_ = e.seq();
      ++stats_.events;
    }
    sink_(std::move(ev));
  }
  auto st = reader->Finish();
  std::lock_guard lk(mu_);
  call_ = nullptr;
  if (resync) {
    ++stats_.resyncs;
    instance_id_.clear();  // whatever the List says is news
    return;
  }
  if (stopping_) return;
  ++stats_.disconnects;
  stats_.connected = false;
  spdlog::warn(
      "kplegd API: event stream ended ({}: {}); the kubelet's calls go on, its events "
      "resume when kplegd is back",
      int(st.error_code()), st.error_message());
}

KplegdFollowerStats KplegdFollower::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

std::optional<cri::CallSubject> KplegdFollower::identify(const cri::CallSubject& subject) const {
  if (subject.id.empty()) return std::nullopt;
  std::lock_guard lk(mu_);
  for (const auto& [uid, pod] : known_) {
    auto it = pod.containers.find(subject.id);
    if (it == pod.containers.end()) continue;
    return cri::CallSubject{subject.id,
                            {uid, pod.name, pod.pod_namespace},
                            it->second.sandbox ? std::string() : it->second.name};
  }
  return std::nullopt;
}

}  // namespace kpleg::relay
