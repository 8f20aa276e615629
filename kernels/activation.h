// Element-wise activations and their gradients, over n contiguous floats.
//
// NaN propagates through the forward pass (as in PyTorch), so an overflow upstream stays
// visible. Vectorised loops; allocate nothing; thread-compatible.
#ifndef RINGMASTER_KERNELS_ACTIVATION_H_
#define RINGMASTER_KERNELS_ACTIVATION_H_

#include <cstdint>

namespace ringmaster::kernels {

// y[i] = max(x[i], 0); NaN stays NaN. y may be x (in place).
void ReluForward(const float* x, float* y, int64_t n);

// dx[i] = dy[i] where the forward output y[i] > 0, else 0 (the mask comes from the output,
// so it works after an in-place forward). dx may be dy.
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_ACTIVATION_H_
