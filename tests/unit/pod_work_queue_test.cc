// PodWorkQueue: one pod's tasks one at a time and in order, pods in parallel, delayed tasks
// neither early nor holding back ready ones, and a delayed task is still run on time while the
// worker that was waiting for it is busy with another pod's task.
#include "pleg/pod_work_queue.h"

#include "common/thread_name.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <cstdio>
#include <vector>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>

namespace kpleg::pleg {
namespace {

using namespace std::chrono_literals;
using Clock = PodWorkQueue::Clock;

// A one-shot flag that tasks and the test wait on, with a deadline.
class Latch {
 public:
  void open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return open_; });
  }
  bool is_open() {
    std::lock_guard lk(mu_);
    return open_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Occupies one of the queue's workers with a task of pod "hung" until released (or 10 s).
// The latches are shared with the task, which may still be returning from its wait when the
// test is done with them.
class HungPod {
 public:
  explicit HungPod(PodWorkQueue& q) : s_(std::make_shared<State>()) {
    q.post("hung", [s = s_] {
      s->started.open();
      s->release.wait(10s);
    });
  }
  ~HungPod() { release(); }
  bool wait_started() { return s_->started.wait(); }
  void release() { s_->release.open(); }

 private:
  struct State {
    Latch started, release;
  };
  std::shared_ptr<State> s_;
};

TEST(PodWorkQueue, OnePodsTasksRunOneAtATimeInOrder) {
  PodWorkQueue q(4);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> in_flight{0};
  std::atomic<bool> overlapped{false};
  Latch done;
  constexpr int kTasks = 50;
  for (int i = 0; i < kTasks; ++i) {
    q.post("pod-a", [&, i] {
      if (++in_flight > 1) overlapped = true;
      {
        std::lock_guard lk(mu);
        order.push_back(i);
        if (order.size() == kTasks) done.open();
      }
      --in_flight;
    });
  }
  ASSERT_TRUE(done.wait());
  q.stop();  // the last task may still be returning: let it finish before the locals go
  EXPECT_FALSE(overlapped.load());
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(order[i], i);
}

TEST(PodWorkQueue, AHungPodHoldsOneWorkerAndOtherPodsGoOn) {
  PodWorkQueue q(2);
  HungPod hung(q);
  ASSERT_TRUE(hung.wait_started());
  std::atomic<int> ran{0};
  Latch all;
  for (int i = 0; i < 10; ++i) {
    q.post("pod-" + std::to_string(i), [&] {
      if (++ran == 10) all.open();
    });
  }
  EXPECT_TRUE(all.wait()) << ran.load() << " of 10 ran while one pod was hung";
  hung.release();
  q.stop();
}

TEST(PodWorkQueue, WorkersAreNamed) {
  PodWorkQueue q(1);
  Latch ran;
  std::string name;
  q.post("pod-a", [&] {
    name = thread_name();
    ran.open();
  });
  ASSERT_TRUE(ran.wait());
  EXPECT_EQ(name, "kpleg-work");
  q.stop();
}

TEST(PodWorkQueue, DelayedTasksRunNotBeforeTheirTimeAndDoNotHoldBackReadyOnes) {
  PodWorkQueue q(2);
  Latch delayed_ran, ready_ran;
  const auto not_before = Clock::now() + 2s;
  Clock::time_point ran_at{};
  std::atomic<bool> delayed_first{false};
  q.post(
      "pod-a",
      [&] {
        ran_at = Clock::now();
        delayed_ran.open();
      },
      not_before);
  // Judged when the ready task runs, not when the test thread gets to look.
  q.post("pod-a", [&] {
    delayed_first = delayed_ran.is_open();
    ready_ran.open();
  });
  ASSERT_TRUE(ready_ran.wait());
  EXPECT_FALSE(delayed_first.load()) << "the ready task waited for the delayed one";
  ASSERT_TRUE(delayed_ran.wait());
  q.stop();
  EXPECT_GE(ran_at, not_before);
}

TEST(PodWorkQueue, ADelayedTaskRunsWhileTheWorkerThatWaitedForItIsBusy) {
  // Three workers: one held by a hung pod, one that will be held by the first delayed task,
  // and one left to run the second delayed task. The first task does not return until the
  // second has run, so the second must not wait for the first worker to come back.
  PodWorkQueue q(3);
  HungPod hung(q);
  ASSERT_TRUE(hung.wait_started());
  Latch second_ran;
  std::atomic<bool> first_saw_second{false};
  const auto t0 = Clock::now();
  q.post(
      "pod-1", [&] { first_saw_second = second_ran.wait(5s); }, t0 + 50ms);
  q.post(
      "pod-2", [&] { second_ran.open(); }, t0 + 150ms);
  // Many more delayed tasks of other pods, due one after another.
  std::atomic<int> more{0};
  Latch all_more;
  for (int i = 0; i < 20; ++i) {
    q.post(
        "more-" + std::to_string(i),
        [&] {
          if (++more == 20) all_more.open();
        },
        t0 + 200ms + i * 10ms);
  }
  EXPECT_TRUE(second_ran.wait(5s)) << "the second delayed task waited for a busy worker";
  EXPECT_TRUE(all_more.wait(5s)) << more.load() << " of 20 later delayed tasks ran";
  hung.release();
  q.stop();  // waits for the running tasks, pod-1's included
  EXPECT_TRUE(first_saw_second.load()) << "the first delayed task never saw the second run";
}

// Times the threads named kpleg-work (the queue's workers, in this process only) went to sleep
// and were woken: their voluntary context switches.
uint64_t worker_wakeups() {
  uint64_t total = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "kpleg-work") continue;
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
        total += std::stoull(line.substr(line.find(':') + 1));
    }
  }
  closedir(d);
  return total;
}

