// Tests of kernels/cuda/elementwise.h against the CPU kernels (kernels/gelu.h,
// kernels/optimizer.h), on random inputs of awkward sizes (1, 7, 1000, 65537, 2^20 + 3).
// Every GPU output is poisoned with NaN bytes first, so an element left unwritten fails.
// Tolerances, per element:
//   ResidualForward: bit for bit (one float addition);
//   GELU forward and backward: |gpu - cpu| <= 1e-5 (1 + |cpu|) (the CPU's tanh is a float
//     approximation with absolute error below 3e-7; the GPU uses tanhf);
//   AdamW: params, exp_avg, exp_avg_sq within 1e-6 (1 + |cpu|) after 3 steps (the same
//     float operations; fused multiply-adds may differ in the last bit);
//   LAMB: sum p^2 relative 1e-9, sum r^2 relative 1e-6 (r is float arithmetic, fused
//     multiply-adds may differ); params and moments within 1e-6 (1 + |cpu|) after 3 steps;
//   SumOfSquares: relative 1e-9 against the CPU's double sum (both accumulate in double);
//   ScaleAndFindNonFinite: the scaled values bit for bit (one float multiply each) and the
//     flag, also with an inf and a NaN injected at the end of the array.
// The bf16 and fp16 twins (typed tests over both formats, ElementwiseCudaHalf/Bf16 and
// ElementwiseCudaHalf/F16), on inputs rounded to the format (kernels/half.h; values of order
// 1-8, well inside fp16's range), against the CPU kernels on the same values:
//   GeluForward*, GeluBackward*: |gpu - cpu| <= r(|cpu|) + 1e-5 (1 + |cpu|): the fp32
//     tolerance plus one rounding to nearest (half an ulp) at most r: bf16 r(v) = 2^-8 v (8
//     significant bits); fp16 r(v) = 2^-11 v + 2^-25 (11 significant bits, plus half the
//     subnormals' spacing 2^-24 for results below 2^-14, such as gelu of x near -6); in place
//     gives the same bits;
//   ResidualForward*: bit for bit round(a + b) (one float addition, one rounding), also for
//     sums that overflow to +-inf, tie at the overflow threshold, cancel to +0, or add
//     subnormals; and every non-NaN value of the format plus -0 gives that value back (exact
//     widening and storing, subnormals included); in place too;
//   CastFloatTo*: bit for bit the host conversion (FloatToBFloat16, FloatToFloat16) on random
//     values and on hand-worked cases (whose expected bits are also checked against the host
//     conversion, without a GPU): +-0, ties, subnormals (for fp16 2^-24, ties at 2^-25 and
//     3 2^-25, values rounding into the normal range at 2^-14 and staying below it), +-inf,
//     overflow (fp16: 65519 to 65504, 65520 to inf; FLT_MAX to inf) and NaNs with sign and
//     payload (quiet, the top payload bits kept); and on every rounding boundary of the
//     format (each midpoint between adjacent values and the floats either side, both signs)
//     and 2048 NaN payloads;
//   Cast*ToFloat: bit for bit the host widening (BFloat16ToFloat, Float16ToFloat) of every
//     16-bit pattern (every NaN payload, +-inf, the subnormals, +-0), in arrays of every size
//     above, so that each pattern lands on several threads and blocks; hand-worked cases
//     (also checked against the host, without a GPU); and every non-NaN value cast back to
//     the format gives itself;
//   RoundToHalf, AddRoundedHalf (16-bit values in fp32 storage): bit for bit
//     kernels/precision.h's RoundTo and AddRounded, on those boundaries, the special cases,
//     random values up to 1e5 (fp16 overflow) and down to 1e-5 (fp16 subnormals), in place too.
// Without a GPU the tests that need one skip; the argument checks run everywhere.
#include "kernels/cuda/elementwise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/optimizer.h"
#include "kernels/precision.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::AsElements;
using testing::Bf16Format;
using testing::Device;
using testing::ExpectSameBits;
using testing::ExpectSameValueBits;
using testing::F16Format;
using testing::HalfFormatName;
using testing::HalfFormats;
using testing::RoundToBits;
using testing::WidenBits;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the CUDA element-wise kernel tests")

constexpr int64_t kSizes[] = {1, 7, 1000, 65537, (1 << 20) + 3};

// Elements where |got - want| > tol * (1 + |want|) (NaN never passes); the first is named.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const char* what, int64_t n) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= tol * (1.0 + std::fabs(want[i])))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " n=" << n << ": " << bad << " elements off, first [" << first
                    << "] gpu " << (first >= 0 ? got[first] : 0) << " cpu "
                    << (first >= 0 ? want[first] : 0);
}

