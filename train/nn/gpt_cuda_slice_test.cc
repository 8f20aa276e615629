// GptCuda's pipeline slices (GptOptions::first_block / end_block, the Slice* calls): a model
// cut into 2 or 3 slices, chained on one device (each stage's output the next one's input,
// the gradients back the other way, fp32 device buffers between them), against the whole
// GptCuda on the same parameters and batch: the last stage's loss within 1e-6 relative,
// and every tensor's gradient, per tensor ||g_slices - g_whole|| <= 1e-5 ||g_whole||. The
// slices run the whole model's kernels on the same values (in bf16 the fp32 boundary holds
// the 16-bit residual stream exactly), so only a product's summation order may differ (a
// cuBLASLt algorithm chosen for another pointer alignment): the bound is fp32 rounding's,
// in bf16 too. Covered: fp32 with and without activation checkpointing (inside a slice
// too), deferred weight gradients (the zero-bubble split), bf16, a discarded micro-batch, a
// forward-only pass (SliceLoss), and tensor parallelism with slices together (2 ranks as
// threads with a host sum, each rank's chained slices against the whole model's gradients
// cut to its shards).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_cuda.h"
#include "train/nn/gpt_cuda_testing.h"
#include "train/nn/gpt_testing.h"

namespace ringmaster::train::nn {
namespace {

using kernels::cuda::MatMulType;
using kernels::cuda::testing::Device;
using testing::CutFlat;
using testing::ExpectClosePerTensor;
using testing::HostGroupSum;
using testing::WholeParams;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the GPU GPT tests")

constexpr double kTolerance = 1e-5;

// fp32: 4 heads of 8 channels; bf16: 2 heads of 64 (a head size the 16-bit attention takes).
GptOptions SmallFp32(int64_t layers) {
  return {.layers = layers, .heads = 4, .width = 32, .context = 8, .vocab = 37};
}
GptOptions SmallBf16(int64_t layers) {
  return {.layers = layers, .heads = 2, .width = 128, .context = 16, .vocab = 37};
}

struct ChainOptions {
  MatMulType type = MatMulType::kFloat32;
  bool defer_weights = false;
  // Run every stage's SliceBackwardWeights after all stages' SliceBackward (as a zero-bubble
  // schedule fills its bubble), not right after its own.
  bool weights_last = false;
  // Each model's tensor-parallel sum (null: none).
  std::function<void(GptCuda&)> set_sum;
  cudaStream_t stream = nullptr;
};

struct ChainRun {
  StepStats stats;           // the last stage's
  std::vector<float> grads;  // laid out as the model `o` without slices
};

// One micro-batch through `o` cut at `bounds` (first blocks of the stages after the first),
// on `whole_params` (of the unsplit model `o` with tp_size 1) cut to each slice.
ChainRun RunChain(const GptOptions& o, const std::vector<int64_t>& bounds,
                  const std::vector<float>& whole_params, const Batch& batch,
                  const ChainOptions& chain) {
  GptOptions unsplit_options = o;
  unsplit_options.tp_size = 1;
  unsplit_options.tp_rank = 0;
  std::unique_ptr<GptModel> unsplit = *GptModel::Create(unsplit_options);
  std::unique_ptr<GptModel> rank_whole = *GptModel::Create(o);  // o's tensor-parallel rank
  std::vector<int64_t> firsts = {0};
  firsts.insert(firsts.end(), bounds.begin(), bounds.end());
  const int stages = static_cast<int>(firsts.size());
  std::vector<std::unique_ptr<GptCuda>> models;
  std::vector<std::unique_ptr<Device<float>>> params, grads, acts, act_grads;
  const int64_t n = batch.size * o.context * o.width;
  for (int s = 0; s < stages; ++s) {
    GptOptions so = o;
    so.first_block = firsts[s];
    so.end_block = s + 1 < stages ? firsts[s + 1] : o.layers;
    absl::StatusOr<std::unique_ptr<GptCuda>> m =
        GptCuda::Create(so, {.matmul = chain.type}, chain.stream);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    if (chain.set_sum) chain.set_sum(**m);
    params.push_back(
        std::make_unique<Device<float>>(CutFlat((*m)->cpu_model(), *unsplit, whole_params.data())));
    grads.push_back(
        std::make_unique<Device<float>>(std::vector<float>((*m)->total_elements(), 0.0f)));
    acts.push_back(std::make_unique<Device<float>>(n));       // this stage's output
    act_grads.push_back(std::make_unique<Device<float>>(n));  // its input's gradient
    models.push_back(std::move(*m));
  }
  const Precision precision = models[0]->precision();
  for (int s = 0; s < stages; ++s) {
    const float* input = s > 0 ? acts[s - 1]->get() : nullptr;
    float* output = s + 1 < stages ? acts[s]->get() : nullptr;
    const absl::Status status = models[s]->SliceForward(batch, params[s]->get(), input, output);
    EXPECT_TRUE(status.ok()) << "stage " << s << ": " << status;
  }
  ForwardBackwardOptions fb;
  fb.loss_divisor = batch.size * o.context;
  fb.precision = precision;
  ChainRun run;
  for (int s = stages - 1; s >= 0; --s) {
    const float* output_grad = s + 1 < stages ? act_grads[s + 1]->get() : nullptr;
    float* input_grad = s > 0 ? act_grads[s]->get() : nullptr;
    absl::StatusOr<StepStats> stats =
        models[s]->SliceBackward(grads[s]->get(), fb, output_grad, input_grad, chain.defer_weights);
    EXPECT_TRUE(stats.ok()) << "stage " << s << ": " << stats.status();
    if (s == stages - 1 && stats.ok()) run.stats = *stats;
    if (chain.defer_weights && !chain.weights_last) {
      const absl::Status w = models[s]->SliceBackwardWeights(grads[s]->get(), fb);
      EXPECT_TRUE(w.ok()) << "stage " << s << ": " << w;
    }
  }
  if (chain.defer_weights && chain.weights_last) {
    for (int s = 0; s < stages; ++s) {
      const absl::Status w = models[s]->SliceBackwardWeights(grads[s]->get(), fb);
      EXPECT_TRUE(w.ok()) << "stage " << s << ": " << w;
    }
  }
  // The stages' gradients, by name, into the unsliced rank's layout.
  run.grads.assign(rank_whole->table().total_elements(), 0.0f);
  for (int s = 0; s < stages; ++s) {
    const std::vector<float> g = grads[s]->Host();
    const state::TensorTable& table = models[s]->cpu_model().table();
    for (const state::TensorSpec& t : table.tensors()) {
      const state::TensorSpec& w = rank_whole->table().tensor(*rank_whole->table().Find(t.name));
      std::copy_n(g.begin() + t.offset, t.numel, run.grads.begin() + w.offset);
    }
  }
  return run;
}

struct WholeRun {
  StepStats stats;
  std::vector<float> grads;
};

WholeRun RunWhole(const GptOptions& o, const std::vector<float>& params, const Batch& batch,
                  MatMulType type) {
  absl::StatusOr<std::unique_ptr<GptCuda>> gpu = GptCuda::Create(o, {.matmul = type}, nullptr);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!gpu.ok()) return {};
  Device<float> dparams(params), dgrads(params.size());
  ForwardBackwardOptions fb;
  fb.loss_divisor = batch.size * o.context;
  fb.precision = (*gpu)->precision();
  absl::StatusOr<StepStats> stats = (*gpu)->ForwardBackward(batch, dparams.get(), dgrads.get(), fb);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return {stats.ok() ? *stats : StepStats{}, dgrads.Host()};
}

void ExpectChainMatchesWhole(const GptOptions& o, const std::vector<int64_t>& bounds,
                             const ChainOptions& chain) {
  std::unique_ptr<GptModel> whole = *GptModel::Create(o);
  const std::vector<float> params = WholeParams(*whole);
  const Batch batch = RandomTokens(2, o, 21);
  const WholeRun want = RunWhole(o, params, batch, chain.type);
  const ChainRun got = RunChain(o, bounds, params, batch, chain);
  std::string what =
      absl::StrCat(MatMulTypeName(chain.type), " ", bounds.size() + 1, " slices, checkpoint_every ",
                   o.checkpoint_every, chain.defer_weights ? ", weights deferred" : "");
  EXPECT_NEAR(got.stats.loss_sum, want.stats.loss_sum, 1e-6 * std::fabs(want.stats.loss_sum))
      << what;
  EXPECT_EQ(got.stats.loss_terms, want.stats.loss_terms) << what;
  EXPECT_EQ(got.stats.correct, want.stats.correct) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  ExpectClosePerTensor(whole->table(), got.grads, want.grads, kTolerance, what + " gradient");
}

TEST(GptCudaSlice, TwoAndThreeSlicesGiveTheWholeModelsLossAndGradients) {
  SKIP_WITHOUT_GPU();
  ExpectChainMatchesWhole(SmallFp32(2), {1}, {});
  ExpectChainMatchesWhole(SmallFp32(4), {1, 3}, {});
}

TEST(GptCudaSlice, WithCheckpointing) {
  SKIP_WITHOUT_GPU();
  GptOptions o = SmallFp32(4);
  o.checkpoint_every = 1;  // every slice recomputes; the middle one (2 blocks) inside itself
  ExpectChainMatchesWhole(o, {1, 3}, {});
  o.checkpoint_every = 2;
  ExpectChainMatchesWhole(o, {2}, {});
}

// The zero-bubble split: the weight gradients deferred and added later give the same sums,
// with and without checkpointing (which recomputes the inputs the deferred work reads).
TEST(GptCudaSlice, DeferredWeightGradientsAddTheSameSums) {
  SKIP_WITHOUT_GPU();
  ChainOptions chain;
  chain.defer_weights = true;
  ExpectChainMatchesWhole(SmallFp32(4), {1, 3}, chain);
  chain.weights_last = true;
  GptOptions o = SmallFp32(4);
  o.checkpoint_every = 1;
  ExpectChainMatchesWhole(o, {1, 3}, chain);
}

TEST(GptCudaSlice, Bf16SlicesGiveTheWholeBf16Model) {
  SKIP_WITHOUT_GPU();
  ChainOptions chain;
  chain.type = MatMulType::kBFloat16;
  ExpectChainMatchesWhole(SmallBf16(2), {1}, chain);
  GptOptions o = SmallBf16(3);
  o.checkpoint_every = 1;
  chain.defer_weights = true;
  ExpectChainMatchesWhole(o, {1, 2}, chain);
}

// Tensor parallelism inside each slice: 2 ranks (threads, one stream each), each running its
// 2 chained slices; each rank's gradients are the whole model's cut to its shards.
TEST(GptCudaSlice, TensorParallelSlices) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = SmallFp32(2);
  const int tp = 2;
  std::unique_ptr<GptModel> whole = *GptModel::Create(o);
  const std::vector<float> params = WholeParams(*whole);
  const Batch batch = RandomTokens(2, o, 23);
  const WholeRun want = RunWhole(o, params, batch, MatMulType::kFloat32);
  HostGroupSum group(tp);
  std::vector<ChainRun> runs(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      GptOptions mine = o;
      mine.tp_size = tp;
      mine.tp_rank = r;
      ChainOptions chain;
      chain.defer_weights = true;
      chain.set_sum = [&group, r](GptCuda& m) {
        m.set_tensor_parallel_sum([&group, r](float* data, int64_t n, cudaStream_t s) {
          return group.SumOnDevice(r, data, n, s);
        });
      };
      ASSERT_EQ(cudaStreamCreate(&chain.stream), cudaSuccess);
      runs[r] = RunChain(mine, {1}, params, batch, chain);
      EXPECT_EQ(cudaStreamDestroy(chain.stream), cudaSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) {
    GptOptions mine = o;
    mine.tp_size = tp;
    mine.tp_rank = r;
    std::unique_ptr<GptModel> part = *GptModel::Create(mine);
    const std::string what = absl::StrCat("tp ", tp, " rank ", r, ", 2 slices");
    EXPECT_NEAR(runs[r].stats.loss_sum, want.stats.loss_sum, 1e-5 * std::fabs(want.stats.loss_sum))
        << what;
    // 2 + 2 sums a block; the blocks are split between the slices.
    EXPECT_EQ(group.rounds(r), 4 * o.layers) << what;
    ASSERT_EQ(runs[r].grads.size(), static_cast<size_t>(part->table().total_elements()));
    // The partial products are summed in another order: gpt_cuda_tp_test's bound.
    ExpectClosePerTensor(part->table(), runs[r].grads, CutFlat(*part, *whole, want.grads.data()),
                         1e-4, what + " gradient");
  }
}

// A forward-only pass ends with SliceLoss: the whole model's loss; a discarded micro-batch
// adds zero gradients and reports zeros.
TEST(GptCudaSlice, ForwardOnlyLossAndDiscardedMicroBatches) {
  SKIP_WITHOUT_GPU();
  const GptOptions o = SmallFp32(2);
  std::unique_ptr<GptModel> whole = *GptModel::Create(o);
  const std::vector<float> params = WholeParams(*whole);
  const Batch batch = RandomTokens(2, o, 25);
  const WholeRun want = RunWhole(o, params, batch, MatMulType::kFloat32);
  GptOptions first = o, last = o;
  first.end_block = 1;
  last.first_block = 1;
  auto m0 = GptCuda::Create(first, {}, nullptr);
  auto m1 = GptCuda::Create(last, {}, nullptr);
  ASSERT_TRUE(m0.ok() && m1.ok());
  Device<float> p0(CutFlat((*m0)->cpu_model(), *whole, params.data()));
  Device<float> p1(CutFlat((*m1)->cpu_model(), *whole, params.data()));
  Device<float> act(batch.size * o.context * o.width), dact(batch.size * o.context * o.width);
  ASSERT_TRUE((*m0)->SliceForward(batch, p0.get(), nullptr, act.get()).ok());
  ASSERT_TRUE((*m1)->SliceForward(batch, p1.get(), act.get(), nullptr).ok());
  absl::StatusOr<StepStats> loss = (*m1)->SliceLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->loss_sum, want.stats.loss_sum, 1e-6 * std::fabs(want.stats.loss_sum));
  EXPECT_EQ(loss->correct, want.stats.correct);
  EXPECT_EQ((*m1)->SliceLoss().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*m0)->SliceLoss().status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE((*m1)->SliceForward(batch, p1.get(), act.get(), nullptr).ok());
  Device<float> g1(std::vector<float>((*m1)->total_elements(), 0.0f));
  ForwardBackwardOptions fb;
  absl::StatusOr<StepStats> discarded =
      (*m1)->SliceBackward(g1.get(), fb, nullptr, dact.get(), false, /*discard=*/true);
  ASSERT_TRUE(discarded.ok()) << discarded.status();
  EXPECT_EQ(discarded->loss_sum, 0);
  EXPECT_EQ(discarded->loss_terms, 0);
  for (float x : g1.Host()) ASSERT_EQ(x, 0.0f);
  for (float x : dact.Host()) ASSERT_EQ(x, 0.0f);
}

TEST(GptCudaSlice, MisuseIsNamed) {
  SKIP_WITHOUT_GPU();
  GptOptions o = SmallFp32(2);
  o.first_block = 1;  // the last stage
  auto m = GptCuda::Create(o, {}, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  Device<float> p((*m)->total_elements()), g((*m)->total_elements());
  Device<float> act(2 * o.context * o.width);
  const Batch batch = RandomTokens(2, o, 1);
  ForwardBackwardOptions fb;
  absl::Status s = (*m)->ForwardBackward(batch, p.get(), g.get(), fb).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("SliceForward"), std::string::npos) << s;
  s = (*m)->SliceBackward(g.get(), fb, nullptr, act.get(), false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  s = (*m)->SliceForward(batch, p.get(), nullptr, nullptr);  // a later stage needs its input
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("input must be a device pointer"), std::string::npos) << s;
  s = (*m)->SliceForward(batch, p.get(), act.get(), act.get());  // the last has no output
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("output must be null"), std::string::npos) << s;
  EXPECT_EQ((*m)->SliceBackwardWeights(g.get(), fb).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ringmaster::train::nn
