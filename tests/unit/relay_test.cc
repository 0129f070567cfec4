// kpleg-cri-relay's catch-up after kplegd came back as a new instance: what changed in the gap
// (the new instance's List against what the relay knew from the old one's events) becomes
// events, and nothing else does.
#include <gtest/gtest.h>

#include "relay/kplegd_follower.h"

namespace kpleg::relay {
namespace {

namespace v1 = ::kpleg::v1;

void add_container(v1::Pod* pod, const std::string& id, const std::string& name, bool sandbox,
                   v1::ContainerState state) {
  auto* c = pod->add_containers();
  c->set_id(id);
  c->set_name(name);
  c->set_sandbox(sandbox);
  c->mutable_status()->set_state(state);
}

pleg::PodLifecycleEvent started(const std::string& uid, const std::string& id, bool sandbox) {
  pleg::PodLifecycleEvent ev;
  ev.type = pleg::EventType::kContainerStarted;
  ev.pod_uid = uid;
  ev.pod_name = "web";
  ev.pod_namespace = "default";
  ev.container_id = id;
  ev.container_name = sandbox ? "" : "app";
  ev.sandbox = sandbox;
  return ev;
}

TEST(RelayCatchUp, ThePodsThatChangedInTheGapAndOnlyThoseBecomeEvents) {
  KplegdFollower::Known known;
  // Before the gap: pod A (sandbox + app running), pod B (sandbox + app running), pod C.
  for (const char* uid : {"A", "B", "C"}) {
    KplegdFollower::apply(known, started(uid, std::string(uid) + "-sb", true));
    KplegdFollower::apply(known, started(uid, std::string(uid) + "-app", false));
  }
  // After it: A unchanged; B's app died and was replaced by a new one, running; C gone; D new.
  v1::ListResponse list;
  auto* a = list.add_pods();
  a->set_uid("A");
  add_container(a, "A-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(a, "A-app", "app", false, v1::CONTAINER_STATE_RUNNING);
  auto* b = list.add_pods();
  b->set_uid("B");
  add_container(b, "B-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(b, "B-app", "app", false, v1::CONTAINER_STATE_EXITED);
  add_container(b, "B-app2", "app", false, v1::CONTAINER_STATE_RUNNING);
  auto* d = list.add_pods();
  d->set_uid("D");
  add_container(d, "D-sb", "", true, v1::CONTAINER_STATE_RUNNING);
  add_container(d, "D-init", "init", false, v1::CONTAINER_STATE_CREATED);

  auto events = KplegdFollower::catch_up(known, list);
  std::vector<std::string> got;
  for (const auto& ev : events) {
    got.push_back(std::string(pleg::to_string(ev.type)) + " " + ev.container_id);
    EXPECT_TRUE(ev.correction);
    EXPECT_EQ(ev.source, pleg::EventSource::kReconcile);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"ContainerDied B-app", "ContainerStarted B-app2",
                                           "ContainerStarted D-sb", "ContainerRemoved C-app",
                                           "ContainerRemoved C-sb"}));
  // The List is what is known now: the same List again changes nothing.
  EXPECT_TRUE(KplegdFollower::catch_up(known, list).empty());
}

TEST(RelayCatchUp, ARemovedContainerIsForgottenAndItsPodWithTheLast) {
  KplegdFollower::Known known;
  KplegdFollower::apply(known, started("A", "A-sb", true));
  auto removed = started("A", "A-sb", true);
  removed.type = pleg::EventType::kContainerRemoved;
  KplegdFollower::apply(known, removed);
  EXPECT_TRUE(known.empty());
}

}  // namespace
}  // namespace kpleg::relay

// The relay over real gRPC and unix sockets, between a client (the kubelet's part), a small
// runtime and a small kplegd: calls go on and the event stream stays open while kplegd is gone,
// and the container that died meanwhile reaches the stream once a new kplegd is there.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <filesystem>

#include "cri/api.grpc.pb.h"
#include "kpleg/v1/pleg.grpc.pb.h"
#include "relay/relay.h"
#include "support/eventually.h"

