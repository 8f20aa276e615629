// Tests of kernels/cuda/matmul.h against the CPU kernels (kernels/matmul.h), on random inputs
// of awkward shapes, every transposition, overwriting and accumulating, in the four element
// types. Inputs of the 16-bit types are rounded to that type on the host and the CPU computes
// with the rounded values, so the products are exact in fp32 on both sides and what differs
// is the order of the fp32 sums and the rounding of the output. Tolerance per element,
// against S = the sum over k of |op(a)[i, k]| |op(b)[k, j]| (plus |c| and |bias| where they
// take part), the bound of a sum's rounding error:
//   fp32 3e-5 S; tf32 4e-3 S (inputs rounded to 10-bit mantissas); bf16 8e-3 S (the output
//   rounded to 8 bits); fp16 2e-3 S (10 bits).
// The bias gradient is checked against a double sum (1e-4 of the sum of |dy|) and
// for the same bits on a second run. Every GPU output is poisoned with NaN bytes first
// (except where the test accumulates), so an element left unwritten fails.
// Without a GPU the tests skip.
#include "kernels/cuda/matmul.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;
using testing::HaveGpu;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the cuBLASLt matmul tests")

constexpr MatMulType kTypes[] = {MatMulType::kFloat32, MatMulType::kTensorFloat32,
                                 MatMulType::kBFloat16, MatMulType::kFloat16};

double Tolerance(MatMulType type) {
  switch (type) {
    case MatMulType::kFloat32:
      return 3e-5;
    case MatMulType::kTensorFloat32:
      return 4e-3;
    case MatMulType::kBFloat16:
      return 8e-3;
    case MatMulType::kFloat16:
      return 2e-3;
  }
  return 0;
}

// Host values as the device type sees them: rounded for the 16-bit types.
std::vector<float> Rounded(MatMulType type, std::vector<float> v) {
  for (float& x : v) {
    if (type == MatMulType::kBFloat16) x = BFloat16ToFloat(FloatToBFloat16(x));
    if (type == MatMulType::kFloat16) x = Float16ToFloat(FloatToFloat16(x));
  }
  return v;
}

// A device array of `type` holding `v` (already rounded for 16-bit types), or n poisoned
// elements.
class TypedDevice {
 public:
  TypedDevice(MatMulType type, const std::vector<float>& v) : type_(type), n_(v.size()) {
    if (ElementBytes(type) == 4) {
      f32_ = std::make_unique<Device<float>>(v);
    } else {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        h[i] = type == MatMulType::kBFloat16 ? FloatToBFloat16(v[i]) : FloatToFloat16(v[i]);
      }
      f16_ = std::make_unique<Device<uint16_t>>(h);
    }
  }
  TypedDevice(MatMulType type, int64_t n) : type_(type), n_(n) {
    if (ElementBytes(type) == 4) {
      f32_ = std::make_unique<Device<float>>(n);
    } else {
      f16_ = std::make_unique<Device<uint16_t>>(n);
    }
  }
  void* get() { return f32_ ? static_cast<void*>(f32_->get()) : static_cast<void*>(f16_->get()); }
  std::vector<float> Host() const {
    if (f32_) return f32_->Host();
    std::vector<uint16_t> h = f16_->Host();
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      v[i] = type_ == MatMulType::kBFloat16 ? BFloat16ToFloat(h[i]) : Float16ToFloat(h[i]);
    }
    return v;
  }

 private:
  MatMulType type_;
  int64_t n_;
  std::unique_ptr<Device<float>> f32_;
  std::unique_ptr<Device<uint16_t>> f16_;
};

// S[i, j] = sum_k |op(a)[i, k]| |op(b)[k, j]|, through the CPU product of absolute values.
std::vector<float> AbsProductSum(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k,
                                 std::vector<float> a, std::vector<float> b) {
  for (float& x : a) x = std::fabs(x);
  for (float& x : b) x = std::fabs(x);
  std::vector<float> s(m * n);
  kernels::MatMul(ta, tb, m, n, k, a.data(), b.data(), s.data(), OutputMode::kOverwrite);
  return s;
}