TEST(ElementwiseCuda, GeluMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<float> x = RandomFloats(n, 11, -6.0f, 6.0f);
    const std::vector<float> dout = RandomFloats(n, 12);
    std::vector<float> out(n), dx(n);
    kernels::GeluForward(out.data(), x.data(), n);
    kernels::GeluBackward(dx.data(), x.data(), dout.data(), n);
    Device<float> dx_in(x), ddout(dout), dout_gpu(n), ddx(n);
    ASSERT_TRUE(cuda::GeluForward(dout_gpu.get(), dx_in.get(), n, nullptr).ok());
    ASSERT_TRUE(cuda::GeluBackward(ddx.get(), dx_in.get(), ddout.get(), n, nullptr).ok());
    ExpectClose(dout_gpu.Host(), out, 1e-5, "GeluForward", n);
    ExpectClose(ddx.Host(), dx, 1e-5, "GeluBackward", n);
  }
}

TEST(ElementwiseCuda, AdamWMatchesTheCpuOverSteps) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    std::vector<float> p = RandomFloats(n, 21), m(n, 0.0f), v(n, 0.0f);
    Device<float> dp(p), dm(m), dv(v);
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = RandomFloats(n, 30 + static_cast<uint32_t>(step));
      AdamMomentArgs a;
      a.step = step;
      kernels::AdamWStep(a, 3e-3f, 0.1f, absl::MakeSpan(p), g, absl::MakeSpan(m),
                         absl::MakeSpan(v));
      Device<float> dg(g);
      ASSERT_TRUE(
          cuda::AdamWStep(a, 3e-3f, 0.1f, dp.get(), dg.get(), dm.get(), dv.get(), n, nullptr).ok());
    }
    ExpectClose(dp.Host(), p, 1e-6, "AdamW params", n);
    ExpectClose(dm.Host(), m, 1e-6, "AdamW exp_avg", n);
    ExpectClose(dv.Host(), v, 1e-6, "AdamW exp_avg_sq", n);
  }
}

TEST(ElementwiseCuda, ResidualForwardAddsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<float> a = RandomFloats(n, 71), b = RandomFloats(n, 72);
    std::vector<float> want(n);
    kernels::ResidualForward(want.data(), a.data(), b.data(), n);
    Device<float> da(a), db(b), out(n);
    ASSERT_TRUE(cuda::ResidualForward(out.get(), da.get(), db.get(), n, nullptr).ok());
    EXPECT_EQ(out.Host(), want) << "n=" << n;
    ASSERT_TRUE(cuda::ResidualForward(da.get(), da.get(), db.get(), n, nullptr).ok());  // in place
    EXPECT_EQ(da.Host(), want) << "in place, n=" << n;
  }
}

// LAMB over 3 steps: both passes on both sides, the GPU's step using the trust ratio of the
// GPU's own sums (as a trainer would), which must be within 1e-6 of the CPU's.
TEST(ElementwiseCuda, LambMatchesTheCpuOverSteps) {
  SKIP_WITHOUT_GPU();
  constexpr float kLr = 1e-3f, kDecay = 0.01f;
  for (int64_t n : kSizes) {
    std::vector<float> p = RandomFloats(n, 51), m(n, 0.0f), v(n, 0.0f);
    Device<float> dp(p), dm(m), dv(v);
    Device<double> scratch(LambSquaresScratchDoubles()), sums(2);
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = RandomFloats(n, 60 + static_cast<uint32_t>(step));
      AdamMomentArgs a;
      a.step = step;
      const LambSquareSums want = kernels::LambSquares(a, kDecay, p, g, m, v);
      Device<float> dg(g);
      ASSERT_TRUE(cuda::LambSquares(a, kDecay, dp.get(), dg.get(), dm.get(), dv.get(), n,
                                    scratch.get(), sums.get(), nullptr)
                      .ok());
      const std::vector<double> got = sums.Host();
      EXPECT_NEAR(got[0], want.params, 1e-9 * want.params) << "sum p^2, n=" << n;
      EXPECT_NEAR(got[1], want.update, 1e-6 * want.update) << "sum r^2, n=" << n;
      const float cpu_lr = static_cast<float>(kLr * std::sqrt(want.params / want.update));
      const float gpu_lr = static_cast<float>(kLr * std::sqrt(got[0] / got[1]));
      kernels::LambStep(a, kDecay, cpu_lr, absl::MakeSpan(p), g, absl::MakeSpan(m),
                        absl::MakeSpan(v));
      ASSERT_TRUE(
          cuda::LambStep(a, kDecay, gpu_lr, dp.get(), dg.get(), dm.get(), dv.get(), n, nullptr)
              .ok());
    }
    ExpectClose(dp.Host(), p, 1e-6, "LAMB params", n);
    ExpectClose(dm.Host(), m, 1e-6, "LAMB exp_avg", n);
    ExpectClose(dv.Host(), v, 1e-6, "LAMB exp_avg_sq", n);
  }
}

TEST(ElementwiseCuda, SumOfSquaresMatchesTheCpuAndIsReproducible) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<float> x = RandomFloats(n, 41, -3.0f, 3.0f);
    const double want = kernels::SumOfSquares(x);
    Device<float> dx(x);
    Device<double> scratch(SumOfSquaresScratchDoubles()), result(1);
    ASSERT_TRUE(cuda::SumOfSquares(dx.get(), n, scratch.get(), result.get(), nullptr).ok());
    const double got = result.Host()[0];
    EXPECT_NEAR(got, want, 1e-9 * want) << "n=" << n;
    ASSERT_TRUE(cuda::SumOfSquares(dx.get(), n, scratch.get(), result.get(), nullptr).ok());
    const double again = result.Host()[0];
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << "not reproducible, n=" << n;
  }
}

