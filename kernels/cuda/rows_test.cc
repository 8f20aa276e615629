// Tests of kernels/cuda/rows.h against the CPU kernels (kernels/layernorm.h,
// kernels/softmax_xent.h) on random inputs of awkward shapes (rows 1, 3, 1000; channels or
// classes 1, 7, 768, 1000, 50257 where the product stays small). GPU outputs that the kernels
// overwrite are poisoned with NaN bytes first; accumulated ones start from the same random
// values as the CPU's. Tolerances: every float output in relative norm error
// ||gpu - cpu|| / ||cpu|| <= 1e-5 (sums in another order), losses <= 1e-5; predicted classes
// equal (the random logits have no near-ties). Determinism: LayerNorm backward twice gives
// the same bits. Without a GPU the tests that need one skip; the argument checks run
// everywhere.
//
// The bf16 and fp16 twins (typed tests over both formats, RowsCudaHalf/Bf16 and
// RowsCudaHalf/F16) run against the CPU kernels on the same 16-bit-valued inputs (random
// values rounded to the format first; gain and bias stay fp32; all of order 1-8, well inside
// fp16's range), on shapes with channels 1, 7, 768 + 3 and 50257 and row counts that are not
// multiples of the 32 backward chunks. Tolerances:
//   16-bit outputs (y, dx, dlogits), per element: |gpu - cpu| <= r(|cpu|) + abs, where r
//     bounds the one rounding to nearest the GPU does (half an ulp) and abs the fp32
//     differences of the sums' order, the same for both formats: 1e-4 for LayerNorm's y and
//     dx (values of order 1, sums of up to 50257 terms), 1e-6 for dlogits (magnitudes at most
//     scale = 0.25). bf16: r(v) = 2^-8 v, half an ulp with 8 significant bits and one ulp at
//     most. fp16: r(v) = 2^-11 v + 2^-25, half an ulp with 11 significant bits on the normal
//     range, plus half the subnormals' spacing 2^-24 for results below 2^-14 (the smallest
//     dlogits, of order 1e-11, become 0 or a subnormal);
//   fp32 outputs (mean, rstd, dgain, dbias, losses): relative norm error <= 1e-5, as for the
//     fp32 kernels (the same fp32 arithmetic on the same values);
//   predicted classes equal: 16-bit logits tie often, and both sides take the first maximum
//     (or the first NaN);
//   LayerNorm backward twice gives the same bits, dx and dgain. Each format's argument checks
//   (error messages naming the function, e.g. LayerNormForwardF16) run without a GPU too.
#include "kernels/cuda/rows.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/layernorm.h"
#include "kernels/softmax_xent.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::AsElements;
using testing::Bf16Format;
using testing::Device;
using testing::F16Format;
using testing::HalfFormatName;
using testing::HalfFormats;
using testing::RoundToBits;
using testing::WidenBits;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the CUDA row kernel tests")

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double{got[i]} - want[i];
    diff += d * d;
    norm += double{want[i]} * want[i];
  }
  if (std::isnan(diff)) return INFINITY;
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct Shape {
  int64_t rows;
  int64_t columns;
};
constexpr Shape kShapes[] = {{1, 1}, {1, 7}, {3, 768}, {1000, 7}, {1000, 768}, {3, 50257}};