void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& scale, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= tol * (scale[i] + 1e-6))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off, first ["
                    << first << "] gpu " << (first >= 0 ? got[first] : 0) << " cpu "
                    << (first >= 0 ? want[first] : 0) << " scale "
                    << (first >= 0 ? scale[first] : 0);
}

struct Shape {
  int64_t m, n, k;
};
constexpr Shape kShapes[] = {{1, 1, 1}, {3, 5, 7}, {37, 53, 129}, {128, 768, 64}, {257, 129, 1000}};

TEST(MatMulCuda, GeneralProductMatchesTheCpuInEveryTypeTranspositionAndMode) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create();
  ASSERT_TRUE(engine.ok()) << engine.status();
  uint32_t seed = 1;
  for (MatMulType type : kTypes) {
    for (const Shape& s : kShapes) {
      for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
        for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
          for (OutputMode mode : {OutputMode::kOverwrite, OutputMode::kAccumulate}) {
            const std::string what =
                absl::StrCat(MatMulTypeName(type), " m=", s.m, " n=", s.n, " k=", s.k,
                             ta == Transpose::kYes ? " aT" : "", tb == Transpose::kYes ? " bT" : "",
                             mode == OutputMode::kAccumulate ? " accumulate" : "");
            const std::vector<float> a = Rounded(type, RandomFloats(s.m * s.k, seed++));
            const std::vector<float> b = Rounded(type, RandomFloats(s.k * s.n, seed++));
            const std::vector<float> c0 = Rounded(type, RandomFloats(s.m * s.n, seed++));
            std::vector<float> want = c0;
            kernels::MatMul(ta, tb, s.m, s.n, s.k, a.data(), b.data(), want.data(), mode);
            std::vector<float> scale = AbsProductSum(ta, tb, s.m, s.n, s.k, a, b);
            if (mode == OutputMode::kAccumulate) {
              for (size_t i = 0; i < scale.size(); ++i) scale[i] += std::fabs(c0[i]);
            }
            TypedDevice da(type, a), db(type, b);
            std::unique_ptr<TypedDevice> dc = mode == OutputMode::kAccumulate
                                                  ? std::make_unique<TypedDevice>(type, c0)
                                                  : std::make_unique<TypedDevice>(type, s.m * s.n);
            ASSERT_TRUE((*engine)
                            ->MatMul(type, ta, tb, s.m, s.n, s.k, da.get(), db.get(), dc->get(),
                                     mode, nullptr)
                            .ok())
                << what;
            ExpectWithin(dc->Host(), want, scale, Tolerance(type), what);
          }
        }
      }
    }
  }
  // One plan per distinct call, reused: 4 types x 5 shapes x 4 transpositions x 2 modes.
  EXPECT_EQ((*engine)->cached_plans(), 4 * 5 * 4 * 2);
}

// Parameters and activations sit at any element offset of the flat buffers: the engine tells
// cuBLASLt's heuristic each pointer's alignment (here one element past a 256-byte boundary),
// so it never picks an algorithm that assumes more (a "misaligned address" fault on a GPU;
// an error in the CPU emulation, which checks).
TEST(MatMulCuda, PointersAtAnyElementOffset) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create();
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kN = 33, kIn = 24, kOut = 40;
  uint32_t seed = 300;
  for (MatMulType type : kTypes) {
    const std::string name = MatMulTypeName(type);
    const std::vector<float> x = Rounded(type, RandomFloats(kN * kIn, seed++));
    const std::vector<float> w = Rounded(type, RandomFloats(kOut * kIn, seed++));
    const std::vector<float> bias = Rounded(type, RandomFloats(kOut, seed++));
    // One element in front of each array.
    auto shifted = [](const std::vector<float>& v) {
      std::vector<float> out = {0.0f};
      out.insert(out.end(), v.begin(), v.end());
      return out;
    };
    TypedDevice dx(type, shifted(x)), dw(type, shifted(w)), dbias(type, shifted(bias)),
        dy(type, kN * kOut + 1);
    auto at1 = [&](TypedDevice& d) { return static_cast<char*>(d.get()) + ElementBytes(type); };
    ASSERT_TRUE(
        (*engine)
            ->LinearForward(type, at1(dx), at1(dw), at1(dbias), at1(dy), kN, kIn, kOut, nullptr)
            .ok())
        << name;
    std::vector<float> want(kN * kOut);
    kernels::LinearForward(x.data(), w.data(), bias.data(), want.data(), kN, kIn, kOut);
    std::vector<float> scale = AbsProductSum(Transpose::kNo, Transpose::kYes, kN, kOut, kIn, x, w);
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kOut; ++j) scale[i * kOut + j] += std::fabs(bias[j]);
    }
    std::vector<float> got = dy.Host();
    got.erase(got.begin());
    ExpectWithin(got, want, scale, Tolerance(type), name + " at an element offset");
  }
}

