// kpleg-bench-wakeup: what one bare wakeup of a thread costs on this machine, the floor under
// every hop of kplegd's event path (a ring-buffer record, a look's due time, the runtime's
// answer, a Watch write each wake a thread). A thread that does nothing but wait is woken
// --wakeups times, --gap-ms apart, and its schedstat (time on a CPU, timeslices) is read before
// and after:
//
//   timer    the thread sleeps out --gap-ms itself (clock_nanosleep), as a look waits for its
//            due time;
//   eventfd  the thread blocks in read(2) on an eventfd that another thread writes every
//            --gap-ms, as a worker woken by a record or by a socket; the waker's cost is printed
//            apart.
//
// --apart pins the woken thread to CPU 1 and the waker to CPU 0, so that every wakeup crosses
// CPUs (an idle CPU is woken, as when a runtime's answer or a record comes from elsewhere);
// without it the scheduler places the threads.
//
// Prints one JSON object per mode; exits 1 when a thread was not woken as often as asked.
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

struct Sched {
  long on_cpu_ns = 0;
  long runs = 0;
};

long this_tid() { return long(syscall(SYS_gettid)); }

// Pins the calling thread to one CPU (with --apart); -1 leaves it where it is.
void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    throw std::runtime_error("cannot pin a thread to CPU " + std::to_string(cpu));
}

Sched sched_of(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  Sched s;
  long wait_ns = 0;
  in >> s.on_cpu_ns >> wait_ns >> s.runs;
  return s;
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, long(ms % 1000) * 1'000'000};
  while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
  }
}

nlohmann::json per_wakeup(const Sched& before, const Sched& after, int wakeups) {
  return {{"runs_per_wakeup", double(after.runs - before.runs) / wakeups},
          {"us_per_wakeup", double(after.on_cpu_ns - before.on_cpu_ns) / 1e3 / wakeups}};
}

// The thread sleeps out every gap itself. It reads its own schedstat before its first sleep and
// after its last wakeup (a finished thread's entry is gone).
nlohmann::json timer_mode(int wakeups, int gap_ms, int woken_cpu) {
  Sched before, after;
  int woken = 0;
  std::thread t([&] {
    pin_to(woken_cpu);
    const long tid = this_tid();
    before = sched_of(tid);
    for (int i = 0; i < wakeups; ++i) {
      sleep_ms(gap_ms);
      ++woken;
    }
    after = sched_of(tid);
  });
  t.join();
  return {{"mode", "timer"}, {"wakeups", woken}, {"woken", per_wakeup(before, after, wakeups)}};
}

// The thread blocks on an eventfd that this thread writes every gap. Each side reads its own
// schedstat around the loop.
nlohmann::json eventfd_mode(int wakeups, int gap_ms, int woken_cpu, int waker_cpu) {
  const int fd = eventfd(0, EFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error("eventfd: " + std::string(std::strerror(errno)));
  Sched before, after;
  std::atomic<bool> ready{false};
  int woken = 0;
  std::thread t([&] {
    pin_to(woken_cpu);
    const long tid = this_tid();
    before = sched_of(tid);
    ready = true;
    for (int i = 0; i < wakeups; ++i) {
      uint64_t v = 0;
      if (read(fd, &v, sizeof v) != sizeof v) break;
      ++woken;
    }
    after = sched_of(tid);
  });
  pin_to(waker_cpu);
  while (!ready) sleep_ms(1);
  sleep_ms(gap_ms);
  const long tid = this_tid();
  const Sched waker_before = sched_of(tid);
  for (int i = 0; i < wakeups; ++i) {
    const uint64_t one = 1;
    if (write(fd, &one, sizeof one) != sizeof one) {
      // The reader would wait for this write for ever.
      std::fprintf(stderr, "kpleg-bench-wakeup: eventfd write: %s\n", std::strerror(errno));
      std::_Exit(1);
    }
    sleep_ms(gap_ms);
  }
  const Sched waker_after = sched_of(tid);
  t.join();
  close(fd);
  // The waker's own pacing sleeps are a timer wakeup each: its cost is that plus the write.
  return {{"mode", "eventfd"},
          {"wakeups", woken},
          {"woken", per_wakeup(before, after, wakeups)},
          {"waker", per_wakeup(waker_before, waker_after, wakeups)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-wakeup: the CPU one bare wakeup of a thread costs on this machine"};
  int wakeups = 200, gap_ms = 50;
  std::string mode = "all";
  bool apart = false;
  app.add_option("--mode", mode, "timer, eventfd or all")
      ->check(CLI::IsMember({"timer", "eventfd", "all"}))
      ->capture_default_str();
  app.add_option("--wakeups", wakeups, "Wakeups per mode")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--gap-ms", gap_ms, "Time between wakeups")
      ->check(CLI::Range(1, 10'000))
      ->capture_default_str();
  app.add_flag("--apart", apart, "Woken thread on CPU 1, waker on CPU 0");
  CLI11_PARSE(app, argc, argv);
  if (apart && std::thread::hardware_concurrency() < 2) {
    std::cerr << "kpleg-bench-wakeup: --apart needs two CPUs\n";
    return 2;
  }
  const int woken_cpu = apart ? 1 : -1, waker_cpu = apart ? 0 : -1;

  bool all_woken = true;
  for (const char* m : {"timer", "eventfd"}) {
    if (mode != "all" && mode != m) continue;
    nlohmann::json r = std::string(m) == "timer"
                           ? timer_mode(wakeups, gap_ms, woken_cpu)
                           : eventfd_mode(wakeups, gap_ms, woken_cpu, waker_cpu);
    r["gap_ms"] = gap_ms;
    r["apart"] = apart;
    std::cout << r.dump() << std::endl;
    if (r["wakeups"].get<int>() != wakeups) {
      std::cerr << "kpleg-bench-wakeup: " << m << ": woken " << r["wakeups"] << " of " << wakeups
                << " times\n";
      all_woken = false;
    }
  }
  return all_woken ? 0 : 1;
}
