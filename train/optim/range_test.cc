#include "train/optim/range.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;

TEST(PiecesInRange, CutsTensorsAndSkipsPadding) {
  TensorTable table;
  table.Add("w", {4, 5});  // [0, 20), padded to 32
  table.Add("b", {3});     // [32, 35)
  table.Add("c", {17});    // [48, 65)
  EXPECT_EQ(PiecesInRange(table, FullRange(table)),
            (std::vector<TensorPiece>{{0, 0, 20}, {1, 32, 35}, {2, 48, 65}}));
  EXPECT_EQ(PiecesInRange(table, {10, 50}),
            (std::vector<TensorPiece>{{0, 10, 20}, {1, 32, 35}, {2, 48, 50}}));
  EXPECT_EQ(PiecesInRange(table, {20, 32}), std::vector<TensorPiece>{});  // padding only
  EXPECT_EQ(PiecesInRange(table, {33, 33}), std::vector<TensorPiece>{});
}

TEST(CheckRange, RejectsRangesOutsideTheTable) {
  TensorTable table;
  table.Add("w", {20});  // 32 elements
  EXPECT_TRUE(CheckRange(table, {0, 32}).ok());
  EXPECT_TRUE(CheckRange(table, {32, 32}).ok());
  for (FlatRange bad : {FlatRange{-1, 3}, FlatRange{5, 4}, FlatRange{0, 33}}) {
    absl::Status s = CheckRange(table, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << RangeString(bad);
    EXPECT_THAT(s.message(), HasSubstr(RangeString(bad)));
  }
}

TEST(Slice, ViewsTheRange) {
  std::vector<int> all = {0, 1, 2, 3, 4, 5};
  absl::Span<int> s = Slice(absl::MakeSpan(all), {2, 5});
  EXPECT_EQ(std::vector<int>(s.begin(), s.end()), (std::vector<int>{2, 3, 4}));
  EXPECT_DEATH(Slice(absl::MakeSpan(all), {4, 7}), "\\[4, 7\\) of 6 elements");
}

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
