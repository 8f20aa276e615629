#include "kernels/batchnorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels {
namespace {

class BatchNormTest : public testing::TestWithParam<BatchNormShape> {};

TEST_P(BatchNormTest, SumsForwardAndBackwardMatchTheDefinition) {
  const BatchNormShape s = GetParam();
  const int64_t size = s.batch * s.channels * s.positions;
  const std::vector<float> x = RandomFloats(size, 1, -2.0f, 3.0f);
  const std::vector<float> dy = RandomFloats(size, 2);
  const std::vector<float> gamma = RandomFloats(s.channels, 3, 0.5f, 1.5f);
  const std::vector<float> beta = RandomFloats(s.channels, 4);
  auto at = [&](int64_t n, int64_t c, int64_t i) { return (n * s.channels + c) * s.positions + i; };

  std::vector<double> sum(s.channels), sum_sq(s.channels);
  BatchNormChannelSums(s, x.data(), sum.data(), sum_sq.data());
  std::vector<float> mean(s.channels), invstd(s.channels);
  const double count = s.batch * s.positions;
  for (int64_t c = 0; c < s.channels; ++c) {
    double want = 0, want_sq = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.positions; ++i) {
        want += x[at(n, c, i)];
        want_sq += double{x[at(n, c, i)]} * x[at(n, c, i)];
      }
    }
    EXPECT_NEAR(sum[c], want, 1e-4);
    EXPECT_NEAR(sum_sq[c], want_sq, 1e-4);
    mean[c] = static_cast<float>(want / count);
    invstd[c] = static_cast<float>(1 / std::sqrt(want_sq / count - mean[c] * mean[c] + 1e-5));
  }

  std::vector<float> y(size);
  BatchNormForward(s, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data());
  std::vector<double> sum_dy(s.channels), sum_dy_xhat(s.channels);
  BatchNormBackwardSums(s, x.data(), dy.data(), mean.data(), invstd.data(), sum_dy.data(),
                        sum_dy_xhat.data());
  std::vector<float> dx(size, 99.0f);
  BatchNormBackwardInput(s, x.data(), dy.data(), mean.data(), invstd.data(), gamma.data(),
                         sum_dy.data(), sum_dy_xhat.data(), count, dx.data());
  for (int64_t c = 0; c < s.channels; ++c) {
    double want_dy = 0, want_dot = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.positions; ++i) {
        const int64_t k = at(n, c, i);
        const double xhat = (double{x[k]} - mean[c]) * invstd[c];
        EXPECT_NEAR(y[k], gamma[c] * xhat + beta[c], 1e-5) << k;
        want_dy += dy[k];
        want_dot += dy[k] * xhat;
      }
    }
    EXPECT_NEAR(sum_dy[c], want_dy, 1e-5);
    EXPECT_NEAR(sum_dy_xhat[c], want_dot, 1e-5);
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.positions; ++i) {
        const int64_t k = at(n, c, i);
        const double xhat = (double{x[k]} - mean[c]) * invstd[c];
        const double want = gamma[c] * invstd[c] * (dy[k] - want_dy / count - xhat * want_dot / count);
        EXPECT_NEAR(dx[k], want, 1e-5) << k;
      }
    }
  }
  // The epilogue rounds as the separate passes would: relu(y + residual), each part alone,
  // and in place over the residual.
  for (const bool relu : {false, true}) {
    for (const bool residual : {false, true}) {
      std::vector<float> fused(size, 99.0f);
      BatchNormForward(s, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(),
                       fused.data(), {residual ? dy.data() : nullptr, relu});
      for (int64_t k = 0; k < size; ++k) {
        float want = residual ? y[k] + dy[k] : y[k];
        if (relu && want < 0.0f) want = 0.0f;
        ASSERT_EQ(fused[k], want) << k << " relu " << relu << " residual " << residual;
      }
    }
  }
  std::vector<float> over = dy;
  BatchNormForward(s, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(),
                   over.data(), {over.data(), true});
  for (int64_t k = 0; k < size; ++k) ASSERT_EQ(over[k], std::max(0.0f, y[k] + dy[k])) << k;
  // In place: dx over dy gives the same.
  std::vector<float> inplace = dy;
  BatchNormBackwardInput(s, x.data(), inplace.data(), mean.data(), invstd.data(), gamma.data(),
                         sum_dy.data(), sum_dy_xhat.data(), count, inplace.data());
  EXPECT_EQ(inplace, dx);
}

// Planes shorter than the sums' 16 lanes, longer (with a remainder), and the channels split
// over 2 and 3 threads (kernels/parallel.h), unevenly.
INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormTest,
                         testing::Values(BatchNormShape{3, 4, 5}, BatchNormShape{3, 5, 37},
                                         BatchNormShape{3, 5, 37, 2},
                                         BatchNormShape{2, 4, 64, 3}));

}  // namespace
}  // namespace ringmaster::kernels
