// How long the runtime takes to report a transition that the kernel has already seen, learned
// from the confirmations themselves, so that a confirmation looks once, when the answer is
// there, instead of asking a runtime that cannot know yet. containerd 1.6, for example, records
// an exit only after it has deleted the task, 25-40 ms after the kernel saw it: looking at once
// and then every few milliseconds cost 4-5 status calls per exit, and looking just before the
// usual lag still cost two.
//
// The first look aims at a high percentile of the lag: a confirmation whose first look was too
// early (it missed) moves the estimate halfway up to where the answer was found; one whose
// first look found the answer lowers it by a small step, in case it was later than needed, so
// that most confirmations need one look and a first look is at most a few milliseconds late.
// It never goes later than `cap`.
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
    if (!last_miss) {
      estimate_ms_ = std::max(0.0, estimate_ms_ - kDownMs);
      return;
    }
    const double found = std::min(double(last_miss->count() + step_.count()),
                                  double(cap_.count()));
    if (found > estimate_ms_) estimate_ms_ += kUp * (found - estimate_ms_);
  }

  double estimate_ms() const { return estimate_ms_; }

 private:
  static constexpr double kUp = 0.5;
  static constexpr double kDownMs = 0.5;
  const ms cap_, step_;
  double estimate_ms_ = 0;  // look at once until something is learned
};

}  // namespace kpleg::pleg
