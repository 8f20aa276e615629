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
// Without a GPU the tests that need one skip; the argument checks run everywhere.
#include "kernels/cuda/elementwise.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/optimizer.h"
#include "kernels/cuda/testing.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;
using testing::HaveGpu;

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
