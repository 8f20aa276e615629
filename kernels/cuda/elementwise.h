// CUDA twins of the element-wise CPU kernels the training step needs after its matmuls and
// attention: GELU (kernels/gelu.h), the AdamW update, the sum of squares behind the global
// gradient norm, and the fp16 unscale with its overflow check (kernels/optimizer.h). Same
// formulas, same arguments, as device pointers (fp32).
//
// The *Bf16 twins of GELU and the residual addition, and CastFloatToBf16, serve bf16
// activations (llm.c-style mixed precision: fp32 master parameters, bf16 activations, fp32
// parameter gradients): their __nv_bfloat16 tensors are widened exactly, the arithmetic is the
// fp32 kernels', and each output is rounded once to the nearest bf16, ties to even, with
// kernels/half.h's FloatToBFloat16 bit for bit (NaN stays NaN, quiet, with its sign; finite
// values beyond bf16's range become +-inf).
//
// The *F16 twins are the same kernels with fp16 (__half) storage: widened exactly, rounded
// once per output to nearest even as kernels/half.h's FloatToFloat16 does (IEEE: values of
// magnitude 65520 or more become +-inf, which the loss scaler's overflow check then finds).
//
// Every function enqueues its kernels on `stream` and returns without waiting, except
// where it says it synchronises: OK means the launches were accepted; errors of the kernels'
// execution surface at the next synchronising call. INVALID_ARGUMENT names the bad argument
// (negative n, a null pointer with n > 0, step < 1); INTERNAL carries a CUDA error. No
// function allocates. Thread-compatible.
#ifndef RINGMASTER_KERNELS_CUDA_ELEMENTWISE_H_
#define RINGMASTER_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "kernels/precision.h"

namespace ringmaster::kernels::cuda {

// out[i] = gelu(x[i]); out may alias x exactly.
absl::Status GeluForward(float* out, const float* x, int64_t n, cudaStream_t stream);
// dx[i] = gelu'(x[i]) * dout[i] (overwrites dx); dx may alias dout exactly.
absl::Status GeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                          cudaStream_t stream);

// out[i] = a[i] + b[i] (kernels/elementwise.h ResidualForward); out may alias a or b exactly.
absl::Status ResidualForward(float* out, const float* a, const float* b, int64_t n,
                             cudaStream_t stream);

// bf16 GELU: out[i] = round(gelu(x[i])); out may alias x exactly.
absl::Status GeluForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* x, int64_t n,
                             cudaStream_t stream);
absl::Status GeluForwardF16(__half* out, const __half* x, int64_t n, cudaStream_t stream);
// dx[i] = round(gelu'(x[i]) * dout[i]) (overwrites dx); dx may alias dout exactly, not x.
absl::Status GeluBackwardBf16(__nv_bfloat16* dx, const __nv_bfloat16* x,
                              const __nv_bfloat16* dout, int64_t n, cudaStream_t stream);
absl::Status GeluBackwardF16(__half* dx, const __half* x, const __half* dout, int64_t n,
                             cudaStream_t stream);
// out[i] = round(a[i] + b[i]) (the sum in fp32); out may alias a or b exactly.
absl::Status ResidualForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* a,
                                 const __nv_bfloat16* b, int64_t n, cudaStream_t stream);
absl::Status ResidualForwardF16(__half* out, const __half* a, const __half* b, int64_t n,
                                cudaStream_t stream);

// out[i] = in[i] rounded to bf16, bit for bit kernels/half.h's FloatToBFloat16: the
// per-step copy of the fp32 master parameters into the bf16 buffer the forward reads.
// out and in must not overlap.
absl::Status CastFloatToBf16(__nv_bfloat16* out, const float* in, int64_t n,
                             cudaStream_t stream);
absl::Status CastFloatToF16(__half* out, const float* in, int64_t n, cudaStream_t stream);
// The way back: out[i] = in[i] widened to fp32, exactly, bit for bit kernels/half.h's
// BFloat16ToFloat / Float16ToFloat: subnormals, +-0 and +-inf kept; a NaN stays NaN with its
// sign and payload (bf16: every bit kept; fp16: made quiet, as the host's conversion does).
// out and in must not overlap.
absl::Status CastBf16ToFloat(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream);
absl::Status CastF16ToFloat(float* out, const __half* in, int64_t n, cudaStream_t stream);

// 16-bit values in fp32 storage, kernels/precision.h's emulation on the device (bit for
// bit, NaNs included), for models whose fp32 kernels run on values rounded to bf16 or fp16
// (train/nn/sequential_cuda.h). RoundToHalf: y[i] = x[i] rounded to `format`; y may be x
// exactly, otherwise they do not overlap. AddRoundedHalf: sum[i] += x[i] rounded to
// `format`, the sum in fp32; x and sum do not overlap.
absl::Status RoundToHalf(HalfFormat format, const float* x, float* y, int64_t n,
                         cudaStream_t stream);
absl::Status AddRoundedHalf(HalfFormat format, const float* x, float* sum, int64_t n,
                            cudaStream_t stream);

// AdamW (PyTorch's formula, kernels/optimizer.h) over n elements, updating params, exp_avg
// and exp_avg_sq in place.
absl::Status AdamWStep(const AdamMomentArgs& moments, float lr, float weight_decay,
                       float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                       int64_t n, cudaStream_t stream);

// LAMB (kernels/optimizer.h), pass 1: result[0] = sum p^2 and result[1] = sum r^2 (two
// device doubles), with r from this step's moments; modifies nothing. Deterministic like
// SumOfSquares, through LambSquaresScratchDoubles() doubles of device scratch. Between the
// passes the caller sums the results across ranks (ZeRO) and forms scaled_lr = lr x trust
// ratio of the whole tensor.
int64_t LambSquaresScratchDoubles();
absl::Status LambSquares(const AdamMomentArgs& moments, float weight_decay, const float* params,
                         const float* grads, const float* exp_avg, const float* exp_avg_sq,
                         int64_t n, double* scratch, double* result, cudaStream_t stream);
// Pass 2: stores the new moments and applies p -= scaled_lr * r.
absl::Status LambStep(const AdamMomentArgs& moments, float weight_decay, float scaled_lr,
                      float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                      int64_t n, cudaStream_t stream);

// Scratch of SumOfSquares: this many doubles of device memory.
int64_t SumOfSquaresScratchDoubles();
// *result (a device double) = sum of x[i]^2, accumulated in double in a fixed order (a
// fixed number of blocks, each over a fixed slice, then one block over their sums): the
// same bits for the same input on the same GPU.
absl::Status SumOfSquares(const float* x, int64_t n, double* scratch, double* result,
                          cudaStream_t stream);

// x[i] *= factor; *flag (a device int) becomes 1 if any result is inf or NaN. The flag is
// zeroed first on the stream.
absl::Status ScaleAndFindNonFinite(float* x, int64_t n, float factor, int* flag,
                                   cudaStream_t stream);
// The same, then waits for the stream and returns whether a result was inf or NaN.
absl::StatusOr<bool> ScaleAndFindNonFiniteSync(float* x, int64_t n, float factor, int* flag,
                                               cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_ELEMENTWISE_H_
