// GrpcCriClient against real sockets: a runtime that never answers, no runtime at all, and the
// test bed's containerd killed and restarted under a live client.
#include <algorithm>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "cri/grpc_cri_client.h"
#include "cri/hung_runtime.h"
#include "support/eventually.h"
#include "cri/testbed.h"
#include "support/eventually.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using cri::CriMethod;
using cri::GrpcCriClient;
using cri::GrpcCriClientOptions;
using Clock = std::chrono::steady_clock;
using google::protobuf::util::MessageDifferencer;
namespace v1 = runtime::v1;

std::unique_ptr<GrpcCriClient> make_client(const std::string& endpoint, GrpcCriClientOptions o) {
  auto c = GrpcCriClient::create(endpoint, std::move(o));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(GrpcCriClientHungRuntime, CallFailsWithDeadlineExceededWithinItsDeadline) {
  HungRuntime runtime;
  ASSERT_TRUE(runtime.ok()) << runtime.error();
  GrpcCriClientOptions o;
  o.call_timeout = 300ms;
  auto client = make_client(runtime.endpoint(), o);
  ASSERT_NE(client, nullptr);

  for (int attempt = 0; attempt < 2; ++attempt) {  // a fresh channel, then an established one
    auto start = Clock::now();
    auto r = client->container_status(
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    auto elapsed = Clock::now() - start;
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, grpc::StatusCode::DEADLINE_EXCEEDED) << r.error().message;
    EXPECT_NE(r.error().message.find("ContainerStatus"), std::string::npos) << r.error().message;
    EXPECT_GE(elapsed, 300ms);
    EXPECT_LT(elapsed, 1500ms);
  }
  EXPECT_GE(runtime.connections_accepted(), 1);
  EXPECT_EQ(
      client->call_stats().count(CriMethod::kContainerStatus, grpc::StatusCode::DEADLINE_EXCEEDED),
      2u);
  EXPECT_EQ(client->calls_in_flight(), 0u);
}

// With one slot and three callers, the later callers wait behind a call that will only end at
// its deadline. Each must still fail at its own deadline, not at the sum of those ahead of it.
TEST(GrpcCriClientHungRuntime, CallsBeyondMaxInFlightStillHonourTheirDeadline) {
  HungRuntime runtime;
  ASSERT_TRUE(runtime.ok()) << runtime.error();
  GrpcCriClientOptions o;
  o.call_timeout = 1s;
  o.list_timeout = 1s;  // the calls are full lists
  o.max_in_flight = 1;
  // The hung runtime never completes a connection: only the deadlines may end these calls,
  // not a failed connection attempt (1 s by default).
  o.min_connect_timeout = 10s;
  auto client = make_client(runtime.endpoint(), o);
  ASSERT_NE(client, nullptr);

  constexpr int kCallers = 3;
  std::vector<Clock::duration> elapsed(kCallers);
  std::vector<int> codes(kCallers, -1);
  std::vector<std::thread> callers;
  std::atomic<size_t> peak_in_flight{0};
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      auto start = Clock::now();
      auto r = client->list_containers({});
      elapsed[i] = Clock::now() - start;
      codes[i] = r.ok() ? 0 : r.error().code;
    });
  }
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      peak_in_flight = std::max(peak_in_flight.load(), client->calls_in_flight());
      std::this_thread::sleep_for(5ms);
    }
  });
  for (auto& t : callers) t.join();
  done = true;
  sampler.join();

  for (int i = 0; i < kCallers; ++i) {
    EXPECT_EQ(codes[i], grpc::StatusCode::DEADLINE_EXCEEDED) << "caller " << i;
    // Without the deadline on the wait the second caller would take ~2 s, the third ~3 s.
    EXPECT_LT(elapsed[i], 1800ms) << "caller " << i;
  }
  EXPECT_EQ(peak_in_flight.load(), 1u);
  EXPECT_EQ(
      client->call_stats().count(CriMethod::kListContainers, grpc::StatusCode::DEADLINE_EXCEEDED),
      static_cast<uint64_t>(kCallers));
}

