// Launchers of the kernels in matmul.cu (the deterministic bias gradient), for matmul.cc.
// Arguments are checked by the caller.
#ifndef RINGMASTER_KERNELS_CUDA_MATMUL_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_MATMUL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// Row chunks of the bias gradient: the scratch holds kBiasGradientChunks x columns floats.
inline constexpr int kBiasGradientChunks = 64;

// element: 0 fp32, 1 bf16, 2 fp16.
cudaError_t LaunchBiasGradient(int element, const void* dy, int64_t rows, int64_t columns,
                               float* dbias, bool accumulate, float* scratch,
                               cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_MATMUL_LAUNCH_H_