TEST(RowsCuda, LayerNormMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " channels " << s.columns);
    const int64_t n = s.rows * s.columns;
    const std::vector<float> x = RandomFloats(n, 1, -3.0f, 5.0f);
    const std::vector<float> gain = RandomFloats(s.columns, 2, 0.5f, 1.5f);
    const std::vector<float> bias = RandomFloats(s.columns, 3);
    const std::vector<float> dy = RandomFloats(n, 4);
    std::vector<float> dx = RandomFloats(n, 5), dgain = RandomFloats(s.columns, 6),
                       dbias = RandomFloats(s.columns, 7);
    Device<float> ddx(dx), ddgain(dgain), ddbias(dbias);  // the accumulators' starting values
    std::vector<float> y(n), mean(s.rows), rstd(s.rows);
    kernels::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), gain.data(),
                              bias.data(), s.rows, s.columns);
    kernels::LayerNormBackward(dx.data(), dgain.data(), dbias.data(), dy.data(), x.data(),
                               gain.data(), mean.data(), rstd.data(), s.rows, s.columns);

    Device<float> dx_in(x), dgain_in(gain), dbias_in(bias), ddy(dy), dyo(n), dmean(s.rows),
        drstd(s.rows), scratch(LayerNormBackwardScratchFloats(s.columns));
    ASSERT_TRUE(cuda::LayerNormForward(dyo.get(), dmean.get(), drstd.get(), dx_in.get(),
                                       dgain_in.get(), dbias_in.get(), s.rows, s.columns, nullptr)
                    .ok());
    EXPECT_LE(RelativeError(dyo.Host(), y), 1e-5);
    EXPECT_LE(RelativeError(dmean.Host(), mean), 1e-5);
    EXPECT_LE(RelativeError(drstd.Host(), rstd), 1e-5);
    ASSERT_TRUE(cuda::LayerNormBackward(ddx.get(), ddgain.get(), ddbias.get(), ddy.get(),
                                        dx_in.get(), dgain_in.get(), dmean.get(), drstd.get(),
                                        s.rows, s.columns, scratch.get(), nullptr)
                    .ok());
    // One channel: x == mean, so dx's term is gain * dy - mean(gain * dy) = 0 up to rounding,
    // times rstd = 1 / sqrt(eps) ~ 316; either side may contract it into an fma (the CPU's
    // target clones do), leaving ~316 ulp of gain * dy. Elsewhere both compute the same.
    EXPECT_LE(RelativeError(ddx.Host(), dx), s.columns == 1 ? 1e-4 : 1e-5);
    EXPECT_LE(RelativeError(ddgain.Host(), dgain), 1e-5);
    EXPECT_LE(RelativeError(ddbias.Host(), dbias), 1e-5);
  }
}

TEST(RowsCuda, LayerNormBackwardIsReproducible) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 1000, channels = 768, n = rows * channels;
  const std::vector<float> x = RandomFloats(n, 8), dy = RandomFloats(n, 9);
  const std::vector<float> gain(channels, 1.0f), zeros(channels, 0.0f), zero_n(n, 0.0f);
  Device<float> dx_in(x), ddy(dy), dgain_in(gain), dbias_in(zeros), y(n), mean(rows), rstd(rows),
      scratch(LayerNormBackwardScratchFloats(channels));
  ASSERT_TRUE(cuda::LayerNormForward(y.get(), mean.get(), rstd.get(), dx_in.get(), dgain_in.get(),
                                     dbias_in.get(), rows, channels, nullptr)
                  .ok());
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Device<float> dx(zero_n), dgain(zeros), dbias(zeros);
    ASSERT_TRUE(cuda::LayerNormBackward(dx.get(), dgain.get(), dbias.get(), ddy.get(),
                                        dx_in.get(), dgain_in.get(), mean.get(), rstd.get(), rows,
                                        channels, scratch.get(), nullptr)
                    .ok());
    std::vector<float> got = dgain.Host();
    if (run == 0) first = got;
    else EXPECT_EQ(std::memcmp(got.data(), first.data(), channels * sizeof(float)), 0);
  }
}

