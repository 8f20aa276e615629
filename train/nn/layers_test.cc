#include "train/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"
#include "state/tensor.h"
#include "train/nn/finite_difference.h"
#include "train/nn/random.h"
#include "train/nn/replica_sum_testing.h"

namespace ringmaster::train::nn {
namespace {

using kernels::RandomFloats;

// Central finite differences on float computations, evaluated in double.
//
// Step h = 1e-2 on inputs and parameters of magnitude about 1. The layers tested here are
// linear in each coordinate between kinks (Linear, Conv2d: exactly; ReLU and max-pool:
// inputs are kept more than h away from 0 and from each other, and the test asserts that no
// step crosses a kink), so the difference quotient has no truncation error; what is left is
// fp32 rounding of the forward, about 1e-6 / (2h) = 5e-5 on the objectives here. Softmax
// cross-entropy is smooth: its truncation error is about h²/6 · |f'''| < 2e-5. Tolerance:
// 1e-3 · (1 + |gradient|), 20 times the error budget, while every wrong index, transpose or
// factor we could make is off by 0.05 or more.
constexpr float kStep = 1e-2f;
constexpr double kTolerance = 1e-3;

// One-sided slopes of a smooth f differ by about h·|f''|: up to 0.1 for the softmax here.
constexpr double kSmoothness = 0.1;

template <typename F>
double Derivative(float& v, F f) {
  const Slope slope = MeasureSlope(v, kStep, kSmoothness, f);
  EXPECT_TRUE(slope.smooth) << "a step crosses a kink";
  return slope.central;
}

void ExpectGradient(double analytic, double numeric, const char* what, size_t i) {
  EXPECT_TRUE(GradientClose(analytic, numeric, kTolerance))
      << what << "[" << i << "]: " << analytic << " vs finite difference " << numeric;
}

// Checks BackwardParams and BackwardInput of `layer` for n samples of input x against
// finite differences of the objective f = Σ r · layer(x), whose output gradient is r.
void CheckLayer(Layer& layer, const state::TensorTable& table, std::vector<float> x, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(x.size()), n * layer.input_size());
  state::FlatBuffer params(table.total_elements());
  SplitMix64 rng(5);
  FillUniform(rng, 1.0f, params.span());
  const std::vector<float> r = RandomFloats(n * layer.output_size(), 6);
  std::vector<float> y(r.size());
  auto objective = [&] {
    layer.Forward(params.data(), x.data(), y.data(), n);
    double f = 0;
    for (size_t i = 0; i < y.size(); ++i) f += double{r[i]} * y[i];
    return f;
  };

  objective();  // leaves the forward state (y, pool argmax) for the backward
  state::FlatBuffer grads(table.total_elements());
  std::vector<float*> targets;
  for (const Parameter& p : layer.parameters()) targets.push_back(grads.data() + p.offset);
  layer.BackwardParams(x.data(), r.data(), n, targets, kernels::OutputMode::kOverwrite);
  std::vector<float> dx(x.size(), 99.0f);
  layer.BackwardInput(params.data(), x.data(), y.data(), r.data(), dx.data(), n);

