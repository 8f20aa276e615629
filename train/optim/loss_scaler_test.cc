#include "train/optim/loss_scaler.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

using Mode = LossScalerOptions::Mode;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// What the model would produce with loss scale `scale`: 1.5 * scale everywhere, and `bad`
// at the end of the (odd-length) buffer when it is not 0.
std::vector<float> ScaledGrads(float scale, float bad = 0) {
  std::vector<float> g(37, 1.5f * scale);
  if (bad != 0) g.back() = bad;
  return g;
}

struct Expected {
  float bad;  // 0: a good step; inf or NaN: an injected overflow
  StepVerdict verdict;
  double scale_after;
  int64_t good_steps_after;
};

void RunScript(LossScaler& scaler, const std::vector<Expected>& script) {
  int line = 0;
  for (const Expected& e : script) {
    ++line;
    std::vector<float> g = ScaledGrads(scaler.scale(), e.bad);
    auto verdict = scaler.UnscaleAndUpdate(absl::MakeSpan(g), SumOnOneRank);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(*verdict, e.verdict) << "line " << line;
    EXPECT_EQ(scaler.state().scale, e.scale_after) << "line " << line;
    EXPECT_EQ(scaler.state().good_steps, e.good_steps_after) << "line " << line;
    if (e.bad == 0) {
      EXPECT_EQ(g[0], 1.5f) << "unscaled, line " << line;
    }
  }
}

LossScaler MakeScaler(const LossScalerOptions& options) {
  return LossScaler::Create(options).value();
}

TEST(LossScaler, DynamicSkipsBacksOffAndGrowsAfterTheInterval) {
  LossScaler scaler = MakeScaler({.initial_scale = 1024, .growth_interval = 3});
  EXPECT_EQ(scaler.scale(), 1024.0f);
  RunScript(scaler, {
                        {0, StepVerdict::kApply, 1024, 1},
                        {0, StepVerdict::kApply, 1024, 2},
                        {0, StepVerdict::kApply, 2048, 0},  // third good step: grow
                        {kInf, StepVerdict::kSkip, 1024, 0},
                        {0, StepVerdict::kApply, 1024, 1},
                        {kNan, StepVerdict::kSkip, 512, 0},  // the interval starts again
                        {0, StepVerdict::kApply, 512, 1},
                        {0, StepVerdict::kApply, 512, 2},
                        {-kInf, StepVerdict::kSkip, 256, 0},
                        {0, StepVerdict::kApply, 256, 1},
                        {0, StepVerdict::kApply, 256, 2},
                        {0, StepVerdict::kApply, 512, 0},
                    });
  EXPECT_EQ(scaler.state(), (state::LossScalerState{
                                .scale = 512, .good_steps = 0, .steps = 12, .skipped_steps = 3}));
}

TEST(LossScaler, BackOffStopsAtMinScale) {
  LossScaler scaler = MakeScaler({.initial_scale = 4, .min_scale = 1});
  RunScript(scaler, {
                        {kInf, StepVerdict::kSkip, 2, 0},
                        {kInf, StepVerdict::kSkip, 1, 0},
                        {kInf, StepVerdict::kSkip, 1, 0},
                    });
  EXPECT_EQ(scaler.state().skipped_steps, 3);
}

