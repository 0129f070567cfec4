// criforward's Forwarder over real gRPC and unix sockets, in front of a small upstream that
// records what reaches it: each hook does what it says, and a held call ends at its caller's
// deadline or cancellation without reaching the runtime. (Its three users have their own tests:
// cri_proxy_test, and the CRI endpoint's and the prefix proxy's against containerd.)
#include "criforward/forwarder.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include <sys/stat.h>
#include <sys/wait.h>

#include "cri/api.grpc.pb.h"
#include "criendpoint/call_watch.h"
#include "criforward/listen_socket.h"
#include "criforward/timer.h"

namespace kpleg::criforward {
namespace {

using namespace std::chrono_literals;
namespace v1 = ::runtime::v1;
using Clock = std::chrono::steady_clock;

class Upstream final : public v1::RuntimeService::Service {
 public:
  explicit Upstream(const std::string& target) {
    grpc::ServerBuilder b;
    b.AddListeningPort(target, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~Upstream() override { server_->Shutdown(); }

  std::atomic<int> calls{0};
  std::string last_parent, last_metadata;

  grpc::Status Version(grpc::ServerContext* ctx, const v1::VersionRequest*,
                       v1::VersionResponse* resp) override {
    ++calls;
    auto it = ctx->client_metadata().find("x-trace");
    if (it != ctx->client_metadata().end())
      last_metadata = std::string(it->second.data(), it->second.size());
    resp->set_runtime_name("upstream");
    return grpc::Status::OK;
  }
  grpc::Status RunPodSandbox(grpc::ServerContext*, const v1::RunPodSandboxRequest* req,
                             v1::RunPodSandboxResponse* resp) override {
    ++calls;
    last_parent = req->config().linux().cgroup_parent();
    resp->set_pod_sandbox_id("sb-1");
    return grpc::Status::OK;
  }
  // Takes its time: a call in flight when the forwarder stops.
  std::atomic<bool> stop_sandbox_arrived{false};
  grpc::Status StopPodSandbox(grpc::ServerContext*, const v1::StopPodSandboxRequest*,
                              v1::StopPodSandboxResponse*) override {
    ++calls;
    stop_sandbox_arrived = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return grpc::Status::OK;
  }
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusResponse*) override {
    ++calls;
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "upstream says no");
  }
  grpc::Status GetContainerEvents(grpc::ServerContext*, const v1::GetEventsRequest*,
                                  grpc::ServerWriter<v1::ContainerEventResponse>* w) override {
    ++calls;
    for (const char* id : {"a1", "b1", "a2", "b2"}) {
      v1::ContainerEventResponse ev;
      ev.set_container_id(id);
      w->Write(ev);
    }
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
};

// Holds Version calls until told; rewrites RunPodSandbox; drops every event of container "b*";
// replaces Status's answer.
class TestHooks final : public Hooks {
 public:
  std::mutex mu;
  std::vector<Gate> held;
  std::atomic<int> done{0};
  grpc::StatusCode last_code = grpc::StatusCode::OK;

  std::unique_ptr<CallHooks> call_hooks(const grpc::GenericCallbackServerContext& ctx) override {
    return std::make_unique<Call>(this, ctx.method());
  }

  class Call final : public CallHooks {
   public:
    Call(TestHooks* h, std::string method) : h_(h), method_(std::move(method)) {}
    void before_forward(grpc::ByteBuffer& request, Gate gate) override {
      if (method_.ends_with("/Version")) {
        std::lock_guard lk(h_->mu);
        h_->held.push_back(gate);
        return;
      }
      if (method_.ends_with("/RunPodSandbox")) {
        v1::RunPodSandboxRequest r;
        ASSERT_TRUE(r.ParseFromString(flatten(request)));
        r.mutable_config()->mutable_linux()->set_cgroup_parent("/prefix" +
                                                               r.config().linux().cgroup_parent());
        request = to_buffer(r.SerializeAsString());
      }
      gate.open();
    }
    void before_answer(Gate gate) override {
      if (method_.ends_with("/Status")) {
        gate.answer(grpc::Status(grpc::StatusCode::ABORTED, "replaced"));
        return;
      }
      gate.open();
    }
    void on_response(grpc::ByteBuffer& m, std::vector<grpc::ByteBuffer>& out) override {
      v1::ContainerEventResponse ev;
      if (method_.ends_with("/GetContainerEvents") && ev.ParseFromString(flatten(m)) &&
          ev.container_id().starts_with("b")) {
        return;
      }
      out.push_back(std::move(m));
    }
    void on_done(const grpc::Status& st) override {
      std::lock_guard lk(h_->mu);
      h_->last_code = st.error_code();
      ++h_->done;
    }

