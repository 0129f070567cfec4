// RemovalWatcher: finds the removal of exited containers and sandboxes, which no kernel event
// marks. One sweep answers for all of them: a full ListContainers (ListPodSandbox when
// sandboxes are watched), whatever their number, instead of a call per container; what a full
// list leaves out the runtime no longer has. Sweeps run every period while containers die and
// go, and back off while nothing changes (TrackerOptions::removal_sweep_*). While the runtime's
// event stream is live its DELETED events confirm the removals, and the sweep only catches one
// that was lost (TrackerOptions::removal_sweep_with_events). A stream that leaves removals out
// (CRI-O sends no DELETED for the containers a RemovePodSandbox takes with it) is found out by
// such a sweep: a removal it finds whose DELETED has not come removal_event_grace later makes
// the sweep run as without the stream, until the stream stops. Sandboxes' removals are swept for
// as without the stream until it has reported one (CRI-O reports none): otherwise the first
// pod removal on such a runtime waited for the rare sweep before it could count as a miss.
//
// The removal hint (RemovalHints: inotify on the runtime's directories, kernel/dir_removal_watch.h,
// or the kernel's syscall tracepoints, bpf/kpleg.bpf.c removal_hint) does the same for runtimes
// without the stream: each exited id is armed, and the removal of a directory named by it (the
// runtime removing its files on RemoveContainer) brings the sweep forward to removal_hint_delay
// (removal_dir_hint_delay for inotify's), one removal_sweep_period after the last sweep at the
// soonest. Until a sweep has found a hinted removal the hints are not
// trusted (unless the runtime is one known to keep such directories: set_hints) and the sweep
// runs as without them; once one has, the sweep of hinted ids runs every
// removal_sweep_with_hints at most, and a removal found without its hint (after
// removal_event_grace) makes it run as without them again. A removal the sweep finds first
// stays armed at the source until its hint comes or that grace is over (the hint may be held
// back); an id the source saw removed before it was armed (RemovalHints::Arm::kGone) is hinted
// as it joins.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pleg/tracker_core.h"

namespace kpleg::pleg {

// The source of the removal hint: arms and disarms ids (in an inotify watch's set, or the BPF
// map); a hinted id reaches the tracker as a kernel::RemovalHint event (the kernel's) or
// through Tracker::on_removal_hint (the inotify watch's, on the tracker's loop).
class RemovalHints {
 public:
  virtual ~RemovalHints() = default;
  enum class Arm {
    kArmed,
    kFailed,  // cannot be armed (the map is full): its removal is then not hinted
    kGone,    // removed already (the source saw it before the id was armed): that is its hint
  };
  virtual Arm watch(const std::string& id) = 0;
  virtual void unwatch(const std::string& id) = 0;
  // Hands on now what the source holds back (inotify's hold-off): the sweep about to run covers
  // those removals, so the hold-off need not end with a wakeup of its own.
  virtual void take_held() {}
  // Stops reading while the runtime's event stream reports every removal (paused), and reads
  // what came meanwhile when it no longer does: the hints are not needed then, and reading
  // them would wake the loop for nothing.
  virtual void set_paused(bool /*paused*/) {}
};

class RemovalWatcher {
 public:
  explicit RemovalWatcher(TrackerCore& core) : core_(core) {}

  // Arms the removal hint for every record that joins from now on (nullptr: none);
  // `trusted`: the runtime is known to remove a directory named by the id on every removal, so
  // the hints stand for the periodic sweep at once (until one is missed). `after_removal`: a
  // hint comes once the directory is gone (inotify's), not at the rmdir's entry (the kernel's):
  // its sweep goes removal_dir_hint_delay after it instead of removal_hint_delay; a hinted id
  // the sweep still finds is looked for again removal_hint_delay apart.
  void set_hints(RemovalHints* hints, bool trusted, bool after_removal = false) {
    if (hints_ != nullptr && hints_paused_) hints_->set_paused(false);
    hints_ = hints;
    hints_paused_ = false;
    hints_trusted_ = hints != nullptr && trusted;
    hints_after_removal_ = after_removal;
    pause_hints_while_covered();
  }
  // The kernel's hint: a directory named by `id` is being removed.
  void on_hint(const std::string& id);
  // A hinted removal has been confirmed, and no removal has been found without its hint since.
  bool hints_trusted() const { return hints_trusted_; }

