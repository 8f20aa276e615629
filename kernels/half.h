// 16-bit floating point storage types and their conversions to and from float.
// bf16 rounds to nearest even and keeps NaNs quiet; f16 uses the compiler's IEEE binary16.
// Always inlined: kernels/cpu builds them with and without AVX2, and an out-of-line copy
// from the AVX2 build must never be picked by the linker for the generic one.
#ifndef RINGMASTER_KERNELS_HALF_H_
#define RINGMASTER_KERNELS_HALF_H_

#include <cstdint>
#include <cstring>

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

[[gnu::always_inline]] inline float Float16ToFloat(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof(v));
  return static_cast<float>(v);
}

[[gnu::always_inline]] inline uint16_t FloatToFloat16(float f) {
  _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof(h));
  return h;
}

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_HALF_H_
