#include "kernels/optimizer.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/optimizer_isa.h"

namespace ringmaster::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Random(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * (1e-3 + std::abs(want[i]))) << "element " << i;
  }
}

// Lengths that exercise the vector body and every tail length.
const size_t kLengths[] = {1, 7, 8, 9, 31, 1001};

TEST(ScaleAndFindNonFinite, ScalesEveryElement) {
  for (size_t n : kLengths) {
    std::vector<float> x = Random(n, 1);
    const std::vector<float> before = x;
    EXPECT_FALSE(ScaleAndFindNonFinite(absl::MakeSpan(x), 0.25f)) << n;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(x[i], before[i] * 0.25f);
  }
}

TEST(ScaleAndFindNonFinite, FindsOneInfOrNanAnywhere) {
  for (size_t n : kLengths) {
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      for (float bad : {kInf, -kInf, kNan}) {
        std::vector<float> x = Random(n, 2);
        x[pos] = bad;
        EXPECT_TRUE(ScaleAndFindNonFinite(absl::MakeSpan(x), 1.0f / 65536))
            << "n " << n << " position " << pos << " value " << bad;
      }
    }
  }
}

TEST(ScaleAndFindNonFinite, FindsOverflowCausedByTheScale) {
  std::vector<float> x(9, 1.0f);
  x[8] = 3e38f;
  EXPECT_TRUE(ScaleAndFindNonFinite(absl::MakeSpan(x), 2.0f));
  EXPECT_EQ(x[8], kInf);
}

TEST(ScaleAndFindNonFinite, EmptySpanIsFinite) {
  EXPECT_FALSE(ScaleAndFindNonFinite(absl::Span<float>(), 2.0f));
}

TEST(SumOfSquares, MatchesDoubleSum) {
  for (size_t n : kLengths) {
    const std::vector<float> x = Random(n, 3, 10.0f);
    double want = 0;
    for (float v : x) want += double{v} * v;
    EXPECT_NEAR(SumOfSquares(x), want, 1e-12 * want) << n;
  }
  EXPECT_EQ(SumOfSquares({}), 0.0);
  EXPECT_TRUE(std::isinf(SumOfSquares(std::vector<float>{1.0f, kInf})));
}

// PyTorch SGD (dampening 0) in double, three steps with new gradients each.
void CheckSgd(const SgdStepArgs& args) {
  const size_t n = 37;
  std::vector<float> p = Random(n, 4);
  std::vector<float> buf(args.momentum != 0 ? n : 0);
  std::vector<double> rp = ToDouble(p), rbuf(n, 0.0);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Random(n, 10 + step);
    SgdStep(args, absl::MakeSpan(p), g, absl::MakeSpan(buf));
    for (size_t i = 0; i < n; ++i) {
      const double d = g[i] + double{args.weight_decay} * rp[i];
      rbuf[i] = step == 0 ? d : args.momentum * rbuf[i] + d;
      const double update = args.nesterov ? d + args.momentum * rbuf[i] : rbuf[i];
      rp[i] -= args.lr * (args.momentum != 0 ? update : d);
    }
  }
  ExpectNear(p, rp, 1e-5);
  if (!buf.empty()) ExpectNear(buf, rbuf, 1e-5);
}