// A full list may take seconds on a big node: it has its own deadline; a filtered list and
// every other call keep the short one.
TEST(GrpcCriClientHungRuntime, FullListsHaveTheirOwnDeadline) {
  HungRuntime runtime;
  ASSERT_TRUE(runtime.ok()) << runtime.error();
  GrpcCriClientOptions o;
  o.call_timeout = 300ms;
  o.list_timeout = 1500ms;
  o.min_connect_timeout = 10s;
  auto client = make_client(runtime.endpoint(), o);
  ASSERT_NE(client, nullptr);

  auto timed = [](auto&& call) {
    auto start = Clock::now();
    auto r = call();
    EXPECT_FALSE(r.ok());
    if (!r.ok()) EXPECT_EQ(r.error().code, grpc::StatusCode::DEADLINE_EXCEEDED);
    return Clock::now() - start;
  };
  const auto full = timed([&] { return client->list_containers({}); });
  EXPECT_GE(full, 1500ms);
  const auto sandboxes = timed([&] { return client->list_pod_sandboxes({}); });
  EXPECT_GE(sandboxes, 1500ms);
  v1::ContainerFilter of_pod;
  of_pod.set_pod_sandbox_id(std::string(64, 'a'));
  const auto filtered = timed([&] { return client->list_containers(of_pod); });
  EXPECT_GE(filtered, 300ms);
  EXPECT_LT(filtered, 1500ms);
  const auto status = timed([&] { return client->container_status(std::string(64, 'b')); });
  EXPECT_LT(status, 1500ms);

  // A shorter list timeout than the call timeout is the call timeout.
  o.list_timeout = 100ms;
  auto other = make_client(runtime.endpoint(), o);
  ASSERT_NE(other, nullptr);
  EXPECT_GE(timed([&] { return other->list_containers({}); }), 300ms);
  o.list_timeout = 0ms;
  EXPECT_FALSE(GrpcCriClient::create(runtime.endpoint(), o).ok());
}

// Shutting down: a call in flight (a full list with a minute left) ends at once, and later
// calls fail without being sent.
TEST(GrpcCriClientHungRuntime, CancelCallsEndsCallsInFlightAndRefusesLaterOnes) {
  HungRuntime runtime;
  ASSERT_TRUE(runtime.ok()) << runtime.error();
  GrpcCriClientOptions o;
  o.list_timeout = 60s;
  o.min_connect_timeout = 60s;
  auto client = make_client(runtime.endpoint(), o);
  ASSERT_NE(client, nullptr);
  std::atomic<int> code{-1};
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    auto r = client->list_containers({});
    code = r.ok() ? 0 : r.error().code;
    returned = true;
  });
  ASSERT_TRUE(eventually([&] { return client->calls_in_flight() == 1; }, 5s));
  ASSERT_TRUE(eventually([&] { return runtime.connections_accepted() >= 1; }, 5s));
  EXPECT_FALSE(returned.load());
  client->cancel_calls();
  EXPECT_TRUE(eventually([&] { return returned.load(); }, 5s));
  caller.join();
  EXPECT_EQ(code.load(), grpc::StatusCode::CANCELLED);
  auto later = client->version();
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.error().code, grpc::StatusCode::CANCELLED) << later.error().message;
}

TEST(GrpcCriClientNoRuntime, FailsFastWithUnavailableInsteadOfWaitingForItsDeadline) {
  GrpcCriClientOptions o;
  o.call_timeout = 5s;
  auto client = make_client("/tmp/kpleg-no-such-runtime-" + std::to_string(getpid()) + ".sock", o);
  ASSERT_NE(client, nullptr);
  auto start = Clock::now();
  auto r = client->version();
  auto elapsed = Clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, grpc::StatusCode::UNAVAILABLE) << r.error().message;
  EXPECT_NE(r.error().message.find("Version"), std::string::npos);
  EXPECT_LT(elapsed, 2500ms) << "half the 5 s deadline";
  EXPECT_FALSE(client->connected());

  // The connectivity watcher must not hold up shutdown while it waits on a dead runtime.
  auto destroy_start = Clock::now();
  client.reset();
  EXPECT_LT(Clock::now() - destroy_start, 1s);
}

TEST(GrpcCriClientNoRuntime, RejectsNonUnixEndpoints) {
  auto c = GrpcCriClient::create("tcp://127.0.0.1:10010");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("unix"), std::string::npos);
}

using GrpcCriClientTestBed = CriTestBedTest;

