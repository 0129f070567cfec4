// kpleg-bench-event-decode: what decoding one event of the runtime's GetContainerEvents stream
// costs, alone (no socket, no HTTP/2): the selective decoder (cri/event_decoder.h) against the
// generated parser (ContainerEventResponse::ParseFromString), each followed by what kplegd then
// reads of the event (pleg::observation_of). The message object is reused from event to event,
// as GrpcCriClient::container_events does. Google Benchmark; besides the time, `allocs` is the
// heap allocations per event (operator new, counted in this process).
//
// The events are built like containerd's: the pod's sandbox status and the status of every
// container of the pod, with the labels, annotations, mounts and resources the kubelet gives
// them, and two ContainerStatus fields newer than kpleg's CRI subset (image_id, user), which the
// generated parser keeps as unknown fields. Arguments: the pod's containers (1 or 5), the
// event's type (0 CREATED, 2 STOPPED; the named container is the pod's last), and whether the
// caches are cold (see evict_caches).
#include <benchmark/benchmark.h>
#include <google/protobuf/unknown_field_set.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "cri/event_decoder.h"
#include "pleg/runtime_looks.h"

namespace {

thread_local uint64_t t_allocs = 0;

}  // namespace

void* operator new(std::size_t n) {
  ++t_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

namespace v1 = ::runtime::v1;

constexpr const char* kPodUid = "8c4f2b9e-6d1a-4c3b-9f7e-2a5d8b1c0e47";
constexpr const char* kPodName = "checkout-7c9d8f6b5-x2k4q";
constexpr const char* kNamespace = "shop";

std::string hex_id(int n) {
  std::string s = "3b0c8e1f9a7d4c2e6b5a0f1d8c3e7b9a2d4f6e8c0a1b3d5f7e9c2a4b6d8f0e1";
  s.back() = char('0' + n % 10);
  return s;
}

v1::PodSandboxStatus sandbox_status() {
  v1::PodSandboxStatus s;
  s.set_id(hex_id(0));
  auto* m = s.mutable_metadata();
  m->set_name(kPodName);
  m->set_uid(kPodUid);
  m->set_namespace_(kNamespace);
  m->set_attempt(0);
  s.set_state(v1::SANDBOX_READY);
  s.set_created_at(1'795'273'640'123'456'789);
  s.mutable_network()->set_ip("10.244.1.37");
  s.mutable_network()->add_additional_ips()->set_ip("fd00:10:244:1::25");
  s.mutable_linux()->mutable_namespaces()->mutable_options()->set_network(v1::POD);
  auto& labels = *s.mutable_labels();
  labels["app.kubernetes.io/name"] = "checkout";
  labels["app.kubernetes.io/part-of"] = "shop";
  labels["pod-template-hash"] = "7c9d8f6b5";
  labels["io.kubernetes.pod.name"] = kPodName;
  labels["io.kubernetes.pod.namespace"] = kNamespace;
  labels["io.kubernetes.pod.uid"] = kPodUid;
  auto& ann = *s.mutable_annotations();
  ann["kubernetes.io/config.seen"] = "2026-11-27T18:02:11.482915327Z";
  ann["kubernetes.io/config.source"] = "api";
  ann["prometheus.io/scrape"] = "true";
  ann["prometheus.io/port"] = "9090";
  s.set_runtime_handler("");
  return s;
}

v1::ContainerStatus container_status(int i, bool exited) {
  const std::string name = i == 0 ? "checkout" : "sidecar-" + std::to_string(i);
  v1::ContainerStatus c;
  c.set_id(hex_id(i + 1));
  c.mutable_metadata()->set_name(name);
  c.mutable_metadata()->set_attempt(0);
  c.set_state(exited ? v1::CONTAINER_EXITED : v1::CONTAINER_RUNNING);
  c.set_created_at(1'795'273'641'000'000'000 + i);
  c.set_started_at(1'795'273'641'200'000'000 + i);
  if (exited) {
    c.set_finished_at(1'795'273'700'000'000'000 + i);
    c.set_exit_code(137);
    c.set_reason("Error");
  }
  c.mutable_image()->set_image("registry.k8s.io/e2e-test-images/agnhost:2.47");
  c.set_image_ref(
      "registry.k8s.io/e2e-test-images/agnhost@sha256:"
      "1e5d8c3b2a9f7e6d4c0b1a2f3e4d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d");
  auto& labels = *c.mutable_labels();
  labels["io.kubernetes.container.name"] = name;
  labels["io.kubernetes.pod.name"] = kPodName;
  labels["io.kubernetes.pod.namespace"] = kNamespace;
  labels["io.kubernetes.pod.uid"] = kPodUid;
  auto& ann = *c.mutable_annotations();
  ann["io.kubernetes.container.hash"] = "6f8a3c21";
  ann["io.kubernetes.container.restartCount"] = "0";
  ann["io.kubernetes.container.terminationMessagePath"] = "/dev/termination-log";
  ann["io.kubernetes.container.terminationMessagePolicy"] = "File";
  ann["io.kubernetes.pod.terminationGracePeriod"] = "30";
  ann["io.kubernetes.container.ports"] =
      R"([{"name":"http","containerPort":8080,"protocol":"TCP"}])";
  const std::string pod_dir = std::string("/var/lib/kubelet/pods/") + kPodUid;
  auto mount = [&](const std::string& in, const std::string& host, bool ro) {
    auto* m = c.add_mounts();
    m->set_container_path(in);
    m->set_host_path(host);
    m->set_readonly(ro);
    m->set_selinux_relabel(false);
  };
  mount("/var/run/secrets/kubernetes.io/serviceaccount",
        pod_dir + "/volumes/kubernetes.io~projected/kube-api-access-7xk2p", true);
  mount("/etc/hosts", pod_dir + "/etc-hosts", false);
  mount("/dev/termination-log", pod_dir + "/containers/" + name + "/4f1b2c3d", false);
  c.set_log_path(std::string("/var/log/pods/") + kNamespace + "_" + kPodName + "_" + kPodUid + "/" +
                 name + "/0.log");
  auto* r = c.mutable_resources()->mutable_linux();
  r->set_cpu_period(100000);
  r->set_cpu_quota(50000);
  r->set_cpu_shares(512);
  r->set_memory_limit_in_bytes(268435456);
  r->set_oom_score_adj(936);
  // CRI fields kpleg's subset does not declare: image_id = 17, user = 18 (linux {uid, gid,
  // supplemental_groups}).
  auto* unknown = c.GetReflection()->MutableUnknownFields(&c);
  unknown->AddLengthDelimited(
      17, "sha256:5e4b8c2a1d9f7e3c6b0a4d8f2e1c7b9a3d5f0e6c8a2b4d1f3e5c7a9b0d2f4e6");
  unknown->AddLengthDelimited(18, std::string("\x0a\x06\x08\x00\x10\x00\x18\x00", 8));
  return c;
}

std::string event_wire(int containers, v1::ContainerEventType type) {
  v1::ContainerEventResponse ev;
  ev.set_container_id(hex_id(containers));  // the pod's last container
  ev.set_container_event_type(type);
  ev.set_created_at(1'795'273'700'000'500'000);
  *ev.mutable_pod_sandbox_status() = sandbox_status();
  for (int i = 0; i < containers; ++i)
    *ev.add_containers_statuses() =
        container_status(i, type == v1::CONTAINER_STOPPED_EVENT && i == containers - 1);
  return ev.SerializeAsString();
}

// kplegd's event thread sleeps between events (tens of ms apart under churn) while other threads
// and processes run: its code and data are mostly out of the caches when an event comes. The
// `cold` variants write over more than the last-level cache before each event (not timed).
void evict_caches() {
  static std::vector<char> junk(64u << 20);
  static char round = 0;
  ++round;
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = round;
  benchmark::ClobberMemory();
}

// What kplegd takes from each is the same.
bool same_observation(const v1::ContainerEventResponse& a, const v1::ContainerEventResponse& b) {
  const auto x = kpleg::pleg::observation_of(a), y = kpleg::pleg::observation_of(b);
  if (x.has_value() != y.has_value()) return false;
  if (!x) return true;
  const auto &p = *x, &q = *y;
  return p.id == q.id && p.state == q.state && p.sandbox == q.sandbox && p.pod.uid == q.pod.uid &&
         p.pod.name == q.pod.name && p.pod.namespace_ == q.pod.namespace_ && p.name == q.name &&
         p.snapshot.state == q.snapshot.state &&
         p.snapshot.created_at_ns == q.snapshot.created_at_ns &&
         p.snapshot.started_at_ns == q.snapshot.started_at_ns &&
         p.snapshot.finished_at_ns == q.snapshot.finished_at_ns &&
         p.snapshot.exit_code == q.snapshot.exit_code && p.snapshot.reason == q.snapshot.reason &&
         p.snapshot.message == q.snapshot.message;
}

template <bool kSelective>
void BM_Decode(benchmark::State& state) {
  const int containers = int(state.range(0));
  const auto type = static_cast<v1::ContainerEventType>(state.range(1));
  const std::string wire = event_wire(containers, type);
  v1::ContainerEventResponse ev;
  const bool cold = state.range(2) != 0;
  uint64_t allocs = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      evict_caches();
      state.ResumeTiming();
    }
    const uint64_t allocs0 = t_allocs;
    bool ok;
    if constexpr (kSelective) ok = kpleg::cri::decode_container_event(wire, ev);
    else ok = ev.ParseFromString(wire);
    auto obs = kpleg::pleg::observation_of(ev);
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(obs);
    allocs += t_allocs - allocs0;
  }
  state.counters["allocs"] = benchmark::Counter(double(allocs), benchmark::Counter::kAvgIterations);
  state.counters["bytes"] = double(wire.size());
  state.SetLabel(type == v1::CONTAINER_CREATED_EVENT ? "CREATED" : "STOPPED");
}

