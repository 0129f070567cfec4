#include "api/health_service.h"

namespace kpleg::api {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

void HealthService::set(const std::string& service, bool serving) {
  {
    std::lock_guard lk(mu_);
    auto [it, added] = serving_.try_emplace(service, serving);
    if (!added && it->second == serving) return;
    it->second = serving;
    ++version_;
  }
  changed_.notify_all();
}

void HealthService::set_evaluated(const std::string& service, std::function<bool()> serving) {
  std::lock_guard lk(mu_);
  evaluated_[service] = std::move(serving);
}

void HealthService::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
}

void HealthService::wake_watches() {
  {
    std::lock_guard lk(mu_);
    ++wakes_;
  }
  changed_.notify_all();
}

HealthService::Status HealthService::status_of(const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

grpc::Status health_watch_slot_refusal(const StreamSlot& slot, const StreamSlots& slots) {
  if (slot.client_full()) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "too many streams from this client (" + slot.client() + ": limit " +
                std::to_string(slots.per_client_limit()) +
                ", kplegd --max-watchers-per-client: Watch and grpc.health Watch streams share it)"};
  }
  if (!slot.taken()) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "too many streams (limit " + std::to_string(slots.limit()) +
                ", kplegd --max-watchers: Watch and grpc.health Watch streams share it)"};
  }
  return grpc::Status::OK;
}

HealthService::Status HealthService::current(const std::string& service) const {
  std::lock_guard lk(mu_);
  return status_of(service);
}

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* req,
                                  HealthCheckResponse* resp) {
  std::function<bool()> evaluate;
  {
    std::lock_guard lk(mu_);
    if (auto it = evaluated_.find(req->service()); it != evaluated_.end()) evaluate = it->second;
  }
  if (evaluate) {
    resp->set_status(evaluate() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  std::lock_guard lk(mu_);
  const Status s = status_of(req->service());
  // The protocol: Check answers NOT_FOUND for a service it does not know.
  if (s == HealthCheckResponse::SERVICE_UNKNOWN)
    return {grpc::StatusCode::NOT_FOUND, "unknown service"};
  resp->set_status(s);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* ctx, const HealthCheckRequest* req,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  StreamSlot slot(streams_, streams_ ? streams_->client_of(*ctx) : std::string());
  if (streams_)
    if (auto st = health_watch_slot_refusal(slot, *streams_); !st.ok()) return st;
  std::unique_lock lk(mu_);
  uint64_t seen = 0;
  bool first = true;
  Status last = HealthCheckResponse::UNKNOWN;
  for (;;) {
    if (stopping_) return {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    if (first || version_ != seen) {
      seen = version_;
      const Status s = status_of(req->service());
      // The protocol: a Watch sends the status at once and then only when it changes; an
      // unknown service is SERVICE_UNKNOWN, not an error, since it may appear later.
      if (first || s != last) {
        first = false;
        last = s;
        HealthCheckResponse resp;
        resp.set_status(s);
        lk.unlock();
        const bool written = writer->Write(resp);
        lk.lock();
        if (!written) return grpc::Status::CANCELLED;  // the client went away
        continue;
      }
    }
    const uint64_t wakes = wakes_;
    changed_.wait_for(lk, watch_poll_,
                      [&] { return stopping_ || version_ != seen || wakes_ != wakes; });
  }
}

}  // namespace kpleg::api
