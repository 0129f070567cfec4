// ExitWakeup: whether the kernel's record of an init's exit must wake the tracker's loop.
//
// A death brings two records: the init's exit, and the rmdir of the container's cgroup when
// the runtime deletes the task (containerd and runc do that before they record the exit: the
// rmdir's chain of looks takes over from the exit's, confirmer.h). Each woke the loop, and the
// exit's wakeup only set a timer that the rmdir then replaced. Once kLearnAfter rmdirs in a row
// came before the exit's own look would have gone, the exit wakes nobody (the BPF program's
// exit_wakes, set through the callback): the rmdir wakes the loop and brings the exit along,
// so a death costs one wakeup fewer. The exit wakes again as soon as an exit's own look went
// (no rmdir came in time: a runtime that keeps the cgroup, a slow delete) or an exit was read
// later than its look would have gone; the learning then starts over. An OOM kill always wakes
// (bpf/kpleg.bpf.c).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

namespace kpleg::pleg {

class ExitWakeup {
 public:
  static constexpr int kLearnAfter = 16;

  // `set` (may be empty: nothing to switch, the exit always wakes) runs on the loop.
  explicit ExitWakeup(std::function<void(bool wake)> set = {}) : set_(std::move(set)) {}
  void set_switch(std::function<void(bool wake)> set) { set_ = std::move(set); }

  // A cgroup's rmdir came while its exit's chain still waited for its first look.
  void rmdir_in_time() {
    if (!set_ || !waking_ || ++streak_ < kLearnAfter) return;
    waking_ = false;
    ++turned_off_;
    set_(false);
  }
  // An exit's own first look went, or an exit was read later than it would have gone.
  void exit_alone() {
    streak_ = 0;
    if (waking_) return;
    waking_ = true;
    ++turned_on_;
    if (set_) set_(true);
  }

  bool waking() const { return waking_; }
  uint64_t turned_off() const { return turned_off_; }
  uint64_t turned_on() const { return turned_on_; }

 private:
  std::function<void(bool)> set_;
  bool waking_ = true;
  int streak_ = 0;
  uint64_t turned_off_ = 0, turned_on_ = 0;
};

}  // namespace kpleg::pleg
