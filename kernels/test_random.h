// Test helper: reproducible random inputs for kernel and layer tests.
#ifndef RINGMASTER_KERNELS_TEST_RANDOM_H_
#define RINGMASTER_KERNELS_TEST_RANDOM_H_

#include <cstdint>
#include <random>
#include <vector>

namespace ringmaster::kernels {

// n floats uniform in [low, high), the same for the same seed.
inline std::vector<float> RandomFloats(int64_t n, uint32_t seed, float low = -1.0f,
                                       float high = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_TEST_RANDOM_H_