   private:
    TestHooks* h_;
    std::string method_;
  };

  size_t held_count() {
    std::lock_guard lk(mu);
    return held.size();
  }
};

class ForwarderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kpleg-criforward-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    upstream_ = std::make_unique<Upstream>("unix://" + dir_ + "/runtime.sock");
    ForwarderOptions o;
    o.who = "test forwarder";
    o.listen_target = "unix://" + dir_ + "/fwd.sock";
    o.upstream_target = "unix://" + dir_ + "/runtime.sock";
    auto f = Forwarder::start(o, &hooks_);
    ASSERT_TRUE(f.ok()) << f.error().message;
    fwd_ = std::move(*f);
    stub_ = v1::RuntimeService::NewStub(
        grpc::CreateChannel(fwd_->endpoint(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    fwd_.reset();
    upstream_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<grpc::ClientContext> ctx(std::chrono::milliseconds timeout) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + timeout);
    return c;
  }
  bool wait_held(size_t n) {
    auto until = Clock::now() + 5s;
    while (hooks_.held_count() != n) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(2ms);
    }
    return true;
  }

  std::string dir_;
  std::unique_ptr<Upstream> upstream_;
  TestHooks hooks_;
  std::unique_ptr<Forwarder> fwd_;
  std::unique_ptr<v1::RuntimeService::Stub> stub_;
};

TEST_F(ForwarderTest, ARewrittenRequestReachesTheRuntime) {
  v1::RunPodSandboxRequest req;
  req.mutable_config()->mutable_linux()->set_cgroup_parent("/kubepods/pod1");
  v1::RunPodSandboxResponse resp;
  ASSERT_TRUE(stub_->RunPodSandbox(ctx(2s).get(), req, &resp).ok());
  EXPECT_EQ(upstream_->last_parent, "/prefix/kubepods/pod1");
  EXPECT_EQ(resp.pod_sandbox_id(), "sb-1");
}

TEST_F(ForwarderTest, AHeldCallEndsAtItsDeadlineWithoutReachingTheRuntime) {
  const auto t0 = Clock::now();
  v1::VersionResponse resp;
  auto st = stub_->Version(ctx(300ms).get(), v1::VersionRequest{}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(upstream_->calls.load(), 0);
  // The forwarder ended it too (on_done), and a late open is harmless.
  auto until = Clock::now() + 5s;
  while (hooks_.done.load() != 1 && Clock::now() < until) std::this_thread::sleep_for(2ms);
  EXPECT_EQ(hooks_.done.load(), 1);
  EXPECT_EQ(hooks_.last_code, grpc::StatusCode::DEADLINE_EXCEEDED);
  for (auto& g : hooks_.held) g.open();
  EXPECT_EQ(upstream_->calls.load(), 0);
}

TEST_F(ForwarderTest, AHeldCallGoesOnWhenOpenedWithItsMetadata) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + 10s);
  c.AddMetadata("x-trace", "t-42");
  v1::VersionResponse resp;
  auto f = std::async(std::launch::async,
                      [&] { return stub_->Version(&c, v1::VersionRequest{}, &resp); });
  ASSERT_TRUE(wait_held(1));
  EXPECT_EQ(upstream_->calls.load(), 0);
  // From another thread, as a timer would.
  Timer timer;
  timer.at(Clock::now() + 50ms, [&] { hooks_.held[0].open(); });
  ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(resp.runtime_name(), "upstream");
  EXPECT_EQ(upstream_->last_metadata, "t-42");
}

TEST_F(ForwarderTest, AHeldCallAnsweredNeverReachesTheRuntime) {
  v1::VersionResponse resp;
  auto f = std::async(std::launch::async,
                      [&] { return stub_->Version(ctx(10s).get(), v1::VersionRequest{}, &resp); });
  ASSERT_TRUE(wait_held(1));
  hooks_.held[0].answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not now"));
  auto st = f.get();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(st.error_message(), "not now");
  EXPECT_EQ(upstream_->calls.load(), 0);
}

TEST_F(ForwarderTest, ACancelledHeldCallEndsAtOnce) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::VersionResponse resp;
  auto f = std::async(std::launch::async,
                      [&] { return stub_->Version(&c, v1::VersionRequest{}, &resp); });
  ASSERT_TRUE(wait_held(1));
  c.TryCancel();
  EXPECT_EQ(f.get().error_code(), grpc::StatusCode::CANCELLED);
  auto until = Clock::now() + 5s;
  while (hooks_.done.load() != 1 && Clock::now() < until) std::this_thread::sleep_for(2ms);
  EXPECT_EQ(hooks_.last_code, grpc::StatusCode::CANCELLED);
}

