// The optimizers, clipping and the loss scaler over CudaVectorOps against the same code over
// host memory (HostVectorOps), on testing::SmallModelTable (its ranges cut inside tensors):
// SGD (plain, momentum, Nesterov) bit for bit (sgd.h rounds like the CPU); AdamW and LAMB
// params and moments within 1e-6 (1 + |host|) after 3 steps (fused multiply-adds may differ
// in the last bit, kernels/cuda/elementwise_test.cc); the clipped norm relative 1e-9 and the
// clipped values within 1e-6 (1 + |host|); the loss scaler's verdicts, an overflow injected;
// Add, ToHalf and FromHalf (both formats) bit for bit, on an odd count (a 16-bit buffer's
// last float half used), with rounding ties, fp16 overflow and subnormals, +-inf, NaN, -0.
// Skips without a GPU.
#include "train/optim/cuda_vector_ops.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "train/optim/clip.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/optimizer.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

std::vector<float> ToHost(VectorOps* ops, absl::Span<const float> x) {
  std::vector<float> out(x.size());
  EXPECT_TRUE(ops->CopyToHost(x, out.data()).ok());
  return out;
}

void ExpectClose(const std::vector<float>& gpu, absl::Span<const float> host, double tolerance,
                 const char* what) {
  ASSERT_EQ(gpu.size(), host.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (tolerance == 0) {
      ASSERT_EQ(gpu[i], host[i]) << what << " [" << i << "]";
    } else {
      ASSERT_LE(std::abs(gpu[i] - host[i]), tolerance * (1 + std::abs(host[i])))
          << what << " [" << i << "]: gpu " << gpu[i] << ", host " << host[i];
    }
  }
}

class CudaVectorOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RM_SKIP_WITHOUT_GPU("the CUDA VectorOps tests");
    auto ops = CudaVectorOps::Create(nullptr);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = *std::move(ops);
  }
  std::unique_ptr<CudaVectorOps> ops_;
};

TEST_F(CudaVectorOpsTest, OptimizersMatchTheHost) {
  const state::TensorTable table = testing::SmallModelTable();
  const std::vector<std::pair<OptimizerOptions, double>> cases = {
      {SgdOptions{.momentum = 0, .weight_decay = 0.01}, 0},
      {SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 1e-3}, 0},
      {AdamWOptions{}, 1e-6},
      {LambOptions{}, 1e-6},
  };
  for (const auto& [options, tolerance] : cases) {
    for (const state::FlatRange& range : testing::Shards(table, 3)) {
      auto host = CreateOptimizer(table, range, options);
      auto gpu = CreateOptimizer(table, range, options, ops_.get());
      ASSERT_TRUE(host.ok() && gpu.ok());
      state::FlatBuffer params(table.total_elements());
      testing::FillRandom(table, 7, 1.0f, params);
      auto dparams = ops_->Allocate(range.size());
      auto dgrads = ops_->Allocate(range.size());
      ASSERT_TRUE(dparams.ok() && dgrads.ok());
      absl::Span<float> p = state::Slice(params.span(), range);
      ASSERT_TRUE(ops_->CopyFromHost(p.data(), dparams->span()).ok());
      for (int step = 0; step < 3; ++step) {
        state::FlatBuffer grads(table.total_elements());
        testing::FillRandom(table, 100 + step, 0.1f, grads);
        absl::Span<float> g = state::Slice(grads.span(), range);
        ASSERT_TRUE(ops_->CopyFromHost(g.data(), dgrads->span()).ok());
        ASSERT_TRUE((*host)->Step(1e-2, p, g, SumOnOneRank).ok());
        ASSERT_TRUE((*gpu)->Step(1e-2, dparams->span(), dgrads->span(), SumOnOneRank).ok());
      }
      EXPECT_EQ((*gpu)->step(), 3);
      ExpectClose(ToHost(ops_.get(), dparams->span()), p, tolerance, "params");
      std::vector<StateBuffer> hs = (*host)->state_buffers(), gs = (*gpu)->state_buffers();
      ASSERT_EQ(hs.size(), gs.size());
      for (size_t i = 0; i < hs.size(); ++i) {
        ExpectClose(ToHost(ops_.get(), gs[i].data), hs[i].data, tolerance, hs[i].name.c_str());
      }
    }
  }
}