// GptCuda's LM head on logits whose rows are padded (row stride > vocab): the forward writes
// y with a stride, the backward products read dy with one; the padding is never written
// (it stays NaN) and, being NaN, would spoil every result it were read into.
TEST(MatMulCuda, StridedRowsAsGptCudaPadsItsLogits) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create();
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kN = 50, kIn = 64, kOut = 301, kStride = 320;
  uint32_t seed = 400;
  for (MatMulType type : kTypes) {
    const std::string name = MatMulTypeName(type);
    const std::vector<float> x = Rounded(type, RandomFloats(kN * kIn, seed++));
    const std::vector<float> w = Rounded(type, RandomFloats(kOut * kIn, seed++));
    const std::vector<float> dy = Rounded(type, RandomFloats(kN * kOut, seed++));
    auto pad = [&](const std::vector<float>& dense) {
      std::vector<float> out(kN * kStride, std::nanf(""));
      for (int64_t i = 0; i < kN; ++i) {
        std::copy_n(dense.data() + i * kOut, kOut, out.data() + i * kStride);
      }
      return out;
    };
    auto unpad = [&](const std::vector<float>& padded, const std::string& what) {
      std::vector<float> out(kN * kOut);
      for (int64_t i = 0; i < kN; ++i) {
        std::copy_n(padded.data() + i * kStride, kOut, out.data() + i * kOut);
        for (int64_t j = kOut; j < kStride; ++j) {
          EXPECT_TRUE(std::isnan(padded[i * kStride + j])) << what << " wrote its padding";
        }
      }
      return out;
    };
    TypedDevice dx(type, x), dw(type, w), ddy(type, pad(dy)), dy_out(type, pad(dy));
    // Forward: y [n, out] with rows kStride apart (poisoned with NaN first, padding included).
    TypedDevice y(type, kN * kStride);
    ASSERT_TRUE((*engine)
                    ->LinearForward(type, dx.get(), dw.get(), nullptr, y.get(), kN, kIn, kOut,
                                    nullptr, kStride)
                    .ok())
        << name;
    std::vector<float> want_y(kN * kOut);
    kernels::LinearForward(x.data(), w.data(), nullptr, want_y.data(), kN, kIn, kOut);
    ExpectWithin(unpad(y.Host(), name + " forward"), want_y,
                 AbsProductSum(Transpose::kNo, Transpose::kYes, kN, kOut, kIn, x, w),
                 Tolerance(type), name + " strided forward");
    // Backward: dx = dy · w and dw = dyᵀ · x (fp32 output) from the strided dy.
    TypedDevice ddx(type, kN * kIn);
    ASSERT_TRUE((*engine)
                    ->LinearBackwardInput(type, ddy.get(), dw.get(), ddx.get(), kN, kIn, kOut,
                                          nullptr, kStride)
                    .ok())
        << name;
    std::vector<float> want_dx(kN * kIn);
    kernels::LinearBackwardInput(dy.data(), w.data(), want_dx.data(), kN, kIn, kOut);
    ExpectWithin(ddx.Host(), want_dx,
                 AbsProductSum(Transpose::kNo, Transpose::kNo, kN, kIn, kOut, dy, w),
                 Tolerance(type), name + " strided backward input");
    Device<float> ddw(std::vector<float>(kOut * kIn, 0.0f));
    ASSERT_TRUE((*engine)
                    ->LinearBackwardWeightsFloatOutput(
                        type, dx.get(), ddy.get(), ddw.get(), nullptr, kN, kIn, kOut,
                        OutputMode::kAccumulate, nullptr, nullptr, kStride)
                    .ok())
        << name;
    std::vector<float> want_dw(kOut * kIn, 0.0f), unused(kOut);
    kernels::LinearBackwardWeights(x.data(), dy.data(), want_dw.data(), unused.data(), kN, kIn,
                                   kOut, OutputMode::kAccumulate);
    ExpectWithin(ddw.Host(), want_dw,
                 AbsProductSum(Transpose::kYes, Transpose::kNo, kOut, kIn, kN, dy, x),
                 type == MatMulType::kTensorFloat32 ? Tolerance(type) : 1e-4,
                 name + " strided weight gradient");
  }
  // A stride below the width, or with a bias gradient (which reads a dense dy), is refused.
  TypedDevice a(MatMulType::kFloat32, kN * kStride), b(MatMulType::kFloat32, kOut * kIn),
      c(MatMulType::kFloat32, kN * kIn);
  absl::Status st = (*engine)->LinearBackwardInput(MatMulType::kFloat32, a.get(), b.get(), c.get(),
                                                   kN, kIn, kOut, nullptr, kOut - 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("strides.a = 300 is below the operand's width 301"),
            std::string::npos)
      << st;
  Device<float> dbias(kOut), scratch(BiasGradientScratchFloats(kOut));
  st = (*engine)->LinearBackwardWeights(MatMulType::kFloat32, c.get(), a.get(), b.get(),
                                        dbias.get(), kN, kIn, kOut, OutputMode::kOverwrite,
                                        scratch.get(), nullptr, kStride);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("dy_stride = 320 with a dbias"), std::string::npos) << st;
}

