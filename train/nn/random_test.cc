#include "train/nn/random.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::train::nn {
namespace {

TEST(SplitMix64, MatchesTheReferenceSequence) {
  // The first outputs of Vigna's splitmix64.c for seed 0.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xe220a8397b1dcdafu);
  EXPECT_EQ(rng.Next(), 0x6e789e6aa1b965f4u);
  EXPECT_EQ(rng.Next(), 0x06c45d188009454fu);
}

TEST(FillUniform, StaysInRangeWithUniformMoments) {
  SplitMix64 rng(42);
  std::vector<float> v(100000);
  const float bound = 0.125f;
  FillUniform(rng, bound, absl::MakeSpan(v));
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    ASSERT_GE(x, -bound);
    ASSERT_LT(x, bound);
    sum += x;
    sum_sq += double{x} * x;
  }
  // Uniform on [-b, b): mean 0, variance b²/3. Standard errors for 1e5 draws: the mean
  // b/sqrt(3e5) = 2.3e-4, the variance about 1.5e-5; these bounds are 5 of them.
  EXPECT_NEAR(sum / v.size(), 0.0, 1.2e-3);
  EXPECT_NEAR(sum_sq / v.size(), bound * bound / 3, 7.5e-5);
}

TEST(SplitMix64, NextUnitIsAMultipleOf2ToTheMinus24InUnitInterval) {
  SplitMix64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const float u = rng.NextUnit();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u * 0x1p24f, std::floor(u * 0x1p24f));
  }
}

}  // namespace
}  // namespace ringmaster::train::nn
