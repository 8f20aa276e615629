#include "kernels/activation.h"

namespace ringmaster::kernels {

void ReluForward(const float* x, float* y, int64_t n) {
  // `x < 0 ? 0 : x` rather than max(): a NaN compares false and passes through.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void ReluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  // A select, not dy * mask: inf * 0 would make a NaN where the unit was off. dy is loaded
  // unconditionally so that the select vectorises (a conditional load would be a branch,
  // mispredicted half the time).
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

}  // namespace ringmaster::kernels
