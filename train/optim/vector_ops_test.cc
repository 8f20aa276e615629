#include "train/optim/vector_ops.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"

namespace ringmaster::train {
namespace {

TEST(HostVectorOps, AllocatesZeroedBuffersAndMovesThem) {
  VectorOps* ops = HostVectorOps();
  EXPECT_STREQ(ops->name(), "host");
  EXPECT_FALSE(ops->device_memory());
  absl::StatusOr<OpsBuffer> a = ops->Allocate(1000);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 1000);
  for (float v : a->span()) EXPECT_EQ(v, 0.0f);
  a->data()[7] = 3;
  OpsBuffer b = *std::move(a);
  EXPECT_EQ(b.data()[7], 3);
  OpsBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.size(), 1000);
  EXPECT_EQ(b.data(), nullptr);

  absl::StatusOr<OpsBuffer> empty = ops->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
  EXPECT_EQ(ops->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostVectorOps, CopiesAndSumsAsTheKernels) {
  VectorOps* ops = HostVectorOps();
  std::vector<float> host = {1, -2, 3, 0.5f};
  absl::StatusOr<OpsBuffer> buf = ops->Allocate(4);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(ops->CopyFromHost(host.data(), buf->span()).ok());
  absl::StatusOr<double> sq = ops->SumOfSquares(buf->span());
  ASSERT_TRUE(sq.ok());
  EXPECT_DOUBLE_EQ(*sq, 1 + 4 + 9 + 0.25);
  absl::StatusOr<bool> bad = ops->ScaleAndFindNonFinite(buf->span(), 2.0f);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(*bad);
  std::vector<float> back(4);
  ASSERT_TRUE(ops->CopyToHost(buf->span(), back.data()).ok());
  EXPECT_EQ(back, (std::vector<float>{2, -4, 6, 1}));
  bad = ops->ScaleAndFindNonFinite(buf->span(), std::numeric_limits<float>::infinity());
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(*bad);
  ASSERT_TRUE(ops->Zero(buf->span()).ok());
  ASSERT_TRUE(ops->CopyToHost(buf->span(), back.data()).ok());
  EXPECT_EQ(back, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(ops->Mark(), 0);
  EXPECT_TRUE(ops->Wait(0).ok());
  EXPECT_TRUE(ops->Synchronize().ok());
}

TEST(HostVectorOps, AddsAndRoundsToHalvesAndBack) {
  VectorOps* ops = HostVectorOps();
  std::vector<float> to = {1, 2, 3};
  const std::vector<float> from = {0.5f, -2, 1e-3f};
  ASSERT_TRUE(ops->Add(from, absl::MakeSpan(to)).ok());
  EXPECT_EQ(to, (std::vector<float>{1.5f, 0, 3 + 1e-3f}));
  // 1 + 2^-9 is halfway between two bf16 values (ties to even: 1) and exact in fp16;
  // 1 + 3 * 2^-9 rounds up in bf16; 70000 overflows fp16 to infinity.
  const std::vector<float> x = {1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-9f, -2.5f, 70000.0f};
  std::vector<uint16_t> half(x.size());
  std::vector<float> back(x.size());
  for (bool bf16 : {true, false}) {
    ASSERT_TRUE(ops->ToHalf(bf16, x, half.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(half[i], bf16 ? kernels::FloatToBFloat16(x[i]) : kernels::FloatToFloat16(x[i]))
          << i;
    }
    ASSERT_TRUE(ops->FromHalf(bf16, half.data(), absl::MakeSpan(back)).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(back[i], bf16 ? kernels::BFloat16ToFloat(half[i]) : kernels::Float16ToFloat(half[i]))
          << i;
    }
  }
  EXPECT_EQ(back[0], 1.0f + 0x1p-9f);  // fp16 keeps it
  EXPECT_EQ(back[3], std::numeric_limits<float>::infinity());
  ASSERT_TRUE(ops->ToHalf(true, x, half.data()).ok());
  ASSERT_TRUE(ops->FromHalf(true, half.data(), absl::MakeSpan(back)).ok());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 0x1p-7f);
  EXPECT_EQ(back[2], -2.5f);
}

}  // namespace
}  // namespace ringmaster::train
