// GptCuda against its CPU twin GptModel (train/nn/gpt.h) in fp32: the same parameters, the
// same batch, then the loss and every tensor's gradient. The GPU sums in other orders, so:
// loss_sum within 1e-5 relative; per tensor, ||g_gpu - g_cpu|| <= tol ||g_cpu|| with tol
// 1e-4 for fp32 products and 5e-3 for TF32 (10-bit mantissa inputs); next-token accuracy
// within 2 tokens (an argmax between near-equal logits may flip). Accumulation: a second call
// with accumulate doubles every gradient (relative 1e-6). Without a GPU the tests skip.
//
// bf16 (bf16 activations, fp32 master parameters and gradients) is compared with the CPU in
// fp32, the exact answer it approximates: every activation is rounded to 8 bits of mantissa
// (relative 2^-9 each), and those errors add up over the layers, so per tensor tol is 5e-2,
// the loss within 1e-2 relative, accuracy within 5% of the tokens. A wrong kernel or a wrong
// pointer gives errors of order 1, far outside. fp16 is held to the same bounds (it keeps 11
// bits of mantissa), with the loss scaled by 1024 as the trainer would and the gradients
// divided back.
#include "train/nn/gpt_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "state/tensor.h"
#include "train/nn/model_testing.h"
#include "train/nn/store_testing.h"

