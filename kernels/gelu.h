// GELU in the tanh approximation used by GPT-2:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//
// fp32 arrays of `n` elements; no allocation, no threads, thread-compatible. The CUDA twins
// take the same arguments as device pointers.
#ifndef RINGMASTER_KERNELS_GELU_H_
#define RINGMASTER_KERNELS_GELU_H_

#include <cstdint>

namespace ringmaster::kernels {

// out[i] = gelu(x[i]) (overwrites out). out may alias x exactly, but backward needs x, so
// in-place use only suits forward-only (evaluation) passes or recomputation.
// Save for backward: x.
void GeluForward(float* out, const float* x, int64_t n);

// dx[i] = gelu'(x[i]) * dout[i]. OVERWRITES dx (the input of a GELU feeds nothing else in a
// GPT MLP). dx may alias dout exactly (in place), not partially; x must not overlap dx.
void GeluBackward(float* dx, const float* x, const float* dout, int64_t n);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_GELU_H_
