#include "kernels/elementwise.h"

namespace ringmaster::kernels {

void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void ResidualBackward(float* da, float* db, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = dout[i];
    da[i] += d;
    db[i] += d;
  }
}

void Accumulate(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace ringmaster::kernels
