#include "kernels/conv.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels {
namespace {

// The direct definition of a stride-1 "same" convolution, visiting every (output element,
// kernel tap) pair whose input lies inside the image: f(n, o, y, x, c, ky, kx, iy, ix).
template <typename F>
void ForEachTap(const Conv2dShape& s, F f) {
  const int64_t pad = s.kernel_size / 2;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t y = 0; y < s.height; ++y) {
        for (int64_t x = 0; x < s.width; ++x) {
          for (int64_t c = 0; c < s.in_channels; ++c) {
            for (int64_t ky = 0; ky < s.kernel_size; ++ky) {
              for (int64_t kx = 0; kx < s.kernel_size; ++kx) {
                const int64_t iy = y + ky - pad, ix = x + kx - pad;
                if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
                f(((n * s.out_channels + o) * s.height + y) * s.width + x,
                  ((o * s.in_channels + c) * s.kernel_size + ky) * s.kernel_size + kx,
                  ((n * s.in_channels + c) * s.height + iy) * s.width + ix);
              }
            }
          }
        }
      }
    }
  }
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
}

// As ExpectNear, with the rounding of Winograd's transforms allowed for: each sum may be off
// by 1e-6 of the sum of its terms' magnitudes (`magnitude`) more. F(4x4, 3x3)'s coefficients
// (up to 8, and 1/6, 1/24) round so in single precision; a wrong coefficient or sign is off by
// far more.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<double>& magnitude) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 + 1e-6 * magnitude[i]) << i;
  }
}

class ConvTest : public testing::TestWithParam<Conv2dShape> {
 protected:
  const Conv2dShape s = GetParam();
  const int64_t hw = s.height * s.width;
  const std::vector<float> x = RandomFloats(s.batch * s.in_channels * hw, 1);
  const std::vector<float> w =
      RandomFloats(s.out_channels * s.in_channels * s.kernel_size * s.kernel_size, 2);
  const std::vector<float> b = RandomFloats(s.out_channels, 3);
  const std::vector<float> dy = RandomFloats(s.batch * s.out_channels * hw, 4);
  std::vector<float> scratch = std::vector<float>(Conv2dScratchElements(s), 7.0f);
};

TEST_P(ConvTest, ForwardMatchesDirectConvolution) {
  std::vector<double> want(dy.size());
  for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
    want[i] = b[(i / hw) % s.out_channels];
  }
  ForEachTap(s, [&](int64_t out, int64_t tap, int64_t in) { want[out] += double{w[tap]} * x[in]; });
  std::vector<float> y(dy.size(), 5.0f);
  Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), scratch.data());
  ExpectNear(y, want);
}

TEST_P(ConvTest, BackwardWeightsMatchesDirectSums) {
  std::vector<double> want_dw(w.size()), want_db(b.size());
  ForEachTap(
      s, [&](int64_t out, int64_t tap, int64_t in) { want_dw[tap] += double{dy[out]} * x[in]; });
  for (int64_t i = 0; i < static_cast<int64_t>(dy.size()); ++i) {
    want_db[(i / hw) % s.out_channels] += dy[i];
  }
  std::vector<float> dw(w.size(), 9.0f), db(b.size(), 9.0f);
  Conv2dBackwardWeights(s, x.data(), dy.data(), dw.data(), db.data(), OutputMode::kOverwrite,
                        scratch.data());
  ExpectNear(dw, want_dw);
  ExpectNear(db, want_db);
  Conv2dBackwardWeights(s, x.data(), dy.data(), dw.data(), db.data(), OutputMode::kAccumulate,
                        scratch.data());
  for (double& v : want_dw) v *= 2;
  for (double& v : want_db) v *= 2;
  ExpectNear(dw, want_dw);
  ExpectNear(db, want_db);
}

