#include "common/clock.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(FakeClock, AdvanceMovesNow) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(105));
}

TEST(FakeClock, SleepUntilWakesOnlyWhenAdvancedPastDeadline) {
  FakeClock clock(absl::FromUnixSeconds(0));
  absl::Notification woke;
  std::thread sleeper([&] {
    clock.SleepUntil(absl::FromUnixSeconds(10));
    woke.Notify();
  });
  while (clock.sleepers() == 0) absl::SleepFor(absl::Milliseconds(1));
  clock.Advance(absl::Seconds(9));
  EXPECT_FALSE(woke.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(woke.WaitForNotificationWithTimeout(absl::Seconds(10)));
  sleeper.join();
}

TEST(RealClock, SleepUntilPastDeadlineReturnsAtOnce) {
  absl::Time start = absl::Now();
  Clock::Real()->SleepUntil(start - absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_GE(Clock::Real()->Now(), start);
}

}  // namespace
}  // namespace ringmaster
