// Sequences of requests to the consumer API (kpleg.v1.PodLifecycle and grpc.health.v1.Health)
// through the production handlers, the unix socket's real server (kplegd's HTTP/2 code) and a
// real gRPC client.
// Whatever a client sends, every call must end with a status from the expected set within a
// bounded time, and the handlers must keep their documented semantics (docs/api.md):
// - a filter longer than its bound (pod_uid 128, pod_namespace 63, instance_id 64 bytes) is
//   refused INVALID_ARGUMENT; a request over 4 KiB RESOURCE_EXHAUSTED;
// - List returns exactly the pods that match its filters, with the stream's seq and instance;
// - a Watch with from_seq != 0 and no instance id, with another instance id (from_seq 0
//   too), from before the retained history, or from beyond the stream's last seq, starts with
//   RESYNC; with the right instance and a position inside the history (0 included) it gets
//   exactly the retained events after from_seq that match its filters, in seq order; every
//   event delivered matches the filters;
// - a cancelled stream gives its slot back: a later Watch is never refused for lack of one;
// - UNAVAILABLE never (the server runs throughout).
//
// The server, its event bus (with a fixed history, part of which has fallen out of the
// retained window) and the client channel are set up once per process. Each input is decoded
// into up to kMaxCalls requests: a selector byte, then the fields. Typed requests carry valid
// UTF-8 (protobuf serializes nothing else for a proto3 string); raw requests send the input's
// bytes as the serialized message of a method through a generic stub, which exercises the
// server's own parsing and its request size limit.
#include "require.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "api/api_server.h"
#include "api/providers.h"
#include "bus/event_bus.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kpleg/v1/pleg.grpc.pb.h"

