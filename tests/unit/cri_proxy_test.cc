// CriProxy over real gRPC and real unix sockets, in front of an upstream runtime served from the
// in-memory fake: forwarding is transparent, exactly the stalled pod's calls are held, held calls
// never hold up other pods' calls, and every held call ends at the caller's deadline, on
// cancellation, when the stall is cleared, or at shutdown. (The same proxy in front of the real
// containerd is exercised by tests/e2e/slow_runtime_test.cc.)
#include "kpleg-cri-proxy/cri_proxy.h"

#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "cri/api.grpc.pb.h"
#include "support/eventually.h"
#include "support/fake_cri_client.h"

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Stub = v1::RuntimeService::Stub;

grpc::Status to_grpc(const Error& e) {
  return grpc::Status(static_cast<grpc::StatusCode>(e.code), e.message);
}

// The fake runtime behind a real gRPC server: what the proxy's upstream looks like on the wire.
// GetContainerEvents is left unimplemented, like containerd 1.6.
class FakeRuntimeServer final : public v1::RuntimeService::Service {
 public:
  explicit FakeRuntimeServer(const std::string& target) {
    grpc::ServerBuilder b;
    b.AddListeningPort(target, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeRuntimeServer() override { server_->Shutdown(); }
  bool ok() const { return server_ != nullptr; }

  FakeCriClient fake;
  std::atomic<int> last_unknown_fields{-1};

  grpc::Status Version(grpc::ServerContext*, const v1::VersionRequest*,
                       v1::VersionResponse* resp) override {
    return reply(fake.version(), resp);
  }
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusResponse* resp) override {
    auto r = fake.status();
    if (!r) return to_grpc(r.error());
    *resp->mutable_status() = *r;
    return grpc::Status::OK;
  }
  grpc::Status RunPodSandbox(grpc::ServerContext*, const v1::RunPodSandboxRequest* req,
                             v1::RunPodSandboxResponse* resp) override {
    auto r = fake.run_pod_sandbox(req->config());
    if (!r) return to_grpc(r.error());
    resp->set_pod_sandbox_id(*r);
    return grpc::Status::OK;
  }
  grpc::Status StopPodSandbox(grpc::ServerContext*, const v1::StopPodSandboxRequest* req,
                              v1::StopPodSandboxResponse*) override {
    return done(fake.stop_pod_sandbox(req->pod_sandbox_id()));
  }
  grpc::Status RemovePodSandbox(grpc::ServerContext*, const v1::RemovePodSandboxRequest* req,
                                v1::RemovePodSandboxResponse*) override {
    return done(fake.remove_pod_sandbox(req->pod_sandbox_id()));
  }
  grpc::Status PodSandboxStatus(grpc::ServerContext*, const v1::PodSandboxStatusRequest* req,
                                v1::PodSandboxStatusResponse* resp) override {
    auto r = fake.pod_sandbox_status(req->pod_sandbox_id());
    if (!r) return to_grpc(r.error());
    *resp->mutable_status() = *r;
    return grpc::Status::OK;
  }
  grpc::Status ListPodSandbox(grpc::ServerContext*, const v1::ListPodSandboxRequest* req,
                              v1::ListPodSandboxResponse* resp) override {
    auto r = fake.list_pod_sandboxes(req->filter());
    if (!r) return to_grpc(r.error());
    for (auto& s : *r) *resp->add_items() = s;
    return grpc::Status::OK;
  }
  grpc::Status CreateContainer(grpc::ServerContext*, const v1::CreateContainerRequest* req,
                               v1::CreateContainerResponse* resp) override {
    auto r = fake.create_container(req->pod_sandbox_id(), req->config(), req->sandbox_config());
    if (!r) return to_grpc(r.error());
    resp->set_container_id(*r);
    return grpc::Status::OK;
  }
  grpc::Status StartContainer(grpc::ServerContext*, const v1::StartContainerRequest* req,
                              v1::StartContainerResponse*) override {
    return done(fake.start_container(req->container_id()));
  }
  grpc::Status StopContainer(grpc::ServerContext*, const v1::StopContainerRequest* req,
                             v1::StopContainerResponse*) override {
    return done(fake.stop_container(req->container_id(), req->timeout()));
  }
  grpc::Status RemoveContainer(grpc::ServerContext*, const v1::RemoveContainerRequest* req,
                               v1::RemoveContainerResponse*) override {
    return done(fake.remove_container(req->container_id()));
  }
  grpc::Status ListContainers(grpc::ServerContext*, const v1::ListContainersRequest* req,
                              v1::ListContainersResponse* resp) override {
    auto r = fake.list_containers(req->filter());
    if (!r) return to_grpc(r.error());
    for (auto& c : *r) *resp->add_containers() = c;
    return grpc::Status::OK;
  }
  grpc::Status ContainerStatus(grpc::ServerContext*, const v1::ContainerStatusRequest* req,
                               v1::ContainerStatusResponse* resp) override {
    last_unknown_fields = req->GetReflection()->GetUnknownFields(*req).field_count();
    auto r = fake.container_status(req->container_id());
    if (!r) return to_grpc(r.error());
    *resp->mutable_status() = *r;
    (*resp->mutable_info())["pid"] = "4242";
    return grpc::Status::OK;
  }

 private:
  template <typename T, typename R>
  static grpc::Status reply(const Result<T>& r, R* resp) {
    if (!r) return to_grpc(r.error());
    *resp = *r;
    return grpc::Status::OK;
  }
  static grpc::Status done(const kpleg::Status& s) {
    return s ? grpc::Status::OK : to_grpc(s.error());
  }
  std::unique_ptr<grpc::Server> server_;
};

struct Pod {
  std::string uid, sandbox_id;
  std::vector<std::string> container_ids;
};

class CriProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kpleg-proxy-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    upstream_ = std::make_unique<FakeRuntimeServer>("unix://" + dir_ + "/runtime.sock");
    ASSERT_TRUE(upstream_->ok());
    // Pods made directly upstream: the proxy has to find out whose ids these are.
    a_ = make_pod("a", 2, /*uid_label=*/true);
    b_ = make_pod("b", 2, /*uid_label=*/false);  // only the sandbox tells the uid
    CriProxyOptions o;
    o.listen_endpoint = "unix://" + dir_ + "/proxy.sock";
    o.upstream_endpoint = "unix://" + dir_ + "/runtime.sock";
    auto p = CriProxy::start(o);
    ASSERT_TRUE(p.ok()) << p.error().message;
    proxy_ = std::move(*p);
    stub_ = v1::RuntimeService::NewStub(
        grpc::CreateChannel(proxy_->endpoint(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    proxy_.reset();
    upstream_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  Pod make_pod(const std::string& name, int containers, bool uid_label) {
    Pod p;
    p.uid = name + "-0000-uid";
    v1::PodSandboxConfig pc;
    pc.mutable_metadata()->set_name(name);
    pc.mutable_metadata()->set_namespace_("ns");
    pc.mutable_metadata()->set_uid(p.uid);
    (*pc.mutable_labels())["io.kubernetes.pod.uid"] = p.uid;
    p.sandbox_id = *upstream_->fake.run_pod_sandbox(pc);
    for (int i = 0; i < containers; ++i) {
      v1::ContainerConfig cc;
      cc.mutable_metadata()->set_name("c" + std::to_string(i));
      if (uid_label) (*cc.mutable_labels())["io.kubernetes.pod.uid"] = p.uid;
      auto id = *upstream_->fake.create_container(p.sandbox_id, cc, pc);
      EXPECT_TRUE(upstream_->fake.start_container(id).ok());
      p.container_ids.push_back(id);
    }
    return p;
  }

  std::unique_ptr<grpc::ClientContext> ctx(std::chrono::milliseconds timeout) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + timeout);
    return c;
  }

  grpc::Status container_status(const std::string& id, std::chrono::milliseconds timeout,
                                v1::ContainerStatusResponse* out = nullptr) {
    v1::ContainerStatusRequest req;
    req.set_container_id(id);
    v1::ContainerStatusResponse resp;
    auto st = stub_->ContainerStatus(ctx(timeout).get(), req, &resp);
    if (out) *out = resp;
    return st;
  }

  bool wait_held(uint64_t n) {
    return testing::eventually([&] { return proxy_->stats().stalled_in_flight == n; });
  }

  std::string dir_;
  std::unique_ptr<FakeRuntimeServer> upstream_;
  std::unique_ptr<CriProxy> proxy_;
  std::unique_ptr<Stub> stub_;
  Pod a_, b_;
};

TEST_F(CriProxyTest, ForwardsRequestsAndAnswersUnchanged) {
  v1::VersionRequest vreq;
  vreq.set_version("v1");
  v1::VersionResponse vresp;
  ASSERT_TRUE(stub_->Version(ctx(2s).get(), vreq, &vresp).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(vresp, *upstream_->fake.version()));

  v1::ContainerStatusResponse cs;
  ASSERT_TRUE(container_status(a_.container_ids[0], 2s, &cs).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      cs.status(), *upstream_->fake.container_status(a_.container_ids[0])));
  EXPECT_EQ(cs.info().at("pid"), "4242");

