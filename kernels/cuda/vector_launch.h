// Internal to kernels/cuda/vector: the kernel launchers, compiled by nvcc (no absl here).
// Callers (vector.cc) validate every argument first; the launchers assume device pointers,
// non-null where n > 0, n >= 0, and the aliasing the public header allows. Each returns
// cudaGetLastError() after its launch (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_VECTOR_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_VECTOR_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

cudaError_t LaunchResidualBackward(float* da, float* db, const float* dout, int64_t n,
                                   cudaStream_t stream);
cudaError_t LaunchAccumulate(float* acc, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_VECTOR_LAUNCH_H_
