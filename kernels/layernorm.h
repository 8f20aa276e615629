// LayerNorm over the last dimension, with a learned gain and bias (GPT-2's ln_1, ln_2, ln_f):
//   y[r, c] = (x[r, c] - mean[r]) * rstd[r] * gain[c] + bias[c],
//   mean[r] = sum_c x[r, c] / C,  rstd[r] = 1 / sqrt(sum_c (x[r, c] - mean[r])^2 / C + eps)
// (biased variance, eps = kLayerNormEpsilon, as PyTorch's nn.LayerNorm).
//
// Layout: x, y, dx, dy are [rows, C] row-major fp32 with rows = B * T; gain, bias and their
// gradients are [C]; mean and rstd are [rows]. No allocation, no threads, thread-compatible.
// The CUDA twins take the same arguments as device pointers.
#ifndef RINGMASTER_KERNELS_LAYERNORM_H_
#define RINGMASTER_KERNELS_LAYERNORM_H_

#include <cstdint>

namespace ringmaster::kernels {

inline constexpr float kLayerNormEpsilon = 1e-5f;

// Writes y, mean and rstd (all overwritten). y must not overlap x.
// Save for backward: x, gain, mean, rstd (2 * rows floats beyond x).
void LayerNormForward(float* y, float* mean, float* rstd, const float* x, const float* gain,
                      const float* bias, int64_t rows, int64_t channels);

// Given dy, ACCUMULATES all three gradients: dx += dL/dx, dgain += dL/dgain,
// dbias += dL/dbias. dx is accumulated because in a pre-LN transformer the input of every
// LayerNorm is the residual stream, whose gradient also arrives through the skip connection:
// the caller passes that gradient in dx and gets the sum (zero dx first for dL/dx alone).
// dx must not overlap dy or x. Rows are reduced into dgain/dbias in ascending order, so the
// result is deterministic.
void LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy, const float* x,
                       const float* gain, const float* mean, const float* rstd, int64_t rows,
                       int64_t channels);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_LAYERNORM_H_