  // Fields this proto subset does not know reach the runtime as they were sent.
  v1::ContainerStatusRequest with_unknown;
  with_unknown.set_container_id(a_.container_ids[0]);
  with_unknown.GetReflection()->MutableUnknownFields(&with_unknown)->AddVarint(99, 7);
  ASSERT_TRUE(stub_->ContainerStatus(ctx(2s).get(), with_unknown, &cs).ok());
  EXPECT_EQ(upstream_->last_unknown_fields.load(), 1);

  // Errors come back with the runtime's own code and message.
  auto missing = container_status(std::string(64, 'f'), 2s);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(),
            to_grpc(upstream_->fake.container_status(std::string(64, 'f')).error()).error_message());
  grpc::ClientContext events_ctx;
  events_ctx.set_deadline(std::chrono::system_clock::now() + 2s);
  auto events = stub_->GetContainerEvents(&events_ctx, v1::GetEventsRequest{});
  v1::ContainerEventResponse ev;
  EXPECT_FALSE(events->Read(&ev));
  EXPECT_EQ(events->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // The workload calls, through the proxy, change the runtime.
  v1::RunPodSandboxRequest run;
  run.mutable_config()->mutable_metadata()->set_uid("c-uid");
  v1::RunPodSandboxResponse ran;
  ASSERT_TRUE(stub_->RunPodSandbox(ctx(2s).get(), run, &ran).ok());
  v1::CreateContainerRequest create;
  create.set_pod_sandbox_id(ran.pod_sandbox_id());
  create.mutable_config()->mutable_metadata()->set_name("app");
  v1::CreateContainerResponse created;
  ASSERT_TRUE(stub_->CreateContainer(ctx(2s).get(), create, &created).ok());
  v1::StartContainerRequest start;
  start.set_container_id(created.container_id());
  v1::StartContainerResponse started;
  ASSERT_TRUE(stub_->StartContainer(ctx(2s).get(), start, &started).ok());
  EXPECT_EQ(upstream_->fake.container_status(created.container_id())->state(), v1::CONTAINER_RUNNING);
  v1::StopContainerRequest stop;
  stop.set_container_id(created.container_id());
  v1::StopContainerResponse stopped;
  ASSERT_TRUE(stub_->StopContainer(ctx(2s).get(), stop, &stopped).ok());
  v1::RemoveContainerRequest rm;
  rm.set_container_id(created.container_id());
  v1::RemoveContainerResponse removed;
  ASSERT_TRUE(stub_->RemoveContainer(ctx(2s).get(), rm, &removed).ok());
  v1::StopPodSandboxRequest stop_pod;
  stop_pod.set_pod_sandbox_id(ran.pod_sandbox_id());
  v1::StopPodSandboxResponse stopped_pod;
  ASSERT_TRUE(stub_->StopPodSandbox(ctx(2s).get(), stop_pod, &stopped_pod).ok());
  v1::RemovePodSandboxRequest rm_pod;
  rm_pod.set_pod_sandbox_id(ran.pod_sandbox_id());
  v1::RemovePodSandboxResponse removed_pod;
  ASSERT_TRUE(stub_->RemovePodSandbox(ctx(2s).get(), rm_pod, &removed_pod).ok());
  EXPECT_FALSE(upstream_->fake.pod_sandbox_status(ran.pod_sandbox_id()).ok());
  EXPECT_EQ(proxy_->stats().stalled, 0u);
  EXPECT_EQ(proxy_->stats().lookups, 0u) << "no stall, no lookups";
}