TEST(RowsCuda, SoftmaxCrossEntropyMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n " << s.rows << " classes " << s.columns);
    const int64_t n = s.rows * s.columns;
    const std::vector<float> logits = RandomFloats(n, 10, -8.0f, 8.0f);
    std::vector<int32_t> labels(s.rows);
    for (int64_t i = 0; i < s.rows; ++i) labels[i] = static_cast<int32_t>((i * 7919) % s.columns);
    std::vector<float> loss(s.rows), dlogits(n);
    std::vector<int32_t> predicted(s.rows);
    kernels::SoftmaxCrossEntropyForwardBackward(logits.data(), labels.data(), s.rows, s.columns,
                                                0.25f, loss.data(), predicted.data(),
                                                dlogits.data());
    Device<float> dlogits_in(logits), dloss(s.rows), dgrad(n), dloss_fwd(s.rows);
    Device<int32_t> dlabels(labels), dpred(s.rows), dpred_fwd(s.rows);
    ASSERT_TRUE(cuda::SoftmaxCrossEntropyForwardBackward(dlogits_in.get(), dlabels.get(), s.rows,
                                                         s.columns, 0.25f, dloss.get(),
                                                         dpred.get(), dgrad.get(), nullptr)
                    .ok());
    ASSERT_TRUE(cuda::SoftmaxCrossEntropyForward(dlogits_in.get(), dlabels.get(), s.rows,
                                                 s.columns, dloss_fwd.get(), dpred_fwd.get(),
                                                 nullptr)
                    .ok());
    EXPECT_LE(RelativeError(dloss.Host(), loss), 1e-5);
    EXPECT_LE(RelativeError(dgrad.Host(), dlogits), 1e-5);
    EXPECT_EQ(dpred.Host(), predicted);
    // Forward alone gives the same losses, bit for bit, as forward with backward.
    const std::vector<float> a = dloss.Host(), b = dloss_fwd.Host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(dpred_fwd.Host(), predicted);
  }
}

// Rows row_stride apart (GptCuda's padded logits): the same bits as dense rows; the logits'
// padding is not read (it holds NaN, which would win the prediction) and dlogits' (NaN bytes
// before the call) is written with zeros.
TEST(RowsCuda, SoftmaxCrossEntropyOnStridedRows) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 37, kClasses = 301, kStride = 320;
  const std::vector<float> logits = RandomFloats(kRows * kClasses, 12, -8.0f, 8.0f);
  std::vector<int32_t> labels(kRows);
  for (int64_t i = 0; i < kRows; ++i) labels[i] = static_cast<int32_t>((i * 31) % kClasses);
  std::vector<float> padded(kRows * kStride, NAN);
  for (int64_t i = 0; i < kRows; ++i) {
    std::copy_n(logits.data() + i * kClasses, kClasses, padded.data() + i * kStride);
  }
  Device<float> dense_in(logits), dense_loss(kRows), dense_grad(kRows * kClasses);
  Device<float> strided_in(padded), strided_loss(kRows), strided_grad(kRows * kStride);
  Device<int32_t> dlabels(labels), dense_pred(kRows), strided_pred(kRows);
  ASSERT_TRUE(cuda::SoftmaxCrossEntropyForwardBackward(dense_in.get(), dlabels.get(), kRows,
                                                       kClasses, 0.5f, dense_loss.get(),
                                                       dense_pred.get(), dense_grad.get(), nullptr)
                  .ok());
  ASSERT_TRUE(cuda::SoftmaxCrossEntropyForwardBackward(
                  strided_in.get(), dlabels.get(), kRows, kClasses, 0.5f, strided_loss.get(),
                  strided_pred.get(), strided_grad.get(), nullptr, kStride)
                  .ok());
  testing::ExpectSameBits(strided_loss.Host(), dense_loss.Host(), "loss");
  EXPECT_EQ(strided_pred.Host(), dense_pred.Host());
  const std::vector<float> dense = dense_grad.Host(), strided = strided_grad.Host();
  for (int64_t i = 0; i < kRows; ++i) {
    ASSERT_EQ(std::memcmp(strided.data() + i * kStride, dense.data() + i * kClasses,
                          kClasses * sizeof(float)),
              0)
        << "row " << i;
    for (int64_t j = kClasses; j < kStride; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &strided[i * kStride + j], 4);
      ASSERT_EQ(bits, 0u) << "dlogits' padding (" << i << ", " << j << ") is not +0";
    }
  }
  const absl::Status s =
      cuda::SoftmaxCrossEntropyForward(strided_in.get(), dlabels.get(), kRows, kClasses,
                                       strided_loss.get(), strided_pred.get(), nullptr, 300);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row_stride 300 is below classes 301"), std::string::npos) << s;
}