namespace kpleg::relay {
namespace {

namespace cri1 = ::runtime::v1;
using namespace std::chrono_literals;

constexpr const char* kUidLabel = "io.kubernetes.pod.uid";

class Runtime final : public cri1::RuntimeService::Service {
 public:
  std::atomic<bool> exited{false};
  grpc::Status Version(grpc::ServerContext*, const cri1::VersionRequest*,
                       cri1::VersionResponse* r) override {
    r->set_runtime_name("fake");
    return grpc::Status::OK;
  }
  grpc::Status ListPodSandbox(grpc::ServerContext*, const cri1::ListPodSandboxRequest*,
                              cri1::ListPodSandboxResponse* r) override {
    auto* s = r->add_items();
    s->set_id("sb1");
    s->mutable_metadata()->set_uid("u1");
    (*s->mutable_labels())[kUidLabel] = "u1";
    return grpc::Status::OK;
  }
  grpc::Status PodSandboxStatus(grpc::ServerContext*, const cri1::PodSandboxStatusRequest*,
                                cri1::PodSandboxStatusResponse* r) override {
    r->mutable_status()->set_id("sb1");
    r->mutable_status()->mutable_metadata()->set_uid("u1");
    r->mutable_status()->set_state(cri1::SANDBOX_READY);
    return grpc::Status::OK;
  }
  grpc::Status ListContainers(grpc::ServerContext*, const cri1::ListContainersRequest*,
                              cri1::ListContainersResponse* r) override {
    auto* c = r->add_containers();
    c->set_id("c1");
    c->set_pod_sandbox_id("sb1");
    (*c->mutable_labels())[kUidLabel] = "u1";
    return grpc::Status::OK;
  }
  grpc::Status ContainerStatus(grpc::ServerContext*, const cri1::ContainerStatusRequest*,
                               cri1::ContainerStatusResponse* r) override {
    r->mutable_status()->set_id("c1");
    r->mutable_status()->set_state(exited ? cri1::CONTAINER_EXITED : cri1::CONTAINER_RUNNING);
    return grpc::Status::OK;
  }
};

// A kplegd's API: List says what `state` the container has, at seq 7; Watch sends nothing until
// cancelled, unless it comes with another instance's position: then a RESYNC, as kplegd's does
// (a Watch the follower started against the first kplegd may reach the second one).
class Kplegd final : public v1::PodLifecycle::Service {
 public:
  Kplegd(std::string instance, v1::ContainerState state, const std::string& target)
      : instance_(std::move(instance)), state_(state) {
    grpc::ServerBuilder b;
    b.AddListeningPort(target, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~Kplegd() override { stop(); }
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::atomic<int> lists{0};
  grpc::Status List(grpc::ServerContext*, const v1::ListRequest*, v1::ListResponse* r) override {
    r->set_instance_id(instance_);
    r->set_seq(7);
    auto* p = r->add_pods();
    p->set_uid("u1");
    p->set_name("web");
    p->set_namespace_("default");
    auto* c = p->add_containers();
    c->set_id("c1");
    c->set_name("app");
    c->mutable_status()->set_state(state_);
    ++lists;
    return grpc::Status::OK;
  }
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::Event>* writer) override {
    if (req->instance_id() != instance_) {
      v1::Event resync;
      resync.set_type(v1::EVENT_TYPE_RESYNC);
      resync.set_seq(7);
      resync.set_reason("another instance's position: List again");
      writer->Write(resync);
      return grpc::Status::OK;
    }
    std::unique_lock lk(mu_);
    while (!stopping_ && !ctx->IsCancelled()) cv_.wait_for(lk, 20ms);
    return grpc::Status::OK;
  }

 private:
  std::string instance_;
  v1::ContainerState state_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::unique_ptr<grpc::Server> server_;
};

TEST(Relay, CallsAndTheEventStreamOutliveKplegdAndTheGapIsCaughtUp) {
  char tmpl[] = "/tmp/kpleg-relay-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Runtime runtime;
  grpc::ServerBuilder rb;
  rb.AddListeningPort("unix://" + dir + "/runtime.sock", grpc::InsecureServerCredentials());
  rb.RegisterService(&runtime);
  auto runtime_server = rb.BuildAndStart();
  auto first =
      std::make_unique<Kplegd>("first", v1::CONTAINER_STATE_RUNNING, "unix://" + dir + "/api.sock");

  RelayOptions o;
  o.listen_endpoint = dir + "/cri.sock";
  o.runtime_endpoint = "unix://" + dir + "/runtime.sock";
  o.kplegd_socket = dir + "/api.sock";
  o.stop_timeout = 5s;
  auto relay = Relay::start(o);
  ASSERT_TRUE(relay.ok()) << relay.error().message;
  ASSERT_TRUE(testing::eventually([&] { return first->lists > 0; }));

  auto stub = cri1::RuntimeService::NewStub(
      grpc::CreateChannel("unix://" + dir + "/cri.sock", grpc::InsecureChannelCredentials()));
  grpc::ClientContext events_ctx;
  // A catch-up that never comes fails the test instead of hanging it.
  events_ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto events = stub->GetContainerEvents(&events_ctx, cri1::GetEventsRequest());
  events->WaitForInitialMetadata();

  // kplegd gone: the call goes on.
  first->stop();
  first.reset();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    cri1::VersionResponse r;
    auto st = stub->Version(&ctx, cri1::VersionRequest(), &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(r.runtime_name(), "fake");
  }
  // The container died meanwhile; a new kplegd says so.
  runtime.exited = true;
  Kplegd second("second", v1::CONTAINER_STATE_EXITED, "unix://" + dir + "/api.sock");
  cri1::ContainerEventResponse ev;
  ASSERT_TRUE(events->Read(&ev));  // the stream stayed open and carries the catch-up
  EXPECT_EQ(ev.container_id(), "c1");
  EXPECT_EQ(ev.container_event_type(), cri1::CONTAINER_STOPPED_EVENT);
  EXPECT_EQ(ev.pod_sandbox_status().metadata().uid(), "u1");
  ASSERT_EQ(ev.containers_statuses_size(), 1);
  EXPECT_EQ(ev.containers_statuses(0).state(), cri1::CONTAINER_EXITED);
  EXPECT_EQ((*relay)->stats().catch_up_events, 1u);

  // A graceful stop ends the stream with OK.
  (*relay)->stop();
  EXPECT_FALSE(events->Read(&ev));
  EXPECT_TRUE(events->Finish().ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/cri.sock"));
  second.stop();
  runtime_server->Shutdown(std::chrono::system_clock::now());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kpleg::relay
