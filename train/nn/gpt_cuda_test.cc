// GptCuda against its CPU twin GptModel (train/nn/gpt.h) in fp32: the same parameters, the
// same batch, then the loss and every tensor's gradient. The GPU sums in other orders, so:
// loss_sum within 1e-5 relative; per tensor, ||g_gpu - g_cpu|| <= tol ||g_cpu|| with tol
// 1e-4 for fp32 products and 5e-3 for TF32 (10-bit mantissa inputs); next-token accuracy
// within 2 tokens (an argmax between near-equal logits may flip). Accumulation: a second call
// with accumulate doubles every gradient (relative 1e-6). Without a GPU the tests skip.
#include "train/nn/gpt_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "train/tensor.h"

namespace ringmaster::train::nn {
namespace {

using kernels::cuda::MatMulType;
using kernels::cuda::testing::Device;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the GPU GPT tests")

GptOptions Tiny() {
  GptOptions o;
  o.layers = 2;
  o.heads = 2;
  o.width = 64;
  o.context = 64;
  o.vocab = 97;
  return o;
}

Batch RandomBatch(const GptOptions& o, int64_t size, uint32_t seed) {
  Batch b;
  b.size = size;
  b.context = o.context;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(o.vocab - 1));
  b.tokens.resize(size * (o.context + 1));
  for (int32_t& t : b.tokens) t = id(gen);
  return b;
}

double Norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double{x[i]} * x[i];
  return std::sqrt(s);
}

void CompareWithCpu(MatMulType type, double tol) {
  const GptOptions o = Tiny();
  absl::StatusOr<std::unique_ptr<GptCuda>> gpu = GptCuda::Create(o, {.matmul = type}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const TensorTable& table = (*cpu)->table();
  FlatBuffer params(table.total_elements()), grads(table.total_elements());
  (*cpu)->Init(42, params);
  const Batch batch = RandomBatch(o, 3, 7);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 3 * o.context;
  absl::StatusOr<StepStats> want = (*cpu)->ForwardBackward(batch, params, grads, fb);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::vector<float> host_params(params.data(), params.data() + params.size());
  Device<float> dparams(host_params), dgrads(table.total_elements());
  absl::StatusOr<StepStats> got = (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->loss_terms, want->loss_terms);
  EXPECT_NEAR(got->loss_sum, want->loss_sum, 1e-5 * std::fabs(want->loss_sum));
  EXPECT_LE(std::llabs(got->correct - want->correct), 2);
  const std::vector<float> g = dgrads.Host();
  for (const TensorSpec& t : table.tensors()) {
    std::vector<float> diff(t.numel);
    for (int64_t i = 0; i < t.numel; ++i) diff[i] = g[t.offset + i] - grads.data()[t.offset + i];
    const double ref = Norm(grads.data() + t.offset, t.numel);
    EXPECT_LE(Norm(diff.data(), t.numel), tol * ref + 1e-12)
        << MatMulTypeName(type) << " gradient of " << t.name << " (norm " << ref << ")";
  }

  // Accumulating a second time doubles every gradient.
  fb.accumulate = true;
  ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
  const std::vector<float> twice = dgrads.Host();
  for (int64_t i = 0; i < table.total_elements(); ++i) {
    ASSERT_NEAR(twice[i], 2 * g[i], 1e-6 * std::fabs(g[i]) + 1e-12) << "element " << i;
  }
}

TEST(GptCuda, Fp32GradientsMatchTheCpuModel) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kFloat32, 1e-4);
}

TEST(GptCuda, Tf32GradientsMatchTheCpuModelLoosely) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kTensorFloat32, 5e-3);
}

TEST(GptCuda, WhatIsNotHereYetIsUnimplemented) {
  SKIP_WITHOUT_GPU();
  GptOptions o = Tiny();
  o.checkpoint_every = 1;
  EXPECT_EQ(GptCuda::Create(o, {}, nullptr).status().code(), absl::StatusCode::kUnimplemented);
  o = Tiny();
  EXPECT_EQ(GptCuda::Create(o, {.matmul = MatMulType::kBFloat16}, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
  o.heads = 0;
  EXPECT_EQ(GptCuda::Create(o, {}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptCuda, BadBatchesAreNamed) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = Tiny();
  absl::StatusOr<std::unique_ptr<GptCuda>> gpu = GptCuda::Create(o, {}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Device<float> p((*gpu)->total_elements()), g((*gpu)->total_elements());
  Batch batch = RandomBatch(o, 2, 1);
  batch.tokens[5] = 97;
  absl::Status s = (*gpu)->ForwardBackward(batch, p.get(), g.get(), {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch.tokens[5] is 97"), std::string::npos) << s;
  batch = RandomBatch(o, 2, 1);
  batch.context = 32;
  s = (*gpu)->ForwardBackward(batch, p.get(), g.get(), {}).status();
  EXPECT_NE(s.message().find("batch.context is 32"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::train::nn
