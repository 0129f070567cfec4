// A connection's streaming calls: PodLifecycle.Watch, written from the publishing thread as
// its subscription fills, and grpc.health Watch, written from the health thread on a change.
// Both hold a stream slot; a cut-off Watch gives its slot back at once and is reset if its
// consumer still reads nothing after the grace (ApiServerOptions::cut_off_grace).
#include <spdlog/spdlog.h>

#include "api/convert.h"
#include "api/h2_connection.h"
#include "api/h2_stream.h"
#include "api/health_service.h"
#include "api/pod_lifecycle_service.h"
#include "kpleg/v1/pleg.pb.h"

namespace kpleg::api::h2 {

void Connection::start_watch(Call call) {
  auto refuse = [&](const grpc::Status& st) { refuse_call(*call.stream, st); };
  v1::WatchRequest req;
  if (!req.ParseFromString(call.message))
    return refuse({grpc::StatusCode::INTERNAL, "cannot parse the request"});
  if (auto st = check_filters(req.pod_uid(), req.pod_namespace(), &req.instance_id()); !st.ok())
    return refuse(st);
  if (shared_.stopping.load()) return refuse({grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"});
  // No wait for a slot to come back: this is the thread that reads the cancellations that would
  // give one back (a unix socket stream gives its slot back as soon as it is read).
  auto slot = std::make_unique<StreamSlot>(&shared_.slots, client_, std::chrono::milliseconds(0));
  if (auto st = watch_slot_refusal(*slot, shared_.slots); !st.ok()) return refuse(st);

  std::weak_ptr<Connection> self = weak_from_this();
  std::weak_ptr<Stream> stream = call.stream;
  bus::Subscription sub = shared_.bus.subscribe(
      watch_position(req, shared_.bus.instance_id()),
      bus::EventFilter{req.pod_uid(), req.pod_namespace()}, 0, [self, stream] {
        if (auto conn = self.lock()) conn->watch_ready(stream);
      });
  std::lock_guard l(mu_);
  Stream& st = *call.stream;
  if (closed_ || st.gone) return;  // the consumer went away meanwhile: sub and slot go with it
  st.kind = Stream::Kind::kWatch;
  st.sub = std::move(sub);
  st.slot = std::move(slot);
  shared_.open_watches.fetch_add(1);
  // The initial metadata tells the consumer that its subscription is in place; read_body then
  // takes the backlog and every event after it.
  respond(st, shared_.bus.instance_id());
  flush();
}

void Connection::refuse_call(Stream& st, const grpc::Status& status) {
  std::lock_guard l(mu_);
  if (closed_) return;
  finish(st, status.error_code(), status.error_message());
  flush();
}

void Connection::watch_ready(const std::weak_ptr<Stream>& stream) {
  std::lock_guard l(mu_);
  if (closed_) return;
  auto st = stream.lock();
  // Not installed yet (start_watch's first read takes the event), gone, or ending already.
  if (!st || st->gone || st->kind != Stream::Kind::kWatch || st->end) return;
  read_flow_control_input();
  if (st->sub.closed()) watch_closed(*st);
  nghttp2_session_resume_data(session_, st->id);
  flush();
  if (quiet_ && windows_low()) set_quiet(false);
}

void Connection::watch_closed(Stream& st) {
  if (st.end) return;
  if (shared_.stopping.load()) {
    st.end = {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
  } else if (st.sub.cut_off()) {
    const std::string reason = st.sub.close_reason();
    spdlog::warn("api: Watch from {} cut off: {}", client_, reason);
    st.end = {grpc::StatusCode::RESOURCE_EXHAUSTED, reason};
    // Its place goes back now; the stream itself after the grace unless the consumer reads
    // its status by then.
    if (st.slot) st.slot->release();
    st.reap_at = Clock::now() + shared_.cut_off_grace;
    shared_.wake_server();
  } else {
    st.end = {grpc::StatusCode::UNAVAILABLE, st.sub.close_reason()};
  }
}

void Connection::fill_from_subscription(Stream& st, size_t room) {
  v1::Event msg;
  std::string bytes;
  // As many as the frame nghttp2 is filling can carry: a burst goes out in one DATA frame.
  while (st.out.size() < room) {
    bus::Subscription::Next n = st.sub.try_next();
    if (n.status == bus::Subscription::Status::kTimeout) break;
    if (n.status == bus::Subscription::Status::kClosed) {
      watch_closed(st);
      break;
    }
    to_proto(*n.event, &msg);
    msg.SerializeToString(&bytes);
    append_message(st.out, bytes);
  }
}

void Connection::start_health_watch(Call call) {
  auto refuse = [&](const grpc::Status& st) { refuse_call(*call.stream, st); };
  grpc::health::v1::HealthCheckRequest req;
  if (!req.ParseFromString(call.message))
    return refuse({grpc::StatusCode::INTERNAL, "cannot parse the request"});
  if (shared_.stopping.load()) return refuse({grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"});
  auto slot = std::make_unique<StreamSlot>(&shared_.slots, client_, std::chrono::milliseconds(0));
  if (auto st = health_watch_slot_refusal(*slot, shared_.slots); !st.ok()) return refuse(st);

  std::lock_guard l(mu_);
  Stream& st = *call.stream;
  if (closed_ || st.gone) return;
  st.kind = Stream::Kind::kHealthWatch;
  st.slot = std::move(slot);
  st.health_service = req.service();
  // The protocol: the status at once, then each change; an unknown service is SERVICE_UNKNOWN.
  grpc::health::v1::HealthCheckResponse resp;
  resp.set_status(shared_.health.current(st.health_service));
  st.health_sent = resp.status();
  append_message(st.out, resp.SerializeAsString());
  respond(st, "");
  flush();
}

void Connection::health_changed() {
  std::lock_guard l(mu_);
  if (closed_) return;
  for (auto& [id, st] : streams_) {
    if (st->gone || st->kind != Stream::Kind::kHealthWatch || st->end) continue;
    grpc::health::v1::HealthCheckResponse resp;
    resp.set_status(shared_.health.current(st->health_service));
    if (resp.status() == st->health_sent) continue;
    st->health_sent = resp.status();
    append_message(st->out, resp.SerializeAsString());
    nghttp2_session_resume_data(session_, id);
  }
  flush();
}

std::optional<Connection::Clock::time_point> Connection::reap(Clock::time_point now) {
  std::lock_guard l(mu_);
  if (closed_) return std::nullopt;
  std::optional<Clock::time_point> next;
  bool reset = false;
  for (auto& [id, st] : streams_) {
    if (!st->reap_at || st->gone) continue;
    if (*st->reap_at > now) {
      if (!next || *st->reap_at < *next) next = st->reap_at;
      continue;
    }
    // The consumer read nothing since it was cut off: the stream goes (its status with it).
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    shared_.cut_off_cancelled.fetch_add(1);
    end_stream_state(*st);
    reset = true;
  }
  if (reset) flush();
  return next;
}

bool Connection::shut_down() {
  std::lock_guard l(mu_);
  if (closed_) return false;
  set_quiet(false);
  for (auto& [id, st] : streams_) {
    if (st->gone || st->kind == Stream::Kind::kUnary) continue;
    st->sub.cancel();
    finish(*st, grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down");
  }
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(session_),
                        NGHTTP2_NO_ERROR, nullptr, 0);
  flush();
  return alive_locked();
}

}  // namespace kpleg::api::h2