  for (size_t i = 0; i < x.size(); ++i) {
    ExpectGradient(dx[i], Derivative(x[i], objective), "input", i);
  }
  for (const Parameter& p : layer.parameters()) {
    for (int64_t i = 0; i < p.numel; ++i) {
      const double numeric = Derivative(params.data()[p.offset + i], objective);
      ExpectGradient(grads.data()[p.offset + i], numeric, table.tensor(p.table_index).name.c_str(),
                     i);
    }
  }
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  Linear layer(table, "fc", 7, 5);
  ASSERT_EQ(table.size(), 2);
  EXPECT_EQ(table.tensor(0).name, "fc.weight");
  EXPECT_EQ(table.tensor(0).shape, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(table.tensor(1).name, "fc.bias");
  EXPECT_FLOAT_EQ(layer.parameters()[0].init_bound, 1 / std::sqrt(7.0f));
  CheckLayer(layer, table, RandomFloats(3 * 7, 1), 3);
}

TEST(Conv2d, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  Conv2d layer(table, "conv", 2, 3, 5, 4, 3);
  EXPECT_EQ(table.tensor(0).shape, (std::vector<int64_t>{3, 2, 3, 3}));
  EXPECT_EQ(layer.output_size(), 3 * 5 * 4);
  EXPECT_FLOAT_EQ(layer.parameters()[0].init_bound, 1 / std::sqrt(18.0f));
  CheckLayer(layer, table, RandomFloats(2 * 2 * 5 * 4, 2), 2);
}

TEST(Relu, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  Relu layer(11);
  std::vector<float> x = RandomFloats(3 * 11, 3);
  for (float& v : x) v = std::copysign(0.1f + std::abs(v), v);  // at least 10 steps from 0
  CheckLayer(layer, table, x, 3);
}

TEST(MaxPool2d, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  MaxPool2d layer(2, 5, 4);  // odd height: the last row is dropped
  EXPECT_EQ(layer.output_size(), 2 * 2 * 2);
  // Distinct values 0.05 apart (more than 2h), shuffled: no window changes its maximum.
  std::vector<float> x(2 * 2 * 5 * 4);
  std::iota(x.begin(), x.end(), 0.0f);
  std::shuffle(x.begin(), x.end(), std::mt19937(4));
  for (float& v : x) v = 0.05f * v - 2.0f;
  CheckLayer(layer, table, x, 2);
}

TEST(StridedConv2d, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  StridedConv2d layer(table, "conv", 2, 3, 5, 6, 3, 2, 1);
  ASSERT_EQ(table.size(), 1);  // no bias
  EXPECT_EQ(table.tensor(0).name, "conv.weight");
  EXPECT_EQ(table.tensor(0).shape, (std::vector<int64_t>{3, 2, 3, 3}));
  EXPECT_EQ(layer.output_size(), 3 * 3 * 3);
  EXPECT_EQ(layer.Describe(), "conv 2->3 3x3/2 on 5x6");
  CheckLayer(layer, table, RandomFloats(2 * 2 * 5 * 6, 8), 2);
}

TEST(StridedConv2d, ProjectionGradientsMatchFiniteDifferences) {
  state::TensorTable table;
  StridedConv2d layer(table, "shortcut", 3, 4, 4, 4, 1, 2, 0);
  EXPECT_EQ(layer.output_size(), 4 * 2 * 2);
  CheckLayer(layer, table, RandomFloats(3 * 3 * 4 * 4, 9), 3);
}

// A convolution Winograd runs (16 channels, 8x8): the one-pass Backward gives exactly what
// BackwardParams and BackwardInput give, and so does a layer running in a scratch it shares,
// whose bytes it leaves to the scratch's owner.
TEST(StridedConv2d, OnePassBackwardAndSharedScratchGiveTheSameGradients) {
  state::TensorTable table;
  StridedConv2d own(table, "own", 16, 16, 8, 8, 3, 1, 1);
  StridedConv2d shared(table, "shared", 16, 16, 8, 8, 3, 1, 1);
  GrowBuffer<float> scratch;
  shared.ShareScratch(&scratch);
  state::FlatBuffer params(table.total_elements());
  SplitMix64 rng(7);
  FillUniform(rng, 1.0f, params.span());
  const Parameter& w_own = own.parameters()[0];
  const Parameter& w_shared = shared.parameters()[0];
  std::copy_n(params.data() + w_own.offset, w_own.numel, params.data() + w_shared.offset);
  constexpr int64_t kN = 3;
  const std::vector<float> x = RandomFloats(kN * own.input_size(), 8);
  const std::vector<float> dy = RandomFloats(kN * own.output_size(), 9);
  std::vector<float> y_own(dy.size()), y_shared(dy.size(), 99.0f);
  std::vector<float> dx_own(x.size()), dx_shared(x.size(), 99.0f);
  state::FlatBuffer grads(table.total_elements());
  float* const g_own[] = {grads.data() + w_own.offset};
  float* const g_shared[] = {grads.data() + w_shared.offset};

  own.Forward(params.data(), x.data(), y_own.data(), kN);
  own.BackwardParams(x.data(), dy.data(), kN, g_own, kernels::OutputMode::kOverwrite);
  own.BackwardInput(params.data(), x.data(), y_own.data(), dy.data(), dx_own.data(), kN);
  shared.Forward(params.data(), x.data(), y_shared.data(), kN);
  shared.Backward(params.data(), x.data(), dy.data(), kN, g_shared,
                  kernels::OutputMode::kOverwrite, dx_shared.data());

  EXPECT_EQ(y_shared, y_own);
  EXPECT_EQ(dx_shared, dx_own);
  for (int64_t i = 0; i < w_own.numel; ++i) ASSERT_EQ(g_shared[0][i], g_own[0][i]) << i;
  EXPECT_GT(scratch.bytes(), 0);
  EXPECT_EQ(shared.scratch_bytes() + scratch.bytes(), own.scratch_bytes());
}

TEST(GlobalAvgPool, GradientsMatchFiniteDifferences) {
  state::TensorTable table;
  GlobalAvgPool layer(3, 4);
  EXPECT_EQ(layer.output_size(), 3);
  CheckLayer(layer, table, RandomFloats(2 * 3 * 4, 10), 2);
}

class BatchNorm2dTest : public testing::Test {
 protected:
  static constexpr int64_t kN = 3, kC = 2, kPositions = 5;
  BatchNorm2dTest() : bn(table, "bn", kC, kPositions) {
    bn.AddRunningStatistics(table);
    params = state::FlatBuffer(table.total_elements());
    SplitMix64 rng(11);
    FillUniform(rng, 1.0f, params.span());
    for (int64_t c = 0; c < kC; ++c) params.data()[bn.running_var_offset() + c] += 1.5f;
  }
  state::TensorTable table;
  BatchNorm2d bn;
  state::FlatBuffer params;
  std::vector<float> x = RandomFloats(kN * kC * kPositions, 12, -1.0f, 2.0f);
};

TEST_F(BatchNorm2dTest, TrainingGradientsMatchFiniteDifferences) {
  EXPECT_EQ(table.tensor(0).name, "bn.weight");
  EXPECT_EQ(table.tensor(3).name, "bn.running_var");
  const std::vector<float> r = RandomFloats(x.size(), 13);
  std::vector<float> y(x.size()), rm(kC), rv(kC);
  auto objective = [&] {
    EXPECT_TRUE(
        bn.ForwardTrain(params.data(), x.data(), y.data(), kN, nullptr, rm.data(), rv.data()).ok());
    double f = 0;
    for (size_t i = 0; i < y.size(); ++i) f += double{r[i]} * y[i];
    return f;
  };
  objective();
  std::vector<float> dx(x.size(), 99.0f), dw(kC, 99.0f), db(kC, 99.0f);
  ASSERT_TRUE(bn.Backward(params.data(), x.data(), r.data(), dx.data(), kN, nullptr, dw.data(),
                          db.data(), kernels::OutputMode::kOverwrite)
                  .ok());
  for (size_t i = 0; i < x.size(); ++i) ExpectGradient(dx[i], Derivative(x[i], objective), "x", i);
  for (int64_t c = 0; c < kC; ++c) {
    ExpectGradient(dw[c], Derivative(params.data()[bn.weight_offset() + c], objective), "w", c);
    ExpectGradient(db[c], Derivative(params.data()[bn.bias_offset() + c], objective), "b", c);
  }
}

TEST_F(BatchNorm2dTest, RunningStatisticsFollowPyTorch) {
  std::vector<float> y(x.size());
  std::vector<float> rm = {0.5f, -1.0f}, rv = {2.0f, 0.25f};
  ASSERT_TRUE(
      bn.ForwardTrain(params.data(), x.data(), y.data(), kN, nullptr, rm.data(), rv.data()).ok());
  const double count = kN * kPositions;
  for (int64_t c = 0; c < kC; ++c) {
    double mean = 0, sq = 0;
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t i = 0; i < kPositions; ++i) mean += x[(n * kC + c) * kPositions + i];
    }
    mean /= count;
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t i = 0; i < kPositions; ++i) {
        const double d = x[(n * kC + c) * kPositions + i] - mean;
        sq += d * d;
      }
    }
    const double before_mean = c == 0 ? 0.5 : -1.0, before_var = c == 0 ? 2.0 : 0.25;
    EXPECT_NEAR(rm[c], 0.9 * before_mean + 0.1 * mean, 1e-6);
    EXPECT_NEAR(rv[c], 0.9 * before_var + 0.1 * sq / (count - 1), 1e-6);  // unbiased
    // Training normalises by the biased variance.
    const float gamma = params.data()[bn.weight_offset() + c];
    const float beta = params.data()[bn.bias_offset() + c];
    const int64_t k = c * kPositions;
    EXPECT_NEAR(y[k], gamma * (x[k] - mean) / std::sqrt(sq / count + 1e-5) + beta, 1e-5);
  }
  // Evaluation normalises by the running statistics in the parameters.
  bn.ForwardEval(params.data(), x.data(), y.data(), kN);
  for (int64_t c = 0; c < kC; ++c) {
    const float* p = params.data();
    const int64_t k = (kC + c) * kPositions + 1;  // sample 1
    EXPECT_NEAR(y[k],
                p[bn.weight_offset() + c] * (x[k] - p[bn.running_mean_offset() + c]) /
                        std::sqrt(p[bn.running_var_offset() + c] + 1e-5) +
                    p[bn.bias_offset() + c],
                1e-5);
  }
}