TEST_F(CudaVectorOpsTest, ClippingAndLossScalingMatchTheHost) {
  const state::TensorTable table = testing::SmallModelTable();
  state::FlatBuffer grads(table.total_elements());
  testing::FillRandom(table, 3, 10.0f, grads);
  auto dgrads = ops_->Allocate(grads.size());
  ASSERT_TRUE(dgrads.ok());
  ASSERT_TRUE(ops_->CopyFromHost(grads.data(), dgrads->span()).ok());

  auto host_scaler = LossScaler::Create({});
  auto gpu_scaler = LossScaler::Create({});
  ASSERT_TRUE(host_scaler.ok() && gpu_scaler.ok());
  auto host_verdict = host_scaler->UnscaleAndUpdate(grads.span(), SumOnOneRank);
  auto gpu_verdict = gpu_scaler->UnscaleAndUpdate(dgrads->span(), SumOnOneRank, ops_.get());
  ASSERT_TRUE(host_verdict.ok() && gpu_verdict.ok());
  EXPECT_EQ(*gpu_verdict, StepVerdict::kApply);
  EXPECT_EQ(*host_verdict, *gpu_verdict);

  auto host_norm = ClipGradNorm(grads.span(), {.max_norm = 1e-3}, SumOnOneRank);
  auto gpu_norm = ClipGradNorm(dgrads->span(), {.max_norm = 1e-3}, SumOnOneRank, ops_.get());
  ASSERT_TRUE(host_norm.ok() && gpu_norm.ok());
  EXPECT_NEAR(gpu_norm->norm, host_norm->norm, 1e-9 * host_norm->norm);
  EXPECT_LT(gpu_norm->scale, 1);
  ExpectClose(ToHost(ops_.get(), dgrads->span()), grads.span(), 1e-6, "clipped gradients");

  // An overflow on the device: the step is skipped and the scale backs off.
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(ops_->CopyFromHost(&inf, dgrads->span().subspan(5, 1)).ok());
  gpu_verdict = gpu_scaler->UnscaleAndUpdate(dgrads->span(), SumOnOneRank, ops_.get());
  ASSERT_TRUE(gpu_verdict.ok());
  EXPECT_EQ(*gpu_verdict, StepVerdict::kSkip);
  EXPECT_EQ(gpu_scaler->state().skipped_steps, 1);
  EXPECT_EQ(gpu_scaler->scale(), 65536 * 0.5f);
}

TEST_F(CudaVectorOpsTest, MarksOrderWorkAcrossThreads) {
  auto a = ops_->Allocate(1 << 20);
  ASSERT_TRUE(a.ok());
  std::vector<float> ones(1 << 20, 1.0f);
  ASSERT_TRUE(ops_->CopyFromHost(ones.data(), a->span()).ok());
  ASSERT_TRUE(ops_->ScaleAndFindNonFinite(a->span(), 3.0f).ok());
  const int mark = ops_->Mark();
  ASSERT_TRUE(ops_->Wait(mark).ok());
  EXPECT_EQ(ToHost(ops_.get(), a->span().subspan(12345, 1))[0], 3.0f);
  EXPECT_EQ(ops_->Wait(-1).code(), absl::StatusCode::kInvalidArgument);
}

template <typename T>
std::vector<uint32_t> Bits(const std::vector<T>& v) {
  std::vector<uint32_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (sizeof(T) == sizeof(uint32_t)) {
      std::memcpy(&bits[i], &v[i], sizeof(T));
    } else {
      bits[i] = v[i];
    }
  }
  return bits;
}

// n 16-bit values of the device buffer `half` (n + 1) / 2 floats long, and the one after them
// when n is odd (the padding of the last float).
std::vector<uint16_t> HalvesToHost(VectorOps* ops, absl::Span<const float> half) {
  const std::vector<float> floats = ToHost(ops, half);
  std::vector<uint16_t> out(2 * floats.size());
  std::memcpy(out.data(), floats.data(), floats.size() * sizeof(float));
  return out;
}

