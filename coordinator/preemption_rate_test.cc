#include "coordinator/preemption_rate.h"

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(PreemptionRateTest, NoticesOverTheWindowPerNodeHour) {
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  PreemptionRate rate(absl::Hours(6));
  EXPECT_EQ(rate.PerNodeHour(t0, 4), 0);
  rate.Record(t0);
  rate.Record(t0 + absl::Hours(1));
  rate.Record(t0 + absl::Hours(2));
  // 3 notices in 6 hours over 4 nodes: 3 / 6 / 4 = 0.125 per node-hour.
  EXPECT_EQ(rate.Recent(t0 + absl::Hours(2)), 3);
  EXPECT_DOUBLE_EQ(rate.PerNodeHour(t0 + absl::Hours(2), 4), 0.125);
  // No nodes known counts as one.
  EXPECT_DOUBLE_EQ(rate.PerNodeHour(t0 + absl::Hours(2), 0), 0.5);
  // The first notice leaves the window 6 hours after it, the others later.
  EXPECT_EQ(rate.Recent(t0 + absl::Hours(6) - absl::Seconds(1)), 3);
  EXPECT_EQ(rate.Recent(t0 + absl::Hours(6)), 2);
  EXPECT_EQ(rate.Recent(t0 + absl::Hours(8)), 0);
  EXPECT_EQ(rate.PerNodeHour(t0 + absl::Hours(9), 4), 0);
  // Recording forgets what left the window.
  rate.Record(t0 + absl::Hours(20));
  EXPECT_EQ(rate.Recent(t0 + absl::Hours(20)), 1);
}

}  // namespace
}  // namespace ringmaster