namespace ringmaster::train::nn {

// What the LM head's padding test reads and poisons inside GptCuda.
class GptCudaTestPeer {
 public:
  // The bits of the rows after the vocab rows of the lm_head's 16-bit copy, where the padded
  // products read its padding rows (after the stream has drained).
  static std::vector<uint16_t> HeadPaddingRows(const GptCuda& gpu) {
    std::vector<uint16_t> bits(gpu.HeadPadding());
    const int64_t rows_end = gpu.head_copy_offset_ + gpu.options_.vocab * gpu.options_.width;
    EXPECT_EQ(cudaStreamSynchronize(gpu.stream()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(bits.data(), static_cast<const uint16_t*>(gpu.params16_) + rows_end,
                         bits.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return bits;
  }
  // NaN bytes over the logits and the buffer their gradient takes (as laid out for `batch`
  // samples by the last call), padding columns included.
  static void PoisonLogits(const GptCuda& gpu, int64_t batch) {
    const int64_t rows = batch * gpu.options_.context, bytes = gpu.half() ? 2 : 4;
    const int64_t width = std::max(4 * gpu.options_.width, gpu.logits_stride_);
    EXPECT_EQ(cudaStreamSynchronize(gpu.stream()), cudaSuccess);
    EXPECT_EQ(cudaMemset(gpu.logits_, 0xff, rows * gpu.logits_stride_ * bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(gpu.dbig_, 0xff, rows * width * bytes), cudaSuccess);
  }
};

namespace {

using kernels::cuda::MatMulType;
using kernels::cuda::testing::Device;
using kernels::cuda::testing::ExpectSameBits;
using nn::testing::DeviceStore;
using nn::testing::ExpectTensorsClose;
using nn::testing::HostStore;

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

// Tiny with one head of 64 channels: a head size the bf16 attention takes.
GptOptions TinyOneHead() {
  GptOptions o = Tiny();
  o.heads = 1;
  return o;
}

// Tiny's vocabulary of 97 has its logits' rows padded to 128 by default; logits_alignment 1
// keeps them dense.
void CompareWithCpu(MatMulType type, double tol, const GptOptions& o = Tiny(),
                    int64_t logits_alignment = GptCudaOptions().logits_row_alignment) {
  absl::StatusOr<std::unique_ptr<GptCuda>> gpu =
      GptCuda::Create(o, {.matmul = type, .logits_row_alignment = logits_alignment}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const state::TensorTable& table = (*cpu)->table();
  state::FlatBuffer params(table.total_elements()), grads(table.total_elements());
  (*cpu)->Init(42, params);
  const Batch batch = RandomBatch(o, 3, 7);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 3 * o.context;
  absl::StatusOr<StepStats> want = (*cpu)->ForwardBackward(batch, params, grads, fb);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::vector<float> host_params(params.data(), params.data() + params.size());
  Device<float> dparams(host_params), dgrads(table.total_elements());
  const bool half = ElementBytes(type) == 2, fp16 = type == MatMulType::kFloat16;
  EXPECT_EQ((*gpu)->precision(), fp16   ? Precision::kFloat16
                                 : half ? Precision::kBFloat16
                                        : Precision::kFloat32);
  fb.precision = (*gpu)->precision();
  // fp16 scales the loss, as the trainer does, so that small gradients do not underflow.
  const float loss_scale = fp16 ? 1024.0f : 1.0f;
  fb.loss_scale = loss_scale;
  absl::StatusOr<StepStats> got = (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->loss_terms, want->loss_terms);
  EXPECT_NEAR(got->loss_sum, want->loss_sum, (half ? 1e-2 : 1e-5) * std::fabs(want->loss_sum));
  EXPECT_LE(std::llabs(got->correct - want->correct), half ? want->loss_terms / 20 : 2);
  std::vector<float> g = dgrads.Host();
  for (float& x : g) x /= loss_scale;
  ExpectTensorsClose(table, g.data(), grads.data(), 1, tol, 1e-12,
                     absl::StrCat(MatMulTypeName(type), " gradient"));

  // Accumulating a second time doubles every gradient: per tensor, to fp32 rounding of the
  // tensor's scale, not of each element. The tied token embedding sums two contributions
  // (the LM head's product and the embedding's backward) that often nearly cancel, and
  // (g + head) + embedding rounds differently from 2 (head + embedding).
  fb.accumulate = true;
  ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
  std::vector<float> twice = dgrads.Host();
  for (float& x : twice) x /= loss_scale;
  ExpectTensorsClose(table, twice.data(), g.data(), 2, 1e-6, 1e-12,
                     absl::StrCat(MatMulTypeName(type), " accumulated gradient"));
}

TEST(GptCuda, Fp32GradientsMatchTheCpuModel) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kFloat32, 1e-4);
}

TEST(GptCuda, Tf32GradientsMatchTheCpuModelLoosely) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kTensorFloat32, 5e-3);
}

TEST(GptCuda, Bf16GradientsApproximateTheFp32CpuModel) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kBFloat16, 5e-2, TinyOneHead());
}

// fp16 keeps 3 more mantissa bits than bf16, so the same bounds hold with room to spare.
TEST(GptCuda, Fp16GradientsApproximateTheFp32CpuModel) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kFloat16, 5e-2, TinyOneHead());
}

TEST(GptCuda, DenseLogitRowsMatchTheCpuModelToo) {
  SKIP_WITHOUT_GPU();
  CompareWithCpu(MatMulType::kFloat32, 1e-4, Tiny(), /*logits_alignment=*/1);
  CompareWithCpu(MatMulType::kBFloat16, 5e-2, TinyOneHead(), /*logits_alignment=*/1);
}

// An overflow injected through the loss scale (2^24 / 192 tokens puts the logits' gradient
// near 8.7e4, past fp16's 65504) shows in the fp32 gradients as inf or NaN, where the loss
// scaler looks; with a scale of 1 the same step's gradients are all finite.
TEST(GptCuda, Fp16OverflowReachesTheFloatGradients) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = TinyOneHead();
  auto gpu = GptCuda::Create(o, {.matmul = MatMulType::kFloat16}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  state::FlatBuffer params((*cpu)->table().total_elements());
  (*cpu)->Init(42, params);
  Device<float> dparams(std::vector<float>(params.data(), params.data() + params.size()));
  Device<float> dgrads(params.size());
  const Batch batch = RandomBatch(o, 3, 5);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 3 * o.context;
  fb.precision = Precision::kFloat16;
  auto finite = [&] {
    const std::vector<float> g = dgrads.Host();
    return std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); });
  };
  ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
  EXPECT_TRUE(finite()) << "scale 1";
  fb.loss_scale = 16777216.0f;
  ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
  EXPECT_FALSE(finite()) << "scale 2^24 overflows fp16";
}