TEST_F(ForwarderTest, TheAnswerGateCanReplaceTheRuntimesAnswer) {
  v1::StatusResponse resp;
  auto st = stub_->Status(ctx(2s).get(), v1::StatusRequest{}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(st.error_message(), "replaced");
  EXPECT_EQ(upstream_->calls.load(), 1) << "it was asked";
}

TEST_F(ForwarderTest, TheResponseFilterDropsMessagesOfAStreamInOrder) {
  auto c = ctx(5s);
  auto reader = stub_->GetContainerEvents(c.get(), v1::GetEventsRequest{});
  std::vector<std::string> got;
  v1::ContainerEventResponse ev;
  while (reader->Read(&ev)) got.push_back(ev.container_id());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, (std::vector<std::string>{"a1", "a2"}));
}

TEST_F(ForwarderTest, StopLetsACallInFlightFinishInsteadOfCancellingIt) {
  // A forwarder whose grace is longer than the call: the runtime's answer reaches the caller.
  ForwarderOptions o;
  o.who = "graceful";
  o.listen_target = "unix://" + dir_ + "/graceful.sock";
  o.upstream_target = "unix://" + dir_ + "/runtime.sock";
  o.shutdown_grace = 30s;
  auto f = Forwarder::start(o, nullptr);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto stub = v1::RuntimeService::NewStub(
      grpc::CreateChannel(o.listen_target, grpc::InsecureChannelCredentials()));
  auto call = std::async(std::launch::async, [&] {
    auto c = ctx(10s);
    v1::StopPodSandboxRequest req;
    v1::StopPodSandboxResponse resp;
    return stub->StopPodSandbox(c.get(), req, &resp);
  });
  const auto until = Clock::now() + 5s;
  while (!upstream_->stop_sandbox_arrived && Clock::now() < until) std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(upstream_->stop_sandbox_arrived);
  const auto t0 = Clock::now();
  (*f)->stop();
  const auto stopped_after = Clock::now() - t0;
  auto st = call.get();
  EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  EXPECT_LT(stopped_after, 10s);  // it waited for the call, not for the whole grace
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/graceful.sock"));
}

TEST_F(ForwarderTest, TheSocketIsOwnerOnlyWhateverTheUmask) {
  const mode_t old = umask(0);
  auto s = ListenSocket::bind(dir_ + "/open.sock", 0600, "test");
  umask(old);
  ASSERT_TRUE(s.ok()) << s.error().message;
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/open.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

TEST_F(ForwarderTest, StopLeavesASocketThatIsNoLongerItsOwn) {
  const std::string path = dir_ + "/fwd.sock";
  // A successor took the path (removed the file and bound its own) before this one stopped.
  ASSERT_EQ(unlink(path.c_str()), 0);
  auto successor = ListenSocket::bind(path, 0600, "successor");
  ASSERT_TRUE(successor.ok()) << successor.error().message;
  fwd_->stop();
  EXPECT_TRUE(std::filesystem::exists(path));
}

TEST_F(ForwarderTest, ALiveSocketIsNotTakenOver) {
  ForwarderOptions o;
  o.who = "second";
  o.listen_target = fwd_->endpoint();
  o.upstream_target = "unix://" + dir_ + "/runtime.sock";
  auto f = Forwarder::start(o, nullptr);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, EADDRINUSE);
}