TEST(ElementwiseCuda, ScaleAndFindNonFiniteScalesAndFlags) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    for (float poison :
         {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> x = RandomFloats(n, 51);
      if (poison != 0.0f || std::isnan(poison)) x.back() = poison;  // 0: none injected
      std::vector<float> want = x;
      const bool want_flag = kernels::ScaleAndFindNonFinite(absl::MakeSpan(want), 0.125f);
      Device<float> dx(x);
      Device<int> flag(1);
      absl::StatusOr<bool> got =
          cuda::ScaleAndFindNonFiniteSync(dx.get(), n, 0.125f, flag.get(), nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, want_flag) << "n=" << n << " poison " << poison;
      ExpectSameValueBits(dx.Host(), want, absl::StrCat("n=", n, " poison ", poison));
    }
  }
}

// ---- bf16 and fp16 twins: typed tests over the two formats ----

// The twins of one format.
template <typename F>
struct HalfKernels;
template <>
struct HalfKernels<Bf16Format> {
  static constexpr auto kGeluForward = &cuda::GeluForwardBf16;
  static constexpr auto kGeluBackward = &cuda::GeluBackwardBf16;
  static constexpr auto kResidualForward = &cuda::ResidualForwardBf16;
  static constexpr auto kCastFloat = &cuda::CastFloatToBf16;
  static constexpr auto kCastToFloat = &cuda::CastBf16ToFloat;
  static constexpr HalfFormat kFormat = HalfFormat::kBFloat16;
};
template <>
struct HalfKernels<F16Format> {
  static constexpr auto kGeluForward = &cuda::GeluForwardF16;
  static constexpr auto kGeluBackward = &cuda::GeluBackwardF16;
  static constexpr auto kResidualForward = &cuda::ResidualForwardF16;
  static constexpr auto kCastFloat = &cuda::CastFloatToF16;
  static constexpr auto kCastToFloat = &cuda::CastF16ToFloat;
  static constexpr HalfFormat kFormat = HalfFormat::kFloat16;
};

float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// A float and the bits the format's round to nearest even gives it, worked out by hand.
struct Cast {
  uint32_t in;
  uint16_t out;
};

// The format's awkward cases: +-0, +-1, +-inf, overflow, subnormals, ties, NaNs.
template <typename F>
std::vector<Cast> SpecialCasts();
template <>
std::vector<Cast> SpecialCasts<Bf16Format>() {
  return {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // +-0
      {0x3f800000u, 0x3f80}, {0xbf800000u, 0xbf80},  // +-1
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // +-inf
      {0x7f7fffffu, 0x7f80}, {0xff7fffffu, 0xff80},  // +-FLT_MAX: round up to +-inf
      {0x00000001u, 0x0000},                         // the smallest float: to 0
      {0x00800000u, 0x0080},                         // FLT_MIN, exact
      {0x3f808000u, 0x3f80},                         // 1 + 2^-8: a tie, to even (1)
      {0x3f818000u, 0x3f82},                         // 1 + 3 2^-8: a tie, to even (up)
      {0x3f808001u, 0x3f81},                         // just above the tie: up
      {0x7f7f8000u, 0x7f80},                         // a tie at the top of the range: to inf
      {0x7fc00000u, 0x7fc0}, {0xffc00000u, 0xffc0},  // quiet NaNs, both signs
      {0x7f800001u, 0x7fc0}, {0xff812345u, 0xffc1},  // signalling NaNs: quiet, sign, payload
  };
}
template <>
std::vector<Cast> SpecialCasts<F16Format>() {
  return {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // +-0
      {0x3f800000u, 0x3c00}, {0xbf800000u, 0xbc00},  // +-1
      {0x7f800000u, 0x7c00}, {0xff800000u, 0xfc00},  // +-inf
      {0x477fe000u, 0x7bff},                         // 65504, the largest fp16, exact
      {0x477fef00u, 0x7bff},                         // 65519: down to 65504
      {0x477fefffu, 0x7bff},                         // just below 65520: down to 65504
      {0x477ff000u, 0x7c00}, {0xc77ff000u, 0xfc00},  // +-65520, a tie at the top: to +-inf
      {0x47c35000u, 0x7c00},                         // 1e5: inf
      {0x7f7fffffu, 0x7c00}, {0xff7fffffu, 0xfc00},  // +-FLT_MAX: +-inf
      {0x00000001u, 0x0000}, {0x80000001u, 0x8000},  // float subnormals: to +-0
      {0x00800000u, 0x0000},                         // FLT_MIN: 0
      {0x33800000u, 0x0001}, {0xb3800000u, 0x8001},  // +-2^-24, the smallest fp16 subnormal
      {0x33000000u, 0x0000},  // 2^-25: a tie between 0 and 2^-24, to even (0)
      {0x33000001u, 0x0001},  // just above it: up
      {0x32ffffffu, 0x0000},  // just below it: down
      {0x33c00000u, 0x0002},  // 3 2^-25: a tie, to even (2 2^-24)
      {0x34200000u, 0x0002},  // 5 2^-25: a tie, to even (2 2^-24)
      {0x387fc000u, 0x03ff},  // 1023 2^-24, the largest subnormal, exact
      {0x387fe000u, 0x0400},  // 1023.5 2^-24: a tie, to even: up into the normals (2^-14)
      {0x387fdfffu, 0x03ff},  // just below it: stays subnormal
      {0x387fffffu, 0x0400},  // just below 2^-14: up to 2^-14
      {0x38800000u, 0x0400},  // 2^-14, the smallest normal fp16, exact
      {0x3f801000u, 0x3c00},  // 1 + 2^-11: a tie, to even (1)
      {0x3f803000u, 0x3c02},  // 1 + 3 2^-11: a tie, to even (up)
      {0x3f801001u, 0x3c01},  // just above the tie: up
      {0x7fc00000u, 0x7e00}, {0xffc00000u, 0xfe00},  // quiet NaNs, both signs
      {0x7f800001u, 0x7e00}, {0xff812345u, 0xfe09},  // signalling NaNs: quiet, sign, payload
      {0x7fbfffffu, 0x7fff}, {0x7f802000u, 0x7e01},  // the top 10 payload bits kept
  };
}

