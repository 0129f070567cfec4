#include "pleg/exit_wakeup.h"

#include <gtest/gtest.h>

#include <vector>

namespace kpleg::pleg {
namespace {

struct Switch {
  std::vector<bool> calls;
  ExitWakeup w{[this](bool wake) { calls.push_back(wake); }};
};

TEST(ExitWakeup, OffAfterAWindowOfRmdirsInTime) {
  Switch s;
  for (int i = 0; i < ExitWakeup::kWindow - 1; ++i) s.w.rmdir_in_time();
  EXPECT_TRUE(s.w.waking()) << "a window not full yet";
  s.w.rmdir_in_time();
  EXPECT_FALSE(s.w.waking());
  EXPECT_EQ(s.calls, std::vector<bool>{false});
  EXPECT_EQ(s.w.turned_off(), 1u);
}

TEST(ExitWakeup, OneExitAloneInTheWindowIsAllowedTwoAreNot) {
  Switch s;
  s.w.exit_alone();
  for (int i = 0; i < ExitWakeup::kWindow - 1; ++i) s.w.rmdir_in_time();
  EXPECT_FALSE(s.w.waking()) << "15 of 16 in time";

  Switch t;
  t.w.exit_alone();
  t.w.rmdir_in_time();
  t.w.exit_alone();
  for (int i = 0; i < ExitWakeup::kWindow - 3; ++i) t.w.rmdir_in_time();
  EXPECT_TRUE(t.w.waking()) << "14 of 16 in time";
  // The first alone one leaves the window with the next death: 15 of 16.
  t.w.rmdir_in_time();
  EXPECT_FALSE(t.w.waking());
}

TEST(ExitWakeup, AnExitAloneWhileOffTurnsItOnAndLearningStartsOver) {
  Switch s;
  for (int i = 0; i < ExitWakeup::kWindow; ++i) s.w.rmdir_in_time();
  ASSERT_FALSE(s.w.waking());
  s.w.rmdir_in_time();  // nothing to learn while off
  s.w.exit_alone();
  EXPECT_TRUE(s.w.waking());
  EXPECT_EQ(s.calls, (std::vector<bool>{false, true}));
  EXPECT_EQ(s.w.turned_on(), 1u);
  for (int i = 0; i < ExitWakeup::kWindow - 1; ++i) s.w.rmdir_in_time();
  EXPECT_TRUE(s.w.waking()) << "a whole window again";
  s.w.rmdir_in_time();
  EXPECT_FALSE(s.w.waking());
}

TEST(ExitWakeup, WithoutASwitchExitsAlwaysWake) {
  ExitWakeup w;
  for (int i = 0; i < 3 * ExitWakeup::kWindow; ++i) w.rmdir_in_time();
  EXPECT_TRUE(w.waking());
  EXPECT_EQ(w.turned_off(), 0u);
}

}  // namespace
}  // namespace kpleg::pleg