// A delayed task costs one wakeup of one worker, when it is due: posting it wakes nobody,
// and no other worker wakes to wait in its place. (Each one cost three or four wakeups with one
// worker waiting out the earliest time on a condition variable.)
TEST(PodWorkQueue, ADelayedTaskWakesOneWorkerOnceWhenItIsDue) {
  PodWorkQueue q(4);
  constexpr int kTasks = 40;
  std::atomic<int> ran{0};
  Latch all;
  // The workers have started (a worker that goes to sleep only now adds one wakeup at most).
  Latch warm;
  q.post("warm", [&] { warm.open(); });
  ASSERT_TRUE(warm.wait());
  const uint64_t before = worker_wakeups();
  const auto start = Clock::now() + 20ms;
  for (int i = 0; i < kTasks; ++i) {
    q.post("pod-" + std::to_string(i), [&] {
      if (++ran == kTasks) all.open();
    }, start + i * 4ms);
  }
  ASSERT_TRUE(all.wait());
  const uint64_t wakeups = worker_wakeups() - before;
  RecordProperty("wakeups", std::to_string(wakeups));
  std::printf("%llu wakeups for %d delayed tasks\n", (unsigned long long)wakeups, kTasks);
  EXPECT_LE(wakeups, uint64_t(kTasks * 3 / 2)) << wakeups << " wakeups for " << kTasks << " tasks";
  EXPECT_GE(wakeups, uint64_t(kTasks / 2)) << "the count does not see the workers";
  q.stop();
}

// A cancelled task never runs and, delayed, wakes nobody: the timer set for it moves to the
// next task. (A look a later signal made pointless was a wakeup for nothing.)
TEST(PodWorkQueue, ACancelledTaskNeverRunsAndWakesNobody) {
  PodWorkQueue q(4);
  constexpr int kTasks = 20;
  std::atomic<int> ran{0}, cancelled_ran{0};
  Latch warm;
  q.post("warm", [&] { warm.open(); });
  ASSERT_TRUE(warm.wait());
  const uint64_t before = worker_wakeups();
  for (int i = 0; i < kTasks; ++i) {
    const std::string pod = "pod-" + std::to_string(i);
    // The twin is the earliest task when it is posted, so the timer is set for it; dropped, the
    // timer must move on to the task due after it.
    const auto now = Clock::now();
    Latch round;
    const PodWorkQueue::Ticket twin = q.post(pod, [&] { ++cancelled_ran; }, now + 3ms);
    q.post(pod, [&] {
      ++ran;
      round.open();
    }, now + 6ms);
    EXPECT_TRUE(q.cancel(twin));
    EXPECT_FALSE(q.cancel(twin)) << "dropped once";
    ASSERT_TRUE(round.wait());
  }
  const uint64_t wakeups = worker_wakeups() - before;
  std::printf("%llu wakeups for %d tasks and %d cancelled ones\n", (unsigned long long)wakeups,
              kTasks, kTasks);
  EXPECT_EQ(cancelled_ran.load(), 0);
  EXPECT_LE(wakeups, uint64_t(kTasks * 3 / 2)) << "the cancelled tasks woke workers";
  // A task that ran (or is unknown) is not cancelled.
  Latch done;
  const PodWorkQueue::Ticket t = q.post("pod-x", [&] { done.open(); });
  ASSERT_TRUE(done.wait());
  EXPECT_FALSE(q.cancel(t));
  EXPECT_FALSE(q.cancel({Clock::now(), 12345}));
  EXPECT_FALSE(q.cancel({})) << "a default ticket names no task";
  q.stop();
}

TEST(PodWorkQueue, StopDropsPendingTasksAndReturns) {
  PodWorkQueue q(2);
  std::atomic<int> ran{0};
  q.post(
      "pod-a", [&] { ++ran; }, Clock::now() + 10s);
  q.stop();
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(q.pending(), 0u);
}

}  // namespace
}  // namespace kpleg::pleg
