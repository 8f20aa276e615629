// The kernel of kernels/cuda/sgd.h: kernels/cpu/optimizer_impl.inc's SgdStep, with each
// float operation rounded on its own (__fmul_rn/__fadd_rn/__fsub_rn) as the CPU build does.
#include <cuda_runtime.h>

#include "kernels/cuda/sgd_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

__global__ void SgdKernel(SgdArgs a, float* params, const float* grads, float* buf, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float p = params[i];
    const float d = __fadd_rn(grads[i], __fmul_rn(a.weight_decay, p));
    if (buf == nullptr) {
      params[i] = __fsub_rn(p, __fmul_rn(a.lr, d));
      continue;
    }
    const float b = __fadd_rn(__fmul_rn(a.momentum, buf[i]), d);
    buf[i] = b;
    const float step = __fadd_rn(__fmul_rn(a.d_coef, d), __fmul_rn(a.buf_coef, b));
    params[i] = __fsub_rn(p, __fmul_rn(a.lr, step));
  }
}

}  // namespace

cudaError_t LaunchSgd(const SgdArgs& a, float* params, const float* grads, float* buf, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  SgdKernel<<<static_cast<int>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      a, params, grads, buf, n);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
