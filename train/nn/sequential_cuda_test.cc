// Tests of train/nn/sequential_cuda.h against the CPU classifiers (train/nn/classifiers.h):
// the same parameters and batch give the same loss, predictions and parameter gradients.
// Tolerances: fp32 1e-5 of each tensor's gradient norm and of the loss (the same fp32
// operations in other orders: cuBLASLt's sums, the convolution's im2col product); TF32 2e-2
// (10-bit mantissas in every product). bf16 and fp16 against the CPU model's bf16 and fp16
// (the same values rounded at the same places; the products exact on TF32 tensor cores, the
// sums in another order, so a rounding can land one ulp apart and carry on): bf16 2e-2 and
// fp16 4e-3 (a few ulps of 2^-8 and 2^-11 each). Accumulating a second time doubles each
// gradient (per tensor, 1e-6; in 16 bits the second gradient is rounded and added to the
// first, rounded the same way). Gradients are announced per layer, last first, ending at
// offset 0.
// Without a GPU the tests skip.
#include "train/nn/sequential_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/precision.h"
#include "state/tensor.h"
#include "train/nn/classifiers.h"
#include "train/nn/model_testing.h"
#include "train/nn/store_testing.h"

namespace ringmaster::train::nn {
namespace {

using kernels::cuda::MatMulType;
using kernels::cuda::testing::Device;
using kernels::cuda::testing::ExpectSameBits;
using kernels::cuda::testing::HaveGpu;
using nn::testing::DeviceStore;
using nn::testing::ExpectTensorsClose;
using nn::testing::HostStore;
using nn::testing::Norm;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the GPU classifier tests")

Batch RandomBatch(int64_t size, int64_t features, int64_t classes, uint32_t seed) {
  Batch b;
  b.size = size;
  b.feature_dim = features;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> x(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(classes - 1));
  b.features.resize(size * features);
  for (float& v : b.features) v = x(gen);
  b.labels.resize(size);
  for (int32_t& l : b.labels) l = label(gen);
  return b;
}

Precision PrecisionOf(MatMulType type) {
  return type == MatMulType::kBFloat16  ? Precision::kBFloat16
         : type == MatMulType::kFloat16 ? Precision::kFloat16
                                        : Precision::kFloat32;
}

void CompareWithCpu(SequentialClassifier& cpu, MatMulType type, double tol) {
  absl::StatusOr<std::unique_ptr<SequentialCuda>> gpu =
      SequentialCuda::Create(cpu, {.matmul = type}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const state::TensorTable& table = cpu.table();
  state::FlatBuffer params(table.total_elements()), grads(table.total_elements());
  cpu.Init(11, params);
  const Batch batch = RandomBatch(37, cpu.input_size(), cpu.classes(), 5);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 37;
  fb.precision = PrecisionOf(type);
  EXPECT_EQ((*gpu)->precision(), fb.precision);
  std::vector<int64_t> cpu_ready;
  fb.on_grads_ready = [&](int64_t offset) { cpu_ready.push_back(offset); };
  absl::StatusOr<StepStats> want = cpu.ForwardBackward(batch, params, grads, fb);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::vector<float> host_params(params.data(), params.data() + params.size());
  Device<float> dparams(host_params), dgrads(table.total_elements());
  std::vector<int64_t> gpu_ready;
  fb.on_grads_ready = [&](int64_t offset) { gpu_ready.push_back(offset); };
  absl::StatusOr<StepStats> got = (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(gpu_ready, cpu_ready);
  EXPECT_EQ(got->loss_terms, want->loss_terms);
  EXPECT_NEAR(got->loss_sum, want->loss_sum, tol * std::fabs(want->loss_sum));
  EXPECT_LE(std::llabs(got->correct - want->correct), type == MatMulType::kFloat32 ? 0 : 2);
  const std::vector<float> g = dgrads.Host();
  ExpectTensorsClose(table, g.data(), grads.data(), 1, tol, 1e-12, "gradient");

  fb.accumulate = true;
  fb.on_grads_ready = nullptr;
  ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
  const std::vector<float> twice = dgrads.Host();
  ExpectTensorsClose(table, twice.data(), g.data(), 2, 1e-6, 1e-12, "accumulated gradient");
}

std::unique_ptr<MlpClassifier> SmallMlp() {
  auto mlp = MlpClassifier::Create({.inputs = 50, .hidden = {33, 20}, .classes = 7});
  CHECK(mlp.ok()) << mlp.status();
  return std::move(*mlp);
}

std::unique_ptr<CnnClassifier> SmallCnn() {
  auto cnn = CnnClassifier::Create({.channels = 2,
                                    .height = 9,
                                    .width = 10,
                                    .conv_channels = {4, 6},
                                    .kernel_size = 3,
                                    .hidden = {12},
                                    .classes = 5});
  CHECK(cnn.ok()) << cnn.status();
  return std::move(*cnn);
}

TEST(SequentialCuda, MlpMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(*SmallMlp(), MatMulType::kFloat32, 1e-5);
}

TEST(SequentialCuda, CnnMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(*SmallCnn(), MatMulType::kFloat32, 1e-5);
}

TEST(SequentialCuda, Tf32ApproximatesTheCpu) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(*SmallMlp(), MatMulType::kTensorFloat32, 2e-2);
  CompareWithCpu(*SmallCnn(), MatMulType::kTensorFloat32, 2e-2);
}

TEST(SequentialCuda, SixteenBitMatchesTheCpusEmulation) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(*SmallMlp(), MatMulType::kBFloat16, 2e-2);
  CompareWithCpu(*SmallCnn(), MatMulType::kBFloat16, 2e-2);
  CompareWithCpu(*SmallMlp(), MatMulType::kFloat16, 4e-3);
  CompareWithCpu(*SmallCnn(), MatMulType::kFloat16, 4e-3);
}

// The 16-bit gradients are 16-bit values: every element rounds to itself.
TEST(SequentialCuda, SixteenBitGradientsAreSixteenBitValues) {
  SKIP_WITHOUT_GPU();
  for (MatMulType type : {MatMulType::kBFloat16, MatMulType::kFloat16}) {
    auto cnn = SmallCnn();
    auto gpu = SequentialCuda::Create(*cnn, {.matmul = type}, nullptr);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    state::FlatBuffer params(cnn->table().total_elements());
    cnn->Init(3, params);
    Device<float> dparams(std::vector<float>(params.data(), params.data() + params.size()));
    Device<float> dgrads(params.size());
    ForwardBackwardOptions fb;
    fb.precision = PrecisionOf(type);
    fb.loss_divisor = 8;
    ASSERT_TRUE((*gpu)
                    ->ForwardBackward(RandomBatch(8, cnn->input_size(), 5, 2), dparams.get(),
                                      dgrads.get(), fb)
                    .ok());
    std::vector<float> g = dgrads.Host(), rounded(g.size());
    kernels::RoundTo(type == MatMulType::kBFloat16 ? kernels::HalfFormat::kBFloat16
                                                   : kernels::HalfFormat::kFloat16,
                     g.data(), rounded.data(), static_cast<int64_t>(g.size()));
    EXPECT_EQ(g, rounded) << kernels::cuda::MatMulTypeName(type);
    EXPECT_GT(Norm(g.data(), static_cast<int64_t>(g.size())), 0);
  }
}

// With a ParameterStore (train/model.h) in device memory, each layer's parameters and
// gradients in buffers of their own, the loss and every gradient are those of the flat
// buffers bit for bit, in fp32, bf16 and fp16, for the MLP and the CNN. The store checks the
// calls' order and poisons what the model may no longer read (train/nn/store_testing.h); the
// calls are the CPU model's, layer for layer. Accumulating with a store is refused.
TEST(SequentialCuda, AParameterStoreGivesTheFlatResultsBitForBit) {
  SKIP_WITHOUT_GPU();
  std::vector<std::unique_ptr<SequentialClassifier>> models;
  models.push_back(SmallMlp());
  models.push_back(SmallCnn());
  for (const auto& cpu : models) {
    const state::TensorTable& table = cpu->table();
    const std::vector<ParameterGroup> groups = cpu->parameter_groups();
    state::FlatBuffer params(table.total_elements()), unused;
    cpu->Init(17, params);
    const std::vector<float> host_params(params.data(), params.data() + params.size());
    const Batch batch = RandomBatch(9, cpu->input_size(), cpu->classes(), 3);
    ForwardBackwardOptions fb;
    fb.loss_divisor = 9;
    HostStore cpu_store(table, groups, params.data());
    fb.store = &cpu_store;
    ASSERT_TRUE(cpu->ForwardBackward(batch, unused, unused, fb).ok());
    cpu_store.EndPass();

    for (MatMulType type : {MatMulType::kFloat32, MatMulType::kBFloat16, MatMulType::kFloat16}) {
      const std::string what = absl::StrCat(cpu->Describe(), ", ", MatMulTypeName(type));
      auto gpu = SequentialCuda::Create(*cpu, {.matmul = type}, nullptr);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      fb.precision = PrecisionOf(type);
      DeviceStore store(table, groups, host_params, (*gpu)->stream());
      fb.store = &store;
      fb.accumulate = true;
      absl::Status refused = (*gpu)->ForwardBackward(batch, nullptr, nullptr, fb).status();
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << what;
      EXPECT_NE(refused.message().find("accumulate with a ParameterStore"), std::string::npos)
          << refused;
      fb.accumulate = false;
      absl::StatusOr<StepStats> got = (*gpu)->ForwardBackward(batch, nullptr, nullptr, fb);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      store.EndPass();
      EXPECT_EQ(store.log(), cpu_store.log()) << what;

      fb.store = nullptr;
      Device<float> dparams(host_params), dgrads(table.total_elements());
      absl::StatusOr<StepStats> want =
          (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_EQ(got->loss_sum, want->loss_sum) << what;
      EXPECT_EQ(got->correct, want->correct) << what;
      ExpectSameBits(store.FlatGradients(), dgrads.Host(), absl::StrCat(what, ", gradients"));
    }
  }
}

TEST(SequentialCuda, BadBatchesAndPrecisionsAreNamed) {
  SKIP_WITHOUT_GPU();
  auto mlp = SmallMlp();
  auto gpu = SequentialCuda::Create(*mlp, {}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Device<float> dparams(mlp->table().total_elements()), dgrads(mlp->table().total_elements());
  Batch batch = RandomBatch(3, 50, 7, 1);
  batch.labels[2] = 7;
  absl::Status s = (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch.labels[2] is 7"), std::string::npos) << s;
  ForwardBackwardOptions bf16;
  bf16.precision = Precision::kBFloat16;
  s = (*gpu)->ForwardBackward(RandomBatch(3, 50, 7, 1), dparams.get(), dgrads.get(), bf16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.precision is bf16 but this GPU model was created for fp32"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ringmaster::train::nn
