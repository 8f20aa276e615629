#include "common/progress_rate.h"

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

TEST(ProgressRateTest, NoRateBeforeTwoPoints) {
  ProgressRate rate;
  EXPECT_EQ(rate.steps_per_s(), 0);
  rate.Add(kT0, 5);
  EXPECT_EQ(rate.steps_per_s(), 0);
  rate.Add(kT0, 6);  // no time between them
  EXPECT_EQ(rate.steps_per_s(), 0);
}

TEST(ProgressRateTest, StepsOverTheWindowNotTheLastStep) {
  ProgressRate rate(absl::Seconds(30));
  // 2 steps/s for 40 s, then one slow step of 4 s: the window's rate, not 1 / 4 s.
  for (int i = 0; i <= 80; ++i) rate.Add(kT0 + absl::Milliseconds(500) * i, i);
  EXPECT_DOUBLE_EQ(rate.steps_per_s(), 2.0);
  rate.Add(kT0 + absl::Seconds(44), 81);
  // The window: from the newest point before 44 - 30 = 14 s (step 28 at 14 s) to 44 s.
  EXPECT_DOUBLE_EQ(rate.steps_per_s(), (81 - 28) / 30.0);
}

TEST(ProgressRateTest, AStepLongerThanTheWindowStillCounts) {
  ProgressRate rate(absl::Seconds(30));
  rate.Add(kT0, 10);
  rate.Add(kT0 + absl::Seconds(60), 11);
  rate.Add(kT0 + absl::Seconds(120), 12);
  EXPECT_DOUBLE_EQ(rate.steps_per_s(), 1 / 60.0);
}

TEST(ProgressRateTest, AStepBackStartsAgain) {
  ProgressRate rate(absl::Seconds(30));
  rate.Add(kT0, 260);
  rate.Add(kT0 + absl::Seconds(10), 265);
  // A restore from step 200's checkpoint: no negative or mixed rate.
  rate.Add(kT0 + absl::Seconds(20), 200);
  EXPECT_EQ(rate.steps_per_s(), 0);
  rate.Add(kT0 + absl::Seconds(24), 210);
  EXPECT_DOUBLE_EQ(rate.steps_per_s(), 2.5);
}

TEST(ProgressRateTest, TimeOutsideTheStepsIsNotCounted) {
  ProgressRate rate(absl::Seconds(30));
  rate.Add(kT0, 0);
  rate.Add(kT0 + absl::Seconds(5), 10);
  rate.Exclude(absl::Seconds(20));  // an evaluation after step 10
  rate.Add(kT0 + absl::Seconds(30), 20);
  EXPECT_DOUBLE_EQ(rate.steps_per_s(), 2.0);
}

TEST(EtaSecondsTest, StepsLeftAtTheRate) {
  EXPECT_DOUBLE_EQ(*EtaSeconds(100, 600, 10), 50);
  EXPECT_DOUBLE_EQ(*EtaSeconds(600, 600, 10), 0);
  EXPECT_DOUBLE_EQ(*EtaSeconds(700, 600, 10), 0);
  EXPECT_DOUBLE_EQ(*EtaSeconds(-1, 600, 10), 60);
  EXPECT_FALSE(EtaSeconds(100, 600, 0).has_value());
  EXPECT_FALSE(EtaSeconds(100, 0, 10).has_value());
}

TEST(ResumeTextTest, SaysTheStepsLostAndWhy) {
  EXPECT_EQ(ResumeText(265, 200, "step 200's checkpoint",
                       "its state is sharded over the ranks (ZeRO-2)"),
            "resumed from step 200's checkpoint: 65 steps lost (the job had reached step 265), "
            "because its state is sharded over the ranks (ZeRO-2)");
  EXPECT_EQ(ResumeText(201, 200, "step 200's checkpoint", ""),
            "resumed from step 200's checkpoint: 1 step lost (the job had reached step 201)");
  EXPECT_EQ(ResumeText(120, 120, "rank 1's memory", ""),
            "resumed from rank 1's memory: no step lost");
  EXPECT_EQ(ResumeText(30, -1, "scratch", "no trainer kept it"),
            "resumed from scratch: 30 steps lost (the job had reached step 30), because no "
            "trainer kept it");
  EXPECT_EQ(ResumeText(-1, 0, "scratch", ""), "resumed from scratch");
}

TEST(EtaTextTest, AsEveryViewWritesIt) {
  EXPECT_EQ(EtaText(0), "0s");
  EXPECT_EQ(EtaText(42.4), "42s");
  EXPECT_EQ(EtaText(93.75), "1m34s");
  EXPECT_EQ(EtaText(3 * 60 + 5), "3m05s");
  EXPECT_EQ(EtaText(3720), "1h02m");
}

TEST(RateWindowTextTest, NamesTheWindow) {
  EXPECT_EQ(RateWindowText(), "over the last 30 s of steps");
}

}  // namespace
}  // namespace ringmaster