TEST_F(CudaVectorOpsTest, AddAndHalvesMatchTheHostBitForBit) {
  constexpr size_t kN = 1001;  // odd: the last float of a 16-bit buffer holds one value
  const float inf = std::numeric_limits<float>::infinity();
  // Ties of bf16 (1 + 2^-9 to even: 1; 1 + 3 2^-9 up) and of fp16 (1 + 2^-11, 1 + 3 2^-11),
  // fp16's overflow (65519 down to 65504, 65520 a tie to inf, 70000) and subnormals (2^-24,
  // 2^-25 a tie to 0, 3 2^-25 a tie up), bf16's top (FLT_MAX to inf), +-inf, NaN, -0.
  std::vector<float> x = {1.0f + 0x1p-9f,
                          1.0f + 3 * 0x1p-9f,
                          1.0f + 0x1p-11f,
                          1.0f + 3 * 0x1p-11f,
                          65519.0f,
                          65520.0f,
                          -65520.0f,
                          70000.0f,
                          -70000.0f,
                          0x1p-24f,
                          0x1p-25f,
                          3 * 0x1p-25f,
                          -1e-6f,
                          std::numeric_limits<float>::max(),
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          -0.0f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);  // fp16 subnormals to overflow
  while (x.size() < kN) x.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  std::vector<float> y(kN);
  for (float& v : y) v = std::ldexp(mantissa(rng), exponent(rng));

  auto dx = ops_->Allocate(kN);
  auto dy = ops_->Allocate(kN);
  auto dback = ops_->Allocate(kN);
  auto dhalf = ops_->Allocate((kN + 1) / 2);
  ASSERT_TRUE(dx.ok() && dy.ok() && dback.ok() && dhalf.ok());
  ASSERT_TRUE(ops_->CopyFromHost(x.data(), dx->span()).ok());
  ASSERT_TRUE(ops_->CopyFromHost(y.data(), dy->span()).ok());
  VectorOps* host = HostVectorOps();

  ASSERT_TRUE(ops_->Add(dx->span(), dy->span()).ok());
  std::vector<float> sum = y;
  ASSERT_TRUE(host->Add(x, absl::MakeSpan(sum)).ok());
  // x holds a NaN: the GPU's sum is its canonical NaN, the host's keeps the payload.
  kernels::cuda::testing::ExpectSameValueBits(ToHost(ops_.get(), dy->span()), sum, "Add");

  auto* dhalf_bits = reinterpret_cast<uint16_t*>(dhalf->data());
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    ASSERT_TRUE(ops_->ToHalf(bf16, dx->span(), dhalf_bits).ok());
    std::vector<uint16_t> want(kN);
    ASSERT_TRUE(host->ToHalf(bf16, x, want.data()).ok());
    std::vector<uint16_t> got = HalvesToHost(ops_.get(), dhalf->span());
    EXPECT_EQ(got[kN], 0) << "the padding after the last value was written";
    got.resize(kN);
    EXPECT_EQ(got, want);

    ASSERT_TRUE(ops_->FromHalf(bf16, dhalf_bits, dback->span()).ok());
    std::vector<float> back(kN);
    ASSERT_TRUE(host->FromHalf(bf16, want.data(), absl::MakeSpan(back)).ok());
    EXPECT_EQ(Bits(ToHost(ops_.get(), dback->span())), Bits(back));
  }
  // The cases the host test works out by hand, through the device.
  ASSERT_TRUE(ops_->ToHalf(false, dx->span(), dhalf_bits).ok());
  ASSERT_TRUE(ops_->FromHalf(false, dhalf_bits, dback->span()).ok());
  std::vector<float> back = ToHost(ops_.get(), dback->span());
  EXPECT_EQ(back[0], 1.0f + 0x1p-9f);  // exact in fp16
  EXPECT_EQ(back[4], 65504.0f);
  EXPECT_EQ(back[5], inf);
  EXPECT_EQ(back[9], 0x1p-24f);
  EXPECT_EQ(back[10], 0.0f);
  ASSERT_TRUE(ops_->ToHalf(true, dx->span(), dhalf_bits).ok());
  ASSERT_TRUE(ops_->FromHalf(true, dhalf_bits, dback->span()).ok());
  back = ToHost(ops_.get(), dback->span());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 0x1p-7f);
  EXPECT_EQ(back[13], inf);
  EXPECT_TRUE(std::isnan(back[16]));
}

TEST_F(CudaVectorOpsTest, AddChecksItsSpans) {
  auto a = ops_->Allocate(8);
  ASSERT_TRUE(a.ok());
  absl::Status s = ops_->Add(a->span().subspan(0, 4), a->span().subspan(4, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("Add (CUDA): 4 floats into 3"), std::string::npos) << s;
  s = ops_->Add(a->span().subspan(0, 4), a->span().subspan(2, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(ops_->Add({}, {}).ok());
  EXPECT_TRUE(ops_->ToHalf(true, {}, nullptr).ok());
  EXPECT_TRUE(ops_->FromHalf(false, nullptr, {}).ok());
}

}  // namespace
}  // namespace ringmaster::train
