#include "train/data/partition.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;

TEST(SplitEvenlyTest, ExampleWithRemainder) {
  std::vector<Range> shares;
  for (int rank = 0; rank < 4; ++rank) shares.push_back(RankShare(10, 4, rank));
  EXPECT_EQ(shares, (std::vector<Range>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(RankShare(2, 4, 3), (Range{2, 2}));
  EXPECT_EQ(MicroShare(Range{6, 8}, 3, 0), (Range{6, 7}));
  EXPECT_EQ(MicroShare(Range{6, 8}, 3, 2), (Range{8, 8}));
}

TEST(SplitEvenlyTest, ContiguousCoveringAndBalanced) {
  for (int64_t count = 0; count <= 60; ++count) {
    for (int64_t parts = 1; parts <= 9; ++parts) {
      int64_t expected_begin = 0, smallest = count, largest = 0, previous = count;
      for (int64_t p = 0; p < parts; ++p) {
        const Range r = SplitEvenly(count, parts, p);
        ASSERT_EQ(r.begin, expected_begin) << count << "/" << parts << " part " << p;
        ASSERT_LE(r.size(), previous) << "earlier parts get the extra";
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
        previous = r.size();
        expected_begin = r.end;
      }
      EXPECT_EQ(expected_begin, count);
      EXPECT_LE(largest - smallest, 1) << count << "/" << parts;
    }
  }
}

// The smallest accumulation count that keeps every micro-batch of every rank within m,
// found by trying counts in turn.
int SmallestAccumulation(int64_t b, int w, int64_t m) {
  for (int a = 1;; ++a) {
    int64_t largest = 0;
    for (int rank = 0; rank < w; ++rank) {
      for (int micro = 0; micro < a; ++micro) {
        largest = std::max(largest, MicroShare(RankShare(b, w, rank), a, micro).size());
      }
    }
    if (largest <= m) return a;
  }
}

TEST(PlanBatchesTest, AwkwardSizes) {
  // 1000 over 3 ranks with micro-batches of at most 64: shares 334/333/333, 6 steps,
  // rank 0 runs 56, 56, 56, 56, 55, 55.
  auto plan = PlanBatches({.global_batch = 1000, .world_size = 3, .max_micro_batch = 64});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->accumulation_steps, 6);
  EXPECT_EQ(plan->max_rank_share, 334);
  EXPECT_EQ(plan->max_micro_batch, 56);
  EXPECT_EQ(plan->MicroBatch(1000, 0, 4), (Range{224, 279}));
  EXPECT_EQ(plan->MicroBatch(1000, 1, 0), (Range{334, 390}));
  EXPECT_EQ(plan->DebugString(), "B=1000 W=3: 6 micro-batches of <= 56 per rank");
  // The short last batch of an epoch (e.g. 7 samples) spreads the same way.
  EXPECT_EQ(plan->MicroBatch(7, 0, 0), (Range{0, 1}));
  EXPECT_EQ(plan->MicroBatch(7, 2, 5), (Range{7, 7}));

  // Fewer samples than ranks: the last ranks get nothing.
  plan = PlanBatches({.global_batch = 3, .world_size = 8, .max_micro_batch = 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->accumulation_steps, 1);
  EXPECT_TRUE(plan->MicroBatch(3, 5, 0).empty());
}

TEST(PlanBatchesTest, AccumulationIsTheSmallestThatFits) {
  for (int64_t b = 1; b <= 130; b += 3) {
    for (int w = 1; w <= 8; ++w) {
      for (int64_t m = 1; m <= 20; ++m) {
        auto plan = PlanBatches({.global_batch = b, .world_size = w, .max_micro_batch = m});
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_EQ(plan->accumulation_steps, SmallestAccumulation(b, w, m))
            << "B " << b << " W " << w << " m " << m;
        EXPECT_LE(plan->max_micro_batch, m);
        EXPECT_EQ(plan->max_micro_batch, plan->MicroBatch(b, 0, 0).size());
      }
    }
  }
}

TEST(PlanBatchesTest, RequestedAccumulation) {
  auto plan = PlanBatches({.global_batch = 10, .world_size = 3, .accumulation_steps = 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Shares 4, 3, 3; micro-batches 2+2, 2+1, 2+1.
  EXPECT_EQ(plan->accumulation_steps, 2);
  EXPECT_EQ(plan->max_micro_batch, 2);
  EXPECT_EQ(plan->MicroBatch(10, 1, 1), (Range{6, 7}));
  EXPECT_EQ(plan->MicroBatch(10, 2, 0), (Range{7, 9}));
}

TEST(PlanBatchesTest, RejectsBadOptions) {
  auto code = [](BatchPlanOptions o) { return PlanBatches(o).status().code(); };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code({.global_batch = 0, .world_size = 1, .max_micro_batch = 1}), kInvalid);
  EXPECT_EQ(code({.global_batch = 8, .world_size = 0, .max_micro_batch = 1}), kInvalid);
  EXPECT_EQ(code({.global_batch = 8, .world_size = 2}), kInvalid);
  EXPECT_EQ(
      code({.global_batch = 8, .world_size = 2, .max_micro_batch = 2, .accumulation_steps = 2}),
      kInvalid);
  auto too_many = PlanBatches({.global_batch = 8, .world_size = 4, .accumulation_steps = 3});
  EXPECT_EQ(too_many.status().code(), kInvalid);
  EXPECT_THAT(too_many.status().message(), HasSubstr("accumulation_steps 3"));
  EXPECT_TRUE(PlanBatches({.global_batch = 8, .world_size = 4, .accumulation_steps = 2}).ok());
}

TEST(EvaluationBatchesTest, InOrderOnOneRank) {
  std::vector<Range> batches = EvaluationBatches(10000, 128, 1, 0);
  ASSERT_EQ(batches.size(), 79u);  // 78 * 128 = 9984, then 16
  EXPECT_EQ(batches.front(), (Range{0, 128}));
  EXPECT_EQ(batches.back(), (Range{9984, 10000}));
  EXPECT_EQ(RangeIndices(batches.back()).front(), 9984);
  EXPECT_EQ(RangeIndices(batches.back()).size(), 16u);
}

TEST(EvaluationBatchesTest, RanksCoverTheSetOnceInOrder) {
  for (int world = 1; world <= 8; ++world) {
    std::vector<int64_t> all;
    for (int rank = 0; rank < world; ++rank) {
      for (const Range& batch : EvaluationBatches(1003, 64, world, rank)) {
        ASSERT_LE(batch.size(), 64);
        ASSERT_FALSE(batch.empty());
        std::vector<int64_t> indices = RangeIndices(batch);
        all.insert(all.end(), indices.begin(), indices.end());
      }
    }
    ASSERT_EQ(all.size(), 1003u) << "world " << world;
    for (int64_t i = 0; i < 1003; ++i) ASSERT_EQ(all[i], i) << "world " << world;
  }
  EXPECT_TRUE(EvaluationBatches(2, 64, 4, 3).empty());
}

}  // namespace
}  // namespace ringmaster::train::data
