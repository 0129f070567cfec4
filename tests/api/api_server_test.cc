// The consumer API end to end in one process: the real ApiServer on a real unix socket (or
// loopback TCP), real gRPC clients, events fed into the real EventBus.
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "api/client.h"
#include "api/convert.h"
#include "api_test_support.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "support/eventually.h"
#include "support/privileged.h"
#include "support/thread_wakeups.h"

namespace kpleg::apitest {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

v1::WatchRequest watch_from(uint64_t seq, const std::string& instance_id = {}) {
  v1::WatchRequest req;
  req.set_from_seq(seq);
  req.set_instance_id(instance_id);
  return req;
}

std::vector<uint64_t> seqs_of(const std::vector<v1::Event>& evs) {
  std::vector<uint64_t> out;
  for (const auto& e : evs) out.push_back(e.seq());
  return out;
}

std::vector<uint64_t> range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(start_status_.ok()) << start_status_.error().message; }
  ServerHarness h_;
  Status start_status_ = h_.start();
};

TEST_F(ApiServerTest, ThreeWatchersReceiveTheSameEventsInTheSameOrder) {
  WatchClient a(h_.channel(), watch_from(0));
  WatchClient b(h_.channel(), watch_from(0));
  WatchClient c(h_.channel(), watch_from(0));
  ASSERT_TRUE(a.subscribed() && b.subscribed() && c.subscribed());
  EXPECT_EQ(h_.bus.stats().subscribers, 3u);

  // Two producers race: the order is the bus's, and every watcher must see that same order.
  constexpr int kPerProducer = 300;
  std::thread p1([&] {
    for (int i = 0; i < kPerProducer; ++i) h_.bus.publish(sample_event(i, "one"));
  });
  std::thread p2([&] {
    for (int i = 0; i < kPerProducer; ++i) h_.bus.publish(sample_event(i, "two"));
  });
  p1.join();
  p2.join();

  for (auto* w : {&a, &b, &c}) ASSERT_TRUE(w->wait_for(2 * kPerProducer, 10s)) << w->count();
  auto ea = a.events(), eb = b.events(), ec = c.events();
  EXPECT_EQ(seqs_of(ea), range(1, 2 * kPerProducer));
  for (size_t i = 0; i < ea.size(); ++i) {
    ASSERT_EQ(ea[i].SerializeAsString(), eb[i].SerializeAsString()) << "at " << i;
    ASSERT_EQ(ea[i].SerializeAsString(), ec[i].SerializeAsString()) << "at " << i;
  }
  EXPECT_EQ(ea[0].type(), v1::EVENT_TYPE_CONTAINER_STARTED);
  EXPECT_EQ(ea[0].source(), v1::EVENT_SOURCE_KERNEL);
  EXPECT_EQ(ea[0].status().state(), v1::CONTAINER_STATE_RUNNING);
  EXPECT_EQ(ea[0].container_id().size(), 64u);
  EXPECT_GT(ea[0].emit_ts_ns(), 0u);
}

TEST_F(ApiServerTest, WatchResumedFromSeqGetsExactlyTheEventsAfterIt) {
  for (int i = 0; i < 50; ++i) h_.bus.publish(sample_event(i));
  WatchClient w(h_.channel(), watch_from(37, h_.bus.instance_id()));
  for (int i = 50; i < 60; ++i) h_.bus.publish(sample_event(i));
  ASSERT_TRUE(w.wait_for(23, 10s)) << w.count();
  EXPECT_EQ(seqs_of(w.events()), range(38, 60));
  // and nothing more arrives
  EXPECT_FALSE(w.wait_for(24, 200ms));
}

TEST_F(ApiServerTest, ListThenWatchHasNoGapAndNoDuplicate) {
  for (int i = 0; i < 5; ++i) h_.bus.publish(sample_event(i));
  auto stub = h_.stub();
  v1::ListResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->List(&ctx, v1::ListRequest{}, &list).ok());
  EXPECT_EQ(list.seq(), 5u);
  EXPECT_EQ(list.instance_id(), h_.bus.instance_id());

  h_.bus.publish(sample_event(5));  // between List and Watch
  v1::WatchRequest req = watch_from(list.seq());
  req.set_instance_id(list.instance_id());
  WatchClient w(h_.channel(), req);
  h_.bus.publish(sample_event(6));
  ASSERT_TRUE(w.wait_for(2, 10s));
  EXPECT_EQ(seqs_of(w.events()), (std::vector<uint64_t>{6, 7}));
}

TEST_F(ApiServerTest, WatchFromOlderThanTheHistoryGetsResyncFirst) {
  ServerHarness small({}, bus::EventBusOptions{.history_capacity = 100});
  ASSERT_TRUE(small.start().ok());
  for (int i = 0; i < 250; ++i) small.bus.publish(sample_event(i));
  WatchClient w(small.channel(), watch_from(10, small.bus.instance_id()));
  ASSERT_TRUE(w.wait_for(101, 10s)) << w.count();
  auto evs = w.events();
  ASSERT_EQ(evs[0].type(), v1::EVENT_TYPE_RESYNC);
  EXPECT_EQ(evs[0].seq(), 150u);
  EXPECT_NE(evs[0].reason().find("no longer retained"), std::string::npos) << evs[0].reason();
  EXPECT_EQ(evs[0].source(), v1::EVENT_SOURCE_UNSPECIFIED);
  EXPECT_FALSE(evs[0].has_status());
  EXPECT_EQ(seqs_of({evs.begin() + 1, evs.end()}), range(151, 250));
}

// A List before the first event gives seq 0: with the instance, a Watch from 0 is that
// position (every event since, RESYNC if the first ones are gone or the instance is another);
// without one, 0 is "from now on".
TEST_F(ApiServerTest, WatchFromZeroWithTheInstanceIsAfterAListAtZero) {
  auto stub = h_.stub();
  v1::ListResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->List(&ctx, v1::ListRequest{}, &list).ok());
  ASSERT_EQ(list.seq(), 0u);
  h_.bus.publish(sample_event(0));  // between List and Watch
  WatchClient positioned(h_.channel(), watch_from(0, list.instance_id()));
  WatchClient from_now(h_.channel(), watch_from(0));
  WatchClient other(h_.channel(), watch_from(0, "0123456789abcdef0123456789abcdef"));
  ASSERT_TRUE(positioned.subscribed() && from_now.subscribed() && other.subscribed());
  h_.bus.publish(sample_event(1));
  ASSERT_TRUE(positioned.wait_for(2, 10s)) << positioned.count();
  EXPECT_EQ(seqs_of(positioned.events()), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(positioned.events()[0].type(), v1::EVENT_TYPE_CONTAINER_STARTED);
  ASSERT_TRUE(from_now.wait_for(1, 10s));
  EXPECT_EQ(seqs_of(from_now.events()), (std::vector<uint64_t>{2}));
  ASSERT_TRUE(other.wait_for(2, 10s));
  EXPECT_EQ(other.events()[0].type(), v1::EVENT_TYPE_RESYNC);
  EXPECT_EQ(seqs_of(other.events()), (std::vector<uint64_t>{1, 2}));

  // The first events no longer retained: RESYNC, then what is.
  ServerHarness small({}, bus::EventBusOptions{.history_capacity = 3});
  ASSERT_TRUE(small.start().ok());
  for (int i = 0; i < 5; ++i) small.bus.publish(sample_event(i));
  WatchClient late(small.channel(), watch_from(0, small.bus.instance_id()));
  ASSERT_TRUE(late.wait_for(4, 10s)) << late.count();
  EXPECT_EQ(late.events()[0].type(), v1::EVENT_TYPE_RESYNC);
  EXPECT_EQ(seqs_of(late.events()), (std::vector<uint64_t>{2, 3, 4, 5}));
}

