// Learning-rate schedule: the linear scaling rule, linear warm-up, then cosine, linear or no
// decay.
//
//   peak = base_lr * global_batch / base_batch     (base_batch > 0; otherwise peak = base_lr)
//   LrAt(step), step = updates applied before this one (0 for the first):
//     step < warmup_steps:  peak * (s + (1 - s) * step / warmup_steps),  s = warmup_start_ratio
//     otherwise, with p = (step - warmup_steps) / (total_steps - warmup_steps) capped at 1
//     and floor = min_lr_ratio * peak:
//       cosine:    floor + (peak - floor) * (1 + cos(pi * p)) / 2
//       linear:    floor + (peak - floor) * (1 - p)
//       constant:  peak
// So LrAt(warmup_steps) = peak, and LrAt(step) = floor from total_steps on (cosine, linear).
// With the default warmup_start_ratio 0 the first update has lr 0, as in PyTorch's and
// Hugging Face's warm-up schedules.
//
// Immutable after Create; thread-safe.
#ifndef RINGMASTER_TRAIN_OPTIM_LR_SCHEDULE_H_
#define RINGMASTER_TRAIN_OPTIM_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ringmaster::train {

struct LrScheduleOptions {
  enum class Decay { kCosine, kLinear, kConstant };

  double base_lr = 1e-3;  // >= 0
  // The linear scaling rule: > 0 scales base_lr by global_batch / base_batch; 0 leaves it.
  int64_t base_batch = 0;
  int64_t global_batch = 0;       // >= 1 when base_batch > 0
  // >= 0; a warm-up longer than the run is clamped to total_steps (Describe says so): a short
  // smoke run of a spec written for a long one warms up over all its steps.
  int64_t warmup_steps = 0;
  double warmup_start_ratio = 0;  // in [0, 1]: warm-up starts at this fraction of the peak
  Decay decay = Decay::kCosine;
  double min_lr_ratio = 0;  // in [0, 1]: where the decay ends, as a fraction of the peak
  int64_t total_steps = 1;  // >= 1: the step where the decay ends
};

class LrSchedule {
 public:
  // INVALID_ARGUMENT naming the setting: "base_lr must be >= 0 and finite, got -1".
  static absl::StatusOr<LrSchedule> Create(const LrScheduleOptions& options);

  // The learning rate after the linear scaling rule, reached at the end of the warm-up.
  double peak_lr() const { return peak_; }
  // See the top of this file. CHECK-fails on a negative step.
  double LrAt(int64_t step) const;
  // The effective values, for the trainer to print at start, e.g. "lr peak 0.4 (base_lr 0.1
  // x global_batch 512 / base_batch 128), warm-up from 0 over 500 steps, cosine decay to
  // 0.004 at step 10000"; a clamped warm-up "warm-up from 0 over 2 steps (schedule.warmup_steps
  // 100 clamped to the run's 2 steps)".
  std::string Describe() const;
  // The warm-up as asked, when it was longer than the run and clamped; else 0.
  int64_t clamped_warmup_steps() const { return clamped_from_; }

 private:
  LrSchedule(const LrScheduleOptions& options, double peak, int64_t clamped_from)
      : options_(options), peak_(peak), clamped_from_(clamped_from) {}

  LrScheduleOptions options_;  // warmup_steps clamped to total_steps
  double peak_;
  int64_t clamped_from_;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_LR_SCHEDULE_H_
