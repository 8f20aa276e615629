#include "train/nn/random.h"

namespace ringmaster::train::nn {

void FillUniform(SplitMix64& rng, float bound, absl::Span<float> out) {
  // 2u - 1 is exact, so the only rounding is the product with `bound`.
  for (float& v : out) v = (2.0f * rng.NextUnit() - 1.0f) * bound;
}

}  // namespace ringmaster::train::nn
