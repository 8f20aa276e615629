// CUDA twins of the CPU element-wise kernels of kernels/elementwise.h that
// kernels/cuda/elementwise.h does not have: the residual addition's backward, the gradient
// accumulation and the in-place scaling. Same formulas, same contracts, as device pointers
// (fp32 arrays of n elements), bit for bit the CPU's results: each element sees the same
// float operations in the same order (additions and one multiply, nothing to fuse), and
// subnormals are kept (no flush to zero). A NaN result is NaN on both, though not the same
// NaN: the GPU's arithmetic returns its canonical NaN, x86 the input's or its default one.
//
// Every function enqueues one kernel on `stream` and returns without waiting: OK means the
// launch was accepted; errors of the kernel's execution surface at the next synchronising
// call. INVALID_ARGUMENT names the bad argument (negative n, a null pointer with n > 0, an
// overlap the function does not allow); INTERNAL carries a CUDA launch error. n = 0 does
// nothing (the pointers may then be null). No function allocates. Thread-compatible.
#ifndef RINGMASTER_KERNELS_CUDA_VECTOR_H_
#define RINGMASTER_KERNELS_CUDA_VECTOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ringmaster::kernels::cuda {

// da[i] += dout[i] and db[i] += dout[i] (both ACCUMULATED). da may equal db (then it
// receives (da + dout) + dout, as on the CPU); otherwise da and db lie apart, and neither
// overlaps dout.
absl::Status ResidualBackward(float* da, float* db, const float* dout, int64_t n,
                              cudaStream_t stream);

// acc[i] += x[i]; acc must not overlap x.
absl::Status Accumulate(float* acc, const float* x, int64_t n, cudaStream_t stream);

// x[i] *= s, in place.
absl::Status Scale(float* x, float s, int64_t n, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_VECTOR_H_