// A position is one in a given instance's stream. With another instance's id, or none (the
// consumer resumes after a daemon restart), it is never taken as a position in this stream.
TEST_F(ApiServerTest, WatchWithAnotherOrNoInstancesPositionGetsResync) {
  for (const std::string instance : {"0123456789abcdef0123456789abcdef", ""}) {
    for (int i = 0; i < 5; ++i) h_.bus.publish(sample_event(i));
    const uint64_t last = h_.bus.stats().last_seq;
    // A valid number here, but not from this stream.
    WatchClient w(h_.channel(), watch_from(last - 2, instance));
    h_.bus.publish(sample_event(5));
    ASSERT_TRUE(w.wait_for(2, 10s)) << "instance '" << instance << "'";
    auto evs = w.events();
    EXPECT_EQ(evs[0].type(), v1::EVENT_TYPE_RESYNC) << "instance '" << instance << "'";
    EXPECT_EQ(evs[0].seq(), last);
    EXPECT_EQ(evs[1].seq(), last + 1);
  }
}

// Requests are a few short filters: an oversized one is the client's mistake, and says so.
TEST_F(ApiServerTest, OversizedFiltersAndRequestsAreRefusedClearly) {
  auto stub = h_.stub();
  {
    v1::ListRequest req;
    req.set_pod_uid(std::string(200, 'u'));
    v1::ListResponse resp;
    grpc::ClientContext ctx;
    auto st = stub->List(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("pod_uid"), std::string::npos) << st.error_message();
  }
  {
    v1::WatchRequest req;
    req.set_pod_namespace(std::string(100, 'n'));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto reader = stub->Watch(&ctx, req);
    v1::Event ev;
    EXPECT_FALSE(reader->Read(&ev));
    auto st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("pod_namespace"), std::string::npos) << st.error_message();
  }
  {
    v1::ListRequest req;
    req.set_pod_namespace(std::string(8192, 'n'));  // over the 4 KiB a request may have
    v1::ListResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->List(&ctx, req, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_EQ(h_.bus.stats().subscribers, 0u) << "a refused Watch holds no subscription";
}

TEST_F(ApiServerTest, WatchFiltersByPodUidAndNamespace) {
  v1::WatchRequest by_ns = watch_from(0);
  by_ns.set_pod_namespace("kube-system");
  WatchClient ns(h_.channel(), by_ns);
  auto target = sample_event(7);
  v1::WatchRequest by_uid = watch_from(0);
  by_uid.set_pod_uid(target.pod_uid);
  WatchClient uid(h_.channel(), by_uid);

  for (int i = 0; i < 20; ++i) h_.bus.publish(sample_event(i, i % 2 ? "kube-system" : "default"));
  ASSERT_TRUE(ns.wait_for(10, 10s));
  ASSERT_TRUE(uid.wait_for(1, 10s));
  for (const auto& e : ns.events()) EXPECT_EQ(e.pod_namespace(), "kube-system");
  EXPECT_FALSE(ns.wait_for(11, 200ms));
  auto u = uid.events();
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].seq(), 8u);
}

TEST_F(ApiServerTest, ListReturnsTheSnapshotAndFilters) {
  pleg::PodRecord web{{"uid-web", "web-0", "default"}, {}};
  const auto running = pleg::ContainerState::kRunning, exited = pleg::ContainerState::kExited;
  web.containers.push_back({"sandbox-id", "", true, running, {running, 1, 2, 0, 0, "", ""}});
  web.containers.push_back({"c1", "nginx", false, exited, {exited, 1, 2, 3, 137, "OOMKilled", ""}});
  pleg::PodRecord dns{{"uid-dns", "coredns-1", "kube-system"}, {}};
  h_.state.set_pods({web, dns});
  h_.bus.publish(sample_event(0));

  auto stub = h_.stub();
  v1::ListResponse all;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->List(&c1, v1::ListRequest{}, &all).ok());
  EXPECT_EQ(all.seq(), 1u);
  ASSERT_EQ(all.pods_size(), 2);
  EXPECT_EQ(all.pods(0).uid(), "uid-web");
  ASSERT_EQ(all.pods(0).containers_size(), 2);
  EXPECT_TRUE(all.pods(0).containers(0).sandbox());
  EXPECT_EQ(all.pods(0).containers(1).status().state(), v1::CONTAINER_STATE_EXITED);
  EXPECT_EQ(all.pods(0).containers(1).status().exit_code(), 137);
  EXPECT_EQ(all.pods(0).containers(1).status().reason(), "OOMKilled");
  EXPECT_EQ(all.pods(0).containers(1).status().finished_at_ns(), 3);

  v1::ListRequest only_ns;
  only_ns.set_pod_namespace("kube-system");
  v1::ListResponse some;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub->List(&c2, only_ns, &some).ok());
  ASSERT_EQ(some.pods_size(), 1);
  EXPECT_EQ(some.pods(0).name(), "coredns-1");
}

// Consumers looping on List do not each take the pipeline's state: one snapshot serves every
// List until an event is published or it is 100 ms old.
TEST_F(ApiServerTest, ListLoopsShareSnapshotsInsteadOfEachTakingTheState) {
  pleg::PodRecord web{{"uid-web", "web-0", "default"}, {}};
  h_.state.set_pods({web});
  h_.bus.publish(sample_event(0));
  const int before = h_.state.snapshots();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> loops;
  std::atomic<int> answered{0};
  for (int t = 0; t < 8; ++t) {
    loops.emplace_back([&] {
      auto stub = h_.stub();
      for (int i = 0; i < 50; ++i) {
        v1::ListResponse r;
        grpc::ClientContext ctx;
        if (stub->List(&ctx, v1::ListRequest{}, &r).ok() && r.pods_size() == 1) ++answered;
      }
    });
  }
  for (auto& t : loops) t.join();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(answered.load(), 400);
  const int taken = h_.state.snapshots() - before;
  EXPECT_LE(taken, 1 + ms / 100 + 1) << "400 Lists in " << ms << " ms took " << taken << " snapshots";

  // An event makes the next List take a new one, at once.
  pleg::PodRecord dns{{"uid-dns", "coredns-1", "kube-system"}, {}};
  h_.state.set_pods({web, dns});
  h_.bus.publish(sample_event(1));
  v1::ListResponse after;
  grpc::ClientContext ctx;
  ASSERT_TRUE(h_.stub()->List(&ctx, v1::ListRequest{}, &after).ok());
  EXPECT_EQ(after.pods_size(), 2);
  EXPECT_EQ(after.seq(), 2u);
}

TEST_F(ApiServerTest, StatsCombineTheDaemonTheBusAndHealth) {
  for (int i = 0; i < 3; ++i) h_.bus.publish(sample_event(i));
  WatchClient w(h_.channel(), watch_from(0));
  h_.health.set(false, {"runtime unreachable"});
  v1::StatsResponse st;
  grpc::ClientContext ctx;
  ASSERT_TRUE(h_.stub()->Stats(&ctx, v1::StatsRequest{}, &st).ok());
  EXPECT_EQ(st.instance_id(), h_.bus.instance_id());
  EXPECT_EQ(st.mode(), "ebpf");
  EXPECT_EQ(st.last_seq(), 3u);
  EXPECT_EQ(st.oldest_retained_seq(), 1u);
  EXPECT_EQ(st.history_capacity(), bus::kDefaultHistoryCapacity);
  EXPECT_EQ(st.subscribers(), 1u);
  EXPECT_EQ(st.kernel_events(), 123u);
  EXPECT_EQ(st.cri_calls(), 77u);
  ASSERT_EQ(st.cri_calls_by_method_size(), 2);
  EXPECT_EQ(st.cri_calls_by_method().at("ContainerStatus"), 60u);
  EXPECT_EQ(st.cri_calls_by_method().at("ListContainers"), 17u);
  EXPECT_EQ(st.confirm_retries(), 5u);
  EXPECT_FALSE(st.healthy());
  ASSERT_EQ(st.health_reasons_size(), 1);
  EXPECT_EQ(st.health_reasons(0), "runtime unreachable");
}