TEST(MatMulCuda, LinearLayerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create();
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kN = 300, kIn = 77, kOut = 129;
  uint32_t seed = 100;
  for (MatMulType type : kTypes) {
    const std::string name = MatMulTypeName(type);
    const std::vector<float> x = Rounded(type, RandomFloats(kN * kIn, seed++));
    const std::vector<float> w = Rounded(type, RandomFloats(kOut * kIn, seed++));
    const std::vector<float> bias = Rounded(type, RandomFloats(kOut, seed++));
    const std::vector<float> dy = Rounded(type, RandomFloats(kN * kOut, seed++));
    TypedDevice dx_in(type, x), dw(type, w), dbias_in(type, bias), ddy(type, dy);

    // Forward with the bias epilogue.
    std::vector<float> y(kN * kOut);
    kernels::LinearForward(x.data(), w.data(), bias.data(), y.data(), kN, kIn, kOut);
    std::vector<float> scale =
        AbsProductSum(Transpose::kNo, Transpose::kYes, kN, kOut, kIn, x, w);
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kOut; ++j) scale[i * kOut + j] += std::fabs(bias[j]);
    }
    TypedDevice dy_out(type, kN * kOut);
    ASSERT_TRUE((*engine)
                    ->LinearForward(type, dx_in.get(), dw.get(), dbias_in.get(), dy_out.get(), kN,
                                    kIn, kOut, nullptr)
                    .ok());
    ExpectWithin(dy_out.Host(), y, scale, Tolerance(type), name + " LinearForward");

    // Backward, input.
    std::vector<float> dx(kN * kIn);
    kernels::LinearBackwardInput(dy.data(), w.data(), dx.data(), kN, kIn, kOut);
    TypedDevice ddx(type, kN * kIn);
    ASSERT_TRUE((*engine)
                    ->LinearBackwardInput(type, ddy.get(), dw.get(), ddx.get(), kN, kIn, kOut,
                                          nullptr)
                    .ok());
    ExpectWithin(ddx.Host(), dx,
                 AbsProductSum(Transpose::kNo, Transpose::kNo, kN, kIn, kOut, dy, w),
                 Tolerance(type), name + " LinearBackwardInput");

    // Backward, weights and bias, accumulating into earlier gradients.
    const std::vector<float> dw0 = Rounded(type, RandomFloats(kOut * kIn, seed++));
    const std::vector<float> db0 = RandomFloats(kOut, seed++);
    std::vector<float> dweight = dw0, dbias = db0;
    kernels::LinearBackwardWeights(x.data(), dy.data(), dweight.data(), dbias.data(), kN, kIn,
                                   kOut, OutputMode::kAccumulate);
    std::vector<float> wscale =
        AbsProductSum(Transpose::kYes, Transpose::kNo, kOut, kIn, kN, dy, x);
    for (size_t i = 0; i < wscale.size(); ++i) wscale[i] += std::fabs(dw0[i]);
    TypedDevice ddweight(type, dw0);
    Device<float> ddbias(db0);
    Device<float> scratch(BiasGradientScratchFloats(kOut));
    ASSERT_TRUE((*engine)
                    ->LinearBackwardWeights(type, dx_in.get(), ddy.get(), ddweight.get(),
                                            ddbias.get(), kN, kIn, kOut,
                                            OutputMode::kAccumulate, scratch.get(), nullptr)
                    .ok());
    ExpectWithin(ddweight.Host(), dweight, wscale, Tolerance(type),
                 name + " LinearBackwardWeights dweight");
    std::vector<float> bscale(kOut, 0.0f);
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kOut; ++j) bscale[j] += std::fabs(dy[i * kOut + j]);
    }
    for (int64_t j = 0; j < kOut; ++j) bscale[j] += std::fabs(db0[j]);
    ExpectWithin(ddbias.Host(), dbias, bscale, 1e-4, name + " LinearBackwardWeights dbias");
  }
}