// Hand-worked cases (Cast, Widening: the bits of an input and of its result) in an array of
// inputs: PutAtTheEnd writes case i's input at in[size - 1 - i] (as many as fit), and
// ExpectAtTheEnd checks the results there.
template <typename Case, typename T>
void PutAtTheEnd(const std::vector<Case>& cases, std::vector<T>& in) {
  static_assert(sizeof(Case::in) == sizeof(T));
  for (size_t i = 0; i < cases.size() && i < in.size(); ++i) {
    std::memcpy(&in[in.size() - 1 - i], &cases[i].in, sizeof(T));
  }
}
template <typename Case, typename T>
void ExpectAtTheEnd(const std::vector<Case>& cases, const std::vector<T>& got, int64_t n) {
  for (size_t i = 0; i < cases.size() && i < got.size(); ++i) {
    EXPECT_EQ(got[got.size() - 1 - i], cases[i].out)
        << std::hex << "input bits 0x" << cases[i].in << ", n=" << std::dec << n;
  }
}

// Every rounding boundary of the format: for each pair of adjacent finite values (and the
// largest with the next power of two, where rounding overflows), their midpoint (a tie, exact
// in fp32) and the floats either side of it, with both signs; and 2048 NaNs, every 10-bit top
// payload with both signs.
template <typename F>
std::vector<float> RoundingBoundaries() {
  std::vector<float> v;
  for (uint32_t h = 0; h <= F::kMaxFinite; ++h) {
    const double low = F::Widen(static_cast<uint16_t>(h));
    const double high = h < F::kMaxFinite ? double{F::Widen(static_cast<uint16_t>(h + 1))}
                                          : 2 * low - F::Widen(static_cast<uint16_t>(h - 1));
    const float mid = static_cast<float>((low + high) / 2);
    for (float f : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, INFINITY)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  for (uint32_t payload = 0; payload < 1024; ++payload) {
    const uint32_t nan = 0x7f800000u | (payload << 13) | (payload % 2 ? 0x1fffu : 0x1u);
    v.push_back(FloatFromBits(nan));
    v.push_back(FloatFromBits(nan | 0x80000000u));
  }
  return v;
}

// Elements where |got - want| > F::RoundingBound(|want|) + tol (1 + |want|) (NaN never
// passes).
template <typename F>
void ExpectWithinOneRounding(const std::vector<float>& got, const std::vector<float>& want,
                             double tol, const std::string& what, int64_t n) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    const double w = std::fabs(double{want[i]});
    if (!(d <= F::RoundingBound(w) + tol * (1.0 + w))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " n=" << n << ": " << bad << " elements off, first [" << first
                    << "] gpu " << (first >= 0 ? got[first] : 0) << " cpu "
                    << (first >= 0 ? want[first] : 0);
}

template <typename F>
class ElementwiseCudaHalf : public ::testing::Test {};
TYPED_TEST_SUITE(ElementwiseCudaHalf, HalfFormats, HalfFormatName);

TYPED_TEST(ElementwiseCudaHalf, GeluMatchesTheCpuOnRoundedInputs) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::string forward_name = absl::StrCat("GeluForward", F::kName);
  const std::string backward_name = absl::StrCat("GeluBackward", F::kName);
  for (int64_t n : kSizes) {
    const std::vector<uint16_t> x = RoundToBits<F>(RandomFloats(n, 81, -6.0f, 6.0f));
    const std::vector<uint16_t> dout = RoundToBits<F>(RandomFloats(n, 82));
    const std::vector<float> xf = WidenBits<F>(x), doutf = WidenBits<F>(dout);
    std::vector<float> out(n), dx(n);
    kernels::GeluForward(out.data(), xf.data(), n);
    kernels::GeluBackward(dx.data(), xf.data(), doutf.data(), n);
    Device<uint16_t> dx_in(x), ddout(dout), dout_gpu(n), ddx(n);
    ASSERT_TRUE(K::kGeluForward(AsElements<F>(dout_gpu), AsElements<F>(dx_in), n, nullptr).ok());
    ASSERT_TRUE(
        K::kGeluBackward(AsElements<F>(ddx), AsElements<F>(dx_in), AsElements<F>(ddout), n, nullptr)
            .ok());
    const std::vector<uint16_t> forward = dout_gpu.Host(), backward = ddx.Host();
    ExpectWithinOneRounding<F>(WidenBits<F>(forward), out, 1e-5, forward_name, n);
    ExpectWithinOneRounding<F>(WidenBits<F>(backward), dx, 1e-5, backward_name, n);
    // In place (dx over dout, then out over x) gives the same bits.
    ASSERT_TRUE(K::kGeluBackward(AsElements<F>(ddout), AsElements<F>(dx_in), AsElements<F>(ddout),
                                 n, nullptr)
                    .ok());
    EXPECT_EQ(ddout.Host(), backward) << backward_name << " in place, n=" << n;
    ASSERT_TRUE(K::kGeluForward(AsElements<F>(dx_in), AsElements<F>(dx_in), n, nullptr).ok());
    EXPECT_EQ(dx_in.Host(), forward) << forward_name << " in place, n=" << n;
  }
}

