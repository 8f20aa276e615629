#include "train/optim/lr_schedule.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

using Decay = LrScheduleOptions::Decay;

LrSchedule Make(const LrScheduleOptions& options) { return LrSchedule::Create(options).value(); }

// base 0.1 at batch 128, run at 512: peak 0.4; warm-up 100 steps; decay until step 1100.
LrScheduleOptions Scaled(Decay decay) {
  return {.base_lr = 0.1,
          .base_batch = 128,
          .global_batch = 512,
          .warmup_steps = 100,
          .decay = decay,
          .min_lr_ratio = 0.1,
          .total_steps = 1100};
}

TEST(LrSchedule, CosineKeyValues) {
  const LrSchedule s = Make(Scaled(Decay::kCosine));
  EXPECT_DOUBLE_EQ(s.peak_lr(), 0.4);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(25), 0.1);
  EXPECT_DOUBLE_EQ(s.LrAt(50), 0.2);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 0.4);              // warm-up end: the peak
  EXPECT_DOUBLE_EQ(s.LrAt(600), 0.04 + 0.36 / 2);  // middle of the decay: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.LrAt(350), 0.04 + 0.36 * (1 + 1 / std::sqrt(2.0)) / 2);  // cos(pi/4)
  EXPECT_DOUBLE_EQ(s.LrAt(1100), 0.04);  // end: min_lr_ratio x peak
  EXPECT_DOUBLE_EQ(s.LrAt(100000), 0.04);
  for (int64_t step = 100; step < 1100; ++step) {
    ASSERT_LT(s.LrAt(step + 1), s.LrAt(step)) << step;
  }
}

TEST(LrSchedule, LinearKeyValues) {
  const LrSchedule s = Make(Scaled(Decay::kLinear));
  EXPECT_DOUBLE_EQ(s.LrAt(100), 0.4);
  EXPECT_DOUBLE_EQ(s.LrAt(350), 0.4 - 0.36 / 4);
  EXPECT_DOUBLE_EQ(s.LrAt(600), 0.22);
  EXPECT_DOUBLE_EQ(s.LrAt(1100), 0.04);
  EXPECT_DOUBLE_EQ(s.LrAt(2000), 0.04);
}

TEST(LrSchedule, ConstantAfterWarmup) {
  const LrSchedule s = Make(Scaled(Decay::kConstant));
  EXPECT_DOUBLE_EQ(s.LrAt(50), 0.2);
  for (int64_t step : {100, 600, 1100, 5000}) EXPECT_DOUBLE_EQ(s.LrAt(step), 0.4) << step;
}

TEST(LrSchedule, WarmupFromAFraction) {
  LrScheduleOptions o = Scaled(Decay::kCosine);
  o.warmup_start_ratio = 0.25;
  const LrSchedule s = Make(o);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.1);
  EXPECT_DOUBLE_EQ(s.LrAt(50), 0.1 + 0.3 / 2);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 0.4);
}

TEST(LrSchedule, NoScalingNoWarmup) {
  const LrSchedule s = Make({.base_lr = 0.003, .total_steps = 10});
  EXPECT_DOUBLE_EQ(s.peak_lr(), 0.003);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.003);
  EXPECT_DOUBLE_EQ(s.LrAt(5), 0.0015);
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.0);
}

TEST(LrSchedule, WarmupAsLongAsTheRun) {
  const LrSchedule s =
      Make({.base_lr = 1, .warmup_steps = 4, .min_lr_ratio = 0.5, .total_steps = 4});
  EXPECT_DOUBLE_EQ(s.LrAt(3), 0.75);
  EXPECT_DOUBLE_EQ(s.LrAt(4), 0.5);  // the run is over: the floor
}

// Issue 36 point 12: a short smoke run (steps=2) of a spec with a warm-up of 100 steps was
// refused; now the warm-up spans the run, and the schedule says so.
TEST(LrSchedule, WarmupLongerThanTheRunIsClampedAndSaidSo) {
  const LrSchedule s = Make({.base_lr = 1, .warmup_steps = 100, .total_steps = 2});
  EXPECT_EQ(s.clamped_warmup_steps(), 100);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(2), 0);  // the run is over: the floor
  EXPECT_EQ(s.Describe(),
            "lr peak 1, warm-up from 0 over 2 steps (schedule.warmup_steps 100 clamped to the "
            "run's 2 steps), cosine decay to 0 at step 2");
  EXPECT_EQ(Make({.base_lr = 1, .warmup_steps = 2, .total_steps = 2}).clamped_warmup_steps(), 0);
}

TEST(LrSchedule, DescribeGivesTheEffectiveValues) {
  EXPECT_EQ(Make(Scaled(Decay::kCosine)).Describe(),
            "lr peak 0.4 (base_lr 0.1 x global_batch 512 / base_batch 128), warm-up from 0 "
            "over 100 steps, cosine decay to 0.04 at step 1100");
  EXPECT_EQ(Make({.base_lr = 0.01, .decay = Decay::kConstant, .total_steps = 50}).Describe(),
            "lr peak 0.01, no warm-up, constant after the warm-up (50 steps)");
}

TEST(LrSchedule, RejectsBadSettingsNamingThem) {
  const struct {
    LrScheduleOptions options;
    std::string message;
  } kBad[] = {
      {{.base_lr = -0.1}, "base_lr must be >= 0 and finite, got -0.1"},
      {{.base_batch = -1}, "base_batch must be >= 0, got -1"},
      {{.base_batch = 256}, "global_batch must be >= 1, got 0"},
      {{.total_steps = 0}, "total_steps must be >= 1, got 0"},
      {{.warmup_steps = -5}, "warmup_steps must be >= 0, got -5"},
      {{.warmup_start_ratio = 1.5}, "warmup_start_ratio must be in [0, 1], got 1.5"},
      {{.min_lr_ratio = -0.1}, "min_lr_ratio must be in [0, 1], got -0.1"},
  };
  for (const auto& bad : kBad) {
    auto s = LrSchedule::Create(bad.options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_EQ(s.status().message(), bad.message);
  }
}

}  // namespace
}  // namespace ringmaster::train
