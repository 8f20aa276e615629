// Validation of option values, shared by the optimizers, the schedule and the loss scaler.
// Each check returns INVALID_ARGUMENT whose message starts with the setting's name, e.g.
// "momentum must be in [0, 1), got 1.5", so the trainer can prefix the job spec's path.
#ifndef RINGMASTER_TRAIN_OPTIM_SETTINGS_H_
#define RINGMASTER_TRAIN_OPTIM_SETTINGS_H_

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ringmaster::train::settings {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

enum class Bound { kClosed, kOpen };

// OK when `value` is a number (not NaN) between lo and hi, each bound closed or open. An
// infinite value passes only an infinite closed bound.
absl::Status CheckReal(absl::string_view name, double value, double lo, Bound lo_bound, double hi,
                       Bound hi_bound);

// value >= lo, finite.
inline absl::Status CheckAtLeast(absl::string_view name, double value, double lo) {
  return CheckReal(name, value, lo, Bound::kClosed, kInfinity, Bound::kOpen);
}
// value > 0, finite.
inline absl::Status CheckPositive(absl::string_view name, double value) {
  return CheckReal(name, value, 0, Bound::kOpen, kInfinity, Bound::kOpen);
}
// 0 <= value < 1: momentum coefficients and betas.
inline absl::Status CheckDecayRate(absl::string_view name, double value) {
  return CheckReal(name, value, 0, Bound::kClosed, 1, Bound::kOpen);
}
// 0 <= value <= 1.
inline absl::Status CheckFraction(absl::string_view name, double value) {
  return CheckReal(name, value, 0, Bound::kClosed, 1, Bound::kClosed);
}

// value >= lo.
absl::Status CheckCount(absl::string_view name, int64_t value, int64_t lo);

}  // namespace ringmaster::train::settings

#endif  // RINGMASTER_TRAIN_OPTIM_SETTINGS_H_