TEST_F(BatchNorm2dTest, OneValuePerChannelIsAnError) {
  BatchNorm2d one(table, "single", 2, 1);
  std::vector<float> y(2), rm(2), rv(2);
  const absl::Status s =
      one.ForwardTrain(params.data(), x.data(), y.data(), 1, nullptr, rm.data(), rv.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("single"), std::string::npos) << s;
}

// Two replicas with synchronized statistics, each with part of the batch, give what one
// replica with the whole batch gives: outputs, running statistics, input gradients, and
// parameter gradients that sum to the whole batch's.
TEST_F(BatchNorm2dTest, SynchronizedReplicasMatchOneBatch) {
  const std::vector<float> r = RandomFloats(x.size(), 14);
  const int64_t sample = kC * kPositions;
  std::vector<float> y(x.size()), dx(x.size()), dw(kC), db(kC), rm(kC, 0.0f), rv(kC, 1.0f);
  ASSERT_TRUE(
      bn.ForwardTrain(params.data(), x.data(), y.data(), kN, nullptr, rm.data(), rv.data()).ok());
  ASSERT_TRUE(bn.Backward(params.data(), x.data(), r.data(), dx.data(), kN, nullptr, dw.data(),
                          db.data(), kernels::OutputMode::kOverwrite)
                  .ok());

  ThreadReplicaSum sum(2);
  const int64_t split[3] = {0, 1, kN};  // samples [0, 1) and [1, 3)
  std::vector<float> ys(x.size()), dxs(x.size()), dws(2 * kC), dbs(2 * kC), rms(2 * kC, 0.0f),
      rvs(2 * kC, 1.0f);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      state::TensorTable own;
      BatchNorm2d replica(own, "bn", kC, kPositions);
      ReplicaSum s = [&sum, k](absl::Span<double> v) { return sum.Sum(k, v); };
      const int64_t at = split[k] * sample, n = split[k + 1] - split[k];
      EXPECT_TRUE(replica
                      .ForwardTrain(params.data(), x.data() + at, ys.data() + at, n, s,
                                    rms.data() + k * kC, rvs.data() + k * kC)
                      .ok());
      EXPECT_TRUE(replica
                      .Backward(params.data(), x.data() + at, r.data() + at, dxs.data() + at, n, s,
                                dws.data() + k * kC, dbs.data() + k * kC,
                                kernels::OutputMode::kOverwrite)
                      .ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(ys[i], y[i], 1e-5) << i;
    EXPECT_NEAR(dxs[i], dx[i], 1e-5) << i;
  }
  for (int64_t c = 0; c < kC; ++c) {
    for (int k = 0; k < 2; ++k) {
      EXPECT_NEAR(rms[k * kC + c], rm[c], 1e-6);
      EXPECT_NEAR(rvs[k * kC + c], rv[c], 1e-6);
    }
    EXPECT_NEAR(dws[c] + dws[kC + c], dw[c], 1e-5);
    EXPECT_NEAR(dbs[c] + dbs[kC + c], db[c], 1e-5);
  }
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t n = 4, classes = 5;
  const float scale = 0.5f;
  std::vector<float> logits = RandomFloats(n * classes, 7, -3.0f, 3.0f);
  const std::vector<int32_t> labels = {4, 0, 2, 2};
  SoftmaxCrossEntropy loss(classes);
  std::vector<float> dlogits(logits.size());
  const StepStats stats =
      loss.ForwardBackward(logits.data(), labels.data(), n, scale, dlogits.data());
  EXPECT_EQ(stats.loss_terms, n);
  auto objective = [&] { return scale * loss.Forward(logits.data(), labels.data(), n).loss_sum; };
  EXPECT_DOUBLE_EQ(objective(), scale * stats.loss_sum);
  for (size_t i = 0; i < logits.size(); ++i) {
    ExpectGradient(dlogits[i], Derivative(logits[i], objective), "logits", i);
  }
}

TEST(SoftmaxCrossEntropy, CountsCorrectPredictions) {
  const std::vector<float> logits = {0, 5, 1,  //
                                     2, 1, 0,  //
                                     0, 0, 9};
  const std::vector<int32_t> labels = {1, 1, 2};
  SoftmaxCrossEntropy loss(3);
  const StepStats stats = loss.Forward(logits.data(), labels.data(), 3);
  EXPECT_EQ(stats.correct, 2);
  EXPECT_EQ(stats.loss_terms, 3);
  EXPECT_GT(loss.scratch_bytes(), 0);
}

}  // namespace
}  // namespace ringmaster::train::nn