TEST_P(ConvTest, BackwardInputMatchesDirectSums) {
  std::vector<double> want(x.size());
  ForEachTap(s,
             [&](int64_t out, int64_t tap, int64_t in) { want[in] += double{dy[out]} * w[tap]; });
  std::vector<float> dx(x.size(), 9.0f);
  Conv2dBackwardInput(s, w.data(), dy.data(), dx.data(), scratch.data());
  ExpectNear(dx, want);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvTest,
                         testing::Values(Conv2dShape{2, 3, 4, 5, 6, 3},  // batch, in, out, h, w, k
                                         Conv2dShape{1, 1, 2, 7, 4, 5},  // kernel wider than w
                                         Conv2dShape{3, 2, 1, 4, 4, 1},
                                         // Half the kernel wider than the image.
                                         Conv2dShape{1, 2, 3, 3, 1, 5},
                                         Conv2dShape{2, 1, 2, 1, 1, 5},
                                         Conv2dShape{1, 1, 1, 2, 2, 7}));

TEST(MaxPool2x2, ForwardTakesWindowMaximaAndBackwardRoutesToThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Two planes of 3x5: the last row and column are dropped.
  const std::vector<float> x = {
      1,  2,  0,   0, 9,  //
      4,  3,  7,   7, 9,  //
      9,  9,  9,   9, 9,  //
      -1, -2, nan, 0, 9,  //
      -3, -4, 1,   2, 9,  //
      9,  9,  9,   9, 9,  //
  };
  std::vector<float> y(4);
  std::vector<int32_t> argmax(4);
  MaxPool2x2Forward(x.data(), y.data(), argmax.data(), 2, 3, 5);
  EXPECT_EQ(argmax, (std::vector<int32_t>{5, 7, 0, 2}));  // ties: the first; NaN wins
  EXPECT_EQ(y[0], 4);
  EXPECT_EQ(y[1], 7);
  EXPECT_EQ(y[2], -1);
  EXPECT_TRUE(std::isnan(y[3]));

  const std::vector<float> dy = {10, 20, 30, 40};
  std::vector<float> dx(x.size(), 5.0f);
  MaxPool2x2Backward(dy.data(), argmax.data(), dx.data(), 2, 3, 5);
  std::vector<float> want(x.size(), 0.0f);
  want[5] = 10;
  want[7] = 20;
  want[15 + 0] = 30;
  want[15 + 2] = 40;
  EXPECT_EQ(dx, want);
}

// Windows drawn from a small set of values (ties, both zeros, infinities, NaN), on planes
// wide enough for the vectorised loop, against the rule in conv.h written with float
// comparisons.
TEST(MaxPool2x2, MatchesTheDocumentedOrderOnSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float pool[] = {-inf, -2.0f, -0.0f, 0.0f, 1.0f, 1.0f, inf, nan, -nan};
  const int64_t planes = 3, height = 6, width = 23;
  std::vector<float> x(planes * height * width);
  std::mt19937 gen(9);
  for (float& v : x) v = pool[gen() % std::size(pool)];
  const int64_t out_h = height / 2, out_w = width / 2;
  std::vector<float> y(planes * out_h * out_w);
  std::vector<int32_t> argmax(y.size());
  MaxPool2x2Forward(x.data(), y.data(), argmax.data(), planes, height, width);
  auto greater = [](float v, float best) {
    if (std::isnan(best)) return false;
    if (std::isnan(v)) return true;
    if (v == 0 && best == 0) return std::signbit(best) && !std::signbit(v);
    return v > best;
  };
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oy = 0; oy < out_h; ++oy) {
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const int64_t top_left = 2 * oy * width + 2 * ox;
        int64_t best = top_left;
        for (int64_t at : {top_left + 1, top_left + width, top_left + width + 1}) {
          if (greater(x[p * height * width + at], x[p * height * width + best])) best = at;
        }
        const int64_t k = (p * out_h + oy) * out_w + ox;
        ASSERT_EQ(argmax[k], best) << "plane " << p << " window " << oy << "," << ox;
        const float want = x[p * height * width + best];
        ASSERT_EQ(std::memcmp(&y[k], &want, sizeof(float)), 0) << k;
      }
    }
  }
}

