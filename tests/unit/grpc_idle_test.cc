// grpcidle::install() in a process of its own (it must run before gRPC starts, so it runs from a
// static initializer here): gRPC's timers still fire on time (a call's deadline, an alarm, a
// reconnect backoff), including a timer set while the timer threads sleep with nothing due, and
// an idle process's timer threads do not wake every second.
#include "grpcidle/grpc_idle.h"

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/async_generic_service.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "support/thread_wakeups.h"

namespace {

// As kplegd does: the client channels' backup poller is a timer too (every 5 s by default).
const std::string kInstallNote = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "60000", 1);
  return kpleg::grpcidle::install();
}();

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Answers Check after `delay`.
class SlowHealth final : public Health::Service {
 public:
  explicit SlowHealth(std::chrono::milliseconds delay) : delay_(delay) {}
  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest*,
                     HealthCheckResponse* resp) override {
    std::this_thread::sleep_for(delay_);
    resp->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }

 private:
  std::chrono::milliseconds delay_;
};

std::string socket_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("grpc_idle_test." + std::to_string(getpid()) + "." + name + ".sock"))
      .string();
}

std::unique_ptr<grpc::Server> serve(const std::string& path, grpc::Service* service) {
  std::filesystem::remove(path);
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(service);
  return b.BuildAndStart();
}

long wakeups_of(const std::string& comm) {
  return kpleg::testing::threads_named(kpleg::testing::scheduled_in(), comm).scheduled_in;
}

bool has_thread(const std::string& comm) {
  return kpleg::testing::threads_named(kpleg::testing::scheduled_in(), comm).threads > 0;
}

TEST(GrpcIdle, IsInstalled) { EXPECT_EQ(kInstallNote, ""); }

TEST(GrpcIdle, ACallsDeadlineFiresOnTimeAfterAnIdleSpell) {
  SlowHealth slow(3s);
  const std::string path = socket_path("deadline");
  auto server = serve(path, &slow);
  ASSERT_TRUE(server);
  auto stub = Health::NewStub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    // Nothing is due meanwhile: the timer threads sleep without a deadline, and the call's
    // deadline timer must wake them.
    std::this_thread::sleep_for(1500ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 300ms);
    HealthCheckResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status st = stub->Check(&ctx, HealthCheckRequest{}, &resp);
    const auto took = Clock::now() - t0;
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_GE(took, 290ms);
    EXPECT_LT(took, 1000ms) << "the deadline fired "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                            << " ms after the call started";
  }
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(GrpcIdle, AnAlarmFiresOnTime) {
  grpc::CompletionQueue cq;
  for (auto delay : {200ms, 50ms, 700ms}) {
    grpc::Alarm alarm;
    const auto t0 = Clock::now();
    alarm.Set(&cq, std::chrono::system_clock::now() + delay, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    const auto took = Clock::now() - t0;
    EXPECT_TRUE(ok);
    EXPECT_GE(took, delay - 10ms);
    EXPECT_LT(took, delay + 400ms);
  }
  // A cancelled alarm ends at once, not ok.
  grpc::Alarm alarm;
  alarm.Set(&cq, std::chrono::system_clock::now() + 1h, reinterpret_cast<void*>(2));
  alarm.Cancel();
  void* tag = nullptr;
  bool ok = true;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_FALSE(ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(GrpcIdle, AChannelConnectsOnceItsServerAppears) {
  const std::string path = socket_path("late");
  std::filesystem::remove(path);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 300);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 300);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 300);
  auto channel = grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  EXPECT_FALSE(channel->WaitForConnected(std::chrono::system_clock::now() + 500ms));
  SlowHealth fast(0ms);
  auto server = serve(path, &fast);
  ASSERT_TRUE(server);
  const auto t0 = Clock::now();
  // The reconnect backoff (a timer) brings it up.
  EXPECT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + 5s));
  EXPECT_LT(Clock::now() - t0, 3s);
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(GrpcIdle, AnIdleProcessTimerThreadsDoNotWakeEverySecond) {
  SlowHealth fast(0ms);
  const std::string path = socket_path("idle");
  auto server = serve(path, &fast);
  ASSERT_TRUE(server);
  auto stub = Health::NewStub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  HealthCheckResponse resp;
  ASSERT_TRUE(stub->Check(&ctx, HealthCheckRequest{}, &resp).ok());
  // gRPC's own EventEngine, with its timer thread, is not created.
  EXPECT_FALSE(has_thread("timer_manager"));
  std::this_thread::sleep_for(1s);  // whatever the call left due
  const long before = wakeups_of("grpc_global_tim");
  std::this_thread::sleep_for(4s);
  const long woke = wakeups_of("grpc_global_tim") - before;
  std::printf("gRPC's timer threads woke %ld times in 4 s of idling\n", woke);
  // Without install(): at least once a second (4), up to once per shard (2 per core) a second.
  EXPECT_LE(woke, 1);
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