// Mixed precision's weight gradient: 16-bit x and dy, accumulated into an fp32 dweight. The
// output is not rounded to 16 bits, so the tolerance is fp32's sum order with tensor-core
// accumulation: 1e-4 S (S as above, plus |dweight0|).
TEST(MatMulCuda, WeightGradientIntoFloatFrom16BitActivations) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create();
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kN = 1000, kIn = 77, kOut = 129;
  uint32_t seed = 200;
  for (MatMulType type : {MatMulType::kBFloat16, MatMulType::kFloat16, MatMulType::kFloat32}) {
    const std::string name = MatMulTypeName(type);
    const std::vector<float> x = Rounded(type, RandomFloats(kN * kIn, seed++));
    const std::vector<float> dy = Rounded(type, RandomFloats(kN * kOut, seed++));
    const std::vector<float> dw0 = RandomFloats(kOut * kIn, seed++);  // fp32, not rounded
    const std::vector<float> db0 = RandomFloats(kOut, seed++);
    for (OutputMode mode : {OutputMode::kOverwrite, OutputMode::kAccumulate}) {
      const bool add = mode == OutputMode::kAccumulate;
      std::vector<float> want = add ? dw0 : std::vector<float>(kOut * kIn, 0.0f);
      std::vector<float> dbias_want = add ? db0 : std::vector<float>(kOut, 0.0f);
      kernels::LinearBackwardWeights(x.data(), dy.data(), want.data(), dbias_want.data(), kN,
                                     kIn, kOut, OutputMode::kAccumulate);
      std::vector<float> scale =
          AbsProductSum(Transpose::kYes, Transpose::kNo, kOut, kIn, kN, dy, x);
      if (add) {
        for (size_t i = 0; i < scale.size(); ++i) scale[i] += std::fabs(dw0[i]);
      }
      TypedDevice dx(type, x), ddy(type, dy);
      // Overwriting: NaN first (cuBLASLt must not read c when beta is 0, nor the bias
      // gradient its output); accumulating: onto dw0 and db0.
      Device<float> dweight(add ? dw0 : std::vector<float>(kOut * kIn, std::nanf("")));
      Device<float> dbias(add ? db0 : std::vector<float>(kOut, std::nanf(""))),
          scratch(BiasGradientScratchFloats(kOut));
      ASSERT_TRUE((*engine)
                      ->LinearBackwardWeightsFloatOutput(type, dx.get(), ddy.get(), dweight.get(),
                                                         dbias.get(), kN, kIn, kOut, mode,
                                                         scratch.get(), nullptr)
                      .ok())
          << name;
      const std::string what = absl::StrCat(name, add ? " accumulate" : " overwrite");
      ExpectWithin(dweight.Host(), want, scale, 1e-4, what + " dweight");
      std::vector<float> bscale(kOut, 0.0f);
      for (int64_t j = 0; j < kOut && add; ++j) bscale[j] = std::fabs(db0[j]);
      for (int64_t i = 0; i < kN; ++i) {
        for (int64_t j = 0; j < kOut; ++j) bscale[j] += std::fabs(dy[i * kOut + j]);
      }
      ExpectWithin(dbias.Host(), dbias_want, bscale, 1e-4, what + " dbias");
    }
  }
}

