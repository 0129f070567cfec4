#include "grpcidle/grpc_idle.h"

#include "common/thread_name.h"

#include <grpc/event_engine/event_engine.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/version_info.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

// gRPC 1.51's internal timer interface (src/core/lib/iomgr/timer.h), declared here as the
// library exports it: the layout and calling convention are those of 1.51 only, which is why
// this file is built only against 1.51 (KPLEG_GRPCIDLE in CMakeLists.txt) and install() checks
// the version of the library loaded. grpc_core::Timestamp is a trivially copyable int64
// (milliseconds since gRPC's process epoch), passed and returned in a register like one.
namespace grpc_core {
class Timestamp {
 public:
  static Timestamp FromTimespecRoundDown(gpr_timespec t);
  int64_t millis;
};
}  // namespace grpc_core
struct grpc_timer;
struct grpc_closure;
enum grpc_timer_check_result {
  GRPC_TIMERS_NOT_CHECKED,
  GRPC_TIMERS_CHECKED_AND_EMPTY,
  GRPC_TIMERS_FIRED,
};
struct grpc_timer_vtable {
  void (*init)(grpc_timer* timer, grpc_core::Timestamp deadline, grpc_closure* closure);
  void (*cancel)(grpc_timer* timer);
  grpc_timer_check_result (*check)(grpc_core::Timestamp* next);
  void (*list_init)();
  void (*list_shutdown)();
  void (*consume_kick)();
};
extern grpc_timer_vtable grpc_generic_timer_vtable;
void grpc_set_timer_impl(grpc_timer_vtable* vtable);
void grpc_kick_poller();  // wakes the iomgr timer threads
// grpc_init() installs the default iomgr platform (which sets the timer implementation) unless
// one was installed before; installing it first lets the timer implementation be replaced.
bool grpc_have_determined_iomgr_platform();
void grpc_set_default_iomgr_platform();

namespace kpleg::grpcidle {
namespace {

static_assert(GRPC_CPP_VERSION_MAJOR == 1 && GRPC_CPP_VERSION_MINOR == 51,
              "grpc_idle.cc declares gRPC 1.51's internal timer interface: check it against this "
              "version's src/core/lib/iomgr/timer.h and timer_manager.cc before using it");

constexpr int64_t kInfFuture = std::numeric_limits<int64_t>::max();

// ---- iomgr timers: gRPC's list, with the real next deadline ----

struct Pending {
  std::mutex mu;
  // Pending timers (and fired ones not yet purged), by deadline and by timer.
  std::multimap<int64_t, grpc_timer*> deadlines;
  std::unordered_map<grpc_timer*, std::multimap<int64_t, grpc_timer*>::iterator> by_timer;
  int64_t reported = kInfFuture;  // the next deadline the timer threads were last told