// The direct definition of a strided, zero-padded convolution: f(y index, weight index,
// x index) for every (output element, kernel tap) pair whose input lies inside the image.
template <typename F>
void ForEachStridedTap(const StridedConv2dShape& s, F f) {
  const int64_t oh = s.out_height(), ow = s.out_width(), k = s.kernel_size;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t x = 0; x < ow; ++x) {
          for (int64_t c = 0; c < s.in_channels; ++c) {
            for (int64_t ky = 0; ky < k; ++ky) {
              for (int64_t kx = 0; kx < k; ++kx) {
                const int64_t iy = y * s.stride + ky - s.padding;
                const int64_t ix = x * s.stride + kx - s.padding;
                if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
                f(((n * s.out_channels + o) * oh + y) * ow + x,
                  ((o * s.in_channels + c) * k + ky) * k + kx,
                  ((n * s.in_channels + c) * s.height + iy) * s.width + ix);
              }
            }
          }
        }
      }
    }
  }
}

class StridedConvTest : public testing::TestWithParam<StridedConv2dShape> {
 protected:
  const StridedConv2dShape s = GetParam();
  const int64_t in_size = s.batch * s.in_channels * s.height * s.width;
  const int64_t out_size = s.batch * s.out_channels * s.out_height() * s.out_width();
  const int64_t w_size = s.out_channels * s.in_channels * s.kernel_size * s.kernel_size;
  const std::vector<float> x = RandomFloats(in_size, 11);
  const std::vector<float> w = RandomFloats(w_size, 12);
  const std::vector<float> dy = RandomFloats(out_size, 13);
  std::vector<float> scratch = std::vector<float>(StridedConv2dScratchElements(s), 7.0f);
};

TEST_P(StridedConvTest, ForwardMatchesDirectConvolution) {
  std::vector<double> want(out_size, 0.0), magnitude(out_size, 0.0);
  ForEachStridedTap(s, [&](int64_t yi, int64_t wi, int64_t xi) {
    want[yi] += double{w[wi]} * x[xi];
    magnitude[yi] += std::abs(double{w[wi]} * x[xi]);
  });
  std::vector<float> y(out_size, 99.0f);
  StridedConv2dForward(s, x.data(), w.data(), y.data(), scratch.data());
  ExpectNear(y, want, magnitude);
}

TEST_P(StridedConvTest, BackwardMatchesDirectConvolution) {
  std::vector<double> want_dw(w_size, 0.0), want_dx(in_size, 0.0);
  std::vector<double> magnitude_dw(w_size, 0.0), magnitude_dx(in_size, 0.0);
  ForEachStridedTap(s, [&](int64_t yi, int64_t wi, int64_t xi) {
    want_dw[wi] += double{dy[yi]} * x[xi];
    want_dx[xi] += double{dy[yi]} * w[wi];
    magnitude_dw[wi] += std::abs(double{dy[yi]} * x[xi]);
    magnitude_dx[xi] += std::abs(double{dy[yi]} * w[wi]);
  });
  std::vector<float> dw(w_size, 99.0f), dx(in_size, 99.0f);
  StridedConv2dBackwardWeights(s, x.data(), dy.data(), dw.data(), OutputMode::kOverwrite,
                               scratch.data());
  ExpectNear(dw, want_dw, magnitude_dw);
  StridedConv2dBackwardInput(s, w.data(), dy.data(), dx.data(), scratch.data());
  ExpectNear(dx, want_dx, magnitude_dx);
  // Accumulate adds to what is there.
  std::vector<float> twice = dw;
  StridedConv2dBackwardWeights(s, x.data(), dy.data(), twice.data(), OutputMode::kAccumulate,
                               scratch.data());
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(twice[i], 2 * dw[i], 1e-4) << i;
}

