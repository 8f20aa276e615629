// Portable, deterministic random numbers for parameter initialisation.
//
// SplitMix64 (Steele, Lea and Flood 2014, as in Vigna's reference code) gives the same
// sequence on every platform and standard library, unlike std:: distributions, so every
// rank and every build initialises a model to the same bits. Not for cryptography.
#ifndef RINGMASTER_TRAIN_NN_RANDOM_H_
#define RINGMASTER_TRAIN_NN_RANDOM_H_

#include <cstdint>

#include "absl/types/span.h"

namespace ringmaster::train::nn {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1): a multiple of 2^-24 (every one equally likely), exact in a float.
  float NextUnit() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// Fills `out` with values uniform in [-bound, bound), in order, from `rng`.
void FillUniform(SplitMix64& rng, float bound, absl::Span<float> out);

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_RANDOM_H_
