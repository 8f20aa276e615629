// The kernels of kernels/cuda/activation.h: grid-stride loops over int64 indices, the CPU
// twins' selects (kernels/cpu/activation.cc) element by element. No arithmetic touches a
// value, so the results are the CPU's bits, NaN payloads and -0 included.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/activation_launch.h"
#include "kernels/cuda/grid.cuh"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = kGridStrideThreads;


// `v < 0 ? 0 : v`, not fmaxf: a NaN compares false and passes through, and -0 (not below 0)
// stays -0, as on the CPU.
__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

// A select, not dy * mask: inf * 0 would make a NaN where the unit was off.
__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

}  // namespace

cudaError_t LaunchReluForward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;  // nothing to do: not even the runtime is touched
  ReluForwardKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ReluBackwardKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
