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
// The bf16 twins, on inputs rounded to bf16 (kernels/half.h), against the CPU kernels on the
// same values:
//   GeluForwardBf16, GeluBackwardBf16: |gpu - cpu| <= 2^-8 |cpu| + 1e-5 (1 + |cpu|): one
//     rounding to bf16 (half an ulp, at most 2^-8 |value|) on top of the fp32 tolerance;
//   ResidualForwardBf16: bit for bit FloatToBFloat16(a + b) (one float addition, one rounding);
//   CastFloatToBf16: bit for bit FloatToBFloat16, including ties, +-0, subnormals, +-inf,
//     overflow to inf and NaNs with sign and payload.
// Without a GPU the tests that need one skip; the argument checks run everywhere.
#include "kernels/cuda/elementwise.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/half.h"
#include "kernels/optimizer.h"
#include "kernels/cuda/testing.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;
using testing::AsBf16;
using testing::Bf16Bits;
using testing::HaveGpu;
using testing::Widen;

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
      kernels::AdamWStep(a, 3e-3f, 0.1f, absl::MakeSpan(p), g, absl::MakeSpan(m), absl::MakeSpan(v));
      Device<float> dg(g);
      ASSERT_TRUE(cuda::AdamWStep(a, 3e-3f, 0.1f, dp.get(), dg.get(), dm.get(), dv.get(), n,
                                  nullptr)
                      .ok());
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
    for (float poison : {0.0f, std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()}) {
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
      const std::vector<float> scaled = dx.Host();
      EXPECT_EQ(std::memcmp(scaled.data(), want.data(), n * sizeof(float)), 0) << "n=" << n;
    }
  }
}

// ---- bf16 twins ----

using bf16 = __nv_bfloat16;

// Elements where |got - want| > 2^-8 |want| + tol (1 + |want|) (NaN never passes).
void ExpectWithinBf16Ulp(const std::vector<float>& got, const std::vector<float>& want,
                         double tol, const char* what, int64_t n) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    const double w = std::fabs(double{want[i]});
    if (!(d <= std::ldexp(w, -8) + tol * (1.0 + w))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " n=" << n << ": " << bad << " elements off, first [" << first
                    << "] gpu " << (first >= 0 ? got[first] : 0) << " cpu "
                    << (first >= 0 ? want[first] : 0);
}

TEST(ElementwiseCuda, GeluBf16MatchesTheCpuOnBf16Inputs) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<uint16_t> x = Bf16Bits(RandomFloats(n, 81, -6.0f, 6.0f));
    const std::vector<uint16_t> dout = Bf16Bits(RandomFloats(n, 82));
    const std::vector<float> xf = Widen(x), doutf = Widen(dout);
    std::vector<float> out(n), dx(n);
    kernels::GeluForward(out.data(), xf.data(), n);
    kernels::GeluBackward(dx.data(), xf.data(), doutf.data(), n);
    Device<uint16_t> dx_in(x), ddout(dout), dout_gpu(n), ddx(n);
    ASSERT_TRUE(cuda::GeluForwardBf16(AsBf16(dout_gpu), AsBf16(dx_in), n, nullptr).ok());
    ASSERT_TRUE(
        cuda::GeluBackwardBf16(AsBf16(ddx), AsBf16(dx_in), AsBf16(ddout), n, nullptr).ok());
    const std::vector<uint16_t> forward = dout_gpu.Host(), backward = ddx.Host();
    ExpectWithinBf16Ulp(Widen(forward), out, 1e-5, "GeluForwardBf16", n);
    ExpectWithinBf16Ulp(Widen(backward), dx, 1e-5, "GeluBackwardBf16", n);
    // In place (dx over dout, then out over x) gives the same bits.
    ASSERT_TRUE(
        cuda::GeluBackwardBf16(AsBf16(ddout), AsBf16(dx_in), AsBf16(ddout), n, nullptr).ok());
    EXPECT_EQ(ddout.Host(), backward) << "GeluBackwardBf16 in place, n=" << n;
    ASSERT_TRUE(cuda::GeluForwardBf16(AsBf16(dx_in), AsBf16(dx_in), n, nullptr).ok());
    EXPECT_EQ(dx_in.Host(), forward) << "GeluForwardBf16 in place, n=" << n;
  }
}

