// Tests of kernels/cuda/conv.h against the CPU kernels (kernels/conv.h).
//
// Convolution: random inputs in [-1, 1) on awkward shapes (batch 1 and 3; channels 1, 3, 5;
// heights and widths 1, 6, 7, 8, 27, 28, odd and even; kernel sizes 1, 3, 5, also wider than
// the image), with and without a bias, dweight and dbias overwritten and accumulated (from
// random starting values on both sides) and dbias absent, in kFloat32 and kTensorFloat32.
// Every GPU output is poisoned with NaN bytes first (except where the test accumulates), and
// so is the scratch, so an element left unwritten or a scratch entry read before it is
// written fails. Each GPU result is checked against the direct definition of the convolution
// summed in double (kernels/conv_test.cc's loops), and against the CPU kernel wherever that
// kernel is valid: kernels/cpu/conv.cc's im2col writes outside its rows when the padding
// exceeds the width (kernel_size / 2 > width, e.g. k = 5 on a width of 1), so those shapes
// are checked against the direct sums only.
//
// Tolerance per element, against S = the sum of the magnitudes of the terms of that output
// (|weight| |x| over the taps, plus |bias|; |dy| |x|; |dy|; |dy| |weight|; plus the |starting
// value| when accumulating): the bound of a sum's rounding error is a multiple of S, whatever
// cancellation makes of the sum itself, so |gpu - want| <= tol S holds for single outputs that
// happen to be near 0 (batch 1, one channel, a 1x1 image), where a relative error of the
// output, or of a norm over a handful of outputs, would not:
//   fp32 3e-5 S: sums of at most 2352 products (3 images of 28 x 28 for dweight) in fp32, in
//     another order than the CPU's; the realistic error is a few u = 6e-8 of S, each side;
//   tf32 4e-3 S: the products' inputs rounded to 10-bit mantissas (at most 2^-10 relative
//     each, so 2e-3 per product), then fp32 sums (as kernels/cuda/matmul_test.cc);
//   dbias 3e-5 S in both types: it is this file's fp32 sum, not a product (256 lanes of at
//     most 10 terms, then the 256 lanes: at most 266 u S = 1.6e-5 S; the CPU's is smaller).
// Determinism: forward and backward (y, dweight, dbias, dx) run twice give the same bits.
//
// Max-pooling: bit for bit the CPU's y and argmax, and dx from backward, on planes of 1 x 1,
// 1 x 28, 2 x 2, 7 x 7, 8 x 6, 27 x 28, 28 x 7, 28 x 28, with values drawn from a small set
// (ties, -0 and +0, +-inf, NaNs of either sign), only zeros of both signs, or uniform, and on
// kernels/conv_test.cc's worked example. Without a GPU the tests that need one skip; the
// argument checks run everywhere.
#include "kernels/cuda/conv.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/conv.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/testing.h"
#include "kernels/matmul.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;
using testing::ExpectSameBits;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the CUDA convolution and max-pooling tests")

// batch, in_channels, out_channels, height, width, kernel_size
constexpr Conv2dShape kShapes[] = {
    {1, 1, 1, 1, 1, 1},   {1, 1, 3, 1, 7, 3},  {3, 3, 5, 7, 7, 3},  {3, 5, 3, 28, 28, 5},
    {1, 3, 5, 28, 7, 5},  {3, 1, 1, 7, 28, 1}, {1, 5, 1, 1, 1, 5},  {3, 3, 3, 8, 6, 3},
    {3, 5, 5, 28, 27, 3}, {1, 1, 5, 7, 1, 5},  {3, 3, 1, 1, 28, 5}, {1, 3, 3, 5, 2, 5},
};

constexpr MatMulType kTypes[] = {MatMulType::kFloat32, MatMulType::kTensorFloat32};

constexpr double kFloat32Tolerance = 3e-5;

double Tolerance(MatMulType type) {
  return type == MatMulType::kTensorFloat32 ? 4e-3 : kFloat32Tolerance;
}

// Whether kernels/cpu/conv.cc can serve as the reference (see the top of this file).
bool CpuKernelHandles(const Conv2dShape& s) { return s.kernel_size / 2 <= s.width; }

