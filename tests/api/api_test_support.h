// Shared pieces of the consumer API tests: the real ApiServer over a real unix socket in a
// private directory, fed from a real EventBus, with simple in-memory providers standing in
// for the daemon (what they return is test data; everything between them and the client is
// the production path).
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/api_server.h"
#include "api/providers.h"
#include "bus/event_bus.h"
#include "common/result.h"
#include "kpleg/v1/pleg.grpc.pb.h"
#include "support/eventually.h"

namespace kpleg::apitest {

using namespace std::chrono_literals;

using kpleg::testing::eventually;

// Resident set size of this process, from /proc/self/status (kB).
long rss_kb();

// A private directory removed (with its contents) at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class TestState : public api::StateProvider {
 public:
  explicit TestState(bus::EventBus& bus) : bus_(bus) {}
  api::StateSnapshot snapshot() override;
  void set_pods(std::vector<pleg::PodRecord> pods);
  int snapshots() const { return snapshots_.load(); }

 private:
  bus::EventBus& bus_;
  std::mutex mu_;
  std::vector<pleg::PodRecord> pods_;
  std::atomic<int> snapshots_{0};
};

class TestHealth : public api::HealthProvider {
 public:
  api::HealthReport health() override;
  void set_health_listener(std::function<void()> fn) override;
  // Changes the report and announces it to the listener, as the daemon does.
  void set(bool healthy, std::vector<std::string> reasons = {});
  // Changes the report without announcing it: only a timed re-read can see it.
  void set_quietly(api::HealthReport report);
  int reads() const { return reads_.load(); }

 private:
  std::mutex mu_;
  api::HealthReport report_{true, {}};
  std::function<void()> listener_;
  std::atomic<int> reads_{0};
};

class TestStats : public api::StatsProvider {
 public:
  api::DaemonStats stats() override;
};

// A ContainerStarted event with realistic field sizes (uid 36, container id 64 characters).
pleg::PodLifecycleEvent sample_event(int i, const std::string& ns = "default");

// Bus + providers + ApiServer on <tmp>/kpleg.sock.
struct ServerHarness {
  explicit ServerHarness(api::ApiServerOptions opts = {}, bus::EventBusOptions bus_opts = {});
  ~ServerHarness();
  Status start();
  std::shared_ptr<grpc::Channel> channel() const;
  std::unique_ptr<v1::PodLifecycle::Stub> stub() const;

  TempDir dir;
  std::string socket_path;
  bus::EventBus bus;
  TestState state{bus};
  TestHealth health;
  TestStats stats;
  api::ApiServerOptions options;
  std::unique_ptr<api::ApiServer> server;
};

// One Watch stream read on its own thread.
class WatchClient {
 public:
  struct Options {
    bool read = true;         // false: never read until finish()
    bool keep_events = true;  // false: only count them and check their order (big runs)
  };
  // Starts the stream and returns once the server has subscribed (initial metadata).
  WatchClient(std::shared_ptr<grpc::Channel> channel, v1::WatchRequest req, Options opt);
  WatchClient(std::shared_ptr<grpc::Channel> channel, v1::WatchRequest req)
      : WatchClient(std::move(channel), std::move(req), Options{}) {}
  ~WatchClient();

  bool wait_for(size_t n, std::chrono::milliseconds timeout);
  std::vector<v1::Event> events();
  size_t count();
  // Reads whatever is left (for a stream started with read=false), then returns the status.
  grpc::Status finish(std::chrono::milliseconds timeout);
  bool finished();
  void cancel() { ctx_.TryCancel(); }
  bool subscribed() const { return subscribed_; }
  uint64_t last_seq();
  // Every event so far had seq = previous + 1.
  bool in_order();
  const std::string& instance_id() const { return instance_id_; }

 private:
  void read_loop();

  grpc::ClientContext ctx_;
  std::unique_ptr<v1::PodLifecycle::Stub> stub_;
  std::unique_ptr<grpc::ClientReader<v1::Event>> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  const Options opt_;
  std::vector<v1::Event> events_;
  size_t count_ = 0;
  uint64_t last_seq_ = 0;
  bool in_order_ = true;
  bool done_ = false;
  grpc::Status status_;
  bool subscribed_ = false;
  std::string instance_id_;
  std::thread thread_;
};

}  // namespace kpleg::apitest