// gRPC keeps process-wide singletons (its executor, the resolver registry, per-thread caches)
// that are still allocated when the fuzzer exits, and its background threads free memory that
// libFuzzer's per-input leak check sees as allocated by the input. Neither is a leak of the
// handlers: leak detection is off for this target (the server's memory is bounded by design and
// measured in docs/api.md).
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace {

using namespace std::chrono_literals;
namespace v1 = ::kpleg::v1;
namespace health = ::grpc::health::v1;
using grpc::StatusCode;

constexpr size_t kPods = 6;
constexpr const char* kNamespaces[] = {"default", "kube-system", "team-a"};
constexpr uint64_t kEvents = 60;   // seq 1..60 published
constexpr size_t kHistory = 40;    // seq 21..60 retained
constexpr uint64_t kOldest = kEvents - kHistory + 1;
constexpr size_t kMaxWatchers = 3;
constexpr size_t kMaxCalls = 16;
constexpr size_t kMaxRequestBytes = 4096;  // api_server.cc
// No call may take longer than this: the server answers every one at once (a Watch's backlog
// included); a call that hits it has hung.
constexpr auto kCallDeadline = 10s;
// The in-flight CRI calls the stats provider reports, by age.
constexpr uint64_t kInflightAgesMs[] = {0, 1500, 600000};

struct PodFixture {
  std::string uid, name, ns;
};

std::vector<PodFixture> g_pods;
std::vector<kpleg::pleg::PodLifecycleEvent> g_events;  // g_events[i].seq == i + 1

class State final : public kpleg::api::StateProvider {
 public:
  explicit State(kpleg::bus::EventBus& bus) : bus_(bus) {}
  kpleg::api::StateSnapshot snapshot() override {
    auto [seq, pods] = bus_.with_seq([] {
      std::vector<kpleg::pleg::PodRecord> out;
      for (const auto& p : g_pods) {
        kpleg::pleg::PodRecord r{{p.uid, p.name, p.ns}, {}};
        r.containers.push_back({"sandbox-" + p.name, "", true, {}, {}});
        r.containers.push_back({"ctr-" + p.name, "app", false, {}, {}});
        out.push_back(std::move(r));
      }
      return out;
    });
    return {seq, std::move(pods)};
  }

 private:
  kpleg::bus::EventBus& bus_;
};

class Health final : public kpleg::api::HealthProvider {
 public:
  kpleg::api::HealthReport health() override { return {true, {}, std::nullopt}; }
};

class Stats final : public kpleg::api::StatsProvider {
 public:
  kpleg::api::DaemonStats stats() override {
    kpleg::api::DaemonStats s;
    s.mode = "ebpf";
    s.pods = kPods;
    s.containers = 2 * kPods;
    return s;
  }
  std::vector<kpleg::api::InflightCallRecord> inflight_calls(std::chrono::milliseconds min_age) override {
    std::vector<kpleg::api::InflightCallRecord> out;
    for (auto it = std::rbegin(kInflightAgesMs); it != std::rend(kInflightAgesMs); ++it) {
      if (std::chrono::milliseconds(*it) < min_age) continue;
      kpleg::api::InflightCallRecord c;
      c.method = "StopPodSandbox";
      c.origin = "kplegd";
      c.pod.uid = g_pods[0].uid;
      c.age = std::chrono::milliseconds(*it);
      c.description = "StopPodSandbox in flight";
      out.push_back(std::move(c));
    }
    return out;
  }
};

struct Env {
  std::string dir;
  kpleg::bus::EventBus bus{kpleg::bus::EventBusOptions{kHistory, 1000, {}}};
  State state{bus};
  Health health;
  Stats stats;
  std::unique_ptr<kpleg::api::ApiServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::PodLifecycle::Stub> stub;
  std::unique_ptr<health::Health::Stub> health_stub;
  std::unique_ptr<grpc::GenericStub> generic;
  grpc::CompletionQueue cq;  // the generic stub's calls, one at a time
  std::string instance_id;
};

Env* g_env = nullptr;

void make_fixture() {
  for (size_t i = 0; i < kPods; ++i)
    g_pods.push_back({fmt::format("{:08x}-1111-4222-8333-{:012x}", i + 1, i + 1),
                      fmt::format("web-{}", i), kNamespaces[i % 3]});
  using kpleg::pleg::EventType;
  const EventType types[] = {EventType::kContainerStarted, EventType::kContainerDied,
                             EventType::kContainerRemoved, EventType::kPodSync};
  for (uint64_t seq = 1; seq <= kEvents; ++seq) {
    const PodFixture& p = g_pods[(seq * 5 + seq / 7) % kPods];
    kpleg::pleg::PodLifecycleEvent ev;
    ev.type = types[seq % 4];
    ev.pod_uid = p.uid;
    ev.pod_name = p.name;
    ev.pod_namespace = p.ns;
    ev.container_id = fmt::format("{:064x}", seq);
    ev.container_name = "app";
    ev.emit_ts_ns = 1'700'000'000'000'000'000ull + seq;
    g_events.push_back(ev);
  }
}

// ---- input decoding ----

struct Input {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | u8();
    return v;
  }
  std::string bytes(size_t len) {
    len = std::min(len, n);
    std::string s(reinterpret_cast<const char*>(p), len);
    p += len;
    n -= len;
    return s;
  }
};

// Bytes as valid UTF-8: ASCII as is, the others as the two-byte encoding of U+0080..U+00FF.
std::string utf8(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) {
    if (c < 0x80) {
      s += char(c);
    } else {
      s += char(0xC0 | (c >> 6));
      s += char(0x80 | (c & 0x3F));
    }
  }
  return s;
}

// A pod_uid or pod_namespace filter: empty, real, near-miss, foreign, arbitrary or over-long.
std::string pick_filter(Input& in, bool uid) {
  const size_t limit = uid ? 128 : 63;
  switch (in.u8() % 8) {
    case 0: return "";
    case 1: return g_pods[in.u8() % kPods].uid;
    case 2: return kNamespaces[in.u8() % 3];
    case 3: return utf8(in.bytes(in.u8() % 72));
    case 4: return std::string(limit + 1 + in.u8(), char('a' + in.u8() % 26));
    case 5: return std::string(limit + in.u8() % 2, 'x');  // at the bound and just past it
    case 6: {
      std::string s = uid ? g_pods[in.u8() % kPods].uid : kNamespaces[in.u8() % 3];
      s += char(in.u8() & 0x7F);
      return s;
    }
    default: return uid ? kNamespaces[in.u8() % 3] : g_pods[in.u8() % kPods].uid;
  }
}

