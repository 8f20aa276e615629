#include "kernels/activation.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(Relu, ForwardClampsNegativesAndPropagatesNan) {
  // 37 elements: a vectorised body and a scalar tail both run.
  std::vector<float> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * 0.25f * i;
  x[5] = kNan;
  x[6] = -kInf;
  x[7] = kInf;
  std::vector<float> y(x.size());
  ReluForward(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == 5) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else {
      EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f) << i;
    }
  }
  ReluForward(x.data(), x.data(), x.size());  // in place
  for (size_t i = 0; i < x.size(); ++i) {
    if (i != 5) {
      EXPECT_EQ(x[i], y[i]) << i;
    }
  }
}

TEST(Relu, BackwardPassesGradientWhereOutputIsPositive) {
  const std::vector<float> y = {0.0f, 2.0f, 0.0f, 0.5f, kNan, 3.0f};
  std::vector<float> dy = {kInf, -1.0f, 4.0f, kInf, 5.0f, -kInf};
  std::vector<float> dx(y.size(), 99.0f);
  ReluBackward(y.data(), dy.data(), dx.data(), y.size());
  // An off unit gets exactly 0 even from an infinite gradient (no inf * 0 = NaN).
  EXPECT_EQ(dx, (std::vector<float>{0.0f, -1.0f, 0.0f, kInf, 0.0f, -kInf}));
  ReluBackward(y.data(), dy.data(), dy.data(), y.size());  // in place
  EXPECT_EQ(dy, dx);
}

}  // namespace
}  // namespace ringmaster::kernels