TEST_F(GrpcCriClientTestBed, TalksToTheRealRuntime) {
  auto client = make_client(endpoint_, {});
  ASSERT_NE(client, nullptr);
  auto v = client->version();
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->runtime_api_version(), "v1");
  EXPECT_FALSE(v->runtime_name().empty());
  auto st = client->status();
  ASSERT_TRUE(st.ok()) << st.error().message;
  bool runtime_ready = false;
  for (const auto& c : st->conditions()) {
    if (c.type() == "RuntimeReady") runtime_ready = c.status();
  }
  EXPECT_TRUE(runtime_ready);
  // The watcher's connection is made beside the calls' and may still be coming up.
  EXPECT_TRUE(kpleg::testing::eventually([&] { return client->connected(); }, 5s));

  auto missing = client->container_status(std::string(64, 'f'));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, grpc::StatusCode::NOT_FOUND) << missing.error().message;
  auto missing_pod = client->pod_sandbox_status(std::string(64, 'f'));
  ASSERT_FALSE(missing_pod.ok());
  EXPECT_EQ(missing_pod.error().code, grpc::StatusCode::NOT_FOUND) << missing_pod.error().message;
  EXPECT_EQ(client->call_stats().count(CriMethod::kContainerStatus, grpc::StatusCode::NOT_FOUND),
            1u);
  EXPECT_EQ(client->call_stats().count(CriMethod::kVersion, grpc::StatusCode::OK), 1u);
}

// The read-only calls over kpleg's own HTTP/2 connections (all that kplegd makes) answer
// exactly as grpc++ does (field for field: a map's order on the wire is not fixed): the
// statuses of a running container, its sandbox, an exited container and an unknown id, the
// lists, Version and Status.
TEST_F(GrpcCriClientTestBed, ReadCallsOverKplegsHttp2AnswerAsGrpcDoes) {
  auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "2", "--namespace", namespace_});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;
  GrpcCriClientOptions grpc_o;
  grpc_o.h2_read_calls = false;
  auto via_grpc = make_client(endpoint_, grpc_o);
  auto via_h2 = make_client(endpoint_, {});
  ASSERT_NE(via_grpc, nullptr);
  ASSERT_NE(via_h2, nullptr);

  v1::ContainerFilter filter;
  (*filter.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  auto containers = via_grpc->list_containers(filter);
  ASSERT_TRUE(containers.ok()) << containers.error().message;
  ASSERT_EQ(containers->size(), 2u);
  // One of them exited, with its exit code and reason in the answer.
  ASSERT_TRUE(via_grpc->stop_container(containers->at(1).id(), 0).ok());
  for (const auto& c : *containers) {
    auto a = via_grpc->container_status(c.id());
    auto b = via_h2->container_status(c.id());
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_TRUE(MessageDifferencer::Equals(*a, *b))
        << c.id() << "\n" << a->DebugString() << "\n" << b->DebugString();
    EXPECT_FALSE(b->id().empty());
  }
  auto a = via_grpc->pod_sandbox_status(containers->at(0).pod_sandbox_id());
  auto b = via_h2->pod_sandbox_status(containers->at(0).pod_sandbox_id());
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_TRUE(MessageDifferencer::Equals(*a, *b)) << a->DebugString() << "\n" << b->DebugString();
  EXPECT_EQ(b->state(), v1::SANDBOX_READY);

  auto missing = via_h2->container_status(std::string(64, 'e'));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, grpc::StatusCode::NOT_FOUND) << missing.error().message;
  EXPECT_NE(missing.error().message.find("CRI ContainerStatus failed: NOT_FOUND: "),
            std::string::npos)
      << missing.error().message;
  EXPECT_EQ(via_h2->call_stats().count(CriMethod::kContainerStatus, grpc::StatusCode::OK), 2u);
  EXPECT_EQ(via_h2->call_stats().count(CriMethod::kPodSandboxStatus, grpc::StatusCode::OK), 1u);
  EXPECT_EQ(via_h2->calls_in_flight(), 0u);

  // The lists, filtered and full (the order of a list is the runtime's map order: compared by
  // id), Version and Status.
  auto by_id = [](auto items) {
    std::sort(items.begin(), items.end(),
              [](const auto& x, const auto& y) { return x.id() < y.id(); });
    return items;
  };
  auto same_lists = [&](const auto& x, const auto& y) {
    ASSERT_TRUE(x.ok()) << x.error().message;
    ASSERT_TRUE(y.ok()) << y.error().message;
    const auto xs = by_id(*x), ys = by_id(*y);
    ASSERT_EQ(xs.size(), ys.size());
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_TRUE(MessageDifferencer::Equals(xs[i], ys[i]))
          << xs[i].DebugString() << "\n" << ys[i].DebugString();
  };
  same_lists(via_grpc->list_containers(filter), via_h2->list_containers(filter));
  same_lists(via_grpc->list_containers({}), via_h2->list_containers({}));
  v1::PodSandboxFilter sandboxes;
  (*sandboxes.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  same_lists(via_grpc->list_pod_sandboxes(sandboxes), via_h2->list_pod_sandboxes(sandboxes));
  same_lists(via_grpc->list_pod_sandboxes({}), via_h2->list_pod_sandboxes({}));
  auto va = via_grpc->version();
  auto vb = via_h2->version();
  ASSERT_TRUE(va.ok()) << va.error().message;
  ASSERT_TRUE(vb.ok()) << vb.error().message;
  EXPECT_TRUE(MessageDifferencer::Equals(*va, *vb)) << va->DebugString() << vb->DebugString();
  EXPECT_FALSE(vb->runtime_name().empty());
  auto sa = via_grpc->status();
  auto sb = via_h2->status();
  ASSERT_TRUE(sa.ok()) << sa.error().message;
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  EXPECT_TRUE(MessageDifferencer::Equals(*sa, *sb)) << sa->DebugString() << sb->DebugString();

  // Every one of them went over HTTP/2 on the one side and through grpc++ on the other: 3
  // statuses, 1 unknown id, 4 lists, Version, Status.
  EXPECT_EQ(via_h2->h2_calls(), 10u);
  EXPECT_EQ(via_grpc->h2_calls(), 0u);
  EXPECT_EQ(via_h2->call_stats().count(CriMethod::kListContainers, grpc::StatusCode::OK), 2u);
  EXPECT_EQ(via_h2->call_stats().count(CriMethod::kListPodSandbox, grpc::StatusCode::OK), 2u);
}

