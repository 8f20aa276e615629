// Gradient clipping by global norm, across the ranks of a data-parallel group.
//
// PyTorch's clip_grad_norm_: norm = sqrt(sum of g^2 over every gradient of the model),
// scale = min(1, max_norm / (norm + 1e-6)), g *= scale; except that a non-finite norm never
// scales anything (see ClipGradNorm).
#ifndef RINGMASTER_TRAIN_OPTIM_CLIP_H_
#define RINGMASTER_TRAIN_OPTIM_CLIP_H_

#include <cmath>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "train/optim/sum_across_ranks.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

struct ClipOptions {
  // > 0: clip to this global norm. 0: only measure the norm (for the metrics).
  double max_norm = 0;
};

struct GradNorm {
  double norm = 0;   // global L2 norm before clipping; inf or NaN when a gradient is
  double scale = 1;  // what the gradients were multiplied by (exactly 1: left untouched)

  bool finite() const { return std::isfinite(norm); }
};

// Measures the global norm of the gradients that the ranks hold together and clips them.
// Each rank passes its own part, the parts disjoint and together the whole model: its ZeRO
// range of the gradients (with the group's SumAcrossRanks), or, where every rank holds every
// reduced gradient, the whole buffer with SumOnOneRank. Calls `sum` once with one value;
// blocks while it does.
//
// A non-finite norm (an inf or NaN gradient on any rank) leaves every rank's gradients as
// they are and returns finite() == false with the norm: the caller must not apply this step
// (with fp16 the LossScaler has skipped it already; in fp32 it means divergence: skip and
// count it, or stop the job).
//
// `grads` is in the memory of `ops` (host by default).
//
// INVALID_ARGUMENT for a negative, infinite or NaN max_norm; otherwise the error of `sum`
// (or the ops' INTERNAL). On an error of `sum` the gradients are untouched.
//
// `duplicates`: ranges of `grads` (offsets into it, increasing, disjoint) that this rank
// holds but another rank counts (a tensor-parallel rank's replicated tensors, counted by
// tensor-parallel rank 0): left out of this rank's sum, and still clipped.
absl::StatusOr<GradNorm> ClipGradNorm(absl::Span<float> grads, const ClipOptions& options,
                                      const SumAcrossRanks& sum, VectorOps* ops = HostVectorOps(),
                                      absl::Span<const state::FlatRange> duplicates = {});

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_CLIP_H_
