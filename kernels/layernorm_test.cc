#include "kernels/layernorm.h"

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace ringmaster::kernels {
namespace {

using testing::FiniteDifference;
using testing::GradientMatches;
using testing::RandomFloats;
using testing::WeightedSum;

struct Case {
  int64_t rows;
  int64_t channels;
};

std::string CaseName(const Case& c) {
  return "rows" + std::to_string(c.rows) + "_c" + std::to_string(c.channels);
}

void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class LayerNormTest : public ::testing::TestWithParam<Case> {};

// Two-pass reference in double.
TEST_P(LayerNormTest, ForwardMatchesTwoPassDoubleReference) {
  const auto [rows, c] = GetParam();
  std::vector<float> x = RandomFloats(rows * c, 21, -2.0f, 3.0f);
  // Row 0 sits far from zero: a one-pass E[x^2] - E[x]^2 in float would be off by ~1e-2 in
  // its variance (about 2), far outside the rstd tolerance below.
  for (int64_t i = 0; i < c; ++i) x[i] += 300.0f;
  const std::vector<float> gain = RandomFloats(c, 22), bias = RandomFloats(c, 23);
  std::vector<float> y(rows * c), mean(rows), rstd(rows);
  LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), gain.data(), bias.data(), rows, c);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0;
    for (int64_t i = 0; i < c; ++i) m += x[r * c + i];
    m /= c;
    double var = 0;
    for (int64_t i = 0; i < c; ++i) var += (x[r * c + i] - m) * (x[r * c + i] - m);
    var /= c;
    const double s = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(mean[r], m, 1e-6 * (1 + std::abs(m))) << "row " << r;
    EXPECT_NEAR(rstd[r], s, 1e-4 * s) << "row " << r;
    for (int64_t i = 0; i < c; ++i) {
      const double want = (x[r * c + i] - m) * s * gain[i] + bias[i];
      EXPECT_NEAR(y[r * c + i], want, 2e-4) << "row " << r << " channel " << i;
    }
  }
}

// Loss = sum w * y. Step 1e-2, tolerance 1e-3 + 1e-2 relative; the gradients are O(1).
TEST_P(LayerNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const auto [rows, c] = GetParam();
  std::vector<float> x = RandomFloats(rows * c, 31, -2.0f, 2.0f);
  std::vector<float> gain = RandomFloats(c, 32, 0.5f, 1.5f), bias = RandomFloats(c, 33);
  const std::vector<float> w = RandomFloats(rows * c, 34);
  std::vector<float> y(rows * c), mean(rows), rstd(rows);
  auto loss = [&, rows = rows, c = c] {  // copies: Clang 14 cannot capture bindings
    LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), gain.data(), bias.data(), rows,
                     c);
    return WeightedSum(w, y.data());
  };
  loss();
  // Start from non-zero gradients: backward must add to them.
  const std::vector<float> dx0 = RandomFloats(rows * c, 35), dgain0 = RandomFloats(c, 36),
                           dbias0 = RandomFloats(c, 37);
  std::vector<float> dx = dx0, dgain = dgain0, dbias = dbias0;
  LayerNormBackward(dx.data(), dgain.data(), dbias.data(), w.data(), x.data(), gain.data(),
                    mean.data(), rstd.data(), rows, c);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  for (int64_t i = 0; i < c; ++i) {
    dgain[i] -= dgain0[i];
    dbias[i] -= dbias0[i];
  }
  EXPECT_TRUE(GradientMatches(loss, x, dx, FiniteDifference{}, "dx"));
  EXPECT_TRUE(GradientMatches(loss, gain, dgain, FiniteDifference{}, "dgain"));
  EXPECT_TRUE(GradientMatches(loss, bias, dbias, FiniteDifference{}, "dbias"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Values(Case{10, 12},  // B=2, T=5, C=12
                                           Case{1, 12},   // B=1, T=1
                                           Case{3, 37}),  // C not a multiple of a vector width
                         [](const auto& info) { return CaseName(info.param); });

}  // namespace
}  // namespace ringmaster::kernels