// Random sums, then at the end of the arrays sums that overflow, tie at the overflow
// threshold, cancel, or add subnormals.
TYPED_TEST(ElementwiseCudaHalf, ResidualForwardRoundsTheFloatSum) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const float max = F::Widen(F::kMaxFinite);
  const float ulp = max - F::Widen(F::kMaxFinite - 1);  // the largest values' spacing
  const float tiny = F::Widen(1);                       // the smallest subnormal
  const std::vector<std::pair<float, float>> special = {
      {max, max},     {-max, -max},      // +-inf
      {max, ulp / 2}, {-max, -ulp / 2},  // ties at the overflow threshold: +-inf
      {max, ulp / 4},                    // back to max
      {max, -max},                       // +0
      {tiny, tiny},   {tiny, -tiny},     // 2 tiny, +0
      {-0.0f, -0.0f}, {0.0f, -0.0f},     // -0, +0
  };
  for (int64_t n : kSizes) {
    std::vector<float> a_random = RandomFloats(n, 91, -4.0f, 4.0f);
    std::vector<float> b_random = RandomFloats(n, 92, -0.01f, 0.01f);
    for (size_t i = 0; i < special.size() && i < a_random.size(); ++i) {
      a_random[a_random.size() - 1 - i] = special[i].first;
      b_random[b_random.size() - 1 - i] = special[i].second;
    }
    const std::vector<uint16_t> a = RoundToBits<F>(a_random), b = RoundToBits<F>(b_random);
    const std::vector<float> af = WidenBits<F>(a), bf = WidenBits<F>(b);
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = F::Round(af[i] + bf[i]);
    Device<uint16_t> da(a), db(b), out(n);
    ASSERT_TRUE(
        K::kResidualForward(AsElements<F>(out), AsElements<F>(da), AsElements<F>(db), n, nullptr)
            .ok());
    EXPECT_EQ(out.Host(), want) << "n=" << n;
    ASSERT_TRUE(
        K::kResidualForward(AsElements<F>(db), AsElements<F>(da), AsElements<F>(db), n, nullptr)
            .ok());
    EXPECT_EQ(db.Host(), want) << "in place, n=" << n;
  }
}

// Every value of the format but the NaNs (which the GPU's fp32 addition would make its one
// canonical NaN), plus -0, is that value: the load widens exactly and the store rounds an
// exact value to itself, subnormals, +-0 and +-inf included.
TYPED_TEST(ElementwiseCudaHalf, ResidualForwardOfEveryValueAndMinusZeroIsThatValue) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  std::vector<uint16_t> a;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (!std::isnan(F::Widen(static_cast<uint16_t>(h)))) a.push_back(static_cast<uint16_t>(h));
  }
  const int64_t n = static_cast<int64_t>(a.size());
  Device<uint16_t> da(a), db(std::vector<uint16_t>(n, F::Round(-0.0f))), out(n);
  ASSERT_TRUE(
      K::kResidualForward(AsElements<F>(out), AsElements<F>(da), AsElements<F>(db), n, nullptr)
          .ok());
  EXPECT_EQ(out.Host(), a);
  ASSERT_TRUE(
      K::kResidualForward(AsElements<F>(da), AsElements<F>(da), AsElements<F>(db), n, nullptr)
          .ok());
  EXPECT_EQ(da.Host(), a) << "in place";
}

