#include "kernels/matmul.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels {
namespace {

// Products of numbers in [-1, 1] summed over k terms in fp32: the error stays far below
// 1e-5 * k (about sqrt(k) * 2^-24 for random signs).
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, int64_t k) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * k) << i;
}

// Odd sizes, so no kernel path relies on a multiple of a vector width.
constexpr int64_t kN = 7, kIn = 13, kOut = 5;

TEST(MatMul, AllTransposesMatchNaiveProduct) {
  const int64_t m = 6, n = 9, k = 11;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      const std::vector<float> a = RandomFloats(m * k, 1), b = RandomFloats(k * n, 2),
                               c0 = RandomFloats(m * n, 3);
      std::vector<double> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double av = ta == Transpose::kYes ? a[p * m + i] : a[i * k + p];
            const double bv = tb == Transpose::kYes ? b[j * k + p] : b[p * n + j];
            sum += av * bv;
          }
          want[i * n + j] = sum;
        }
      }
      std::vector<float> c = c0;
      MatMul(ta, tb, m, n, k, a.data(), b.data(), c.data(), OutputMode::kOverwrite);
      ExpectNear(c, want, k);
      c = c0;
      MatMul(ta, tb, m, n, k, a.data(), b.data(), c.data(), OutputMode::kAccumulate);
      for (int64_t i = 0; i < m * n; ++i) want[i] += c0[i];
      ExpectNear(c, want, k);
    }
  }
}

TEST(Linear, ForwardIsXTimesWeightTransposedPlusBias) {
  const std::vector<float> x = RandomFloats(kN * kIn, 4), w = RandomFloats(kOut * kIn, 5),
                           b = RandomFloats(kOut, 6);
  std::vector<double> want(kN * kOut), want_no_bias(kN * kOut);
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < kIn; ++i) sum += double{x[r * kIn + i]} * w[o * kIn + i];
      want_no_bias[r * kOut + o] = sum;
      want[r * kOut + o] = sum + b[o];
    }
  }
  std::vector<float> y(kN * kOut, 123.0f);
  LinearForward(x.data(), w.data(), b.data(), y.data(), kN, kIn, kOut);
  ExpectNear(y, want, kIn);
  y.assign(kN * kOut, 123.0f);  // overwritten, not added to
  LinearForward(x.data(), w.data(), nullptr, y.data(), kN, kIn, kOut);
  ExpectNear(y, want_no_bias, kIn);
}

TEST(Linear, BackwardInputIsDyTimesWeight) {
  const std::vector<float> dy = RandomFloats(kN * kOut, 7), w = RandomFloats(kOut * kIn, 8);
  std::vector<double> want(kN * kIn);
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t i = 0; i < kIn; ++i) {
      double sum = 0;
      for (int64_t o = 0; o < kOut; ++o) sum += double{dy[r * kOut + o]} * w[o * kIn + i];
      want[r * kIn + i] = sum;
    }
  }
  std::vector<float> dx(kN * kIn, 123.0f);
  LinearBackwardInput(dy.data(), w.data(), dx.data(), kN, kIn, kOut);
  ExpectNear(dx, want, kOut);
}

TEST(Linear, BackwardWeightsOverwritesOrAccumulates) {
  const std::vector<float> x = RandomFloats(kN * kIn, 9), dy = RandomFloats(kN * kOut, 10);
  const std::vector<float> dw0 = RandomFloats(kOut * kIn, 11), db0 = RandomFloats(kOut, 12);
  std::vector<double> want_dw(kOut * kIn), want_db(kOut);
  for (int64_t o = 0; o < kOut; ++o) {
    for (int64_t r = 0; r < kN; ++r) want_db[o] += dy[r * kOut + o];
    for (int64_t i = 0; i < kIn; ++i) {
      for (int64_t r = 0; r < kN; ++r)
        want_dw[o * kIn + i] += double{dy[r * kOut + o]} * x[r * kIn + i];
    }
  }
  std::vector<float> dw = dw0, db = db0;
  LinearBackwardWeights(x.data(), dy.data(), dw.data(), db.data(), kN, kIn, kOut,
                        OutputMode::kOverwrite);
  ExpectNear(dw, want_dw, kN);
  ExpectNear(db, want_db, kN);

  dw = dw0;
  db = db0;
  LinearBackwardWeights(x.data(), dy.data(), dw.data(), db.data(), kN, kIn, kOut,
                        OutputMode::kAccumulate);
  for (int64_t i = 0; i < kOut * kIn; ++i) want_dw[i] += dw0[i];
  for (int64_t o = 0; o < kOut; ++o) want_db[o] += db0[o];
  ExpectNear(dw, want_dw, kN);
  ExpectNear(db, want_db, kN);
}

TEST(Blas, ThreadCountIsSettable) {
  SetBlasThreads(1);
  EXPECT_EQ(BlasThreads(), 1);
}

}  // namespace
}  // namespace ringmaster::kernels
