// LagLearner: first looks move to where the runtime's answer usually is, never past the cap,
// and come back down when they turn out to be late.
#include "pleg/lag_learner.h"

#include <gtest/gtest.h>

namespace kpleg::pleg {
namespace {

using ms = std::chrono::milliseconds;

// A runtime that reports the transition `lag` after the signal, looked at the way the tracker
// does: first at first_look(), then in steps of 5 ms. Returns the number of looks.
int confirm_once(LagLearner& l, ms lag) {
  ms at = l.first_look();
  std::optional<ms> last_miss;
  int looks = 1;
  while (at < lag) {
    last_miss = at;
    at += ms(5);
    ++looks;
  }
  l.settled(last_miss);
  return looks;
}

TEST(LagLearner, CountsWhatItLearnedFrom) {
  LagLearner l;
  EXPECT_EQ(l.samples(), 0);
  l.settled(std::nullopt);
  l.found_by_other(ms(30));
  EXPECT_EQ(l.samples(), 2);
}

TEST(LagLearner, LooksAtOnceUntilItHasLearned) {
  LagLearner l;
  EXPECT_EQ(l.first_look(), ms(0));
}

TEST(LagLearner, ASteadyLagIsConfirmedWithFewLooks) {
  LagLearner l;
  EXPECT_GE(confirm_once(l, ms(30)), 6) << "before learning: a look every 5 ms";
  for (int i = 0; i < 30; ++i) confirm_once(l, ms(30));
  int looks = 0;
  for (int i = 0; i < 60; ++i) looks += confirm_once(l, ms(30));
  EXPECT_LE(looks, 75) << "at most 1.25 looks per confirmation once learned (7 before)";
  EXPECT_LE(l.first_look(), ms(35)) << "at most one retry step after the lag";
  EXPECT_GE(l.first_look(), ms(25));
}

TEST(LagLearner, AJitteryLagIsMostlyConfirmedWithOneLook) {
  LagLearner l;
  auto lag = [i = 0]() mutable { return ms(26 + (i++ * 7) % 10); };  // 26..35 ms
  for (int i = 0; i < 50; ++i) confirm_once(l, lag());
  int looks = 0;
  for (int i = 0; i < 100; ++i) looks += confirm_once(l, lag());
  EXPECT_LE(looks, 140) << "at most 1.4 looks per confirmation";
  EXPECT_LE(l.first_look(), ms(45)) << "not far after the slowest answers";
}

TEST(LagLearner, AFasterRuntimeBringsTheFirstLookBackDown) {
  LagLearner l;
  for (int i = 0; i < 30; ++i) confirm_once(l, ms(40));
  ASSERT_GE(l.first_look(), ms(30));
  for (int i = 0; i < 200; ++i) confirm_once(l, ms(2));
  EXPECT_LE(l.first_look(), ms(5));
}

TEST(LagLearner, TheFirstLookIsCapped) {
  LagLearner l(ms(100));
  for (int i = 0; i < 50; ++i) l.settled(ms(5000));
  EXPECT_EQ(l.first_look(), ms(100));
}

TEST(LagLearner, ADaemonThatJustStartedLearnsTheLagWithinAFewConfirmations) {
  LagLearner l;
  for (int i = 0; i < 4; ++i) confirm_once(l, ms(30));
  EXPECT_GE(l.first_look(), ms(25)) << "learned within its first 4 confirmations";
}

TEST(LagLearner, OneSlowAnswerMovesTheFirstLookLittle) {
  LagLearner l(ms(100));
  for (int i = 0; i < 40; ++i) confirm_once(l, ms(10));
  const auto before = l.first_look();
  confirm_once(l, ms(95));  // the machine stalled once
  EXPECT_LE(l.first_look(), before + ms(4));
}

// A chain that gave way to another (the exit's, to the rmdir's) learns where the other found
// the answer, so that its own first look comes after it.
TEST(LagLearner, AnswersFoundByAnotherChainMoveTheFirstLookPastThem) {
  LagLearner l(ms(100));
  for (int i = 0; i < 60; ++i) l.found_by_other(ms(25 + i % 6));
  EXPECT_GE(l.first_look(), ms(25));
  EXPECT_LE(l.first_look(), ms(31));
  for (int i = 0; i < 40; ++i) l.found_by_other(ms(5000));
  EXPECT_EQ(l.first_look(), ms(100)) << "capped";
  for (int i = 0; i < 400; ++i) l.found_by_other(ms(10));
  EXPECT_LE(l.first_look(), ms(11)) << "earlier answers bring it back down";
}

}  // namespace
}  // namespace kpleg::pleg
