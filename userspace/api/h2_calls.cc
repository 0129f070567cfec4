// A connection's calls: a complete request checked (a gRPC request, one message within the
// bound, inflated when compressed) and handed to its method: the unary ones answered here, the
// streams started in h2_streams.cc.
#include <zlib.h>

#include "api/h2_connection.h"
#include "api/h2_stream.h"
#include "api/health_service.h"
#include "api/limits.h"
#include "api/pod_lifecycle_service.h"
#include "common/result.h"
#include "kpleg/v1/pleg.pb.h"

namespace kpleg::api::h2 {
namespace {

// One unary method: the request parsed, the handler, the response serialized into `reply`.
template <class Request, class Response, class Handler>
grpc::Status unary(const std::string& message, std::string& reply, Handler handler) {
  Request req;
  if (!req.ParseFromString(message)) return {grpc::StatusCode::INTERNAL, "cannot parse the request"};
  Response resp;
  grpc::Status st = handler(&req, &resp);
  if (st.ok()) reply = resp.SerializeAsString();
  return st;
}

// A gzip or deflate (zlib) compressed request message, inflated up to the request bound.
Result<std::string> inflate_request(std::string_view compressed) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK)  // 32: either header, told apart by zlib
    return Error{grpc::StatusCode::INTERNAL, "cannot inflate the request"};
  std::string out(size_t(kMaxRequestBytes) + 1, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = uInt(compressed.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = uInt(out.size());
  const int rc = inflate(&zs, Z_FINISH);
  const size_t produced = out.size() - zs.avail_out;
  inflateEnd(&zs);
  if (produced > size_t(kMaxRequestBytes))
    return Error{grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "request inflates to over " + std::to_string(kMaxRequestBytes) + " bytes"};
  if (rc != Z_STREAM_END)
    return Error{grpc::StatusCode::INTERNAL, "the request's compressed message is corrupt"};
  out.resize(produced);
  return out;
}

}  // namespace

std::vector<Connection::Call> Connection::take_calls() {
  std::vector<Call> calls;
  for (int32_t id : complete_) {
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second->handed_out) continue;
    Stream& st = *it->second;
    st.handed_out = true;
    if (!st.post || !st.grpc_content) {
      // Not a gRPC request: the protocol's answer is HTTP 415.
      const nghttp2_nv h[] = {header(":status", "415")};
      nghttp2_submit_response(session_, id, h, std::size(h), nullptr);
      continue;
    }
    Call call{it->second, st.path, {}, {}};
    const auto* p = reinterpret_cast<const uint8_t*>(st.body.data());
    if (st.body_bytes > 5 + size_t(kMaxRequestBytes)) {
      call.refused = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "request of " + std::to_string(st.body_bytes - 5) + " bytes: at most " +
                          std::to_string(kMaxRequestBytes)};
    } else if (st.body.size() < 5) {
      call.refused = {grpc::StatusCode::INTERNAL, "the request carried no message"};
    } else if (const uint32_t size = (uint32_t(p[1]) << 24) | (uint32_t(p[2]) << 16) |
                                     (uint32_t(p[3]) << 8) | uint32_t(p[4]);
               st.body.size() != 5 + size_t(size)) {
      call.refused = {grpc::StatusCode::INTERNAL, "the request is not one whole message"};
    } else if (p[0] == 0) {
      call.message = st.body.substr(5);
    } else if (st.encoding != "gzip" && st.encoding != "deflate") {
      call.refused = {grpc::StatusCode::UNIMPLEMENTED,
                      "a request compressed with \"" + st.encoding +
                          "\": this server takes gzip and deflate"};
    } else if (auto plain = inflate_request(std::string_view(st.body).substr(5))) {
      call.message = std::move(*plain);
    } else {
      call.refused = {plain.error().code, plain.error().message};
    }
    std::string().swap(st.body);
    calls.push_back(std::move(call));
  }
  complete_.clear();
  return calls;
}

void Connection::serve(Call call) {
  // A method this server does not have is UNIMPLEMENTED whatever its request (as gRPC answers).
  const bool known = call.path == "/kpleg.v1.PodLifecycle/List" ||
                     call.path == "/kpleg.v1.PodLifecycle/Stats" ||
                     call.path == "/kpleg.v1.PodLifecycle/InflightCalls" ||
                     call.path == "/kpleg.v1.PodLifecycle/Watch" ||
                     call.path == "/grpc.health.v1.Health/Check" ||
                     call.path == "/grpc.health.v1.Health/Watch";
  if (known && !call.refused) {
    if (call.path == "/kpleg.v1.PodLifecycle/Watch") return start_watch(std::move(call));
    if (call.path == "/grpc.health.v1.Health/Watch") return start_health_watch(std::move(call));
  }
  grpc::Status st;
  std::string reply;
  if (!known) {
    st = {grpc::StatusCode::UNIMPLEMENTED, "unknown method " + call.path};
  } else if (call.refused) {
    st = {grpc::StatusCode(call.refused->first), call.refused->second};
  } else if (call.path == "/kpleg.v1.PodLifecycle/List") {
    st = unary<v1::ListRequest, v1::ListResponse>(call.message, reply, [&](auto* req, auto* resp) {
      return shared_.lifecycle.List(nullptr, req, resp);
    });
  } else if (call.path == "/kpleg.v1.PodLifecycle/Stats") {
    st = unary<v1::StatsRequest, v1::StatsResponse>(call.message, reply, [&](auto* req, auto* resp) {
      return shared_.lifecycle.Stats(nullptr, req, resp);
    });
  } else if (call.path == "/kpleg.v1.PodLifecycle/InflightCalls") {
    st = unary<v1::InflightCallsRequest, v1::InflightCallsResponse>(
        call.message, reply,
        [&](auto* req, auto* resp) { return shared_.lifecycle.InflightCalls(nullptr, req, resp); });
  } else {
    using namespace grpc::health::v1;
    st = unary<HealthCheckRequest, HealthCheckResponse>(
        call.message, reply,
        [&](auto* req, auto* resp) { return shared_.health.Check(nullptr, req, resp); });
  }
  std::lock_guard l(mu_);
  Stream& s = *call.stream;
  if (closed_ || s.gone) return;
  if (st.ok()) {
    append_message(s.out, reply);
    s.end = {0, ""};
    respond(s, "");
  } else {
    finish(s, st.error_code(), st.error_message());
  }
  flush();
}


}  // namespace kpleg::api::h2
