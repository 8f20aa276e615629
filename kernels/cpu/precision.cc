#include "kernels/precision.h"

#include <cstdint>
#include <cstring>

namespace ringmaster::kernels {
namespace {

// Branch-free bit arithmetic (selects, no calls), so that the loops below vectorise.

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float Float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline bool IsNan(uint32_t magnitude) { return magnitude > 0x7f800000u; }

// Drops the low kDropped bits of a float's bit pattern, rounding to nearest even. A carry
// out of the mantissa moves to the next binade, and out of the largest one to inf.
template <int kDropped>
inline uint32_t RoundMantissa(uint32_t magnitude) {
  constexpr uint32_t kHalf = (1u << (kDropped - 1)) - 1;
  constexpr uint32_t kMask = ~((1u << kDropped) - 1);
  return (magnitude + kHalf + ((magnitude >> kDropped) & 1u)) & kMask;
}

inline float RoundBFloat16(float x) {
  const uint32_t u = Bits(x);
  const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return Float(IsNan(u & 0x7fffffffu) ? quiet_nan : RoundMantissa<16>(u));
}

inline float RoundFloat16(float x) {
  constexpr uint32_t kMinNormal = 0x38800000u;  // 2^-14
  constexpr uint32_t kOverflow = 0x47800000u;   // 2^16: the first binade fp16 lacks
  const uint32_t u = Bits(x);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t magnitude = u ^ sign;
  // Normal range: 10 mantissa bits are kept.
  uint32_t normal = RoundMantissa<13>(magnitude);
  normal = normal >= kOverflow ? 0x7f800000u : normal;
  // Subnormal range: multiples of 2^-24, the ulp of floats in [0.5, 1); adding and
  // subtracting 0.5 rounds to them (to nearest even) and the subtraction is exact.
  const float subnormal = (Float(magnitude) + 0.5f) - 0.5f;
  uint32_t result = magnitude < kMinNormal ? Bits(subnormal) : normal;
  result = IsNan(magnitude) ? ((magnitude | 0x00400000u) & 0xffffe000u) : result;
  return Float(result | sign);
}

template <float (*Round)(float)>
void RoundAll(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Round(x[i]);
}

template <float (*Round)(float)>
void AddAll(const float* x, float* sum, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] += Round(x[i]);
}

}  // namespace

void RoundTo(HalfFormat format, const float* x, float* y, int64_t n) {
  if (format == HalfFormat::kBFloat16) return RoundAll<RoundBFloat16>(x, y, n);
  RoundAll<RoundFloat16>(x, y, n);
}

void AddRounded(HalfFormat format, const float* x, float* sum, int64_t n) {
  if (format == HalfFormat::kBFloat16) return AddAll<RoundBFloat16>(x, sum, n);
  AddAll<RoundFloat16>(x, sum, n);
}

}  // namespace ringmaster::kernels
