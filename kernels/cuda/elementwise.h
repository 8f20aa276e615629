// CUDA twins of the element-wise CPU kernels the training step needs after its matmuls and
// attention: GELU (kernels/gelu.h), the AdamW update, the sum of squares behind the global
// gradient norm, and the fp16 unscale with its overflow check (kernels/optimizer.h). Same
// formulas, same arguments, as device pointers (fp32).
//
// Every function enqueues its kernels on `stream` and returns without waiting, except
// where it says it synchronises: OK means the launches were accepted; errors of the kernels'
// execution surface at the next synchronising call. INVALID_ARGUMENT names the bad argument
// (negative n, a null pointer with n > 0, step < 1); INTERNAL carries a CUDA error. No
// function allocates. Thread-compatible.
#ifndef RINGMASTER_KERNELS_CUDA_ELEMENTWISE_H_
#define RINGMASTER_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"

namespace ringmaster::kernels::cuda {

// out[i] = gelu(x[i]); out may alias x exactly.
absl::Status GeluForward(float* out, const float* x, int64_t n, cudaStream_t stream);
// dx[i] = gelu'(x[i]) * dout[i] (overwrites dx); dx may alias dout exactly.
absl::Status GeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                          cudaStream_t stream);

// out[i] = a[i] + b[i] (kernels/elementwise.h ResidualForward); out may alias a or b exactly.
absl::Status ResidualForward(float* out, const float* a, const float* b, int64_t n,
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
