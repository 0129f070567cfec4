// How long the runtime takes to report a transition that the kernel has already seen, learned
// from the confirmations themselves, so that a confirmation first looks when the answer is
// likely there instead of asking a runtime that cannot know yet. containerd 1.6, for example,
// records an exit only after it has deleted the task, 25-40 ms after the kernel saw it: looking
// at once and then every few milliseconds cost 4-5 status calls per exit.
//
// The estimate follows the last look that still saw the old state (a lower bound of the lag);
// a first look that already saw the new state pulls it down. The first look goes slightly
// before the estimate and never later than `cap`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

namespace kpleg::pleg {

class LagLearner {
 public:
  using ms = std::chrono::milliseconds;

  explicit LagLearner(ms cap = ms(100), ms lead = ms(2), ms pull_down = ms(5))
      : cap_(cap), lead_(lead), pull_down_(pull_down) {}

  // When to look first, after the signal.
  ms first_look() const {
    double at = estimate_ms_ - double(lead_.count());
    at = std::clamp(at, 0.0, double(cap_.count()));
    return ms(std::lround(at));
  }

  // A confirmation settled. `last_miss`: when (after the signal) the last look that still saw
  // the old state was made; nullopt when the first look already saw the new state.
  void settled(std::optional<ms> last_miss) {
    double sample = last_miss ? double(last_miss->count())
                              : std::max(0.0, double(first_look().count() - pull_down_.count()));
    sample = std::min(sample, double(cap_.count()) + double(lead_.count()));
    estimate_ms_ = kWeight * sample + (1 - kWeight) * estimate_ms_;
  }

  double estimate_ms() const { return estimate_ms_; }

 private:
  static constexpr double kWeight = 0.25;
  const ms cap_, lead_, pull_down_;
  double estimate_ms_ = 0;  // look at once until something is learned
};

}  // namespace kpleg::pleg