TEST(GptCuda, Bf16HoldsAParameterCopyAndHalfTheActivations) {
  SKIP_WITHOUT_GPU();
  auto fp32 = GptCuda::Create(TinyOneHead(), {}, nullptr);
  auto bf16 = GptCuda::Create(TinyOneHead(), {.matmul = MatMulType::kBFloat16}, nullptr);
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  EXPECT_EQ((*fp32)->parameter_copy_bytes(), 0);
  // Every parameter (lm_head the last) and lm_head's padding rows, 128 - 97 of them.
  EXPECT_EQ((*bf16)->parameter_copy_bytes(), 2 * ((*bf16)->total_elements() + 31 * 64));
  const Batch batch = RandomBatch(TinyOneHead(), 4, 3);
  Device<float> g((*fp32)->total_elements());
  std::vector<float> zeros((*fp32)->total_elements(), 0.0f);
  Device<float> params(zeros);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 4 * TinyOneHead().context;
  ASSERT_TRUE((*fp32)->ForwardBackward(batch, params.get(), g.get(), fb).ok());
  // The wrong precision is refused, naming it.
  absl::Status s = (*bf16)->ForwardBackward(batch, params.get(), g.get(), fb).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s;
  fb.precision = Precision::kBFloat16;
  ASSERT_TRUE((*bf16)->ForwardBackward(batch, params.get(), g.get(), fb).ok());
  // Activations are half the bytes; fp32 statistics, tokens and scratch make up the rest.
  EXPECT_LT((*bf16)->activation_bytes(), 0.6 * (*fp32)->activation_bytes());
  EXPECT_GT((*bf16)->activation_bytes(), 0.4 * (*fp32)->activation_bytes());
}

