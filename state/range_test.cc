#include "state/range.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::state {
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

TEST(CheckPlacement, AcceptsDisjointPiecesAndNamesTheFirstBadOne) {
  TensorTable table;
  table.Add("w", {64});  // [0, 64)
  // Two units of 32, each cut in two for two ranks: rank 1 holds [16, 32) and [48, 64).
  const std::vector<PlacedRange> rank1 = {{{16, 32}, 0}, {{48, 64}, 16}};
  EXPECT_TRUE(CheckPlacement(table, rank1, 32).ok());
  EXPECT_EQ(PlacedElements(rank1), 32);
  EXPECT_TRUE(CheckPlacement(table, {InPlace({0, 64})}, 64).ok());

  auto fails = [&](std::vector<PlacedRange> pieces, int64_t local, const std::string& what) {
    absl::Status s = CheckPlacement(table, pieces, local);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(s.message(), HasSubstr(what));
  };
  fails({{{16, 32}, 0}, {{48, 64}, 16}}, 31, "piece 1 ([48, 64) at 16): its local span");
  fails({{{48, 64}, 0}, {{16, 32}, 16}}, 32, "piece 1 ([16, 32) at 16): overlaps or comes before");
  fails({{{0, 65}, 0}}, 65, "piece 0 ([0, 65) at 0): range [0, 65) is not inside");
  fails({{{0, 16}, 0}, {{16, 32}, 8}}, 32, "local spans [0, 16) and [8, 24) overlap");
}

TEST(Slice, ViewsTheRange) {
  std::vector<int> all = {0, 1, 2, 3, 4, 5};
  absl::Span<int> s = Slice(absl::MakeSpan(all), {2, 5});
  EXPECT_EQ(std::vector<int>(s.begin(), s.end()), (std::vector<int>{2, 3, 4}));
  EXPECT_DEATH(Slice(absl::MakeSpan(all), {4, 7}), "\\[4, 7\\) of 6 elements");
}

}  // namespace
}  // namespace ringmaster::state
