#include "train/optim/clip.h"

#include "common/status_macros.h"
#include "kernels/optimizer.h"
#include "train/optim/settings.h"

namespace ringmaster::train {

absl::StatusOr<GradNorm> ClipGradNorm(absl::Span<float> grads, const ClipOptions& options,
                                      const SumAcrossRanks& sum, VectorOps* ops) {
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("max_norm", options.max_norm, 0));
  RM_ASSIGN_OR_RETURN(double sum_of_squares, ops->SumOfSquares(grads));
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