// The cold variants' eviction takes ~10 ms an event: a fixed number of events instead.
void hot_caches(benchmark::internal::Benchmark* b) {
  b->ArgNames({"containers", "type", "cold"});
  for (int containers : {1, 5})
    for (int type : {v1::CONTAINER_CREATED_EVENT, v1::CONTAINER_STOPPED_EVENT})
      b->Args({containers, type, 0});
}
void cold_caches(benchmark::internal::Benchmark* b) {
  b->ArgNames({"containers", "type", "cold"});
  for (int containers : {1, 5})
    for (int type : {v1::CONTAINER_CREATED_EVENT, v1::CONTAINER_STOPPED_EVENT})
      b->Args({containers, type, 1});
  b->Iterations(200);
}
BENCHMARK(BM_Decode<false>)->Name("generated")->Apply(hot_caches);
BENCHMARK(BM_Decode<true>)->Name("selective")->Apply(hot_caches);
BENCHMARK(BM_Decode<false>)->Name("generated")->Apply(cold_caches);
BENCHMARK(BM_Decode<true>)->Name("selective")->Apply(cold_caches);

}  // namespace

// First checks that both ways give kplegd the same observation of every event benchmarked
// (exit 1 otherwise), then runs the benchmarks.
int main(int argc, char** argv) {
  for (int containers : {1, 5})
    for (auto type : {v1::CONTAINER_CREATED_EVENT, v1::CONTAINER_STOPPED_EVENT}) {
      const std::string wire = event_wire(containers, type);
      v1::ContainerEventResponse full, decoded;
      if (!full.ParseFromString(wire) || !kpleg::cri::decode_container_event(wire, decoded) ||
          !same_observation(full, decoded)) {
        std::fprintf(stderr,
                     "kpleg-bench-event-decode: the decoder and the generated parser disagree "
                     "on a %d-container event of type %d\n",
                     containers, int(type));
        return 1;
      }
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
