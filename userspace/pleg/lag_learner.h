// How long the runtime takes to report a transition that the kernel has already seen, learned
// from the confirmations themselves, so that a confirmation looks once, when the answer is
// there, instead of asking a runtime that cannot know yet. containerd 1.6, for example, records
// an exit only after it has deleted the task, 25-40 ms after the kernel saw it: looking at once
// and then every few milliseconds cost 4-5 status calls per exit, and looking just before the
// usual lag still cost two.
//
// The first look aims at a high percentile of the lag (about the 94th): a confirmation whose
// first look was too early (it missed) moves the estimate up, halfway to where the answer was
// found but by at most 4 ms, so that one slow outlier does not make every later look late; one
// whose first look found the answer lowers it by a quarter of a millisecond, in case it was
// later than needed. Each miss costs a second look, so at that balance about one confirmation
// in sixteen needs two; a runtime that became faster is followed down within a few hundred
// confirmations. The first kWarmup confirmations move it without the 4 ms bound, so that a
// daemon that just started learns the runtime's lag within a few of them instead of paying for
// many misses. It never goes later than `cap`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

namespace kpleg::pleg {

class LagLearner {
 public:
  using ms = std::chrono::milliseconds;

  // `step`: the tracker's retry step after a missed first look (where the answer was then found).
  explicit LagLearner(ms cap = ms(100), ms step = ms(5)) : cap_(cap), step_(step) {}

  // When to look first, after the signal.
  ms first_look() const {
    return ms(std::lround(std::clamp(estimate_ms_, 0.0, double(cap_.count()))));
  }

  // A confirmation settled. `last_miss`: when (after the signal) the last look that still saw
  // the old state was made; nullopt when the first look already saw the new state.
  void settled(std::optional<ms> last_miss) {
    ++samples_;
    if (!last_miss) {
      estimate_ms_ = std::max(0.0, estimate_ms_ - kDownMs);
      return;
    }
    up_to(double(last_miss->count() + step_.count()));
  }

  // Another chain of looks (after a later signal) found the answer `at` after this one's
  // signal: this chain made no look that could say whether it was there earlier.
  void found_by_other(ms at) {
    ++samples_;
    if (double(at.count()) > estimate_ms_) {
      up_to(double(at.count()));
    } else {
      estimate_ms_ = std::max(0.0, estimate_ms_ - kDownMs);
    }
  }

  double estimate_ms() const { return estimate_ms_; }
  // Confirmations it has learned from.
  int samples() const { return samples_; }

 private:
  void up_to(double found_ms) {
    const double found = std::min(found_ms, double(cap_.count()));
    if (found <= estimate_ms_) return;
    const double up = kUp * (found - estimate_ms_);
    estimate_ms_ += samples_ <= kWarmup ? up : std::min(up, kUpMaxMs);
  }

  static constexpr double kUp = 0.5;
  static constexpr double kUpMaxMs = 4.0;
  static constexpr double kDownMs = 0.25;
  static constexpr int kWarmup = 8;
  const ms cap_, step_;
  int samples_ = 0;
  double estimate_ms_ = 0;  // look at once until something is learned
};

}  // namespace kpleg::pleg