TEST_F(CriProxyTest, HangsEveryCallThatConcernsTheStalledPodUntilTheCallersDeadline) {
  // The proxy connects upstream on first use: let a forwarded call do that, so that the id
  // lookups below (which share each caller's short deadline) are not also paying for it.
  v1::VersionRequest vreq;
  v1::VersionResponse vresp;
  ASSERT_TRUE(stub_->Version(ctx(5s).get(), vreq, &vresp).ok());
  proxy_->set_stalled_pod({a_.uid, StallMode::kHang, {}});
  const auto deadline = 400ms;
  auto expect_held = [&](const char* what, const grpc::Status& st, Clock::time_point t0) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << what << ": " << st.error_message();
    EXPECT_GE(Clock::now() - t0, deadline) << what;
  };
  auto t0 = Clock::now();
  expect_held("ContainerStatus", container_status(a_.container_ids[1], deadline), t0);
  {
    v1::PodSandboxStatusRequest r;
    r.set_pod_sandbox_id(a_.sandbox_id);
    v1::PodSandboxStatusResponse resp;
    t0 = Clock::now();
    expect_held("PodSandboxStatus", stub_->PodSandboxStatus(ctx(deadline).get(), r, &resp), t0);
  }
  {
    v1::ListContainersRequest r;
    r.mutable_filter()->set_pod_sandbox_id(a_.sandbox_id);
    v1::ListContainersResponse resp;
    t0 = Clock::now();
    expect_held("ListContainers by sandbox", stub_->ListContainers(ctx(deadline).get(), r, &resp), t0);
    v1::ListContainersRequest by_label;
    (*by_label.mutable_filter()->mutable_label_selector())["io.kubernetes.pod.uid"] = a_.uid;
    t0 = Clock::now();
    expect_held("ListContainers by pod uid",
                stub_->ListContainers(ctx(deadline).get(), by_label, &resp), t0);
  }
  {
    v1::ListPodSandboxRequest r;
    r.mutable_filter()->set_id(a_.sandbox_id);
    v1::ListPodSandboxResponse resp;
    t0 = Clock::now();
    expect_held("ListPodSandbox by id", stub_->ListPodSandbox(ctx(deadline).get(), r, &resp), t0);
  }
  {
    v1::StopContainerRequest r;
    r.set_container_id(a_.container_ids[0]);
    v1::StopContainerResponse resp;
    t0 = Clock::now();
    expect_held("StopContainer", stub_->StopContainer(ctx(deadline).get(), r, &resp), t0);
    v1::RemoveContainerRequest rm;
    rm.set_container_id(a_.container_ids[0]);
    v1::RemoveContainerResponse rm_resp;
    t0 = Clock::now();
    expect_held("RemoveContainer", stub_->RemoveContainer(ctx(deadline).get(), rm, &rm_resp), t0);
    v1::StopPodSandboxRequest sp;
    sp.set_pod_sandbox_id(a_.sandbox_id);
    v1::StopPodSandboxResponse sp_resp;
    t0 = Clock::now();
    expect_held("StopPodSandbox", stub_->StopPodSandbox(ctx(deadline).get(), sp, &sp_resp), t0);
    v1::RemovePodSandboxRequest rp;
    rp.set_pod_sandbox_id(a_.sandbox_id);
    v1::RemovePodSandboxResponse rp_resp;
    t0 = Clock::now();
    expect_held("RemovePodSandbox", stub_->RemovePodSandbox(ctx(deadline).get(), rp, &rp_resp), t0);
  }
  // None of the held calls reached the runtime: the pod is untouched.
  EXPECT_EQ(upstream_->fake.container_status(a_.container_ids[0])->state(), v1::CONTAINER_RUNNING);
  EXPECT_TRUE(upstream_->fake.pod_sandbox_status(a_.sandbox_id).ok());

  // The other pod (whose containers carry no uid label: found through their sandbox), the whole
  // node's lists and the runtime's own calls are answered.
  for (const auto& id : b_.container_ids) EXPECT_TRUE(container_status(id, 2s).ok()) << id;
  v1::ListContainersRequest all;
  v1::ListContainersResponse listed;
  ASSERT_TRUE(stub_->ListContainers(ctx(2s).get(), all, &listed).ok());
  EXPECT_EQ(listed.containers_size(), 4);
  v1::ListPodSandboxResponse sandboxes;
  EXPECT_TRUE(stub_->ListPodSandbox(ctx(2s).get(), v1::ListPodSandboxRequest{}, &sandboxes).ok());
  v1::StatusResponse status;
  EXPECT_TRUE(stub_->Status(ctx(2s).get(), v1::StatusRequest{}, &status).ok());

  EXPECT_TRUE(wait_held(0)) << "every held call's thread is released";
  auto s = proxy_->stats();
  EXPECT_EQ(s.stalled, 9u) << "a call whose id lookup ran out of time is forwarded, not held";
  EXPECT_EQ(s.gave_up, 9u);
  EXPECT_GT(s.lookups, 0u) << "the proxy never saw these ids before: it asked the runtime";
}

