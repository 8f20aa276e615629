#include "tools/cuda_emu/nccl_reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rm_emu::nccl {
namespace {

// How an element of a type is read, computed on and written back.
template <typename T>
struct Native {
  using Compute = T;
  static T Load(const void* p, size_t i) {
    T v;
    std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
    return v;
  }
  static void Store(void* p, size_t i, T v) {
    std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
  }
};

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct Sixteen {
  using Compute = float;
  static float Load(const void* p, size_t i) { return ToFloat(Native<uint16_t>::Load(p, i)); }
  static void Store(void* p, size_t i, float v) { Native<uint16_t>::Store(p, i, FromFloat(v)); }
};
using Half = Sixteen<HalfToFloat, FloatToHalf>;
using Bf16 = Sixteen<Bf16ToFloat, FloatToBf16>;

// a op b, wrapping for integers (no signed overflow).
template <typename C>
C Apply(ncclRedOp_t op, C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ncclProd:
        return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      default:
        break;
    }
  } else {
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return a + b;
      case ncclProd:
        return a * b;
      default:
        break;
    }
  }
  return op == ncclMin ? (b < a ? b : a) : (a < b ? b : a);
}

template <typename E>
void ReduceAs(ncclRedOp_t op, const std::vector<const void*>& inputs, void* out, size_t count) {
  using C = typename E::Compute;
  const size_t n = inputs.size();
  constexpr bool kFloat = !std::is_integral_v<C>;
  // ncclAvg on floating point: each input times 1/n in the type, then summed.
  C scale{1};
  if constexpr (kFloat) {
    if (op == ncclAvg) {
      char one[sizeof(double)];
      E::Store(one, 0, static_cast<C>(1.0 / static_cast<double>(n)));
      scale = E::Load(one, 0);
    }
  }
  char buf[sizeof(double)];
  // Round `v` to the element type.
  auto round = [&buf](C v) {
    E::Store(buf, 0, v);
    return E::Load(buf, 0);
  };
  for (size_t i = 0; i < count; ++i) {
    C acc = E::Load(inputs[0], i);
    if (kFloat && op == ncclAvg) acc = round(acc * scale);
    for (size_t r = 1; r < n; ++r) {
      C x = E::Load(inputs[r], i);
      if (kFloat && op == ncclAvg) x = round(x * scale);
      acc = round(Apply(op, acc, x));
    }
    if constexpr (!kFloat) {
      if (op == ncclAvg) acc = static_cast<C>(acc / static_cast<C>(n));
    }
    E::Store(out, i, acc);
  }
}

}  // namespace

size_t TypeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

bool Reducible(ncclDataType_t type) {
  return TypeBytes(type) != 0 && type != ncclFloat8e4m3 && type != ncclFloat8e5m2;
}

void Reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& inputs, void* out,
            size_t count) {
  switch (type) {
    case ncclInt8:
      return ReduceAs<Native<int8_t>>(op, inputs, out, count);
    case ncclUint8:
      return ReduceAs<Native<uint8_t>>(op, inputs, out, count);
    case ncclInt32:
      return ReduceAs<Native<int32_t>>(op, inputs, out, count);
    case ncclUint32:
      return ReduceAs<Native<uint32_t>>(op, inputs, out, count);
    case ncclInt64:
      return ReduceAs<Native<int64_t>>(op, inputs, out, count);
    case ncclUint64:
      return ReduceAs<Native<uint64_t>>(op, inputs, out, count);
    case ncclFloat16:
      return ReduceAs<Half>(op, inputs, out, count);
    case ncclBfloat16:
      return ReduceAs<Bf16>(op, inputs, out, count);
    case ncclFloat32:
      return ReduceAs<Native<float>>(op, inputs, out, count);
    case ncclFloat64:
      return ReduceAs<Native<double>>(op, inputs, out, count);
    default:
      return;  // callers check Reducible()
  }
}

float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa != 0 ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
  }
  return (h & 0x8000) ? -v : v;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;   // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to or beyond 65520: infinity
  if (abs < 0x38800000) {                       // below 2^-14: a subnormal half (or zero)
    // The value in units of 2^-24, rounded to nearest even.
    const float units = std::fabs(f) * 16777216.0f;  // exact: a power of two
    return sign | static_cast<uint16_t>(std::nearbyint(units));
  }
  // Normal: drop 13 mantissa bits, rounding to nearest even (a carry bumps the exponent).
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t rounded = rebased + 0xfff + ((rebased >> 13) & 1);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace rm_emu::nccl
