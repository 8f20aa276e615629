#include "train/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"
#include "state/tensor.h"
#include "train/nn/finite_difference.h"
#include "train/nn/random.h"

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