TEST_F(CriProxyTest, DelayedCallsAreAnsweredAfterTheDelay) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kDelay, 400ms});
  auto t0 = Clock::now();
  v1::ContainerStatusResponse resp;
  ASSERT_TRUE(container_status(a_.container_ids[0], 5s, &resp).ok());
  EXPECT_GE(Clock::now() - t0, 400ms);
  EXPECT_EQ(resp.status().state(), v1::CONTAINER_RUNNING);
  // A caller with less patience than the delay gets its deadline.
  EXPECT_EQ(container_status(a_.container_ids[0], 100ms).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
}

// A late answer: the runtime is asked at once, and its answer (the state when it was asked)
// reaches the caller after the delay, when the runtime may have moved on.
TEST_F(CriProxyTest, LateAnswersTellTheStateWhenTheCallCameAfterTheDelay) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kLateAnswer, 400ms});
  const auto& id = a_.container_ids[0];
  auto t0 = Clock::now();
  v1::ContainerStatusResponse resp;
  auto call = std::async(std::launch::async, [&] { return container_status(id, 5s, &resp); });
  ASSERT_TRUE(wait_held(1)) << "the answer is held";
  const auto forwarded = proxy_->stats().forwarded;
  ASSERT_TRUE(upstream_->fake.stop_container(id, 0).ok());
  ASSERT_TRUE(call.get().ok());
  EXPECT_GE(Clock::now() - t0, 400ms);
  EXPECT_EQ(resp.status().state(), v1::CONTAINER_RUNNING) << "the state when it was asked";
  EXPECT_EQ(proxy_->stats().forwarded, forwarded) << "asked once, before the hold";
  // The next call is answered with the new state, late too; an impatient caller gets its
  // deadline.
  ASSERT_TRUE(container_status(id, 5s, &resp).ok());
  EXPECT_EQ(resp.status().state(), v1::CONTAINER_EXITED);
  EXPECT_EQ(container_status(id, 100ms).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Other pods' answers are not held.
  t0 = Clock::now();
  ASSERT_TRUE(container_status(b_.container_ids[0], 5s).ok());
  EXPECT_LT(Clock::now() - t0, 400ms);
}

