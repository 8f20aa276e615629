// Test helpers for the CUDA kernel tests (CUDA builds only): whether a GPU is present, and
// a device array filled from a host vector or poisoned with NaN bytes, copied back on demand.
#ifndef RINGMASTER_KERNELS_CUDA_TESTING_H_
#define RINGMASTER_KERNELS_CUDA_TESTING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
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
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
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
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t bytes() const { return static_cast<size_t>(n_ > 0 ? n_ : 1) * sizeof(T); }
  int64_t n_;
  T* ptr_ = nullptr;
};

// v rounded to bf16 (kernels/half.h), as bits for the device; and bits widened to floats for
// the CPU twins.
inline std::vector<uint16_t> Bf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = FloatToBFloat16(v[i]);
  return bits;
}
inline std::vector<float> Widen(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = BFloat16ToFloat(bits[i]);
  return v;
}
// A device array of bf16 bits as the kernels' element type.
inline __nv_bfloat16* AsBf16(Device<uint16_t>& d) {
  return reinterpret_cast<__nv_bfloat16*>(d.get());
}

}  // namespace ringmaster::kernels::cuda::testing

// In a TEST body: skips it, saying what needs a GPU, where none is present.
#define RM_SKIP_WITHOUT_GPU(what)                                                   \
  if (!::ringmaster::kernels::cuda::testing::HaveGpu()) {                           \
    GTEST_SKIP() << "no CUDA GPU on this machine: " what " need one (build with "   \
                    "--config=cuda and run where a GPU is present)";                \
  }

#endif  // RINGMASTER_KERNELS_CUDA_TESTING_H_