// The hand-worked special cases against the host conversion the GPU tests compare with: no
// GPU needed.
TYPED_TEST(ElementwiseCudaHalf, HostConversionGivesTheSpecialCasesBits) {
  using F = TypeParam;
  for (const Cast& c : SpecialCasts<F>()) {
    EXPECT_EQ(F::Round(FloatFromBits(c.in)), c.out)
        << std::hex << "float bits 0x" << c.in << " (" << FloatFromBits(c.in) << ")";
  }
}

TYPED_TEST(ElementwiseCudaHalf, CastFloatEqualsTheHostConversionBitForBit) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::vector<Cast> special = SpecialCasts<F>();
  for (int64_t n : kSizes) {
    std::vector<float> in = RandomFloats(n, 95, -1e4f, 1e4f);
    PutAtTheEnd(special, in);
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = F::Round(in[i]);
    Device<float> din(in);
    Device<uint16_t> out(n);
    ASSERT_TRUE(K::kCastFloat(AsElements<F>(out), din.get(), n, nullptr).ok());
    const std::vector<uint16_t> got = out.Host();
    EXPECT_EQ(got, want) << "n=" << n;
    ExpectAtTheEnd(special, got, n);
  }
}

TYPED_TEST(ElementwiseCudaHalf, CastFloatRoundsEveryBoundaryAndNanAsTheHost) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::vector<float> in = RoundingBoundaries<F>();
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<uint16_t> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = F::Round(in[i]);
  Device<float> din(in);
  Device<uint16_t> out(n);
  ASSERT_TRUE(K::kCastFloat(AsElements<F>(out), din.get(), n, nullptr).ok());
  const std::vector<uint16_t> got = out.Host();
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  uint32_t first_bits = 0;
  if (first >= 0) std::memcpy(&first_bits, &in[first], sizeof(first_bits));
  EXPECT_EQ(bad, 0) << bad << " of " << n << " differ, first: float bits 0x" << std::hex
                    << first_bits << " gpu 0x" << (first >= 0 ? got[first] : 0) << " host 0x"
                    << (first >= 0 ? want[first] : 0);
}

std::vector<uint32_t> BitsOf(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// A 16-bit pattern and the float bits it widens to, worked out by hand.
struct Widening {
  uint16_t in;
  uint32_t out;
};

// The format's awkward patterns: +-0, +-1, +-inf, the largest finite, subnormals, NaNs.
template <typename F>
std::vector<Widening> SpecialWidenings();
template <>
std::vector<Widening> SpecialWidenings<Bf16Format>() {
  return {
      {0x0000, 0x00000000u}, {0x8000, 0x80000000u},  // +-0
      {0x3f80, 0x3f800000u}, {0xbf80, 0xbf800000u},  // +-1
      {0x7f80, 0x7f800000u}, {0xff80, 0xff800000u},  // +-inf
      {0x7f7f, 0x7f7f0000u},                         // the largest finite bf16
      {0x0001, 0x00010000u}, {0x807f, 0x807f0000u},  // subnormals, kept
      {0x7fc0, 0x7fc00000u}, {0xffc1, 0xffc10000u},  // quiet NaNs: every bit kept
      {0x7f81, 0x7f810000u}, {0xffbf, 0xffbf0000u},  // signalling NaNs: every bit kept too
  };
}
template <>
std::vector<Widening> SpecialWidenings<F16Format>() {
  return {
      {0x0000, 0x00000000u}, {0x8000, 0x80000000u},  // +-0
      {0x3c00, 0x3f800000u}, {0xbc00, 0xbf800000u},  // +-1
      {0x7c00, 0x7f800000u}, {0xfc00, 0xff800000u},  // +-inf
      {0x7bff, 0x477fe000u},                         // 65504, the largest fp16
      {0x0001, 0x33800000u}, {0x8001, 0xb3800000u},  // +-2^-24, the smallest subnormal
      {0x0002, 0x34000000u},                         // 2^-23
      {0x0003, 0x34400000u},                         // 3 2^-24
      {0x03ff, 0x387fc000u},                         // 1023 2^-24, the largest subnormal
      {0x0400, 0x38800000u},                         // 2^-14, the smallest normal
      {0x3c01, 0x3f802000u},                         // 1 + 2^-10
      {0x7e00, 0x7fc00000u}, {0xfe00, 0xffc00000u},  // quiet NaNs, both signs
      {0x7e09, 0x7fc12000u},                         // a quiet NaN's payload kept
      {0x7c01, 0x7fc02000u}, {0xfc09, 0xffc12000u},  // signalling NaNs: quiet, sign, payload
      {0x7dff, 0x7fffe000u},                         // the widest signalling payload
  };
}

TYPED_TEST(ElementwiseCudaHalf, HostWideningGivesTheSpecialCasesBits) {
  using F = TypeParam;
  for (const Widening& w : SpecialWidenings<F>()) {
    uint32_t got;
    const float f = F::Widen(w.in);
    std::memcpy(&got, &f, sizeof(got));
    EXPECT_EQ(got, w.out) << std::hex << "16-bit pattern 0x" << w.in;
  }
}

// Every 16-bit pattern, in arrays of each of kSizes (pattern (i * 40503 + 12345) mod 2^16 at
// i: an odd step, so every 65536 consecutive elements hold each pattern once), and the
// hand-worked cases at the end; the output is poisoned first.
TYPED_TEST(ElementwiseCudaHalf, CastToFloatEqualsTheHostWideningBitForBit) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::vector<Widening> special = SpecialWidenings<F>();
  for (int64_t n : kSizes) {
    std::vector<uint16_t> in(n);
    for (int64_t i = 0; i < n; ++i) in[i] = static_cast<uint16_t>(i * 40503 + 12345);
    PutAtTheEnd(special, in);
    const std::vector<float> want = WidenBits<F>(in);
    Device<uint16_t> din(in);
    Device<float> out(n);
    ASSERT_TRUE(K::kCastToFloat(out.get(), AsElements<F>(din), n, nullptr).ok());
    const std::vector<uint32_t> got = BitsOf(out.Host());
    ExpectSameBits(got, BitsOf(want), absl::StrCat("n=", n));
    ExpectAtTheEnd(special, got, n);
  }
}

