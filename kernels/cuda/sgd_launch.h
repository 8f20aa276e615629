// Internal to kernels/cuda/sgd: the launcher, compiled by nvcc. sgd.cc checks the arguments.
#ifndef RINGMASTER_KERNELS_CUDA_SGD_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_SGD_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

struct SgdArgs {
  float lr, momentum, weight_decay;
  float d_coef, buf_coef;  // nesterov ? (1, momentum) : (0, 1)
};
// buf may be null (momentum 0).
cudaError_t LaunchSgd(const SgdArgs& a, float* params, const float* grads, float* buf, int64_t n,
                      cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_SGD_LAUNCH_H_
