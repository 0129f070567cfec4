// ExitWakeup: whether the kernel's record of an init's exit must wake the tracker's loop.
//
// A death brings two records: the init's exit, and the rmdir of the container's cgroup when
// the runtime deletes the task (containerd and runc do that before they record the exit: the
// rmdir's chain of looks takes over from the exit's, confirmer.h). Each woke the loop, and the
// exit's wakeup only set a timer that the rmdir then replaced. Once the rmdir came before the
// runtime recorded the death (while the exit's chain still waited for a look) in kWindow - 1 of
// the last kWindow deaths, the exit wakes nobody (the BPF program's exit_wakes, set through the
// callback): the rmdir wakes the loop and brings the exit along, so a death costs one wakeup
// fewer. (One death in the window may have gone otherwise: a lost record, a race.) The first
// death that the exit's own chain confirms (the runtime recorded it and no rmdir had come: a
// runtime that keeps the cgroup, a nested init, a delete that failed) makes exits wake again,
// and the learning starts over. A slow rmdir is not such a death: the runtime records it after
// the rmdir all the same. An OOM kill always wakes (bpf/kpleg.bpf.c).
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <utility>

namespace kpleg::pleg {

class ExitWakeup {
 public:
  static constexpr int kWindow = 16;

  // `set` (may be empty: nothing to switch, the exit always wakes) runs on the loop.
  explicit ExitWakeup(std::function<void(bool wake)> set = {}) : set_(std::move(set)) {}
  void set_switch(std::function<void(bool wake)> set) { set_ = std::move(set); }

  // A cgroup's rmdir came while its exit's chain still waited for its look.
  void rmdir_in_time() { note(true); }
  // The exit's own chain confirmed a death: no rmdir came before the runtime recorded it.
  void exit_alone() {
    if (!waking_) {
      waking_ = true;
      ++turned_on_;
      seen_ = 0;
      in_time_ = 0;
      if (set_) set_(true);
      return;
    }
    note(false);
  }

  bool waking() const { return waking_; }
  uint64_t turned_off() const { return turned_off_; }
  uint64_t turned_on() const { return turned_on_; }

 private:
  void note(bool in_time) {
    if (!set_ || !waking_) return;
    in_time_ = (in_time_ << 1) | (in_time ? 1u : 0u);
    if (seen_ < kWindow) ++seen_;
    const uint32_t window = in_time_ & ((1u << kWindow) - 1);
    if (seen_ < kWindow || std::popcount(window) < kWindow - 1) return;
    waking_ = false;
    ++turned_off_;
    set_(false);
  }

  std::function<void(bool)> set_;
  bool waking_ = true;
  int seen_ = 0;          // deaths noted since the learning (re)started, up to kWindow
  uint32_t in_time_ = 0;  // the last deaths, newest in bit 0: 1 when the rmdir came in time
  uint64_t turned_off_ = 0, turned_on_ = 0;
};

}  // namespace kpleg::pleg