// Activation checkpointing recomputes each segment's activations from its kept input with
// the same kernels on the same inputs, so the gradients are those of the run without it (to
// 1e-6 relative per tensor: only a matmul algorithm that sums in another order could differ),
// in fp32 and bf16; and the activations take less memory.
TEST(GptCuda, CheckpointingGivesTheSameGradientsInLessMemory) {
  SKIP_WITHOUT_GPU();
  for (MatMulType type : {MatMulType::kFloat32, MatMulType::kBFloat16, MatMulType::kFloat16}) {
    GptOptions o = TinyOneHead();
    o.layers = 5;
    const Batch batch = RandomBatch(o, 3, 11);
    absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const state::TensorTable& table = (*cpu)->table();
    state::FlatBuffer params(table.total_elements());
    (*cpu)->Init(42, params);
    Device<float> dparams(std::vector<float>(params.data(), params.data() + params.size()));
    std::vector<std::vector<float>> grads;
    std::vector<int64_t> bytes;
    std::vector<double> losses;
    for (int64_t every : {0, 1, 2, 5}) {
      o.checkpoint_every = every;
      auto gpu = GptCuda::Create(o, {.matmul = type}, nullptr);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      Device<float> dgrads(table.total_elements());
      ForwardBackwardOptions fb;
      fb.loss_divisor = 3 * o.context;
      fb.precision = (*gpu)->precision();
      absl::StatusOr<StepStats> stats =
          (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
      ASSERT_TRUE(stats.ok()) << stats.status();
      grads.push_back(dgrads.Host());
      bytes.push_back((*gpu)->activation_bytes());
      losses.push_back(stats->loss_sum);
    }
    for (size_t run = 1; run < grads.size(); ++run) {
      EXPECT_EQ(losses[run], losses[0]) << MatMulTypeName(type) << " run " << run;
      ExpectTensorsClose(
          table, grads[run].data(), grads[0].data(), 1, 1e-6, 0,
          absl::StrCat(MatMulTypeName(type), " checkpointing run ", run, ", gradient"));
    }
    // Every block's activations (0) > one segment of 2 blocks plus 3 kept inputs (2) > one
    // block's plus 5 kept inputs (1); every 5 with 5 layers keeps everything, as 0 does.
    EXPECT_LT(bytes[2], bytes[0]) << MatMulTypeName(type);
    EXPECT_LT(bytes[1], bytes[2]) << MatMulTypeName(type);
    EXPECT_EQ(bytes[3], bytes[0]) << MatMulTypeName(type);
  }
}

// Profiling times every kind of work of the step and changes nothing it computes.
TEST(GptCuda, ProfileTimesEachKindOfWork) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = TinyOneHead();
  absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  state::FlatBuffer params((*cpu)->table().total_elements());
  (*cpu)->Init(42, params);
  Device<float> dparams(std::vector<float>(params.data(), params.data() + params.size()));
  const Batch batch = RandomBatch(o, 2, 9);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 2 * o.context;
  std::vector<std::vector<float>> grads;
  for (bool profile : {false, true}) {
    auto gpu = GptCuda::Create(o, {.profile = profile}, nullptr);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    Device<float> dgrads(params.size());
    for (int call = 0; call < 2; ++call) {
      ASSERT_TRUE((*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).ok());
    }
    grads.push_back(dgrads.Host());
    if (!profile) {
      EXPECT_TRUE((*gpu)->profile_ms().empty());
      EXPECT_EQ((*gpu)->profiled_calls(), 0);
      continue;
    }
    EXPECT_EQ((*gpu)->profiled_calls(), 2);
    for (const char* what :
         {"matmul forward", "matmul backward (inputs)", "matmul backward (weights, biases)",
          "attention forward", "attention backward", "layernorm forward", "layernorm backward",
          "gelu forward", "gelu backward", "residual add", "softmax cross-entropy",
          "embedding forward", "embedding backward", "zero the gradients"}) {
      auto it = (*gpu)->profile_ms().find(what);
      ASSERT_NE(it, (*gpu)->profile_ms().end()) << what;
      EXPECT_GT(it->second, 0.0) << what;
    }
  }
  EXPECT_EQ(grads[0], grads[1]) << "profiling changed the gradients";
}

// A pass of `gpu` over `params` (host values) through a DeviceStore, or (store_log null)
// through flat device buffers: its stats and gradients (flat). The store's calls must be
// `*store_log`.
struct GpuPass {
  StepStats stats;
  std::vector<float> grads;
};
GpuPass RunPass(GptCuda& gpu, const Batch& batch, const std::vector<float>& params,
                ForwardBackwardOptions fb, const std::vector<std::string>* store_log) {
  const state::TensorTable& table = gpu.cpu_model().table();
  GpuPass pass;
  absl::StatusOr<StepStats> stats;
  if (store_log != nullptr) {
    DeviceStore store(table, gpu.cpu_model().parameter_groups(), params, gpu.stream());
    fb.store = &store;
    stats = gpu.ForwardBackward(batch, nullptr, nullptr, fb);
    store.EndPass();
    EXPECT_EQ(store.log(), *store_log);
    pass.grads = store.FlatGradients();
  } else {
    Device<float> dparams(params), dgrads(table.total_elements());
    stats = gpu.ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
    pass.grads = dgrads.Host();
  }
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) pass.stats = *stats;
  return pass;
}

