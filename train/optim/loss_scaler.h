// Loss scaling for fp16 training.
//
// The model multiplies the loss by scale() (ForwardBackwardOptions::loss_scale), so small
// gradients survive fp16; after the gradients are reduced, UnscaleAndUpdate divides them by
// the scale and looks for inf/NaN on every rank. Dynamic mode: an overflow skips the step
// and multiplies the scale by backoff_factor (not below min_scale); growth_interval
// consecutive good steps multiply it by growth_factor. Fixed mode never changes the scale
// but still skips overflowing steps. PyTorch's GradScaler, plus the floor.
//
// Thread-compatible. The state is plain data, saved in checkpoints and restored as is.
#ifndef RINGMASTER_TRAIN_OPTIM_LOSS_SCALER_H_
#define RINGMASTER_TRAIN_OPTIM_LOSS_SCALER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/training_state.h"
#include "train/optim/sum_across_ranks.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

struct LossScalerOptions {
  enum class Mode { kDynamic, kFixed };
  Mode mode = Mode::kDynamic;
  double initial_scale = 65536;    // > 0, finite; the scale in fixed mode
  double growth_factor = 2;        // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // >= 1 good steps in a row before growing
  double min_scale = 1;            // dynamic: > 0, <= initial_scale; backing off stops here
};

enum class StepVerdict {
  kApply,  // every gradient is finite: clip and apply the optimizer step
  kSkip,   // some rank's gradient overflowed: leave the parameters and optimizer as they are
};

class LossScaler {
 public:
  // INVALID_ARGUMENT naming the setting ("backoff_factor must be in (0, 1), got 2").
  static absl::StatusOr<LossScaler> Create(const LossScalerOptions& options);

  // The factor to multiply the loss by this step.
  float scale() const { return static_cast<float>(state_.scale); }

  // Multiplies this rank's `grads` by 1 / scale() and finds inf/NaN in one pass, then learns
  // from every rank whether any found one (`sum` once, one value), and updates the state:
  // the verdict is the same on every rank. Each rank passes the gradients it will use: the
  // whole reduced buffer, or its ZeRO range. Blocks while `sum` does.
  // `grads` is in the memory of `ops` (host by default).
  // On error (that of `sum`, or the ops' INTERNAL) the gradients may be unscaled already;
  // the state is unchanged.
  absl::StatusOr<StepVerdict> UnscaleAndUpdate(absl::Span<float> grads, const SumAcrossRanks& sum,
                                               VectorOps* ops = HostVectorOps());

  const state::LossScalerState& state() const { return state_; }
  // Takes the saved state. In fixed mode the scale stays options' initial_scale (it is
  // configuration, not learned); the counts are restored. INVALID_ARGUMENT when the state
  // could not have come from a scaler: a dynamic scale below min_scale or beyond the
  // float range, negative counts, or more skipped steps than steps.
  absl::Status Restore(const state::LossScalerState& state);

  // E.g. "dynamic loss scale 65536 (x2 after 2000 good steps, x0.5 on overflow, >= 1)".
  std::string Describe() const;

 private:
  explicit LossScaler(const LossScalerOptions& options);

  LossScalerOptions options_;
  state::LossScalerState state_;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_LOSS_SCALER_H_