TEST(ElementwiseCuda, ResidualForwardBf16RoundsTheFloatSum) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<uint16_t> a = Bf16Bits(RandomFloats(n, 91, -4.0f, 4.0f));
    const std::vector<uint16_t> b = Bf16Bits(RandomFloats(n, 92, -0.01f, 0.01f));
    const std::vector<float> af = Widen(a), bf = Widen(b);
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = FloatToBFloat16(af[i] + bf[i]);
    Device<uint16_t> da(a), db(b), out(n);
    ASSERT_TRUE(cuda::ResidualForwardBf16(AsBf16(out), AsBf16(da), AsBf16(db), n, nullptr).ok());
    EXPECT_EQ(out.Host(), want) << "n=" << n;
    ASSERT_TRUE(cuda::ResidualForwardBf16(AsBf16(db), AsBf16(da), AsBf16(db), n, nullptr).ok());
    EXPECT_EQ(db.Host(), want) << "in place, n=" << n;
  }
}

TEST(ElementwiseCuda, CastFloatToBf16EqualsTheHostConversionBitForBit) {
  SKIP_WITHOUT_GPU();
  auto bits_to_float = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {
      0.0f, -0.0f, 1.0f, -1.0f, inf, -inf,
      std::numeric_limits<float>::max(),      // rounds up to inf
      -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
      bits_to_float(0x3f808000u),  // 1 + 2^-8: a tie, to even (1)
      bits_to_float(0x3f818000u),  // 1 + 3 2^-8: a tie, to even (up)
      bits_to_float(0x3f808001u),  // just above the tie: up
      bits_to_float(0x7f7f8000u),  // a tie at the top of the range: to inf
      bits_to_float(0x7fc00000u), bits_to_float(0xffc00000u),  // quiet NaNs, both signs
      bits_to_float(0x7f800001u), bits_to_float(0xff812345u),  // signalling NaNs
  };
  for (int64_t n : kSizes) {
    std::vector<float> in = RandomFloats(n, 95, -1e4f, 1e4f);
    for (size_t i = 0; i < special.size() && i < in.size(); ++i) {
      in[in.size() - 1 - i] = special[i];
    }
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = FloatToBFloat16(in[i]);
    Device<float> din(in);
    Device<uint16_t> out(n);
    ASSERT_TRUE(cuda::CastFloatToBf16(AsBf16(out), din.get(), n, nullptr).ok());
    EXPECT_EQ(out.Host(), want) << "n=" << n;
  }
}

// The checks run before anything touches the device: host addresses serve.
TEST(ElementwiseCuda, Bf16BadArgumentsAreNamed) {
  bf16* null = nullptr;
  uint16_t h = 0, h2 = 0;
  bf16* b = reinterpret_cast<bf16*>(&h);
  bf16* b2 = reinterpret_cast<bf16*>(&h2);
  float f = 0;
  absl::Status s = cuda::GeluForwardBf16(null, b, 5, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("GeluForwardBf16 (CUDA): out is null"), std::string::npos) << s;
  s = cuda::GeluForwardBf16(b, b, -1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n must be >= 0, got -1"), std::string::npos) << s;
  EXPECT_TRUE(cuda::GeluForwardBf16(null, null, 0, nullptr).ok());  // nothing to do
  s = cuda::GeluBackwardBf16(b, b, b2, 1, nullptr);
  EXPECT_NE(s.message().find("must not alias x"), std::string::npos) << s;
  s = cuda::GeluBackwardBf16(b, b2, null, 1, nullptr);
  EXPECT_NE(s.message().find("dout is null"), std::string::npos) << s;
  s = cuda::GeluBackwardBf16(b, b2, b, -7, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  s = cuda::ResidualForwardBf16(b, b2, null, 3, nullptr);
  EXPECT_NE(s.message().find("ResidualForwardBf16 (CUDA): b is null"), std::string::npos) << s;
  s = cuda::ResidualForwardBf16(b, b2, b, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  s = cuda::CastFloatToBf16(null, &f, 1, nullptr);
  EXPECT_NE(s.message().find("CastFloatToBf16 (CUDA): out is null"), std::string::npos) << s;
  s = cuda::CastFloatToBf16(b, nullptr, 1, nullptr);
  EXPECT_NE(s.message().find("in is null"), std::string::npos) << s;
  s = cuda::CastFloatToBf16(b, &f, -2, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n must be >= 0, got -2"), std::string::npos) << s;
  s = cuda::CastFloatToBf16(reinterpret_cast<bf16*>(&f), &f, 1, nullptr);
  EXPECT_NE(s.message().find("out must not overlap in"), std::string::npos) << s;
  EXPECT_TRUE(cuda::CastFloatToBf16(null, nullptr, 0, nullptr).ok());
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
