// The shard helpers of train/optim/testing.h and the SumAcrossRanks hook.
#include "train/optim/sum_across_ranks.h"

#include <vector>

#include "gtest/gtest.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

using state::FlatRange;
using state::TensorSpec;
using state::TensorTable;

TEST(Shards, CoverTheTableAndCutTensors) {
  const TensorTable table = testing::SmallModelTable();
  EXPECT_EQ(table.total_elements(), 160);
  const int kCutTensors[] = {0, 1, 2, 2, 4};  // the 4-shard cuts put one in padding
  for (int shards = 1; shards <= 5; ++shards) {
    const std::vector<FlatRange> ranges = testing::Shards(table, shards);
    ASSERT_EQ(static_cast<int>(ranges.size()), shards);
    EXPECT_EQ(ranges.front().begin, 0);
    EXPECT_EQ(ranges.back().end, table.total_elements());
    int cut_tensors = 0;
    for (int i = 1; i < shards; ++i) {
      EXPECT_EQ(ranges[i].begin, ranges[i - 1].end);
      for (const TensorSpec& t : table.tensors()) {
        cut_tensors += t.offset < ranges[i].begin && ranges[i].begin < t.offset + t.numel;
      }
    }
    EXPECT_EQ(cut_tensors, kCutTensors[shards - 1]) << shards;
  }
}

TEST(FakeRanks, EveryRankGetsTheTotalsEachRound) {
  testing::FakeRanks ranks(3);
  std::vector<std::vector<double>> got(3);
  ranks.Run([&](int rank, const SumAcrossRanks& sum) {
    for (int round = 0; round < 4; ++round) {
      std::vector<double> v = {1.0 * rank, 10.0 * round};
      ASSERT_TRUE(sum(absl::MakeSpan(v)).ok());
      got[rank].insert(got[rank].end(), v.begin(), v.end());
    }
  });
  const std::vector<double> want = {3, 0, 3, 30, 3, 60, 3, 90};
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(got[rank], want) << rank;
  EXPECT_EQ(ranks.rounds(), 4);
}

TEST(SumOnOneRank, LeavesValues) {
  std::vector<double> v = {1.5, -2};
  EXPECT_TRUE(SumOnOneRank(absl::MakeSpan(v)).ok());
  EXPECT_EQ(v, (std::vector<double>{1.5, -2}));
}

}  // namespace
}  // namespace ringmaster::train
