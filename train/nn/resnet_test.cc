#include "train/nn/resnet.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/finite_difference.h"
#include "train/nn/replica_sum_testing.h"

namespace ringmaster::train::nn {
namespace {

using kernels::RandomFloats;

std::unique_ptr<ResNet18> Make(int64_t width, int64_t side = 28, int64_t classes = 10) {
  absl::StatusOr<std::unique_ptr<ResNet18>> m = ResNet18::Create({side, width, classes});
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

Batch RandomBatch(int64_t n, int64_t side, uint32_t seed, int64_t classes = 10) {
  Batch b;
  b.size = n;
  b.feature_dim = side * side;
  b.features = RandomFloats(n * side * side, seed, -1.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i)
    b.labels.push_back(static_cast<int32_t>((i * 7 + seed) % classes));
  return b;
}

TEST(ResNet18Test, TableIsPyTorchsWithTheRunningStatisticsLast) {
  std::unique_ptr<ResNet18> m = Make(64);
  const state::TensorTable& t = m->table();
  // torchvision-style CIFAR ResNet-18 for 10 classes: 11,173,962 trained parameters, and
  // 2 · 4,800 running statistics.
  int64_t trained = 0, buffers = 0;
  const state::FlatRange range = m->buffer_range();
  for (const state::TensorSpec& s : t.tensors()) {
    const bool buffer = s.offset >= range.begin;
    EXPECT_EQ(buffer, s.name.find("running_") != std::string::npos) << s.name;
    (buffer ? buffers : trained) += s.numel;
  }
  EXPECT_EQ(trained, 11173962);
  EXPECT_EQ(buffers, 2 * 4800);
  EXPECT_EQ(range.end, t.total_elements());
  EXPECT_EQ(t.tensor(0).name, "conv1.weight");
  EXPECT_EQ(t.tensor(0).shape, (std::vector<int64_t>{64, 3, 3, 3}));
  ASSERT_TRUE(t.Find("layer2.0.shortcut.0.weight").ok());
  EXPECT_EQ(t.tensor(*t.Find("layer2.0.shortcut.0.weight")).shape,
            (std::vector<int64_t>{128, 64, 1, 1}));
  EXPECT_TRUE(t.Find("layer4.1.bn2.running_var").ok());
  EXPECT_FALSE(t.Find("layer1.0.shortcut.0.weight").ok());  // identity
  EXPECT_EQ(t.tensor(*t.Find("linear.weight")).shape, (std::vector<int64_t>{10, 512}));
  // Groups cover every tensor once, in order.
  int next = 0;
  for (const ParameterGroup& g : m->parameter_groups()) {
    EXPECT_EQ(g.first_tensor, next) << g.name;
    next = g.end_tensor;
  }
  EXPECT_EQ(next, t.size());
}

TEST(ResNet18Test, InitialisesLikePyTorch) {
  std::unique_ptr<ResNet18> m = Make(4);
  state::FlatBuffer p(m->table().total_elements());
  m->Init(3, p);
  const state::TensorTable& t = m->table();
  auto values = [&](const char* name) { return p.tensor(t.tensor(*t.Find(name))); };
  for (float v : values("layer3.1.bn1.weight")) EXPECT_EQ(v, 1.0f);
  for (float v : values("layer3.1.bn1.bias")) EXPECT_EQ(v, 0.0f);
  for (float v : values("layer3.1.bn1.running_mean")) EXPECT_EQ(v, 0.0f);
  for (float v : values("layer3.1.bn1.running_var")) EXPECT_EQ(v, 1.0f);
  const float bound = 1 / std::sqrt(4.0f * 9);
  float largest = 0;
  for (float v : values("layer1.0.conv1.weight")) largest = std::max(largest, std::abs(v));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.5f * bound);
}

// Finite differences of the training loss (batch statistics) in a tiny network, on a sample
// of the parameters and skipping steps that cross a ReLU kink. Tolerance as layers_test's,
// looser for the second-order error of the BatchNorms: 2e-3 · (1 + |g|) with h = 1e-2.
TEST(ResNet18Test, GradientsMatchFiniteDifferences) {
  std::unique_ptr<ResNet18> m = Make(2, 6, 3);
  const state::TensorTable& t = m->table();
  state::FlatBuffer p(t.total_elements()), g(t.total_elements());
  m->Init(5, p);
  // Give the BatchNorms' affine parameters other values than 1 and 0.
  for (const state::TensorSpec& s : t.tensors()) {
    if (s.name.find("bn") != std::string::npos && s.name.find("running") == std::string::npos) {
      const std::vector<float> r =
          RandomFloats(s.numel, static_cast<uint32_t>(s.offset), 0.5f, 1.5f);
      std::copy(r.begin(), r.end(), p.tensor(s).begin());
    }
  }
  const Batch b = RandomBatch(4, 6, 1, 3);
  ForwardBackwardOptions o;
  o.loss_divisor = 4;
  ASSERT_TRUE(m->ForwardBackward(b, p, g, o).ok());
  state::FlatBuffer scratch(t.total_elements());
  auto loss = [&] {
    absl::StatusOr<StepStats> s = m->ForwardBackward(b, p, scratch, o);
    EXPECT_TRUE(s.ok());
    return s->loss_sum / 4;
  };
  // The head and the last BatchNorm: their steps move few ReLU inputs, so kinks are rare
  // (and detected); every other gradient is compared with PyTorch's by
  // //tests:resnet_torch_test.
  int checked = 0;
  for (const char* name :
       {"linear.weight", "linear.bias", "layer4.1.bn2.weight", "layer4.1.bn2.bias"}) {
    const state::TensorSpec& s = t.tensor(*t.Find(name));
    for (int64_t at = s.offset; at < s.offset + s.numel; ++at) {
      const Slope slope = MeasureSlope(p.data()[at], 1e-2f, 0.05, loss);
      if (!slope.smooth) continue;
      ++checked;
      EXPECT_TRUE(GradientClose(g.data()[at], slope.central, 2e-3))
          << name << " flat index " << at << ": " << g.data()[at] << " vs finite difference "
          << slope.central;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(ResNet18Test, RunningStatisticsAreKeptUntilUpdateBuffers) {
  std::unique_ptr<ResNet18> m = Make(2);
  const state::TensorTable& t = m->table();
  state::FlatBuffer p(t.total_elements()), g(t.total_elements());
  m->Init(1, p);
  const std::vector<float> before(p.span().begin(), p.span().end());
  std::vector<int64_t> announced;
  ForwardBackwardOptions o;
  o.loss_divisor = 8;
  o.on_grads_ready = [&](int64_t offset) { announced.push_back(offset); };
  std::fill(g.span().begin(), g.span().end(), 7.0f);
  ASSERT_TRUE(m->ForwardBackward(RandomBatch(8, 28, 2), p, g, o).ok());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.span().begin()));  // params untouched
  const state::FlatRange buffers = m->buffer_range();
  for (const state::TensorSpec& s : t.tensors()) {
    if (s.offset < buffers.begin) continue;
    for (float v : g.tensor(s)) ASSERT_EQ(v, 0.0f) << s.name;  // buffers get zero gradients
  }
  ASSERT_FALSE(announced.empty());
  EXPECT_TRUE(std::is_sorted(announced.rbegin(), announced.rend()));
  EXPECT_EQ(announced.back(), 0);
  // A second micro-batch moves the statistics again, from where the first left them.
  o.accumulate = true;
  ASSERT_TRUE(m->ForwardBackward(RandomBatch(8, 28, 3), p, g, o).ok());
  m->UpdateBuffers(p.span());
  const state::TensorSpec& mean = t.tensor(*t.Find("bn1.running_mean"));
  const state::TensorSpec& var = t.tensor(*t.Find("layer4.1.bn2.running_var"));
  for (float v : p.tensor(mean)) EXPECT_NE(v, 0.0f);
  for (float v : p.tensor(var)) EXPECT_NE(v, 1.0f);
  const std::vector<float> after(p.span().begin(), p.span().end());
  for (int64_t i = 0; i < buffers.begin; ++i) ASSERT_EQ(after[i], before[i]) << i;
  m->UpdateBuffers(p.span());  // no forward since: nothing changes
  EXPECT_TRUE(std::equal(after.begin(), after.end(), p.span().begin()));
  // Evaluation reads the running statistics.
  const Batch eval = RandomBatch(4, 28, 4);
  absl::StatusOr<StepStats> updated = m->Evaluate(eval, p, Precision::kFloat32);
  ASSERT_TRUE(updated.ok());
  for (float& v : p.tensor(var)) v *= 4;
  absl::StatusOr<StepStats> changed = m->Evaluate(eval, p, Precision::kFloat32);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(updated->loss_sum, changed->loss_sum);
}

// Two replicas with synchronized BatchNorm, each with half of a batch, give what one model
// with the whole batch gives: the loss and running statistics, and gradients that sum to its.
TEST(ResNet18Test, SynchronizedReplicasMatchOneBatch) {
  const Batch whole = RandomBatch(6, 28, 9);
  std::unique_ptr<ResNet18> one = Make(2);
  const state::TensorTable& t = one->table();
  state::FlatBuffer p(t.total_elements()), g(t.total_elements());
  one->Init(2, p);
  ForwardBackwardOptions o;
  o.loss_divisor = 6;
  absl::StatusOr<StepStats> s = one->ForwardBackward(whole, p, g, o);
  ASSERT_TRUE(s.ok()) << s.status();
  state::FlatBuffer updated(t.total_elements());
  std::copy(p.span().begin(), p.span().end(), updated.span().begin());
  one->UpdateBuffers(updated.span());

  ThreadReplicaSum sum(2);
  std::vector<state::FlatBuffer> grads, stats;
  double losses[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    grads.emplace_back(t.total_elements());
    stats.emplace_back(t.total_elements());
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      std::unique_ptr<ResNet18> replica = Make(2);
      Batch half;
      half.size = 3;
      half.feature_dim = whole.feature_dim;
      half.features.assign(whole.features.begin() + k * 3 * 784,
                           whole.features.begin() + (k + 1) * 3 * 784);
      half.labels.assign(whole.labels.begin() + k * 3, whole.labels.begin() + (k + 1) * 3);
      ForwardBackwardOptions ro = o;
      ro.sum_across_replicas = [&sum, k](absl::Span<double> v) { return sum.Sum(k, v); };
      absl::StatusOr<StepStats> r = replica->ForwardBackward(half, p, grads[k], ro);
      EXPECT_TRUE(r.ok()) << r.status();
      losses[k] = r->loss_sum;
      std::copy(p.span().begin(), p.span().end(), stats[k].span().begin());
      replica->UpdateBuffers(stats[k].span());
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_NEAR(losses[0] + losses[1], s->loss_sum, 1e-4);
  for (int64_t i = 0; i < t.total_elements(); ++i) {
    ASSERT_NEAR(grads[0].data()[i] + grads[1].data()[i], g.data()[i], 2e-5) << i;
    ASSERT_NEAR(stats[0].data()[i], updated.data()[i], 1e-5) << i;
    ASSERT_EQ(stats[0].data()[i], stats[1].data()[i]) << i;
  }
}

TEST(ResNet18Test, EmptyBatchTakesPartInTheSums) {
  // An empty replica next to one with a batch: the other gets its own batch's statistics.
  std::unique_ptr<ResNet18> alone = Make(2);
  const state::TensorTable& t = alone->table();
  state::FlatBuffer p(t.total_elements()), g(t.total_elements());
  alone->Init(4, p);
  const Batch b = RandomBatch(3, 28, 5);
  ForwardBackwardOptions o;
  o.loss_divisor = 3;
  ASSERT_TRUE(alone->ForwardBackward(b, p, g, o).ok());
  ThreadReplicaSum sum(2);
  state::FlatBuffer g0(t.total_elements()), g1(t.total_elements());
  std::thread empty([&] {
    std::unique_ptr<ResNet18> m = Make(2);
    ForwardBackwardOptions eo = o;
    eo.sum_across_replicas = [&sum](absl::Span<double> v) { return sum.Sum(1, v); };
    Batch none;
    none.feature_dim = 784;
    EXPECT_TRUE(m->ForwardBackward(none, p, g1, eo).ok());
  });
  std::unique_ptr<ResNet18> m = Make(2);
  ForwardBackwardOptions fo = o;
  fo.sum_across_replicas = [&sum](absl::Span<double> v) { return sum.Sum(0, v); };
  EXPECT_TRUE(m->ForwardBackward(b, p, g0, fo).ok());
  empty.join();
  for (int64_t i = 0; i < t.total_elements(); ++i) {
    ASSERT_NEAR(g0.data()[i], g.data()[i], 1e-5) << i;
    ASSERT_EQ(g1.data()[i], 0.0f) << i;
  }
}

// Evaluation normalises each sample by the running statistics alone: a batch larger than
// one evaluation piece gives the sum of its samples evaluated one by one.
TEST(ResNet18Test, EvaluationIsPerSample) {
  std::unique_ptr<ResNet18> m = Make(2);
  state::FlatBuffer p(m->table().total_elements());
  m->Init(6, p);
  const Batch b = RandomBatch(40, 28, 8);
  absl::StatusOr<StepStats> all = m->Evaluate(b, p, Precision::kFloat32);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->loss_terms, 40);
  double loss = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < 40; ++i) {
    Batch one;
    one.size = 1;
    one.feature_dim = b.feature_dim;
    one.features.assign(b.features.begin() + i * 784, b.features.begin() + (i + 1) * 784);
    one.labels = {b.labels[i]};
    absl::StatusOr<StepStats> s = m->Evaluate(one, p, Precision::kFloat32);
    ASSERT_TRUE(s.ok()) << s.status();
    loss += s->loss_sum;
    correct += s->correct;
  }
  EXPECT_NEAR(all->loss_sum, loss, 1e-4);
  EXPECT_EQ(all->correct, correct);
}

TEST(ResNet18Test, RefusesWhatItCannotRun) {
  EXPECT_EQ(ResNet18::Create({28, 0, 10}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ResNet18::Create({33, 4, 10}).status().message().find("resnet18.image_side"),
            std::string::npos);
  std::unique_ptr<ResNet18> m = Make(2);
  state::FlatBuffer p(m->table().total_elements()), g(m->table().total_elements());
  ForwardBackwardOptions o;
  o.precision = Precision::kBFloat16;
  absl::StatusOr<StepStats> s = m->ForwardBackward(RandomBatch(2, 28, 1), p, g, o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("options.precision"), std::string::npos) << s.status();
  s = m->ForwardBackward(RandomBatch(2, 27, 1), p, g, {});
  EXPECT_NE(s.status().message().find("batch.feature_dim"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace ringmaster::train::nn
