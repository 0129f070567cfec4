// The runtime event feed's subscription loop, against a scripted subscribe function: events are
// handed on, a stream that fails is subscribed again after a backoff, and a runtime without the
// stream (UNIMPLEMENTED) is asked again only when told it came back.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <grpcpp/support/status_code_enum.h>

#include "pleg/runtime_events.h"
#include "support/eventually.h"

namespace kpleg::pleg {
namespace {

using namespace std::chrono_literals;
using kpleg::testing::eventually;
namespace v1 = ::runtime::v1;

TEST(RuntimeEventsTest, EventsAreHandedOnAndAFailedStreamIsSubscribedAgain) {
  std::atomic<int> subscriptions{0}, events{0}, stopped{0};
  RuntimeEvents::Options o;
  o.retry_first = 10ms;
  o.retry_max = 20ms;
  RuntimeEvents feed(
      [&](cri::CancelToken&, const RuntimeEvents::OnEvent& on_event) -> Status {
        ++subscriptions;
        for (int i = 0; i < 3; ++i) {
          v1::ContainerEventResponse ev;
          ev.set_container_id("c" + std::to_string(i));
          on_event(ev);
        }
        return Error{grpc::StatusCode::UNAVAILABLE, "connection reset"};
      },
      [&](v1::ContainerEventResponse& ev) {
        EXPECT_EQ(ev.container_id().size(), 2u);
        ++events;
      },
      [&] { ++stopped; }, o);
  feed.start();
  ASSERT_TRUE(eventually([&] { return subscriptions >= 3; }));
  feed.stop();
  EXPECT_GE(events.load(), 9);
  EXPECT_GE(stopped.load(), 3) << "the tracker is told each time a stream ends";
  auto st = feed.stats();
  EXPECT_FALSE(st.unimplemented);
  EXPECT_EQ(st.last_error, "connection reset");
  EXPECT_GE(st.events, 9u);
}

TEST(RuntimeEventsTest, ARuntimeWithoutTheStreamIsAskedAgainOnlyAfterItCameBack) {
  std::atomic<int> subscriptions{0};
  RuntimeEvents::Options o;
  o.retry_first = 1ms;
  RuntimeEvents feed(
      [&](cri::CancelToken&, const RuntimeEvents::OnEvent&) -> Status {
        ++subscriptions;
        return Error{grpc::StatusCode::UNIMPLEMENTED, "unknown method GetContainerEvents"};
      },
      [](v1::ContainerEventResponse&) {}, [] {}, o);
  feed.start();
  ASSERT_TRUE(eventually([&] { return subscriptions == 1; }));
  EXPECT_FALSE(eventually([&] { return subscriptions > 1; }, 200ms)) << "asked again unprompted";
  EXPECT_TRUE(feed.stats().unimplemented);
  feed.retry_now();
  EXPECT_TRUE(eventually([&] { return subscriptions == 2; }));
  feed.stop();
}

// On an event loop: after an event that no signal waits for, the stream holds off (its next
// events are read together); while one waits, it does not; the reader function the tracker is
// given ends a hold (or reads what came, at once), and is taken back when the feed stops.
TEST(RuntimeEventsTest, OnALoopTheStreamHoldsOffAfterAnEventNoSignalWaitsFor) {
  struct FakeStream : cri::AsyncStatusCalls::Stream {
    FakeStream(std::atomic<int>& h, std::atomic<int>& r, std::atomic<int>& q)
        : holds(h), resumes(r), reads(q) {}
    void hold(std::chrono::steady_clock::time_point) override { ++holds; }
    void resume() override { ++resumes; }
    void read_queued() override { ++reads; }
    std::atomic<int>& holds;
    std::atomic<int>& resumes;
    std::atomic<int>& reads;
  };
  std::atomic<int> holds{0}, resumes{0}, reads{0}, events{0};
  std::atomic<bool> wanted{false};
  RuntimeEvents::OnEvent deliver;
  std::function<void(bool)> reader;
  EventLoop loop;
  loop.start("test-loop");
  RuntimeEvents::Options o;
  o.hold_off = 250ms;
  o.wanted = [&] { return wanted.load(); };
  o.set_reader = [&](std::function<void(bool)> f) { reader = std::move(f); };
  RuntimeEvents feed(
      loop,
      [&](RuntimeEvents::OnEvent on_event, std::function<void(Status)>)
          -> std::unique_ptr<cri::AsyncStatusCalls::Stream> {
        deliver = std::move(on_event);
        return std::make_unique<FakeStream>(holds, resumes, reads);
      },
      [&](v1::ContainerEventResponse&) { ++events; }, [] {}, o);
  feed.start();
  ASSERT_TRUE(eventually([&] { return loop.call([&] { return bool(deliver); }); }));
  v1::ContainerEventResponse ev;
  ev.set_container_id("c1");
  loop.call([&] { deliver(ev); });
  EXPECT_EQ(events.load(), 1);
  EXPECT_EQ(holds.load(), 1) << "an event no signal waits for: the stream holds off";
  wanted = true;
  loop.call([&] { deliver(ev); });
  EXPECT_EQ(holds.load(), 1) << "held off while a signal waits for its event";
  ASSERT_TRUE(loop.call([&] { return bool(reader); }));
  loop.call([&] { reader(false); });
  EXPECT_EQ(resumes.load(), 1);
  loop.call([&] { reader(true); });
  EXPECT_EQ(reads.load(), 1);
  feed.stop();
  EXPECT_FALSE(loop.call([&] { return bool(reader); })) << "the reader outlived the stream";
  loop.stop();
}

}  // namespace
}  // namespace kpleg::pleg
