#include "train/optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;

double ReferenceNorm(const state::FlatBuffer& g) {
  double s = 0;
  for (int64_t i = 0; i < g.size(); ++i) s += double{g.data()[i]} * g.data()[i];
  return std::sqrt(s);
}

bool SameBits(const state::FlatBuffer& a, const state::FlatBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

state::FlatBuffer Gradients(const state::TensorTable& table, uint64_t seed) {
  state::FlatBuffer g(table.total_elements());
  testing::FillRandom(table, seed, 1.0f, g);
  return g;
}

class ClipTest : public ::testing::Test {
 protected:
  const state::TensorTable table_ = testing::SmallModelTable();
  state::FlatBuffer grads_ = Gradients(table_, 11);
  const state::FlatBuffer original_ = Gradients(table_, 11);
};

TEST_F(ClipTest, ScalesDownToMaxNorm) {
  const double norm = ReferenceNorm(grads_);
  ASSERT_GT(norm, 5);  // 147 standard normal values
  auto result = ClipGradNorm(grads_.span(), {.max_norm = 2}, SumOnOneRank);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->finite());
  EXPECT_NEAR(result->norm, norm, 1e-12 * norm);
  const double scale = 2 / (norm + 1e-6);
  EXPECT_NEAR(result->scale, scale, 1e-15);
  for (int64_t i = 0; i < grads_.size(); ++i) {
    ASSERT_FLOAT_EQ(grads_.data()[i], original_.data()[i] * scale) << i;
  }
  EXPECT_NEAR(ReferenceNorm(grads_), 2, 1e-5);
}

TEST_F(ClipTest, LeavesGradientsUnderMaxNorm) {
  auto result = ClipGradNorm(grads_.span(), {.max_norm = 1000}, SumOnOneRank);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->scale, 1);
  EXPECT_TRUE(SameBits(grads_, original_));
}

TEST_F(ClipTest, MaxNormZeroOnlyMeasures) {
  auto result = ClipGradNorm(grads_.span(), {}, SumOnOneRank);
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->norm, ReferenceNorm(original_), 1e-12 * result->norm);
  EXPECT_EQ(result->scale, 1);
  EXPECT_TRUE(SameBits(grads_, original_));
}

// Duplicates (held here, counted elsewhere) are left out of the norm and still scaled.
TEST_F(ClipTest, DuplicatesAreNotCountedButAreClipped) {
  const int64_t n = grads_.size();
  const std::vector<state::FlatRange> dups = {{0, 10}, {40, 41}, {n - 7, n}};
  double counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool dup = std::any_of(dups.begin(), dups.end(), [&](const state::FlatRange& r) {
      return i >= r.begin && i < r.end;
    });
    if (!dup) counted += double{grads_.data()[i]} * grads_.data()[i];
  }
  auto result = ClipGradNorm(grads_.span(), {.max_norm = 1}, SumOnOneRank, HostVectorOps(), dups);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->norm, std::sqrt(counted), 1e-9 * std::sqrt(counted));
  EXPECT_LT(result->norm, ReferenceNorm(original_));
  for (const state::FlatRange& r : dups) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      ASSERT_FLOAT_EQ(grads_.data()[i], original_.data()[i] * result->scale) << i;
    }
  }
}

TEST_F(ClipTest, NonFiniteNormIsReportedAndNothingIsScaled) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    grads_ = Gradients(table_, 11);
    grads_.data()[table_.tensor(3).offset + 2] = bad;
    auto result = ClipGradNorm(grads_.span(), {.max_norm = 1}, SumOnOneRank);
    ASSERT_TRUE(result.ok());
    EXPECT_FALSE(result->finite()) << bad;
    EXPECT_EQ(std::isnan(result->norm), std::isnan(bad));
    EXPECT_EQ(result->scale, 1);
    grads_.data()[table_.tensor(3).offset + 2] = original_.data()[table_.tensor(3).offset + 2];
    EXPECT_TRUE(SameBits(grads_, original_)) << "scaled despite a non-finite norm";
  }
}

TEST_F(ClipTest, ShardedMatchesUnshardedForOneToFiveShards) {
  state::FlatBuffer want = Gradients(table_, 11);
  auto unsharded = ClipGradNorm(want.span(), {.max_norm = 3}, SumOnOneRank);
  ASSERT_TRUE(unsharded.ok());
  ASSERT_LT(unsharded->scale, 1);
  for (int shards = 1; shards <= 5; ++shards) {
    state::FlatBuffer grads = Gradients(table_, 11);
    const std::vector<state::FlatRange> ranges = testing::Shards(table_, shards);
    std::vector<GradNorm> results(shards);
    testing::FakeRanks group(shards);
    group.Run([&](int rank, const SumAcrossRanks& sum) {
      auto r = ClipGradNorm(state::Slice(grads.span(), ranges[rank]), {.max_norm = 3}, sum);
      ASSERT_TRUE(r.ok()) << r.status();
      results[rank] = *r;
    });
    for (const GradNorm& r : results) {
      EXPECT_NEAR(r.norm, unsharded->norm, 1e-12 * unsharded->norm) << shards << " shards";
      EXPECT_EQ(r.scale, results[0].scale) << "every rank scales alike";
    }
    for (int64_t i = 0; i < grads.size(); ++i) {
      ASSERT_NEAR(grads.data()[i], want.data()[i], 1e-6 * std::abs(want.data()[i])) << i;
    }
  }
}

TEST_F(ClipTest, InfOnOneRankStopsEveryRankFromScaling) {
  grads_.data()[table_.tensor(5).offset] = std::numeric_limits<float>::infinity();  // last rank
  const std::vector<state::FlatRange> ranges = testing::Shards(table_, 3);
  std::vector<GradNorm> results(3);
  testing::FakeRanks group(3);
  group.Run([&](int rank, const SumAcrossRanks& sum) {
    auto r = ClipGradNorm(state::Slice(grads_.span(), ranges[rank]), {.max_norm = 1}, sum);
    ASSERT_TRUE(r.ok());
    results[rank] = *r;
  });
  for (const GradNorm& r : results) {
    EXPECT_FALSE(r.finite());
    EXPECT_EQ(r.scale, 1);
  }
  for (int64_t i = 0; i < table_.tensor(5).offset; ++i) {
    ASSERT_EQ(grads_.data()[i], original_.data()[i]) << i;
  }
}

TEST_F(ClipTest, BadMaxNormAndFailedSumLeaveGradients) {
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto result = ClipGradNorm(grads_.span(), {.max_norm = bad}, SumOnOneRank);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("max_norm must be >= 0"));
  }
  auto failed = ClipGradNorm(grads_.span(), {.max_norm = 1},
                             [](absl::Span<double>) { return absl::AbortedError("ring broke"); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(SameBits(grads_, original_));
}

}  // namespace
}  // namespace ringmaster::train