// Weights prepared once, as a layer does, give the forward and the input gradient exactly what
// the calls give preparing them themselves; and the calls use them: weights prepared from 2w
// double both results. Shapes that run no Winograd prepare nothing.
TEST_P(StridedConvTest, PreparedWeightsAreWhatTheCallsUse) {
  std::vector<float> prepared(StridedConv2dPreparedWeightElements(s), 5.0f);
  const bool winograd = s.kernel_size == 3 && s.stride == 1 && s.padding == 1 &&
                        s.in_channels >= 16 && s.out_channels >= 16 && s.height >= 4 &&
                        s.width >= 4;
  ASSERT_EQ(prepared.empty(), !winograd);
  std::vector<float> y(out_size), dx(in_size);
  StridedConv2dForward(s, x.data(), w.data(), y.data(), scratch.data());
  StridedConv2dBackwardInput(s, w.data(), dy.data(), dx.data(), scratch.data());
  for (float factor : {1.0f, 2.0f}) {
    std::vector<float> scaled = w;
    for (float& v : scaled) v *= factor;
    StridedConv2dPrepareWeights(s, scaled.data(), prepared.data());
    std::vector<float> y_prepared(out_size, 99.0f), dx_prepared(in_size, 99.0f);
    StridedConv2dForward(s, x.data(), w.data(), y_prepared.data(), scratch.data(),
                         prepared.data());
    StridedConv2dBackwardInput(s, w.data(), dy.data(), dx_prepared.data(), scratch.data(),
                               prepared.data());
    const float scale = winograd ? factor : 1.0f;  // without Winograd nothing is prepared
    for (int64_t i = 0; i < out_size; ++i) ASSERT_EQ(y_prepared[i], scale * y[i]) << i;
    for (int64_t i = 0; i < in_size; ++i) ASSERT_EQ(dx_prepared[i], scale * dx[i]) << i;
  }
}

// Both gradients in one call give exactly what the two calls give, with the weights prepared
// (Winograd then transforms dy once for both) and without; kAccumulate adds.
TEST_P(StridedConvTest, BothGradientsAtOnceAreTheSeparateCalls) {
  std::vector<float> dw(w_size), dx(in_size);
  StridedConv2dBackwardWeights(s, x.data(), dy.data(), dw.data(), OutputMode::kOverwrite,
                               scratch.data());
  StridedConv2dBackwardInput(s, w.data(), dy.data(), dx.data(), scratch.data());
  std::vector<float> prepared(StridedConv2dPreparedWeightElements(s));
  StridedConv2dPrepareWeights(s, w.data(), prepared.data());
  for (const float* p : {static_cast<const float*>(prepared.data()),
                         static_cast<const float*>(nullptr)}) {
    std::vector<float> both_dw(w_size, 99.0f), both_dx(in_size, 99.0f);
    StridedConv2dBackward(s, x.data(), w.data(), dy.data(), both_dw.data(),
                          OutputMode::kOverwrite, both_dx.data(), scratch.data(), p);
    EXPECT_EQ(both_dw, dw) << (p == nullptr ? "unprepared" : "prepared");
    EXPECT_EQ(both_dx, dx) << (p == nullptr ? "unprepared" : "prepared");
    StridedConv2dBackward(s, x.data(), w.data(), dy.data(), both_dw.data(),
                          OutputMode::kAccumulate, both_dx.data(), scratch.data(), p);
    for (int64_t i = 0; i < w_size; ++i) EXPECT_NEAR(both_dw[i], 2 * dw[i], 1e-4) << i;
    EXPECT_EQ(both_dx, dx);
  }
}

