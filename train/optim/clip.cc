#include "train/optim/clip.h"

#include <algorithm>

#include "common/status_macros.h"
#include "kernels/optimizer.h"
#include "train/optim/settings.h"

namespace ringmaster::train {

absl::StatusOr<GradNorm> ClipGradNorm(absl::Span<float> grads, const ClipOptions& options,
                                      const SumAcrossRanks& sum, VectorOps* ops,
                                      absl::Span<const state::FlatRange> duplicates) {
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("max_norm", options.max_norm, 0));
  double sum_of_squares = 0;
  if (duplicates.empty()) {
    RM_ASSIGN_OR_RETURN(sum_of_squares, ops->SumOfSquares(grads));
  } else {
    // The ranges between the duplicates.
    int64_t at = 0;
    const int64_t n = static_cast<int64_t>(grads.size());
    for (size_t i = 0; i <= duplicates.size(); ++i) {
      const int64_t end = i < duplicates.size() ? std::min(duplicates[i].begin, n) : n;
      if (end > at) {
        RM_ASSIGN_OR_RETURN(double part, ops->SumOfSquares(grads.subspan(at, end - at)));
        sum_of_squares += part;
      }
      if (i < duplicates.size()) at = std::max(at, std::min(duplicates[i].end, n));
    }
  }
  RM_RETURN_IF_ERROR(sum(absl::MakeSpan(&sum_of_squares, 1)));
  GradNorm result;
  result.norm = std::sqrt(sum_of_squares);
  if (!result.finite() || options.max_norm == 0) return result;
  const double scale = options.max_norm / (result.norm + 1e-6);
  if (scale < 1) {
    result.scale = scale;
    // Every gradient is finite (the norm is), so no product can be: ignore the finding.
    RM_RETURN_IF_ERROR(ops->ScaleAndFindNonFinite(grads, static_cast<float>(scale)).status());
  }
  return result;
}

}  // namespace ringmaster::train
