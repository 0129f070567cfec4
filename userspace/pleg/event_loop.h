// EventLoop: the one thread that owns the kernel-driven path's state (the container table, the
// confirmer's chains, the removal watcher's sweep). It sleeps in epoll on three kinds of
// descriptor and does everything it is woken for before it sleeps again:
//
//   - one timerfd, set to the earliest of its timers (a look that is due, a back-off, a sweep);
//   - one eventfd, written when another thread posts a message (post(), call());
//   - the descriptors registered with watch() (the BPF ring buffer, a connection).
//
// Nothing that runs on it blocks: a slow call runs off the loop and comes back as a message.
// Other threads never touch the state: they post to it, or call() and wait for the answer.
// post() takes a short lock on the message queue only (never held while a message runs); a
// message posted while the loop is awake for something else costs no wakeup at all.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "cri/reactor.h"

namespace kpleg::pleg {

class EventLoop final : public cri::Reactor {
 public:
  using Task = std::function<void()>;
  using TimerId = uint64_t;  // never 0 for a timer

  EventLoop();
  ~EventLoop() override;
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the loop's thread, named `name`.
  void start(const std::string& name);
  // Ends the loop: the messages posted before run, the timers are dropped, the thread is
  // joined. Later posts are dropped and later call()s run on their caller's thread, one at a
  // time. Not from the loop itself.
  void stop();

  // Whether the caller is the loop's thread.
  bool in_loop() const { return std::this_thread::get_id() == thread_id_.load(); }

  // Runs `task` on the loop, after the messages posted before it. From any thread.
  void post(Task task);
  // Runs `f` on the loop and returns its result: at once on the loop's own thread (or once the
  // loop has stopped), else after the messages posted before.
  template <typename F>
  auto call(F&& f) -> std::invoke_result_t<F> {
    using R = std::invoke_result_t<F>;
    if (in_loop()) return f();
    {
      std::unique_lock lk(mu_);
      if (stopped_) {
        std::lock_guard after(after_stop_mu_);
        lk.unlock();
        return f();
      }
    }
    std::packaged_task<R()> task(std::forward<F>(f));
    auto result = task.get_future();
    auto shared = std::make_shared<std::packaged_task<R()>>(std::move(task));
    if (!enqueue([shared] { (*shared)(); })) {  // stopped meanwhile
      std::lock_guard after(after_stop_mu_);
      (*shared)();
    }
    return result.get();
  }

  // On the loop's thread: runs `task` on the loop at `at` (at once if past). Returns its id.
  TimerId at(Clock::time_point at, Task task, const char* what = "timer") override;
  // The same for a task that can wait: it runs at the loop's first wakeup at or after `at`, for
  // whatever cause, and at `at + slack` at the latest, where the timer wakes the loop for it.
  // Under load the loop is awake often, and such a timer can share another cause's wakeup.
  TimerId at(Clock::time_point at, Clock::duration slack, Task task, const char* what) override;
  // Drops a timer that has not fired: true when it will never run.
  bool cancel(TimerId id) override;

  // On the loop's thread (or before start()): calls `on_ready` with the epoll events each time
  // `fd` is ready for `events` (EPOLLIN, EPOLLOUT, level-triggered).
  void watch(int fd, uint32_t events, std::function<void(uint32_t)> on_ready,
             const char* what = "other") override;
  void modify(int fd, uint32_t events) override;
  void unwatch(int fd) override;
  // On the loop's thread (or before start()): `first` runs at every wakeup before what woke the
  // loop is handled: for a source whose records do not all wake the loop (the BPF ring buffer,
  // whose exec and rmdir records wait for the wake timer or for whatever wakes the loop first),
  // so that they are read before what they come before (the runtime's answer or event).
  void set_first_at_wakeup(Task first) { first_at_wakeup_ = std::move(first); }

  // Times the loop's thread woke (out of epoll_wait), for tests and benchmarks.
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // On the loop's thread: what woke it, counted per wakeup for each cause: the `what` of each
  // descriptor that was ready, of the timer the timerfd fired for (the one whose time, slack
  // included, came first; "timer: nothing due" when none ran: one cancelled after the timerfd
  // fired), or "message" (post(), call()). A timer run with another cause's wakeup is not
  // counted. A wakeup with several ready counts under each, so the counts add up to at least
  // wakeups().
  const std::map<std::string, uint64_t, std::less<>>& woken_by() const { return woken_by_; }

 private:
  bool enqueue(Task task);
  void run();
  void run_messages();
  // Runs the timers that are due (at every wakeup: those with slack run with another cause's);
  // the `what` of the one whose time (with its slack) came first, the one the timerfd was set
  // for, or nullptr for none.
  const char* run_timers();
  void count(const char* what);
  void arm();

  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  int message_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<uint64_t> wakeups_{0};

  std::mutex mu_;  // the message queue only
  std::deque<Task> messages_;
  bool signalled_ = false;  // the eventfd was written and not yet read
  bool stopping_ = false, stopped_ = false;
  std::mutex after_stop_mu_;  // call()s after stop() run one at a time

  // The loop's own (no lock):
  struct Timer {
    Task task;
    const char* what;
    Clock::time_point latest;  // `at` plus its slack
  };
  std::map<std::pair<Clock::time_point, TimerId>, Timer> timers_;  // by when each is due
  std::set<std::pair<Clock::time_point, TimerId>> latest_;  // by when each must run: the timerfd
  std::unordered_map<TimerId, Clock::time_point> timer_at_;
  TimerId last_timer_ = 0;
  Clock::time_point armed_at_ = Clock::time_point::max();
  // The loop is handling a wakeup: timers set or cancelled meanwhile arm the timerfd once, at
  // its end (one timerfd_settime per wakeup at most, and none for a timer set and cancelled
  // within it).
  bool in_batch_ = false;
  struct Watched {
    std::function<void(uint32_t)> on_ready;
    const char* what;
    // In the epoll set: not while modified to no events. Kept in it with none, an inotify
    // descriptor still woke epoll_wait at every event queued (fsnotify's wakeup has no poll
    // key, so epoll cannot filter it), and epoll_wait slept again without returning.
    bool in_set;
  };
  std::unordered_map<int, Watched> watched_;
  std::map<std::string, uint64_t, std::less<>> woken_by_;
  Task first_at_wakeup_;
};

}  // namespace kpleg::pleg
