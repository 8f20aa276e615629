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

TEST(Slice, ViewsTheRange) {
  std::vector<int> all = {0, 1, 2, 3, 4, 5};
  absl::Span<int> s = Slice(absl::MakeSpan(all), {2, 5});
  EXPECT_EQ(std::vector<int>(s.begin(), s.end()), (std::vector<int>{2, 3, 4}));
  EXPECT_DEATH(Slice(absl::MakeSpan(all), {4, 7}), "\\[4, 7\\) of 6 elements");
}

}  // namespace
}  // namespace ringmaster::state