TEST(LossScaler, GrowthStopsAtTheFloatRange) {
  LossScaler scaler = MakeScaler({.initial_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  RunScript(scaler, {{0, StepVerdict::kApply, std::ldexp(1.0, 127), 0}});
}

TEST(LossScaler, FixedModeSkipsOverflowsButNeverChangesTheScale) {
  LossScaler scaler =
      MakeScaler({.mode = Mode::kFixed, .initial_scale = 128, .growth_interval = 2});
  RunScript(scaler, {
                        {0, StepVerdict::kApply, 128, 1},
                        {0, StepVerdict::kApply, 128, 2},
                        {0, StepVerdict::kApply, 128, 3},
                        {kNan, StepVerdict::kSkip, 128, 0},
                        {kInf, StepVerdict::kSkip, 128, 0},
                        {0, StepVerdict::kApply, 128, 1},
                    });
  EXPECT_EQ(scaler.state().skipped_steps, 2);
  EXPECT_EQ(scaler.state().steps, 6);
}

TEST(LossScaler, OverflowOnOneRankSkipsTheStepOnEveryRank) {
  constexpr int kWorld = 3;
  std::vector<LossScaler> scalers(kWorld, MakeScaler({.initial_scale = 256}));
  std::vector<StepVerdict> verdicts(kWorld);
  testing::FakeRanks group(kWorld);
  group.Run([&](int rank, const SumAcrossRanks& sum) {
    std::vector<float> g = ScaledGrads(256, rank == 1 ? kInf : 0);
    auto verdict = scalers[rank].UnscaleAndUpdate(absl::MakeSpan(g), sum);
    ASSERT_TRUE(verdict.ok());
    verdicts[rank] = *verdict;
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(verdicts[rank], StepVerdict::kSkip) << rank;
    EXPECT_EQ(scalers[rank].state(), scalers[0].state());
  }
  EXPECT_EQ(scalers[0].scale(), 128.0f);
  EXPECT_EQ(group.rounds(), 1);
}

TEST(LossScaler, FailedSumKeepsTheState) {
  LossScaler scaler = MakeScaler({});
  const state::LossScalerState before = scaler.state();
  std::vector<float> g = ScaledGrads(scaler.scale());
  auto verdict = scaler.UnscaleAndUpdate(absl::MakeSpan(g), [](absl::Span<double>) {
    return absl::DeadlineExceededError("all-reduce timed out");
  });
  EXPECT_EQ(verdict.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(scaler.state(), before);
}

TEST(LossScaler, RestoreTakesSavedStateAndRejectsImpossibleOnes) {
  LossScaler scaler = MakeScaler({});
  const state::LossScalerState saved{
      .scale = 2048, .good_steps = 17, .steps = 40, .skipped_steps = 5};
  ASSERT_TRUE(scaler.Restore(saved).ok());
  EXPECT_EQ(scaler.state(), saved);
  EXPECT_EQ(scaler.scale(), 2048.0f);

  const state::LossScalerState bad[] = {
      {.scale = 0.5, .steps = 1},  // below min_scale 1
      {.scale = kNan},
      {.scale = 1e39},  // beyond float
      {.scale = 8, .good_steps = -1},
      {.scale = 8, .steps = 2, .skipped_steps = 3},
  };
  for (const state::LossScalerState& s : bad) {
    EXPECT_EQ(scaler.Restore(s).code(), absl::StatusCode::kInvalidArgument) << s.scale;
  }
  EXPECT_EQ(scaler.state(), saved);

  LossScaler fixed = MakeScaler({.mode = Mode::kFixed, .initial_scale = 64});
  ASSERT_TRUE(fixed.Restore(saved).ok());
  EXPECT_EQ(fixed.scale(), 64.0f) << "a fixed scale is configuration";
  EXPECT_EQ(fixed.state().skipped_steps, 5);
}

TEST(LossScaler, CreateRejectsBadSettingsNamingThem) {
  const struct {
    LossScalerOptions options;
    std::string message;
  } kBad[] = {
      {{.initial_scale = 0}, "initial_scale must be > 0 and finite, got 0"},
      {{.growth_factor = 1}, "growth_factor must be > 1 and finite, got 1"},
      {{.backoff_factor = 1}, "backoff_factor must be in (0, 1), got 1"},
      {{.growth_interval = 0}, "growth_interval must be >= 1, got 0"},
      {{.initial_scale = 8, .min_scale = 16}, "min_scale must be in (0, 8], got 16"},
  };
  for (const auto& bad : kBad) {
    auto scaler = LossScaler::Create(bad.options);
    EXPECT_EQ(scaler.status().code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_EQ(scaler.status().message(), bad.message);
  }
  // min_scale is a dynamic-mode setting: a fixed scale below it is fine.
  EXPECT_TRUE(LossScaler::Create({.mode = Mode::kFixed, .initial_scale = 0.5}).ok());
}

TEST(LossScaler, Describe) {
  EXPECT_EQ(MakeScaler({}).Describe(),
            "dynamic loss scale 65536 (x2 after 2000 good steps, x0.5 on overflow, >= 1)");
  EXPECT_EQ(MakeScaler({.mode = Mode::kFixed, .initial_scale = 128}).Describe(),
            "fixed loss scale 128 (overflowing steps skipped)");
}

}  // namespace
}  // namespace ringmaster::train
