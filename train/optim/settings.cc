#include "train/optim/settings.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace ringmaster::train::settings {
namespace {

bool Above(double value, double lo, Bound bound) {
  return bound == Bound::kClosed ? value >= lo : value > lo;
}

std::string Allowed(double lo, Bound lo_bound, double hi, Bound hi_bound) {
  if (std::isinf(hi) && hi_bound == Bound::kOpen) {
    return absl::StrCat(lo_bound == Bound::kClosed ? ">= " : "> ", lo, " and finite");
  }
  return absl::StrCat("in ", lo_bound == Bound::kClosed ? "[" : "(", lo, ", ", hi,
                      hi_bound == Bound::kClosed ? "]" : ")");
}

}  // namespace

absl::Status CheckReal(absl::string_view name, double value, double lo, Bound lo_bound, double hi,
                       Bound hi_bound) {
  // -value > -hi is value < hi; NaN fails both comparisons.
  if (Above(value, lo, lo_bound) && Above(-value, -hi, hi_bound)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be ", Allowed(lo, lo_bound, hi, hi_bound), ", got ", value));
}

absl::Status CheckCount(absl::string_view name, int64_t value, int64_t lo) {
  if (value >= lo) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be >= ", lo, ", got ", value));
}

}  // namespace ringmaster::train::settings