  void erase_locked(grpc_timer* t) {
    auto it = by_timer.find(t);
    if (it == by_timer.end()) return;
    deadlines.erase(it->second);
    by_timer.erase(it);
  }
};
Pending& pending() {
  static Pending* p = new Pending;  // used by gRPC's threads up to exit: never destroyed
  return *p;
}

int64_t now_ms() {
  return grpc_core::Timestamp::FromTimespecRoundDown(gpr_now(GPR_CLOCK_MONOTONIC)).millis;
}

void timer_init(grpc_timer* timer, grpc_core::Timestamp deadline, grpc_closure* closure) {
  grpc_generic_timer_vtable.init(timer, deadline, closure);
  bool kick;
  {
    Pending& p = pending();
    std::lock_guard lk(p.mu);
    p.erase_locked(timer);  // a timer that fired and is armed again
    p.by_timer.emplace(timer, p.deadlines.emplace(deadline.millis, timer));
    kick = deadline.millis < p.reported;
    if (kick) p.reported = deadline.millis;
  }
  // gRPC kicks only for a timer earlier than its own next deadline, which the threads no longer
  // sleep until: kick for one earlier than what they were told.
  if (kick) grpc_kick_poller();
}

void timer_cancel(grpc_timer* timer) {
  {
    Pending& p = pending();
    std::lock_guard lk(p.mu);
    p.erase_locked(timer);
  }
  grpc_generic_timer_vtable.cancel(timer);
}

grpc_timer_check_result timer_check(grpc_core::Timestamp* next) {
  const int64_t now = now_ms();  // no later than the now gRPC's check uses
  const grpc_timer_check_result r = grpc_generic_timer_vtable.check(next);
  if (next == nullptr || r != GRPC_TIMERS_CHECKED_AND_EMPTY) return r;
  Pending& p = pending();
  std::lock_guard lk(p.mu);
  // What is left from before `now` has fired (or been re-armed, which replaced its entry) —
  // or is due and was not run: gRPC's check first compares `now` with a per-thread copy of its
  // earliest deadline, which only a kick this thread consumed refreshes, and returns "empty"
  // without looking when that copy is later. Left alone, gRPC would wake this thread at that
  // stale time and run the timer late; told the next pending deadline instead, the thread
  // slept past it forever (an alarm that never fired, within a few dozen runs of
  // GrpcIdle.AnAlarmFiresOnTime). So: drop the copy and look again at once.
  bool overdue = false;
  while (!p.deadlines.empty() && p.deadlines.begin()->first < now) {
    p.by_timer.erase(p.deadlines.begin()->second);
    p.deadlines.erase(p.deadlines.begin());
    overdue = true;
  }
  if (overdue) {
    grpc_generic_timer_vtable.consume_kick();  // this thread's copy: gRPC's check will look
    next->millis = now;
    p.reported = now;
    return r;
  }
  const int64_t earliest = p.deadlines.empty() ? kInfFuture : p.deadlines.begin()->first;
  next->millis = earliest;
  p.reported = earliest;
  return r;
}

void timer_list_init() {
  {
    Pending& p = pending();
    std::lock_guard lk(p.mu);
    p.by_timer.clear();
    p.deadlines.clear();
    p.reported = kInfFuture;
  }
  grpc_generic_timer_vtable.list_init();
}

void timer_list_shutdown() { grpc_generic_timer_vtable.list_shutdown(); }
void timer_consume_kick() { grpc_generic_timer_vtable.consume_kick(); }

grpc_timer_vtable g_vtable = {timer_init,      timer_cancel,        timer_check,
                              timer_list_init, timer_list_shutdown, timer_consume_kick};

// ---- the EventEngine: closures and timers on one thread that sleeps until one is due ----

namespace ee = grpc_event_engine::experimental;

class TimersOnlyEngine final : public ee::EventEngine {
 public:
  TimersOnlyEngine() : thread_(named_thread("kpleg-grpc-ee", [this] { loop(); })) {}
  ~TimersOnlyEngine() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (std::this_thread::get_id() == thread_.get_id()) thread_.detach();
    else thread_.join();
  }

  bool IsWorkerThread() override { return std::this_thread::get_id() == thread_.get_id(); }

  void Run(Closure* closure) override {
    Run(absl::AnyInvocable<void()>([closure] { closure->Run(); }));
  }
  void Run(absl::AnyInvocable<void()> closure) override {
    {
      std::lock_guard lk(mu_);
      ready_.push_back(std::move(closure));
    }
    cv_.notify_one();
  }
  TaskHandle RunAfter(Duration when, Closure* closure) override {
    return RunAfter(when, absl::AnyInvocable<void()>([closure] { closure->Run(); }));
  }
  TaskHandle RunAfter(Duration when, absl::AnyInvocable<void()> closure) override {
    const auto due = std::chrono::steady_clock::now() + std::max(when, Duration::zero());
    bool earliest;
    TaskHandle h;
    {
      std::lock_guard lk(mu_);
      const intptr_t id = next_id_++;
      h = TaskHandle{{id, 0}};
      earliest = timers_.empty() || due < timers_.begin()->first.first;
      timers_.emplace(std::make_pair(due, id), std::move(closure));
      ids_.emplace(id, due);
    }
    if (earliest) cv_.notify_one();
    return h;
  }
  bool Cancel(TaskHandle handle) override {
    absl::AnyInvocable<void()> dropped;  // destroyed outside the lock
    std::lock_guard lk(mu_);
    auto it = ids_.find(handle.keys[0]);
    if (it == ids_.end()) return false;
    auto t = timers_.find(std::make_pair(it->second, it->first));
    dropped = std::move(t->second);
    timers_.erase(t);
    ids_.erase(it);
    return true;
  }

  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback, absl::AnyInvocable<void(absl::Status)>, const ee::EndpointConfig&,
      std::unique_ptr<ee::MemoryAllocatorFactory>) override {
    return absl::UnimplementedError("kplegd's EventEngine does not listen (gRPC's iomgr does)");
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress&,
                           const ee::EndpointConfig&, ee::MemoryAllocator, Duration) override {
    Run([cb = std::move(on_connect)]() mutable {
      cb(absl::UnimplementedError("kplegd's EventEngine does not connect (gRPC's iomgr does)"));
    });
    return ConnectionHandle{{0, 0}};
  }
  bool CancelConnect(ConnectionHandle) override { return false; }