TEST(SgdStep, MomentumMatchesReference) {
  CheckSgd({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
}
TEST(SgdStep, NesterovMatchesReference) {
  CheckSgd({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true});
}
TEST(SgdStep, NoMomentumKeepsNoBuffer) { CheckSgd({.lr = 0.5f, .weight_decay = 0.1f}); }

// Adam moments in double.
struct RefMoments {
  std::vector<double> m, v;
  // Advances the moments by `g` and returns m_hat / (sqrt(v_hat) + eps) per element.
  std::vector<double> Direction(const AdamMomentArgs& a, const std::vector<float>& g) {
    std::vector<double> d(g.size());
    const double c1 = 1 - std::pow(double{a.beta1}, a.step);
    const double c2 = 1 - std::pow(double{a.beta2}, a.step);
    for (size_t i = 0; i < g.size(); ++i) {
      m[i] = a.beta1 * m[i] + (1 - double{a.beta1}) * g[i];
      v[i] = a.beta2 * v[i] + (1 - double{a.beta2}) * g[i] * g[i];
      d[i] = (m[i] / c1) / (std::sqrt(v[i] / c2) + a.eps);
    }
    return d;
  }
};

TEST(AdamWStep, MatchesPyTorchFormula) {
  const size_t n = 41;
  const float lr = 0.01f, wd = 0.1f;
  std::vector<float> p = Random(n, 5), m(n), v(n);
  std::vector<double> rp = ToDouble(p);
  RefMoments ref{std::vector<double>(n), std::vector<double>(n)};
  for (int64_t t = 1; t <= 4; ++t) {
    const AdamMomentArgs a{.beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .step = t};
    const std::vector<float> g = Random(n, 20 + t);
    AdamWStep(a, lr, wd, absl::MakeSpan(p), g, absl::MakeSpan(m), absl::MakeSpan(v));
    const std::vector<double> d = ref.Direction(a, g);
    for (size_t i = 0; i < n; ++i) rp[i] = rp[i] * (1 - double{lr} * wd) - lr * d[i];
  }
  ExpectNear(p, rp, 1e-5);
  ExpectNear(m, ref.m, 1e-5);
  ExpectNear(v, ref.v, 1e-5);
}

TEST(Lamb, SquaresThenStepMatchReference) {
  const size_t n = 29;
  const float wd = 0.05f, scaled_lr = 0.003f;
  std::vector<float> p = Random(n, 6), m = Random(n, 7, 0.1f), v = Random(n, 8, 0.1f);
  for (float& x : v) x = x * x;  // second moments are squares
  const std::vector<float> g = Random(n, 9);
  const AdamMomentArgs a{.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .step = 3};

  RefMoments ref{ToDouble(m), ToDouble(v)};
  const std::vector<double> d = ref.Direction(a, g);
  std::vector<double> r(n), rp = ToDouble(p);
  double want_p = 0, want_r = 0;
  for (size_t i = 0; i < n; ++i) {
    r[i] = d[i] + wd * rp[i];
    want_p += rp[i] * rp[i];
    want_r += r[i] * r[i];
    rp[i] -= scaled_lr * r[i];
  }

  const LambSquareSums sums = LambSquares(a, wd, p, g, m, v);
  EXPECT_NEAR(sums.params, want_p, 1e-6 * want_p);
  EXPECT_NEAR(sums.update, want_r, 1e-5 * want_r);
  LambStep(a, wd, scaled_lr, absl::MakeSpan(p), g, absl::MakeSpan(m), absl::MakeSpan(v));
  ExpectNear(p, rp, 1e-5);
  ExpectNear(m, ref.m, 1e-5);
  ExpectNear(v, ref.v, 1e-5);
}

// Ranks compare fingerprints of their parameters, so the builds must agree to the bit.
struct State {
  std::vector<float> p, m, v;
  bool operator==(const State& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    return same(p, o.p) && same(m, o.m) && same(v, o.v);
  }
};

TEST(Implementations, GenericAndAvx2GiveTheSameBits) {
  if (std::string(OptimizerImplementation()) != "avx2") {
    GTEST_SKIP() << "this processor runs only the generic build";
  }
  const AdamMomentArgs moments{.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 7};
  const SgdStepArgs sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
  for (size_t n : {size_t{1}, size_t{7}, size_t{13}, size_t{1001}, size_t{100003}}) {
    const std::vector<float> g = Random(n, 30);
    State start{Random(n, 31), Random(n, 32, 0.1f), Random(n, 33, 0.1f)};
    for (float& x : start.v) x *= x;
    State a = start, b = start;
    generic::SgdStep(sgd, a.p.data(), g.data(), a.m.data(), n);
    avx2::SgdStep(sgd, b.p.data(), g.data(), b.m.data(), n);
    EXPECT_TRUE(a == b) << "SgdStep, n " << n;
    a = b = start;
    generic::AdamWStep(moments, 0.01f, 0.1f, a.p.data(), g.data(), a.m.data(), a.v.data(), n);
    avx2::AdamWStep(moments, 0.01f, 0.1f, b.p.data(), g.data(), b.m.data(), b.v.data(), n);
    EXPECT_TRUE(a == b) << "AdamWStep, n " << n;
    const LambSquareSums sa = generic::LambSquares(moments, 0.1f, start.p.data(), g.data(),
                                                   start.m.data(), start.v.data(), n);
    const LambSquareSums sb = avx2::LambSquares(moments, 0.1f, start.p.data(), g.data(),
                                                start.m.data(), start.v.data(), n);
    EXPECT_TRUE(sa.params == sb.params && sa.update == sb.update) << "LambSquares, n " << n;
    a = b = start;
    generic::LambStep(moments, 0.1f, 0.003f, a.p.data(), g.data(), a.m.data(), a.v.data(), n);
    avx2::LambStep(moments, 0.1f, 0.003f, b.p.data(), g.data(), b.m.data(), b.v.data(), n);
    EXPECT_TRUE(a == b) << "LambStep, n " << n;
    EXPECT_EQ(generic::SumOfSquares(g.data(), n), avx2::SumOfSquares(g.data(), n)) << n;
  }
}

TEST(OptimizerImplementation, NamesOne) {
  const std::string impl = OptimizerImplementation();
  EXPECT_TRUE(impl == "avx2" || impl == "generic") << impl;
}

}  // namespace
}  // namespace ringmaster::kernels
