#include "kernels/batchnorm.h"

#include <cstdint>

#include "kernels/parallel.h"

namespace ringmaster::kernels {
namespace {

constexpr int kLanes = 16;

// Σ dy[i] and Σ dy[i] · (x[i] - m) over one plane (with dy = x and m = 0: Σ x and Σ x²), in
// kLanes interleaved float partial sums (so that the loop vectorises without reassociating),
// then added in double.
void PlaneSums(const float* dy, const float* x, float m, int64_t n, double& sum, double& dot) {
  float t[kLanes] = {}, d[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      t[l] += dy[i + l];
      d[l] += dy[i + l] * (x[i + l] - m);
    }
  }
  double total = 0, dt = 0;
  for (; i < n; ++i) {
    total += dy[i];
    dt += static_cast<double>(dy[i]) * (x[i] - m);
  }
  for (int l = 0; l < kLanes; ++l) {
    total += t[l];
    dt += d[l];
  }
  sum += total;
  dot += dt;
}

// BatchNormForward with its epilogue's parts chosen at compile time, so that each loop
// vectorises without branches.
template <bool kResidual, bool kRelu>
void Normalize(const BatchNormShape& s, const float* x, const float* mean, const float* invstd,
               const float* gamma, const float* beta, const float* residual, float* y) {
  ParallelFor(s.threads, s.channels, [&](int64_t begin, int64_t end) {
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t at = (n * s.channels + c) * s.positions;
        const float scale = gamma[c] * invstd[c], shift = beta[c] - mean[c] * scale;
        for (int64_t i = 0; i < s.positions; ++i) {
          float v = x[at + i] * scale + shift;
          if constexpr (kResidual) v += residual[at + i];
          if constexpr (kRelu) v = v < 0.0f ? 0.0f : v;
          y[at + i] = v;
        }
      }
    }
  });
}

}  // namespace

void BatchNormChannelSums(const BatchNormShape& s, const float* x, double* sum, double* sum_sq) {
  ParallelFor(s.threads, s.channels, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double total = 0, squares = 0;
      for (int64_t n = 0; n < s.batch; ++n) {
        const float* plane = x + (n * s.channels + c) * s.positions;
        PlaneSums(plane, plane, 0.0f, s.positions, total, squares);
      }
      sum[c] = total;
      sum_sq[c] = squares;
    }
  });
}

void BatchNormForward(const BatchNormShape& s, const float* x, const float* mean,
                      const float* invstd, const float* gamma, const float* beta, float* y,
                      const BatchNormEpilogue& then) {
  if (then.residual != nullptr) {
    if (then.relu) return Normalize<true, true>(s, x, mean, invstd, gamma, beta, then.residual, y);
    return Normalize<true, false>(s, x, mean, invstd, gamma, beta, then.residual, y);
  }
  if (then.relu) return Normalize<false, true>(s, x, mean, invstd, gamma, beta, nullptr, y);
  Normalize<false, false>(s, x, mean, invstd, gamma, beta, nullptr, y);
}

void BatchNormBackwardSums(const BatchNormShape& s, const float* x, const float* dy,
                           const float* mean, const float* invstd, double* sum_dy,
                           double* sum_dy_xhat) {
  ParallelFor(s.threads, s.channels, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double total = 0, dot = 0;
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t at = (n * s.channels + c) * s.positions;
        PlaneSums(dy + at, x + at, mean[c], s.positions, total, dot);
      }
      sum_dy[c] = total;
      sum_dy_xhat[c] = dot * invstd[c];
    }
  });
}

void BatchNormBackwardInput(const BatchNormShape& s, const float* x, const float* dy,
                            const float* mean, const float* invstd, const float* gamma,
                            const double* sum_dy, const double* sum_dy_xhat, double count,
                            float* dx) {
  ParallelFor(s.threads, s.channels, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
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
  });
}

}  // namespace ringmaster::kernels