uint64_t pick_from_seq(Input& in) {
  switch (in.u8() % 9) {
    case 0: return 0;
    case 1: return kOldest + in.u8() % kHistory;         // inside the retained history
    case 2: return 1 + in.u8() % (kOldest - 1);          // before it (kOldest - 1: just before)
    case 3: return kEvents;                              // the last seq
    case 4: return kEvents + 1 + in.u8();                // past it
    case 5: return UINT64_MAX;
    case 6: return UINT64_MAX - 1 - in.u8() % 2;
    case 7: return kOldest - 1 + in.u8() % 3;            // around the history's start
    default: return in.u64();
  }
}

std::string pick_instance(Input& in) {
  switch (in.u8() % 6) {
    case 0: return "";
    case 1: return "0123456789abcdef0123456789abcdef";
    case 2: return std::string(65 + in.u8() % 64, 'f');  // over-long
    case 3: {
      std::string s = g_env->instance_id;
      s[in.u8() % s.size()] ^= 1;
      return s;
    }
    case 4: return utf8(in.bytes(in.u8() % 70));
    default: return g_env->instance_id;
  }
}

// ---- expectations ----

bool filters_too_long(const std::string& uid, const std::string& ns, const std::string* inst) {
  return uid.size() > 128 || ns.size() > 63 || (inst != nullptr && inst->size() > 64);
}

bool matches(const std::string& uid, const std::string& ns, const std::string& pod_uid,
             const std::string& pod_ns) {
  return (uid.empty() || uid == pod_uid) && (ns.empty() || ns == pod_ns);
}

// One expected Watch event: RESYNC at `seq`, or fixture event `seq`.
struct Expected {
  bool resync;
  uint64_t seq;
};

// The backlog docs/api.md promises for a Watch on the fixed history (no live events follow).
std::vector<Expected> expected_backlog(const v1::WatchRequest& req) {
  std::vector<Expected> out;
  const uint64_t from = req.from_seq();
  if (from == 0 && req.instance_id().empty()) return out;  // from now on
  if (req.instance_id() != g_env->instance_id || from > kEvents) {
    out.push_back({true, kEvents});
    return out;
  }
  uint64_t first = from + 1;
  if (first < kOldest) {
    out.push_back({true, kOldest - 1});
    first = kOldest;
  }
  for (uint64_t seq = first; seq <= kEvents; ++seq) {
    const auto& ev = g_events[seq - 1];
    if (matches(req.pod_uid(), req.pod_namespace(), ev.pod_uid, ev.pod_namespace))
      out.push_back({false, seq});
  }
  return out;
}

void check_event(const v1::Event& got, const Expected& want, const v1::WatchRequest& req) {
  REQUIRE(got.seq() == want.seq);
  if (want.resync) {
    REQUIRE(got.type() == v1::EVENT_TYPE_RESYNC);
    return;
  }
  const auto& ev = g_events[want.seq - 1];
  REQUIRE(got.type() != v1::EVENT_TYPE_RESYNC);
  REQUIRE(got.pod_uid() == ev.pod_uid);
  REQUIRE(got.pod_namespace() == ev.pod_namespace);
  REQUIRE(got.container_id() == ev.container_id);
  REQUIRE(matches(req.pod_uid(), req.pod_namespace(), got.pod_uid(), got.pod_namespace()));
}