// Widening is exact: every non-NaN value of the format, cast to fp32 and back on the device,
// is itself (+-0, the subnormals and +-inf included).
TYPED_TEST(ElementwiseCudaHalf, CastToFloatAndBackIsTheIdentityOnNonNanValues) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  std::vector<uint16_t> values;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (!std::isnan(F::Widen(static_cast<uint16_t>(h)))) values.push_back(static_cast<uint16_t>(h));
  }
  const int64_t n = static_cast<int64_t>(values.size());
  Device<uint16_t> din(values), back(n);
  Device<float> wide(n);
  ASSERT_TRUE(K::kCastToFloat(wide.get(), AsElements<F>(din), n, nullptr).ok());
  ASSERT_TRUE(K::kCastFloat(AsElements<F>(back), wide.get(), n, nullptr).ok());
  EXPECT_EQ(back.Host(), values);
}

// fp32-stored half values: RoundToHalf and AddRoundedHalf against kernels/precision.h, bit
// for bit, on every rounding boundary of the format, the special cases and random values of
// any magnitude (and in place).
TYPED_TEST(ElementwiseCudaHalf, RoundToHalfAndAddRoundedEqualTheCpuBitForBit) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  std::vector<float> in = RoundingBoundaries<F>();
  for (const Cast& c : SpecialCasts<F>()) in.push_back(FloatFromBits(c.in));
  for (float v : RandomFloats(65537, 96, -1e5f, 1e5f)) in.push_back(v);
  for (float v : RandomFloats(1000, 97, -1e-5f, 1e-5f)) in.push_back(v);  // fp16 subnormals
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<float> want(n);
  RoundTo(K::kFormat, in.data(), want.data(), n);
  Device<float> din(in);
  Device<float> out(n);
  ASSERT_TRUE(cuda::RoundToHalf(K::kFormat, din.get(), out.get(), n, nullptr).ok());
  EXPECT_EQ(BitsOf(out.Host()), BitsOf(want));
  ASSERT_TRUE(cuda::RoundToHalf(K::kFormat, din.get(), din.get(), n, nullptr).ok());
  EXPECT_EQ(BitsOf(din.Host()), BitsOf(want)) << "in place";

  const std::vector<float> start = RandomFloats(n, 98, -1e3f, 1e3f);
  std::vector<float> sum = start;
  AddRounded(K::kFormat, in.data(), sum.data(), n);
  Device<float> x(in);
  Device<float> dsum(start);
  ASSERT_TRUE(cuda::AddRoundedHalf(K::kFormat, x.get(), dsum.get(), n, nullptr).ok());
  ExpectSameValueBits(dsum.Host(), sum, "AddRoundedHalf");  // a NaN input's sum: any NaN
}