// The parameters GptModel::Init(42) gives `o`'s model (host values), and the calls the CPU
// model's pass over `batch` makes of a HostStore holding them: the GPU model's must be these.
struct CpuStorePass {
  std::vector<float> params;
  std::vector<std::string> calls;
};
CpuStorePass PassThroughAHostStore(const GptOptions& o, const Batch& batch) {
  CpuStorePass pass;
  absl::StatusOr<std::unique_ptr<GptModel>> cpu = GptModel::Create(o);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return pass;
  const state::TensorTable& table = (*cpu)->table();
  state::FlatBuffer params(table.total_elements()), unused;
  (*cpu)->Init(42, params);
  pass.params.assign(params.data(), params.data() + params.size());
  HostStore store(table, (*cpu)->parameter_groups(), params.data());
  ForwardBackwardOptions fb;
  fb.loss_divisor = batch.size * o.context;
  fb.store = &store;
  const absl::Status status = (*cpu)->ForwardBackward(batch, unused, unused, fb).status();
  EXPECT_TRUE(status.ok()) << status;
  store.EndPass();
  pass.calls = store.log();
  return pass;
}

void ExpectSamePass(const GpuPass& got, const GpuPass& want, const std::string& what) {
  EXPECT_EQ(got.stats.loss_sum, want.stats.loss_sum) << what;
  EXPECT_EQ(got.stats.correct, want.stats.correct) << what;
  ExpectSameBits(got.grads, want.grads, absl::StrCat(what, ", gradients"));
}

// With a ParameterStore (train/model.h) in device memory, each group's parameters and
// gradients in buffers of their own, the loss and every gradient are those of the flat
// buffers bit for bit (the same kernels on the same values), in fp32 and bf16, with and
// without checkpointing, and in fp16 without; in bf16 also with only one group's 16-bit copy
// (flat_parameters = false), over two passes with other parameters. The store checks the calls' order and
// poisons what the model may no longer read (train/nn/store_testing.h); the calls are the
// CPU model's, group for group.
TEST(GptCuda, AParameterStoreGivesTheFlatResultsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t every : {0, 1}) {
    GptOptions o = TinyOneHead();
    o.checkpoint_every = every;
    const Batch batch = RandomBatch(o, 2, 13);
    const CpuStorePass cpu = PassThroughAHostStore(o, batch);
    const std::vector<float>& host_params = cpu.params;
    const std::vector<std::string>& calls = cpu.calls;
    ForwardBackwardOptions fb;
    fb.loss_divisor = 2 * o.context;

    for (MatMulType type : {MatMulType::kFloat32, MatMulType::kBFloat16, MatMulType::kFloat16}) {
      if (type == MatMulType::kFloat16 && every != 0) continue;
      const std::string what = absl::StrCat(MatMulTypeName(type), ", checkpoint_every ", every);
      auto flat = GptCuda::Create(o, {.matmul = type}, nullptr);
      ASSERT_TRUE(flat.ok()) << flat.status();
      fb.precision = (*flat)->precision();
      // The store's pass first, so that the 16-bit copy holds nothing from a flat pass.
      const GpuPass stored = RunPass(**flat, batch, host_params, fb, &calls);
      const GpuPass want = RunPass(**flat, batch, host_params, fb, nullptr);
      ExpectSamePass(stored, want, what);
      if (type != MatMulType::kBFloat16 || every != 0) continue;

      // One group's 16-bit copy: the largest group's elements, up to 127 more to keep the
      // whole copy's alignment, lm_head's padding rows (31 of 64), and up to 127 more to
      // place lm_head's copy past the others'; every call needs a store.
      auto sharded = GptCuda::Create(o, {.matmul = type, .flat_parameters = false}, nullptr);
      ASSERT_TRUE(sharded.ok()) << sharded.status();
      const state::TensorTable& table = (*flat)->cpu_model().table();
      int64_t largest = 0;
      for (const ParameterGroup& g : (*flat)->cpu_model().parameter_groups()) {
        const state::TensorSpec& last = table.tensor(g.end_tensor - 1);
        largest = std::max(largest, last.offset + last.numel - table.tensor(g.first_tensor).offset);
      }
      EXPECT_GE((*sharded)->parameter_copy_bytes(), 2 * (largest + 31 * 64));
      EXPECT_LE((*sharded)->parameter_copy_bytes(), 2 * (largest + 127 + 31 * 64 + 127));
      EXPECT_LT((*sharded)->parameter_copy_bytes(), (*flat)->parameter_copy_bytes() / 2);
      Device<float> dparams(host_params), dgrads(table.total_elements());
      absl::Status s = (*sharded)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("flat_parameters"), std::string::npos) << s;
      ExpectSamePass(RunPass(**sharded, batch, host_params, fb, &calls), want, "one group's copy");
      // A second pass casts every group again, from the new values.
      std::vector<float> other(host_params);
      for (float& x : other) x *= 0.75f;
      ExpectSamePass(RunPass(**sharded, batch, other, fb, &calls),
                     RunPass(**flat, batch, other, fb, nullptr), "one group's copy, second pass");
    }
  }
}

