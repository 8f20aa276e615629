#include "kernels/embedding_index.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(IndexTokens, GroupsPositionsByTokenInAscendingOrder) {
  // batch 2, seq_len 4: tokens 5 at (0,0) (0,2) (1,3); 2 at (0,1) (1,0); 9 at (0,3) (1,1)
  // (1,2).
  const std::vector<int32_t> tokens = {5, 2, 5, 9, 2, 9, 9, 5};
  absl::StatusOr<EmbeddingIndex> index = IndexTokens(tokens.data(), 2, 4, 10);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->groups, 3);
  EXPECT_THAT(index->ints, ElementsAre(2, 5, 9,        // tokens, ascending
                                       0, 2, 5, 8,     // starts
                                       1, 4,           // token 2's positions
                                       0, 2, 7,        // token 5's
                                       3, 5, 6));      // token 9's
  EXPECT_LE(static_cast<int64_t>(index->ints.size()), EmbeddingIndexInts(2, 4));
}

TEST(IndexTokens, AllDistinctAndAllEqualBatches) {
  const std::vector<int32_t> distinct = {3, 0, 2, 1};
  absl::StatusOr<EmbeddingIndex> a = IndexTokens(distinct.data(), 1, 4, 4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->groups, 4);
  EXPECT_THAT(a->ints, ElementsAre(0, 1, 2, 3, 0, 1, 2, 3, 4, 1, 3, 2, 0));
  EXPECT_EQ(static_cast<int64_t>(a->ints.size()), EmbeddingIndexInts(1, 4));  // the most
  const std::vector<int32_t> same(6, 7);
  absl::StatusOr<EmbeddingIndex> b = IndexTokens(same.data(), 3, 2, 8);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->groups, 1);
  EXPECT_THAT(b->ints, ElementsAre(7, 0, 6, 0, 1, 2, 3, 4, 5));
}

TEST(IndexTokens, BadInputIsNamed) {
  const std::vector<int32_t> tokens = {1, 2, 50257, 3};
  absl::Status s = IndexTokens(tokens.data(), 2, 2, 50257).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token id 50257 at batch row 1, position 0"));
  const std::vector<int32_t> negative = {-1};
  EXPECT_THAT(IndexTokens(negative.data(), 1, 1, 4).status().message(), HasSubstr("token id -1"));
  EXPECT_THAT(IndexTokens(tokens.data(), 0, 2, 4).status().message(), HasSubstr("batch"));
  EXPECT_THAT(IndexTokens(tokens.data(), 1, 0, 4).status().message(), HasSubstr("seq_len"));
  EXPECT_THAT(IndexTokens(nullptr, 1, 1, 4).status().message(), HasSubstr("tokens is null"));
  EXPECT_THAT(IndexTokens(tokens.data(), 1 << 20, 1 << 12, 4).status().message(),
              HasSubstr("below 2^31"));
}

}  // namespace
}  // namespace ringmaster::kernels