std::string Describe(const Conv2dShape& s, MatMulType type) {
  return absl::StrCat(MatMulTypeName(type), " batch ", s.batch, " in ", s.in_channels, " out ",
                      s.out_channels, " ", s.height, "x", s.width, " k ", s.kernel_size);
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Elements where |got - want| > tol * scale (NaN never passes); the first is named.
void ExpectWithin(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& scale, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.size(), scale.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= tol * scale[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off, first ["
                    << first << "] gpu " << (first >= 0 ? got[first] : 0) << " want "
                    << (first >= 0 ? want[first] : 0) << " scale "
                    << (first >= 0 ? scale[first] : 0);
}

// got within tol S of the direct sums, and of the CPU kernel's result when there is one.
void ExpectMatches(const std::vector<float>& got, const std::vector<double>& direct,
                   const std::vector<float>* cpu, const std::vector<double>& scale, double tol,
                   const std::string& what) {
  ExpectWithin(got, direct, scale, tol, what + " vs direct sums");
  if (cpu != nullptr) ExpectWithin(got, ToDouble(*cpu), scale, tol, what + " vs CPU kernel");
}

// A shape's random tensors, host and device, and the CPU's scratch.
struct ConvData {
  ConvData(const Conv2dShape& s, uint32_t seed)
      : shape(s),
        hw(s.height * s.width),
        taps(s.in_channels * s.kernel_size * s.kernel_size),
        x(RandomFloats(s.batch * s.in_channels * hw, seed)),
        w(RandomFloats(s.out_channels * taps, seed + 1)),
        b(RandomFloats(s.out_channels, seed + 2)),
        dy(RandomFloats(s.batch * s.out_channels * hw, seed + 3)),
        cpu_scratch(Conv2dScratchElements(s)),
        dx_in(x),
        dw_in(w),
        db_in(b),
        ddy_in(dy) {}

  const Conv2dShape shape;
  const int64_t hw, taps;
  const std::vector<float> x, w, b, dy;
  std::vector<float> cpu_scratch;
  Device<float> dx_in, dw_in, db_in, ddy_in;
};

// The convolution by its definition, in double: for every output element, tap and input
// element that the tap reads inside the image (kernels/conv_test.cc's loops), the sums of
// the products and of their magnitudes (S). y excludes the bias, dweight and dbias are
// overwritten.
struct DirectSums {
  explicit DirectSums(const ConvData& d)
      : y(d.dy.size()),
        y_scale(d.dy.size()),
        dw(d.w.size()),
        dw_scale(d.w.size()),
        db(d.b.size()),
        db_scale(d.b.size()),
        dx(d.x.size()),
        dx_scale(d.x.size()) {
    const Conv2dShape& s = d.shape;
    const int64_t pad = s.kernel_size / 2;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t o = 0; o < s.out_channels; ++o) {
        for (int64_t oy = 0; oy < s.height; ++oy) {
          for (int64_t ox = 0; ox < s.width; ++ox) {
            const int64_t out = ((n * s.out_channels + o) * s.height + oy) * s.width + ox;
            db[o] += d.dy[out];
            db_scale[o] += std::fabs(d.dy[out]);
            for (int64_t c = 0; c < s.in_channels; ++c) {
              for (int64_t ky = 0; ky < s.kernel_size; ++ky) {
                for (int64_t kx = 0; kx < s.kernel_size; ++kx) {
                  const int64_t iy = oy + ky - pad, ix = ox + kx - pad;
                  if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
                  const int64_t tap =
                      ((o * s.in_channels + c) * s.kernel_size + ky) * s.kernel_size + kx;
                  const int64_t in = ((n * s.in_channels + c) * s.height + iy) * s.width + ix;
                  const double x = d.x[in], w = d.w[tap], g = d.dy[out];
                  y[out] += w * x;
                  y_scale[out] += std::fabs(w * x);
                  dw[tap] += g * x;
                  dw_scale[tap] += std::fabs(g * x);
                  dx[in] += g * w;
                  dx_scale[in] += std::fabs(g * w);
                }
              }
            }
          }
        }
      }
    }
  }

  std::vector<double> y, y_scale, dw, dw_scale, db, db_scale, dx, dx_scale;
};

// v + |start| elementwise (S of an accumulated output), or v + start (its value).
std::vector<double> PlusAbs(std::vector<double> v, const std::vector<float>& start) {
  for (size_t i = 0; i < v.size(); ++i) v[i] += std::fabs(start[i]);
  return v;
}
std::vector<double> Plus(std::vector<double> v, const std::vector<float>& start) {
  for (size_t i = 0; i < v.size(); ++i) v[i] += start[i];
  return v;
}

std::unique_ptr<MatMulEngine> NewEngine() {
  auto engine = MatMulEngine::Create();
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

TEST(ConvCuda, ForwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<MatMulEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  uint32_t seed = 1;
  for (MatMulType type : kTypes) {
    for (const Conv2dShape& s : kShapes) {
      ConvData d(s, seed += 10);
      const DirectSums direct(d);
      for (bool with_bias : {true, false}) {
        const std::string what = Describe(s, type) + (with_bias ? " with bias" : " no bias");
        std::vector<double> want = direct.y, scale = direct.y_scale;
        if (with_bias) {
          for (size_t i = 0; i < want.size(); ++i) {
            const float bias = d.b[(i / d.hw) % s.out_channels];
            want[i] += bias;
            scale[i] += std::fabs(bias);
          }
        }
        std::vector<float> cpu(d.dy.size());
        if (CpuKernelHandles(s)) {
          kernels::Conv2dForward(s, d.x.data(), d.w.data(), with_bias ? d.b.data() : nullptr,
                                 cpu.data(), d.cpu_scratch.data());
        }
        Device<float> y(d.dy.size()), scratch(Conv2dCudaScratchFloats(s));
        ASSERT_TRUE(cuda::Conv2dForward(engine.get(), type, s, d.dx_in.get(), d.dw_in.get(),
                                        with_bias ? d.db_in.get() : nullptr, y.get(), scratch.get(),
                                        nullptr)
                        .ok())
            << what;
        ExpectMatches(y.Host(), want, CpuKernelHandles(s) ? &cpu : nullptr, scale, Tolerance(type),
                      what);
      }
    }
  }
}

TEST(ConvCuda, BackwardWeightsMatchesTheCpuInBothModes) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<MatMulEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  uint32_t seed = 1000;
  for (MatMulType type : kTypes) {
    for (const Conv2dShape& s : kShapes) {
      ConvData d(s, seed += 10);
      const DirectSums direct(d);
      const std::vector<float> dw0 = RandomFloats(d.w.size(), seed + 5);
      const std::vector<float> db0 = RandomFloats(d.b.size(), seed + 6);
      for (OutputMode mode : {OutputMode::kOverwrite, OutputMode::kAccumulate}) {
        const bool accumulate = mode == OutputMode::kAccumulate;
        for (bool with_dbias : {true, false}) {
          const std::string what = Describe(s, type) + (accumulate ? " accumulate" : " overwrite") +
                                   (with_dbias ? "" : " no dbias");
          std::vector<float> cpu_dw = dw0, cpu_db = db0;
          if (CpuKernelHandles(s)) {
            kernels::Conv2dBackwardWeights(s, d.x.data(), d.dy.data(), cpu_dw.data(),
                                           with_dbias ? cpu_db.data() : nullptr, mode,
                                           d.cpu_scratch.data());
          }
          Device<float> dw = accumulate ? Device<float>(dw0) : Device<float>(d.w.size());
          Device<float> db = accumulate ? Device<float>(db0) : Device<float>(d.b.size());
          Device<float> scratch(Conv2dCudaScratchFloats(s));
          ASSERT_TRUE(cuda::Conv2dBackwardWeights(
                          engine.get(), type, s, d.dx_in.get(), d.ddy_in.get(), dw.get(),
                          with_dbias ? db.get() : nullptr, mode, scratch.get(), nullptr)
                          .ok())
              << what;
          ExpectMatches(dw.Host(), accumulate ? Plus(direct.dw, dw0) : direct.dw,
                        CpuKernelHandles(s) ? &cpu_dw : nullptr,
                        accumulate ? PlusAbs(direct.dw_scale, dw0) : direct.dw_scale,
                        Tolerance(type), what + " dweight");
          if (with_dbias) {
            ExpectMatches(db.Host(), accumulate ? Plus(direct.db, db0) : direct.db,
                          CpuKernelHandles(s) ? &cpu_db : nullptr,
                          accumulate ? PlusAbs(direct.db_scale, db0) : direct.db_scale,
                          kFloat32Tolerance, what + " dbias");
          } else if (accumulate) {
            EXPECT_EQ(db.Host(), db0) << what << ": dbias was written";
          }
        }
      }
    }
  }
}

TEST(ConvCuda, BackwardInputMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<MatMulEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  uint32_t seed = 2000;
  for (MatMulType type : kTypes) {
    for (const Conv2dShape& s : kShapes) {
      const std::string what = Describe(s, type);
      ConvData d(s, seed += 10);
      const DirectSums direct(d);
      std::vector<float> cpu(d.x.size());
      if (CpuKernelHandles(s)) {
        kernels::Conv2dBackwardInput(s, d.w.data(), d.dy.data(), cpu.data(), d.cpu_scratch.data());
      }
      Device<float> dx(d.x.size()), scratch(Conv2dCudaScratchFloats(s));
      ASSERT_TRUE(cuda::Conv2dBackwardInput(engine.get(), type, s, d.dw_in.get(), d.ddy_in.get(),
                                            dx.get(), scratch.get(), nullptr)
                      .ok())
          << what;
      ExpectMatches(dx.Host(), direct.dx, CpuKernelHandles(s) ? &cpu : nullptr, direct.dx_scale,
                    Tolerance(type), what);
    }
  }
}

TEST(ConvCuda, RunsTwiceGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<MatMulEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  const Conv2dShape s{3, 5, 5, 28, 27, 3};
  for (MatMulType type : kTypes) {
    const std::string what = Describe(s, type);
    ConvData d(s, 3000);
    std::vector<float> y[2], dw[2], db[2], dx[2];
    for (int run = 0; run < 2; ++run) {
      Device<float> dy_out(d.dy.size()), ddw(d.w.size()), ddb(d.b.size()), ddx(d.x.size()),
          scratch(Conv2dCudaScratchFloats(s));
      ASSERT_TRUE(cuda::Conv2dForward(engine.get(), type, s, d.dx_in.get(), d.dw_in.get(),
                                      d.db_in.get(), dy_out.get(), scratch.get(), nullptr)
                      .ok());
      ASSERT_TRUE(cuda::Conv2dBackwardWeights(engine.get(), type, s, d.dx_in.get(), d.ddy_in.get(),
                                              ddw.get(), ddb.get(), OutputMode::kOverwrite,
                                              scratch.get(), nullptr)
                      .ok());
      ASSERT_TRUE(cuda::Conv2dBackwardInput(engine.get(), type, s, d.dw_in.get(), d.ddy_in.get(),
                                            ddx.get(), scratch.get(), nullptr)
                      .ok());
      y[run] = dy_out.Host();
      dw[run] = ddw.Host();
      db[run] = ddb.Host();
      dx[run] = ddx.Host();
    }
    ExpectSameBits(y[1], y[0], what + " y");
    ExpectSameBits(dw[1], dw[0], what + " dweight");
    ExpectSameBits(db[1], db[0], what + " dbias");
    ExpectSameBits(dx[1], dx[0], what + " dx");
  }
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Runs both max-pooling kernels on x and compares y, argmax and dx (for a random dy) with
// the CPU's, bit for bit.
void ExpectPoolingMatchesTheCpu(const std::vector<float>& x, int64_t planes, int64_t height,
                                int64_t width, uint32_t seed, const std::string& what) {
  const int64_t pooled = planes * (height / 2) * (width / 2);
  std::vector<float> want_y(pooled), want_dx(x.size());
  std::vector<int32_t> want_argmax(pooled);
  kernels::MaxPool2x2Forward(x.data(), want_y.data(), want_argmax.data(), planes, height, width);
  const std::vector<float> dy = RandomFloats(pooled, seed);
  kernels::MaxPool2x2Backward(dy.data(), want_argmax.data(), want_dx.data(), planes, height, width);

  Device<float> dx_in(x), y(pooled), ddy(dy), dx(x.size());
  Device<int32_t> argmax(pooled);  // poisoned: -1
  ASSERT_TRUE(
      cuda::MaxPool2x2Forward(dx_in.get(), y.get(), argmax.get(), planes, height, width, nullptr)
          .ok())
      << what;
  ExpectSameBits(y.Host(), want_y, what + " y");
  ExpectSameBits(argmax.Host(), want_argmax, what + " argmax");
  ASSERT_TRUE(
      cuda::MaxPool2x2Backward(ddy.get(), argmax.get(), dx.get(), planes, height, width, nullptr)
          .ok())
      << what;
  ExpectSameBits(dx.Host(), want_dx, what + " dx");
}

struct PoolShape {
  int64_t planes, height, width;
};
constexpr PoolShape kPoolShapes[] = {{1, 1, 1},   {2, 1, 28}, {1, 2, 2},    {3, 7, 7},  {4, 8, 6},
                                     {3, 27, 28}, {5, 28, 7}, {15, 28, 28}, {2, 28, 27}};

TEST(ConvCuda, MaxPoolMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  // Ties (1 twice over), both zeros, infinities, NaNs of either sign and with a payload.
  const float pool[] = {-inf,
                        -2.0f,
                        -0.0f,
                        0.0f,
                        1.0f,
                        1.0f,
                        inf,
                        FromBits(0x7fc00000u),
                        FromBits(0xffc00000u),
                        FromBits(0x7f800123u)};
  uint32_t seed = 4000;
  for (const PoolShape& p : kPoolShapes) {
    const int64_t n = p.planes * p.height * p.width;
    const std::string what = absl::StrCat("planes ", p.planes, " ", p.height, "x", p.width);
    std::vector<float> special(n);
    std::mt19937 gen(++seed);
    for (float& v : special) v = pool[gen() % std::size(pool)];
    ExpectPoolingMatchesTheCpu(special, p.planes, p.height, p.width, ++seed, what + " special");
    // Windows of only zeros of both signs: -0 ranks below +0, and ties keep the first.
    std::vector<float> zeros(n);
    for (float& v : zeros) v = gen() % 2 == 0 ? 0.0f : -0.0f;
    ExpectPoolingMatchesTheCpu(zeros, p.planes, p.height, p.width, ++seed, what + " zeros");
    const std::vector<float> uniform = RandomFloats(n, ++seed);
    ExpectPoolingMatchesTheCpu(uniform, p.planes, p.height, p.width, ++seed, what + " uniform");
  }
}

// kernels/conv_test.cc's worked example: two planes of 3 x 5 (the last row and column are
// dropped), a tie, and a NaN that wins.
TEST(ConvCuda, MaxPoolWorkedExample) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {
      1,  2,  0,   0, 9,  //
      4,  3,  7,   7, 9,  //
      9,  9,  9,   9, 9,  //
      -1, -2, nan, 0, 9,  //
      -3, -4, 1,   2, 9,  //
      9,  9,  9,   9, 9,  //
  };
  Device<float> dx_in(x), y(4), dy(std::vector<float>{10, 20, 30, 40}), dx(x.size());
  Device<int32_t> argmax(4);
  ASSERT_TRUE(cuda::MaxPool2x2Forward(dx_in.get(), y.get(), argmax.get(), 2, 3, 5, nullptr).ok());
  EXPECT_EQ(argmax.Host(), (std::vector<int32_t>{5, 7, 0, 2}));
  const std::vector<float> got = y.Host();
  EXPECT_EQ(got[0], 4);
  EXPECT_EQ(got[1], 7);
  EXPECT_EQ(got[2], -1);
  EXPECT_TRUE(std::isnan(got[3]));
  ASSERT_TRUE(cuda::MaxPool2x2Backward(dy.get(), argmax.get(), dx.get(), 2, 3, 5, nullptr).ok());
  std::vector<float> want(x.size(), 0.0f);
  want[5] = 10;
  want[7] = 20;
  want[15 + 0] = 30;
  want[15 + 2] = 40;
  EXPECT_EQ(dx.Host(), want);
}

// A plane of one row pools to nothing: y and argmax may be null, and backward zeroes dx.
TEST(ConvCuda, MaxPoolOfASingleRowIsEmpty) {
  SKIP_WITHOUT_GPU();
  Device<float> x(RandomFloats(2 * 9, 1)), dx(2 * 9);
  ASSERT_TRUE(cuda::MaxPool2x2Forward(x.get(), nullptr, nullptr, 2, 1, 9, nullptr).ok());
  ASSERT_TRUE(cuda::MaxPool2x2Backward(nullptr, nullptr, dx.get(), 2, 1, 9, nullptr).ok());
  ExpectSameBits(dx.Host(), std::vector<float>(2 * 9, 0.0f), "dx");
}

int64_t RoundUp64(int64_t v) { return (v + 63) / 64 * 64; }

TEST(ConvCuda, ScratchIsTheDocumentedSize) {
  for (const Conv2dShape& s : kShapes) {
    const int64_t positions = s.batch * s.height * s.width;
    EXPECT_EQ(Conv2dCudaScratchFloats(s),
              RoundUp64(s.in_channels * s.kernel_size * s.kernel_size * positions) +
                  RoundUp64(s.out_channels * positions) + 256 * s.out_channels);
  }
  EXPECT_EQ(Conv2dCudaScratchFloats(Conv2dShape{1, 1, 1, 2, 2, 1}), 64 + 64 + 256);
  EXPECT_EQ(Conv2dCudaScratchFloats(Conv2dShape{0, 1, 1, 2, 2, 1}), 0);
}

// The checks run before anything reaches the GPU, so host arrays stand in for device ones.
TEST(ConvCuda, BadArgumentsAreNamed) {
  const Conv2dShape s{1, 1, 1, 2, 2, 1};  // x, y, dy, dx: 4 floats; weight 1; scratch 384
  alignas(64) float x[4] = {}, y[4] = {}, w[4] = {}, b[4] = {};
  alignas(64) static float scratch[512];
  const MatMulType f32 = MatMulType::kFloat32;
  auto expect = [](const absl::Status& status, const std::string& text) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(text), std::string::npos)
        << "want \"" << text << "\" in: " << status;
  };

  Conv2dShape bad = s;
  bad.batch = 0;
  expect(Conv2dForward(nullptr, f32, bad, x, w, b, y, scratch, nullptr),
         "Conv2dForward (CUDA): shape.batch must be positive, got 0");
  bad = s;
  bad.kernel_size = 2;
  expect(Conv2dForward(nullptr, f32, bad, x, w, b, y, scratch, nullptr),
         "shape.kernel_size must be odd, got 2");
  bad = s;
  bad.height = int64_t{1} << 31;
  expect(Conv2dForward(nullptr, f32, bad, x, w, b, y, scratch, nullptr),
         "shape.height 2147483648 exceeds 2^31 - 1");
  bad = s;
  bad.batch = 1 << 20;
  bad.height = 1 << 6;
  bad.width = 1 << 5;
  expect(Conv2dForward(nullptr, f32, bad, x, w, b, y, scratch, nullptr),
         "shape.batch * height * width = 1048576 * 64 * 32 exceeds 2^31 - 1");
  expect(Conv2dForward(nullptr, MatMulType::kBFloat16, s, x, w, b, y, scratch, nullptr),
         "type must be kFloat32 or kTensorFloat32 (fp32 storage), got bf16");
  expect(Conv2dForward(nullptr, f32, s, nullptr, w, b, y, scratch, nullptr), "x is null");
  expect(Conv2dForward(nullptr, f32, s, x, w, b, y, nullptr, nullptr), "scratch is null");
  expect(Conv2dForward(nullptr, f32, s, x, w + 1, b, y, scratch, nullptr),
         "weight must be 16-byte aligned");
  expect(Conv2dForward(nullptr, f32, s, x, w, b, y, scratch + 2, nullptr),
         "scratch must be 16-byte aligned");
  expect(Conv2dForward(nullptr, f32, s, x, w, b, x + 1, scratch, nullptr), "y overlaps x");
  expect(Conv2dForward(nullptr, f32, s, x, w, b, scratch + 383, scratch, nullptr),
         "y overlaps scratch");
  expect(Conv2dForward(nullptr, f32, s, scratch + 380, w, b, y, scratch, nullptr),
         "scratch overlaps x");
  expect(Conv2dForward(nullptr, f32, s, x, w, b, y, scratch, nullptr),
         "Conv2dForward (CUDA): engine is null");
  // Just past the scratch is apart from it.
  expect(Conv2dForward(nullptr, f32, s, x, w, b, scratch + 384, scratch, nullptr),
         "engine is null");

  expect(Conv2dBackwardWeights(nullptr, f32, s, x, nullptr, w, b, OutputMode::kOverwrite, scratch,
                               nullptr),
         "Conv2dBackwardWeights (CUDA): dy is null");
  expect(Conv2dBackwardWeights(nullptr, f32, s, x, y, w + 2, b, OutputMode::kOverwrite, scratch,
                               nullptr),
         "dweight must be 16-byte aligned");
  expect(Conv2dBackwardWeights(nullptr, f32, s, x, y, w, y + 3, OutputMode::kAccumulate, scratch,
                               nullptr),
         "dbias overlaps dy");
  expect(
      Conv2dBackwardWeights(nullptr, f32, s, x, y, w, w, OutputMode::kAccumulate, scratch, nullptr),
      "dweight overlaps dbias");
  expect(Conv2dBackwardWeights(nullptr, f32, s, x, y, w, nullptr, OutputMode::kOverwrite, scratch,
                               nullptr),
         "Conv2dBackwardWeights (CUDA): engine is null");

  expect(Conv2dBackwardInput(nullptr, f32, s, w, y, nullptr, scratch, nullptr),
         "Conv2dBackwardInput (CUDA): dx is null");
  expect(Conv2dBackwardInput(nullptr, MatMulType::kFloat16, s, w, y, x, scratch, nullptr),
         "got fp16");
  expect(Conv2dBackwardInput(nullptr, f32, s, w, y, y, scratch, nullptr), "dx overlaps dy");
  expect(Conv2dBackwardInput(nullptr, f32, s, w, y, x, scratch, nullptr),
         "Conv2dBackwardInput (CUDA): engine is null");

  int32_t argmax[4] = {};
  expect(MaxPool2x2Forward(x, y, argmax, 0, 2, 2, nullptr),
         "MaxPool2x2Forward (CUDA): planes must be positive, got 0");
  expect(MaxPool2x2Forward(x, y, argmax, 1, 1 << 16, 1 << 15, nullptr),
         "height * width = 65536 * 32768 exceeds 2^31 - 1 (argmax is int32)");
  expect(MaxPool2x2Forward(nullptr, y, argmax, 1, 2, 2, nullptr), "x is null");
  expect(MaxPool2x2Forward(x, nullptr, argmax, 1, 2, 2, nullptr), "y is null");
  expect(MaxPool2x2Forward(x, y, nullptr, 1, 2, 2, nullptr), "argmax is null");
  expect(MaxPool2x2Forward(x, x + 3, argmax, 1, 2, 2, nullptr), "y overlaps x");
  expect(MaxPool2x2Forward(x, y, reinterpret_cast<int32_t*>(x), 1, 2, 2, nullptr),
         "argmax overlaps x");
  expect(MaxPool2x2Backward(y, argmax, nullptr, 1, 2, 2, nullptr),
         "MaxPool2x2Backward (CUDA): dx is null");
  expect(MaxPool2x2Backward(nullptr, argmax, x, 1, 2, 2, nullptr), "dy is null");
  expect(MaxPool2x2Backward(y, argmax, y, 1, 2, 2, nullptr), "dx overlaps dy");
  // A single row pools to nothing: forward needs neither y nor argmax and launches nothing.
  EXPECT_TRUE(MaxPool2x2Forward(x, nullptr, nullptr, 1, 1, 4, nullptr).ok());
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
