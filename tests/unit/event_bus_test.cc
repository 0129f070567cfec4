#include "bus/event_bus.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::bus {
namespace {

using namespace std::chrono_literals;
using pleg::EventType;
using pleg::PodLifecycleEvent;

PodLifecycleEvent started(const std::string& pod_uid, const std::string& ns = "default",
                          const std::string& container = "app") {
  PodLifecycleEvent ev;
  ev.type = EventType::kContainerStarted;
  ev.pod_uid = pod_uid;
  ev.pod_name = "pod-" + pod_uid;
  ev.pod_namespace = ns;
  ev.container_id = "cid-" + container;
  ev.container_name = container;
  return ev;
}

// Takes every event available within `idle` of the previous one.
std::vector<EventPtr> drain(Subscription& sub, std::chrono::milliseconds idle = 50ms) {
  std::vector<EventPtr> out;
  for (;;) {
    auto n = sub.next(idle);
    if (n.status != Subscription::Status::kEvent) return out;
    out.push_back(n.event);
  }
}

std::vector<uint64_t> seqs(const std::vector<EventPtr>& evs) {
  std::vector<uint64_t> out;
  for (const auto& e : evs) out.push_back(e->seq);
  return out;
}

std::vector<uint64_t> range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

TEST(EventBus, AssignsSequenceNumbersFromOneInPublishOrder) {
  EventBus bus;
  EXPECT_EQ(bus.last_seq(), 0u);
  auto sub = bus.subscribe(0);
  for (int i = 0; i < 5; ++i) bus.publish(started("p" + std::to_string(i)));
  auto got = drain(sub);
  ASSERT_EQ(seqs(got), range(1, 5));
  EXPECT_EQ(got[3]->pod_uid, "p3");
  EXPECT_GT(got[0]->emit_ts_ns, 0u) << "publish stamps emit time when the producer did not";
  EXPECT_EQ(bus.last_seq(), 5u);
}

TEST(EventBus, KeepsTheProducersEmitTime) {
  EventBus bus;
  auto sub = bus.subscribe(0);
  auto ev = started("p");
  ev.emit_ts_ns = 42;
  bus.publish(ev);
  auto n = sub.next(1s);
  ASSERT_EQ(n.status, Subscription::Status::kEvent);
  EXPECT_EQ(n.event->emit_ts_ns, 42u);
}

TEST(EventBus, FromSeqZeroGetsOnlyNewEvents) {
  EventBus bus;
  for (int i = 0; i < 3; ++i) bus.publish(started("old"));
  auto sub = bus.subscribe(0);
  EXPECT_EQ(sub.next(20ms).status, Subscription::Status::kTimeout);
  bus.publish(started("new"));
  auto got = drain(sub);
  ASSERT_EQ(seqs(got), std::vector<uint64_t>{4});
  EXPECT_EQ(got[0]->pod_uid, "new");
}

TEST(EventBus, FromTheOldestRetainedGetsTheWholeHistoryThenLiveEvents) {
  EventBusOptions o;
  o.history_capacity = 4;
  EventBus bus(o);
  auto empty = bus.subscribe(kOldestRetained);
  for (int i = 0; i < 6; ++i) bus.publish(started("p" + std::to_string(i)));
  EXPECT_EQ(seqs(drain(empty)), range(1, 6)) << "an empty history: live events only";
  auto sub = bus.subscribe(kOldestRetained);
  EXPECT_EQ(sub.backlog(), 4u);
  bus.publish(started("p"));
  auto got = drain(sub);
  EXPECT_EQ(seqs(got), range(3, 7)) << "no RESYNC: the history is all there is";
}

TEST(EventBus, ResumeFromSeqGetsExactlyTheEventsAfterIt) {
  EventBus bus;
  for (int i = 0; i < 10; ++i) bus.publish(started("p"));
  auto sub = bus.subscribe(4);
  EXPECT_EQ(sub.backlog(), 6u);
  bus.publish(started("p"));
  EXPECT_EQ(seqs(drain(sub)), range(5, 11));
}

TEST(EventBus, ResumeFromTheLastSeqGetsOnlyNewEvents) {
  EventBus bus;
  for (int i = 0; i < 3; ++i) bus.publish(started("p"));
  auto sub = bus.subscribe(3);
  EXPECT_EQ(sub.next(20ms).status, Subscription::Status::kTimeout);
  bus.publish(started("p"));
  EXPECT_EQ(seqs(drain(sub)), std::vector<uint64_t>{4});
}

TEST(EventBus, PositionOlderThanTheHistoryGetsResyncFirst) {
  EventBus bus(EventBusOptions{.history_capacity = 5});
  for (int i = 0; i < 20; ++i) bus.publish(started("p"));
  EXPECT_EQ(bus.stats().oldest_retained_seq, 16u);

  auto sub = bus.subscribe(3);
  auto got = drain(sub);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[0]->type, EventType::kResync);
  EXPECT_EQ(got[0]->seq, 15u) << "RESYNC says after which seq the stream continues";
  EXPECT_NE(got[0]->reason.find("events 4..15 are no longer retained"), std::string::npos)
      << got[0]->reason;
  EXPECT_EQ(seqs({got.begin() + 1, got.end()}), range(16, 20));
}

