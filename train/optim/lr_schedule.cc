#include "train/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "train/optim/settings.h"

namespace ringmaster::train {

absl::StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleOptions& o) {
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("base_lr", o.base_lr, 0));
  RM_RETURN_IF_ERROR(settings::CheckCount("base_batch", o.base_batch, 0));
  if (o.base_batch > 0) {
    RM_RETURN_IF_ERROR(settings::CheckCount("global_batch", o.global_batch, 1));
  }
  RM_RETURN_IF_ERROR(settings::CheckCount("total_steps", o.total_steps, 1));
  RM_RETURN_IF_ERROR(settings::CheckCount("warmup_steps", o.warmup_steps, 0));
  RM_RETURN_IF_ERROR(settings::CheckFraction("warmup_start_ratio", o.warmup_start_ratio));
  RM_RETURN_IF_ERROR(settings::CheckFraction("min_lr_ratio", o.min_lr_ratio));
  double peak = o.base_lr;
  if (o.base_batch > 0) {
    peak = o.base_lr * static_cast<double>(o.global_batch) / static_cast<double>(o.base_batch);
  }
  LrScheduleOptions clamped = o;
  int64_t clamped_from = 0;
  if (o.warmup_steps > o.total_steps) {
    clamped_from = o.warmup_steps;
    clamped.warmup_steps = o.total_steps;
  }
  return LrSchedule(clamped, peak, clamped_from);
}

double LrSchedule::LrAt(int64_t step) const {
  CHECK_GE(step, 0);
  const LrScheduleOptions& o = options_;
  if (step < o.warmup_steps) {
    const double s = o.warmup_start_ratio;
    return peak_ * (s + (1 - s) * static_cast<double>(step) / static_cast<double>(o.warmup_steps));
  }
  const double floor = o.min_lr_ratio * peak_;
  const double p = step >= o.total_steps ? 1.0
                                         : static_cast<double>(step - o.warmup_steps) /
                                               static_cast<double>(o.total_steps - o.warmup_steps);
  switch (o.decay) {
    case LrScheduleOptions::Decay::kCosine:
      return floor + (peak_ - floor) * (1 + std::cos(std::numbers::pi * p)) / 2;
    case LrScheduleOptions::Decay::kLinear:
      return floor + (peak_ - floor) * (1 - p);
    case LrScheduleOptions::Decay::kConstant:
      return peak_;
  }
  LOG(FATAL) << "unknown decay " << static_cast<int>(o.decay);
}

std::string LrSchedule::Describe() const {
  const LrScheduleOptions& o = options_;
  std::string out = absl::StrCat("lr peak ", peak_);
  if (o.base_batch > 0) {
    absl::StrAppend(&out, " (base_lr ", o.base_lr, " x global_batch ", o.global_batch,
                    " / base_batch ", o.base_batch, ")");
  }
  if (o.warmup_steps > 0) {
    absl::StrAppend(&out, ", warm-up from ", o.warmup_start_ratio * peak_, " over ", o.warmup_steps,
                    " steps");
    if (clamped_from_ > 0) {
      absl::StrAppend(&out, " (schedule.warmup_steps ", clamped_from_, " clamped to the run's ",
                      o.total_steps, " steps)");
    }
  } else {
    absl::StrAppend(&out, ", no warm-up");
  }
  switch (o.decay) {
    case LrScheduleOptions::Decay::kCosine:
    case LrScheduleOptions::Decay::kLinear:
      absl::StrAppend(&out, ", ",
                      o.decay == LrScheduleOptions::Decay::kCosine ? "cosine" : "linear",
                      " decay to ", o.min_lr_ratio * peak_, " at step ", o.total_steps);
      break;
    case LrScheduleOptions::Decay::kConstant:
      absl::StrAppend(&out, ", constant after the warm-up (", o.total_steps, " steps)");
      break;
  }
  return out;
}

}  // namespace ringmaster::train
