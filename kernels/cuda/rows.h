// CUDA twins of the row-wise CPU kernels of the training step: LayerNorm forward and
// backward (kernels/layernorm.h) and softmax cross-entropy (kernels/softmax_xent.h). Same
// formulas, layouts and contracts (backward ACCUMULATES dx, dgain, dbias), as device
// pointers, fp32. One block per row.
//
// The *Bf16 twins keep the activations in bf16 (llm.c-style mixed precision: fp32 master
// parameters, bf16 activations and activation gradients, fp32 parameter gradients): the
// tensors typed __nv_bfloat16 below are bf16, everything else (gain, bias, mean, rstd, dgain,
// dbias, loss, scratch) stays fp32. They compute in fp32 exactly as the fp32 kernels do, on the
// bf16 inputs widened exactly, and round each bf16 output once, to nearest even with
// kernels/half.h's FloatToBFloat16 (NaN stays NaN). So a bf16 kernel gives the fp32 kernel's
// result on the same (bf16-valued) inputs, rounded to bf16: within one bf16 ulp of the CPU
// kernel run on those inputs and rounded (kernels/precision.h). LayerNormBackwardBf16's
// accumulation into dx is dx = round(dx + dL/dx): one rounding per call, no fp32 copy kept.
//
// The *F16 twins are the same kernels with fp16 (__half) storage: widened exactly, rounded
// once per output to nearest even as kernels/half.h's FloatToFloat16 does (IEEE: values of
// magnitude 65520 or more become +-inf, which the loss scaler's overflow check then finds).
//
// LayerNorm backward sums dgain and dbias without atomics: partial sums per chunk of rows
// into `scratch` (LayerNormBackwardScratchFloats(channels) floats of device memory, contents
// undefined afterwards), then the chunks in ascending order, so the result is bitwise
// reproducible on the same GPU and shape.
//
// Every function enqueues its kernels on `stream` and returns without waiting: OK means the
// launches were accepted; errors of the kernels' execution surface at the next synchronising
// call. INVALID_ARGUMENT names the bad argument (a non-positive size, rows beyond the grid's
// 2^31 - 1 blocks, a null pointer); INTERNAL carries a CUDA launch error. Labels must be in
// [0, classes): the caller validates them, as for the CPU kernel. No function allocates.
// Thread-compatible.
#ifndef RINGMASTER_KERNELS_CUDA_ROWS_H_
#define RINGMASTER_KERNELS_CUDA_ROWS_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ringmaster::kernels::cuda {

// Writes y, mean and rstd (overwritten); y must not overlap x.
absl::Status LayerNormForward(float* y, float* mean, float* rstd, const float* x,
                              const float* gain, const float* bias, int64_t rows,
                              int64_t channels, cudaStream_t stream);
// bf16 x and y; fp32 gain, bias, mean and rstd.
absl::Status LayerNormForwardBf16(__nv_bfloat16* y, float* mean, float* rstd,
                                  const __nv_bfloat16* x, const float* gain, const float* bias,
                                  int64_t rows, int64_t channels, cudaStream_t stream);
absl::Status LayerNormForwardF16(__half* y, float* mean, float* rstd, const __half* x,
                                 const float* gain, const float* bias, int64_t rows,
                                 int64_t channels, cudaStream_t stream);

// The scratch of LayerNormBackward and its bf16 and fp16 twins, in floats.
int64_t LayerNormBackwardScratchFloats(int64_t channels);
// dx += dL/dx, dgain += dL/dgain, dbias += dL/dbias.
absl::Status LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                               const float* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t channels,
                               float* scratch, cudaStream_t stream);
// bf16 dy, x and dx (dx = round(dx + dL/dx)); fp32 gain, mean, rstd, and dgain and dbias,
// which are summed as LayerNormBackward sums them (the same scratch, the same order).
absl::Status LayerNormBackwardBf16(__nv_bfloat16* dx, float* dgain, float* dbias,
                                   const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                   const float* gain, const float* mean, const float* rstd,
                                   int64_t rows, int64_t channels, float* scratch,
                                   cudaStream_t stream);
absl::Status LayerNormBackwardF16(__half* dx, float* dgain, float* dbias, const __half* dy,
                                  const __half* x, const float* gain, const float* mean,
                                  const float* rstd, int64_t rows, int64_t channels, float* scratch,
                                  cudaStream_t stream);

// Per-row loss and predicted class (the first maximum; a NaN wins). Each function takes
// logits (and dlogits) whose rows are row_stride elements apart (0: classes): GptCuda pads its
// logits' rows to an aligned width. The logits' columns past `classes` are not read; dlogits'
// are written with zeros, so that a product over the padded width (GptCuda's LM head's input
// gradient, against zero rows of the weight) adds nothing from them.
absl::Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float* loss, int32_t* predicted,
                                        cudaStream_t stream, int64_t row_stride = 0);
// bf16 logits; fp32 losses.
absl::Status SoftmaxCrossEntropyForwardBf16(const __nv_bfloat16* logits, const int32_t* labels,
                                            int64_t n, int64_t classes, float* loss,
                                            int32_t* predicted, cudaStream_t stream,
                                            int64_t row_stride = 0);
absl::Status SoftmaxCrossEntropyForwardF16(const __half* logits, const int32_t* labels, int64_t n,
                                           int64_t classes, float* loss, int32_t* predicted,
                                           cudaStream_t stream, int64_t row_stride = 0);
// The same losses, and dlogits = (softmax - onehot) * scale (overwritten).
absl::Status SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels,
                                                int64_t n, int64_t classes, float scale,
                                                float* loss, int32_t* predicted, float* dlogits,
                                                cudaStream_t stream, int64_t row_stride = 0);
// bf16 logits and dlogits = round((softmax - onehot) * scale), softmax in fp32; fp32 losses.
absl::Status SoftmaxCrossEntropyForwardBackwardBf16(const __nv_bfloat16* logits,
                                                    const int32_t* labels, int64_t n,
                                                    int64_t classes, float scale, float* loss,
                                                    int32_t* predicted, __nv_bfloat16* dlogits,
                                                    cudaStream_t stream, int64_t row_stride = 0);
absl::Status SoftmaxCrossEntropyForwardBackwardF16(const __half* logits, const int32_t* labels,
                                                   int64_t n, int64_t classes, float scale,
                                                   float* loss, int32_t* predicted, __half* dlogits,
                                                   cudaStream_t stream, int64_t row_stride = 0);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_ROWS_H_