// A tied head (GPT-2: the LM head is wte): the CPU model's loss and gradients in fp32 and
// bf16, padded or dense logits; with a ParameterStore the flat results bit for bit (the
// store's calls are the CPU model's: the head asks for the embeddings again, in forward and
// backward), also with one group's 16-bit copy (the head's own copy of wte keeps its padding
// rows zero) and over a second pass on other values.
TEST(GptCuda, ATiedHeadMatchesTheCpuModelAndAStore) {
  SKIP_WITHOUT_GPU();
  GptOptions o = TinyOneHead();
  o.tied_head = true;
  CompareWithCpu(MatMulType::kFloat32, 1e-4, o);
  CompareWithCpu(MatMulType::kFloat32, 1e-4, o, /*logits_alignment=*/1);
  CompareWithCpu(MatMulType::kBFloat16, 5e-2, o);
  CompareWithCpu(MatMulType::kBFloat16, 5e-2, o, /*logits_alignment=*/1);

  const Batch batch = RandomBatch(o, 2, 19);
  const CpuStorePass cpu = PassThroughAHostStore(o, batch);
  ASSERT_GE(std::count(cpu.calls.begin(), cpu.calls.end(), "P0"), 3);  // embed, head, backward
  ForwardBackwardOptions fb;
  fb.loss_divisor = 2 * o.context;
  const std::vector<uint16_t> zeros(31 * 64, 0);
  for (MatMulType type : {MatMulType::kFloat32, MatMulType::kBFloat16}) {
    const std::string what = MatMulTypeName(type);
    auto flat = GptCuda::Create(o, {.matmul = type}, nullptr);
    ASSERT_TRUE(flat.ok()) << flat.status();
    fb.precision = (*flat)->precision();
    const GpuPass want = RunPass(**flat, batch, cpu.params, fb, nullptr);
    ExpectSamePass(RunPass(**flat, batch, cpu.params, fb, &cpu.calls), want, what);
    if (type != MatMulType::kBFloat16) continue;
    // 16-bit: the whole copy, then the head's copy of wte with its 31 padding rows.
    const int64_t total = (*flat)->cpu_model().table().total_elements();
    EXPECT_GE((*flat)->parameter_copy_bytes(), 2 * (total + 128 * 64));
    EXPECT_LE((*flat)->parameter_copy_bytes(), 2 * (total + 127 + 128 * 64));
    EXPECT_EQ(GptCudaTestPeer::HeadPaddingRows(**flat), zeros) << what;
    auto sharded = GptCuda::Create(o, {.matmul = type, .flat_parameters = false}, nullptr);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ExpectSamePass(RunPass(**sharded, batch, cpu.params, fb, &cpu.calls), want, "one group's copy");
    EXPECT_EQ(GptCudaTestPeer::HeadPaddingRows(**sharded), zeros) << "one group's copy";
    std::vector<float> other(cpu.params);
    for (float& x : other) x *= 0.75f;
    ExpectSamePass(RunPass(**sharded, batch, other, fb, &cpu.calls),
                   RunPass(**flat, batch, other, fb, nullptr), "one group's copy, second pass");
  }
}

