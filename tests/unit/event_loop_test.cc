// The tracker's event loop (pleg/event_loop.h): timers run in their order and a cancelled one
// never runs nor wakes the loop, messages run in the order they were posted, call() answers
// from the loop (and at once on it), and a loop that stopped drops posts but still answers
// call()s on the caller's thread; it counts what woke it, by cause; a descriptor modified to no
// events wakes it for nothing; a timer with slack shares another cause's wakeup.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "pleg/event_loop.h"
#include "support/eventually.h"

namespace kpleg::pleg {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(EventLoopTest, TimersRunInTheirOrderAndACancelledOneNever) {
  EventLoop loop;
  loop.start("test-loop");
  std::vector<int> ran;
  std::atomic<bool> last{false};
  loop.call([&] {
    const auto now = Clock::now();
    loop.at(now + 30ms, [&] { ran.push_back(3); });
    loop.at(now + 10ms, [&] { ran.push_back(1); });
    const auto dropped = loop.at(now + 20ms, [&] { ran.push_back(2); });
    EXPECT_TRUE(loop.cancel(dropped));
    EXPECT_FALSE(loop.cancel(dropped));
    loop.at(now + 40ms, [&] { last = true; });
  });
  ASSERT_TRUE(testing::eventually([&] { return last.load(); }, 2s));
  EXPECT_EQ(loop.call([&] { return ran; }), (std::vector<int>{1, 3}));
  loop.stop();
}

TEST(EventLoopTest, ACancelledTimerDoesNotWakeTheLoop) {
  EventLoop loop;
  loop.start("test-loop");
  loop.call([&] {
    const auto id = loop.at(Clock::now() + 50ms, [] {});
    loop.cancel(id);
  });
  const auto before = loop.wakeups();
  // Past the cancelled timer's time: the loop has not woken.
  EXPECT_FALSE(testing::eventually([&] { return loop.wakeups() > before; }, 150ms));
  loop.stop();
}

// A timer with slack goes with the next wakeup the loop has for something else once it is due,
// and wakes the loop for itself only when its slack is over.
TEST(EventLoopTest, ATimerWithSlackRunsWithAnotherWakeupOrAtItsLatest) {
  EventLoop loop;
  loop.start("test-loop");
  std::atomic<bool> shared{false}, alone{false};
  loop.call([&] { loop.at(Clock::now() + 10ms, 10s, [&] { shared = true; }, "shared timer"); });
  // Past its time and short of its slack's end: it waits for a wakeup.
  EXPECT_FALSE(testing::eventually([&] { return shared.load(); }, 50ms));
  loop.post([] {});
  EXPECT_TRUE(testing::eventually([&] { return shared.load(); }, 2s));
  // Nothing else wakes the loop: this one runs when its slack is over, not before.
  Clock::time_point alone_due, alone_ran;
  loop.call([&] {
    alone_due = Clock::now() + 20ms;
    loop.at(alone_due, 300ms, [&] {
      alone_ran = Clock::now();
      alone = true;
    }, "lone timer");
  });
  ASSERT_TRUE(testing::eventually([&] { return alone.load(); }, 5s));
  EXPECT_GE(alone_ran - alone_due, 300ms);
  const auto woken_by = loop.call([&] { return loop.woken_by(); });
  EXPECT_EQ(woken_by.count("shared timer"), 0u);  // it ran with the message's wakeup
  EXPECT_EQ(woken_by.count("lone timer"), 1u);
  loop.stop();
}

// A timer with slack due before another that fired the timerfd runs with it, but the wakeup
// is the other's.
TEST(EventLoopTest, ATimerWakeupIsCountedForTheTimerTheTimerfdWasSetFor) {
  EventLoop loop;
  loop.start("test-loop");
  std::atomic<bool> waiting{false}, punctual{false};
  loop.call([&] {
    const auto now = Clock::now();
    loop.at(now + 10ms, 10s, [&] { waiting = true; }, "waiting timer");
    loop.at(now + 60ms, [&] { punctual = true; }, "punctual timer");
  });
  ASSERT_TRUE(testing::eventually([&] { return punctual.load(); }, 2s));
  EXPECT_TRUE(waiting.load()) << "due before it, it did not run with it";
  const auto woken_by = loop.call([&] { return loop.woken_by(); });
  EXPECT_EQ(woken_by.count("waiting timer"), 0u);
  EXPECT_EQ(woken_by.count("punctual timer"), 1u);
  loop.stop();
}

// The task set with set_first_at_wakeup runs first at every wakeup, whatever woke the loop: a
// ring buffer whose records do not all wake it is read before what they come before.
TEST(EventLoopTest, TheFirstAtWakeupRunsBeforeWhatWokeTheLoop) {
  EventLoop loop;
  std::vector<std::string> order;  // the loop's own
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC), 0);
  loop.set_first_at_wakeup([&] { order.push_back("first"); });
  loop.start("test-loop");
  loop.call([&] {
    loop.watch(pipe_fds[0], EPOLLIN, [&](uint32_t) {
      char c;
      while (read(pipe_fds[0], &c, 1) == 1) {
      }
      order.push_back("pipe");
    }, "the pipe");
    loop.at(Clock::now() + 5ms, [&] { order.push_back("timer"); }, "timer");
  });
  // (Each look is a message: a wakeup too, with a "first" of its own.)
  auto seen_once = [&](const char* what) {
    return loop.call([&] { return std::count(order.begin(), order.end(), what) == 1; });
  };
  ASSERT_TRUE(testing::eventually([&] { return seen_once("timer"); }, 2s));
  ASSERT_EQ(write(pipe_fds[1], "x", 1), 1);
  ASSERT_TRUE(testing::eventually([&] { return seen_once("pipe"); }, 2s));
  const auto seen = loop.call([&] { return order; });
  // Each of the timer and the pipe came right after a "first" of its own wakeup.
  for (const char* what : {"timer", "pipe"}) {
    const auto it = std::find(seen.begin(), seen.end(), what);
    ASSERT_NE(it, seen.end());
    ASSERT_NE(it, seen.begin());
    EXPECT_EQ(*(it - 1), "first") << what;
  }
  loop.call([&] { loop.unwatch(pipe_fds[0]); });
  loop.stop();
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(EventLoopTest, CountsWhatWokeItByCause) {
  EventLoop loop;
  loop.start("test-loop");
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC), 0);
  std::atomic<int> read_times{0};
  std::atomic<bool> first{false}, second{false};
  loop.call([&] {
    loop.watch(pipe_fds[0], EPOLLIN, [&](uint32_t) {
      char c;
      while (read(pipe_fds[0], &c, 1) == 1) {
      }
      ++read_times;
    }, "the pipe");
    const auto now = Clock::now();
    loop.at(now + 10ms, [&] { first = true; }, "first timer");
    // Due with the first: the same wakeup, counted once, under the first timer's name.
    loop.at(now + 10ms, [&] { second = true; }, "second timer");
  });
  ASSERT_TRUE(testing::eventually([&] { return second.load(); }, 2s));
  ASSERT_EQ(write(pipe_fds[1], "x", 1), 1);
  ASSERT_TRUE(testing::eventually([&] { return read_times.load() == 1; }, 2s));
  const auto woken_by = loop.call([&] { return loop.woken_by(); });  // a message itself
  EXPECT_EQ(woken_by.count("first timer"), 1u);
  EXPECT_EQ(woken_by.count("second timer"), 0u);
  EXPECT_EQ(woken_by.at("first timer"), 1u);
  EXPECT_EQ(woken_by.at("the pipe"), 1u);
  EXPECT_GE(woken_by.at("message"), 1u);  // the call()s
  loop.call([&] { loop.unwatch(pipe_fds[0]); });
  loop.stop();
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(EventLoopTest, MessagesRunInOrderOnTheLoopAndCallRunsAtOnceOnIt) {
  EventLoop loop;
  loop.start("test-loop");
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) loop.post([&, i] { seen.push_back(i); });
  const auto all = loop.call([&] {
    EXPECT_TRUE(loop.in_loop());
    return loop.call([&] { return seen.size(); });  // on the loop: at once, no deadlock
  });
  EXPECT_EQ(all, 1000u);
  EXPECT_FALSE(loop.in_loop());
  loop.stop();
}

