// Element-wise optimizer updates, and the gradient passes around them, over float spans.
//
// The optimizers in train/optim call these once per piece of a tensor in their range (a
// ZeRO shard may cut a tensor in two), with that tensor's hyper-parameters: weight decay is
// per tensor. Spans passed to one call have the same length (CHECK) and must not overlap.
//
// Arithmetic is float, as in PyTorch; sums accumulate in double. Every function computes
// the same bits whichever implementation runs (no contraction into FMA, reductions in a fixed
// order of 8 interleaved lanes), so ranks on different processors stay identical. All
// functions are thread-compatible and allocate nothing. The CPU implementation picks an
// AVX2 build at run time when the processor has it; a CUDA one will sit beside it.
#ifndef RINGMASTER_KERNELS_OPTIMIZER_H_
#define RINGMASTER_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/types/span.h"

namespace ringmaster::kernels {

// SGD with momentum, PyTorch's torch.optim.SGD with dampening 0:
//   d   = g + weight_decay * p
//   buf = momentum * buf + d        (buf starts at 0, so the first step sets buf = d)
//   p  -= lr * (nesterov ? d + momentum * buf : buf)
// With momentum 0 there is no buffer: `momentum_buffer` is empty and p -= lr * d.
struct SgdStepArgs {
  float lr = 0;
  float momentum = 0;
  float weight_decay = 0;
  bool nesterov = false;
};
void SgdStep(const SgdStepArgs& args, absl::Span<float> params, absl::Span<const float> grads,
             absl::Span<float> momentum_buffer);

// The Adam moments of update number `step` (1 for the first):
//   m = beta1 * m + (1 - beta1) * g,   v = beta2 * v + (1 - beta2) * g * g
//   m_hat = m / (1 - beta1^step),      v_hat = v / (1 - beta2^step)
struct AdamMomentArgs {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  int64_t step = 1;  // >= 1 (CHECK)
};

// AdamW, PyTorch's torch.optim.AdamW formula (decoupled weight decay):
//   p = p * (1 - lr * weight_decay) - lr * m_hat / (sqrt(v_hat) + eps)
// updating `exp_avg` (m) and `exp_avg_sq` (v) in place.
void AdamWStep(const AdamMomentArgs& moments, float lr, float weight_decay,
               absl::Span<float> params, absl::Span<const float> grads, absl::Span<float> exp_avg,
               absl::Span<float> exp_avg_sq);

// LAMB (You et al. 2019) in two passes over the same inputs, so that the per-tensor norms
// can be summed across ranks in between and nothing changes until the second pass:
//   r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p   (with the moments of this step)
// LambSquares returns sum(p^2) and sum(r^2) over the span and modifies nothing;
// LambStep stores the new moments and applies p -= scaled_lr * r, where the caller's
// scaled_lr = lr * trust ratio of the whole tensor.
struct LambSquareSums {
  double params = 0;
  double update = 0;
};
LambSquareSums LambSquares(const AdamMomentArgs& moments, float weight_decay,
                           absl::Span<const float> params, absl::Span<const float> grads,
                           absl::Span<const float> exp_avg, absl::Span<const float> exp_avg_sq);
void LambStep(const AdamMomentArgs& moments, float weight_decay, float scaled_lr,
              absl::Span<float> params, absl::Span<const float> grads, absl::Span<float> exp_avg,
              absl::Span<float> exp_avg_sq);

// Sum of x[i]^2 in double (the gradient norm for clipping).
double SumOfSquares(absl::Span<const float> x);

// x[i] *= factor, and whether any result is inf or NaN, in one pass: the fp16 "unscale and
// check for overflow" (factor = 1 / loss scale), and the clipping scale.
bool ScaleAndFindNonFinite(absl::Span<float> x, float factor);

// Which implementation these functions use on this processor: "avx2" or "generic".
const char* OptimizerImplementation();

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_OPTIMIZER_H_