TEST_F(CriProxyTest, HeldCallsDoNotHoldUpOtherPods) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kHang, {}});
  constexpr int kHeld = 40;  // far more than gRPC's default pollers
  std::vector<std::future<grpc::Status>> held;
  for (int i = 0; i < kHeld; ++i) {
    held.push_back(std::async(std::launch::async, [&, i] {
      return container_status(a_.container_ids[i % 2], 20s);
    }));
  }
  ASSERT_TRUE(wait_held(kHeld)) << proxy_->stats().stalled_in_flight;
  for (int i = 0; i < 20; ++i) {
    auto t0 = Clock::now();
    ASSERT_TRUE(container_status(b_.container_ids[i % 2], 2s).ok());
    EXPECT_LT(Clock::now() - t0, 1s);
  }
  EXPECT_EQ(proxy_->stats().stalled_in_flight, uint64_t(kHeld)) << "still held meanwhile";

  // Clearing the stall forwards the held calls at once: the call was slow, not failed.
  auto t0 = Clock::now();
  proxy_->clear_stall();
  for (auto& f : held) EXPECT_TRUE(f.get().ok());
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(proxy_->stats().gave_up, 0u);
}

TEST_F(CriProxyTest, ACancelledCallIsReleased) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kHang, {}});
  grpc::ClientContext c;
  // Only cancellation ends it; the far deadline only keeps a failed wait_held from hanging.
  c.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::ContainerStatusRequest req;
  req.set_container_id(a_.container_ids[0]);
  auto f = std::async(std::launch::async, [&] {
    v1::ContainerStatusResponse resp;
    return stub_->ContainerStatus(&c, req, &resp);
  });
  ASSERT_TRUE(wait_held(1));
  c.TryCancel();
  EXPECT_EQ(f.get().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(wait_held(0));
  EXPECT_TRUE(testing::eventually([&] { return proxy_->stats().gave_up == 1; }));
}

