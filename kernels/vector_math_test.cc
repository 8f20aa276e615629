#include "kernels/cpu/vector_math.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace ringmaster::kernels {
namespace {

// 2^21 + 1 evenly spaced arguments from lo to hi, then every float in [-2^-10, 2^-10] that is a
// multiple of 2^-30 (small arguments, where the reductions are most delicate).
template <typename Fn>
void ForFloatsIn(float lo, float hi, Fn fn) {
  constexpr int kSteps = 1 << 21;
  for (int k = 0; k <= kSteps; ++k) fn(lo + (hi - lo) * (static_cast<double>(k) / kSteps));
  for (int k = -(1 << 20); k <= (1 << 20); ++k) fn(std::ldexp(static_cast<float>(k), -30));
}

TEST(FastExp, RelativeErrorBelow2e7OverItsRange) {
  double worst = 0;
  float worst_at = 0;
  ForFloatsIn(-87.0f, 88.0f, [&](float x) {
    const double want = std::exp(static_cast<double>(x));
    const double err = std::abs(FastExp(x) - want) / want;
    if (err > worst) worst = err, worst_at = x;
  });
  EXPECT_LT(worst, 2e-7) << "at x = " << worst_at;
  EXPECT_EQ(FastExp(0.0f), 1.0f);
}

TEST(FastExp, ClampsOutsideItsRangeAndPropagatesNan) {
  const float low = FastExp(-87.0f);
  EXPECT_GT(low, 0.0f);
  EXPECT_EQ(FastExp(-1000.0f), low);
  EXPECT_EQ(FastExp(-std::numeric_limits<float>::infinity()), low);
  EXPECT_EQ(FastExp(1000.0f), FastExp(88.0f));
  EXPECT_TRUE(std::isfinite(FastExp(1000.0f)));
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastTanh, AbsoluteErrorBelow3e7) {
  double worst = 0;
  float worst_at = 0;
  ForFloatsIn(-50.0f, 50.0f, [&](float u) {
    const double err = std::abs(FastTanh(u) - std::tanh(static_cast<double>(u)));
    if (err > worst) worst = err, worst_at = u;
  });
  EXPECT_LT(worst, 3e-7) << "at u = " << worst_at;
}

TEST(FastTanh, SaturatesExactlyAndPropagatesNan) {
  EXPECT_EQ(FastTanh(45.0f), 1.0f);
  EXPECT_EQ(FastTanh(-45.0f), -1.0f);
  EXPECT_EQ(FastTanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(FastTanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(FastTanh(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace ringmaster::kernels
