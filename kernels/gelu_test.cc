#include "kernels/gelu.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace ringmaster::kernels {
namespace {

using testing::FiniteDifference;
using testing::GradientMatches;
using testing::RandomFloats;
using testing::WeightedSum;

double GeluReference(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardMatchesDoubleFormula) {
  std::vector<float> x = RandomFloats(101, 7, -6.0f, 6.0f);
  x.insert(x.end(), {0.0f, 20.0f, -20.0f, 1.0f});
  std::vector<float> out(x.size());
  GeluForward(out.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(out[i], GeluReference(x[i]), 1e-6 * (1 + std::abs(x[i]))) << "x = " << x[i];
  }
  EXPECT_EQ(out[101], 0.0f);
  EXPECT_EQ(out[102], 20.0f);             // tanh saturates: gelu(x) = x
  EXPECT_EQ(out[103], -0.0f);             // and 0 far on the left
  EXPECT_NEAR(out[104], 0.841192, 1e-6);  // GPT-2's gelu(1)
}

// Step 1e-2 over x in [-4, 4]: the truncation error h^2 |gelu'''| / 6 stays below 1e-4.
TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 61;
  std::vector<float> x = RandomFloats(n, 11, -4.0f, 4.0f), w = RandomFloats(n, 12);
  std::vector<float> out(n), dx(n, NAN);
  auto loss = [&] {
    GeluForward(out.data(), x.data(), n);
    return WeightedSum(w, out.data());
  };
  GeluBackward(dx.data(), x.data(), w.data(), n);  // overwrites the NaNs
  EXPECT_TRUE(GradientMatches(loss, x, dx, FiniteDifference{.step = 1e-2, .atol = 1e-4}, "dx"));
}

TEST(Gelu, BackwardInPlaceOverDout) {
  const int64_t n = 19;
  std::vector<float> x = RandomFloats(n, 13, -3.0f, 3.0f), dout = RandomFloats(n, 14);
  std::vector<float> dx(n);
  GeluBackward(dx.data(), x.data(), dout.data(), n);
  GeluBackward(dout.data(), x.data(), dout.data(), n);
  EXPECT_EQ(dout, dx);
}

}  // namespace
}  // namespace ringmaster::kernels