TEST(MatMulCuda, BiasGradientIsExactlyReproducible) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 8192 + 5, kColumns = 2304 + 3;
  const std::vector<float> dy = RandomFloats(kRows * kColumns, 7);
  Device<float> ddy(dy), scratch(BiasGradientScratchFloats(kColumns));
  std::vector<double> want(kColumns, 0.0), scale(kColumns, 0.0);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kColumns; ++j) {
      want[j] += dy[i * kColumns + j];
      scale[j] += std::fabs(dy[i * kColumns + j]);
    }
  }
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    Device<float> dbias(kColumns);
    ASSERT_TRUE(BiasGradient(MatMulType::kFloat32, ddy.get(), kRows, kColumns, dbias.get(),
                             OutputMode::kOverwrite, scratch.get(), nullptr)
                    .ok());
    runs.push_back(dbias.Host());
  }
  for (int64_t j = 0; j < kColumns; ++j) {
    ASSERT_LE(std::fabs(runs[0][j] - want[j]), 1e-4 * scale[j]) << "column " << j;
  }
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), kColumns * sizeof(float)), 0)
      << "two runs of the bias gradient differ";
}

TEST(MatMulCuda, BadArgumentsAreNamed) {
  SKIP_WITHOUT_GPU();
  auto engine = MatMulEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Device<float> a(16), b(16), c(16);
  absl::Status s = (*engine)->MatMul(MatMulType::kFloat32, Transpose::kNo, Transpose::kNo, 0, 4,
                                     4, a.get(), b.get(), c.get(), OutputMode::kOverwrite,
                                     nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("m must be"), std::string::npos) << s;
  s = (*engine)->MatMul(MatMulType::kFloat32, Transpose::kNo, Transpose::kNo, 4, 4, 4, a.get(),
                        nullptr, c.get(), OutputMode::kOverwrite, nullptr);
  EXPECT_NE(s.message().find("b is null"), std::string::npos) << s;
  s = (*engine)->MatMul(MatMulType::kFloat32, Transpose::kNo, Transpose::kNo, 4, 4, 4, a.get(),
                        b.get(), c.get(), OutputMode::kAccumulate, nullptr, a.get());
  EXPECT_NE(s.message().find("kOverwrite"), std::string::npos) << s;
  s = (*engine)->LinearBackwardWeights(MatMulType::kFloat32, a.get(), b.get(), c.get(), c.get(),
                                       4, 4, 4, OutputMode::kOverwrite, nullptr, nullptr);
  EXPECT_NE(s.message().find("scratch is null"), std::string::npos) << s;
  EXPECT_EQ(MatMulEngine::Create(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
