#include "train/data/dataset.h"

#include "absl/strings/str_cat.h"

namespace ringmaster::train::data {

absl::Status Dataset::Gather(absl::Span<const int64_t> indices, Batch* batch) const {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= info_.size) {
      return absl::InvalidArgumentError(absl::StrCat("sample index ", indices[i], " (position ", i,
                                                     " of the batch) is outside [0, ", info_.size,
                                                     ") of data set ", info_.name));
    }
  }
  batch->size = static_cast<int64_t>(indices.size());
  batch->feature_dim = 0;
  batch->features.clear();
  batch->labels.clear();
  batch->context = 0;
  batch->tokens.clear();
  GatherValid(indices, *batch);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::data
