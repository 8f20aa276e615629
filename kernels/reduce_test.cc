#include "kernels/reduce.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"

namespace ringmaster::kernels {
namespace {

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(FloatToBFloat16(INFINITY))));
}

TEST(Half, Float16RoundTrip) {
  for (float f : {0.0f, 1.0f, -1.5f, 65504.0f, 0.000061035156f}) {
    EXPECT_EQ(Float16ToFloat(FloatToFloat16(f)), f) << f;
  }
  EXPECT_EQ(Float16ToFloat(FloatToFloat16(1.0f + 1.0f / 4096)), 1.0f);
  EXPECT_TRUE(std::isinf(Float16ToFloat(FloatToFloat16(1e6f))));
}

TEST(Reduce, Float32AllKinds) {
  std::vector<float> a = {1, -2, 3.5f, 0}, b = {4, 5, -1, 0}, d(4);
  Reduce(DataType::kFloat32, ReduceKind::kSum, d.data(), a.data(), b.data(), 4);
  EXPECT_EQ(d, (std::vector<float>{5, 3, 2.5f, 0}));
  Reduce(DataType::kFloat32, ReduceKind::kProd, d.data(), a.data(), b.data(), 4);
  EXPECT_EQ(d, (std::vector<float>{4, -10, -3.5f, 0}));
  Reduce(DataType::kFloat32, ReduceKind::kMin, d.data(), a.data(), b.data(), 4);
  EXPECT_EQ(d, (std::vector<float>{1, -2, -1, 0}));
  Reduce(DataType::kFloat32, ReduceKind::kMax, d.data(), a.data(), b.data(), 4);
  EXPECT_EQ(d, (std::vector<float>{4, 5, 3.5f, 0}));
}

TEST(Reduce, MinMaxPropagateNanWhicheverSide) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {nan, 1}, b = {1, nan}, d(2);
  Reduce(DataType::kFloat32, ReduceKind::kMin, d.data(), a.data(), b.data(), 2);
  EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]));
  Reduce(DataType::kFloat32, ReduceKind::kMax, d.data(), a.data(), b.data(), 2);
  EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]));
}

TEST(Reduce, InPlaceLongVectorMatchesScalar) {
  const size_t n = 100003;  // not a multiple of any vector width
  std::vector<double> a(n), b(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 0.5 * i;
    b[i] = 1.0 / (i + 1);
    want[i] = a[i] + b[i];
  }
  Reduce(DataType::kFloat64, ReduceKind::kSum, a.data(), a.data(), b.data(), n);
  EXPECT_EQ(a, want);
}

TEST(Reduce, IntegersAndBytes) {
  std::vector<int64_t> a = {1LL << 40, -3}, b = {1, 7}, d(2);
  Reduce(DataType::kInt64, ReduceKind::kSum, d.data(), a.data(), b.data(), 2);
  EXPECT_EQ(d, (std::vector<int64_t>{(1LL << 40) + 1, 4}));
  std::vector<int32_t> ia = {5, -5}, ib = {3, 9}, id(2);
  Reduce(DataType::kInt32, ReduceKind::kMax, id.data(), ia.data(), ib.data(), 2);
  EXPECT_EQ(id, (std::vector<int32_t>{5, 9}));
  std::vector<uint8_t> ua = {250, 3}, ub = {10, 4}, ud(2);
  Reduce(DataType::kUint8, ReduceKind::kSum, ud.data(), ua.data(), ub.data(), 2);
  EXPECT_EQ(ud, (std::vector<uint8_t>{4, 7}));  // wraps modulo 256
}

TEST(Reduce, HalfTypesComputeInFloat) {
  std::vector<uint16_t> a(3), b(3), d(3);
  float av[] = {1.5f, -2.0f, 100.0f}, bv[] = {0.25f, 0.5f, 0.125f};
  for (int i = 0; i < 3; ++i) {
    a[i] = FloatToBFloat16(av[i]);
    b[i] = FloatToBFloat16(bv[i]);
  }
  Reduce(DataType::kBFloat16, ReduceKind::kSum, d.data(), a.data(), b.data(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(BFloat16ToFloat(d[i]), BFloat16ToFloat(FloatToBFloat16(av[i] + bv[i])));
  }
  for (int i = 0; i < 3; ++i) {
    a[i] = FloatToFloat16(av[i]);
    b[i] = FloatToFloat16(bv[i]);
  }
  Reduce(DataType::kFloat16, ReduceKind::kProd, d.data(), a.data(), b.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Float16ToFloat(d[i]), av[i] * bv[i]);
}

TEST(DivideBy, FloatsScaleIntegersTruncate) {
  std::vector<float> f = {3, -6};
  DivideBy(DataType::kFloat32, f.data(), 2, 3);
  EXPECT_FLOAT_EQ(f[0], 1);
  EXPECT_FLOAT_EQ(f[1], -2);
  std::vector<int32_t> i = {7, -7};
  DivideBy(DataType::kInt32, i.data(), 2, 2);
  EXPECT_EQ(i, (std::vector<int32_t>{3, -3}));
  std::vector<uint16_t> h = {FloatToBFloat16(6.0f)};
  DivideBy(DataType::kBFloat16, h.data(), 1, 4);
  EXPECT_EQ(BFloat16ToFloat(h[0]), 1.5f);
}

TEST(Reduce, ReportsImplementation) {
  std::string impl = ReduceImplementation();
  EXPECT_TRUE(impl == "avx2" || impl == "generic") << impl;
}

}  // namespace
}  // namespace ringmaster::kernels
