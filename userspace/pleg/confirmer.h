// Confirmer: turns a container's kernel signal into the runtime's word. For each signal (first
// exec, init exit, the cgroup's rmdir) it makes one targeted look when the runtime has usually
// caught up (learned per signal, lag_learner.h), retries briefly while it has not,
// and keeps looking, backing off, past its budget: a confirmation is never dropped. Only a
// state the runtime reports is emitted. A started container the runtime never learns of is
// someone else's (foreign): its later signals are ignored. It lives on the tracker's event loop
// (tracker_core.h): a look is a timer, a call made off the loop, and its answer back on it.
// confirmer.cc: the signals and their looks; confirmer_events.cc: the runtime's event stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/log_limiter.h"
#include "pleg/exit_wakeup.h"
#include "pleg/lag_learner.h"
#include "pleg/tracker_core.h"

namespace kpleg::pleg {

class Confirmer {
 public:
  // kExitOom: the init's exit, killed by the OOM killer (read off the init itself).
  enum class Signal { kExec, kExit, kExitOom, kRmdir };
  using Clock = std::chrono::steady_clock;

  explicit Confirmer(TrackerCore& core) : core_(core) {}

  // A kernel signal for container/sandbox `id` of pod `pod_uid` at `ts_ns` (realtime), made at
  // `signal_at` (the loop's clock): its looks go a learned lag after that, however late its
  // record was read.
  void on_signal(const std::string& id, const std::string& pod_uid, Signal signal, uint64_t ts_ns,
                 Clock::time_point signal_at);

  // What the runtime's event stream said of container/sandbox `id` (runtime_events.h): taken
  // like a look's answer, for a record the tracker holds; the looks of the signals it settles
  // then find nothing to do. Any report makes the stream live (see set_live()).
  void on_report(const Observation& obs);
  // The event stream started or stopped delivering.
  void set_live(bool live);
  // Whether a signal waits for its event now (the stream should then be read as events come).
  bool awaiting_events() const { return !awaiting_.empty(); }

  // Whether an init's exit wakes the loop (exit_wakeup.h), learned from the signals here.
  ExitWakeup& exit_wakeup() { return exit_wakeup_; }
  const ExitWakeup& exit_wakeup() const { return exit_wakeup_; }

  // How long after an exec, and after a cgroup's rmdir, their records must wake the loop at the
  // latest (kernel::BpfProgram::set_wake_after): when the loop would act on them if nothing else
  // woke it first, the chain's first look (or, while the runtime's event stream is live, when
  // its event is usually there: the learners learn that from the events). Set through `set` at
  // once and whenever it changes; called on the loop.
  using WakeAfter = std::function<void(std::chrono::milliseconds exec, std::chrono::milliseconds rmdir)>;
  void set_wake_after(WakeAfter set);
  enum class Want { kRunning, kExited };
  // What a chain of looks waits after: the first exec, the init's exit, the cgroup's rmdir.
  // A death has two: the runtime records it after it removed the cgroup (runc delete), and the
  // time from the rmdir to that record varies half as much as the time from the exit, so the
  // rmdir's chain takes over from the exit's (Record::death_chain).
  enum class Anchor { kExec = 0, kExit = 1, kRmdir = 2 };
  // One look of a chain: for a kernel signal received at `signal_at`; `last_miss` is when
  // (after the signal) the previous look still saw the old state, negative for none; `delay`
  // the wait before the next look if this one misses. A death's look whose `chain` is no longer
  // the record's makes no call.
  struct Look {
    std::string id;
    Anchor anchor;
    uint32_t chain;
    std::chrono::milliseconds delay;
    Clock::time_point deadline, signal_at;
    Clock::duration last_miss;
    // The first answer of this chain that said the runtime does not know the container (zero
    // before one): the foreign rule counts from it, not from the signal, so that a runtime that
    // was unreachable meanwhile gets its foreign_after all the same.
    Clock::time_point unknown_since{};
  };