TEST_F(CriProxyTest, MovingTheStallReleasesTheOldPodAndHoldsTheNew) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kHang, {}});
  auto held_a = std::async(std::launch::async, [&] { return container_status(a_.container_ids[0], 20s); });
  ASSERT_TRUE(wait_held(1));
  proxy_->set_stalled_pod({b_.uid, StallMode::kHang, {}});
  EXPECT_TRUE(held_a.get().ok());
  EXPECT_EQ(container_status(b_.container_ids[0], 1s).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(container_status(a_.container_ids[0], 2s).ok());
  ASSERT_TRUE(proxy_->stall().has_value());
  EXPECT_EQ(proxy_->stall()->pod_uid, b_.uid);
}

TEST_F(CriProxyTest, ShutdownReleasesCallsWithoutADeadline) {
  proxy_->set_stalled_pod({a_.uid, StallMode::kHang, {}});
  grpc::ClientContext c;
  v1::ContainerStatusRequest req;
  req.set_container_id(a_.container_ids[0]);
  auto f = std::async(std::launch::async, [&] {
    v1::ContainerStatusResponse resp;
    return stub_->ContainerStatus(&c, req, &resp);
  });
  ASSERT_TRUE(wait_held(1));
  auto t0 = Clock::now();
  proxy_->shutdown();
  EXPECT_FALSE(f.get().ok());
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/proxy.sock")) << "the socket is removed";
}

TEST_F(CriProxyTest, TheSocketIsOwnerOnly) {
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/proxy.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(CriProxyTest, StartRejectsBadEndpointsAndALiveSocket) {
  CriProxyOptions o;
  o.upstream_endpoint = "unix://" + dir_ + "/runtime.sock";
  o.listen_endpoint = "tcp://127.0.0.1:1234";
  EXPECT_FALSE(CriProxy::start(o).ok());
  o.listen_endpoint = "relative.sock";
  EXPECT_FALSE(CriProxy::start(o).ok());
  o.listen_endpoint = o.upstream_endpoint;
  auto same = CriProxy::start(o);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.error().message.find("same socket"), std::string::npos) << same.error().message;
  o.listen_endpoint = proxy_->endpoint();
  auto busy = CriProxy::start(o);
  ASSERT_FALSE(busy.ok());
  EXPECT_NE(busy.error().message.find("already listens"), std::string::npos) << busy.error().message;
  o.listen_endpoint = "unix://" + dir_ + "/missing-dir/p.sock";
  auto no_dir = CriProxy::start(o);
  ASSERT_FALSE(no_dir.ok());
  EXPECT_NE(no_dir.error().message.find("missing-dir"), std::string::npos);
}

TEST_F(CriProxyTest, AStaleSocketFileIsReplaced) {
  const std::string path = dir_ + "/stale.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(fd);  // bound, never listened, closed: what a crashed server leaves behind
  CriProxyOptions o;
  o.listen_endpoint = path;
  o.upstream_endpoint = "unix://" + dir_ + "/runtime.sock";
  auto p = CriProxy::start(o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto v = (*p)->upstream_version(2s);
  ASSERT_TRUE(v.ok()) << v.error().message;
}

TEST_F(CriProxyTest, UnreachableUpstreamIsForwardedAsUnavailable) {
  upstream_.reset();
  auto st = container_status(b_.container_ids[0], 2s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  auto v = proxy_->upstream_version(300ms);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("runtime.sock"), std::string::npos) << v.error().message;
}

}  // namespace
}  // namespace kpleg::cri