TEST_F(ForwarderTest, TakesTheSocketSystemdPasses) {
  auto sock = ListenSocket::bind(dir_ + "/activated.sock", 0600, "systemd");
  ASSERT_TRUE(sock.ok()) << sock.error().message;
  // In a child: fd 3 of this process is gRPC's already. Exit status 0 when fd 3 was taken and
  // the variables were unset; 10 + step otherwise.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (dup2(sock->fd(), 3) != 3) _exit(10);
    setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
    setenv("LISTEN_FDS", "1", 1);
    auto activated = ListenSocket::from_systemd("test");
    if (!activated.ok() || !activated->has_value()) _exit(11);
    if ((*activated)->fd() != 3 || !(*activated)->activated()) _exit(12);
    if (getenv("LISTEN_FDS") != nullptr || getenv("LISTEN_PID") != nullptr) _exit(13);
    // Another process's variables are not this one's.
    setenv("LISTEN_PID", "1", 1);
    setenv("LISTEN_FDS", "1", 1);
    auto other = ListenSocket::from_systemd("test");
    if (!other.ok() || other->has_value()) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ForwarderTest, ServesASocketItWasGivenAndLeavesItsFile) {
  auto sock = ListenSocket::bind(dir_ + "/given.sock", 0600, "given");
  ASSERT_TRUE(sock.ok()) << sock.error().message;
  ForwarderOptions o;
  o.who = "given";
  o.listen_target = "unix://" + dir_ + "/given.sock";
  o.listen_fd = sock->fd();
  o.upstream_target = "unix://" + dir_ + "/runtime.sock";
  auto f = Forwarder::start(o, nullptr);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto stub = v1::RuntimeService::NewStub(
      grpc::CreateChannel(o.listen_target, grpc::InsecureChannelCredentials()));
  auto c = ctx(5s);
  v1::VersionResponse resp;
  EXPECT_TRUE(stub->Version(c.get(), v1::VersionRequest(), &resp).ok());
  EXPECT_EQ(resp.runtime_name(), "upstream");
  (*f)->stop();
  // Its owner's file (systemd's): the forwarder never removes it.
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/given.sock"));
}

// criendpoint's CallWatch on a forwarder: at most max_calls in flight, each in the watchdog.
class LimitedHooks final : public Hooks {
 public:
  explicit LimitedHooks(size_t max) : watch(std::make_shared<cri::InflightCalls>(), max) {}
  grpc::ServerGenericBidiReactor* serve_locally(grpc::GenericCallbackServerContext&) override {
    return watch.admit("test");
  }
  std::unique_ptr<CallHooks> call_hooks(const grpc::GenericCallbackServerContext& ctx) override {
    return watch.hooks(ctx.method());
  }
  criendpoint::CallWatch watch;
};

TEST_F(ForwarderTest, CallsOverTheLimitAreRefusedAndTheOthersWatched) {
  LimitedHooks hooks(1);
  ForwarderOptions o;
  o.who = "limited";
  o.listen_target = "unix://" + dir_ + "/limited.sock";
  o.upstream_target = "unix://" + dir_ + "/runtime.sock";
  auto f = Forwarder::start(o, &hooks);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto stub = v1::RuntimeService::NewStub(
      grpc::CreateChannel(o.listen_target, grpc::InsecureChannelCredentials()));
  auto slow = std::async(std::launch::async, [&] {
    auto c = ctx(10s);
    v1::StopPodSandboxRequest req;
    req.set_pod_sandbox_id("sb-9");
    v1::StopPodSandboxResponse resp;
    return stub->StopPodSandbox(c.get(), req, &resp);
  });
  const auto until = Clock::now() + 5s;
  while (!upstream_->stop_sandbox_arrived && Clock::now() < until) std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(upstream_->stop_sandbox_arrived);
  auto stuck = hooks.watch.inflight().older_than(0ms);
  ASSERT_EQ(stuck.size(), 1u);
  EXPECT_EQ(stuck[0].method, "StopPodSandbox");
  EXPECT_EQ(stuck[0].subject.id, "sb-9");
  auto c = ctx(5s);
  v1::VersionResponse resp;
  auto st = stub->Version(c.get(), v1::VersionRequest(), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(slow.get().ok());
  EXPECT_EQ(hooks.watch.in_flight(), 0u);
  auto c2 = ctx(5s);
  EXPECT_TRUE(stub->Version(c2.get(), v1::VersionRequest(), &resp).ok());
  EXPECT_EQ(hooks.watch.refused(), 1u);
}

TEST(Timer, RunsInOrderAndCancelled) {
  Timer timer;
  std::mutex mu;
  std::vector<int> ran;
  std::promise<void> last;
  const auto now = Clock::now();
  timer.at(now + 60ms, [&] {
    std::lock_guard lk(mu);
    ran.push_back(3);
    last.set_value();
  });
  auto id = timer.at(now + 20ms, [&] {
    std::lock_guard lk(mu);
    ran.push_back(99);
  });
  timer.at(now + 10ms, [&] {
    std::lock_guard lk(mu);
    ran.push_back(1);
  });
  timer.at(now + 30ms, [&] {
    std::lock_guard lk(mu);
    ran.push_back(2);
  });
  timer.cancel(id);
  ASSERT_EQ(last.get_future().wait_for(5s), std::future_status::ready);
  std::lock_guard lk(mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
}

}  // namespace
}  // namespace kpleg::criforward