// One thread of the server polls its connections (gRPC's default allows two): with two, each
// consumer's acknowledgement of an event (its WINDOW_UPDATE) woke one poller, which handed the
// poll to the other through a wakeup fd, several wakeups per event instead of one. A unary call
// is handled by the thread that polled it, and a new poller takes over meanwhile; the handler
// thread then ends instead of polling beside it. So with one Watch open, after unary calls, the
// server has two threads: the Watch's handler and the one poller.
// The unix socket is served by one thread whatever its streams (grpc++'s sync server held a
// thread per open stream): the Watches' events are written by the publishing thread.
TEST_F(ApiServerTest, TheUnixSocketIsServedByOneThreadWhateverItsStreams) {
  std::vector<std::unique_ptr<WatchClient>> watches;
  for (int i = 0; i < 3; ++i)
    watches.push_back(std::make_unique<WatchClient>(h_.channel(), watch_from(0)));
  auto health = grpc::health::v1::Health::NewStub(h_.channel());
  grpc::ClientContext health_ctx;
  auto health_watch = health->Watch(&health_ctx, HealthCheckRequest{});
  HealthCheckResponse status;
  ASSERT_TRUE(health_watch->Read(&status));
  for (int i = 0; i < 5; ++i) {
    v1::StatsResponse st;
    grpc::ClientContext ctx;
    ASSERT_TRUE(h_.stub()->Stats(&ctx, v1::StatsRequest{}, &st).ok());
  }
  const auto threads = kpleg::testing::scheduled_in();
  EXPECT_EQ(kpleg::testing::threads_named(threads, "kpleg-api").threads, 1);
  EXPECT_EQ(kpleg::testing::threads_named(threads, "grpcpp_sync_ser").threads, 0)
      << "no gRPC server without --listen";
  h_.bus.publish(sample_event(0));
  for (auto& w : watches) EXPECT_TRUE(w->wait_for(1, 5s));
  health_ctx.TryCancel();
  while (health_watch->Read(&status)) {
  }
  health_watch->Finish();
}

