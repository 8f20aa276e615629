// The "sum across ranks" hook of the optimizer and the gradient norm.
//
// Under ZeRO a rank's range (state/range.h) may cut a tensor in two, so per-tensor
// quantities (LAMB's trust ratio, the global gradient norm) are computed as local partial
// sums that a SumAcrossRanks adds up over the ranks.
#ifndef RINGMASTER_TRAIN_OPTIM_SUM_ACROSS_RANKS_H_
#define RINGMASTER_TRAIN_OPTIM_SUM_ACROSS_RANKS_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ringmaster::train {

// Sums `values` element-wise across the ranks of the data-parallel group, in place. Every
// rank calls it at the same point with a span of the same length and receives the same
// totals; it blocks until all ranks have contributed (the trainer implements it with an
// all-reduce under the collective's deadline). An error (ABORTED when the group broke,
// DEADLINE_EXCEEDED) is returned to the caller of the operation that needed the sum.
using SumAcrossRanks = std::function<absl::Status(absl::Span<double> values)>;

// The hook for a group of one rank: the local sums are already the totals.
absl::Status SumOnOneRank(absl::Span<double> values);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_SUM_ACROSS_RANKS_H_