TEST(RowsCuda, ANanWinsThePredictionAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<float> logits = {1.0f, 5.0f, NAN, 5.0f, NAN, 2.0f, 3.0f, 3.0f};
  const std::vector<int32_t> labels = {0, 0};
  std::vector<float> loss(2);
  std::vector<int32_t> predicted(2);
  kernels::SoftmaxCrossEntropyForward(logits.data(), labels.data(), 2, 4, loss.data(),
                                      predicted.data());
  Device<float> dlogits(logits), dloss(2);
  Device<int32_t> dlabels(labels), dpred(2);
  ASSERT_TRUE(cuda::SoftmaxCrossEntropyForward(dlogits.get(), dlabels.get(), 2, 4, dloss.get(),
                                               dpred.get(), nullptr)
                  .ok());
  EXPECT_EQ(dpred.Host(), predicted);  // row 0: the NaN at 2; row 1: the NaN at 0
}

TEST(RowsCuda, BadArgumentsAreNamed) {
  float f = 0;
  int32_t label = 0;
  absl::Status s = cuda::LayerNormForward(&f, &f, &f, nullptr, &f, &f, 1, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x is null"), std::string::npos) << s;
  s = cuda::LayerNormForward(&f, &f, &f, &f, &f, &f, 0, 1, nullptr);
  EXPECT_NE(s.message().find("rows must be positive"), std::string::npos) << s;
  s = cuda::LayerNormBackward(&f, &f, &f, &f, &f, &f, &f, &f, 1, 4, nullptr, nullptr);
  EXPECT_NE(s.message().find("scratch is null"), std::string::npos) << s;
  s = cuda::SoftmaxCrossEntropyForward(&f, &label, 1, 0, &f, &label, nullptr);
  EXPECT_NE(s.message().find("classes must be positive"), std::string::npos) << s;
  s = cuda::SoftmaxCrossEntropyForwardBackward(&f, &label, 1, 1, 1.0f, &f, &label, nullptr,
                                               nullptr);
  EXPECT_NE(s.message().find("dlogits is null"), std::string::npos) << s;
}

// ---- bf16 and fp16 twins: typed tests over the two formats ----

// The twins of one format.
template <typename F>
struct HalfKernels;
template <>
struct HalfKernels<Bf16Format> {
  static constexpr auto kLayerNormForward = &cuda::LayerNormForwardBf16;
  static constexpr auto kLayerNormBackward = &cuda::LayerNormBackwardBf16;
  // Forwarding functions rather than pointers, so the default row_stride stays available.
  static absl::Status kSoftmaxCrossEntropyForward(auto... args) {
    return cuda::SoftmaxCrossEntropyForwardBf16(args...);
  }
  static absl::Status kSoftmaxCrossEntropyForwardBackward(auto... args) {
    return cuda::SoftmaxCrossEntropyForwardBackwardBf16(args...);
  }
};
template <>
struct HalfKernels<F16Format> {
  static constexpr auto kLayerNormForward = &cuda::LayerNormForwardF16;
  static constexpr auto kLayerNormBackward = &cuda::LayerNormBackwardF16;
  // Forwarding functions rather than pointers, so the default row_stride stays available.
  static absl::Status kSoftmaxCrossEntropyForward(auto... args) {
    return cuda::SoftmaxCrossEntropyForwardF16(args...);
  }
  static absl::Status kSoftmaxCrossEntropyForwardBackward(auto... args) {
    return cuda::SoftmaxCrossEntropyForwardBackwardF16(args...);
  }
};

// Elements where |got - want| > F::RoundingBound(|want|) + abs (NaN never passes); the first
// is named.
template <typename F>
void ExpectWithinOneRounding(const std::vector<float>& got, const std::vector<float>& want,
                             double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= F::RoundingBound(std::fabs(double{want[i]})) + abs)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements off, first [" << first << "] gpu "
                    << (first >= 0 ? got[first] : 0) << " cpu " << (first >= 0 ? want[first] : 0);
}

