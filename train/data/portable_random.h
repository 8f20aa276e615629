// Random numbers that are the same on every machine, compiler and standard library, for
// everything that must agree across ranks and across restarts (the sampler's epoch order).
// std::shuffle and std::uniform_int_distribution are not: their output is unspecified.
//
// SplitMix64 (Steele, Lea, Flood 2014; Vigna's reference splitmix64.c), bounded integers by
// Lemire's multiply-and-reject (unbiased), and Fisher-Yates from the last element down.
//
// Thread-safety: SplitMix64 is a plain value; the functions are pure.
#ifndef RINGMASTER_TRAIN_DATA_PORTABLE_RANDOM_H_
#define RINGMASTER_TRAIN_DATA_PORTABLE_RANDOM_H_

#include <cstdint>
#include <vector>

namespace ringmaster::train::data {

// The SplitMix64 output function: a bijective 64-bit mixer.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit constexpr SplitMix64(uint64_t state) : state_(state) {}

  constexpr uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return Mix64(state_);
  }

  // Uniform in [0, bound); bound must be > 0.
  uint64_t UniformBelow(uint64_t bound);

 private:
  uint64_t state_;
};

// A permutation of [0, n): start from 0, 1, ..., n-1; for i = n-1 down to 1 swap element i
// with element rng.UniformBelow(i + 1).
std::vector<int64_t> RandomPermutation(int64_t n, SplitMix64& rng);

// The generator for data epoch `epoch` of a job seeded with `seed`:
// SplitMix64(Mix64(seed ^ Mix64(epoch))).
SplitMix64 EpochGenerator(uint64_t seed, uint64_t epoch);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_PORTABLE_RANDOM_H_
