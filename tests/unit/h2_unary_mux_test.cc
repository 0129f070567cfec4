// The status looks' non-blocking HTTP/2 client (cri/h2_unary_mux.h) on kplegd's event loop
// (pleg/event_loop.h), against a real grpc++ server on a unix socket: many calls in flight at
// once over one connection, a hung call that ends at its deadline while the others on the same
// connection are answered, a server restarted between calls, and no server at all.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <string>

#include "cri/api.grpc.pb.h"
#include "cri/h2_unary_mux.h"
#include "pleg/event_loop.h"
#include "support/eventually.h"

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;
namespace v1 = ::runtime::v1;
using Clock = std::chrono::steady_clock;
constexpr std::string_view kStatus = "/runtime.v1.RuntimeService/ContainerStatus";

// ContainerStatus answers with the id asked for; "slow" waits until the client goes away.
class StatusService final : public v1::RuntimeService::Service {
 public:
  grpc::Status ContainerStatus(grpc::ServerContext* ctx, const v1::ContainerStatusRequest* req,
                               v1::ContainerStatusResponse* resp) override {
    ++calls;
    if (req->container_id() == "slow") {
      (void)testing::eventually([&] { return ctx->IsCancelled(); }, 5s, 5ms);
      cancelled_seen = ctx->IsCancelled();
      return grpc::Status::CANCELLED;
    }
    resp->mutable_status()->set_id(req->container_id());
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
  std::atomic<bool> cancelled_seen{false};
};

struct Server {
  std::string path;
  StatusService service;
  std::unique_ptr<grpc::Server> server;
  explicit Server(std::string p) : path(std::move(p)) { start(); }
  void start() {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Server() { stop(); }
  void stop() {
    if (!server) return;
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    server.reset();
    unlink(path.c_str());
  }
};

std::string socket_path() {
  static int n = 0;
  return "/tmp/kpleg-h2mux-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

std::string request(const std::string& id) {
  v1::ContainerStatusRequest r;
  r.set_container_id(id);
  return r.SerializeAsString();
}

// The loop and a mux on it; calls are started on the loop, answers collected by id.
struct Fixture {
  pleg::EventLoop loop;
  std::unique_ptr<H2UnaryMux> mux;
  std::mutex mu;
  std::map<std::string, Result<std::string>> answers;
  explicit Fixture(const std::string& path) {
    loop.start("test-loop");
    loop.call([&] { mux = std::make_unique<H2UnaryMux>(path, loop); });
  }
  ~Fixture() {
    loop.call([&] { mux.reset(); });
    loop.stop();
  }
  void start(const std::string& id, Clock::duration timeout = 2s) {
    loop.post([this, id, timeout] {
      mux->call(kStatus, request(id), Clock::now() + timeout, [this, id](Result<std::string> r) {
        std::lock_guard lk(mu);
        answers.emplace(id, std::move(r));
      });
    });
  }
  size_t answered() {
    std::lock_guard lk(mu);
    return answers.size();
  }
  Result<std::string> answer(const std::string& id) {
    std::lock_guard lk(mu);
    auto it = answers.find(id);
    if (it == answers.end()) return Error{-1, "no answer"};
    return it->second;
  }
};

TEST(H2UnaryMuxTest, ManyCallsInFlightAtOnceOverOneConnection) {
  Server server(socket_path());
  Fixture f(server.path);
  for (int i = 0; i < 200; ++i) f.start("c" + std::to_string(i));
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 200; }, 5s));
  for (int i = 0; i < 200; ++i) {
    auto r = f.answer("c" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.error().message;
    v1::ContainerStatusResponse resp;
    ASSERT_TRUE(resp.ParseFromString(*r));
    EXPECT_EQ(resp.status().id(), "c" + std::to_string(i));
  }
  EXPECT_EQ(f.loop.call([&] { return f.mux->connects(); }), 1u);
}

TEST(H2UnaryMuxTest, AHungCallEndsAtItsDeadlineAndHoldsNoOtherCall) {
  Server server(socket_path());
  Fixture f(server.path);
  const auto start = Clock::now();
  f.start("slow", 500ms);
  for (int i = 0; i < 20; ++i) f.start("c" + std::to_string(i));
  // The others are answered while the hung one waits.
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 20; }, 2s));
  EXPECT_FALSE(f.answer("slow").ok());
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 21; }, 3s));
  EXPECT_GE(Clock::now() - start, 500ms);
  auto slow = f.answer("slow");
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.error().code, int(grpc::StatusCode::DEADLINE_EXCEEDED)) << slow.error().message;
  // The server is told (RST_STREAM), and the connection goes on.
  EXPECT_TRUE(testing::eventually([&] { return server.service.cancelled_seen.load(); }, 3s));
  f.start("after");
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 22; }, 2s));
  EXPECT_TRUE(f.answer("after").ok());
  EXPECT_EQ(f.loop.call([&] { return f.mux->connects(); }), 1u);
}

TEST(H2UnaryMuxTest, AServerRestartedBetweenCallsIsReconnectedTo) {
  Server server(socket_path());
  Fixture f(server.path);
  f.start("a");
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 1; }, 2s));
  server.stop();
  server.start();
  f.start("b");
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 2; }, 3s));
  auto b = f.answer("b");
  EXPECT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(f.loop.call([&] { return f.mux->connects(); }), 2u);
}

TEST(H2UnaryMuxTest, NoServerIsUnavailableAndNamesTheSocket) {
  const std::string path = socket_path();
  Fixture f(path);
  f.start("a");
  ASSERT_TRUE(testing::eventually([&] { return f.answered() == 1; }, 2s));
  auto a = f.answer("a");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(a.error().message.find(path), std::string::npos) << a.error().message;
}

}  // namespace
}  // namespace kpleg::cri