  // The look's timer fired: the call, unless another path settled the chain meanwhile.
  void confirm(const Look& look);
  // The runtime's answer to `look`, made `look_at` after the signal; `known`: the runtime had
  // reported the record before the call.
  void on_answer(const Look& look, Clock::duration look_at, bool known, Result<Observation> obs);
  // Starts a new chain: its first look, or, while the runtime's event stream is live, a wait
  // for its event. An early report (see early_) that settles the chain is applied into `out`.
  void start_chain(Record& rec, const std::string& pod_uid, Anchor anchor,
                   Clock::time_point signal_at, Events& out);
  // Sets the timer of `look` at `at` (kept on the record for a death's chain, which a later
  // chain cancels). `unanswered`: the look before it got no answer (see unanswered_).
  void schedule(const Look& look, Clock::time_point at, bool unanswered = false);
  // A look's answer came (`answered`), or the call failed without one (a deadline, the runtime
  // unreachable). The first answer after kSilence or more in which looks failed and none was
  // answered makes every look waiting after an unanswered one go at once.
  void note_answer(bool answered, Clock::time_point now);
  // Not settled yet: the next look, backing off past the budget (logged once).
  std::chrono::milliseconds next_delay(Record& rec, const Look& look, bool unknown_start,
                                       const Result<Observation>& obs);
  // A signal whose runtime event is awaited (the stream is live): one check for all of them,
  // at most every runtime_event_check, starts a look for those whose event is overdue. A look
  // per signal would wake the loop per signal only to find the event there.
  struct Awaiting {
    Look look;
    Clock::time_point first_look;
  };
  void check_awaiting();
  void schedule_check(Clock::time_point at);
  // When the runtime's events settled every awaited signal: the check's timer goes, since it
  // would wake the loop only to find nothing overdue.
  void drop_settled_awaiting();
  bool settled_or_superseded(const Record& rec, Anchor anchor, uint32_t chain) const;
  static Want want_of(Anchor a) { return a == Anchor::kExec ? Want::kRunning : Want::kExited; }
  LagLearner& learner(Anchor anchor, bool sandbox) {
    return lag_[static_cast<int>(anchor)][sandbox ? 1 : 0];
  }
  // When a chain's first look goes. Sandboxes start and die far less often than containers:
  // until a sandbox learner has learned anything, the containers' lag for the same signal is a
  // better first guess than looking at once (a sandbox's death then cost 4-5 looks, 5 ms apart,
  // on containerd 1.6).
  std::chrono::milliseconds first_look(Anchor anchor, bool sandbox) {
    const LagLearner& own = learner(anchor, sandbox);
    if (sandbox && own.samples() == 0) return learner(anchor, false).first_look();
    return own.first_look();
  }
  // The learners learn when the runtime's event had what a pending signal waits for.
  void learn_from_report(const Record& rec, const Observation& obs);
  // Hands the first looks' lags on to wake_after_, when they changed.
  void publish_wake_after();
  // How long after an init's exit its chain's first look goes (the learned lag, and the wait
  // for the runtime's event while its stream is live).
  Clock::duration exit_look_after(bool sandbox);
  // A signal came: what it says of whether an init's exit must wake the loop.
  void learn_exit_wakeup(const Record& rec, Signal signal);

  TrackerCore& core_;
  // Looks whose call before got no answer, waiting for their next try (backing off past the
  // budget: up to confirm_backoff_max apart), by id and anchor. A runtime that answered nothing
  // for a while (frozen, restarting) recovers with a backlog: a container it then starts, stops
  // and removes within seconds was gone before its chain's next try, and one the runtime never
  // reported is reported to no one. So they go at once when the runtime answers again.
  struct Unanswered {
    TrackerCore::TimerId timer;
    Look look;
  };
  std::map<std::pair<std::string, int>, Unanswered> unanswered_;
  static constexpr std::chrono::seconds kSilence{1};
  std::optional<Clock::time_point> silent_since_;  // the first unanswered look since an answer
  // How long after each anchor the runtime reports the transition, for containers [.][0] and
  // sandboxes [.][1] apart (containerd lists a sandbox tens of milliseconds after its pause
  // started).
  LagLearner lag_[3][2];
  LogLimiter late_log_{std::chrono::seconds(10)};
  ExitWakeup exit_wakeup_;
  WakeAfter wake_after_;
  std::optional<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> wake_after_set_;
  std::deque<Awaiting> awaiting_;
  std::optional<Clock::time_point> check_due_;
  TrackerCore::TimerId check_timer_ = 0;
  Clock::time_point last_check_{};
  // The runtime's events for containers the tracker has no record of yet: a container's
  // STARTED event can come before the exec signal that makes its record (the ring buffer and
  // the stream are read apart); unmatched, the signal then waited the whole grace for an event
  // that had come and gone (a Started 100 ms late). Kept for kEarlyFor, at most kMaxEarly, and
  // taken as the runtime's word by the signal's chain when it settles it. A container id is
  // never reused, so an old report can only be behind the container's state, never ahead.
  struct Early {
    Observation obs;
    Clock::time_point at;
  };
  static constexpr size_t kMaxEarly = 1024;
  static constexpr std::chrono::seconds kEarlyFor{2};
  void remember_early(const std::string& id, const Observation& obs, Clock::time_point now);
  // The early report of `rec`, if it settles `anchor`'s chain: applied into `out`.
  bool take_early(Record& rec, Anchor anchor, Clock::time_point now, Events& out);
  std::unordered_map<std::string, Early> early_;
};

}  // namespace kpleg::pleg
