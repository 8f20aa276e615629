// Tests of train/nn/device_arena.h: pieces are 256-byte aligned and disjoint, the arena grows
// only when a layout needs more, and a layout that fits keeps the allocation. Skips without
// a GPU.
#include "train/nn/device_arena.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"

namespace ringmaster::train::nn {
namespace {

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the device arena tests")

using kernels::cuda::testing::HaveGpu;

TEST(DeviceArena, PiecesAreAlignedDisjointAndGrowOnlyWhenNeeded) {
  SKIP_WITHOUT_GPU();
  DeviceArena arena(nullptr);
  float* a = nullptr;
  int32_t* b = nullptr;
  int64_t n = 10;
  auto place = [&](DeviceArena::Layout& l) {
    a = l.Floats(n);
    b = l.Ints(3);
  };
  ASSERT_TRUE(arena.Fit(place, "test").ok());
  EXPECT_EQ(arena.bytes(), 512);  // two pieces of 40 and 12 bytes, each rounded up to 256
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<char*>(b) - reinterpret_cast<char*>(a), 256);
  const float* first = a;

  n = 64;  // still 256 bytes: the allocation stays
  ASSERT_TRUE(arena.Fit(place, "test").ok());
  EXPECT_EQ(arena.bytes(), 512);
  EXPECT_EQ(a, first);

  n = 65;  // 260 bytes: grows
  ASSERT_TRUE(arena.Fit(place, "test").ok());
  EXPECT_EQ(arena.bytes(), 768);
  EXPECT_EQ(reinterpret_cast<char*>(b) - reinterpret_cast<char*>(a), 512);
}

TEST(DeviceArena, AnAllocationThatFailsNamesWhatAndLeavesItEmpty) {
  SKIP_WITHOUT_GPU();
  DeviceArena arena(nullptr);
  const absl::Status s = arena.Fit([](DeviceArena::Layout& l) { l.Take(int64_t{1} << 50); },
                                   "Model: activations for 7 samples");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Model: activations for 7 samples: cudaMalloc of"), std::string::npos)
      << s;
  EXPECT_EQ(arena.bytes(), 0);
}

}  // namespace
}  // namespace ringmaster::train::nn