TEST(EventBus, PositionJustBeforeTheOldestRetainedIsNoGap) {
  EventBus bus(EventBusOptions{.history_capacity = 5});
  for (int i = 0; i < 20; ++i) bus.publish(started("p"));
  auto sub = bus.subscribe(15);
  auto got = drain(sub);
  EXPECT_EQ(seqs(got), range(16, 20));
  for (const auto& e : got) EXPECT_NE(e->type, EventType::kResync);
}

TEST(EventBus, PositionBeyondTheStreamGetsResyncThenLiveEvents) {
  EventBus bus;
  for (int i = 0; i < 3; ++i) bus.publish(started("p"));
  // e.g. a consumer that watched a previous daemon instance up to seq 500
  auto sub = bus.subscribe(500);
  bus.publish(started("p"));
  auto got = drain(sub);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]->type, EventType::kResync);
  EXPECT_EQ(got[0]->seq, 3u);
  EXPECT_NE(got[0]->reason.find("seq 500 is not in this event stream"), std::string::npos);
  EXPECT_EQ(got[1]->seq, 4u);
}

TEST(EventBus, UnknownPositionGetsResync) {
  EventBus bus;
  bus.publish(started("p"));
  auto sub = bus.subscribe(kUnknownPosition);
  auto got = drain(sub);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]->type, EventType::kResync);
  EXPECT_EQ(got[0]->seq, 1u);
}

TEST(EventBus, ResyncOnAnEmptyStream) {
  EventBus bus;
  auto sub = bus.subscribe(7);
  auto got = drain(sub);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]->type, EventType::kResync);
  EXPECT_EQ(got[0]->seq, 0u);
}

TEST(EventBus, FiltersByPodUidAndNamespaceButAlwaysDeliversResync) {
  EventBus bus(EventBusOptions{.history_capacity = 2});
  for (int i = 0; i < 5; ++i) bus.publish(started("old"));  // history now holds 4..5
  auto by_uid = bus.subscribe(1, EventFilter{.pod_uid = "a"});
  auto by_ns = bus.subscribe(0, EventFilter{.pod_namespace = "kube-system"});
  bus.publish(started("a", "default"));
  bus.publish(started("b", "kube-system"));
  bus.publish(started("a", "kube-system"));

  auto uid_events = drain(by_uid);
  ASSERT_EQ(uid_events.size(), 3u);
  EXPECT_EQ(uid_events[0]->type, EventType::kResync);
  EXPECT_EQ(uid_events[1]->seq, 6u);
  EXPECT_EQ(uid_events[2]->seq, 8u);

  EXPECT_EQ(seqs(drain(by_ns)), (std::vector<uint64_t>{7, 8}));
}

TEST(EventBus, SubscriberWithAFullQueueIsCutOffAndOthersAreNot) {
  EventBus bus;
  auto slow = bus.subscribe(0, {}, 3);
  auto reader = bus.subscribe(0, {}, 3);
  EXPECT_EQ(bus.stats().subscribers, 2u);
  for (int i = 0; i < 3; ++i) bus.publish(started("p"));
  EXPECT_EQ(slow.queued(), 3u);
  EXPECT_EQ(seqs(drain(reader)), range(1, 3));
  EXPECT_FALSE(slow.closed());

  bus.publish(started("p"));  // the fourth does not fit in slow's queue
  EXPECT_TRUE(slow.closed());
  EXPECT_TRUE(slow.cut_off());
  EXPECT_EQ(slow.close_reason(), "subscriber too slow: queue of 3 events full");
  EXPECT_EQ(slow.queued(), 0u) << "a cut-off subscriber's queue is released at once";
  EXPECT_EQ(slow.next(1s).status, Subscription::Status::kClosed);

  EXPECT_EQ(seqs(drain(reader)), std::vector<uint64_t>{4});
  EXPECT_FALSE(reader.closed());
  auto st = bus.stats();
  EXPECT_EQ(st.subscribers, 1u);
  EXPECT_EQ(st.subscribers_cut_off, 1u);
  EXPECT_EQ(st.discarded_events, 4u);
}

