// Helpers for plain-C++ kernels that the compiler vectorises, internal to kernels/cpu.
//
// FastExp and FastTanh are exp and tanh in float arithmetic alone: no libm call and no
// float-to-int conversion, so a loop over them becomes SIMD code when the including file is
// built with -O3 -fno-trapping-math (their clamps are compare-and-select, which GCC will not
// if-convert under trapping math; no result changes, as floating-point exceptions are never
// unmasked). libm's expf and tanhf stay scalar calls (tanhf costs about 13 ns) unless the
// whole file is built with -ffast-math, which we avoid: the emulated fp16 path needs inf and
// NaN to behave.
//
// LaneSum is a float reduction that vectorises without reassociation flags.
//
// RM_TARGET_CLONES marks a hot loop function to be compiled twice, for x86-64-v3 (AVX2, FMA)
// and for baseline x86-64, with the processor's version picked once at load time (GCC
// target_clones, an ifunc). Apply it to functions that run whole loops, not to per-element
// helpers: those are always_inline so that each clone gets its own copy.
#ifndef RINGMASTER_KERNELS_CPU_VECTOR_MATH_H_
#define RINGMASTER_KERNELS_CPU_VECTOR_MATH_H_

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RM_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define RM_TARGET_CLONES
#endif

namespace ringmaster::kernels {

// exp(x) by Cephes' method: x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2, exp(r) by
// a degree-6 polynomial, 2^n assembled in the exponent bits. Relative error below 2e-7 for x
// in [-87, 88]; x is clamped to that range first (so very negative x gives 1.6e-38, not 0,
// and very large x gives 1.7e38, not inf). NaN gives NaN.
[[gnu::always_inline]] inline float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo; n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds to an integer and leaves it in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  x = x < -87.0f ? -87.0f : x;  // comparisons with NaN are false: NaN passes through
  x = x > 88.0f ? 88.0f : x;
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  int32_t n_bits;
  std::memcpy(&n_bits, &shifted, sizeof(n_bits));
  n_bits -= 0x4B400000;  // the bits of kRound: what remains is n, in [-126, 127]
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t scale_bits = (n_bits + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return p * scale;
}

// sum over j in [0, n) of term(j), kept in eight independent partial sums (so the order of
// additions, and the result, is fixed for a given n), which -O3 turns into vector adds.
// term may have side effects; it is called once for each j, in increasing j within each lane.
template <typename Term>
[[gnu::always_inline]] inline float LaneSum(int64_t n, Term term) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += term(j + k);
  }
  for (; j < n; ++j) acc[0] += term(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error below 3e-7 (the relative error grows near
// 0, where the subtraction cancels), exactly +-1 for |u| > 44, NaN for NaN.
[[gnu::always_inline]] inline float FastTanh(float u) {
  return 1.0f - 2.0f / (FastExp(2.0f * u) + 1.0f);
}

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_CPU_VECTOR_MATH_H_
