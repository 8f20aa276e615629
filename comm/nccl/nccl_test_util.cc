#include "comm/nccl/nccl_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ringmaster::comm::testing {
namespace {

// IEEE binary16 from a float that is normal in half precision (the test's values are
// small integers), rounding to nearest even.
uint16_t FloatToHalf(float f) {
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(f), &e);  // |f| = m * 2^e, m in [0.5, 1)
  int exponent = e + 14;
  int mantissa = static_cast<int>(std::nearbyint((2 * m - 1) * 1024));
  if (mantissa == 1024) {  // rounded up to the next power of two
    mantissa = 0;
    ++exponent;
  }
  return sign | static_cast<uint16_t>(exponent << 10) | static_cast<uint16_t>(mantissa);
}

double HalfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double v = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  if (exponent == 31) v = mantissa ? NAN : INFINITY;
  return (h & 0x8000) ? -v : v;
}

uint16_t FloatToBf16(float f) {  // exact for the test's values
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

double Bf16ToDouble(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
void Put(std::vector<uint8_t>& out, size_t i, T v) {
  std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
}

template <typename T>
T Take(const std::vector<uint8_t>& in, size_t i) {
  T v;
  std::memcpy(&v, in.data() + i * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

std::vector<uint8_t> Encode(DataType type, const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * DataTypeSize(type));
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (type) {
      case DataType::kFloat32:
        Put(out, i, static_cast<float>(v));
        break;
      case DataType::kFloat64:
        Put(out, i, v);
        break;
      case DataType::kFloat16:
        Put(out, i, FloatToHalf(static_cast<float>(v)));
        break;
      case DataType::kBFloat16:
        Put(out, i, FloatToBf16(static_cast<float>(v)));
        break;
      case DataType::kInt32:
        Put(out, i, static_cast<int32_t>(v));
        break;
      case DataType::kInt64:
        Put(out, i, static_cast<int64_t>(v));
        break;
      case DataType::kUint8:
        Put(out, i, static_cast<uint8_t>(v));
        break;
    }
  }
  return out;
}

std::vector<double> Decode(DataType type, const std::vector<uint8_t>& in) {
  std::vector<double> out(in.size() / DataTypeSize(type));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (type) {
      case DataType::kFloat32:
        out[i] = Take<float>(in, i);
        break;
      case DataType::kFloat64:
        out[i] = Take<double>(in, i);
        break;
      case DataType::kFloat16:
        out[i] = HalfToDouble(Take<uint16_t>(in, i));
        break;
      case DataType::kBFloat16:
        out[i] = Bf16ToDouble(Take<uint16_t>(in, i));
        break;
      case DataType::kInt32:
        out[i] = Take<int32_t>(in, i);
        break;
      case DataType::kInt64:
        out[i] = static_cast<double>(Take<int64_t>(in, i));
        break;
      case DataType::kUint8:
        out[i] = Take<uint8_t>(in, i);
        break;
    }
  }
  return out;
}

std::vector<double> Input(DataType type, size_t count, int rank) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) {
    const double x = static_cast<double>((i * 7 + rank * 13) % 23);
    v[i] = type == DataType::kUint8 ? x : x - 11;
  }
  return v;
}

std::vector<double> SmallInput(DataType type, size_t count, int rank) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t x = i * 7 + rank * 5;
    v[i] = type == DataType::kUint8 ? static_cast<double>(x % 4) : static_cast<double>(x % 7) - 3;
  }
  return v;
}

std::vector<double> ReduceReference(DataType type, ReduceOp op,
                                    const std::vector<std::vector<double>>& inputs) {
  const size_t n = inputs.size();
  std::vector<double> out = inputs[0];
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t r = 1; r < n; ++r) {
      const double x = inputs[r][i];
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          out[i] += x;
          break;
        case ReduceOp::kProd:
          out[i] *= x;
          break;
        case ReduceOp::kMin:
          out[i] = std::min(out[i], x);
          break;
        case ReduceOp::kMax:
          out[i] = std::max(out[i], x);
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      out[i] /= static_cast<double>(n);
      if (!IsFloatingPoint(type)) out[i] = std::trunc(out[i]);
    }
  }
  return out;
}

std::string Mismatch(DataType type, const std::vector<uint8_t>& got_bytes,
                     const std::vector<double>& want) {
  const std::vector<double> got = Decode(type, got_bytes);
  if (got.size() != want.size()) {
    return absl::StrCat(got.size(), " elements, want ", want.size());
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", got.size(), " elements differ; first at ", first, ": got ",
                      got[first], ", want ", want[first]);
}

}  // namespace ringmaster::comm::testing
