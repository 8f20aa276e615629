// Test helpers for the CUDA kernel tests (CUDA builds only): whether a GPU is present, a
// device array filled from a host vector or poisoned with NaN bytes, copied back on demand,
// and the 16-bit storage formats (bf16, fp16) for tests written once for both.
#ifndef RINGMASTER_KERNELS_CUDA_TESTING_H_
#define RINGMASTER_KERNELS_CUDA_TESTING_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"

namespace ringmaster::kernels::cuda::testing {

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
class Device {
 public:
  explicit Device(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), used_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // n elements of 0xff bytes (NaN for floats): an element a kernel leaves unwritten shows.
  explicit Device(int64_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0xff, bytes()), cudaSuccess);
  }
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* get() { return ptr_; }
  // Waits for the device, then copies the array back.
  std::vector<T> Host() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, used_bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  // At least one element is allocated (a real pointer even for an empty array); only the n
  // elements are copied (an empty vector's data() is null, which cudaMemcpy rejects).
  size_t bytes() const { return static_cast<size_t>(n_ > 0 ? n_ : 1) * sizeof(T); }
  size_t used_bytes() const { return static_cast<size_t>(n_) * sizeof(T); }
  int64_t n_;
  T* ptr_ = nullptr;
};

// got and want hold the same bits, element for element, apart from NaNs when nan_equal
// (any NaN then equals any NaN); the first difference is named.
template <typename T>
void ExpectBitsEqual(const std::vector<T>& got, const std::vector<T>& want, bool nan_equal,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (nan_equal && std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ, first ["
                    << first << "] gpu " << (first >= 0 ? got[first] : T{}) << " cpu "
                    << (first >= 0 ? want[first] : T{});
}

// got and want hold the same bits, element for element (NaN payloads and the sign of zero
// included): for casts, copies and bit manipulation.
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what) {
  ExpectBitsEqual(got, want, /*nan_equal=*/false, what);
}

// As ExpectSameBits for the results of arithmetic: the same bits, except that any NaN equals
// any NaN. IEEE 754 leaves the payload and sign of an arithmetic result's NaN to the
// hardware: an NVIDIA GPU writes its canonical NaN (0x7fffffff), x86 keeps an operand's
// payload (or writes 0xffc00000); the emulation (x86 arithmetic) cannot show the difference.
template <typename T>
void ExpectSameValueBits(const std::vector<T>& got, const std::vector<T>& want,
                         const std::string& what) {
  ExpectBitsEqual(got, want, /*nan_equal=*/true, what);
}

// The 16-bit storage formats of the *Bf16 and *F16 kernels, as type parameters of tests
// written once for both (gtest typed tests over HalfFormats): the device element type, the
// kernels' name suffix, the host conversions of kernels/half.h (which the device's rounding
// equals bit for bit), the largest finite value's bits, and a bound on the error of one
// rounding to nearest.
struct Bf16Format {
  using Element = __nv_bfloat16;
  static constexpr char kName[] = "Bf16";
  static constexpr uint16_t kMaxFinite = 0x7f7f;  // 3.3895e38
  static uint16_t Round(float f) { return FloatToBFloat16(f); }
  static float Widen(uint16_t h) { return BFloat16ToFloat(h); }
  // |round(v) - v| <= RoundingBound(|v|) for |v| in bf16's normal range (2^-126 up to the
  // overflow threshold): 8 significant bits, so half an ulp is at most 2^-8 |v| (and the
  // bound at most one ulp).
  static double RoundingBound(double magnitude) { return std::ldexp(magnitude, -8); }
};

struct F16Format {
  using Element = __half;
  static constexpr char kName[] = "F16";
  static constexpr uint16_t kMaxFinite = 0x7bff;  // 65504
  static uint16_t Round(float f) { return FloatToFloat16(f); }
  static float Widen(uint16_t h) { return Float16ToFloat(h); }
  // |round(v) - v| <= RoundingBound(|v|) for |v| below the overflow threshold 65520: 11
  // significant bits, so half an ulp is at most 2^-11 |v| on the normal range (from 2^-14),
  // and below it the subnormals' spacing is 2^-24, half of which is 2^-25.
  static double RoundingBound(double magnitude) {
    return std::ldexp(magnitude, -11) + std::ldexp(1.0, -25);
  }
};

using HalfFormats = ::testing::Types<Bf16Format, F16Format>;

// Names the typed tests' instances by format: Suite/Bf16.Test, Suite/F16.Test.
struct HalfFormatName {
  template <typename Format>
  static std::string GetName(int) {
    return Format::kName;
  }
};

// v rounded to the format, as bits for the device; bits widened to floats for the CPU twins;
// a device array of bits as the kernels' element type.
template <typename Format>
std::vector<uint16_t> RoundToBits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = Format::Round(v[i]);
  return bits;
}
template <typename Format>
std::vector<float> WidenBits(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = Format::Widen(bits[i]);
  return v;
}
template <typename Format>
typename Format::Element* AsElements(Device<uint16_t>& d) {
  return reinterpret_cast<typename Format::Element*>(d.get());
}

}  // namespace ringmaster::kernels::cuda::testing

// In a TEST body: skips it, saying what needs a GPU, where none is present.
#define RM_SKIP_WITHOUT_GPU(what)                                    \
  if (!::ringmaster::kernels::cuda::testing::HaveGpu()) {            \
    GTEST_SKIP() << "no CUDA GPU on this machine: " what             \
                    " need one (build with "                         \
                    "--config=cuda and run where a GPU is present)"; \
  }

#endif  // RINGMASTER_KERNELS_CUDA_TESTING_H_
