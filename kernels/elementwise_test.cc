#include "kernels/elementwise.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace ringmaster::kernels {
namespace {

using testing::FiniteDifference;
using testing::GradientMatches;
using testing::RandomFloats;
using testing::WeightedSum;

TEST(Residual, ForwardAddsAndMayRunInPlace) {
  std::vector<float> a = {1, -2, 0.5f}, b = {3, 4, -0.5f}, out(3);
  ResidualForward(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{4, 2, 0}));
  ResidualForward(a.data(), a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{4, 2, 0}));
}

TEST(Residual, BackwardAccumulatesIntoBothInputs) {
  std::vector<float> da = {1, 1, 1}, db = {0, -1, 2}, dout = {0.5f, 2, -3};
  ResidualBackward(da.data(), db.data(), dout.data(), 3);
  EXPECT_EQ(da, (std::vector<float>{1.5f, 3, -2}));
  EXPECT_EQ(db, (std::vector<float>{0.5f, 1, -1}));
}

TEST(Residual, BackwardOfSelfAddDoublesTheGradient) {
  std::vector<float> dx = {1, 0, -1}, dout = {0.5f, 2, -3};
  ResidualBackward(dx.data(), dx.data(), dout.data(), 3);
  EXPECT_EQ(dx, (std::vector<float>{2, 4, -7}));
}

TEST(Residual, BackwardMatchesFiniteDifferences) {
  const int64_t n = 37;
  std::vector<float> a = RandomFloats(n, 1), b = RandomFloats(n, 2), w = RandomFloats(n, 3);
  std::vector<float> out(n), da(n, 0.0f), db(n, 0.0f);
  auto loss = [&] {
    ResidualForward(out.data(), a.data(), b.data(), n);
    return WeightedSum(w, out.data());
  };
  ResidualBackward(da.data(), db.data(), w.data(), n);
  EXPECT_TRUE(GradientMatches(loss, a, da, FiniteDifference{}, "da"));
  EXPECT_TRUE(GradientMatches(loss, b, db, FiniteDifference{}, "db"));
}

TEST(Elementwise, AccumulateAndScale) {
  std::vector<float> acc = {1, 2, 3}, x = {-1, 0.25f, 4};
  Accumulate(acc.data(), x.data(), 3);
  EXPECT_EQ(acc, (std::vector<float>{0, 2.25f, 7}));
  Scale(acc.data(), -2.0f, 3);
  EXPECT_EQ(acc, (std::vector<float>{0, -4.5f, -14}));
}

}  // namespace
}  // namespace ringmaster::kernels
