#include "kernels/batchnorm.h"

#include <cstdint>

namespace ringmaster::kernels {

void BatchNormChannelSums(const BatchNormShape& s, const float* x, double* sum, double* sum_sq) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double total = 0, squares = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      const float* plane = x + (n * s.channels + c) * s.positions;
      // Float partial sums per plane (at most a few thousand values), then double.
      float t = 0, q = 0;
      for (int64_t i = 0; i < s.positions; ++i) {
        t += plane[i];
        q += plane[i] * plane[i];
      }
      total += t;
      squares += q;
    }
    sum[c] = total;
    sum_sq[c] = squares;
  }
}

void BatchNormForward(const BatchNormShape& s, const float* x, const float* mean,
                      const float* invstd, const float* gamma, const float* beta, float* y) {
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t at = (n * s.channels + c) * s.positions;
      const float scale = gamma[c] * invstd[c], shift = beta[c] - mean[c] * scale;
      for (int64_t i = 0; i < s.positions; ++i) y[at + i] = x[at + i] * scale + shift;
    }
  }
}

void BatchNormBackwardSums(const BatchNormShape& s, const float* x, const float* dy,
                           const float* mean, const float* invstd, double* sum_dy,
                           double* sum_dy_xhat) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double total = 0, dot = 0;
    const float m = mean[c];
    for (int64_t n = 0; n < s.batch; ++n) {
      const int64_t at = (n * s.channels + c) * s.positions;
      float t = 0, d = 0;
      for (int64_t i = 0; i < s.positions; ++i) {
        t += dy[at + i];
        d += dy[at + i] * (x[at + i] - m);
      }
      total += t;
      dot += d;
    }
    sum_dy[c] = total;
    sum_dy_xhat[c] = dot * invstd[c];
  }
}

void BatchNormBackwardInput(const BatchNormShape& s, const float* x, const float* dy,
                            const float* mean, const float* invstd, const float* gamma,
                            const double* sum_dy, const double* sum_dy_xhat, double count,
                            float* dx) {
  for (int64_t c = 0; c < s.channels; ++c) {
    const float scale = gamma[c] * invstd[c];
    const float mean_dy = static_cast<float>(sum_dy[c] / count);
    // dy - mean_dy - (x - mean) · invstd² · sum_dy_xhat / count, times gamma · invstd.
    const float slope = static_cast<float>(sum_dy_xhat[c] / count) * invstd[c];
    const float m = mean[c];
    for (int64_t n = 0; n < s.batch; ++n) {
      const int64_t at = (n * s.channels + c) * s.positions;
      for (int64_t i = 0; i < s.positions; ++i) {
        dx[at + i] = scale * (dy[at + i] - mean_dy - (x[at + i] - m) * slope);
      }
    }
  }
}

}  // namespace ringmaster::kernels
