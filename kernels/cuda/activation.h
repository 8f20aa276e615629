// CUDA twins of the ReLU kernels of kernels/activation.h: the same formulas over n
// contiguous floats, as device pointers, bit for bit the CPU's results (selects, no
// arithmetic): ReluForward keeps NaN (with its sign and payload) and -0, ReluBackward routes
// dy where y > 0 and writes +0 elsewhere, even where dy is inf or NaN.
//
// Aliasing: an output may be one of its inputs exactly (in place); a partial overlap is
// INVALID_ARGUMENT.
//
// Every function enqueues one kernel on `stream` and returns without waiting: OK means the
// launch was accepted; errors of the kernel's execution surface at the next synchronising
// call. INVALID_ARGUMENT names the bad argument (negative n, a null pointer with n > 0, a
// partial overlap); INTERNAL carries a CUDA launch error. n = 0 does nothing (the pointers
// may then be null). No function allocates. Thread-compatible.
#ifndef RINGMASTER_KERNELS_CUDA_ACTIVATION_H_
#define RINGMASTER_KERNELS_CUDA_ACTIVATION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ringmaster::kernels::cuda {

// y[i] = x[i] < 0 ? +0 : x[i] (overwrites y); y may be x.
absl::Status ReluForward(const float* x, float* y, int64_t n, cudaStream_t stream);

// dx[i] = y[i] > 0 ? dy[i] : +0 (overwrites dx), the mask from the forward output y; dx may
// be dy (or y).
absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                          cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_ACTIVATION_H_