void check_list(const v1::ListRequest& req, const grpc::Status& st, const v1::ListResponse& resp) {
  if (filters_too_long(req.pod_uid(), req.pod_namespace(), nullptr)) {
    REQUIRE(st.error_code() == StatusCode::INVALID_ARGUMENT);
    return;
  }
  REQUIRE(st.ok());
  REQUIRE(resp.seq() == kEvents);
  REQUIRE(resp.instance_id() == g_env->instance_id);
  size_t want = 0;
  for (const auto& p : g_pods) want += matches(req.pod_uid(), req.pod_namespace(), p.uid, p.ns);
  REQUIRE(size_t(resp.pods_size()) == want);
  for (const auto& pod : resp.pods()) {
    REQUIRE(matches(req.pod_uid(), req.pod_namespace(), pod.uid(), pod.namespace_()));
    REQUIRE(pod.containers_size() == 2);
  }
}

void check_stats(const grpc::Status& st, const v1::StatsResponse& resp) {
  REQUIRE(st.ok());
  REQUIRE(resp.instance_id() == g_env->instance_id);
  REQUIRE(resp.last_seq() == kEvents);
  REQUIRE(resp.oldest_retained_seq() == kOldest);
  REQUIRE(resp.history_capacity() == kHistory);
  REQUIRE(resp.subscribers() <= kMaxWatchers);
  REQUIRE(resp.pods() == kPods);
  REQUIRE(resp.healthy());
}

void check_inflight(const v1::InflightCallsRequest& req, const grpc::Status& st,
                    const v1::InflightCallsResponse& resp) {
  REQUIRE(st.ok());
  // The handler clamps min_age_ms to what a duration holds; every fixture age is below that.
  size_t want = 0;
  for (uint64_t age : kInflightAgesMs) want += age >= req.min_age_ms();
  REQUIRE(size_t(resp.calls_size()) == want);
  uint64_t prev = UINT64_MAX;
  for (const auto& c : resp.calls()) {
    REQUIRE(c.age_ms() >= req.min_age_ms());
    REQUIRE(c.age_ms() <= prev);  // oldest first
    prev = c.age_ms();
  }
}

bool known_health_service(const std::string& name) {
  return name.empty() || name == kpleg::api::kHealthServiceName;
}

void check_health_check(const health::HealthCheckRequest& req, const grpc::Status& st,
                        const health::HealthCheckResponse& resp) {
  if (!known_health_service(req.service())) {
    REQUIRE(st.error_code() == StatusCode::NOT_FOUND);
    return;
  }
  REQUIRE(st.ok());
  REQUIRE(resp.status() == health::HealthCheckResponse::SERVING);
}

void check_health_watch_first(const health::HealthCheckRequest& req,
                              const health::HealthCheckResponse& resp) {
  REQUIRE(resp.status() == (known_health_service(req.service())
                                ? health::HealthCheckResponse::SERVING
                                : health::HealthCheckResponse::SERVICE_UNKNOWN));
}

// What a stream that ended without its subscription in place may end with.
void check_refused(const grpc::Status& st, bool too_long) {
  // Never refused for lack of a slot: this client holds no other stream, and the ones it
  // cancelled must have given theirs back.
  REQUIRE(st.error_code() != StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(too_long == (st.error_code() == StatusCode::INVALID_ARGUMENT));
}

void set_deadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
}

// ---- typed calls ----

void call_list(Input& in) {
  v1::ListRequest req;
  req.set_pod_uid(pick_filter(in, true));
  req.set_pod_namespace(pick_filter(in, false));
  grpc::ClientContext ctx;
  set_deadline(ctx);
  v1::ListResponse resp;
  check_list(req, g_env->stub->List(&ctx, req, &resp), resp);
}

void call_stats() {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  v1::StatsResponse resp;
  check_stats(g_env->stub->Stats(&ctx, v1::StatsRequest{}, &resp), resp);
}