// The LM head's padding (GptCudaOptions::logits_row_alignment; Tiny's vocabulary of 97 runs
// its 16-bit products over 128): the lm_head's 16-bit copy has 31 padding rows, zero from
// Create on (fresh device memory holds garbage) whatever the casts write, also with one
// group's copy at a time (flat_parameters = false), where the other groups' copies share the
// buffer; and the cross-entropy writes zeros into dlogits' padding columns, so that NaN left
// there by earlier work (poisoned here, with the logits) does not reach the input gradient
// through the padded product (NaN x 0 = NaN): a pass over the poisoned buffers gives the
// results of the pass before it bit for bit.
TEST(GptCuda, TheLmHeadsPaddingStaysZeroAndOutOfTheResults) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = TinyOneHead();
  const Batch batch = RandomBatch(o, 2, 17);
  const CpuStorePass cpu = PassThroughAHostStore(o, batch);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 2 * o.context;
  const std::vector<uint16_t> zeros(31 * 64, 0);
  for (MatMulType type : {MatMulType::kBFloat16, MatMulType::kFloat16}) {
    for (bool flat : {true, false}) {
      const std::string what =
          absl::StrCat(MatMulTypeName(type), flat ? ", flat" : ", one group's copy");
      auto gpu = GptCuda::Create(o, {.matmul = type, .flat_parameters = flat}, nullptr);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      ASSERT_EQ((*gpu)->logits_stride(), 128);
      EXPECT_EQ(GptCudaTestPeer::HeadPaddingRows(**gpu), zeros) << what << ", after Create";
      fb.precision = (*gpu)->precision();
      const std::vector<std::string>* log = flat ? nullptr : &cpu.calls;
      const GpuPass first = RunPass(**gpu, batch, cpu.params, fb, log);
      EXPECT_TRUE(std::all_of(first.grads.begin(), first.grads.end(), [](float x) {
        return std::isfinite(x);
      })) << what;
      EXPECT_EQ(GptCudaTestPeer::HeadPaddingRows(**gpu), zeros) << what << ", after a pass";
      GptCudaTestPeer::PoisonLogits(**gpu, batch.size);
      ExpectSamePass(RunPass(**gpu, batch, cpu.params, fb, log), first,
                     absl::StrCat(what, ", over NaN logits and dlogits"));
      EXPECT_EQ(GptCudaTestPeer::HeadPaddingRows(**gpu), zeros) << what << ", after two passes";
    }
  }
}

// A store sums micro-batches itself: accumulating with one is refused, as in GptModel.
TEST(GptCuda, AccumulateWithAParameterStoreIsRefused) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = Tiny();
  auto gpu = GptCuda::Create(o, {}, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<float> zeros((*gpu)->total_elements(), 0.0f);
  DeviceStore store((*gpu)->cpu_model().table(), (*gpu)->cpu_model().parameter_groups(), zeros,
                    (*gpu)->stream());
  ForwardBackwardOptions fb;
  fb.store = &store;
  fb.accumulate = true;
  absl::Status s = (*gpu)->ForwardBackward(RandomBatch(o, 1, 2), nullptr, nullptr, fb).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("accumulate with a ParameterStore"), std::string::npos) << s;
  EXPECT_TRUE(store.log().empty());
}

TEST(GptCuda, WhatIsNotHereYetIsUnimplemented) {
  SKIP_WITHOUT_GPU();
  GptOptions o = Tiny();
  o.memory_efficient_attention = false;
  EXPECT_EQ(GptCuda::Create(o, {}, nullptr).status().code(), absl::StatusCode::kUnimplemented);
  o = Tiny();
  // 16-bit attention takes head sizes 64 and 128; Tiny's two heads have 32 channels.
  EXPECT_EQ(GptCuda::Create(o, {.matmul = MatMulType::kFloat16}, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
  absl::Status s = GptCuda::Create(o, {.matmul = MatMulType::kBFloat16}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("head size 32"), std::string::npos) << s;
  s = GptCuda::Create(o, {.logits_row_alignment = 0}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("logits_row_alignment must be >= 1"), std::string::npos) << s;
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
