#include "kernels/gelu.h"

#include "kernels/cpu/vector_math.h"

namespace ringmaster::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

}  // namespace

RM_TARGET_CLONES void GeluForward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    out[i] = 0.5f * v * (1.0f + FastTanh(u));
  }
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,
// du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
RM_TARGET_CLONES void GeluBackward(float* dx, const float* x, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    const float th = FastTanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    const float local = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
    dx[i] = local * dout[i];
  }
}

}  // namespace ringmaster::kernels
