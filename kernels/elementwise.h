// Element-wise kernels for the residual stream: out = a + b and the routing of its gradient.
//
// Contract shared by every function here: fp32 arrays of `n` elements, no allocation, no
// threads, thread-compatible (concurrent calls on disjoint arrays are fine). The CUDA twins
// (kernels/cuda/) take the same arguments as device pointers.
#ifndef RINGMASTER_KERNELS_ELEMENTWISE_H_
#define RINGMASTER_KERNELS_ELEMENTWISE_H_

#include <cstdint>

namespace ringmaster::kernels {

// out[i] = a[i] + b[i] (overwrites out). out may alias a and/or b exactly (not partially).
// Nothing needs to be saved for backward.
void ResidualForward(float* out, const float* a, const float* b, int64_t n);

// Backward of out = a + b: da[i] += dout[i] and db[i] += dout[i] (both ACCUMULATED, since the
// two inputs of a residual add usually receive gradient from other consumers too; zero them
// first for a plain copy). da may equal db (then it receives 2 * dout, the gradient of a + a);
// neither may overlap dout.
void ResidualBackward(float* da, float* db, const float* dout, int64_t n);

// acc[i] += x[i]. acc must not overlap x. One branch of ResidualBackward, for a caller that
// keeps the skip path's gradient in place and only adds the branch.
void Accumulate(float* acc, const float* x, int64_t n);

// x[i] *= s, in place.
void Scale(float* x, float s, int64_t n);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_ELEMENTWISE_H_