constexpr Shape kHalfShapes[] = {{1, 1}, {1, 7}, {7, 771}, {1000, 7}, {1000, 771}, {3, 50257}};

template <typename F>
class RowsCudaHalf : public ::testing::Test {};
TYPED_TEST_SUITE(RowsCudaHalf, HalfFormats, HalfFormatName);

TYPED_TEST(RowsCudaHalf, LayerNormMatchesTheCpuOnRoundedInputs) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  for (const Shape& s : kHalfShapes) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " channels " << s.columns);
    const int64_t n = s.rows * s.columns;
    const std::vector<uint16_t> x = RoundToBits<F>(RandomFloats(n, 101, -3.0f, 5.0f));
    const std::vector<uint16_t> dy = RoundToBits<F>(RandomFloats(n, 102));
    const std::vector<uint16_t> dx0 = RoundToBits<F>(RandomFloats(n, 103));
    const std::vector<float> gain = RandomFloats(s.columns, 104, 0.5f, 1.5f);
    const std::vector<float> bias = RandomFloats(s.columns, 105);
    const std::vector<float> dgain0 = RandomFloats(s.columns, 106);
    const std::vector<float> dbias0 = RandomFloats(s.columns, 107);

    const std::vector<float> xf = WidenBits<F>(x), dyf = WidenBits<F>(dy);
    std::vector<float> y(n), mean(s.rows), rstd(s.rows);
    kernels::LayerNormForward(y.data(), mean.data(), rstd.data(), xf.data(), gain.data(),
                              bias.data(), s.rows, s.columns);
    std::vector<float> dx = WidenBits<F>(dx0), dgain = dgain0, dbias = dbias0;
    kernels::LayerNormBackward(dx.data(), dgain.data(), dbias.data(), dyf.data(), xf.data(),
                               gain.data(), mean.data(), rstd.data(), s.rows, s.columns);

    Device<uint16_t> dx_in(x), ddy(dy), ddx(dx0), dyo(n);
    Device<float> dgain_in(gain), dbias_in(bias), ddgain(dgain0), ddbias(dbias0), dmean(s.rows),
        drstd(s.rows), scratch(LayerNormBackwardScratchFloats(s.columns));
    ASSERT_TRUE(K::kLayerNormForward(AsElements<F>(dyo), dmean.get(), drstd.get(),
                                     AsElements<F>(dx_in), dgain_in.get(), dbias_in.get(), s.rows,
                                     s.columns, nullptr)
                    .ok());
    ExpectWithinOneRounding<F>(WidenBits<F>(dyo.Host()), y, 1e-4,
                               absl::StrCat("LayerNormForward", F::kName) + " y");
    EXPECT_LE(RelativeError(dmean.Host(), mean), 1e-5);
    EXPECT_LE(RelativeError(drstd.Host(), rstd), 1e-5);
    ASSERT_TRUE(K::kLayerNormBackward(AsElements<F>(ddx), ddgain.get(), ddbias.get(),
                                      AsElements<F>(ddy), AsElements<F>(dx_in), dgain_in.get(),
                                      dmean.get(), drstd.get(), s.rows, s.columns, scratch.get(),
                                      nullptr)
                    .ok());
    ExpectWithinOneRounding<F>(WidenBits<F>(ddx.Host()), dx, 1e-4,
                               absl::StrCat("LayerNormBackward", F::kName) + " dx");
    EXPECT_LE(RelativeError(ddgain.Host(), dgain), 1e-5);
    EXPECT_LE(RelativeError(ddbias.Host(), dbias), 1e-5);
  }
}