TEST(EventLoopTest, ADescriptorIsReadOnTheLoop) {
  EventLoop loop;
  loop.start("test-loop");
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::atomic<int> reads{0};
  loop.call([&] {
    loop.watch(fd, EPOLLIN, [&](uint32_t) {
      uint64_t v;
      (void)!read(fd, &v, sizeof v);
      ++reads;
    });
  });
  const uint64_t one = 1;
  (void)!write(fd, &one, sizeof one);
  ASSERT_TRUE(testing::eventually([&] { return reads.load() == 1; }, 2s));
  loop.call([&] { loop.unwatch(fd); });
  loop.stop();
  close(fd);
}

// The times a thread slept and was woken (its voluntary context switches).
uint64_t voluntary_switches(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
      return std::stoull(line.substr(line.find(':') + 1));
  return 0;
}

// A descriptor modified to no events wakes the loop's thread for nothing: not even an inotify
// descriptor, whose wakeups say nothing of what they are for (so epoll cannot filter them: kept
// in the epoll set with no events, every event queued woke epoll_wait, which slept again
// without returning: a wakeup no count of the loop saw). Modified back, it is read as before.
TEST(EventLoopTest, ADescriptorWithNoEventsDoesNotWakeTheLoop) {
  char tmpl[] = "/tmp/kpleg-event-loop-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_GE(inotify_add_watch(fd, dir.c_str(), IN_DELETE), 0);
  EventLoop loop;
  loop.start("test-loop");
  std::atomic<int> reads{0};
  const pid_t tid = loop.call([&] {
    loop.watch(fd, EPOLLIN, [&](uint32_t) {
      char buf[4096];
      while (read(fd, buf, sizeof buf) > 0) {
      }
      ++reads;
    });
    loop.modify(fd, 0);
    return static_cast<pid_t>(syscall(SYS_gettid));
  });
  // Asleep in epoll_wait once the call's answer is taken.
  ASSERT_TRUE(testing::eventually([&] {
    const uint64_t v = voluntary_switches(tid);
    std::this_thread::sleep_for(20ms);
    return voluntary_switches(tid) == v;
  }));
  const uint64_t before = voluntary_switches(tid);
  for (int i = 0; i < 10; ++i) {
    const std::string f = dir + "/" + std::to_string(i);
    ASSERT_EQ(mkdir(f.c_str(), 0700), 0);
    ASSERT_EQ(rmdir(f.c_str()), 0);
    std::this_thread::sleep_for(5ms);  // each its own wakeup, were it one
  }
  EXPECT_FALSE(testing::eventually([&] { return voluntary_switches(tid) > before; }, 200ms))
      << voluntary_switches(tid) - before << " wakeups of the loop for a descriptor with no events";
  EXPECT_EQ(reads.load(), 0);
  loop.call([&] { loop.modify(fd, EPOLLIN); });
  EXPECT_TRUE(testing::eventually([&] { return reads.load() == 1; }, 2s))
      << "what came meanwhile was not read once modified back";
  loop.call([&] { loop.unwatch(fd); });
  loop.stop();
  close(fd);
  rmdir(dir.c_str());
}

TEST(EventLoopTest, AfterStopPostsAreDroppedAndCallsRunOnTheCaller) {
  EventLoop loop;
  loop.start("test-loop");
  std::atomic<int> before{0};
  loop.post([&] { ++before; });
  loop.stop();
  EXPECT_EQ(before.load(), 1) << "what was posted before stop() runs";
  bool ran = false;
  loop.post([&] { ran = true; });
  EXPECT_EQ(loop.call([&] { return 7; }), 7);
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace kpleg::pleg