  // An exited record joins the sweep.
  void join(Record& rec);
  // The runtime's event stream started or stopped confirming removals (its DELETED events):
  // while it does, sweeps are rare; when it stops, one goes soon.
  void on_runtime_events_live(bool live);
  // The runtime's stream reported `id` removed (its DELETED event), whether or not a sweep had
  // found it first.
  void on_deleted_event(const std::string& id);
  // One targeted look at exited `id` (a reconcile no longer lists it): removed if the runtime
  // does not know it any more; otherwise the sweep goes on.
  void check(const std::string& id);
  // The live stream left a removal out (until it stops).
  bool events_miss_removals() const { return events_miss_removals_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Plans the sweep at `at` unless one is due earlier.
  void schedule(Clock::time_point at);
  // The sweep's timer fired: the records it judges, and its lists (on the loop where the
  // client can, else off it).
  void sweep();
  // The lists as the client's calls on the loop (AsyncStatusCalls::list_ids), then judge();
  // false when it has none (nothing started).
  bool list_on_loop(bool containers, bool sandboxes, bool joined);
  // The lists' answer (`still_there`, unless !listed) for the kinds listed.
  void judge(bool containers, bool sandboxes, bool joined, bool listed,
             const std::set<std::string>& still_there);
  // Whether the runtime's DELETED events stand for the sweep, for sandboxes' removals or for
  // containers'.
  bool events_cover_removals(bool sandbox) const {
    return core_.runtime_events_live() && !events_miss_removals_ &&
           (!sandbox || sandbox_deleted_seen_);
  }
  // Pauses the hints' source while the runtime's DELETED events cover both kinds' removals,
  // and resumes it when they no longer do.
  void pause_hints_while_covered();
  // Removals a sweep found while the events covered them, whose DELETED has not come for
  // removal_event_grace, are ones the stream left out: counted, and from then on the sweep runs
  // as without it.
  void find_missed_deleted_events(Clock::time_point now);
  // Takes the removals whose grace (removal_event_grace) is over out of `awaiting`, and
  // returns their ids.
  std::vector<std::string> take_overdue(std::map<std::string, Clock::time_point>& awaiting,
                                        Clock::time_point now) const;
  // A hinted removal was confirmed: the hints stand for the periodic sweep (logged once).
  void trust_hints(const std::string& hinted_id);
  // Same as find_missed_deleted_events for removals of armed ids a sweep found before their
  // hint came; their ids are disarmed at the source.
  void find_missed_hints(Clock::time_point now);
  // How long the sweep may wait for `rec` because something else announces its removal (the
  // runtime's events, a trusted hint); zero when nothing does.
  std::chrono::milliseconds sweep_wait_allowed(const Record& rec) const;
  // The record left the sweep: its id is disarmed in the kernel.
  void forget(const std::string& id);

  TrackerCore& core_;
  std::set<std::string> watched_;          // ids of the records that joined (a sweep walks these, not every record)
  std::optional<Clock::time_point> due_;  // the next sweep
  TrackerCore::TimerId sweep_timer_ = 0;  // its timer
  bool sweeping_ = false;                 // a sweep's lists are being made
  std::optional<Clock::time_point> last_sweep_;  // when the last one began
  std::chrono::milliseconds interval_{0};  // after that one
  bool joined_ = false;                    // a record joined since the last sweep
  // Removals a sweep found while the stream covered them, by when: each waits for its DELETED.
  std::map<std::string, Clock::time_point> awaiting_deleted_;
  bool events_miss_removals_ = false;  // the live stream left a removal out (until it stops)
  bool sandbox_deleted_seen_ = false;  // the live stream reported a sandbox's removal
  // The kernel's removal hint:
  RemovalHints* hints_ = nullptr;
  std::set<std::string> armed_;   // watched ids armed in the kernel
  std::set<std::string> hinted_;  // of those, the ones whose hint came
  // Sweeps (the first the hint's delay after it, then removal_hint_delay apart) that look for
  // a hinted container the runtime still lists.
  static constexpr int kHintRechecks = 3;
  std::map<std::string, int> rechecks_;  // hinted ids the sweep looks for soon, and how often more
  std::map<std::string, Clock::time_point> awaiting_hint_;  // removals found before their hint
  bool hints_trusted_ = false;
  bool hints_after_removal_ = false;
  bool hints_paused_ = false;  // the source reads nothing while the stream covers removals
  std::chrono::milliseconds hint_delay() const {
    return hints_after_removal_ ? core_.opts().removal_dir_hint_delay : core_.opts().removal_hint_delay;
  }
};

}  // namespace kpleg::pleg
