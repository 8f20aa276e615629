#include "train/data/portable_random.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace ringmaster::train::data {
namespace {

// Expected values come from a separate Python implementation of the same definitions; the
// first list also matches Vigna's reference splitmix64.c.
TEST(SplitMix64Test, MatchesReferenceOutputs) {
  SplitMix64 rng(1234567);
  for (uint64_t want : {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                        4593380528125082431ull, 16408922859458223821ull}) {
    EXPECT_EQ(rng.Next(), want);
  }
  SplitMix64 zero(0);
  EXPECT_EQ(zero.Next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(zero.Next(), 0x6e789e6aa1b965f4ull);
}

TEST(SplitMix64Test, UniformBelowMatchesReference) {
  SplitMix64 rng(7);
  std::vector<uint64_t> small;
  for (int i = 0; i < 20; ++i) small.push_back(rng.UniformBelow(10));
  EXPECT_EQ(small,
            (std::vector<uint64_t>{3, 0, 9, 5, 4, 2, 4, 3, 1, 4, 1, 9, 9, 8, 8, 5, 8, 3, 6, 7}));
  // A bound just above 2^63 rejects about half the draws: exercises the rejection loop.
  SplitMix64 big(7);
  for (uint64_t want : {3595544800446187243ull, 8308050873407804673ull, 2300599727732774152ull,
                        1238314238945538992ull}) {
    EXPECT_EQ(big.UniformBelow((uint64_t{1} << 63) + 1), want);
  }
}

TEST(RandomPermutationTest, MatchesReference) {
  SplitMix64 epoch0 = EpochGenerator(42, 0);
  EXPECT_EQ(RandomPermutation(10, epoch0), (std::vector<int64_t>{2, 3, 6, 4, 7, 9, 0, 8, 1, 5}));
  SplitMix64 epoch1 = EpochGenerator(42, 1);
  EXPECT_EQ(RandomPermutation(10, epoch1), (std::vector<int64_t>{6, 5, 2, 0, 4, 7, 8, 9, 3, 1}));
  SplitMix64 seed0 = EpochGenerator(0, 0);
  EXPECT_EQ(
      RandomPermutation(20, seed0),
      (std::vector<int64_t>{18, 19, 5, 15, 11, 7, 9, 14, 6, 3, 12, 13, 10, 2, 4, 1, 16, 0, 8, 17}));
}

TEST(RandomPermutationTest, IsAPermutationForEverySize) {
  SplitMix64 rng(99);
  for (int64_t n = 0; n <= 300; ++n) {
    std::vector<int64_t> order = RandomPermutation(n, rng);
    std::sort(order.begin(), order.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(order[i], i) << "n " << n;
  }
}

TEST(RandomPermutationTest, EveryPositionIsRoughlyUniform) {
  // 3 elements: each of the 6 orders should appear ~1/6 of the time.
  SplitMix64 rng(5);
  std::vector<int> counts(6);
  constexpr int kTrials = 60000;
  for (int t = 0; t < kTrials; ++t) {
    std::vector<int64_t> p = RandomPermutation(3, rng);
    ++counts[p[0] * 2 + (p[1] > p[2] ? 1 : 0)];
  }
  // Binomial(60000, 1/6): sd ~ 91; allow 6 sd.
  for (int c : counts) EXPECT_NEAR(c, kTrials / 6, 550);
}

}  // namespace
}  // namespace ringmaster::train::data