TEST(EventBus, InitialBacklogDoesNotCountAgainstTheQueue) {
  EventBus bus(EventBusOptions{.history_capacity = 100});
  for (int i = 0; i < 50; ++i) bus.publish(started("p"));
  auto sub = bus.subscribe(1, {}, 2);
  bus.publish(started("p"));
  bus.publish(started("p"));
  EXPECT_FALSE(sub.closed());
  EXPECT_EQ(seqs(drain(sub)), range(2, 52));
}

TEST(EventBus, BurstWithANeverReadingSubscriberKeepsMemoryBoundedAndTheReaderWhole) {
  constexpr uint64_t kBurst = 100'000;
  EventBus bus;  // defaults: history 10,000, queues 1,000
  auto stuck = bus.subscribe(0);
  // The reader's queue can hold the whole burst, so that the test does not depend on the
  // scheduler letting it keep pace; what matters is that the stuck one never slows it down.
  auto reader = bus.subscribe(0, {}, kBurst);

  std::vector<uint64_t> got;
  got.reserve(kBurst);
  std::thread reading([&] {
    while (got.size() < kBurst) {
      auto n = reader.next(5s);
      if (n.status != Subscription::Status::kEvent) return;
      got.push_back(n.event->seq);
    }
  });

  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < kBurst; ++i) bus.publish(started("p" + std::to_string(i % 100)));
  auto publish_time = std::chrono::steady_clock::now() - t0;
  reading.join();

  EXPECT_TRUE(stuck.cut_off());
  EXPECT_EQ(stuck.close_reason(), "subscriber too slow: queue of 1000 events full");
  EXPECT_EQ(stuck.max_queued(), 1000u) << "the stuck queue never exceeds its capacity";
  EXPECT_EQ(stuck.queued(), 0u);

  ASSERT_EQ(got.size(), kBurst);
  for (uint64_t i = 0; i < kBurst; ++i) ASSERT_EQ(got[i], i + 1) << "at index " << i;
  EXPECT_FALSE(reader.closed());

  auto st = bus.stats();
  EXPECT_EQ(st.history_size, kDefaultHistoryCapacity);
  EXPECT_EQ(st.oldest_retained_seq, kBurst - kDefaultHistoryCapacity + 1);
  EXPECT_EQ(st.subscribers_cut_off, 1u);
  std::printf("published %llu events in %.1f ms\n", static_cast<unsigned long long>(kBurst),
              std::chrono::duration<double, std::milli>(publish_time).count());
}

TEST(EventBus, ConcurrentPublishersGetUniqueIncreasingSequenceNumbers) {
  constexpr int kThreads = 4, kPerThread = 10'000;
  EventBus bus;
  auto sub = bus.subscribe(0, {}, kThreads * kPerThread);
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t)
    producers.emplace_back([&bus, t] {
      for (int i = 0; i < kPerThread; ++i) bus.publish(started("t" + std::to_string(t)));
    });
  for (auto& p : producers) p.join();
  EXPECT_EQ(seqs(drain(sub, 10ms)), range(1, kThreads * kPerThread));
}