// containerd dies (SIGKILL, as the OOM killer or a crash would) and comes back. The very same
// client must notice, fail fast while it is gone, reconnect by itself and say so.
TEST_F(GrpcCriClientTestBed, SameClientReconnectsAfterContainerdIsKilledAndRestarted) {
  const auto& bed = TestBed::instance();
  KPLEG_REQUIRE_OR_SKIP(
      bed.endpoint_is_test_bed(),
      "the runtime at " + endpoint_ + " is not the test bed's; cannot restart it");

  // A pod that must survive the restart: containerd keeps its state and reattaches to shims.
  auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "1", "--namespace", namespace_});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;

  std::atomic<int> reconnect_callbacks{0};
  GrpcCriClientOptions o;
  o.call_timeout = 2s;
  o.initial_reconnect_backoff = 100ms;
  o.max_reconnect_backoff = 1s;
  o.on_reconnect = [&] { ++reconnect_callbacks; };
  auto client = make_client(endpoint_, o);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(eventually([&] { return client->version().ok(); }, 10s));
  ASSERT_TRUE(eventually([&] { return client->connected(); }, 5s));

  auto pid = bed.containerd_pid();
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  ASSERT_EQ(kill(*pid, SIGKILL), 0) << "kill " << *pid << ": " << strerror(errno);
  ASSERT_TRUE(eventually([&] { return kill(*pid, 0) != 0 && errno == ESRCH; }, 10s))
      << "containerd " << *pid << " still exists after SIGKILL";

  // While it is gone: calls fail at once with UNAVAILABLE, not after their 2 s deadline.
  ASSERT_TRUE(eventually(
      [&] {
        auto start = Clock::now();
        auto r = client->version();
        return !r.ok() && r.error().code == grpc::StatusCode::UNAVAILABLE &&
               Clock::now() - start < 1s;
      },
      10s));
  EXPECT_FALSE(client->connected());
  EXPECT_EQ(reconnect_callbacks.load(), 0);

  auto restarted = bed.up();
  ASSERT_TRUE(restarted.ok()) << restarted.error().message;
  ASSERT_EQ(*restarted, endpoint_);

  ASSERT_TRUE(eventually([&] { return client->version().ok(); }, 30s, 100ms))
      << "the client did not reconnect; state " << cri::connection_state_name(client->state());
  EXPECT_TRUE(eventually([&] { return reconnect_callbacks.load() >= 1; }, 5s));
  EXPECT_GE(client->reconnects(), 1u);
  EXPECT_TRUE(client->connected());
  EXPECT_GE(client->call_stats().count(CriMethod::kVersion, grpc::StatusCode::UNAVAILABLE), 1u);

  v1::PodSandboxFilter filter;
  (*filter.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  auto pods = client->list_pod_sandboxes(filter);
  ASSERT_TRUE(pods.ok()) << pods.error().message;
  EXPECT_EQ(pods->size(), 1u) << "the pod created before the restart is gone";
  // The status calls' own connection (cri/h2_unary.h), closed by the restart, is replaced too.
  ASSERT_FALSE(pods->empty());
  auto sandbox = client->pod_sandbox_status(pods->at(0).id());
  ASSERT_TRUE(sandbox.ok()) << sandbox.error().message;
  EXPECT_EQ(sandbox->state(), v1::SANDBOX_READY);
}

}  // namespace
}  // namespace kpleg::testing
