// The kernels of kernels/cuda/vector.h: grid-stride loops over int64 indices, each element
// handled by one thread with the CPU twins' operations in their order
// (kernels/cpu/elementwise.cc).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/vector_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = kGridStrideThreads;


// da and db are deliberately not __restrict__: when they are the same array, the second
// update must read the first one's result ((a + d) + d, as the CPU loop computes).
__global__ void ResidualBackwardKernel(float* da, float* db, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float d = dout[i];
    da[i] += d;
    db[i] += d;
  }
}

__global__ void AccumulateKernel(float* acc, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    acc[i] += x[i];
  }
}

__global__ void ScaleKernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

}  // namespace

cudaError_t LaunchResidualBackward(float* da, float* db, const float* dout, int64_t n,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;  // nothing to do: not even the runtime is touched
  ResidualBackwardKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(da, db, dout, n);
  return cudaGetLastError();
}

cudaError_t LaunchAccumulate(float* acc, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AccumulateKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(acc, x, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, s, n);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
