// kplegd's CRI endpoint (--cri-listen) between CRI clients and the test bed's real containerd:
// every call comes back as the runtime answers it, methods kpleg has no name for included;
// kpleg-load and crictl work through it as against the runtime, and again after the runtime
// restarted; and GetContainerEvents is
// answered from kpleg's events with what a kubelet requires of each event, to any number of
// subscribers, on a runtime that has no event stream of its own (containerd 1.6) too.
#include <gtest/gtest.h>
#include <signal.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cri/api.grpc.pb.h"
#include "e2e/e2e_support.h"
#include "support/eventually.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
namespace v1 = ::runtime::v1;

struct RawReply {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  std::string body;
};

// One unary call by method path and raw request bytes, as a generic client makes it.
RawReply raw_call(const std::string& endpoint, const std::string& method, const std::string& request) {
  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::Slice slice(request.data(), request.size());
  grpc::ByteBuffer req(&slice, 1), resp;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status st) {
    std::lock_guard lk(mu);
    status = std::move(st);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done; });
  RawReply r{status.error_code(), status.error_message(), {}};
  std::vector<grpc::Slice> slices;
  if (status.ok() && resp.Dump(&slices).ok())
    for (const auto& s : slices) r.body.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return r;
}

// A GetContainerEvents subscriber reading on its own thread until cancelled.
class EventsReader {
 public:
  explicit EventsReader(const std::string& endpoint) {
    auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
    stub_ = v1::RuntimeService::NewStub(channel);
    reader_ = stub_->GetContainerEvents(&ctx_, v1::GetEventsRequest{});
    thread_ = std::thread([this] {
      v1::ContainerEventResponse ev;
      while (reader_->Read(&ev)) {
        std::lock_guard lk(mu_);
        events_.push_back(ev);
      }
      std::lock_guard lk(mu_);
      finished_ = true;
      status_ = reader_->Finish();
    });
  }
  ~EventsReader() { stop(); }
  // Cancels; returns how the stream ended.
  grpc::Status stop() {
    ctx_.TryCancel();
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  std::vector<v1::ContainerEventResponse> events() const {
    std::lock_guard lk(mu_);
    return events_;
  }
  bool finished() const {
    std::lock_guard lk(mu_);
    return finished_;
  }
  bool has(const std::string& id, v1::ContainerEventType type) const {
    std::lock_guard lk(mu_);
    for (const auto& e : events_)
      if (e.container_id() == id && e.container_event_type() == type) return true;
    return false;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<v1::RuntimeService::Stub> stub_;
  std::unique_ptr<grpc::ClientReader<v1::ContainerEventResponse>> reader_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<v1::ContainerEventResponse> events_;
  bool finished_ = false;
  grpc::Status status_;
};

class CriEndpointTest : public CriTestBedTest {
 protected:
  void SetUp() override {
    CriTestBedTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    char tmpl[] = "/tmp/kpleg-cri-endpoint-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = "unix://" + dir_ + "/kplegd-cri.sock";
    std::vector<std::string> args{"--cri-listen", socket_};
    for (auto& a : extra_args()) args.push_back(a);
    auto d = start_kplegd(endpoint_, "ebpf", args);
    ASSERT_TRUE(d.ok()) << d.error().message;
    kplegd_ = std::move(*d);
  }
  virtual std::vector<std::string> extra_args() const { return {}; }
  void TearDown() override {
    if (kplegd_) EXPECT_EQ(kplegd_->stop(), 0) << "kplegd did not shut down cleanly";
    CriTestBedTest::TearDown();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // kpleg-load through kplegd's endpoint (not the test bed's socket).
  Result<LaunchedPod> launch_through(const std::string& name, const std::string& command) {
    auto r = run_process({KPLEG_LOAD_BIN, "--runtime-endpoint", socket_, "run", "--pods", "1",
                          "--containers", "1", "--namespace", namespace_, "--name-prefix", name,
                          "--command", command},
                         60s);
    if (!r) return r.error();
    if (r->exit_code != 0) return Error{r->exit_code, "kpleg-load run: " + r->err};
    auto j = nlohmann::json::parse(lines_of(r->out).at(0));
    return LaunchedPod{j["pod_uid"], j["pod_name"], j["sandbox_id"],
                       {j["containers"][0]["container_id"].get<std::string>()}};
  }
  Status through(const std::vector<std::string>& op) {
    std::vector<std::string> argv{KPLEG_LOAD_BIN, "--runtime-endpoint", socket_};
    argv.insert(argv.end(), op.begin(), op.end());
    auto r = run_process(argv, 60s);
    if (!r) return r.error();
    if (r->exit_code != 0) return Error{r->exit_code, "kpleg-load: " + r->err};
    return {};
  }

  std::string dir_, socket_;
  std::unique_ptr<KplegdProcess> kplegd_;
};

// A message's top-level fields as (number, bytes), sorted: the runtime lists its images in no
// fixed order (containerd 2.x walks a map), so two ListImages answers are the same list when
// their fields are the same multiset.
std::vector<std::pair<int, std::string>> sorted_fields(const std::string& body) {
  google::protobuf::UnknownFieldSet set;
  if (!set.ParseFromString(body)) return {{-1, body}};
  std::vector<std::pair<int, std::string>> out;
  for (int i = 0; i < set.field_count(); ++i) {
    const auto& f = set.field(i);
    std::string value;
    if (f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED)
      value = f.length_delimited();
    else if (f.type() == google::protobuf::UnknownField::TYPE_VARINT)
      value = std::to_string(f.varint());
    else
      value = "type " + std::to_string(f.type());
    out.emplace_back(f.number(), std::move(value));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(CriEndpointTest, EveryCallComesBackAsTheRuntimeAnswersIt) {
  struct Case {
    std::string method;
    std::string request;
  };
  v1::ContainerStatusRequest missing;
  missing.set_container_id("0123456789abcdef-not-a-container");
  v1::VersionRequest version;
  version.set_version("v1");
  const std::vector<Case> cases = {
      {"/runtime.v1.RuntimeService/Version", version.SerializeAsString()},
      {"/runtime.v1.RuntimeService/ContainerStatus", missing.SerializeAsString()},
      // Not in kpleg's copy of the CRI: forwarded by name all the same (containerd 1.6 answers
      // UNIMPLEMENTED, 2.x its cgroup driver).
      {"/runtime.v1.RuntimeService/RuntimeConfig", ""},
      {"/runtime.v1.ImageService/ListImages", ""},
      {"/runtime.v1.ImageService/ImageFsInfo", ""},
      {"/runtime.v1.RuntimeService/NoSuchMethodAnywhere", ""},
      {"/kpleg.test.Nothing/AtAll", ""},
  };
  for (const auto& c : cases) {
    auto direct = raw_call(endpoint_, c.method, c.request);
    auto via = raw_call(socket_, c.method, c.request);
    EXPECT_EQ(via.code, direct.code) << c.method << ": " << via.message << " vs " << direct.message;
    EXPECT_EQ(via.message, direct.message) << c.method;
    if (c.method.find("ImageFsInfo") != std::string::npos)  // carries usage that changes
      EXPECT_FALSE(via.body.empty()) << c.method;
    else if (c.method.find("ListImages") != std::string::npos)  // in no fixed order
      EXPECT_EQ(sorted_fields(via.body), sorted_fields(direct.body)) << c.method;
    else
      EXPECT_EQ(via.body, direct.body) << c.method;
  }
  // And it is the runtime that answers, not kplegd: the same name as from its own socket.
  auto v = raw_call(socket_, "/runtime.v1.RuntimeService/Version", version.SerializeAsString());
  auto d = raw_call(endpoint_, "/runtime.v1.RuntimeService/Version", version.SerializeAsString());
  v1::VersionResponse vr, dr;
  ASSERT_TRUE(vr.ParseFromString(v.body));
  ASSERT_TRUE(dr.ParseFromString(d.body));
  EXPECT_FALSE(dr.runtime_name().empty());
  EXPECT_EQ(vr.runtime_name(), dr.runtime_name());
  EXPECT_EQ(vr.runtime_version(), dr.runtime_version());
}

// The runtime dies (SIGKILL) and comes back: the kubelet's calls through the endpoint fail
// while it is gone, as they would against its socket, and are forwarded again once it is back,
// without a restart of kplegd.
TEST_F(CriEndpointTest, ForwardsAgainAfterTheRuntimeIsKilledAndRestarted) {
  KPLEG_REQUIRE_OR_SKIP(TestBed::instance().endpoint_is_test_bed(),
                        "the runtime at " + endpoint_ + " is not the test bed's; cannot restart it");
  v1::VersionRequest version;
  version.set_version("v1");
  const std::string method = "/runtime.v1.RuntimeService/Version";
  ASSERT_EQ(raw_call(socket_, method, version.SerializeAsString()).code, grpc::StatusCode::OK);
  auto pid = TestBed::instance().containerd_pid();
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  ASSERT_TRUE(kplegd_->wait_for_log("connection lost", 10s)) << kplegd_->log();
  auto down = raw_call(socket_, method, version.SerializeAsString());
  EXPECT_EQ(down.code, grpc::StatusCode::UNAVAILABLE) << down.message;

  auto up = TestBed::instance().up();
  ASSERT_TRUE(up.ok()) << up.error().message;
  ASSERT_TRUE(kplegd_->wait_for_log("reconnected", 30s)) << kplegd_->log();
  // As a kubelet does, once a second: each call may fail while the endpoint's own connection
  // to the runtime is still being made again.
  grpc::StatusCode last = grpc::StatusCode::UNKNOWN;
  std::string message;
  const bool forwarded = eventually(
      [&] {
        auto r = raw_call(socket_, method, version.SerializeAsString());
        last = r.code;
        message = r.message;
        return r.code == grpc::StatusCode::OK;
      },
      30s, 1s);
  EXPECT_TRUE(forwarded) << "the last call through the endpoint: " << int(last) << " " << message;
}

TEST_F(CriEndpointTest, WorkloadsAndCrictlWorkThroughIt) {
  auto pod = launch_through("through", "sleep 1000000");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  // kplegd sees the pod it forwarded, from the kernel.
  EXPECT_TRUE(wait_types(*kplegd_, pod->container_ids[0], kStarted));
  if (system("command -v crictl >/dev/null 2>&1") == 0) {
    auto r = run_process({"crictl", "--runtime-endpoint", socket_, "--timeout", "10s", "inspect",
                          "-o", "json", pod->container_ids[0]},
                         30s);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto j = nlohmann::json::parse(r->out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->out;
    EXPECT_EQ(j["status"]["state"], "CONTAINER_RUNNING");
    auto pods = run_process({"crictl", "--runtime-endpoint", socket_, "pods", "-q", "--namespace",
                             namespace_},
                            30s);
    ASSERT_TRUE(pods.ok());
    EXPECT_EQ(lines_of(pods->out), std::vector<std::string>{pod->sandbox_id});
  } else if (privileged_required()) {
    ADD_FAILURE() << "crictl is not on PATH (scripts/crictl.sh builds it)";
  }
  ASSERT_TRUE(through({"stop-container", "--grace-period", "0", pod->container_ids[0]}));
  EXPECT_TRUE(wait_types(*kplegd_, pod->container_ids[0], kDied));
  ASSERT_TRUE(through({"remove-pod", pod->sandbox_id}));
  EXPECT_TRUE(wait_types(*kplegd_, pod->container_ids[0], kRemoved));
}

// What a kubelet's Evented PLEG requires of each event (pkg/kubelet/pleg/evented.go): a sandbox
// status with metadata and the pod uid, created_at in ns increasing per pod, the pod's complete
// container list (up to 1.36), STOPPED for a death (the 1.37 hint), DELETED for a removal.
TEST_F(CriEndpointTest, ContainerEventsComeFromKplegToEverySubscriber) {
  EventsReader a(socket_), b(socket_);
  auto pod = launch_through("events", "sh -c 'sleep 1; exit 3'");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string sandbox = pod->sandbox_id, container = pod->container_ids[0];
  for (auto* r : {&a, &b}) {
    EXPECT_TRUE(eventually([&] { return r->has(container, v1::CONTAINER_STOPPED_EVENT); }, 20s));
  }
  ASSERT_TRUE(through({"remove-pod", sandbox}));
  for (auto* r : {&a, &b}) {
    EXPECT_TRUE(eventually([&] {
      return r->has(sandbox, v1::CONTAINER_DELETED_EVENT) &&
             r->has(container, v1::CONTAINER_DELETED_EVENT);
    }, 20s));
  }
  ASSERT_FALSE(HasFailure());
  // Both subscribers saw the same events; the streams are still open.
  auto ea = a.events(), eb = b.events();
  EXPECT_FALSE(a.finished());
  EXPECT_FALSE(b.finished());
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i)
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ea[i], eb[i])) << i;

  int64_t last_created = 0;
  std::map<std::string, std::vector<v1::ContainerEventType>> types;
  for (const auto& e : ea) {
    if (e.pod_sandbox_status().metadata().uid() != pod->uid) continue;  // another test's pod
    types[e.container_id()].push_back(e.container_event_type());
    ASSERT_TRUE(e.has_pod_sandbox_status());
    EXPECT_EQ(e.pod_sandbox_status().metadata().name(), pod->name);
    EXPECT_EQ(e.pod_sandbox_status().metadata().namespace_(), namespace_);
    EXPECT_EQ(e.pod_sandbox_status().id(), sandbox);
    EXPECT_GT(e.created_at(), last_created) << "created_at must increase per pod";
    EXPECT_GT(e.created_at(), int64_t(1'600'000'000) * 1'000'000'000) << "nanoseconds";
    last_created = e.created_at();
    if (e.container_id() == container && e.container_event_type() == v1::CONTAINER_STOPPED_EVENT) {
      ASSERT_EQ(e.containers_statuses_size(), 1);
      EXPECT_EQ(e.containers_statuses(0).id(), container);
      EXPECT_EQ(e.containers_statuses(0).state(), v1::CONTAINER_EXITED);
      EXPECT_EQ(e.containers_statuses(0).exit_code(), 3);
    }
    if (e.container_id() == container && e.container_event_type() == v1::CONTAINER_STARTED_EVENT) {
      ASSERT_EQ(e.containers_statuses_size(), 1);
      EXPECT_EQ(e.containers_statuses(0).state(), v1::CONTAINER_RUNNING);
    }
    if (e.container_id() == sandbox && e.container_event_type() == v1::CONTAINER_DELETED_EVENT) {
      EXPECT_EQ(e.pod_sandbox_status().state(), v1::SANDBOX_NOTREADY);
      EXPECT_EQ(e.containers_statuses_size(), 0) << "the pod's containers are gone";
    }
  }
  using T = std::vector<v1::ContainerEventType>;
  EXPECT_EQ(types[container],
            (T{v1::CONTAINER_STARTED_EVENT, v1::CONTAINER_STOPPED_EVENT, v1::CONTAINER_DELETED_EVENT}));
  EXPECT_EQ(types[sandbox],
            (T{v1::CONTAINER_STARTED_EVENT, v1::CONTAINER_STOPPED_EVENT, v1::CONTAINER_DELETED_EVENT}));
  // Ended only by the subscriber.
  EXPECT_EQ(a.stop().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(b.stop().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(CriEndpointTest, AnEventStreamOnAQuietNodeStaysOpenWithItsHeadersSent) {
  auto channel = grpc::CreateChannel(socket_, grpc::InsecureChannelCredentials());
  auto stub = v1::RuntimeService::NewStub(channel);
  grpc::ClientContext ctx;
  auto reader = stub->GetContainerEvents(&ctx, v1::GetEventsRequest{});
  // Headers come at once: a client waiting for them before any event does not hang.
  auto waited = std::async(std::launch::async, [&] { reader->WaitForInitialMetadata(); });
  EXPECT_EQ(waited.wait_for(5s), std::future_status::ready);
  ctx.TryCancel();
  waited.wait();
  v1::ContainerEventResponse ev;
  while (reader->Read(&ev)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// --cri-events hints: the same events, as cues for a kubelet 1.37 (which takes only STOPPED and
// the pod uid from them), without the pod statuses and their CRI calls.
class CriEndpointHintsTest : public CriEndpointTest {
 protected:
  std::vector<std::string> extra_args() const override { return {"--cri-events", "hints"}; }
};

TEST_F(CriEndpointHintsTest, HintsCarryThePodAndNoStatuses) {
  EventsReader reader(socket_);
  auto pod = launch_through("hinted", "sh -c 'sleep 1; exit 2'");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  const std::string container = pod->container_ids[0];
  ASSERT_TRUE(eventually([&] { return reader.has(container, v1::CONTAINER_STOPPED_EVENT); }, 20s));
  for (const auto& e : reader.events()) {
    if (e.pod_sandbox_status().metadata().uid() != pod->uid) continue;
    EXPECT_EQ(e.pod_sandbox_status().metadata().name(), pod->name);
    EXPECT_EQ(e.pod_sandbox_status().metadata().namespace_(), namespace_);
    EXPECT_EQ(e.containers_statuses_size(), 0);
    EXPECT_GT(e.created_at(), int64_t(1'600'000'000) * 1'000'000'000);
  }
  EXPECT_EQ(reader.stop().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace kpleg::testing