TYPED_TEST(RowsCudaHalf, LayerNormBackwardIsReproducible) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const int64_t rows = 1000, channels = 771, n = rows * channels;
  const std::vector<uint16_t> x = RoundToBits<F>(RandomFloats(n, 108)),
                              dy = RoundToBits<F>(RandomFloats(n, 109)), zero_n(n, F::Round(0.0f));
  const std::vector<float> gain(channels, 1.0f), zeros(channels, 0.0f);
  Device<uint16_t> dx_in(x), ddy(dy), y(n);
  Device<float> dgain_in(gain), dbias_in(zeros), mean(rows), rstd(rows),
      scratch(LayerNormBackwardScratchFloats(channels));
  ASSERT_TRUE(K::kLayerNormForward(AsElements<F>(y), mean.get(), rstd.get(), AsElements<F>(dx_in),
                                   dgain_in.get(), dbias_in.get(), rows, channels, nullptr)
                  .ok());
  std::vector<float> first_dgain;
  std::vector<uint16_t> first_dx;
  for (int run = 0; run < 2; ++run) {
    Device<uint16_t> dx(zero_n);
    Device<float> dgain(zeros), dbias(zeros);
    ASSERT_TRUE(K::kLayerNormBackward(AsElements<F>(dx), dgain.get(), dbias.get(),
                                      AsElements<F>(ddy), AsElements<F>(dx_in), dgain_in.get(),
                                      mean.get(), rstd.get(), rows, channels, scratch.get(),
                                      nullptr)
                    .ok());
    std::vector<float> got = dgain.Host();
    std::vector<uint16_t> got_dx = dx.Host();
    if (run == 0) {
      first_dgain = got;
      first_dx = got_dx;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), first_dgain.data(), channels * sizeof(float)), 0);
      EXPECT_EQ(got_dx, first_dx);
    }
  }
}

TYPED_TEST(RowsCudaHalf, SoftmaxCrossEntropyMatchesTheCpuOnRoundedLogits) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  constexpr float kScale = 0.25f;
  for (const Shape& s : kHalfShapes) {
    SCOPED_TRACE(::testing::Message() << "n " << s.rows << " classes " << s.columns);
    const int64_t n = s.rows * s.columns;
    const std::vector<uint16_t> logits = RoundToBits<F>(RandomFloats(n, 110, -8.0f, 8.0f));
    const std::vector<float> logits_f = WidenBits<F>(logits);
    std::vector<int32_t> labels(s.rows);
    for (int64_t i = 0; i < s.rows; ++i) labels[i] = static_cast<int32_t>((i * 7919) % s.columns);
    std::vector<float> loss(s.rows), dlogits(n);
    std::vector<int32_t> predicted(s.rows);
    kernels::SoftmaxCrossEntropyForwardBackward(logits_f.data(), labels.data(), s.rows, s.columns,
                                                kScale, loss.data(), predicted.data(),
                                                dlogits.data());
    Device<uint16_t> dlogits_in(logits), dgrad(n);
    Device<float> dloss(s.rows), dloss_fwd(s.rows);
    Device<int32_t> dlabels(labels), dpred(s.rows), dpred_fwd(s.rows);
    ASSERT_TRUE(K::kSoftmaxCrossEntropyForwardBackward(AsElements<F>(dlogits_in), dlabels.get(),
                                                       s.rows, s.columns, kScale, dloss.get(),
                                                       dpred.get(), AsElements<F>(dgrad), nullptr)
                    .ok());
    ASSERT_TRUE(K::kSoftmaxCrossEntropyForward(AsElements<F>(dlogits_in), dlabels.get(), s.rows,
                                               s.columns, dloss_fwd.get(), dpred_fwd.get(), nullptr)
                    .ok());
    EXPECT_LE(RelativeError(dloss.Host(), loss), 1e-5);
    ExpectWithinOneRounding<F>(
        WidenBits<F>(dgrad.Host()), dlogits, 1e-6,
        absl::StrCat("SoftmaxCrossEntropyForwardBackward", F::kName) + " dlogits");
    EXPECT_EQ(dpred.Host(), predicted);
    // Forward alone gives the same losses, bit for bit, as forward with backward.
    const std::vector<float> a = dloss.Host(), b = dloss_fwd.Host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(dpred_fwd.Host(), predicted);
  }
}

