#include "kernels/layernorm.h"

#include <cmath>

#include "kernels/cpu/vector_math.h"

namespace ringmaster::kernels {

RM_TARGET_CLONES void LayerNormForward(float* y, float* mean, float* rstd, const float* x,
                                       const float* gain, const float* bias, int64_t rows,
                                       int64_t channels) {
  const float inv_c = 1.0f / static_cast<float>(channels);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * channels;
    float* yr = y + r * channels;
    // Two passes (mean, then centred squares): no cancellation for rows with a large mean.
    const float m = LaneSum(channels, [xr](int64_t c) { return xr[c]; }) * inv_c;
    const float sq = LaneSum(channels, [xr, m](int64_t c) { return (xr[c] - m) * (xr[c] - m); });
    const float s = 1.0f / std::sqrt(sq * inv_c + kLayerNormEpsilon);
    for (int64_t c = 0; c < channels; ++c) yr[c] = (xr[c] - m) * s * gain[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

// With n = (x - mean) * rstd and g = gain * dy:
//   dx = rstd * (g - mean_c(g) - n * mean_c(g * n)),  dgain += dy * n,  dbias += dy.
RM_TARGET_CLONES void LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                                        const float* x, const float* gain, const float* mean,
                                        const float* rstd, int64_t rows, int64_t channels) {
  const float inv_c = 1.0f / static_cast<float>(channels);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * channels;
    const float* dyr = dy + r * channels;
    float* dxr = dx + r * channels;
    const float m = mean[r];
    const float s = rstd[r];
    const float g_mean = LaneSum(channels, [&](int64_t c) { return gain[c] * dyr[c]; }) * inv_c;
    const float gn_mean =
        LaneSum(channels, [&](int64_t c) { return gain[c] * dyr[c] * (xr[c] - m) * s; }) * inv_c;
    for (int64_t c = 0; c < channels; ++c) {
      const float n = (xr[c] - m) * s;
      dbias[c] += dyr[c];
      dgain[c] += dyr[c] * n;
      dxr[c] += s * (gain[c] * dyr[c] - g_mean - n * gn_mean);
    }
  }
}

}  // namespace ringmaster::kernels