void call_inflight(Input& in) {
  v1::InflightCallsRequest req;
  switch (in.u8() % 4) {
    case 0: req.set_min_age_ms(0); break;
    case 1: req.set_min_age_ms(kInflightAgesMs[in.u8() % 3] + in.u8() % 3 - 1); break;
    case 2: req.set_min_age_ms(UINT64_MAX - in.u8()); break;
    default: req.set_min_age_ms(in.u64()); break;
  }
  grpc::ClientContext ctx;
  set_deadline(ctx);
  v1::InflightCallsResponse resp;
  check_inflight(req, g_env->stub->InflightCalls(&ctx, req, &resp), resp);
}

void call_watch(Input& in) {
  v1::WatchRequest req;
  req.set_from_seq(pick_from_seq(in));
  req.set_pod_uid(pick_filter(in, true));
  req.set_pod_namespace(pick_filter(in, false));
  req.set_instance_id(pick_instance(in));
  const bool too_long = filters_too_long(req.pod_uid(), req.pod_namespace(), &req.instance_id());
  const std::vector<Expected> want = too_long ? std::vector<Expected>{} : expected_backlog(req);

  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto reader = g_env->stub->Watch(&ctx, req);
  reader->WaitForInitialMetadata();
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find("kpleg-instance-id");
  if (it == md.end()) {  // refused before subscribing
    v1::Event ev;
    REQUIRE(!reader->Read(&ev));
    check_refused(reader->Finish(), too_long);
    return;
  }
  REQUIRE(!too_long);
  REQUIRE(std::string(it->second.data(), it->second.size()) == g_env->instance_id);
  // Exactly the expected backlog, then nothing more is waiting: the fixture publishes no live
  // events, so the stream is idle; cancel it as a consumer going away would.
  v1::Event ev;
  for (const Expected& e : want) {
    REQUIRE(reader->Read(&ev));
    check_event(ev, e, req);
  }
  ctx.TryCancel();
  while (reader->Read(&ev)) REQUIRE(false && "an event beyond the expected backlog");
  const grpc::Status st = reader->Finish();
  REQUIRE(st.error_code() == StatusCode::CANCELLED);
}

void call_health(Input& in, bool watch) {
  health::HealthCheckRequest req;
  switch (in.u8() % 4) {
    case 0: break;
    case 1: req.set_service(kpleg::api::kHealthServiceName); break;
    case 2: req.set_service(std::string(kpleg::api::kHealthServiceName) + "x"); break;
    default: req.set_service(utf8(in.bytes(in.u8() % 200))); break;
  }
  grpc::ClientContext ctx;
  set_deadline(ctx);
  if (!watch) {
    health::HealthCheckResponse resp;
    check_health_check(req, g_env->health_stub->Check(&ctx, req, &resp), resp);
    return;
  }
  auto reader = g_env->health_stub->Watch(&ctx, req);
  health::HealthCheckResponse resp;
  if (!reader->Read(&resp)) {
    check_refused(reader->Finish(), false);
    REQUIRE(false && "a health Watch ended without its first status");
  }
  check_health_watch_first(req, resp);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  REQUIRE(reader->Finish().error_code() == StatusCode::CANCELLED);
}

// ---- raw calls through the generic stub ----

enum Method { kList, kWatch, kStats, kInflight, kHealthCheck, kHealthWatch, kUnknown, kMethods };
constexpr const char* kPaths[] = {
    "/kpleg.v1.PodLifecycle/List",          "/kpleg.v1.PodLifecycle/Watch",
    "/kpleg.v1.PodLifecycle/Stats",         "/kpleg.v1.PodLifecycle/InflightCalls",
    "/grpc.health.v1.Health/Check",         "/grpc.health.v1.Health/Watch",
    "/kpleg.v1.PodLifecycle/Delete",
};

// Waits for the one operation in flight on the generic stub's queue.
bool await(void* tag) {
  void* got = nullptr;
  bool ok = false;
  const auto status =
      g_env->cq.AsyncNext(&got, &ok, std::chrono::system_clock::now() + kCallDeadline + 5s);
  REQUIRE(status == grpc::CompletionQueue::GOT_EVENT);  // else the call hung past its deadline
  REQUIRE(got == tag);
  return ok;
}