// The twins on rows row_stride apart, as the fp32 kernel: the dense rows' bits, the logits'
// padding (NaN) not read, dlogits' padding (NaN bytes before the call) written with +0.
TYPED_TEST(RowsCudaHalf, SoftmaxCrossEntropyOnStridedRows) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 37, kClasses = 301, kStride = 320;
  const std::vector<uint16_t> logits =
      RoundToBits<F>(RandomFloats(kRows * kClasses, 13, -8.0f, 8.0f));
  std::vector<int32_t> labels(kRows);
  for (int64_t i = 0; i < kRows; ++i) labels[i] = static_cast<int32_t>((i * 31) % kClasses);
  std::vector<uint16_t> padded(kRows * kStride, 0xffff);  // NaN in both formats
  for (int64_t i = 0; i < kRows; ++i) {
    std::copy_n(logits.data() + i * kClasses, kClasses, padded.data() + i * kStride);
  }
  Device<uint16_t> dense_in(logits), dense_grad(kRows * kClasses);
  Device<uint16_t> strided_in(padded), strided_grad(kRows * kStride);
  Device<float> dense_loss(kRows), strided_loss(kRows);
  Device<int32_t> dlabels(labels), dense_pred(kRows), strided_pred(kRows);
  ASSERT_TRUE(K::kSoftmaxCrossEntropyForwardBackward(
                  AsElements<F>(dense_in), dlabels.get(), kRows, kClasses, 0.5f, dense_loss.get(),
                  dense_pred.get(), AsElements<F>(dense_grad), nullptr)
                  .ok());
  ASSERT_TRUE(K::kSoftmaxCrossEntropyForwardBackward(AsElements<F>(strided_in), dlabels.get(),
                                                     kRows, kClasses, 0.5f, strided_loss.get(),
                                                     strided_pred.get(),
                                                     AsElements<F>(strided_grad), nullptr, kStride)
                  .ok());
  testing::ExpectSameBits(strided_loss.Host(), dense_loss.Host(), "loss");
  EXPECT_EQ(strided_pred.Host(), dense_pred.Host());
  const std::vector<uint16_t> dense = dense_grad.Host(), strided = strided_grad.Host();
  for (int64_t i = 0; i < kRows; ++i) {
    ASSERT_TRUE(std::equal(dense.begin() + i * kClasses, dense.begin() + (i + 1) * kClasses,
                           strided.begin() + i * kStride))
        << "row " << i;
    for (int64_t j = kClasses; j < kStride; ++j) {
      ASSERT_EQ(strided[i * kStride + j], 0u) << "dlogits' padding (" << i << ", " << j << ")";
    }
  }
}