  class NoDns final : public DNSResolver {
   public:
    explicit NoDns(TimersOnlyEngine* e) : engine_(e) {}
    LookupTaskHandle LookupHostname(LookupHostnameCallback cb, absl::string_view,
                                    absl::string_view, Duration) override {
      engine_->Run([cb = std::move(cb)]() mutable { cb(error()); });
      return {};
    }
    LookupTaskHandle LookupSRV(LookupSRVCallback cb, absl::string_view, Duration) override {
      engine_->Run([cb = std::move(cb)]() mutable { cb(error()); });
      return {};
    }
    LookupTaskHandle LookupTXT(LookupTXTCallback cb, absl::string_view, Duration) override {
      engine_->Run([cb = std::move(cb)]() mutable { cb(error()); });
      return {};
    }
    bool CancelLookup(LookupTaskHandle) override { return false; }

   private:
    static absl::Status error() {
      return absl::UnimplementedError("kplegd's EventEngine does not resolve names");
    }
    TimersOnlyEngine* engine_;
  };
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions&) override {
    return std::make_unique<NoDns>(this);
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!stopping_) {
      if (!ready_.empty()) {
        auto fn = std::move(ready_.front());
        ready_.pop_front();
        lk.unlock();
        fn();
        fn = nullptr;
        lk.lock();
        continue;
      }
      if (!timers_.empty()) {
        auto first = timers_.begin();
        if (first->first.first <= std::chrono::steady_clock::now()) {
          auto fn = std::move(first->second);
          ids_.erase(first->first.second);
          timers_.erase(first);
          lk.unlock();
          fn();
          fn = nullptr;
          lk.lock();
          continue;
        }
        cv_.wait_until(lk, first->first.first);
      } else {
        cv_.wait(lk);  // nothing due: sleep until something is scheduled
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  intptr_t next_id_ = 1;
  std::deque<absl::AnyInvocable<void()>> ready_;
  std::map<std::pair<std::chrono::steady_clock::time_point, intptr_t>, absl::AnyInvocable<void()>>
      timers_;
  std::unordered_map<intptr_t, std::chrono::steady_clock::time_point> ids_;
  std::thread thread_;  // last: starts once the rest is constructed
};

}  // namespace

std::string install() {
  // The build allows only gRPC 1.51's headers (CMakeLists.txt and the static_assert above); the
  // library loaded at run time can still differ (another package installed since): the
  // declarations above would then not match what they call.
  const std::string core = grpc_version_string();
  if (core != KPLEG_GRPCIDLE_GRPC_CORE_VERSION)
    return "gRPC core " + core + " is loaded, grpcidle was built for gRPC " GRPC_CPP_VERSION_STRING
           " (core " KPLEG_GRPCIDLE_GRPC_CORE_VERSION "): left as is";
  if (const std::string cpp = grpc::Version(); cpp != GRPC_CPP_VERSION_STRING)
    return "gRPC C++ " + cpp + " is loaded, grpcidle was built for gRPC " GRPC_CPP_VERSION_STRING
           ": left as is";
  if (grpc_is_initialized())
    return "gRPC was initialised before: left as is";
  if (grpc_have_determined_iomgr_platform()) return "gRPC's iomgr platform was chosen before: left as is";
  grpc_set_default_iomgr_platform();
  grpc_set_timer_impl(&g_vtable);
  ee::SetEventEngineFactory([] { return std::make_unique<TimersOnlyEngine>(); });
  return "";
}

}  // namespace kpleg::grpcidle
