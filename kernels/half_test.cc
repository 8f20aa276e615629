// The software binary16 conversions (used where the compiler has no _Float16, Clang 14):
// known values everywhere, and where it has one, bit for bit the compiler's conversions
// for every binary16 and about a million floats around every rounding boundary.
#include "kernels/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace ringmaster::kernels {
namespace {

using internal::SoftFloat16ToFloat;
using internal::SoftFloatToFloat16;

float FromBits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t ToBits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(SoftFloat16, KnownValues) {
  EXPECT_EQ(SoftFloatToFloat16(0.0f), 0x0000);
  EXPECT_EQ(SoftFloatToFloat16(-0.0f), 0x8000);
  EXPECT_EQ(SoftFloatToFloat16(1.0f), 0x3c00);
  EXPECT_EQ(SoftFloatToFloat16(-2.0f), 0xc000);
  EXPECT_EQ(SoftFloatToFloat16(65504.0f), 0x7bff);    // largest finite
  EXPECT_EQ(SoftFloatToFloat16(65519.996f), 0x7bff);  // below the tie
  EXPECT_EQ(SoftFloatToFloat16(65520.0f), 0x7c00);    // tie, to even: Inf
  EXPECT_EQ(SoftFloatToFloat16(-1e9f), 0xfc00);
  EXPECT_EQ(SoftFloatToFloat16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1023.5f, -24)), 0x0400);  // tie, to even: normal
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);     // tie, to even: 0
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(SoftFloatToFloat16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp, to even: 2
  EXPECT_EQ(SoftFloatToFloat16(1.0f + 1.0f / 2048), 0x3c00);     // tie, to even: 1
  EXPECT_EQ(SoftFloatToFloat16(1.0f + 3.0f / 2048), 0x3c02);     // tie, to even: up
  EXPECT_EQ(SoftFloatToFloat16(FromBits(0x7f800001u)), 0x7e00);  // signalling NaN: quiet
  EXPECT_EQ(SoftFloatToFloat16(FromBits(0xffc02000u)), 0xfe01);  // sign and payload

  EXPECT_EQ(ToBits(SoftFloat16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(SoftFloat16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(SoftFloat16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(SoftFloat16ToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(SoftFloat16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(SoftFloat16ToFloat(0x83ff), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(SoftFloat16ToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(ToBits(SoftFloat16ToFloat(0x7c01)), 0x7fc02000u);  // signalling NaN: quiet
}

TEST(SoftFloat16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = SoftFloat16ToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    EXPECT_EQ(std::isnan(f), nan) << std::hex << h;
    // A NaN comes back quiet; everything else exactly.
    EXPECT_EQ(SoftFloatToFloat16(f), nan ? (h | 0x200) : h) << std::hex << h;
  }
}

#if RINGMASTER_HAS_FLOAT16
TEST(SoftFloat16, MatchesTheCompilersFloat16) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(ToBits(SoftFloat16ToFloat(static_cast<uint16_t>(h))),
              ToBits(Float16ToFloat(static_cast<uint16_t>(h))))
        << std::hex << h;
  }
  auto check = [](uint32_t u) {
    const float f = FromBits(u);
    ASSERT_EQ(SoftFloatToFloat16(f), FloatToFloat16(f)) << std::hex << u << " " << f;
  };
  // Every 4093rd bit pattern, then the neighbourhood of every binary16 value and of every
  // midpoint between two (the rounding boundaries), of both signs.
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) check(static_cast<uint32_t>(u));
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const uint32_t value = ToBits(Float16ToFloat(static_cast<uint16_t>(h)));
    const uint32_t next = ToBits(Float16ToFloat(static_cast<uint16_t>(h + 1)));
    const uint32_t midpoint = ToBits((FromBits(value) + FromBits(next)) / 2);  // exact
    for (uint32_t center : {value, midpoint}) {
      for (int d = -2; d <= 2; ++d) {
        check(center + d);
        check((center + d) | 0x80000000u);
      }
    }
  }
}
#endif

}  // namespace
}  // namespace ringmaster::kernels