TYPED_TEST(RowsCudaHalf, ANanWinsThePredictionAsOnTheCpu) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::vector<uint16_t> logits =
      RoundToBits<F>({1.0f, 5.0f, NAN, 5.0f, NAN, 2.0f, 3.0f, 3.0f});
  const std::vector<float> logits_f = WidenBits<F>(logits);
  const std::vector<int32_t> labels = {0, 0};
  std::vector<float> loss(2);
  std::vector<int32_t> predicted(2);
  kernels::SoftmaxCrossEntropyForward(logits_f.data(), labels.data(), 2, 4, loss.data(),
                                      predicted.data());
  Device<uint16_t> dlogits(logits);
  Device<float> dloss(2);
  Device<int32_t> dlabels(labels), dpred(2);
  ASSERT_TRUE(K::kSoftmaxCrossEntropyForward(AsElements<F>(dlogits), dlabels.get(), 2, 4,
                                             dloss.get(), dpred.get(), nullptr)
                  .ok());
  EXPECT_EQ(dpred.Host(), predicted);  // row 0: the NaN at 2; row 1: the NaN at 0
  EXPECT_EQ(predicted, (std::vector<int32_t>{2, 0}));
}

// The twins' checks run before anything touches the device: host addresses serve.
TYPED_TEST(RowsCudaHalf, BadArgumentsAreNamed) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  using E = typename F::Element;
  float f = 0;
  int32_t label = 0;
  uint16_t h = 0, h2 = 0;
  E* b = reinterpret_cast<E*>(&h);
  E* b2 = reinterpret_cast<E*>(&h2);
  const std::string forward = absl::StrCat("LayerNormForward", F::kName);
  absl::Status s = K::kLayerNormForward(b, &f, &f, nullptr, &f, &f, 1, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(forward + " (CUDA): x is null"), std::string::npos) << s;
  s = K::kLayerNormForward(b, &f, &f, b2, nullptr, &f, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + " (CUDA): gain is null"), std::string::npos) << s;
  s = K::kLayerNormForward(b, &f, &f, b2, &f, &f, -3, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(forward + " (CUDA): rows must be positive, got -3"), std::string::npos)
      << s;
  s = K::kLayerNormForward(b, &f, &f, b2, &f, &f, 1, 0, nullptr);
  EXPECT_NE(s.message().find("channels must be positive"), std::string::npos) << s;
  s = K::kLayerNormForward(b, &f, &f, b, &f, &f, 1, 1, nullptr);
  EXPECT_NE(s.message().find("y must not overlap x"), std::string::npos) << s;
  const std::string backward = absl::StrCat("LayerNormBackward", F::kName);
  s = K::kLayerNormBackward(b, &f, &f, b, b, &f, &f, &f, 1, 4, nullptr, nullptr);
  EXPECT_NE(s.message().find(backward + " (CUDA): scratch is null"), std::string::npos) << s;
  s = K::kLayerNormBackward(nullptr, &f, &f, b, b, &f, &f, &f, 1, 4, &f, nullptr);
  EXPECT_NE(s.message().find(backward + " (CUDA): dx is null"), std::string::npos) << s;
  s = K::kLayerNormBackward(b, &f, &f, b, b, &f, &f, &f, -1, 4, &f, nullptr);
  EXPECT_NE(s.message().find("rows must be positive"), std::string::npos) << s;
  const std::string xent = absl::StrCat("SoftmaxCrossEntropyForward", F::kName);
  s = K::kSoftmaxCrossEntropyForward(b, &label, 1, -2, &f, &label, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(xent + " (CUDA): classes must be positive"), std::string::npos) << s;
  s = K::kSoftmaxCrossEntropyForward(nullptr, &label, 1, 1, &f, &label, nullptr);
  EXPECT_NE(s.message().find("logits is null"), std::string::npos) << s;
  const std::string xent_backward = absl::StrCat("SoftmaxCrossEntropyForwardBackward", F::kName);
  s = K::kSoftmaxCrossEntropyForwardBackward(b, &label, 1, 1, 1.0f, &f, &label, nullptr, nullptr);
  EXPECT_NE(s.message().find(xent_backward + " (CUDA): dlogits is null"), std::string::npos) << s;
  s = K::kSoftmaxCrossEntropyForwardBackward(b, nullptr, 1, 1, 1.0f, &f, &label, b2, nullptr);
  EXPECT_NE(s.message().find(xent_backward + " (CUDA): labels is null"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