TEST(EventBus, CancelWakesABlockedReaderPromptly) {
  EventBus bus;
  auto sub = bus.subscribe(0);
  std::atomic<bool> returned{false};
  Subscription::Status status = Subscription::Status::kEvent;
  auto t0 = std::chrono::steady_clock::now();
  std::thread blocked([&] {
    status = sub.next(30s).status;
    returned = true;
  });
  // Cancel only once the reader is (very likely) waiting; correctness does not depend on it.
  while (std::chrono::steady_clock::now() - t0 < 20ms) std::this_thread::yield();
  sub.cancel();
  blocked.join();
  EXPECT_EQ(status, Subscription::Status::kClosed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(sub.close_reason(), "cancelled");
  EXPECT_FALSE(sub.cut_off());
  EXPECT_EQ(bus.stats().subscribers, 0u);
}

TEST(EventBus, WakeMakesABlockedReaderReturnATimeoutOnce) {
  EventBus bus;
  auto sub = bus.subscribe(0);
  Subscription::Status status = Subscription::Status::kEvent;
  auto t0 = std::chrono::steady_clock::now();
  std::thread blocked([&] { status = sub.next(30s).status; });
  while (std::chrono::steady_clock::now() - t0 < 20ms) std::this_thread::yield();
  sub.wake();
  blocked.join();
  EXPECT_EQ(status, Subscription::Status::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_FALSE(sub.closed());
  // The wake is used up: the next wait is a full one, and events still come.
  EXPECT_EQ(sub.next(20ms).status, Subscription::Status::kTimeout);
  bus.publish(started("a"));
  auto n = sub.next(1s);
  ASSERT_EQ(n.status, Subscription::Status::kEvent);
  EXPECT_EQ(n.event->seq, 1u);
}

TEST(EventBus, DestroyingASubscriptionUnsubscribes) {
  EventBus bus;
  {
    auto a = bus.subscribe(0);
    auto b = std::move(a);
    EXPECT_EQ(bus.stats().subscribers, 1u);
  }
  EXPECT_EQ(bus.stats().subscribers, 0u);
  bus.publish(started("p"));  // must not touch the destroyed subscriber
  EXPECT_EQ(bus.stats().subscribers, 0u);
}

TEST(EventBus, CloseEndsEverySubscriptionWithTheReason) {
  EventBus bus;
  auto a = bus.subscribe(0);
  bus.close("kplegd is shutting down");
  EXPECT_EQ(a.next(1s).status, Subscription::Status::kClosed);
  EXPECT_EQ(a.close_reason(), "kplegd is shutting down");
  auto late = bus.subscribe(0);
  EXPECT_TRUE(late.closed());
  EXPECT_EQ(late.close_reason(), "kplegd is shutting down");
  bus.publish(started("p"));
  EXPECT_EQ(bus.last_seq(), 1u);
}

TEST(EventBus, WithSeqRunsUnderThePublishLock) {
  uint64_t hook_count = 0;  // written only by on_publish, i.e. under the publish lock
  EventBus bus(EventBusOptions{.on_publish = [&](const PodLifecycleEvent& ev) {
    ++hook_count;
    EXPECT_EQ(ev.seq, hook_count);
  }});
  std::atomic<bool> stop{false};
  std::vector<std::thread> producers;
  for (int t = 0; t < 2; ++t)
    producers.emplace_back([&] {
      while (!stop) bus.publish(started("p"));
    });
  int checked = 0;
  for (int i = 0; i < 2000; ++i) {
    auto [seq, seen] = bus.with_seq([&] { return hook_count; });
    ASSERT_EQ(seq, seen) << "a snapshot taken in with_seq is consistent with its seq";
    ++checked;
  }
  uint64_t void_seq = bus.with_seq([] {});
  stop = true;
  for (auto& p : producers) p.join();
  EXPECT_EQ(checked, 2000);
  EXPECT_LE(void_seq, bus.last_seq());
}

TEST(EventBus, InstanceIdsDiffer) {
  EventBus a, b;
  EXPECT_EQ(a.instance_id().size(), 32u);
  EXPECT_NE(a.instance_id(), b.instance_id());
}

}  // namespace
// on_ready is how a writer on the publishing thread learns there is something to take: once when
// an event arrives for a subscription with nothing waiting (not again until it took them), when
// it is cut off, and when the bus closes it; never for its own cancel. It runs with the bus's
// lock released: it may take events, and the bus can be used meanwhile from other threads.
TEST(EventBus, OnReadyTellsAWriterWhenThereIsSomethingToTake) {
  EventBus bus(EventBusOptions{.default_queue_capacity = 3});
  int told = 0;
  Subscription* self = nullptr;
  std::vector<uint64_t> taken;
  bool take = false;
  Subscription sub = bus.subscribe(0, {}, 0, [&] {
    ++told;
    EXPECT_GE(bus.last_seq(), 1u);  // would deadlock if the bus's lock were held
    if (!take || self == nullptr) return;
    for (auto n = self->try_next(); n.status == Subscription::Status::kEvent; n = self->try_next())
      taken.push_back(n.event->seq);
  });
  self = &sub;
  EXPECT_EQ(sub.try_next().status, Subscription::Status::kTimeout) << "try_next never waits";

  bus.publish(started("a"));
  bus.publish(started("a"));
  EXPECT_EQ(told, 1) << "told once while events wait";
  EXPECT_EQ(sub.try_next().event->seq, 1u);
  EXPECT_EQ(sub.try_next().event->seq, 2u);
  take = true;
  bus.publish(started("a"));
  EXPECT_EQ(told, 2) << "told again once it took them";
  EXPECT_EQ(taken, (std::vector<uint64_t>{3}));

  take = false;
  for (int i = 0; i < 4; ++i) bus.publish(started("a"));  // the 4th overflows the queue of 3
  EXPECT_EQ(told, 4) << "told of the first event and of the cut-off";
  EXPECT_TRUE(sub.cut_off());
  EXPECT_EQ(sub.try_next().status, Subscription::Status::kClosed);

  int other_told = 0;
  Subscription other = bus.subscribe(0, {}, 0, [&] { ++other_told; });
  Subscription cancelled = bus.subscribe(0, {}, 0, [&] { ADD_FAILURE() << "told of its own cancel"; });
  cancelled.cancel();
  bus.close("stopping");
  EXPECT_EQ(other_told, 1) << "told that the bus closed it";
  EXPECT_EQ(other.close_reason(), "stopping");
}

}  // namespace kpleg::bus
