#include "train/optim/sum_across_ranks.h"

namespace ringmaster::train {

absl::Status SumOnOneRank(absl::Span<double>) { return absl::OkStatus(); }

}  // namespace ringmaster::train
