#include "train/data/portable_random.h"

#include <numeric>
#include <utility>

#include "glog/logging.h"

namespace ringmaster::train::data {

uint64_t SplitMix64::UniformBelow(uint64_t bound) {
  CHECK_GT(bound, 0u);
  // Lemire, "Fast Random Integer Generation in an Interval" (2019): the high word of
  // x * bound, rejecting the few low words that would bias it.
  unsigned __int128 product = static_cast<unsigned __int128>(Next()) * bound;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      product = static_cast<unsigned __int128>(Next()) * bound;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

std::vector<int64_t> RandomPermutation(int64_t n, SplitMix64& rng) {
  CHECK_GE(n, 0);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i >= 1; --i) {
    std::swap(order[i], order[rng.UniformBelow(static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

SplitMix64 EpochGenerator(uint64_t seed, uint64_t epoch) {
  return SplitMix64(Mix64(seed ^ Mix64(epoch)));
}

}  // namespace ringmaster::train::data
