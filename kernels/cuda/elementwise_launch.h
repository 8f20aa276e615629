// Internal to kernels/cuda/elementwise: the kernel launchers, compiled by nvcc (no absl
// here). Callers (elementwise.cc) validate every argument first; the launchers assume
// device pointers, non-null where n > 0, n >= 0, and the aliasing the public header allows.
// Each returns cudaGetLastError() after its launches (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_ELEMENTWISE_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_ELEMENTWISE_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// Blocks of the sum-of-squares first pass: each sums a fixed, contiguous slice.
inline constexpr int kSumBlocks = 1024;
inline constexpr int kSumThreads = 256;

cudaError_t LaunchGeluForward(float* out, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                               cudaStream_t stream);

cudaError_t LaunchResidualForward(float* out, const float* a, const float* b, int64_t n,
                                  cudaStream_t stream);

// bf16 storage, fp32 arithmetic, outputs rounded to nearest even (kernels/cuda/bf16.cuh).
cudaError_t LaunchGeluForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* x, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchGeluForwardF16(__half* out, const __half* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackwardBf16(__nv_bfloat16* dx, const __nv_bfloat16* x,
                                   const __nv_bfloat16* dout, int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackwardF16(__half* dx, const __half* x, const __half* dout, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchResidualForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* a,
                                      const __nv_bfloat16* b, int64_t n, cudaStream_t stream);
cudaError_t LaunchResidualForwardF16(__half* out, const __half* a, const __half* b, int64_t n,
                                     cudaStream_t stream);
cudaError_t LaunchCastFloatToBf16(__nv_bfloat16* out, const float* in, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchCastFloatToF16(__half* out, const float* in, int64_t n, cudaStream_t stream);
cudaError_t LaunchCastBf16ToFloat(float* out, const __nv_bfloat16* in, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchCastF16ToFloat(float* out, const __half* in, int64_t n, cudaStream_t stream);

// fp32 storage of 16-bit values (kernels/precision.h, bit for bit): y = x rounded to bf16
// (bf16) or fp16, kept in fp32; AddRounded: sum += x rounded.
cudaError_t LaunchRoundToHalf(bool bf16, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddRoundedHalf(bool bf16, const float* x, float* sum, int64_t n,
                                 cudaStream_t stream);

// The constants of one step's Adam moments, prepared on the host as the CPU kernel prepares
// them (kernels/cpu/optimizer_impl.inc, Moments): the same float operations follow.
struct MomentArgs {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float inv_correction1;       // 1 / (1 - beta1^step)
  float inv_sqrt_correction2;  // 1 / sqrt(1 - beta2^step)
};

struct AdamWArgs {
  MomentArgs moments;
  float lr;
  float decay;  // 1 - lr * weight_decay (computed in double)
};
cudaError_t LaunchAdamW(const AdamWArgs& a, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, int64_t n, cudaStream_t stream);

// One LAMB pass: the tensor's weight decay and (for the step) lr times its trust ratio.
struct LambArgs {
  MomentArgs moments;
  float weight_decay;
  float scaled_lr;
};
// partials: 2 kSumBlocks doubles; result: two doubles, sum p^2 and sum r^2.
cudaError_t LaunchLambSquares(const LambArgs& a, const float* params, const float* grads,
                              const float* exp_avg, const float* exp_avg_sq, int64_t n,
                              double* partials, double* result, cudaStream_t stream);
cudaError_t LaunchLambStep(const LambArgs& a, float* params, const float* grads, float* exp_avg,
                           float* exp_avg_sq, int64_t n, cudaStream_t stream);

// partials: kSumBlocks doubles; result: one double (both device memory).
cudaError_t LaunchSumOfSquares(const float* x, int64_t n, double* partials, double* result,
                               cudaStream_t stream);

// x *= factor; *flag becomes 1 if any result is inf or NaN (it is not cleared: the caller
// zeroes it first).
cudaError_t LaunchScaleAndFindNonFinite(float* x, int64_t n, float factor, int* flag,
                                        cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_ELEMENTWISE_LAUNCH_H_
