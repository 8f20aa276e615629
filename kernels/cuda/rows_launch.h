// Internal to kernels/cuda/rows: the kernel launchers, compiled by nvcc (no absl here).
// Callers (rows.cc) validate every argument first; the launchers assume device pointers,
// non-null, rows and channels (classes) positive and within the grid's limits. Each returns
// cudaGetLastError() after its launches (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_ROWS_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_ROWS_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// LayerNorm backward sums dgain and dbias over row chunks first (one partial per chunk and
// column, rows in ascending order), then the chunks in ascending order: deterministic.
inline constexpr int kLayerNormChunks = 32;

cudaError_t LaunchLayerNormForward(float* y, float* mean, float* rstd, const float* x,
                                   const float* gain, const float* bias, int64_t rows,
                                   int64_t channels, cudaStream_t stream);
cudaError_t LaunchLayerNormForwardBf16(__nv_bfloat16* y, float* mean, float* rstd,
                                       const __nv_bfloat16* x, const float* gain,
                                       const float* bias, int64_t rows, int64_t channels,
                                       cudaStream_t stream);
cudaError_t LaunchLayerNormForwardF16(__half* y, float* mean, float* rstd, const __half* x,
                                      const float* gain, const float* bias, int64_t rows,
                                      int64_t channels, cudaStream_t stream);
// scratch: 2 * kLayerNormChunks * channels floats.
cudaError_t LaunchLayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                                    const float* x, const float* gain, const float* mean,
                                    const float* rstd, int64_t rows, int64_t channels,
                                    float* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormBackwardBf16(__nv_bfloat16* dx, float* dgain, float* dbias,
                                        const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                        const float* gain, const float* mean, const float* rstd,
                                        int64_t rows, int64_t channels, float* scratch,
                                        cudaStream_t stream);
cudaError_t LaunchLayerNormBackwardF16(__half* dx, float* dgain, float* dbias, const __half* dy,
                                       const __half* x, const float* gain, const float* mean,
                                       const float* rstd, int64_t rows, int64_t channels,
                                       float* scratch, cudaStream_t stream);

// dlogits null: forward only (scale unused).
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n,
                                      int64_t classes, int64_t stride, float scale, float* loss,
                                      int32_t* predicted, float* dlogits, cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropyBf16(const __nv_bfloat16* logits, const int32_t* labels,
                                          int64_t n, int64_t classes, int64_t stride, float scale,
                                          float* loss, int32_t* predicted, __nv_bfloat16* dlogits,
                                          cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropyF16(const __half* logits, const int32_t* labels, int64_t n,
                                         int64_t classes, int64_t stride, float scale, float* loss,
                                         int32_t* predicted, __half* dlogits, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_ROWS_LAUNCH_H_
