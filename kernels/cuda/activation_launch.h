// Internal to kernels/cuda/activation: the kernel launchers, compiled by nvcc (no absl
// here). Callers (activation.cc) validate every argument first; the launchers assume device
// pointers, non-null where n > 0, n >= 0, and the aliasing the public header allows. Each
// returns cudaGetLastError() after its launch (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_ACTIVATION_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_ACTIVATION_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

cudaError_t LaunchReluForward(const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                               cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_ACTIVATION_LAUNCH_H_
