#include "train/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/optimizer.h"
#include "train/optim/settings.h"

namespace ringmaster::train {

absl::StatusOr<LossScaler> LossScaler::Create(const LossScalerOptions& o) {
  using settings::Bound;
  RM_RETURN_IF_ERROR(settings::CheckPositive("initial_scale", o.initial_scale));
  RM_RETURN_IF_ERROR(settings::CheckReal("growth_factor", o.growth_factor, 1, Bound::kOpen,
                                         settings::kInfinity, Bound::kOpen));
  RM_RETURN_IF_ERROR(
      settings::CheckReal("backoff_factor", o.backoff_factor, 0, Bound::kOpen, 1, Bound::kOpen));
  RM_RETURN_IF_ERROR(settings::CheckCount("growth_interval", o.growth_interval, 1));
  if (o.mode == LossScalerOptions::Mode::kDynamic) {
    RM_RETURN_IF_ERROR(settings::CheckReal("min_scale", o.min_scale, 0, Bound::kOpen,
                                           o.initial_scale, Bound::kClosed));
  }
  return LossScaler(o);
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  state_.scale = options.initial_scale;
}

absl::StatusOr<StepVerdict> LossScaler::UnscaleAndUpdate(absl::Span<float> grads,
                                                         const SumAcrossRanks& sum,
                                                         VectorOps* ops) {
  const float inverse = static_cast<float>(1.0 / state_.scale);
  RM_ASSIGN_OR_RETURN(const bool overflow, ops->ScaleAndFindNonFinite(grads, inverse));
  double ranks_with_overflow = overflow ? 1 : 0;
  RM_RETURN_IF_ERROR(sum(absl::MakeSpan(&ranks_with_overflow, 1)));

  const bool dynamic = options_.mode == LossScalerOptions::Mode::kDynamic;
  ++state_.steps;
  if (ranks_with_overflow > 0) {
    ++state_.skipped_steps;
    state_.good_steps = 0;
    if (dynamic) {
      state_.scale = std::max(state_.scale * options_.backoff_factor, options_.min_scale);
    }
    return StepVerdict::kSkip;
  }
  if (++state_.good_steps >= options_.growth_interval && dynamic) {
    state_.good_steps = 0;
    const double grown = state_.scale * options_.growth_factor;
    // The model takes the scale as a float: it must stay one.
    if (grown <= std::numeric_limits<float>::max()) state_.scale = grown;
  }
  return StepVerdict::kApply;
}

absl::Status LossScaler::Restore(const state::LossScalerState& s) {
  const bool dynamic = options_.mode == LossScalerOptions::Mode::kDynamic;
  if (dynamic) {
    RM_RETURN_IF_ERROR(
        settings::CheckReal("scale", s.scale, options_.min_scale, settings::Bound::kClosed,
                            std::numeric_limits<float>::max(), settings::Bound::kClosed));
  }
  RM_RETURN_IF_ERROR(settings::CheckCount("good_steps", s.good_steps, 0));
  RM_RETURN_IF_ERROR(settings::CheckCount("skipped_steps", s.skipped_steps, 0));
  RM_RETURN_IF_ERROR(settings::CheckCount("steps", s.steps, s.skipped_steps));
  state_ = s;
  if (!dynamic) state_.scale = options_.initial_scale;
  return absl::OkStatus();
}

std::string LossScaler::Describe() const {
  if (options_.mode == LossScalerOptions::Mode::kFixed) {
    return absl::StrCat("fixed loss scale ", state_.scale, " (overflowing steps skipped)");
  }
  return absl::StrCat("dynamic loss scale ", state_.scale, " (x", options_.growth_factor, " after ",
                      options_.growth_interval, " good steps, x", options_.backoff_factor,
                      " on overflow, >= ", options_.min_scale, ")");
}

}  // namespace ringmaster::train