// ResNet's shapes in small: 3x3 stride 1 and 2 with padding 1, 1x1 stride 2 without; odd
// sizes; batches of one and of more images than one product takes (late small maps are
// unfolded several images at once).
INSTANTIATE_TEST_SUITE_P(Shapes, StridedConvTest,
                         testing::Values(StridedConv2dShape{2, 3, 4, 8, 8, 3, 1, 1},
                                         StridedConv2dShape{3, 4, 5, 8, 8, 3, 2, 1},
                                         StridedConv2dShape{2, 4, 6, 7, 5, 3, 2, 1},
                                         StridedConv2dShape{3, 3, 5, 8, 8, 1, 2, 0},
                                         StridedConv2dShape{70, 2, 3, 4, 4, 3, 1, 1},
                                         StridedConv2dShape{1, 2, 3, 32, 32, 3, 1, 1},
                                         StridedConv2dShape{130, 2, 2, 4, 4, 1, 2, 0},
                                         StridedConv2dShape{4, 16, 16, 4, 4, 3, 1, 1},
                                         StridedConv2dShape{4, 8, 16, 8, 8, 3, 2, 1},
                                         // Winograd (3x3, stride 1, padding 1, 16 channels or
                                         // more, maps of 4x4 or more; transforms by rows of 4
                                         // tiles or more, a tile at a time on shorter rows).
                                         // F(4x4, 3x3) on maps of 8x8 or more: odd sizes
                                         // (partial last tile rows and columns), chunks of
                                         // images (128 tiles) with a short last.
                                         StridedConv2dShape{3, 16, 24, 19, 21, 3, 1, 1},
                                         StridedConv2dShape{2, 24, 16, 16, 17, 3, 1, 1},
                                         StridedConv2dShape{2, 16, 16, 17, 16, 3, 1, 1},
                                         StridedConv2dShape{9, 16, 16, 16, 16, 3, 1, 1},
                                         StridedConv2dShape{20, 16, 16, 9, 10, 3, 1, 1},
                                         StridedConv2dShape{40, 16, 16, 8, 8, 3, 1, 1},
                                         StridedConv2dShape{40, 16, 16, 8, 8, 3, 1, 1, true, 2},
                                         // F(2x2, 3x3) on smaller maps: an odd side, chunks
                                         // with a short last.
                                         StridedConv2dShape{10, 16, 24, 7, 8, 3, 1, 1},
                                         StridedConv2dShape{3, 16, 16, 5, 4, 3, 1, 1},
                                         StridedConv2dShape{70, 16, 16, 4, 4, 3, 1, 1, true, 2},
                                         // Each tile where the other would run.
                                         StridedConv2dShape{3, 16, 24, 19, 21, 3, 1, 1, true, 1,
                                                            2},
                                         StridedConv2dShape{40, 16, 16, 4, 4, 3, 1, 1, true, 1,
                                                            4},
                                         // Two threads (kernels/parallel.h): Winograd, the
                                         // unfolded product with one image a product and with
                                         // several, and an odd number of chunks.
                                         StridedConv2dShape{9, 16, 16, 16, 16, 3, 1, 1, true, 2},
                                         StridedConv2dShape{3, 16, 24, 19, 21, 3, 1, 1, true, 2},
                                         StridedConv2dShape{5, 4, 6, 32, 32, 3, 1, 1, true, 2},
                                         StridedConv2dShape{7, 8, 16, 8, 8, 3, 2, 1, true, 2},
                                         StridedConv2dShape{130, 2, 2, 4, 4, 1, 2, 0, true, 2}));

TEST(GlobalAvgPoolTest, MeansAndSpreadsBack) {
  const std::vector<float> x = RandomFloats(3 * 5, 21);
  std::vector<float> y(3);
  GlobalAvgPoolForward(x.data(), y.data(), 3, 5);
  for (int p = 0; p < 3; ++p) {
    double want = 0;
    for (int i = 0; i < 5; ++i) want += x[p * 5 + i];
    EXPECT_NEAR(y[p], want / 5, 1e-6);
  }
  std::vector<float> dx(15, 99.0f);
  const std::vector<float> dy = {1.0f, -2.0f, 0.5f};
  GlobalAvgPoolBackward(dy.data(), dx.data(), 3, 5);
  for (int i = 0; i < 15; ++i) EXPECT_FLOAT_EQ(dx[i], dy[i / 5] / 5) << i;
}

}  // namespace
}  // namespace ringmaster::kernels