template <typename M>
bool parse(const grpc::ByteBuffer& buf, M* msg) {
  grpc::Slice slice;
  if (!buf.TrySingleSlice(&slice).ok() && !buf.DumpToSingleSlice(&slice).ok()) return false;
  return msg->ParseFromArray(slice.begin(), int(slice.size()));
}

void call_raw(Input& in) {
  const Method method = Method(in.u8() % kMethods);
  size_t len = (size_t(in.u8()) << 8 | in.u8()) % 4300;  // up to a bit past the limit
  if (in.u8() % 4 != 0) len %= 96;                        // mostly small ones
  std::string payload = in.bytes(len);
  // A long request the input cannot fill: the bytes taken, repeated.
  while (!payload.empty() && payload.size() < len) payload += payload.substr(0, len - payload.size());
  if (payload.empty()) payload.assign(len, '\n');

  // What the server should make of the bytes.
  const bool too_big = payload.size() > kMaxRequestBytes;
  bool parses = false;
  v1::ListRequest list_req;
  v1::WatchRequest watch_req;
  v1::InflightCallsRequest inflight_req;
  health::HealthCheckRequest health_req;
  switch (method) {
    case kList: parses = list_req.ParseFromString(payload); break;
    case kWatch: parses = watch_req.ParseFromString(payload); break;
    case kStats: parses = v1::StatsRequest().ParseFromString(payload); break;
    case kInflight: parses = inflight_req.ParseFromString(payload); break;
    case kHealthCheck:
    case kHealthWatch: parses = health_req.ParseFromString(payload); break;
    default: break;
  }
  const bool streaming = method == kWatch || method == kHealthWatch;
  const bool watch_too_long =
      method == kWatch && parses &&
      filters_too_long(watch_req.pod_uid(), watch_req.pod_namespace(), &watch_req.instance_id());
  std::vector<Expected> want;
  if (method == kWatch && parses && !too_big && !watch_too_long) want = expected_backlog(watch_req);
  size_t reads = streaming ? (method == kWatch ? want.size() : 1) : 1;

  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto call = g_env->generic->PrepareCall(&ctx, kPaths[method], &g_env->cq);
  int tag = 0;
  call->StartCall(&tag);
  REQUIRE(await(&tag));
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1);
  // A write fails when the server has already ended the call (e.g. the unknown method).
  call->WriteLast(request, grpc::WriteOptions(), &tag);
  await(&tag);
  call->ReadInitialMetadata(&tag);
  await(&tag);
  // A Watch refused before subscribing has no kpleg-instance-id: it is read to its end, not
  // cancelled (a cancel could overtake the refusal).
  const bool subscribed =
      method != kWatch || ctx.GetServerInitialMetadata().count("kpleg-instance-id") > 0;
  if (!subscribed) reads = 0;

  std::vector<grpc::ByteBuffer> got;
  bool ended = false;
  for (size_t i = 0; i < reads; ++i) {
    grpc::ByteBuffer buf;
    call->Read(&buf, &tag);
    if (!await(&tag)) {
      ended = true;
      break;
    }
    got.push_back(std::move(buf));
  }
  if (streaming && subscribed && !ended) {
    ctx.TryCancel();
  } else if (!ended) {
    grpc::ByteBuffer buf;
    call->Read(&buf, &tag);
    REQUIRE(!await(&tag));  // a unary call answers once
  }
  while (!ended) {
    grpc::ByteBuffer buf;
    call->Read(&buf, &tag);
    if (!await(&tag)) break;
    REQUIRE(false && "a message beyond the expected ones");
  }
  grpc::Status st;
  call->Finish(&st, &tag);
  REQUIRE(await(&tag));

  const StatusCode code = st.error_code();
  REQUIRE(code != StatusCode::UNAVAILABLE);
  if (method == kUnknown) {
    REQUIRE(code == StatusCode::UNIMPLEMENTED);
    return;
  }
  if (too_big) {
    REQUIRE(code == StatusCode::RESOURCE_EXHAUSTED);
    REQUIRE(got.empty());
    return;
  }
  if (!parses) {
    // A request that does not parse is INTERNAL (as gRPC's sync server answers it).
    REQUIRE(code == StatusCode::INTERNAL);
    REQUIRE(got.empty());
    return;
  }
  switch (method) {
    case kList: {
      v1::ListResponse resp;
      REQUIRE(!st.ok() || (got.size() == 1 && parse(got[0], &resp)));
      check_list(list_req, st, resp);
      break;
    }
    case kStats: {
      v1::StatsResponse resp;
      REQUIRE(got.size() == 1 && parse(got[0], &resp));
      check_stats(st, resp);
      break;
    }
    case kInflight: {
      v1::InflightCallsResponse resp;
      REQUIRE(got.size() == 1 && parse(got[0], &resp));
      check_inflight(inflight_req, st, resp);
      break;
    }
    case kHealthCheck: {
      health::HealthCheckResponse resp;
      REQUIRE(!st.ok() || (got.size() == 1 && parse(got[0], &resp)));
      check_health_check(health_req, st, resp);
      break;
    }
    case kHealthWatch: {
      REQUIRE(got.size() == 1);
      health::HealthCheckResponse resp;
      REQUIRE(parse(got[0], &resp));
      check_health_watch_first(health_req, resp);
      REQUIRE(code == StatusCode::CANCELLED);
      break;
    }
    case kWatch: {
      if (watch_too_long) {
        REQUIRE(code == StatusCode::INVALID_ARGUMENT);
        REQUIRE(got.empty());
        break;
      }
      REQUIRE(code == StatusCode::CANCELLED);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        v1::Event ev;
        REQUIRE(parse(got[i], &ev));
        check_event(ev, want[i], watch_req);
      }
      break;
    }
    default: break;
  }
}