// The server reads every connection, so a client that goes away is noticed at once: its
// subscription and its slot go without waiting for an event (grpc++'s sync API noticed it only
// when a write failed, or after a minute's look).
TEST_F(ApiServerTest, AGoneClientsSubscriptionEndsAtOnce) {
  auto w = std::make_unique<WatchClient>(h_.channel(), watch_from(0));
  ASSERT_EQ(h_.bus.stats().subscribers, 1u);
  ASSERT_EQ(h_.server->open_watches(), 1u);
  w->cancel();
  EXPECT_EQ(w->finish(10s).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(eventually([&] { return h_.bus.stats().subscribers == 0; }, 5s))
      << "still subscribed with no event published";
  EXPECT_EQ(h_.server->open_watches(), 0u);
}

// What the gRPC protocol says a server answers to a method it does not serve, and compressed
// requests as grpc++ took them.
TEST_F(ApiServerTest, UnknownMethodsAreUnimplementedAndCompressedRequestsAreServed) {
  grpc::GenericStub generic(h_.channel());
  grpc::ClientContext ctx;
  grpc::ByteBuffer reply;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> done;
  grpc::Slice nothing("");
  grpc::ByteBuffer empty(&nothing, 1);
  generic.UnaryCall(&ctx, "/kpleg.v1.PodLifecycle/Nope", grpc::StubOptions(), &empty, &reply,
                    [&](grpc::Status st) {
                      std::lock_guard l(mu);
                      done = st;
                      cv.notify_all();
                    });
  {
    std::unique_lock l(mu);
    ASSERT_TRUE(cv.wait_for(l, 10s, [&] { return done.has_value(); }));
  }
  EXPECT_EQ(done->error_code(), grpc::StatusCode::UNIMPLEMENTED) << done->error_message();
  EXPECT_NE(done->error_message().find("/kpleg.v1.PodLifecycle/Nope"), std::string::npos);

  // Compressed requests (gzip; deflate the same) are inflated, up to the request bound.
  grpc::ClientContext zipped;
  zipped.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  v1::ListRequest req;
  req.set_pod_namespace(std::string(60, 'n'));
  v1::ListResponse resp;
  grpc::Status st = h_.stub()->List(&zipped, req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.instance_id(), h_.bus.instance_id());
  grpc::ClientContext bomb;
  bomb.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  req.set_pod_uid(std::string(8192, 'u'));  // a few dozen bytes compressed
  st = h_.stub()->List(&bomb, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();

  // The connection still serves.
  grpc::ClientContext plain;
  EXPECT_TRUE(h_.stub()->List(&plain, v1::ListRequest{}, &resp).ok());
}

TEST(ApiServerWatchSlots, AGoneClientsSlotIsReclaimedWhenANewWatchNeedsIt) {
  ServerHarness h(api::ApiServerOptions{.max_watchers = 1});
  ASSERT_TRUE(h.start().ok());
  auto w = std::make_unique<WatchClient>(h.channel(), watch_from(0));
  ASSERT_TRUE(w->subscribed());
  w->cancel();
  EXPECT_EQ(w->finish(10s).error_code(), grpc::StatusCode::CANCELLED);
  auto t0 = std::chrono::steady_clock::now();
  WatchClient next(h.channel(), watch_from(0));
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(next.subscribed()) << "the gone client's slot was not reclaimed";
  EXPECT_EQ(h.bus.stats().subscribers, 1u);
  EXPECT_LT(took, 2s);
  std::printf("a new Watch reclaimed the gone client's slot after %.1f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  // With the slot held by a live client, a further Watch is still refused.
  WatchClient third(h.channel(), watch_from(0));
  EXPECT_FALSE(third.subscribed());
  EXPECT_EQ(third.finish(10s).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ApiServerTest, StopEndsWatchesWithUnavailable) {
  WatchClient w(h_.channel(), watch_from(0));
  h_.server->stop();
  grpc::Status st = w.finish(10s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_FALSE(std::filesystem::exists(h_.socket_path)) << "stop removes the socket";
}

TEST_F(ApiServerTest, TooManyWatchersAreRefused) {
  ServerHarness limited(api::ApiServerOptions{.max_watchers = 2});
  ASSERT_TRUE(limited.start().ok());
  WatchClient a(limited.channel(), watch_from(0));
  WatchClient b(limited.channel(), watch_from(0));
  WatchClient c(limited.channel(), watch_from(0));
  grpc::Status st = c.finish(10s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("too many watchers (limit 2"), std::string::npos);
}

// A consumer that stops reading is cut off; its handler stays blocked in a write its flow
// control holds. Its place under --max-watchers must come back at once (a stuck consumer may
// not lock others out), and its call, with the server thread, after the grace.
TEST_F(ApiServerTest, ACutOffWatcherGivesItsPlaceBackAtOnceAndItsCallAfterTheGrace) {
  ServerHarness limited(api::ApiServerOptions{.max_watchers = 2, .cut_off_grace = 500ms});
  ASSERT_TRUE(limited.start().ok());
  WatchClient stuck(limited.channel(), watch_from(0), {.read = false, .keep_events = false});
  WatchClient reader(limited.channel(), watch_from(0), {.read = true, .keep_events = false});
  ASSERT_TRUE(eventually([&] { return limited.bus.stats().subscribers == 2; }, 5s));

  uint64_t published = 0;
  while (limited.bus.stats().subscribers_cut_off == 0 && published < 200'000) {
    for (int i = 0; i < 500; ++i) limited.bus.publish(sample_event(static_cast<int>(published++)));
    ASSERT_TRUE(eventually([&] { return reader.last_seq() >= published; }, 10s));
  }
  ASSERT_EQ(limited.bus.stats().subscribers_cut_off, 1u) << "never cut off";

  // At once, while the stuck handler still waits in its write: a third consumer gets in.
  WatchClient late(limited.channel(), watch_from(0), {.read = true, .keep_events = false});
  limited.bus.publish(sample_event(static_cast<int>(published++)));
  EXPECT_TRUE(eventually([&] { return late.last_seq() >= published; }, 10s))
      << "a cut-off consumer that reads nothing kept its place";
  EXPECT_FALSE(late.finished());

  // Its call ends though it never reads: cancelled after the grace while its handler waits in
  // a write (the usual case), or by itself if the cut-off found the handler between writes.
  EXPECT_TRUE(eventually([&] { return limited.server->open_watches() == 2; }, 10s))
      << limited.server->open_watches() << " Watch handlers still running";
  const bool reaped = limited.server->cut_off_watches_cancelled() == 1;
  grpc::Status st = stuck.finish(15s);
  EXPECT_EQ(st.error_code(),
            reaped ? grpc::StatusCode::CANCELLED : grpc::StatusCode::RESOURCE_EXHAUSTED)
      << st.error_message() << (reaped ? " (cancelled after the grace)" : " (ended by itself)");
  EXPECT_FALSE(reader.finished());
}

// A consumer that stops reading fills its stream's flow-control window and its socket; what it
// leaves unread waits in its bus queue. The API's thread is not woken for it meanwhile (a
// stream blocked by flow control is no reason to poll the socket for writing), nor is the
// publisher held up: it is cut off when its queue is full, as any subscriber.
TEST(ApiServerWatchSlots, AConsumerThatStopsReadingCostsTheServerNoWakeups) {
  ServerHarness h(api::ApiServerOptions{}, bus::EventBusOptions{.default_queue_capacity = 400'000});
  ASSERT_TRUE(h.start().ok());
  WatchClient stuck(h.channel(), watch_from(0), {.read = false, .keep_events = false});
  ASSERT_TRUE(stuck.subscribed());
  // Enough to fill the window (gRPC's clients grow theirs to a few MiB) and the socket; fewer
  // than the queue holds.
  for (int i = 0; i < 300'000; ++i) h.bus.publish(sample_event(i));
  ASSERT_EQ(h.bus.stats().subscribers_cut_off, 0u);
  auto api_thread = [] {
    return kpleg::testing::threads_named(kpleg::testing::scheduled_in(), "kpleg-api").scheduled_in;
  };
  // Settled: the consumer's library has read what its window let through.
  long before = api_thread();
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(20ms);
    const long now = api_thread();
    if (now == before) break;
    before = now;
  }
  std::this_thread::sleep_for(500ms);  // the span measured, not a synchronisation
  EXPECT_LE(api_thread() - before, 2) << "the API's thread woke for a stream it cannot write to";
  EXPECT_FALSE(stuck.finished());
}

namespace {

long api_thread_scheduled_in() {
  return kpleg::testing::threads_named(kpleg::testing::scheduled_in(), "kpleg-api").scheduled_in;
}

// Publishes one event every 2 ms on a thread of its own until destroyed: a flowing stream, whose
// consumer answers each event with its flow-control frames.
class SteadyPublisher {
 public:
  explicit SteadyPublisher(bus::EventBus& bus, int first = 0)
      : thread_([this, &bus, first] {
          for (int i = first; !stop_.load(); ++i) {
            bus.publish(sample_event(i));
            published_.fetch_add(1);
            std::this_thread::sleep_for(2ms);  // the stream's pace, not a synchronisation
          }
        }) {}
  ~SteadyPublisher() {
    stop_.store(true);
    thread_.join();
  }
  size_t published() const { return published_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> published_{0};
  std::thread thread_;
};

}  // namespace

// A gRPC C++ consumer answers each message it reads with WINDOW_UPDATEs; while its Watch flows
// they are read by the publishing thread when it writes, not by waking the API's thread for each
// (it was woken once per event before: about 200 here).
TEST_F(ApiServerTest, AFlowingWatchCostsTheServersThreadNoWakeupPerEvent) {
  WatchClient w(h_.channel(), watch_from(0));
  ASSERT_TRUE(w.subscribed());
  const long before = api_thread_scheduled_in();
  {
    SteadyPublisher pub(h_.bus);
    ASSERT_TRUE(eventually([&] { return pub.published() >= 200; }, 10s));
  }
  const size_t published = h_.bus.stats().last_seq;
  ASSERT_TRUE(w.wait_for(published, 10s));
  const long woke = api_thread_scheduled_in() - before;
  EXPECT_LE(woke, 20) << "for " << published << " events";
  EXPECT_TRUE(w.in_order());
}

// What a consumer sends on a connection whose Watch flows is still read: a call while the
// events come (at the next event), a call once they stopped (within the quiet span), a cancel;
// and a consumer that stops reading and starts again gets every event.
TEST_F(ApiServerTest, WhatAConsumerSendsBesideAFlowingWatchIsRead) {
  auto channel = h_.channel();
  auto stub = v1::PodLifecycle::NewStub(channel);
  auto stats_ok = [&] {
    v1::StatsResponse st;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    return stub->Stats(&ctx, v1::StatsRequest{}, &st).ok();
  };
  auto w = std::make_unique<WatchClient>(channel, watch_from(0));
  ASSERT_TRUE(w->subscribed());
  {
    SteadyPublisher pub(h_.bus);
    ASSERT_TRUE(w->wait_for(100, 10s));
    EXPECT_TRUE(stats_ok()) << "a call while the Watch flows";
  }
  EXPECT_TRUE(stats_ok()) << "a call once the events stopped";
  {
    SteadyPublisher pub(h_.bus, 100'000);
    ASSERT_TRUE(eventually([&] { return pub.published() >= 100; }, 10s));
    w->cancel();
    EXPECT_EQ(w->finish(10s).error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(eventually([&] { return h_.bus.stats().subscribers == 0; }, 5s))
      << "the cancel was not read";
  EXPECT_TRUE(eventually([&] { return h_.server->open_watches() == 0; }, 5s));

  // Paused: the unread events fill the stream's window; read again, all of them come.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  const uint64_t from = h_.bus.stats().last_seq;
  auto reader = stub->Watch(&ctx, watch_from(from, h_.bus.instance_id()));
  v1::Event ev;
  size_t got = 0;
  {
    SteadyPublisher pub(h_.bus, 200'000);
    while (got < 100 && reader->Read(&ev)) ++got;
  }
  ASSERT_EQ(got, 100u);
  // More than the window holds, fewer than the bus queues for a subscriber.
  for (int i = 0; i < 700; ++i) h_.bus.publish(sample_event(300'000 + i));
  const uint64_t last = h_.bus.stats().last_seq;
  uint64_t seq = 0;
  while (seq < last && reader->Read(&ev)) seq = ev.seq();
  EXPECT_EQ(seq, last);
  ctx.TryCancel();
  while (reader->Read(&ev)) {
  }
  reader->Finish();
}

// An idle Watch looks for a gone client only once a second; a stream that needs the slot of one
// whose client cancelled it must not wait for that (nor be refused meanwhile).
TEST_F(ApiServerTest, CancelledStreamsGiveTheirSlotsBackAtOnce) {
  ServerHarness limited(api::ApiServerOptions{.max_watchers = 2});
  ASSERT_TRUE(limited.start().ok());
  auto health = grpc::health::v1::Health::NewStub(limited.channel());
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      WatchClient a(limited.channel(), watch_from(0));
      ASSERT_TRUE(a.subscribed()) << "round " << round;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 10s);
      auto reader = health->Watch(&ctx, HealthCheckRequest{});
      HealthCheckResponse resp;
      ASSERT_TRUE(reader->Read(&resp)) << "round " << round;
      ctx.TryCancel();
      while (reader->Read(&resp)) {
      }
      reader->Finish();
    }  // a cancelled
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, 900ms) << "round " << round;
  }
}

// UINT64_MAX - 1 is the bus's "every retained event" for in-process consumers; from a client it
// is just a position beyond the stream's last seq.
TEST_F(ApiServerTest, WatchFromBeyondTheLastSeqGetsResync) {
  for (uint64_t from : {uint64_t(100), UINT64_MAX - 2, UINT64_MAX - 1, UINT64_MAX}) {
    for (int i = 0; i < 5; ++i) h_.bus.publish(sample_event(i));
    const uint64_t last = h_.bus.stats().last_seq;
    WatchClient w(h_.channel(), watch_from(from, h_.bus.instance_id()));
    h_.bus.publish(sample_event(5));
    ASSERT_TRUE(w.wait_for(2, 10s)) << from;
    auto evs = w.events();
    EXPECT_EQ(evs[0].type(), v1::EVENT_TYPE_RESYNC) << from;
    EXPECT_EQ(evs[0].seq(), last) << from;
    EXPECT_EQ(evs[1].seq(), last + 1) << from << ": the live event, no retained one before it";
  }
}

TEST_F(ApiServerTest, NeverReadingWatcherIsCutOffWhileOthersKeepUpAndMemoryStaysBounded) {
  constexpr uint64_t kWarmup = 20'000;  // fills the history (10,000) first
  constexpr uint64_t kEvents = 200'000;
  constexpr uint64_t kBatch = 500;  // half a watcher queue: readers keep pace batch by batch
  const long rss_start = rss_kb();
  size_t wire_size = 0;
  {
    v1::Event probe;
    api::to_proto(sample_event(1), &probe);
    wire_size = probe.ByteSizeLong();
  }

  WatchClient stuck(h_.channel(), watch_from(0), {.read = false, .keep_events = false});
  WatchClient r1(h_.channel(), watch_from(0), {.read = true, .keep_events = false});
  WatchClient r2(h_.channel(), watch_from(0), {.read = true, .keep_events = false});
  ASSERT_EQ(h_.bus.stats().subscribers, 3u);

  uint64_t published = 0;
  double worst_catch_up_ms = 0;
  bool cut_off_seen = false;
  double catch_up_at_cut_off_ms = -1;
  uint64_t cut_off_near_seq = 0;
  long rss_after_warmup = 0;
  auto publish_batch = [&] {
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < kBatch; ++i)
      h_.bus.publish(sample_event(static_cast<int>(published++)));
    bool ok =
        eventually([&] { return r1.last_seq() >= published && r2.last_seq() >= published; }, 10s);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    worst_catch_up_ms = std::max(worst_catch_up_ms, ms);
    if (!cut_off_seen && h_.bus.stats().subscribers_cut_off == 1) {
      cut_off_seen = true;
      catch_up_at_cut_off_ms = ms;
      cut_off_near_seq = published;
    }
    return ok;
  };

  while (published < kWarmup)
    ASSERT_TRUE(publish_batch()) << "readers fell behind at " << published;
  rss_after_warmup = rss_kb();
  while (published < kWarmup + kEvents)
    ASSERT_TRUE(publish_batch()) << "readers fell behind at " << published;
  const long rss_end = rss_kb();

  // The readers got everything, in order, and were never cut off.
  EXPECT_EQ(r1.count(), kWarmup + kEvents);
  EXPECT_EQ(r2.count(), kWarmup + kEvents);
  EXPECT_TRUE(r1.in_order());
  EXPECT_TRUE(r2.in_order());
  EXPECT_FALSE(r1.finished());
  EXPECT_FALSE(r2.finished());
  EXPECT_TRUE(cut_off_seen);
  auto bs = h_.bus.stats();
  EXPECT_EQ(bs.subscribers_cut_off, 1u);
  EXPECT_EQ(bs.subscribers, 2u);

  // The stuck one learns why when it finally reads: after what was in flight, the status.
  grpc::Status st = stuck.finish(30s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_EQ(st.error_message(), "subscriber too slow: queue of 1000 events full");
  // What it does get is what HTTP/2 flow control let into its own transport buffers before
  // the server's write blocked, plus nothing from the bus queue (dropped at the cut-off).
  EXPECT_LT(stuck.count(), 100'000u);

  // Unbounded buffering of 200,000 events for the stuck watcher would cost well over 60 MB
  // (~350 bytes of strings and bookkeeping each); the history was full after warm-up.
  const long growth_kb = rss_end - rss_after_warmup;
  std::printf(
      "RSS: start %ld kB, after %llu warm-up events %ld kB, after %llu more %ld kB (growth %ld "
      "kB); stuck watcher cut off near seq %llu after %zu events reached it; worst batch "
      "catch-up %.1f ms, at the cut-off %.1f ms; event size on the wire %zu bytes\n",
      rss_start, static_cast<unsigned long long>(kWarmup), rss_after_warmup,
      static_cast<unsigned long long>(kEvents), rss_end, growth_kb,
      static_cast<unsigned long long>(cut_off_near_seq), stuck.count(), worst_catch_up_ms,
      catch_up_at_cut_off_ms, wire_size);
  EXPECT_LT(growth_kb, 16 * 1024);
  EXPECT_LT(catch_up_at_cut_off_ms, 2000) << "cutting one watcher off must not stall the others";
}

// A consumer through kpleg's client makes no BDP PINGs, which kplegd would wake to answer about
// every eighth event.
TEST(ApiClient, ChannelsDoNotProbeBandwidthWithPings) {
  grpc::ChannelArguments args;
  api::set_channel_arguments(args);
  const grpc_channel_args c = args.c_channel_args();
  int found = 0;
  for (size_t i = 0; i < c.num_args; ++i) {
    if (std::string(c.args[i].key) != GRPC_ARG_HTTP2_BDP_PROBE) continue;
    ++found;
    ASSERT_EQ(c.args[i].type, GRPC_ARG_INTEGER);
    EXPECT_EQ(c.args[i].value.integer, 0);
  }
  EXPECT_EQ(found, 1);
}

TEST_F(ApiServerTest, SocketIsOwnerOnly) {
  struct stat st {};
  ASSERT_EQ(stat(h_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST(ApiServerSocket, SocketGroupMakesIt0660AndChownsIt) {
  group* g = getgrgid(getegid());
  ASSERT_NE(g, nullptr);
  ServerHarness h(api::ApiServerOptions{.socket_group = g->gr_name});
  ASSERT_TRUE(h.start().ok());
  struct stat st {};
  ASSERT_EQ(stat(h.socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getegid());
}

TEST(ApiServerSocket, UnknownSocketGroupIsAnError) {
  ServerHarness h(api::ApiServerOptions{.socket_group = "kpleg-no-such-group"});
  auto st = h.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("no such group"), std::string::npos) << st.error().message;
  EXPECT_FALSE(std::filesystem::exists(h.socket_path));
}

TEST(ApiServerSocket, CreatesTheSocketDirectory) {
  TempDir dir;
  std::string path = dir.path() + "/run/kpleg/kpleg.sock";
  ServerHarness h(api::ApiServerOptions{.socket_path = path});
  ASSERT_TRUE(h.start().ok());
  EXPECT_TRUE(std::filesystem::is_socket(path));
}

TEST(ApiServerSocket, ReplacesAStaleSocketButNotALiveOne) {
  ServerHarness first;
  ASSERT_TRUE(first.start().ok());
  ServerHarness second(api::ApiServerOptions{.socket_path = first.socket_path});
  auto st = second.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("another server answers on it"), std::string::npos)
      << st.error().message;

  // A crashed daemon leaves its socket behind: nobody answers on it.
  first.server.reset();
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", first.socket_path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  ServerHarness third(api::ApiServerOptions{.socket_path = first.socket_path});
  auto st3 = third.start();
  ASSERT_TRUE(st3.ok()) << st3.error().message;
  grpc::ClientContext ctx;
  v1::StatsResponse resp;
  EXPECT_TRUE(third.stub()->Stats(&ctx, v1::StatsRequest{}, &resp).ok());
}

TEST(ApiServerSocket, RefusesToReplaceANonSocket) {
  TempDir dir;
  std::string path = dir.path() + "/kpleg.sock";
  std::ofstream(path) << "not a socket";
  ServerHarness h(api::ApiServerOptions{.socket_path = path});
  auto st = h.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("exists and is not a socket"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
}

TEST(ApiServerOptionsTest, PlainTcpIsRefusedWithoutInsecureTcp) {
  ServerHarness h(api::ApiServerOptions{.listen_address = "127.0.0.1:0"});
  auto st = h.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("refusing plain TCP on 127.0.0.1:0"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("--insecure-tcp"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(h.socket_path)) << "nothing is served on refusal";
}

TEST(ApiServerOptionsTest, InsecureTcpServesOnLoopbackWhenAskedFor) {
  ServerHarness h(api::ApiServerOptions{.listen_address = "127.0.0.1:0", .insecure_tcp = true});
  ASSERT_TRUE(h.start().ok());
  ASSERT_GT(h.server->tcp_port(), 0);
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(h.server->tcp_port()),
                                grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::StatsResponse resp;
  EXPECT_TRUE(v1::PodLifecycle::NewStub(ch)->Stats(&ctx, v1::StatsRequest{}, &resp).ok());
}

// On TCP, grpc++'s sync server: one thread per open stream and one that polls the connections
// (gRPC's default allows two pollers, which handed each consumer WINDOW_UPDATE to each other
// through a wakeup fd). A unary call is handled by the thread that polled it, a new poller
// taking over; that thread ends after the call.
TEST(ApiServerOptionsTest, OnTcpOneThreadPollsBesideTheWatchHandlers) {
  ServerHarness h(api::ApiServerOptions{.listen_address = "127.0.0.1:0", .insecure_tcp = true});
  ASSERT_TRUE(h.start().ok());
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(h.server->tcp_port()),
                                grpc::InsecureChannelCredentials());
  WatchClient w(ch, watch_from(0));
  for (int i = 0; i < 5; ++i) {
    v1::StatsResponse st;
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::PodLifecycle::NewStub(ch)->Stats(&ctx, v1::StatsRequest{}, &st).ok());
  }
  int threads = 0;
  // The handler of the last unary call ends after its reply: polled with a deadline.
  EXPECT_TRUE(eventually([&] {
    threads = kpleg::testing::threads_named(kpleg::testing::scheduled_in(), "grpcpp_sync_ser").threads;
    return threads == 2;
  })) << threads << " server threads";
  h.bus.publish(sample_event(0));
  EXPECT_TRUE(w.wait_for(1, 5s));
}

TEST(ApiServerOptionsTest, FlagsAndTheirValidation) {
  auto parse = [](std::vector<std::string> args) {
    CLI::App app;
    api::ApiServerOptions o;
    bus::EventBusOptions b;
    api::add_api_flags(app, o, b);
    std::vector<const char*> argv{"kplegd"};
    for (auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    return std::make_tuple(o, b);
  };
  auto [o, b] =
      parse({"--listen", "0.0.0.0:7443", "--tls-cert", "c.pem", "--tls-key", "k.pem",
             "--tls-client-ca", "ca.pem", "--event-history", "500", "--watch-queue", "64"});
  EXPECT_TRUE(o.validate().ok());
  EXPECT_EQ(o.socket_path, api::kDefaultSocketPath);
  EXPECT_EQ(b.history_capacity, 500u);
  EXPECT_EQ(b.default_queue_capacity, 64u);

  auto bad = [&](std::vector<std::string> args, const std::string& expect) {
    auto [opt, unused] = parse(std::move(args));
    auto st = opt.validate();
    ASSERT_FALSE(st.ok()) << expect;
    EXPECT_NE(st.error().message.find(expect), std::string::npos) << st.error().message;
  };
  bad({"--listen", "127.0.0.1:7443"}, "refusing plain TCP");
  bad({"--listen", "127.0.0.1"}, "expected host:port");
  bad({"--listen", "h:1", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together");
  bad({"--listen", "h:1", "--tls-cert", "c", "--tls-key", "k", "--insecure-tcp"}, "choose one");
  bad({"--listen", "h:1", "--insecure-tcp", "--tls-client-ca", "ca"}, "--tls-client-ca needs");
  bad({"--tls-cert", "c", "--tls-key", "k"}, "which is not given");
  bad({"--socket", ""}, "nothing to serve on");
}

// ---- grpc.health.v1 ----

HealthCheckResponse::ServingStatus check(const std::shared_ptr<grpc::Channel>& ch,
                                         const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(ch);
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  if (!stub->Check(&ctx, req, &resp).ok()) return HealthCheckResponse::UNKNOWN;
  return resp.status();
}

TEST(ApiServerHealth, FollowsTheHealthProvider) {
  ServerHarness h;
  ASSERT_TRUE(h.start().ok());
  auto ch = h.channel();
  EXPECT_EQ(check(ch, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(check(ch, api::kHealthServiceName), HealthCheckResponse::SERVING);

  h.health.set(false, {"kernel path detached"});
  EXPECT_TRUE(eventually([&] { return check(ch, "") == HealthCheckResponse::NOT_SERVING; }, 5s));
  EXPECT_EQ(check(ch, api::kHealthServiceName), HealthCheckResponse::NOT_SERVING);

  h.health.set(true);
  EXPECT_TRUE(eventually([&] { return check(ch, "") == HealthCheckResponse::SERVING; }, 5s));
}

TEST(ApiServerHealth, IsNotReReadWhileNothingChanges) {
  ServerHarness h;
  ASSERT_TRUE(h.start().ok());
  EXPECT_EQ(check(h.channel(), ""), HealthCheckResponse::SERVING);
  const int reads = h.health.reads();
  // Checks are answered from the last status; nothing wakes the health thread meanwhile.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(check(h.channel(), ""), HealthCheckResponse::SERVING);
  h.health.set_quietly(api::HealthReport{false, {"unannounced"}});
  EXPECT_FALSE(eventually([&] { return check(h.channel(), "") != HealthCheckResponse::SERVING; },
                          300ms));
  EXPECT_EQ(h.health.reads(), reads);
}

TEST(ApiServerHealth, AReportWithADeadlineIsReReadWhenItPasses) {
  ServerHarness h;
  h.health.set_quietly(api::HealthReport{true, {}, 100ms});
  ASSERT_TRUE(h.start().ok());
  // The deadline passes with no announcement: the health thread re-reads on its own.
  h.health.set_quietly(api::HealthReport{false, {"reconcile too old"}});
  EXPECT_TRUE(eventually([&] { return check(h.channel(), "") == HealthCheckResponse::NOT_SERVING; },
                         5s));
}

TEST(ApiServerHealth, RefreshHealthAppliesAtOnce) {
  // A refresh interval far beyond the test: only refresh_health() can change the status.
  ServerHarness h(api::ApiServerOptions{.health_refresh_interval = std::chrono::hours(1)});
  ASSERT_TRUE(h.start().ok());
  h.health.set_quietly(api::HealthReport{false, {"runtime unreachable"}});
  EXPECT_EQ(check(h.channel(), ""), HealthCheckResponse::SERVING);
  h.server->refresh_health();
  EXPECT_EQ(check(h.channel(), ""), HealthCheckResponse::NOT_SERVING);
}

TEST(ApiServerHealth, AWatchGetsTheStatusAndThenEachChange) {
  ServerHarness h;
  ASSERT_TRUE(h.start().ok());
  auto stub = grpc::health::v1::Health::NewStub(h.channel());
  HealthCheckRequest req;
  req.set_service(api::kHealthServiceName);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  h.health.set(false, {"kernel path detached"});
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  h.health.set(true);
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(ApiServerHealth, AnUnknownServiceIsNotFoundForCheckAndServiceUnknownForWatch) {
  ServerHarness h;
  ASSERT_TRUE(h.start().ok());
  auto stub = grpc::health::v1::Health::NewStub(h.channel());
  HealthCheckRequest req;
  req.set_service("no.such.Service");
  HealthCheckResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto reader = stub->Watch(&ctx, req);
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  ctx.TryCancel();
}

// A grpc.health Watch holds a server thread as long as a Watch of events does: both kinds share
// --max-watchers, so health watches cannot grow the daemon's threads without bound either.
TEST(ApiServerHealth, HealthWatchesCountAgainstTheStreamLimit) {
  ServerHarness h(api::ApiServerOptions{.max_watchers = 2});
  ASSERT_TRUE(h.start().ok());
  auto stub = grpc::health::v1::Health::NewStub(h.channel());
  struct HealthWatch {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
    HealthCheckResponse resp;
  };
  auto open = [&](HealthWatch& w) {
    w.ctx.set_deadline(std::chrono::system_clock::now() + 30s);
    w.reader = stub->Watch(&w.ctx, HealthCheckRequest{});
    return w.reader->Read(&w.resp);  // the first status: the stream holds its slot
  };
  HealthWatch a, b, c;
  ASSERT_TRUE(open(a));
  ASSERT_TRUE(open(b));
  EXPECT_FALSE(open(c));
  grpc::Status st = c.reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("too many streams (limit 2"), std::string::npos) << st.error_message();
  {
    WatchClient events(h.channel(), v1::WatchRequest{});
    EXPECT_EQ(events.finish(10s).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // A health watch that ends frees its slot (a new stream that finds every slot taken has the
  // open ones look whether their client is gone).
  a.ctx.TryCancel();
  while (a.reader->Read(&a.resp)) {
  }
  a.reader->Finish();
  EXPECT_TRUE(eventually([&] {
    HealthWatch d;
    const bool opened = open(d);
    d.ctx.TryCancel();
    while (d.reader->Read(&d.resp)) {
    }
    d.reader->Finish();
    return opened;
  }, 10s, 100ms));
  b.ctx.TryCancel();
}

TEST(ApiServerHealth, StoppingTheServerEndsAWatch) {
  ServerHarness h;
  ASSERT_TRUE(h.start().ok());
  auto stub = grpc::health::v1::Health::NewStub(h.channel());
  HealthCheckRequest req;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 30s);
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  const auto t0 = std::chrono::steady_clock::now();
  h.server->stop();
  while (reader->Read(&resp)) {
  }
  EXPECT_NE(reader->Finish().error_code(), grpc::StatusCode::OK);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// ---- TLS on loopback ----

class Certs {
 public:
  Certs() {
    const std::string d = dir_.path();
    // Two CAs: the real one, and a stranger whose client certificate must be refused.
    std::string script = R"(set -e
cd ")" + d + R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { key $1.key; openssl req -x509 -new -key $1.key -out $1.crt -days 2 -subj "/CN=$1" 2>/dev/null; }
leaf() {  # name ca ext [cn]
  key $1.key
  openssl req -new -key $1.key -out $1.csr -subj "/CN=${4:-$1}" 2>/dev/null
  printf '%s\n' "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -out $1.crt -days 2 -extfile $1.ext 2>/dev/null
}
ca ca
ca stranger
leaf server ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client ca "extendedKeyUsage=clientAuth"
leaf intruder stranger "extendedKeyUsage=clientAuth"
leaf other ca "extendedKeyUsage=clientAuth"
leaf agent ca "subjectAltName=DNS:node-agent.kpleg
extendedKeyUsage=clientAuth"
leaf impostor ca "subjectAltName=DNS:elsewhere.kpleg
extendedKeyUsage=clientAuth" node-agent.kpleg
leaf byip ca "subjectAltName=IP:10.1.2.3
extendedKeyUsage=clientAuth"
leaf workload ca "subjectAltName=URI:spiffe://kpleg/reader
extendedKeyUsage=clientAuth"
ca ca2
leaf server2 ca2 "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
)";
    std::ofstream(d + "/make.sh") << script;
    ok_ = std::system(("sh " + d + "/make.sh").c_str()) == 0;
  }
  bool ok() const { return ok_; }
  std::string file(const std::string& name) const { return dir_.path() + "/" + name; }
  // A server on a free loopback port with the "server" certificate, requiring certificates from
  // "ca".
  api::ApiServerOptions mutual_tls_server() const {
    return {.listen_address = "127.0.0.1:0",
            .tls_cert_file = file("server.crt"),
            .tls_key_file = file("server.key"),
            .tls_client_ca_file = file("ca.crt")};
  }
  // A client of the server at `addr` that trusts "ca" and presents `who`'s certificate.
  api::ClientOptions client(const std::string& addr, const std::string& who) const {
    return {.address = addr,
            .tls_ca_file = file("ca.crt"),
            .tls_cert_file = file(who + ".crt"),
            .tls_key_file = file(who + ".key")};
  }

 private:
  TempDir dir_;
  bool ok_ = false;
};

grpc::StatusCode stats_over(const api::ClientOptions& c) {
  auto ch = api::connect_channel(c);
  if (!ch) return grpc::StatusCode::INVALID_ARGUMENT;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::StatsResponse resp;
  return v1::PodLifecycle::NewStub(*ch)->Stats(&ctx, v1::StatsRequest{}, &resp).error_code();
}

TEST(ApiServerTls, ClientCertificateIsRequiredWhenAClientCaIsGiven) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/openssl", X_OK) == 0,
                        "openssl CLI not installed (Debian package openssl)");
  Certs certs;
  ASSERT_TRUE(certs.ok()) << "openssl failed to make the test certificates";
  ServerHarness h(certs.mutual_tls_server());
  auto st = h.start();
  ASSERT_TRUE(st.ok()) << st.error().message;
  const std::string addr = "127.0.0.1:" + std::to_string(h.server->tcp_port());

  api::ClientOptions with_cert{.address = addr,
                               .tls_ca_file = certs.file("ca.crt"),
                               .tls_cert_file = certs.file("client.crt"),
                               .tls_key_file = certs.file("client.key")};
  EXPECT_EQ(stats_over(with_cert), grpc::StatusCode::OK);

  api::ClientOptions without_cert{.address = addr, .tls_ca_file = certs.file("ca.crt")};
  EXPECT_EQ(stats_over(without_cert), grpc::StatusCode::UNAVAILABLE);

  api::ClientOptions foreign_cert = with_cert;
  foreign_cert.tls_cert_file = certs.file("intruder.crt");
  foreign_cert.tls_key_file = certs.file("intruder.key");
  EXPECT_EQ(stats_over(foreign_cert), grpc::StatusCode::UNAVAILABLE);

  api::ClientOptions plaintext{.address = addr, .insecure_tcp = true};
  EXPECT_EQ(stats_over(plaintext), grpc::StatusCode::UNAVAILABLE);

  api::ClientOptions untrusting{.address = addr,
                                .tls_ca_file = certs.file("stranger.crt"),
                                .tls_cert_file = certs.file("client.crt"),
                                .tls_key_file = certs.file("client.key")};
  EXPECT_EQ(stats_over(untrusting), grpc::StatusCode::UNAVAILABLE)
      << "the client verifies the server too";
}

TEST(ApiServerTls, OnlyAllowedClientIdentitiesGetIn) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/openssl", X_OK) == 0,
                        "openssl CLI not installed (Debian package openssl)");
  Certs certs;
  ASSERT_TRUE(certs.ok());
  api::ApiServerOptions o = certs.mutual_tls_server();
  o.tls_client_allow = {"node-agent.kpleg", "CN:client", "IP:10.1.2.3", "URI:spiffe://kpleg/reader"};
  ServerHarness h(o);
  auto st = h.start();
  ASSERT_TRUE(st.ok()) << st.error().message;
  const std::string addr = "127.0.0.1:" + std::to_string(h.server->tcp_port());
  auto as = [&](const std::string& who) { return certs.client(addr, who); };
  EXPECT_EQ(stats_over(as("client")), grpc::StatusCode::OK) << "allowed by CN:";
  EXPECT_EQ(stats_over(as("agent")), grpc::StatusCode::OK) << "allowed by subjectAltName DNS";
  EXPECT_EQ(stats_over(as("byip")), grpc::StatusCode::OK) << "allowed by subjectAltName IP";
  EXPECT_EQ(stats_over(as("workload")), grpc::StatusCode::OK) << "allowed by subjectAltName URI";
  // Signed by the trusted CA, but not an allowed identity.
  EXPECT_EQ(stats_over(as("other")), grpc::StatusCode::UNAUTHENTICATED);
  // Its common name is an allowed DNS name, but a name's kind counts, as for a Kubernetes client.
  EXPECT_EQ(stats_over(as("impostor")), grpc::StatusCode::UNAUTHENTICATED);
}

// One client holding its share of --max-watchers does not lock the others out: over TLS a client
// is its certificate's identity.
TEST(ApiServerTls, EachCertificateIdentityHoldsAtMostItsShareOfWatchers) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/openssl", X_OK) == 0,
                        "openssl CLI not installed (Debian package openssl)");
  Certs certs;
  ASSERT_TRUE(certs.ok());
  api::ApiServerOptions o = certs.mutual_tls_server();
  o.max_watchers = 4;
  o.max_watchers_per_client = 2;
  ServerHarness h(o);
  ASSERT_TRUE(h.start().ok());
  const std::string addr = "127.0.0.1:" + std::to_string(h.server->tcp_port());
  auto channel_as = [&](const std::string& who) {
    auto ch = api::connect_channel(certs.client(addr, who));
    EXPECT_TRUE(ch.ok());
    return *ch;
  };
  auto greedy = channel_as("client");
  WatchClient a(greedy, watch_from(0)), b(greedy, watch_from(0));
  ASSERT_TRUE(a.subscribed() && b.subscribed());
  WatchClient c(greedy, watch_from(0));
  EXPECT_FALSE(c.subscribed());
  grpc::Status st = c.finish(10s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("too many watchers from this client (certificate CN:client: "
                                    "limit 2, kplegd --max-watchers-per-client"),
            std::string::npos)
      << st.error_message();
  // Another identity on the same host still gets in.
  auto other = channel_as("agent");
  WatchClient d(other, watch_from(0));
  EXPECT_TRUE(d.subscribed()) << "one client locked another out";
}

TEST(ApiServerTls, RotatedCertificatesAreServedWithoutARestart) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/openssl", X_OK) == 0,
                        "openssl CLI not installed (Debian package openssl)");
  Certs certs;
  ASSERT_TRUE(certs.ok());
  TempDir live;
  const std::string cert = live.path() + "/tls.crt", key = live.path() + "/tls.key";
  std::filesystem::copy_file(certs.file("server.crt"), cert);
  std::filesystem::copy_file(certs.file("server.key"), key);
  api::ApiServerOptions o{.listen_address = "127.0.0.1:0", .tls_cert_file = cert, .tls_key_file = key};
  o.tls_no_client_auth = true;
  o.tls_reload_interval = 1s;
  ServerHarness h(o);
  ASSERT_TRUE(h.start().ok());
  const std::string addr = "127.0.0.1:" + std::to_string(h.server->tcp_port());
  const api::ClientOptions trusts_old{.address = addr, .tls_ca_file = certs.file("ca.crt")};
  const api::ClientOptions trusts_new{.address = addr, .tls_ca_file = certs.file("ca2.crt")};
  EXPECT_EQ(stats_over(trusts_old), grpc::StatusCode::OK);
  EXPECT_EQ(stats_over(trusts_new), grpc::StatusCode::UNAVAILABLE);

  // The certificate is renewed in place (by another CA, so the difference shows).
  std::filesystem::copy_file(certs.file("server2.key"), key,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(certs.file("server2.crt"), cert,
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_TRUE(eventually([&] { return stats_over(trusts_new) == grpc::StatusCode::OK; }, 20s, 200ms))
      << "the renewed certificate was never served";
  EXPECT_EQ(stats_over(trusts_old), grpc::StatusCode::UNAVAILABLE);
}

TEST(ApiServerTls, AllowListWithoutClientCaIsRefused) {
  api::ApiServerOptions o{.listen_address = "127.0.0.1:0", .tls_cert_file = "c", .tls_key_file = "k"};
  o.tls_client_allow = {"agent"};
  auto st = o.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("--tls-client-allow needs --tls-client-ca"), std::string::npos);
}

TEST(ApiServerTls, TlsWithoutClientCertificatesIsRefusedUnlessAskedFor) {
  api::ApiServerOptions o{.listen_address = "127.0.0.1:0", .tls_cert_file = "c", .tls_key_file = "k"};
  auto st = o.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("refusing TLS without client certificates on 127.0.0.1:0"),
            std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("--tls-no-client-auth"), std::string::npos);
  o.tls_no_client_auth = true;
  EXPECT_TRUE(o.validate().ok());
  o.tls_client_ca_file = "ca";
  st = o.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("--tls-no-client-auth contradicts --tls-client-ca"),
            std::string::npos);
  api::ApiServerOptions plain{.listen_address = "127.0.0.1:0", .insecure_tcp = true};
  plain.tls_no_client_auth = true;
  st = plain.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("--tls-no-client-auth needs --tls-cert"), std::string::npos);
}

TEST(ApiServerTls, ServerOnlyTlsAcceptsClientsWithoutCertificatesWhenAskedFor) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/openssl", X_OK) == 0,
                        "openssl CLI not installed (Debian package openssl)");
  Certs certs;
  ASSERT_TRUE(certs.ok());
  ServerHarness h(api::ApiServerOptions{.listen_address = "127.0.0.1:0",
                                        .tls_cert_file = certs.file("server.crt"),
                                        .tls_key_file = certs.file("server.key"),
                                        .tls_no_client_auth = true});
  ASSERT_TRUE(h.start().ok());
  const std::string addr = "127.0.0.1:" + std::to_string(h.server->tcp_port());
  EXPECT_EQ(stats_over({.address = addr, .tls_ca_file = certs.file("ca.crt")}),
            grpc::StatusCode::OK);
}

TEST(ApiServerTls, MissingCertificateFileIsAClearError) {
  ServerHarness h(api::ApiServerOptions{.listen_address = "127.0.0.1:0",
                                        .tls_cert_file = "/nonexistent/server.crt",
                                        .tls_key_file = "/nonexistent/server.key",
                                        .tls_no_client_auth = true});
  auto st = h.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("--tls-cert /nonexistent/server.crt: cannot read"),
            std::string::npos)
      << st.error().message;
}

}  // namespace
}  // namespace kpleg::apitest
