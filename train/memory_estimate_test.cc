#include "train/memory_estimate.h"

#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

TEST(EstimateMemory, ZeroPaperNumbers) {
  // The ZeRO paper's example: 7.5B parameters, 64 GPUs, mixed-precision Adam:
  // 120 GB unsharded, 31.4 GB with P_os, 16.6 GB with P_os+g, 1.9 GB with P_os+g+p.
  MemoryEstimateOptions o;
  o.parameters = 7.5e9;
  o.world_size = 64;
  const double expected_gb[] = {120, 31.40625, 16.640625, 1.875};
  for (int stage = 0; stage <= 3; ++stage) {
    o.zero_stage = stage;
    auto e = EstimateMemory(o);
    ASSERT_TRUE(e.ok());
    EXPECT_NEAR(e->total_bytes() / 1e9, expected_gb[stage], 1e-9) << "stage " << stage;
    EXPECT_EQ(e->bytes_per_parameter_unsharded, 16);
  }
}

TEST(EstimateMemory, SeedsSizingExercises) {
  // 7B on 8 GPUs and 13B on 32 GPUs, mixed-precision Adam.
  MemoryEstimateOptions o;
  o.parameters = 7e9;
  o.world_size = 8;
  o.zero_stage = 0;
  EXPECT_NEAR(EstimateMemory(o)->total_bytes() / 1e9, 112, 1e-9);
  o.zero_stage = 2;
  // 2Ψ + (2 + 12)Ψ / 8 = 14 + 12.25 GB.
  EXPECT_NEAR(EstimateMemory(o)->total_bytes() / 1e9, 14 + 14 * 7.0 / 8, 1e-9);
  o.parameters = 13e9;
  o.world_size = 32;
  o.zero_stage = 3;
  EXPECT_NEAR(EstimateMemory(o)->total_bytes() / 1e9, 16 * 13.0 / 32, 1e-9);
}

TEST(EstimateMemory, Fp32AndSgd) {
  MemoryEstimateOptions o;
  o.parameters = 1e6;
  o.mixed_precision = false;
  EXPECT_EQ(EstimateMemory(o)->bytes_per_parameter_unsharded, 16);  // 4 + 4 + 8
  o.optimizer = MemoryEstimateOptions::Optimizer::kSgdMomentum;
  EXPECT_EQ(EstimateMemory(o)->bytes_per_parameter_unsharded, 12);
}

TEST(EstimateMemory, BadInputNamesTheFlag) {
  MemoryEstimateOptions o;
  EXPECT_NE(EstimateMemory(o).status().message().find("--params"), std::string::npos);
  o.parameters = 1;
  o.world_size = 0;
  EXPECT_NE(EstimateMemory(o).status().message().find("--world"), std::string::npos);
  o.world_size = 1;
  o.zero_stage = 4;
  EXPECT_NE(EstimateMemory(o).status().message().find("--zero"), std::string::npos);
}

TEST(ParseParameterCount, Suffixes) {
  EXPECT_EQ(*ParseParameterCount("7B"), 7e9);
  EXPECT_EQ(*ParseParameterCount("13e9"), 13e9);
  EXPECT_EQ(*ParseParameterCount("1.5M"), 1.5e6);
  EXPECT_EQ(*ParseParameterCount("124m"), 124e6);
  EXPECT_EQ(*ParseParameterCount("669706"), 669706);
  EXPECT_FALSE(ParseParameterCount("seven").ok());
  EXPECT_FALSE(ParseParameterCount("B").ok());
  EXPECT_FALSE(ParseParameterCount("-3B").ok());
}

}  // namespace
}  // namespace ringmaster::train
