// 16-bit floating point storage types and their conversions to and from float.
// bf16 rounds to nearest even and keeps NaNs quiet; f16 is IEEE binary16, converted by the
// compiler's _Float16 where it has one (GCC 12 and Clang 15 on x86-64: the F16C
// instructions where the build allows them), otherwise (Clang 14) by the integer and float
// arithmetic of internal::SoftFloat16ToFloat/SoftFloatToFloat16, which give the same bits.
// Always inlined: kernels/cpu builds them with and without AVX2, and an out-of-line copy
// from the AVX2 build must never be picked by the linker for the generic one.
#ifndef RINGMASTER_KERNELS_HALF_H_
#define RINGMASTER_KERNELS_HALF_H_

#include <bit>
#include <cstdint>
#include <cstring>

// 1 where the compiler has an IEEE binary16 type with conversions that link.
#if defined(__clang__) && __clang_major__ < 15
#define RINGMASTER_HAS_FLOAT16 0
#else
#define RINGMASTER_HAS_FLOAT16 1
#endif

namespace ringmaster::kernels {

[[gnu::always_inline]] inline float BFloat16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

[[gnu::always_inline]] inline uint16_t FloatToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

namespace internal {

// IEEE binary16 -> binary32, exact. A NaN stays NaN with its sign and payload, made quiet
// (as the F16C instructions and libgcc do).
[[gnu::always_inline]] inline float SoftFloat16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf, NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) |
                                (mantissa != 0 ? 0x00400000u : 0u));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  return std::bit_cast<float>(sign |
                              std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f));
}

// IEEE binary32 -> binary16, rounded to nearest even; beyond 65504 (from 65520 on) it is
// Inf; a NaN stays NaN with its sign and the top of its payload, made quiet.
[[gnu::always_inline]] inline uint16_t SoftFloatToFloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520
  if (magnitude >= 0x38800000u) {  // a normal binary16 (>= 2^-14): round the low 13 bits
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  // Below 2^-14: a multiple of 2^-24. Adding 0.5 (whose ulp is 2^-24) rounds to one, to
  // nearest even; the low bits of the sum count them (1024, 2^-14, encodes as itself).
  const float sum = std::bit_cast<float>(magnitude) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(sum) - 0x3f000000u));
}

}  // namespace internal

[[gnu::always_inline]] inline float Float16ToFloat(uint16_t h) {
#if RINGMASTER_HAS_FLOAT16
  _Float16 v;
  std::memcpy(&v, &h, sizeof(v));
  return static_cast<float>(v);
#else
  return internal::SoftFloat16ToFloat(h);
#endif
}

[[gnu::always_inline]] inline uint16_t FloatToFloat16(float f) {
#if RINGMASTER_HAS_FLOAT16
  _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof(h));
  return h;
#else
  return internal::SoftFloatToFloat16(f);
#endif
}

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_HALF_H_
