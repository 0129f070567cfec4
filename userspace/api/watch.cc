// PodLifecycle.Watch: one EventBus subscription per stream, written out as it comes.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/convert.h"
#include "api/limits.h"
#include "api/pod_lifecycle_service.h"

namespace kpleg::api {

// Registers a Watch's subscription for stop() while the handler runs; on the way out, no
// cut-off callback or reaper may touch the call any more.
struct PodLifecycleService::OpenWatch {
  PodLifecycleService& svc;
  bus::Subscription& sub;
  grpc::ServerContext* ctx;
  OpenWatch(PodLifecycleService& s, bus::Subscription& b, grpc::ServerContext* c)
      : svc(s), sub(b), ctx(c) {
    std::lock_guard lk(svc.open_mu_);
    if (svc.stopping_.load()) sub.cancel();
    svc.open_.insert(&sub);
  }
  ~OpenWatch() {
    sub.set_on_cut_off(nullptr);
    svc.reaper_.disarm(ctx);
    std::lock_guard lk(svc.open_mu_);
    svc.open_.erase(&sub);
  }
};

grpc::Status watch_slot_refusal(const StreamSlot& slot, const StreamSlots& slots) {
  if (slot.client_full()) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("too many watchers from this client ({}: limit {}, kplegd "
                        "--max-watchers-per-client; grpc.health Watch streams count too)",
                        slot.client(), slots.per_client_limit())};
  }
  if (!slot.taken()) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("too many watchers (limit {}, kplegd --max-watchers; grpc.health Watch "
                        "streams count too)",
                        slots.limit())};
  }
  return grpc::Status::OK;
}

uint64_t watch_position(const v1::WatchRequest& req, const std::string& instance_id) {
  uint64_t from = req.from_seq();
  // The bus reads the top three values as its own positions (kOldestRetained: every retained
  // event, no RESYNC, an in-process consumer's request). From a client each is a position
  // beyond the stream's last seq like any other, which docs/api.md promises a RESYNC for;
  // passed on as is, kOldestRetained replayed the history as if nothing had been lost.
  if (from >= bus::kStreamStart) from = bus::kUnknownPosition;
  if (!req.instance_id().empty()) {
    // A position is one in a given daemon instance's stream, 0 included (a List before the
    // first event): another instance's (the daemon restarted since) means List again (RESYNC).
    if (req.instance_id() != instance_id) from = bus::kUnknownPosition;
    else if (from == 0) from = bus::kStreamStart;
  } else if (from != 0) {
    from = bus::kUnknownPosition;  // a position without the instance whose stream it is in
  }
  // Without an instance, from_seq 0 is "from now on".
  return from;
}

size_t PodLifecycleService::open_watches() {
  std::lock_guard lk(open_mu_);
  return open_.size();
}

void PodLifecycleService::wake_watches() {
  std::lock_guard lk(open_mu_);
  for (bus::Subscription* sub : open_) sub->wake();
}

void PodLifecycleService::stop() {
  std::lock_guard lk(open_mu_);
  stopping_.store(true);
  for (bus::Subscription* sub : open_) sub->cancel();
}

grpc::Status PodLifecycleService::Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                        grpc::ServerWriter<v1::Event>* writer) {
  if (auto st = check_filters(req->pod_uid(), req->pod_namespace(), &req->instance_id());
      !st.ok())
    return st;
  StreamSlot slot(&streams_, streams_.client_of(*ctx));
  if (auto st = watch_slot_refusal(slot, streams_); !st.ok()) return st;
  const uint64_t from = watch_position(*req, bus_.instance_id());
  bus::Subscription sub =
      bus_.subscribe(from, bus::EventFilter{req->pod_uid(), req->pod_namespace()});
  OpenWatch open{*this, sub, ctx};
  // Cut off for being too slow: its place goes back at once; its call (and thread) after
  // the grace unless the consumer reads again and the handler returns by itself.
  sub.set_on_cut_off([this, &slot, ctx] {
    slot.release();
    reaper_.arm(ctx, std::chrono::steady_clock::now() + cut_off_grace_);
  });

  // Initial metadata tells the consumer that its subscription is in place: anything
  // published from now on reaches it.
  ctx->AddInitialMetadata("kpleg-instance-id", bus_.instance_id());
  writer->SendInitialMetadata();

  v1::Event msg;
  for (;;) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    if (stopping_.load()) return {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
    bus::Subscription::Next n = sub.next(kWatchPoll);
    if (n.status == bus::Subscription::Status::kTimeout) continue;
    if (n.status == bus::Subscription::Status::kClosed) {
      if (stopping_.load()) return {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
      if (sub.cut_off()) {
        spdlog::warn("api: Watch from {} cut off: {}", ctx->peer(), sub.close_reason());
        return {grpc::StatusCode::RESOURCE_EXHAUSTED, sub.close_reason()};
      }
      return {grpc::StatusCode::UNAVAILABLE, sub.close_reason()};
    }
    to_proto(*n.event, &msg);
    grpc::WriteOptions wo;
    // More is waiting: let gRPC coalesce; the last event of a burst is flushed at once.
    if (sub.queued() + sub.backlog() > 0) wo.set_buffer_hint();
    if (!writer->Write(msg, wo)) return grpc::Status::CANCELLED;  // the consumer went away
  }
}

}  // namespace kpleg::api