TEST(ElementwiseCuda, RoundToHalfArgumentsAreNamed) {
  float v[4] = {};
  float* null = nullptr;
  absl::Status s = cuda::RoundToHalf(HalfFormat::kBFloat16, null, v, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("RoundToHalf (CUDA): x is null"), std::string::npos) << s;
  s = cuda::RoundToHalf(HalfFormat::kFloat16, v, v + 1, 2, nullptr);
  EXPECT_NE(s.message().find("y must be x exactly or not overlap it"), std::string::npos) << s;
  s = cuda::RoundToHalf(HalfFormat::kFloat16, v, v, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0, got -1"), std::string::npos) << s;
  s = cuda::AddRoundedHalf(HalfFormat::kBFloat16, v, null, 1, nullptr);
  EXPECT_NE(s.message().find("AddRoundedHalf (CUDA): sum is null"), std::string::npos) << s;
  s = cuda::AddRoundedHalf(HalfFormat::kBFloat16, v, v, 1, nullptr);
  EXPECT_NE(s.message().find("sum must not overlap x"), std::string::npos) << s;
  EXPECT_TRUE(cuda::AddRoundedHalf(HalfFormat::kFloat16, null, null, 0, nullptr).ok());
}

// The checks run before anything touches the device: host addresses serve.
TYPED_TEST(ElementwiseCudaHalf, BadArgumentsAreNamed) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  using E = typename F::Element;
  E* null = nullptr;
  uint16_t h = 0, h2 = 0;
  E* b = reinterpret_cast<E*>(&h);
  E* b2 = reinterpret_cast<E*>(&h2);
  float f = 0;
  const std::string gelu = absl::StrCat("GeluForward", F::kName);
  absl::Status s = K::kGeluForward(null, b, 5, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(gelu + " (CUDA): out is null"), std::string::npos) << s;
  s = K::kGeluForward(b, null, 5, nullptr);
  EXPECT_NE(s.message().find(gelu + " (CUDA): x is null"), std::string::npos) << s;
  s = K::kGeluForward(b, b, -1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(gelu + " (CUDA): n must be >= 0, got -1"), std::string::npos) << s;
  EXPECT_TRUE(K::kGeluForward(null, null, 0, nullptr).ok());  // nothing to do
  const std::string gelu_backward = absl::StrCat("GeluBackward", F::kName);
  s = K::kGeluBackward(b, b, b2, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(gelu_backward + " (CUDA): dx must not alias x"), std::string::npos)
      << s;
  s = K::kGeluBackward(b, b2, null, 1, nullptr);
  EXPECT_NE(s.message().find(gelu_backward + " (CUDA): dout is null"), std::string::npos) << s;
  s = K::kGeluBackward(b, b2, b, -7, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  EXPECT_TRUE(K::kGeluBackward(null, null, null, 0, nullptr).ok());
  const std::string residual = absl::StrCat("ResidualForward", F::kName);
  s = K::kResidualForward(b, b2, null, 3, nullptr);
  EXPECT_NE(s.message().find(residual + " (CUDA): b is null"), std::string::npos) << s;
  s = K::kResidualForward(b, b2, b, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  EXPECT_TRUE(K::kResidualForward(null, null, null, 0, nullptr).ok());
  const std::string cast = absl::StrCat("CastFloatTo", F::kName);
  s = K::kCastFloat(null, &f, 1, nullptr);
  EXPECT_NE(s.message().find(cast + " (CUDA): out is null"), std::string::npos) << s;
  s = K::kCastFloat(b, nullptr, 1, nullptr);
  EXPECT_NE(s.message().find(cast + " (CUDA): in is null"), std::string::npos) << s;
  s = K::kCastFloat(b, &f, -2, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n must be >= 0, got -2"), std::string::npos) << s;
  s = K::kCastFloat(reinterpret_cast<E*>(&f), &f, 1, nullptr);
  EXPECT_NE(s.message().find(cast + " (CUDA): out must not overlap in"), std::string::npos) << s;
  EXPECT_TRUE(K::kCastFloat(null, nullptr, 0, nullptr).ok());
  const std::string widen = absl::StrCat("Cast", F::kName, "ToFloat");
  float* null_float = nullptr;
  s = K::kCastToFloat(null_float, b, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(widen + " (CUDA): out is null"), std::string::npos) << s;
  s = K::kCastToFloat(&f, null, 1, nullptr);
  EXPECT_NE(s.message().find(widen + " (CUDA): in is null"), std::string::npos) << s;
  s = K::kCastToFloat(&f, b, -3, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(widen + " (CUDA): n must be >= 0, got -3"), std::string::npos) << s;
  s = K::kCastToFloat(&f, reinterpret_cast<E*>(&f), 1, nullptr);
  EXPECT_NE(s.message().find(widen + " (CUDA): out must not overlap in"), std::string::npos) << s;
  EXPECT_TRUE(K::kCastToFloat(null_float, null, 0, nullptr).ok());
}

TEST(ElementwiseCuda, BadArgumentsAreNamed) {
  float* null = nullptr;
  absl::Status s = cuda::GeluForward(null, null, 5, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out is null"), std::string::npos) << s;
  s = cuda::GeluForward(null, null, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  EXPECT_TRUE(cuda::GeluForward(null, null, 0, nullptr).ok());  // nothing to do
  AdamMomentArgs a;
  a.step = 0;
  s = cuda::AdamWStep(a, 1e-3f, 0, null, null, null, null, 0, nullptr);
  EXPECT_NE(s.message().find("step must be >= 1"), std::string::npos) << s;
  float fake = 0;
  s = cuda::GeluBackward(&fake, &fake, &fake, 1, nullptr);
  EXPECT_NE(s.message().find("must not alias x"), std::string::npos) << s;
  s = cuda::SumOfSquares(&fake, 1, nullptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("scratch is null"), std::string::npos) << s;
  s = cuda::LambStep(a, 0.01f, 1e-3f, null, null, null, null, 0, nullptr);
  EXPECT_NE(s.message().find("LambStep (CUDA): step must be >= 1"), std::string::npos) << s;
  a.step = 1;
  s = cuda::LambSquares(a, 0.01f, &fake, null, &fake, &fake, 1, nullptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("grads is null"), std::string::npos) << s;
  s = cuda::LambSquares(a, 0.01f, &fake, &fake, &fake, &fake, 1, nullptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("scratch is null"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
