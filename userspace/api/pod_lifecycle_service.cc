#include "api/pod_lifecycle_service.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "api/convert.h"

namespace kpleg::api {
namespace {

bool matches(const pleg::PodRecord& pod, const v1::ListRequest& req) {
  if (!req.pod_uid().empty() && pod.uid != req.pod_uid()) return false;
  if (!req.pod_namespace().empty() && pod.namespace_ != req.pod_namespace()) return false;
  return true;
}

}  // namespace

grpc::Status check_filters(const std::string& pod_uid, const std::string& pod_namespace,
                           const std::string* instance_id) {
  if (pod_uid.size() > 128)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("pod_uid is {} bytes long: at most 128", pod_uid.size())};
  if (pod_namespace.size() > 63)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("pod_namespace is {} bytes long: at most 63 (a DNS label)",
                        pod_namespace.size())};
  if (instance_id != nullptr && instance_id->size() > 64)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("instance_id is {} bytes long: at most 64", instance_id->size())};
  return grpc::Status::OK;
}

grpc::Status PodLifecycleService::List(grpc::ServerContext*, const v1::ListRequest* req,
                                       v1::ListResponse* resp) {
  if (auto st = check_filters(req->pod_uid(), req->pod_namespace()); !st.ok()) return st;
  const std::shared_ptr<const StateSnapshot> snap = snapshots_.get();
  resp->set_seq(snap->seq);
  resp->set_instance_id(bus_.instance_id());
  for (const auto& pod : snap->pods)
    if (matches(pod, *req)) to_proto(pod, resp->add_pods());
  return grpc::Status::OK;
}

grpc::Status PodLifecycleService::Stats(grpc::ServerContext*, const v1::StatsRequest*,
                                        v1::StatsResponse* resp) {
  DaemonStats d = stats_.stats();
  bus::BusStats b = bus_.stats();
  HealthReport h = health_.health();
  resp->set_instance_id(bus_.instance_id());
  resp->set_mode(d.mode);
  resp->set_start_time_ns(d.start_time_ns);
  resp->set_healthy(h.healthy);
  for (auto& r : h.reasons) resp->add_health_reasons(r);
  resp->set_last_seq(b.last_seq);
  resp->set_oldest_retained_seq(b.oldest_retained_seq);
  resp->set_history_capacity(b.history_capacity);
  resp->set_subscribers(b.subscribers);
  resp->set_subscribers_cut_off(b.subscribers_cut_off);
  resp->set_pods(d.pods);
  resp->set_containers(d.containers);
  resp->set_kernel_events(d.kernel_events);
  resp->set_lost_kernel_events(d.lost_kernel_events);
  resp->set_corrections(d.corrections);
  resp->set_cri_calls(d.cri_calls);
  resp->mutable_cri_calls_by_method()->insert(d.cri_calls_by_method.begin(),
                                              d.cri_calls_by_method.end());
  resp->set_confirm_retries(d.confirm_retries);
  resp->mutable_loop_wakeups_by_cause()->insert(d.loop_wakeups_by_cause.begin(),
                                                d.loop_wakeups_by_cause.end());
  resp->set_relists(d.relists);
  resp->set_last_reconcile_ns(d.last_reconcile_ns);
  return grpc::Status::OK;
}

grpc::Status PodLifecycleService::InflightCalls(grpc::ServerContext*,
                                                const v1::InflightCallsRequest* req,
                                                v1::InflightCallsResponse* resp) {
  const auto min_age =
      std::chrono::milliseconds(std::min<uint64_t>(req->min_age_ms(), uint64_t(INT64_MAX)));
  for (const auto& c : stats_.inflight_calls(min_age)) {
    auto* out = resp->add_calls();
    out->set_method(c.method);
    out->set_origin(c.origin);
    out->set_pod_uid(c.pod.uid);
    out->set_pod_name(c.pod.name);
    out->set_pod_namespace(c.pod.namespace_);
    out->set_id(c.id);
    out->set_container_name(c.container_name);
    out->set_age_ms(uint64_t(c.age.count()));
    out->set_description(c.description);
  }
  return grpc::Status::OK;
}

}  // namespace kpleg::api