void init() {
  // The server's and protobuf's logs of what the fuzzer sends on purpose are noise here.
  spdlog::set_level(spdlog::level::err);
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  make_fixture();

  char tmpl[] = "/tmp/kpleg-api-fuzz-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  g_env = new Env;  // never destroyed: the fuzzer exits from inside libFuzzer
  g_env->dir = tmpl;
  for (auto& ev : g_events) g_env->bus.publish(ev);
  g_env->instance_id = g_env->bus.instance_id();

  kpleg::api::ApiServerOptions opts;
  opts.socket_path = g_env->dir + "/kpleg.sock";
  opts.max_watchers = kMaxWatchers;
  g_env->server = std::make_unique<kpleg::api::ApiServer>(opts, g_env->bus, g_env->state,
                                                          g_env->health, g_env->stats);
  if (auto st = g_env->server->start(); !st) {
    std::fprintf(stderr, "api_requests_fuzz: cannot start the API server: %s\n",
                 st.error().message.c_str());
    std::abort();
  }
  g_env->channel =
      grpc::CreateChannel("unix:" + opts.socket_path, grpc::InsecureChannelCredentials());
  g_env->stub = v1::PodLifecycle::NewStub(g_env->channel);
  g_env->health_stub = health::Health::NewStub(g_env->channel);
  g_env->generic = std::make_unique<grpc::GenericStub>(g_env->channel);
  // The socket directory goes when the process does (also when libFuzzer ends it by _exit).
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(g_env->dir, ec);
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  for (size_t i = 0; i < kMaxCalls && !in.empty(); ++i) {
    switch (in.u8() % 7) {
      case 0: call_list(in); break;
      case 1: call_watch(in); break;
      case 2: call_stats(); break;
      case 3: call_inflight(in); break;
      case 4: call_health(in, false); break;
      case 5: call_health(in, true); break;
      default: call_raw(in); break;
    }
  }
  return 0;
}
