#include "kernels/precision.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"

namespace ringmaster::kernels {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// The oracle: a conversion to the 16-bit type and back (kernels/half.h; fp16 through the
// compiler's _Float16).
float Oracle(HalfFormat format, float x) {
  return format == HalfFormat::kBFloat16 ? BFloat16ToFloat(FloatToBFloat16(x))
                                         : Float16ToFloat(FloatToFloat16(x));
}

// Every 4093rd bit pattern (about a million floats of every sign, binade and NaN payload),
// plus the neighbourhoods of every rounding boundary that matters.
std::vector<float> Samples() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) v.push_back(FromBits(static_cast<uint32_t>(u)));
  for (float center : {65504.0f, 65520.0f, 65536.0f, 6.103515625e-05f /* 2^-14 */,
                       5.9604645e-08f /* 2^-24 */, 2.9802322e-08f /* 2^-25 */, 1.0f,
                       3.3895314e38f /* largest bf16 */, std::numeric_limits<float>::max()}) {
    for (int d = -300; d <= 300; ++d) {
      const uint32_t u = ToBits(center) + d;
      v.push_back(FromBits(u));
      v.push_back(-FromBits(u));
    }
  }
  return v;
}

// Same bits, so that -0 and +0 are told apart; any NaN matches any NaN.
bool SameValue(float got, float want) {
  return std::isnan(want) ? std::isnan(got) : ToBits(got) == ToBits(want);
}

class RoundToTest : public testing::TestWithParam<HalfFormat> {};

TEST_P(RoundToTest, MatchesConversionThroughTheHalfType) {
  const HalfFormat format = GetParam();
  const std::vector<float> x = Samples();
  std::vector<float> y(x.size());
  RoundTo(format, x.data(), y.data(), static_cast<int64_t>(x.size()));
  int failures = 0;
  for (size_t i = 0; i < x.size() && failures < 20; ++i) {
    const float want = Oracle(format, x[i]);
    if (!SameValue(y[i], want)) {
      ADD_FAILURE() << x[i] << " rounds to " << y[i] << ", want " << want;
      ++failures;
    }
  }

  std::vector<float> in_place = x;
  RoundTo(format, in_place.data(), in_place.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(SameValue(in_place[i], y[i])) << x[i];
}

TEST_P(RoundToTest, AddRoundedAddsTheRoundedValue) {
  const HalfFormat format = GetParam();
  std::vector<float> x, sum, want;
  for (int i = 0; i < 35; ++i) {
    x.push_back(1.0f + i / 1024.0f + 1.0f / 8192);  // between representable values
    sum.push_back(0.5f * i);
    want.push_back(0.5f * i + Oracle(format, x.back()));
  }
  AddRounded(format, x.data(), sum.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(sum, want);
}

INSTANTIATE_TEST_SUITE_P(Formats, RoundToTest,
                         testing::Values(HalfFormat::kBFloat16, HalfFormat::kFloat16));

TEST(RoundTo, KnownValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {65504.0f,           65519.0f, 65520.0f, -1e6f,
                                1.0f + 1.0f / 2048, 3e-8f,    2.9e-8f,  1e-8f};
  std::vector<float> y(x.size());
  RoundTo(HalfFormat::kFloat16, x.data(), y.data(), static_cast<int64_t>(x.size()));
  // 65520 is halfway between 65504 and 2^16 (not finite in fp16) and ties to the even 2^16;
  // 1 + 2^-11 ties to 1; 3e-8 rounds up to the smallest subnormal 2^-24, 2.9e-8 (< 2^-25)
  // down to 0.
  EXPECT_EQ(y, (std::vector<float>{65504.0f, 65504.0f, inf, -inf, 1.0f, 0x1p-24f, 0.0f, 0.0f}));
  const float big = 1e38f;
  float rounded;
  RoundTo(HalfFormat::kBFloat16, &big, &rounded, 1);
  EXPECT_TRUE(std::isfinite(rounded));
  EXPECT_NEAR(rounded, big, big / 256);
}

}  // namespace
}  // namespace ringmaster::kernels
